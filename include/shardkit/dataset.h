// shardkit/dataset.h: opening, reading and writing datasets by address.
//
// An address is a path with an optional scheme that overrides detection:
//   folder:DIR   wds:PATTERN   lmdb:DIR   hdf5:FILE
//   mds:DIR (MosaicML Streaming: a directory holding index.json)
//   tfrecord:PATTERN (a file, brace range, list or x.tfrecord.json; writing: out/x-%05d.tfrecord)
// Without a scheme the format is detected from the content (a tar header, LMDB's
// meta page, the HDF5 signature, a manifest), else from the path. Anything that
// reads as a scheme (2+ letters and digits, then ':') but names no format is an
// error (kInvalidArgument); write `./odd:name` for a path that holds a colon.
// `pipe:CMD` reads a tar stream from a command's output. A wds pattern is a single tar, a brace range
// (`out/train-{000000..000009}.tar`), a `::`-joined list, or a manifest
// (`out/train.manifest.json`); for writing, a printf pattern (`out/train-%06d.tar`).
//
// Lifetime: a Dataset must outlive every SampleReader and RandomAccess it hands
// out. Bytes inside the samples they return keep their own storage alive and may
// outlive all of them.
//
// Thread safety:
//  - Dataset: info() and the factory methods may be called from any thread.
//  - SampleReader: one thread at a time (each thread may open its own reader).
//  - RandomAccess: Get() may be called from many threads at once.
//  - SampleWriter: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/filesystem.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

// One file of a dataset (a tar shard, the LMDB data file, the .h5 file).
struct ShardInfo {
  std::string path;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  std::string checksum;  // "xxh3:<16 hex digits>" of the whole file, empty if unknown
  // What Open() takes to read this file alone as a dataset (a tar shard of a
  // sharded dataset: read shard by shard); empty when the file is no dataset of
  // its own (LMDB's data.mdb).
  std::string address;
};

// Where a dataset keeps per-sample checksums (Sample::checksum()), i.e. what
// verify can check. Whole-file checksums are ShardInfo::checksum.
enum class SampleChecksums {
  kNone,        // none recorded (e.g. written by another tool, or sidecars removed)
  kList,        // recorded as a list, in dataset order: Dataset::RecordedChecksums()
  kInRecords,   // kept with each record and checked by the reader itself: a mismatch
                // fails Next() (and Get(), where OpenOptions::check_records asks or the
                // format always checks, as TFRecord does) with kCorrupt and
                // Detail::kSampleChecksum
  kNoMetadata,  // the format carries no metadata at all (an image folder)
};

struct DatasetInfo {
  std::string format;                   // registry name: "folder", "wds", "lmdb", "hdf5"
  std::string address;                  // the address it was opened with
  std::optional<uint64_t> num_samples;  // known without a full scan?
  std::vector<std::string> class_names; // label i is class_names[i]
  std::vector<std::string> fields;      // extensions present, sorted
  std::vector<ShardInfo> shards;
  uint64_t total_bytes = 0;             // bytes on disk
  std::map<std::string, std::string> extra;  // format-specific facts (e.g. "layout": "caffe")
  // What per-sample checksums this dataset carries, and in words where (for reports,
  // e.g. "xxh3 in every record, checked on every read"; may be empty).
  SampleChecksums sample_checksums = SampleChecksums::kNone;
  std::string sample_checksums_where;
  // Whole-file checksums that the format's own reader checks (MDS: index.json's
  // hashes of each shard file), in words for reports; empty when none. A
  // mismatch fails with kCorrupt and Detail::kShardChecksum.
  std::string shard_checksums_where;
  // Each sample is a file of its own (an image folder): the layout other formats are
  // measured against (`shardkit bench`'s baseline).
  bool file_per_sample = false;
};

// Reads samples in dataset order.
class SHARDKIT_API SampleReader {
 public:
  virtual ~SampleReader() = default;
  // Fills *out with the next sample and returns true, or returns false at the end.
  virtual Result<bool> Next(Sample* out) = 0;
};

// Reads sample i of [0, size()). Get() is safe to call from many threads at once.
// Field bytes are zero-copy views where the format allows it.
class SHARDKIT_API RandomAccess {
 public:
  virtual ~RandomAccess() = default;
  virtual uint64_t size() const = 0;
  virtual Status Get(uint64_t index, Sample* out) const = 0;
  // A hint: these samples will be read soon, in about this order. A source whose Get()
  // waits on the network (remote tar shards without a cache) starts reading them now on
  // threads of its own, within a bounded budget; others ignore it. Never needed for
  // correctness: a hinted sample that is not read is dropped, and Get() returns the same
  // sample and the same errors with or without it. Thread-safe, like Get().
  virtual void Prefetch(const uint64_t* /*indices*/, size_t /*n*/) const {}
};

struct OpenOptions {
  // HDF5: map dataset names to fields, e.g. {"images": "jpg", "labels": "cls"}.
  // TFRecord: map feature names to fields, e.g. {"image/encoded": "jpg", "image/class/label": "cls-1",
  // "image/filename": "__key__"} (instead of the preset detected from the first record).
  std::map<std::string, std::string> field_map;
  // Per-format reading knobs, "format.name" -> value, where content alone is ambiguous:
  //   "lmdb.layout": shardkit | caffe | image | pickle (default: detected from the first values)
  //   "lmdb.channels": bgr | rgb | bgr-to-rgb (pickled decoded arrays; default bgr, kept as is)
  //   "hdf5.order":  nhwc | nchw (4-D decoded image datasets; default nhwc)
  //   "hdf5.channels": bgr | rgb | bgr-to-rgb (decoded image datasets; default: the images' attribute
  //                    channel_order, else rgb)
  //   "wds.index_budget": bytes of per-shard indexes random access keeps (LRU; default 64MiB;
  //                       docs/formats-wds.md)
  // The library reads no environment for any option here; the CLI and Python turn
  // SHARDKIT_INDEX_BUDGET, SHARDKIT_CACHE_DIR and SHARDKIT_CACHE_BYTES into
  // "wds.index_budget", cache_dir and cache_bytes when those are not given.
  // A format ignores the others' keys.
  std::map<std::string, std::string> format_options;
  // Where the files are (null = FileSystem::Local()).
  std::shared_ptr<FileSystem> filesystem;
  // Remote shards (http://, https://, s3://; docs/remote.md): with a cache
  // directory each shard is downloaded whole on first use into it (bounded by
  // cache_bytes, 0 = unbounded; least recently used shards go first; shared
  // safely by several processes) and read from local disk from then on;
  // without one, random access reads each sample by an HTTP range request.
  std::string cache_dir;
  uint64_t cache_bytes = 0;
  // Confinement (docs/reliability.md): every file a manifest, index list or index.json
  // names must resolve inside the description's own location (local: under its
  // directory, symbolic links followed; http(s)://: same scheme, host and port, under its
  // path prefix; s3://: same bucket, under its key prefix). Absolute paths, '..' that
  // climbs out, other schemes or hosts and `pipe:` entries are refused with
  // kInvalidArgument (Detail::kOutsideDataset) naming the manifest, the entry and the
  // rule. true trusts the manifest: its entries are taken as written (absolute paths
  // and '..' allowed; commands never), e.g. for shards shared by manifests in sibling
  // folders. The CLI's --trust-manifest, Python's trust_manifest=True.
  bool trust_manifest = false;
  // Random access (Get) also checks the checksum a format keeps with each record
  // (SampleChecksums::kInRecords: LMDB's per-record xxh3), which it skips by default on
  // the training hot path; sequential readers and verify always check. Convert sets it
  // while it checks its source (ConvertOptions::verify_source).
  bool check_records = false;
};

// The environment's defaults for what `o` leaves unset, for front ends (the CLI and the
// Python module call it; the library never does): cache_dir from SHARDKIT_CACHE_DIR,
// cache_bytes from SHARDKIT_CACHE_BYTES, the source option "wds.index_budget" from
// SHARDKIT_INDEX_BUDGET. kInvalidArgument naming the variable when a size is not one.
SHARDKIT_API Status OpenOptionsFromEnvironment(OpenOptions* o);

// What a writer does with a key whose last path component holds a dot (which a
// WebDataset reader would split at the wrong place).
enum class KeyDots {
  kError,    // refuse with an error naming the key (default)
  kReplace,  // replace each '.' in the last component by '_'
};

// One part of a split conversion (ConvertOptions::part fills it): a writer that
// writes shards writes only this part's shards of the global plan, numbered from
// first_shard, and at Finish() a part record instead of the dataset's metadata
// (Merge() writes that from all the records). count == 0: not a part.
struct PartWriteOptions {
  uint64_t index = 0, count = 0;
  uint64_t first_shard = 0;     // global number of this part's first shard
  uint64_t total_shards = 0;    // of the whole plan
  uint64_t total_samples = 0;
  std::string plan;             // JSON object every part must agree on (flags, source)
};
// One option a format declares for its writer or its reader (its tables in
// lib/formats/<name>/), given in WriteOptions::format_options (writer) or
// OpenOptions::format_options (reader) under key() = "<format>.<name>". The CLI's
// `--<format>-<name>` flags and Python's `<format>_<name>` keyword arguments are the
// writer's; `--source-option KEY=VALUE` / `source_options=` take the reader's, and
// Open() refuses a key of the format's own that its table does not hold.
struct FormatOption {
  std::string format;                // "lmdb"
  std::string name;                  // "layout"
  bool write = true;                 // a writer's option (false: the reader's)
  std::string default_value;         // as text
  std::vector<std::string> choices;  // the allowed values; empty: free text the format checks
  std::string help;                  // one line
  std::string key() const { return format + "." + name; }
};
// Every format's writer and reader options, in registry order.
SHARDKIT_API std::vector<FormatOption> FormatOptions();

struct WriteOptions {
  // Sharded formats: start a new shard at this many bytes. 0: the format's own default
  // (1 GiB for tar shards, TFRecord and RecordIO; 64 MiB for MDS, as MosaicML Streaming),
  // or no byte limit when samples_per_shard is given.
  uint64_t shard_size = 0;
  uint64_t samples_per_shard = 0;    // and/or at this many samples (0 = no limit)
  std::vector<std::string> class_names;
  bool overwrite = false;            // replace an existing output
  KeyDots key_dots = KeyDots::kError;
  // Write each shard's index beside it where the format has one (tar shards: DALI's .idx;
  // TFRecord: DALI's tfrecord2idx).
  bool write_index = true;
  // When non-empty, shard i holds exactly shard_plan[i] samples (the sum is the number of
  // samples the caller will write; a conversion with --skip-bad counts the samples it
  // leaves out there too, each leaving its shard one short); shard_size and
  // samples_per_shard are then ignored.
  // What `shardkit shard --num-shards N` and the parts of a split conversion follow.
  std::vector<uint64_t> shard_plan;
  // Per-format writer options, "<format>.<name>" -> value, as FormatOptions() lists them
  // with their defaults: e.g. "lmdb.layout" = "caffe", "mds.compression" = "zstd:3",
  // "mds.hashes" = "xxh3_64,md5", "tfrecord.field_map" = "image/encoded=jpg,...". A format
  // ignores the others' keys; Create() refuses an unknown key of the output's format or a
  // value outside its choices, naming it.
  std::map<std::string, std::string> format_options;
  PartWriteOptions part;
  // What the source says its decoded arrays ("npy") are: "bgr", "rgb", or "" (not said;
  // RGB by shardkit's convention). Convert fills it from DatasetInfo::extra
  // ["channel_order"]; the LMDB pickle and HDF5 native layouts and the tar-shard manifest
  // record it beside the arrays (nothing is converted).
  std::string array_channels;
  // What convert did to the images (ConvertOptions::resize, ::encode), as a JSON object's
  // text: {"resize": "short:256", "encode": "jpeg:90", "orientation": "applied"}; empty:
  // images copied as they are. Every format with metadata records it ("transform": the
  // tar-shard and TFRecord manifests, shardkit.json of LMDB and MDS, the HDF5 attribute,
  // RecordIO's sidecars, the folder marker), and its reader gives it back as
  // DatasetInfo::extra["transform"] (verify --against reads it).
  std::string transform;
  // wds, lmdb: continue an interrupted write of the same source with the same
  // options. The writer reads its journal (wds: "<manifest>.partial"; lmdb: the
  // sidecar in "<dir>.partial"), checks what was committed, and then expects
  // Write() to be called again with ALL samples from the first: the ones already
  // committed are checked against the journal's digests and dropped, the rest are
  // written. Without a journal it starts from scratch. A resumable writer that is
  // destroyed without Finish() keeps what it committed (see SampleWriter).
  bool resume = false;
  // Where the output goes (null = FileSystem::Local()): every file, directory,
  // sync and publish the writers make goes through it (see filesystem.h for
  // what LMDB and libhdf5 do themselves).
  std::shared_ptr<FileSystem> filesystem;
};

struct WriteSummary {
  uint64_t samples = 0;
  uint64_t bytes = 0;  // bytes written to disk
  std::vector<ShardInfo> shards;
};

// Writes samples. Nothing appears under the dataset's final name (the wds
// manifest, the LMDB directory, the .h5 file) until Finish() succeeds.
// Destroying a writer without Finish() removes what it wrote, except:
//  - with WriteOptions::resume, and after a write error (I/O error, disk full),
//    a wds or lmdb writer keeps its committed shards / transactions and its
//    journal: the resumable state that WriteOptions::resume continues from. The
//    error message then says how to resume.
//  - a process killed outright (SIGKILL, power loss) leaves that same state.
class SHARDKIT_API SampleWriter {
 public:
  virtual ~SampleWriter() = default;
  virtual Status Write(const Sample& s) = 0;
  virtual Result<WriteSummary> Finish() = 0;
};

class SHARDKIT_API Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const DatasetInfo& info() const = 0;
  virtual Result<std::unique_ptr<SampleReader>> NewReader() const = 0;
  // Unsupported for formats without random access.
  virtual Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const = 0;
  // The per-sample checksums (Sample::checksum()) the writer recorded, in dataset
  // order; empty when the dataset carries none (e.g. written by another tool).
  virtual Result<std::vector<uint64_t>> RecordedChecksums() const { return std::vector<uint64_t>{}; }
};

// Opens a dataset for reading.
SHARDKIT_API Result<std::unique_ptr<Dataset>> Open(std::string_view address, const OpenOptions& opts = {});
// Creates a writer for a new dataset.
SHARDKIT_API Result<std::unique_ptr<SampleWriter>> Create(std::string_view address, const WriteOptions& opts = {});
// The registered format names, in registry order.
SHARDKIT_API std::vector<std::string> FormatNames();
// The format an address resolves to (scheme or detection), without opening it.
SHARDKIT_API Result<std::string> DetectFormat(std::string_view address);

}  // namespace shardkit
