// shardkit/loader.h: the streaming reader that feeds training.
//
// A Loader reads a dataset in the order of an epoch plan, decodes and augments its
// images on a pool of threads, and hands out batches:
//
//   LoaderOptions o;
//   o.batch_size = 256;
//   SK_ASSIGN_OR_RETURN(auto loader, Loader::Create("train-{000000..000009}.tar", o));
//   for (uint64_t epoch = 0; epoch < 90; ++epoch) {
//     loader->set_epoch(epoch);
//     for (;;) {
//       SK_ASSIGN_OR_RETURN(Batch b, loader->Next());
//       if (b.end_of_epoch()) break;
//       train_step(b.data(), b.labels());   // b's buffer returns to the pool when b dies
//     }
//   }
//
// Order and randomness (see docs/loader.md): the order of epoch e is a permutation of
// [0, N) that is a pure function of (seed, e); rank r of W takes positions r, r+W, ...
// of it; the crop box and flip of a sample are a pure function of (seed, e, sample
// index). Thread count, timing, resume and rank count never change them.
// Mixtures (LoaderOptions::sources): several datasets read as one epoch whose order is
// a pure function of (seed, e, the sources' sizes and counts): each source keeps its own
// keyed permutation and gives exactly its count of samples per epoch, interleaved in
// proportion (docs/loader.md, "Mixtures"). A row's source is Batch::sources()[i].
// Elastic resume: save_state() records the global position in the epoch's order (the
// positions every rank together consumed), so restore() on another world size or batch
// size continues that order from there: each sample of the epoch is delivered once
// across the ranks before and after (random access only).
// Streamed mode (LoaderOptions::stream, or a dataset without random access): the
// shards are permuted by (seed, e), rank r reads the r-th contiguous 1/W of that
// sequence (cut at sample granularity), through a shuffle buffer of `shuffle_buffer`
// samples whose picks are a pure function of (seed, e, r, pick number); again the same
// on every machine, whatever the thread count or timing.
//
// Threading: a Loader's methods are called from one thread at a time (the consumer).
// Decoding runs on the loader's own TBB arena of `threads` threads. A Batch may be
// moved to, read from and released on any thread.
//
// Lifetime: a Batch owns one buffer of the loader's pool until it is destroyed or
// Release()d; it may outlive the Loader (the pool's memory is freed when the Loader and
// every Batch are gone). The pool has `prefetch` buffers, allocated once at Create():
// memory is bounded by prefetch * batch bytes whatever the dataset size. Streamed mode
// also holds at most shuffle_buffer + (2 + prefetch) * batch_size encoded samples. The consumer
// may hold up to prefetch - 1 batches while calling Next(); when it holds all of them,
// Next() returns kInvalidArgument instead of waiting forever.
// Destroying a Loader mid-epoch cancels the work in flight and returns promptly (after
// at most the sample each thread is decoding).
// Between epochs (LoaderOptions::prefetch_next_epoch): when the last batches of epoch e
// are submitted, free pool buffers (the same `prefetch`, nothing more) go to epoch
// e + 1's first batches; set_epoch(e + 1) keeps them, any other set_epoch or restore()
// drops them. Results (batches, errors, save_state) are identical with or without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

enum class DType { kUint8, kFloat32, kFloat16, kBFloat16 };
enum class Layout { kNHWC, kNCHW };
SHARDKIT_API const char* DTypeName(DType d);      // "uint8", "float32", "float16", "bfloat16"
SHARDKIT_API size_t DTypeSize(DType d);           // bytes per element

// Where batch memory comes from. The default allocator uses aligned heap memory. A
// pinned (page-locked) allocator, e.g. cudaHostAlloc, plugs in here (issue 7): it is
// called only at Create() (one buffer per prefetch slot) and Deallocate when the pool
// dies, possibly on another thread.
class SHARDKIT_API HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;  // nullptr on failure
  virtual void Deallocate(void* p, size_t bytes) = 0;
  virtual bool pinned() const = 0;           // page-locked memory?
};
SHARDKIT_API std::shared_ptr<HostAllocator> DefaultHostAllocator();

enum class AugmentMode {
  kTrain,  // RandomResizedCrop(output_size, scale, ratio) + horizontal flip with flip_p
  kEval,   // Resize(resize_size) (shorter side) + CenterCrop(output_size)
};

enum class DecodeErrorPolicy {
  kError,  // Next() returns the error, naming the sample's key and index
  kSkip,   // the sample is left out of its batch (the batch is shorter) and counted
};

// A sample without one of LoaderOptions::fields (issue 17).
enum class MissingFieldPolicy {
  kError,  // the row fails: kCorrupt naming the field, the key, the index and, where the
           // dataset's shard table says, the shard and its file; Next() returns it, or
           // under DecodeErrorPolicy::kSkip the sample is skipped and listed
  kNull,   // the row's value is absent: Batch::field(f)[i] is nullopt
};

// One dataset of a mixture (LoaderOptions::sources).
struct MixSourceSpec {
  std::string address;   // as for Loader::Create (format, local or remote); random access
  double weight = 1.0;   // share of the epoch among the sources without repeat or choose
  // At most one of these two (both unset: the weight decides):
  double repeat = 0;     // > 0: round(repeat * size) samples per epoch (0.5: half, 3: three passes)
  uint64_t choose = 0;   // > 0: exactly this many samples per epoch
  int64_t label_offset = 0;  // added to the source's labels (>= 0), into one label space
};

struct LoaderOptions {
  uint32_t batch_size = 256;
  bool shuffle = true;
  uint64_t seed = 0;
  // Rank and world size; -1 = from the RANK / WORLD_SIZE environment (torchrun), else 0 / 1.
  int rank = -1;
  int world_size = -1;
  // true: every rank gets floor(N / world) samples, full batches only.
  // false: the epoch is padded by repeating its first samples so every rank gets
  // ceil(N / world); the last batch may be partial, equally on every rank.
  bool drop_last = false;
  // Decoding threads; 0 = the default (docs/loader.md, "Threads"): the CPUs of this
  // process's affinity mask, or this rank's share of them (local_world_size), less one
  // core feeding a GPU and one more on the GPU decode path. Loader::options().threads and
  // GpuLoader::threads() say what was used.
  int threads = 0;
  // Ranks of this job on this machine (torchrun's LOCAL_WORLD_SIZE; the library reads no
  // environment for it: Python passes it). 0 or 1: this process alone.
  int local_world_size = 0;
  int prefetch = 4;         // pool buffers = batches decoded ahead + held by the consumer
  // When the consumer holds every pool buffer, Next() waits this long for one to be
  // released (by another thread) before it fails with kInvalidArgument. 0 = fail at once:
  // a single-threaded consumer holding every buffer would otherwise wait forever.
  int buffer_wait_ms = 0;
  int output_width = 224;
  int output_height = 224;
  AugmentMode mode = AugmentMode::kTrain;
  double scale_min = 0.08, scale_max = 1.0;          // RandomResizedCrop scale
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // and aspect ratio range
  double flip_p = 0.5;
  int resize_size = 256;    // eval: the shorter side before the center crop
  bool dct_scaling = true;  // decode at a reduced JPEG DCT scale when the crop allows
  // DCT scaling (1/2, 1/4, 1/8) is used while the scaled crop box still covers
  // dct_min_cover * the output size in both dimensions: 0.75 decodes a box of >= 1.5x
  // the output at 1/2 (then upsampled by at most 4/3); 1.0 never upsamples after
  // scaling (closest to a full decode, slower). See docs/loader.md, "Performance".
  double dct_min_cover = 0.75;
  float mean[3] = {0.485f, 0.456f, 0.406f};  // on [0,1] values (ignored for uint8)
  float std[3] = {0.229f, 0.224f, 0.225f};
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;  // uint8 is usually NHWC, floats NCHW; any pair works
  DecodeErrorPolicy on_error = DecodeErrorPolicy::kError;
  // Decompression-bomb guard: an image whose header declares more pixels than this
  // (width * height; any side over 32768 too) is refused before its pixels are allocated,
  // as an undecodable image naming its key and declared size ("image declares WxH
  // pixels, over the limit"; on_error applies). Every codec and both loaders (the GPU
  // loader's nvJPEG route too) check it. Default 200 megapixels; 0 is refused.
  uint64_t max_pixels = 200'000'000;
  std::string image_field;  // field to decode; empty = the sample's first image field
  bool pin_memory = false;  // ask for page-locked batch memory (needs `allocator`)
  std::shared_ptr<HostAllocator> allocator;  // null = DefaultHostAllocator()
  // Streamed input: read each shard front to back (no random access) instead of a
  // global permutation. Chosen automatically when the dataset has no random access;
  // `stream = true` forces it. Needs the per-shard sample counts (wds: the manifest or
  // the shards' index; others: DatasetInfo::num_samples); without them Create()
  // counts the samples by reading every shard once.
  bool stream = false;
  // How Create(address) opens the address and, in streamed mode, each tar shard (which
  // is opened alone): format options ("wds.index_budget"), the remote shard cache
  // (cache_dir / cache_bytes). A dataset passed to Create() was opened by the caller;
  // its streamed shards are still opened with these.
  OpenOptions open;
  // Streamed mode: samples held in the shuffle buffer (memory: this many encoded
  // samples). 0 or 1 = no sample-level shuffle (shards are still permuted).
  uint32_t shuffle_buffer = 8192;
  // Between epochs: once every batch of epoch e has been submitted (the last `prefetch`
  // batches are in flight or ready), free pool buffers start on epoch e + 1's batches,
  // whose plan is already known. set_epoch(e + 1) then keeps them, so its first Next()
  // does not wait a batch time; set_epoch(anything else) or restore() drops them. The
  // batches are the same either way (docs/loader.md, "Between epochs"). false = the
  // workers idle from the end of an epoch until set_epoch (wasted work saved when the
  // next epoch is not e + 1, e.g. an evaluation loader re-run at the same epoch).
  bool prefetch_next_epoch = true;
  // Extra fields carried beside each row's image and label (issue 17: image-text pairs),
  // by extension as in Sample ("txt", "json", "cls", ...; lowercase, distinct). Batch::
  // field(f) holds fields[f] of every row, in row order, as the sample's bytes (no copy
  // where the format gives views). They follow their rows through shuffling, ranks,
  // skips and resume. A sample without one: missing_fields.
  std::vector<std::string> fields;
  MissingFieldPolicy missing_fields = MissingFieldPolicy::kError;
  // A mixture of datasets instead of one address (Loader::Create's address is then
  // empty). Source i gives m_i samples to each epoch: `choose`, or repeat * n_i rounded
  // to nearest (halves to even), or, for the sources with neither, a share by weight of
  // the total size of those with a weight > 0 (largest remainders, so the shares add up
  // exactly). Every source needs random access.
  std::vector<MixSourceSpec> sources;
};

// Checks `o` as Loader::Create does, without opening anything: OK, or kInvalidArgument
// naming the first bad option (batch size, output size up to 16384, prefetch, threads,
// RandomResizedCrop scale and ratio, flip_p, resize_size, dct_min_cover, std, and rank
// within world size, those two read from RANK / WORLD_SIZE when < 0). The GPU loader's
// check is Validate(LoaderOptions, GpuOptions) (shardkit/gpu.h): this one and more.
SHARDKIT_API Status Validate(const LoaderOptions& o);

// Streamed mode's position (see LoaderState::stream).
struct StreamState {
  struct Entry {
    uint64_t shard = 0;   // shard index within the dataset
    uint64_t offset = 0;  // position of the sample within its shard
    std::string key;      // checked when the sample is re-read
  };
  // Where it was taken: it is used only by a restore to this same (epoch, batch).
  uint64_t epoch = 0, next_batch = 0;
  uint64_t emitted = 0;   // samples this rank handed out (or consumed) in the epoch
  uint64_t segment = 0;   // the next sample to read: index into the rank's segments ...
  uint64_t offset = 0;    // ... and its position within that segment's shard
  std::vector<Entry> buffer;  // the shuffle buffer's contents, in buffer order
};

// The position of a loader, enough to continue in a new process.
struct SHARDKIT_API LoaderState {
  int version = 2;           // 1: written before elastic resume (a per-rank cursor only)
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t next_batch = 0;   // index in this rank's epoch of the next batch Next() yields
  uint64_t num_samples = 0;  // dataset size (a mixture: its items; checked on restore)
  int rank = 0, world_size = 1;
  uint32_t batch_size = 0;
  // Version 2, random access: the global position. `position` positions of the epoch's
  // order were consumed by all ranks together before next_batch; the rank's plan began
  // at `start` (0, or where an elastic resume continued); the order has `epoch_size`
  // positions (the dataset's size, or a mixture's sum of counts). A restore with the same
  // world size and batch size continues at next_batch of the plan from `start`; with
  // others, from `position` (next_batch 0 of a new plan). `sources`: a mixture's (size,
  // count) per source, empty for one dataset; checked on restore.
  uint64_t position = 0, start = 0, epoch_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> sources;
  // Streamed mode: where the reader and shuffle buffer stand before batch next_batch.
  // A streamed loader given a state without it (has_stream false), or with one taken at
  // another (epoch, next_batch), replays the epoch's stream up to next_batch (reading,
  // not decoding: slower, same batches) instead.
  bool has_stream = false;
  StreamState stream;
  // {"version":2,"seed":..,"epoch":..,"next_batch":..,...,"position":..,"stream":{...}};
  // FromJson also reads version 1.
  std::string ToJson() const;
  static Result<LoaderState> FromJson(std::string_view json);
};

namespace detail {
struct BatchPool;
}

// One batch, or the end-of-epoch marker. Move-only. The data is valid while the Batch
// holds its buffer (until destruction or Release()).
class SHARDKIT_API Batch {
 public:
  Batch() = default;
  Batch(Batch&& o) noexcept;
  Batch& operator=(Batch&& o) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { Release(); }

  // True for the marker Next() returns after the last batch of the epoch.
  bool end_of_epoch() const { return end_; }
  // Returns the buffer to the pool now; the Batch becomes empty.
  void Release();

  void* data() { return data_; }
  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  // {n, c, h, w} for NCHW, {n, h, w, c} for NHWC; n = size() (<= batch_size).
  const int64_t* shape() const { return shape_; }
  size_t size() const { return size_t(shape_[0]); }
  size_t bytes() const;                            // of the valid rows
  const std::vector<int64_t>& labels() const { return labels_; }   // -1 where no `cls`
  const std::vector<std::string>& keys() const { return keys_; }
  const std::vector<uint64_t>& indices() const { return indices_; } // dataset indices
  const std::vector<uint32_t>& sources() const { return sources_; }
  // A mixture's source of each row (index into LoaderOptions::sources); empty otherwise.
  // indices() are then the mixture's items: a source's sample in one of its passes
  // (docs/loader.md, "Mixtures").
  // LoaderOptions::fields of the valid rows: field(f)[i] is row i's value of
  // options().fields[f]; nullopt where the sample has none (MissingFieldPolicy::kNull).
  size_t num_fields() const { return fields_.size(); }
  const std::vector<std::optional<Bytes>>& field(size_t f) const { return fields_[f]; }
  uint64_t epoch() const { return epoch_; }
  uint64_t index() const { return index_; }        // batch index within this rank's epoch
  int buffer_id() const { return slot_; }          // pool slot in [0, prefetch), stable
  bool pinned() const { return pinned_; }

 private:
  friend class Loader;
  std::shared_ptr<detail::BatchPool> pool_;
  int slot_ = -1;
  bool end_ = false;
  bool pinned_ = false;
  void* data_ = nullptr;
  DType dtype_ = DType::kUint8;
  Layout layout_ = Layout::kNHWC;
  int64_t shape_[4] = {0, 0, 0, 0};
  std::vector<int64_t> labels_;
  std::vector<std::string> keys_;
  std::vector<uint64_t> indices_;
  std::vector<uint32_t> sources_;
  std::vector<std::vector<std::optional<Bytes>>> fields_;  // [field][row]
  uint64_t epoch_ = 0, index_ = 0;
};

class SHARDKIT_API Loader {
 public:
  // Opens `address` (shardkit::Open). Reads it through NewRandomAccess, or streamed
  // (NewReader per shard) when opts.stream is set or the dataset has no random access.
  static Result<std::unique_ptr<Loader>> Create(std::string_view address, const LoaderOptions& opts);
  // Reads from an opened dataset (which the Loader then owns), as Create(address) does:
  // random access unless opts.stream or NewRandomAccess() is kUnsupported.
  static Result<std::unique_ptr<Loader>> Create(std::unique_ptr<Dataset> ds, const LoaderOptions& opts);
  // Reads from an existing random-access dataset; class names are unknown (empty).
  static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<RandomAccess> data, const LoaderOptions& opts);
  ~Loader();

  // Opens o.sources as one mixture (o.sources non-empty; each source opened with o.open).
  static Result<std::unique_ptr<Loader>> Create(const LoaderOptions& o);
  // Starts epoch e from its first batch (cancels work in flight for the old position).
  void set_epoch(uint64_t e);
  uint64_t epoch() const;
  // Batches this rank yields in the current epoch (the same on every rank; after an
  // elastic restore, the batches left from the resumed position).
  uint64_t num_batches() const;
  uint64_t num_samples() const;  // dataset size (a mixture: its items)
  uint64_t epoch_size() const;   // positions of an epoch's order (a mixture: sum of counts)
  // A mixture's sources: (samples, samples per epoch) of each; empty for one dataset.
  std::vector<std::pair<uint64_t, uint64_t>> mixture() const;
  int rank() const;
  int world_size() const;
  const LoaderOptions& options() const;
  const std::vector<std::string>& class_names() const;

  // The next batch of the epoch, in plan order; after the last one a Batch with
  // end_of_epoch() (again on every further call until set_epoch). A decode error under
  // kError comes back as that sample's Status (key and index in its Location) once the
  // batches before it have been handed out; the loader then keeps returning it until
  // set_epoch() or restore().
  Result<Batch> Next();

  // Under kSkip: the samples skipped so far in this epoch (Status naming each one).
  std::vector<Status> skipped() const;

  // Streamed mode's counters for the current epoch (all zero in random-access mode).
  struct StreamStats {
    bool streaming = false;
    uint64_t buffer_capacity = 0;  // shuffle_buffer (1 when not shuffling)
    uint64_t max_buffered = 0;     // the most samples the shuffle buffer held
    uint64_t samples_read = 0;     // samples read from shards (including skipped-over ones)
    uint64_t shards_opened = 0;
  };
  // Safe to call between Next() calls (it waits for the reader thread's counters).
  StreamStats stream_stats() const;
  bool streaming() const;

  // Prefetching across epochs (LoaderOptions::prefetch_next_epoch): counters since
  // Create(), for tests and benchmarks. Safe to call between Next() calls.
  struct PrefetchStats {
    uint64_t speculated = 0;   // batches of a next epoch submitted before its set_epoch
    uint64_t adopted = 0;      // of those, kept by set_epoch(e + 1)
    uint64_t discarded = 0;    // of those, dropped (set_epoch(other), restore, destruction)
    uint64_t ready_ahead = 0;  // now: batches of the next epoch decoded and waiting
    uint64_t decoding_ahead = 0;  // now: batches of the next epoch still being decoded
    uint64_t next_calls = 0;   // Next() calls that returned a batch (or its error)
    uint64_t next_waited = 0;  // of those, the calls whose batch was not decoded yet
    bool last_next_waited = false;  // the latest of those calls waited
  };
  PrefetchStats prefetch_stats() const;

  // The position: the batch that the next Next() returns.
  LoaderState save_state() const;
  // Continues from `s`, taken from a loader over the same dataset (or mixture) and seed.
  // Same world size and batch size: at s.next_batch (any rank's state will do: ranks
  // move in step). Other world size or batch size (version 2, random access): from the
  // global position s.position, every sample of the epoch's order that no rank consumed
  // yet delivered once across the new ranks (the rest of the epoch is cut by the usual
  // drop_last / padding rule). Anything else is kInvalidArgument naming what differs.
  Status restore(const LoaderState& s);

 private:
  struct SHARDKIT_HIDDEN Impl;
  explicit Loader(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<Loader>> CreateStreamed(std::unique_ptr<Dataset> ds, const LoaderOptions& opts);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardkit
