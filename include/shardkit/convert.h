// shardkit/convert.h: streaming a dataset from one format into another.
//
// Convert() opens a source address, creates a destination address and copies
// every sample across, keeping dataset order, or, with `shuffle`, in one seeded
// global permutation of the source's indices (which needs random access).
// Shard() is Convert() into WebDataset tar shards with a choice of how to cut
// them, including N shards whose sample counts differ by at most one.
//
// Memory is bounded: at most two windows of `window` samples are in flight,
// counted from the first sample being written (when the source offers random
// access, `threads` threads read ahead continuously within that bound; else the
// next window is read while the current one is written).
//
// Thread safety: the functions are reentrant; distinct calls may run at once on
// distinct outputs. The ProgressFn is called from the calling thread only.
// Nothing appears under the destination's final name unless the call succeeds.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

// One part of a conversion split over processes or machines (`--part I/N`). Every
// part computes the same global plan (the sample order, --shuffle included, and the
// shard boundaries) and writes only its shards, under their final global names, plus
// a part record; Merge() then writes the final metadata. count == 0: the whole
// conversion in one process (the default). Only sharded outputs (wds) can be split.
struct PartSpec {
  uint64_t index = 0;
  uint64_t count = 0;
  std::string from;  // where it came from: "--part", or the variables read ("SLURM_PROCID/SLURM_NTASKS")
};

// "I/N" (0 <= I < N) or "env" (PartFromEnvironment()). kInvalidArgument names the text.
SHARDKIT_API Result<PartSpec> ParsePart(std::string_view text);

// The part from a launcher's variables, the first set of: SLURM_ARRAY_TASK_ID/
// SLURM_ARRAY_TASK_COUNT (minus SLURM_ARRAY_TASK_MIN, divided by SLURM_ARRAY_TASK_STEP),
// OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, SLURM_PROCID/
// SLURM_NTASKS, RANK/WORLD_SIZE. PartSpec::from names the pair used. kInvalidArgument
// when none is set or a value is not a number in range.
SHARDKIT_API Result<PartSpec> PartFromEnvironment();

// Checks ConvertOptions::resize and ::encode as Convert() reads them (kInvalidArgument
// naming the value; kUnsupported for webp in a build without libwebp), so that a command
// line can refuse them before it starts.
SHARDKIT_API Status CheckTransformOptions(std::string_view resize, std::string_view encode);

struct ConvertOptions {
  // Passed to the destination's writer. When write.class_names is empty it is
  // filled from the source's DatasetInfo::class_names.
  WriteOptions write;
  OpenOptions open;  // passed to the source
  // Write in a seeded global permutation of the source's order (needs random
  // access; fails with kUnsupported on a source without it).
  bool shuffle = false;
  uint64_t seed = 0;
  // Threads reading ahead; 1 reads on the calling thread's helper task only.
  // With threads > 1 a source with random access is read by index in parallel;
  // one without it is read sequentially ahead of the writer.
  int threads = 1;
  // Samples per read-ahead window (memory bound: two windows).
  size_t window = 256;
  // Write one part of the output (PartSpec; needs random access and a sharded output).
  PartSpec part;
  // The codec of the output's images: "" or "keep" copies image bytes as they are;
  // "png" (lossless), "jpeg[:Q]" or "webp[:Q]" (quality 1-100, default 90; webp needs a
  // build with libwebp) decodes every image field, turns it upright by its EXIF
  // orientation, resizes it by `resize` and encodes it, without metadata, as .png, .jpg
  // or .webp (the key is unchanged; docs/formats.md, "Transforms"). Decoded arrays
  // (field "npy", uint8 [H, W(, C)]) are written as images too, resized by `resize`
  // when larger (gray stays gray, RGBA becomes RGB). A source
  // that says its arrays are BGR (DatasetInfo::extra["channel_order"]) is refused:
  // convert them first (lmdb.channels=bgr-to-rgb) or say they are RGB.
  std::string encode;
  // Shrink every image to a rule, never enlarging one: "short:S" (the short side S),
  // "max:M" (the long side M) or "fit:WxH" (inside W x H, keeping the aspect ratio).
  // Empty: no resize. With a resize `encode` defaults to "jpeg:90" ("keep" is an error).
  // The output's metadata records the transform (wds: the manifest's "transform").
  std::string resize;
  // An image that a transform cannot decode (corrupt, over max_pixels, an unknown codec)
  // leaves its sample out, listed with the reason in skipped.json beside the output
  // (ConvertSummary::skipped_file). false: the conversion fails naming the key, and
  // nothing is published.
  bool skip_bad = false;
  // The decoder's pixel limit (width * height) for the images a transform decodes; an
  // image declaring more is refused with its key and size before any pixel memory is
  // allocated. 0: the decoder's default (200,000,000).
  uint64_t max_pixels = 0;
  // A remote destination (s3://, http(s)://; docs/remote.md) is written into a local
  // staging directory below this one (shardkit-upload-<hash>[-part-I-of-N]) and
  // uploaded file by file. Empty: /tmp. The library reads no environment for it: the
  // CLI and Python fill it from SHARDKIT_STAGING_DIR, else TMPDIR.
  std::string staging_dir;
  // Check every sample against the checksum its source records (a list:
  // DatasetInfo::sample_checksums == kList; formats that keep them in the records
  // check them on read anyway). A mismatch fails the conversion with kCorrupt and
  // Detail::kSampleChecksum naming the sample, before its bytes are written under
  // fresh checksums. false (`--no-verify-source`) converts damaged data as it is.
  bool verify_source = true;
  // A source without samples is an error (kInvalidArgument naming it, nothing written)
  // unless this is set (`--allow-empty`): then an empty output is written. A part
  // (ConvertOptions::part) of a non-empty source may hold no samples either way.
  bool allow_empty = false;
  // Which samples are written (docs/formats.md, "Choosing samples"): "" all,
  // "classes=a,b" (names or label numbers), "keys-from=FILE" (one key per line), or
  // "fraction=F" (exactly round(F * n) samples, chosen by `seed`). In source order; the
  // shuffle applies after. Needs random access, and reads every sample once first.
  std::string select;
  // Drop a sample whose image bytes equal an earlier (source order) sample's, after
  // `select`; the dropped keys are listed in duplicates.json beside the output
  // (ConvertSummary::duplicates_file). The same in every part of a split conversion.
  bool dedup = false;
};

struct ConvertProgress {
  uint64_t samples = 0;               // samples written so far
  uint64_t bytes = 0;                 // payload bytes written so far
  double elapsed = 0;                 // seconds since the start
  std::optional<uint64_t> total;      // samples to write, when known
};
// Called about ten times a second and once at the end, on the calling thread.
using ProgressFn = std::function<void(const ConvertProgress&)>;

struct ConvertSummary {
  std::string source;              // addresses as given
  std::string destination;
  std::string source_format;       // registry names
  std::string destination_format;
  bool destination_shards = false;  // the destination's format cuts its output into shards
  uint64_t samples = 0;
  uint64_t payload_bytes = 0;      // sum of Sample::bytes() over all samples
  uint64_t bytes = 0;              // bytes written to disk (WriteSummary::bytes)
  double seconds = 0;
  std::vector<ShardInfo> shards;   // the output files
  // --resume found the output (or this part) already complete: it was checked and
  // nothing was written.
  bool already_complete = false;
  PartSpec part;                   // the part written (count 0: the whole output)
  uint64_t source_checksums_checked = 0;  // samples checked against the source's checksums
  // What the source left out, in words (an image folder's files that are not images).
  std::vector<std::string> notes;
  // With ConvertOptions::skip_bad: the samples left out, and where they are listed.
  uint64_t skipped = 0;
  std::string skipped_file;
  // The transform applied to images ("" none), as the output's metadata records it:
  // {"resize": "short:256", "encode": "jpeg:90", "orientation": "applied"}.
  std::string transform;
  // With select or dedup: the source's samples, how many the selection chose, how many
  // of those dedup dropped, and where the dropped ones are listed.
  uint64_t source_samples = 0;
  uint64_t selected = 0;
  uint64_t duplicates = 0;
  std::string duplicates_file;
};

// Opens `src`, creates `dst` and copies every sample.
SHARDKIT_API Result<ConvertSummary> Convert(std::string_view src, std::string_view dst,
                               const ConvertOptions& opts = {}, const ProgressFn& progress = {});

// The same, from an open dataset into an open writer (Finish() is called on
// success). `total` is the number of samples when known (for progress only).
// The summary's address and format members are left empty.
SHARDKIT_API Result<ConvertSummary> ConvertDataset(const Dataset& src, SampleWriter* dst,
                                      const ConvertOptions& opts = {},
                                      const ProgressFn& progress = {});

struct ShardOptions {
  // Exactly one way to cut (all zero: the format's default shard size, 1 GiB).
  uint64_t num_shards = 0;         // N shards, counts differ by at most one
  uint64_t samples_per_shard = 0;  // a new shard every N samples
  uint64_t shard_size = 0;         // a new shard at this many bytes
  bool shuffle = false;
  uint64_t seed = 0;
  int threads = 1;
  bool overwrite = false;
  KeyDots key_dots = KeyDots::kError;
  bool write_index = true;  // DALI .idx beside each shard (WriteOptions::write_index)
  OpenOptions open;
  bool resume = false;  // WriteOptions::resume: continue an interrupted run
  std::shared_ptr<FileSystem> filesystem;  // WriteOptions::filesystem (null = local)
  PartSpec part;  // ConvertOptions::part
  std::string staging_dir;  // ConvertOptions::staging_dir (a remote destination)
  bool verify_source = true;  // ConvertOptions::verify_source
  bool allow_empty = false;   // ConvertOptions::allow_empty
  std::string resize;         // ConvertOptions::resize
  std::string encode;         // ConvertOptions::encode
  bool skip_bad = false;      // ConvertOptions::skip_bad
  uint64_t max_pixels = 0;    // ConvertOptions::max_pixels
  std::string select;         // ConvertOptions::select
  bool dedup = false;         // ConvertOptions::dedup
};

// Re-shards any dataset into WebDataset tar shards. `dst` is a printf pattern
// (`out/train-%06d.tar`), with or without the `wds:` scheme; another scheme is
// an error. --num-shards needs the sample count: taken from the source's
// metadata or random access, else counted with one sequential pass.
SHARDKIT_API Result<ConvertSummary> Shard(std::string_view src, std::string_view dst, const ShardOptions& opts,
                             const ProgressFn& progress = {});

struct MergeOptions {
  // Also hash every shard and compare with the part records' checksums (a full
  // read); without it merge checks names and sizes only (`shardkit verify` hashes).
  bool checksums = false;
  std::shared_ptr<FileSystem> filesystem;  // null = local
};

struct MergeSummary {
  std::string destination;
  uint64_t parts = 0;
  uint64_t shards = 0;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  std::string metadata;        // the file written (wds: the manifest)
  bool unchanged = false;      // it already existed with the same contents: nothing written
  // The parts ran with ConvertOptions::skip_bad: the samples they left out (key,
  // reason) in write order, listed in skipped.json beside the output (skipped_file),
  // as a conversion in one process lists them; nullopt without skip_bad.
  std::optional<std::vector<std::pair<std::string, std::string>>> skipped;
  std::string skipped_file;
  std::string source;  // the address the parts converted (secrets redacted), with skip_bad
};

// Completes a conversion run as parts (ConvertOptions::part): reads the part records
// beside `dst` (the same destination address the parts were given), checks that every
// part of 0..N-1 finished, that all ran with the same plan (flags and source; the first
// difference is named), that the shards are exactly 0..S-1 with none missing or twice
// and that each exists with its recorded size, then writes the final metadata (wds: the
// manifest) last. Idempotent: run again, it checks again and rewrites nothing.
SHARDKIT_API Result<MergeSummary> Merge(std::string_view dst, const MergeOptions& opts = {});

// Stopping long work from a signal handler (the shardkit command's SIGINT and SIGTERM).
// RequestStop(sig) is async-signal-safe. After it, Convert and Shard stop before
// the next sample and return Code::kCancelled, nothing is published, and a writer
// destroyed without Finish() keeps what WriteOptions::resume continues from (tar shards:
// the complete shards and the journal; LMDB: the last durable point) and removes the
// rest (HDF5, MDS, TFRecord, RecordIO and folder outputs start over on resume).
// StopRequested() is the signal number given, 0 when none; the request stays until
// ClearStopRequest(). Thread safety: all three may be called from any thread.
SHARDKIT_API void RequestStop(int signal_number) noexcept;
SHARDKIT_API int StopRequested() noexcept;
SHARDKIT_API void ClearStopRequest() noexcept;

// Per-shard sample counts for `total` samples in `num_shards` shards: the first
// total % num_shards shards hold one more. num_shards must be > 0; shards may be
// empty when total < num_shards.
SHARDKIT_API std::vector<uint64_t> EvenShardPlan(uint64_t total, uint64_t num_shards);

// The permutation of [0, n) that `shuffle` with `seed` writes in, written out: a
// keyed bijection evaluated per position (a Feistel network with cycle walking,
// docs/cluster.md), so a conversion or a part of one needs no table of n indices;
// the same on every platform and build. (Until 0.x it was Fisher-Yates on
// std::mt19937_64: orders changed once, see CHANGELOG.md.)
SHARDKIT_API std::vector<uint64_t> ShufflePermutation(uint64_t n, uint64_t seed);

}  // namespace shardkit
