// shardkit/gpu.h: batches delivered in GPU memory (issue 7).
//
// A GpuLoader hands out DeviceBatch es whose pixels live on a CUDA device, in two ways:
//
//  - decoder = cpu (the copy path): the streaming Loader (shardkit/loader.h) decodes and
//    augments on the CPU into page-locked uint8 NHWC buffers; each batch is copied with
//    cudaMemcpyAsync on the GpuLoader's own non-blocking stream into a device ring slot,
//    and a CUDA kernel converts it there to the requested dtype/layout with mean/std. Only
//    uint8 crosses the bus (a quarter of float32's bytes).
//  - decoder = gpu: JPEG decoding moves to the GPU with nvJPEG: the hardware JPEG engines
//    (batched) for baseline 4:4:4/4:2:2/4:2:0/4:4:0 colour JPEGs, nvJPEG's CUDA backends
//    (GPU_HYBRID, else HYBRID) for the rest (progressive, grayscale), and libjpeg-turbo on
//    the host for what nvJPEG cannot decode (CMYK/YCCK, PNG, damaged files), in the same
//    batch. The crop box and flip are the CPU loader's (the same pure function of (seed,
//    epoch, sample index)); only the crop's region is decoded where nvJPEG allows it; the
//    resize (the CPU loader's filter weights, computed by the same host code), flip and
//    normalisation run in a CUDA kernel.
//  - decoder = auto: gpu when a CUDA device and nvJPEG are available, else cpu.
//
// Order, partition across ranks, padding and the crop/flip of every sample are those of
// the CPU Loader with the same LoaderOptions (docs/loader.md); see docs/gpu.md for how
// exactly the pixels agree.
//
// No CUDA type appears here: streams and events are passed as void* (cudaStream_t and
// cudaEvent_t are pointers). nullptr as a stream means the legacy default stream.
//
// Threading: a GpuLoader's methods are called from one thread at a time (the consumer).
// A DeviceBatch may be moved to, used from and released on any thread.
//
// Lifetime and reuse of device memory: the device ring has GpuOptions::ring slots,
// allocated once at Create(). A slot is written again only after (1) its DeviceBatch was
// released (Release() or destruction) and (2) the work the consumer had queued on the
// release stream at that moment has completed on the device (an event recorded at
// release; the loader's stream waits for it on the device, the host does not block).
// The consumer may hold at most ring - 1 batches while calling Next(); holding all of them
// makes Next() fail with kInvalidArgument instead of waiting forever. A DeviceBatch may
// outlive its GpuLoader; device memory is freed when both are gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/loader.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

// True when this build has the CUDA code (CMake found the toolkit).
SHARDKIT_API bool CudaCompiled();
// True when this build has the nvJPEG decoder (nvjpeg.h and libnvjpeg were found).
SHARDKIT_API bool NvjpegCompiled();
// Number of usable CUDA devices; 0 when the build has no CUDA, no driver or no device.
SHARDKIT_API int CudaDeviceCount();
// Why no device is usable ("" when one is): e.g. "no CUDA device: cudaGetDeviceCount:
// no CUDA-capable device is detected" or "built without CUDA".
SHARDKIT_API std::string CudaUnavailableReason();

// Page-locked host memory from cudaHostAlloc (portable, usable by any device), for
// LoaderOptions::allocator. Returns null (and sets *why) when CUDA is not usable.
SHARDKIT_API std::shared_ptr<HostAllocator> PinnedHostAllocator(std::string* why = nullptr);

enum class DecoderKind { kCpu, kGpu, kAuto };
SHARDKIT_API const char* DecoderName(DecoderKind d);  // "cpu", "gpu", "auto"

struct GpuOptions {
  int device = 0;                          // CUDA device ordinal
  DecoderKind decoder = DecoderKind::kAuto;
  int ring = 3;                            // device batch slots (>= 2)
  // gpu decode: host threads (read, parse, host decode). 0 = LoaderOptions::threads, or
  // when that is 0 too, the CPUs of the affinity mask minus 2 (the consumer's thread and
  // the decoder's, which spins in nvJPEG's batched call). The copy path: minus 1.
  int host_threads = 0;
  bool roi_decode = true;                  // gpu decode: decode only the crop's region where nvJPEG allows
  bool hardware_decoder = true;            // gpu decode: use the hardware JPEG engines when present
  // gpu decode: the share of the JPEGs the hardware engines could take that they do take;
  // the rest are decoded by the host threads at the same time, so that both the engines
  // and the CPU cores work. Set (in [0, 1]): which images go where is a function of the
  // sample index only (never of timing): bit-exact reruns. < 0 with decoder kGpu: the
  // default (kDefaultHardwareLoad). < 0 with decoder kAuto: adaptive placement, starting
  // at the default and moved after every batch by what the consumer waits (docs/gpu.md
  // "Placement"); pixels then differ between runs within the cross-decoder tolerance.
  // 1: every image the engines accept. (Python: Loader(hardware_load=).)
  double hardware_load = -1;
  static constexpr double kDefaultHardwareLoad = 0.7;  // best of 1, 0.7, 0.65, 0.55 on an H200 (docs/gpu.md)
  // gpu decode, for tests: route every image through libjpeg-turbo on the host (the
  // resize, flip and normalisation still run on the GPU).
  bool force_cpu_decode = false;
  // gpu decode: time where the producer spends it (host seconds per phase, GPU
  // milliseconds of the hardware decode and the resize), read with GpuLoader::profile().
  // Off by default: it records two more CUDA events per batch.
  bool profile = false;
  // The stream on which the consumer uses batches (cudaStream_t; nullptr = legacy default
  // stream). A batch destroyed without an explicit Release(stream) is released on it.
  void* consumer_stream = nullptr;
};

// Checks `o` and `g` as GpuLoader::Create does, before it touches a device: OK, or
// kInvalidArgument naming the first bad option. The checks of Validate(o) (shardkit/
// loader.h), with the output size up to 8192 (the resize kernel's limit), and ring in
// [2, 64], host_threads in [0, 4096], hardware_load < 0 or in [0, 1].
SHARDKIT_API Status Validate(const LoaderOptions& o, const GpuOptions& g);

namespace detail {
struct DeviceRing;
}

// One batch in device memory, or the end-of-epoch marker. Move-only.
class SHARDKIT_API DeviceBatch {
 public:
  DeviceBatch() = default;
  DeviceBatch(DeviceBatch&& o) noexcept;
  DeviceBatch& operator=(DeviceBatch&& o) noexcept;
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;
  ~DeviceBatch();

  bool end_of_epoch() const { return end_; }

  // Device pointer to the batch (valid rows first), valid until Release().
  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  const int64_t* shape() const { return shape_; }  // {n,c,h,w} (NCHW) or {n,h,w,c} (NHWC)
  size_t size() const { return size_t(shape_[0]); }
  size_t bytes() const;
  const std::vector<int64_t>& labels() const { return labels_; }
  const std::vector<std::string>& keys() const { return keys_; }
  const std::vector<uint64_t>& indices() const { return indices_; }
  // A mixture's source of each row (as Batch::sources()); empty for one dataset.
  const std::vector<uint32_t>& sources() const { return sources_; }
  // LoaderOptions::fields of the valid rows (host memory), as Batch::field.
  size_t num_fields() const { return fields_.size(); }
  const std::vector<std::optional<Bytes>>& field(size_t f) const { return fields_[f]; }
  uint64_t epoch() const { return epoch_; }
  uint64_t index() const { return index_; }
  int device() const { return device_; }
  int slot() const { return slot_; }

  // cudaEvent_t recorded on the loader's stream once the data is complete.
  void* ready_event() const;
  // Makes `stream` wait (on the device) until the data is complete. Host does not block.
  Status WaitOn(void* stream) const;
  // Blocks the host until the data is complete.
  Status Synchronize() const;
  // Blocking copy of the valid rows to host memory (dst of at least bytes()).
  Status CopyToHost(void* dst) const;
  // Gives the slot back; `stream` is where the consumer used the data (the slot is reused
  // only after the work queued there so far has completed). Idempotent.
  void Release(void* stream);
  void Release();  // on GpuOptions::consumer_stream

 private:
  friend class GpuLoader;
  friend struct GpuLoaderAccess;
  std::shared_ptr<detail::DeviceRing> ring_;
  int slot_ = -1;
  bool end_ = false;
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
  int device_ = 0;
};

class SHARDKIT_API GpuLoader {
 public:
  // Fails with kUnsupported (message says why) when the build has no CUDA, when no device
  // is usable, or when decoder = gpu and the build has no nvJPEG.
  static Result<std::unique_ptr<GpuLoader>> Create(std::string_view address, const LoaderOptions& opts,
                                                   const GpuOptions& gopts);
  static Result<std::unique_ptr<GpuLoader>> Create(std::shared_ptr<RandomAccess> data, const LoaderOptions& opts,
                                                   const GpuOptions& gopts);
  // Reads from an opened dataset (which the GpuLoader then owns; e.g. opened with
  // OpenOptions::format_options), as Create(address) does.
  static Result<std::unique_ptr<GpuLoader>> Create(std::unique_ptr<Dataset> ds, const LoaderOptions& opts,
                                                   const GpuOptions& gopts);
  ~GpuLoader();

  // Positions at the start of epoch e (the batches depend only on e and the options).
  // Right after the end of epoch e - 1 it keeps the batches of e already made ahead
  // (LoaderOptions::prefetch_next_epoch, both paths); otherwise it drops the work in
  // flight and starts again (the GPU decode path keeps it when already at e's start).
  void set_epoch(uint64_t e);
  uint64_t epoch() const;
  uint64_t num_batches() const;
  uint64_t num_samples() const;
  DecoderKind decoder() const;  // what is in use: kCpu or kGpu (never kAuto)
  int threads() const;          // host decoding threads in use (LoaderOptions::threads resolved)
  // The loader's cudaStream_t (copies, decode, kernels; the GPU decode path resizes into
  // the ring on a second stream of the same, lowest, priority): use a batch's ready event
  // (DeviceBatch), not this stream, to order work after a batch.
  void* stream() const;

  // The next batch of the epoch, or the end-of-epoch marker; errors as Loader::Next().
  Result<DeviceBatch> Next();

  // Under kSkip: the samples skipped so far in this epoch (batches made ahead included).
  std::vector<Status> skipped() const;

  // The position: the batch that the next Next() returns (batches prepared ahead on the
  // device do not count). The same LoaderState as Loader's: a GpuLoader can resume a
  // CPU Loader's run and the reverse.
  LoaderState save_state() const;
  // Continues from `s` as Loader::restore does, on both paths: the same world size and
  // batch size at s.next_batch (the batches then equal those of the uninterrupted run),
  // another one from the global position s.position (an elastic resume); anything else
  // is kInvalidArgument naming what differs.
  Status restore(const LoaderState& s);

  struct Stats {
    uint64_t batches = 0;
    uint64_t images_hardware = 0;  // decoded by nvJPEG's hardware engines
    uint64_t images_cuda = 0;      // decoded by nvJPEG's CUDA (hybrid) backends
    uint64_t images_host = 0;      // decoded by libjpeg-turbo / libpng on the host
    uint64_t images_roi = 0;       // of the nvJPEG ones, decoded as a region only
    uint64_t bytes_uploaded = 0;   // host -> device
    double next_wait_s = 0;        // time the consumer spent inside Next()
    // gpu decode: the share of engine-decodable JPEGs sent to the engines now (< 0 on the
    // copy path); adaptive: it moves with the consumer (decoder auto, hardware_load unset).
    double hardware_share = -1;
    bool adaptive = false;
    uint64_t nvjpeg_device_bytes = 0;  // nvJPEG's own device buffers (a cache that only grows)
    // gpu decode with LoaderOptions::prefetch_next_epoch: batches of epoch e + 1 made
    // after the end of epoch e and waiting for set_epoch(e + 1) now, and the batches
    // such a set_epoch kept since Create() (0 on the copy path, whose CPU Loader does it).
    uint64_t next_epoch_ready = 0;
    uint64_t next_epoch_adopted = 0;
  };
  Stats stats() const;

  // Where the GPU decode path spends its time (GpuOptions::profile; all zero when off,
  // and on the copy path). Host seconds summed over the batches; GPU milliseconds summed
  // over the batches whose timing events have completed. Four stages run at once on
  // different batches: phase 1 on the host threads (several batches), the packer, the
  // decoder, the submitter (docs/gpu.md).
  struct Profile {
    bool enabled = false;
    uint64_t batches = 0;        // batches the producer started
    double acquire_s = 0;        // submitter: waiting for a free ring slot
    double wait_set_s = 0;       // producer: waiting for the batch's host/device set to be free
    double phase1_s = 0;         // phase 1 (read, parse headers, choose crops, host decode),
                                 //   from posting a batch's rows to its last row done
    double handoff_s = 0;        // decoder: waiting for the next batch to be packed
    double pack_s = 0;           // packer: pack descriptors, weights, pixels, upload
    double hw_call_s = 0;        // decoder: inside the hardware engines' batched decode call
    double cuda_rows_s = 0;      // decoder: the call and the CUDA-backend rows, to the join
    double tail_s = 0;           // submitter: resize launch and events
    double rows_nvjpeg_s = 0;    // phase 1 rows routed to nvJPEG (read, parse, inspect), thread-seconds
    double rows_host_s = 0;      // phase 1 rows decoded on the host (read, decode, pack), thread-seconds
    double gpu_hw_decode_ms = 0; // GPU time: nvJPEG decode
    double gpu_resize_ms = 0;    // GPU time: the resize kernel
    uint64_t gpu_timed = 0;      // batches whose GPU times are in the two sums above
  };
  // Safe to call between Next() calls.
  Profile profile() const;

  struct SHARDKIT_HIDDEN Impl;

 private:
  explicit GpuLoader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardkit
