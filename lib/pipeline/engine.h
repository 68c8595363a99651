// pipeline/engine.h (internal): the batch engine that the CPU Loader (loader.cc) and the
// GPU decode path (gpu/gpu_loader.cc) share, as DALI's loader base is shared by its
// readers: the base owns what every consumer of an epoch plan needs, a path supplies the
// row decoder.
//
//   options   ResolveOptions: one Validate (shardkit::Validate, loader.h / gpu.h) and
//             the defaults filled in (rank / world size from RANK / WORLD_SIZE, threads)
//   plan      the epoch's order (plan.h: LoaderEpochOrder) cut into batches (RowsOf)
//   slots     each path's own scheduler (the CPU loader's buffer pool, job map and TBB
//             workers; the GPU path's device ring, producer and submitter threads and
//             queue): they share what the consumer sees, below
//   source    SourceFacts: what the dataset's info says that rows need (the shard of an
//             index, for errors; decoded arrays said to be BGR); CheckArrayColours at Create
//   rows      ReadRow (read the sample, find its image, label and LoaderOptions::fields),
//             then the path's row
//             decoder hook; DecodeCrop is the host decoder's one call (crop choice
//             ChooseCrop + libjpeg-turbo / libpng at a DCT scale), used by the CPU loader
//             for every row and by the GPU path for the rows nvJPEG does not take
//   errors    SettleRows: kError fails the batch at its first bad row, kSkip drops and
//             lists them
//   delivery  Delivery: the consumer's side of both loaders: epoch and next batch
//             (handed out in plan order), the sticky error of a failed batch, the end of
//             the epoch, the rows skipped; Start on set_epoch / restore. Stopped(): the
//             status of what a stopping loader cancelled
//   state     MakeState (Delivery::State) / CheckRestore: one save_state and one restore
//             check (with the next-batch range check) for both loaders
//
// Everything here but Delivery (a plain struct, guarded by its owner) is stateless or a
// pure function; thread safety is the caller's (each function may run on any thread; the
// decoders passed in are per thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "decode/jpeg.h"
#include "pipeline/plan.h"
#include "shardkit/dataset.h"
#include "shardkit/loader.h"
#include "shardkit/status.h"

namespace shardkit {
struct GpuOptions;
}

namespace shardkit::pipeline {

// ---- options ----

// What a loader feeds, for its thread default.
enum class FeedPath {
  kHost,       // host batches (Loader)
  kGpuCopy,    // device batches decoded on the host (GpuLoader, decoder cpu)
  kGpuDecode,  // device batches decoded by nvJPEG (GpuLoader, decoder gpu)
};
// The decoding threads a loader starts when LoaderOptions::threads is 0: the one
// definition (docs/loader.md, "Threads"). The CPUs of this process's affinity mask; when
// LoaderOptions::local_world_size ranks share this machine and none is pinned (its mask
// is the whole machine), this rank's share of them; less one core feeding a GPU (the
// training loop's thread) and one more on the GPU decode path (its submitter); at least 1.
int DefaultThreads(const LoaderOptions& o, FeedPath path);

// Validates `o` (shardkit::Validate) and fills in the defaults: rank and world size
// from the RANK / WORLD_SIZE environment when < 0, threads (DefaultThreads) when 0.
Status ResolveOptions(LoaderOptions* o);
// The same, plus the GPU options' own checks (shardkit::Validate(o, g)).
Status ResolveOptions(LoaderOptions* o, const GpuOptions& g);

// GpuOptions::hardware_load with its default (< 0: GpuOptions::kDefaultHardwareLoad).
double ResolvedHardwareLoad(const GpuOptions& g);

// The largest output side the GPU decode path's kernels take.
inline constexpr int kMaxGpuOutputSide = 8192;
// ... and the CPU loader's.
inline constexpr int kMaxOutputSide = 16384;

// ---- plan ----

// Rows [begin, end) of batch b in an epoch of `samples` samples for this rank.
struct BatchRows {
  uint64_t begin = 0, end = 0;
  size_t count() const { return size_t(end - begin); }
};
inline BatchRows RowsOf(uint64_t samples, uint32_t batch_size, uint64_t b) {
  const uint64_t begin = b * batch_size;
  return {begin, std::max(begin, std::min<uint64_t>(begin + batch_size, samples))};
}

// ---- source ----

// What a loader knows of its dataset beyond the samples (from DatasetInfo), for its rows.
struct SourceFacts {
  // The shard table (ShardInfo::samples, in order) when it covers every sample: errors
  // of a row then name its shard and file.
  std::vector<uint64_t> shard_end;  // cumulative sample counts
  std::vector<std::string> shard_file;
  // Decoded arrays said to be BGR and not converted (DatasetInfo::extra["channel_order"],
  // the LMDB pickle layout's lmdb.channels=bgr): a 3-channel array is refused (the
  // loader feeds RGB), naming the source option that converts or declares them.
  bool arrays_bgr = false;
  std::string channel_order;   // the info's words, for the error
  std::string channel_option;  // formats::ChannelOption: the option to name
  // The source records no order (formats::ArrayOrder::kUnknown): a 3-channel array is
  // refused with this message (formats::UnknownOrderMessage); empty when it is known.
  std::string unknown_order;

  // `where` with the shard and file of where.index added (when known).
  Location At(Location where) const;
};
SourceFacts FactsOf(const DatasetInfo& info, uint64_t n);

// ---- rows ----

// What ReadRow found: the sample's image field, its label (-1 without `cls`), the
// location (key, index) every error of the row names, and LoaderOptions::fields
// (fields[f]: the sample's bytes, nullopt where it has none under MissingFieldPolicy::kNull).
struct RowHead {
  const Sample* sample = nullptr;
  const Field* image = nullptr;
  int64_t label = -1;
  Location where;
  std::vector<std::optional<Bytes>> fields;
};

// The image ReadRow decodes: LoaderOptions::image_field, else the sample's first image
// field, else its decoded array ("npy"); nullptr if none.
const Field* RowImage(const Sample& s, const LoaderOptions& o);

// Reads sample `index` into *scratch (unless `given`: the sample already read, streamed
// mode), finds the image to decode (RowImage) and collects LoaderOptions::fields. Errors
// name the index (read) or key and index (no image: kCorrupt); a missing field under
// MissingFieldPolicy::kError (kCorrupt) also its shard and file where `facts` knows them.
Result<RowHead> ReadRow(const RandomAccess* data, const LoaderOptions& o, uint64_t index, const Sample* given,
                        Sample* scratch, const SourceFacts* facts = nullptr);

// The crop box and flip of sample `index` in epoch e for an image of w x h: training's
// RandomResizedCrop + flip, or evaluation's resize + center crop.
Augment ChooseCrop(const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch, uint64_t index, int w, int h);

// The decoder limits of a loader: Limits{} with LoaderOptions::max_pixels. Every decoder
// the loaders make (one per thread) is made with these.
decode::Limits DecodeLimits(const LoaderOptions& o);

// The host decode of one row: the image's header gives its size, ChooseCrop the box,
// and the decoder decodes the box's region (at a DCT scale when dct_scaling allows).
// *aug gets the crop (box and flip). The error names `where`.
Status DecodeCrop(decode::ImageDecoder& dec, const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch,
                  uint64_t index, const uint8_t* data, size_t size, const Location& where, Augment* aug,
                  decode::Region* out);

// DecodeCrop for the row's image field: a decoded array ("npy": uint8 [H, W], [H, W, 1]
// or [H, W, 3], C order) goes straight to the crop (ImageDecoder::FromPixels: no decode,
// no re-encode: the pixels a lossless PNG of it gives); anything else is decoded.
Status DecodeImage(decode::ImageDecoder& dec, const LoaderOptions& o, const RrcParams& rrc, uint64_t epoch,
                   uint64_t index, const Field& image, const SourceFacts* facts, const Location& where,
                   Augment* aug, decode::Region* out);

// Create's check of decoded arrays against SourceFacts::arrays_bgr / unknown_order: when
// the source says its arrays are BGR or says no order, the first sample is read and a
// 3-channel array image refused
// (kInvalidArgument naming the source options). Rows check it again (DecodeImage).
Status CheckArrayColours(const RandomAccess* data, const LoaderOptions& o, const SourceFacts& facts);

// One row through the row decoder hook: ReadRow, then decode(head), the path's hook
// (the CPU loader decodes and resizes into the host batch; the GPU path hands the image
// to nvJPEG or, when nvJPEG does not take it, to DecodeCrop and packs the pixels for the
// device). An exception becomes kInternal naming the index. Called concurrently for
// distinct rows (each with its own scratch sample).
Status RowException(const std::exception& ex, uint64_t index);
template <class Decode>
Status RunRow(const RandomAccess* data, const LoaderOptions& o, uint64_t index, const Sample* given,
              Sample* scratch, Decode&& decode, const SourceFacts* facts = nullptr) {
  try {
    Result<RowHead> head = ReadRow(data, o, index, given, scratch, facts);
    if (!head.ok()) return std::move(head).take_status();
    return decode(*head);
  } catch (const std::exception& ex) {
    return RowException(ex, index);
  }
}
// ---- errors and skip ----

// The rows of a batch that stay, in order, given each row's status. kError (or any
// cancelled row): the first failure by row is returned. kSkip: the failures are appended
// to *skipped and left out of *keep.
Status SettleRows(const std::vector<Status>& rows, DecodeErrorPolicy policy, std::vector<size_t>* keep,
                  std::vector<Status>* skipped);

// ---- delivery, cancellation and state ----

// The status of a row or batch that a stopping loader (destruction, set_epoch, restore)
// cancelled: kCancelled "loader stopped", on both paths.
inline Status Stopped() { return Status::Cancelled("loader stopped"); }

// What a loader's epochs look like, for save_state and restore: n items (num_samples),
// an order of epoch_size positions, a mixture's (size, count) per source.
struct PlanShape {
  uint64_t n = 0;
  uint64_t epoch_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> sources;
  bool streaming = false;
};

// The consumer's side of a loader, one definition for both paths: where it stands in the
// epoch's plan (epoch, and `next`, the batch the next Next() hands out: what save_state
// reports), the error that failed a batch (sticky: every Next() returns it until
// set_epoch or restore Start()s again), whether the end of the epoch was handed out, and
// the rows skipped under kSkip since the epoch (re)started. Batches are handed out in
// plan order, so Delivered(b) always follows Delivered(b - 1) within an epoch.
// Not synchronised: each loader says which of its mutexes guards it (the CPU loader:
// its consumer thread and pool mutex; the GPU path: its queue mutex).
struct Delivery {
  uint64_t epoch = 0;
  uint64_t next = 0;
  Status sticky;
  bool ended = false;
  std::vector<Status> skipped;

  // set_epoch / restore: batch `start` of epoch e, no error, nothing skipped yet.
  void Start(uint64_t e, uint64_t start) {
    epoch = e;
    next = start;
    sticky = Status::OK();
    ended = false;
    skipped.clear();
  }
  // Batch b failed (reading, decoding under kError, the device): it and every later
  // Next() return `st` until Start.
  const Status& Fail(Status st) {
    sticky = std::move(st);
    return sticky;
  }
  // Batch b was handed out; `rows_skipped`: its rows dropped under kSkip (moved here).
  void Delivered(uint64_t b, std::vector<Status>* rows_skipped = nullptr) {
    next = b + 1;
    if (rows_skipped)
      for (auto& s : *rows_skipped) skipped.push_back(std::move(s));
  }
  // save_state's position (MakeState) for options `o` over n samples.
  LoaderState State(const LoaderOptions& o, uint64_t n) const;
  // The same with the global position, the plan having started at `start`.
  LoaderState State(const LoaderOptions& o, const PlanShape& shape, uint64_t start) const;
};

// The position "batch next_batch of epoch e" of a loader with options `o` over n samples.
LoaderState MakeState(const LoaderOptions& o, uint64_t n, uint64_t epoch, uint64_t next_batch);

// The position "batch next_batch of epoch e, the plan starting at `start`", with the
// global position (version 2).
LoaderState MakeState(const LoaderOptions& o, const PlanShape& shape, uint64_t epoch, uint64_t next_batch,
                      uint64_t start);
// Where a restore of `s` continues in a loader with options `o` and epochs of `shape`:
// batch `next_batch` of the plan from position `start`. Same world size and batch size:
// s.start and s.next_batch; otherwise (version 2, random access) s.position and 0.
// kInvalidArgument naming what differs (seed, dataset size, sources, version, streamed).
struct ResumeAt {
  uint64_t start = 0, next_batch = 0;
  bool elastic = false;  // the plan changes (another world size or batch size)
};
Result<ResumeAt> PlanRestore(const LoaderState& s, const LoaderOptions& o, const PlanShape& shape);

// Whether `s` can be restored into a loader with options `o` over n samples whose epochs
// have num_batches batches: same seed, dataset size, batch size, rank and world size, and
// a next batch within the epoch (num_batches itself: at the end). kInvalidArgument if not.
Status CheckRestore(const LoaderState& s, const LoaderOptions& o, uint64_t n, uint64_t num_batches);

}  // namespace shardkit::pipeline
