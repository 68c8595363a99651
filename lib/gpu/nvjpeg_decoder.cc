// gpu/nvjpeg_decoder.cc: see nvjpeg_decoder.h.
#include "gpu/nvjpeg_decoder.h"

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "gpu/cuda_util.h"

namespace shardkit::gpu {
namespace {

const char* NvjpegStatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    default: return "unknown nvJPEG status";
  }
}

Status NvError(nvjpegStatus_t s, const char* what) {
  Code c = (s == NVJPEG_STATUS_BAD_JPEG || s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED) ? Code::kCorrupt : Code::kInternal;
  return Status(c, std::string(what) + ": " + NvjpegStatusName(s) + " (" + std::to_string(int(s)) + ")");
}

#define SK_NVJPEG_RETURN(expr)                                             \
  do {                                                                     \
    nvjpegStatus_t sk_ns_ = (expr);                                        \
    if (sk_ns_ != NVJPEG_STATUS_SUCCESS) return NvError(sk_ns_, #expr);    \
  } while (0)

// nvJPEG's buffers (its decoder states, the hardware batch's pools, the pinned and device
// buffers of the CUDA backends) grow to the largest image seen. With the default
// allocators every growth is a cudaFree / cudaFreeHost of the old buffer, and each of
// those waits for the whole device and holds the driver's lock meanwhile: the training
// loop's kernel launches stall behind it (issue 16 counted ~35 such frees per 30 steps).
// This cache hands nvJPEG blocks that are never returned to CUDA while the decoder lives:
// a freed block goes to a free list (with an event recorded on the stream nvJPEG names,
// waited for on the host before the block is handed out again), and the next request of
// a size it covers (at most twice the request) takes it. Memory stays at the high-water
// mark, reported by bytes(). Thread-safe (nvJPEG calls it from every decoding thread).
class BlockCache {
 public:
  explicit BlockCache(bool pinned) : pinned_(pinned) {}
  ~BlockCache() {
    for (auto& [p, b] : blocks_) {
      if (b.ev) SK_CUDA_IGNORE(cudaEventSynchronize(b.ev));
      if (b.ev) SK_CUDA_IGNORE(cudaEventDestroy(b.ev));
      if (pinned_) {
        SK_CUDA_IGNORE(cudaFreeHost(p));
      } else {
        SK_CUDA_IGNORE(cudaFree(p));
      }
    }
  }
  int Alloc(void** p, size_t size) {
    const size_t want = RoundUp(size);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first <= 2 * want) {
      void* q = it->second;
      free_.erase(it);
      Block& b = blocks_[q];
      if (b.ev && cudaEventSynchronize(b.ev) != cudaSuccess) return 1;  // its last user is done
      *p = q;
      return 0;
    }
    void* q = nullptr;
    cudaError_t e = pinned_ ? cudaHostAlloc(&q, want, cudaHostAllocDefault) : cudaMalloc(&q, want);
    if (e != cudaSuccess) return 1;
    blocks_[q] = Block{want, nullptr};
    bytes_ += want;
    *p = q;
    return 0;
  }
  int Free(void* p, cudaStream_t stream) {
    if (!p) return 0;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return 1;
    Block& b = it->second;
    if (!b.ev && cudaEventCreateWithFlags(&b.ev, cudaEventDisableTiming) != cudaSuccess) b.ev = nullptr;
    if (b.ev && cudaEventRecord(b.ev, stream) != cudaSuccess) {
      SK_CUDA_IGNORE(cudaEventDestroy(b.ev));
      b.ev = nullptr;
      SK_CUDA_IGNORE(cudaStreamSynchronize(stream));  // (never seen: be safe, not fast)
    }
    free_.emplace(b.size, p);
    return 0;
  }
  size_t bytes() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
  }

  static int DevMalloc(void* ctx, void** p, size_t size, cudaStream_t) {
    return static_cast<BlockCache*>(ctx)->Alloc(p, size);
  }
  static int DevFree(void* ctx, void* p, size_t, cudaStream_t stream) {
    return static_cast<BlockCache*>(ctx)->Free(p, stream);
  }

 private:
  static size_t RoundUp(size_t n) {
    size_t r = size_t(64) << 10;  // 64 KiB, then powers of two: few sizes, easy reuse
    while (r < n) r <<= 1;
    return r;
  }
  struct Block {
    size_t size = 0;
    cudaEvent_t ev = nullptr;  // recorded when freed
  };
  const bool pinned_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;
  std::multimap<size_t, void*> free_;
  size_t bytes_ = 0;
};

}  // namespace

struct NvjpegDecoder::Impl {
  int device = 0;
  // Declared before the handle: destroyed after everything nvJPEG allocated from them.
  BlockCache dev_cache{false}, pinned_cache{true};
  nvjpegDevAllocatorV2_t dev_alloc{};
  nvjpegPinnedAllocatorV2_t pinned_alloc{};
  nvjpegHandle_t handle = nullptr;
  // Hardware, batched: one state and one set of per-image params per set.
  std::vector<nvjpegJpegState_t> hw_state;
  std::vector<std::vector<nvjpegDecodeParams_t>> hw_params;
  std::vector<const unsigned char*> hw_data;
  std::vector<size_t> hw_len;
  std::vector<nvjpegImage_t> hw_out;
  // CUDA backends.
  nvjpegJpegDecoder_t dec_gpu = nullptr;   // GPU_HYBRID
  nvjpegJpegDecoder_t dec_host = nullptr;  // HYBRID
  struct Ctx {
    nvjpegJpegState_t st_gpu = nullptr, st_host = nullptr;
    nvjpegBufferPinned_t pinned = nullptr;
    nvjpegBufferDevice_t devbuf = nullptr;
    nvjpegJpegStream_t jstream = nullptr;
    nvjpegDecodeParams_t params = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
    bool used = false;
  };
  std::vector<Ctx> ctx;

  ~Impl() {
    SK_CUDA_IGNORE(cudaSetDevice(device));
    for (auto& c : ctx)
      if (c.stream) SK_CUDA_IGNORE(cudaStreamSynchronize(c.stream));
    SK_CUDA_IGNORE(cudaDeviceSynchronize());
    for (auto& c : ctx) {
      if (c.params) nvjpegDecodeParamsDestroy(c.params);
      if (c.jstream) nvjpegJpegStreamDestroy(c.jstream);
      if (c.st_gpu) nvjpegJpegStateDestroy(c.st_gpu);
      if (c.st_host) nvjpegJpegStateDestroy(c.st_host);
      if (c.pinned) nvjpegBufferPinnedDestroy(c.pinned);
      if (c.devbuf) nvjpegBufferDeviceDestroy(c.devbuf);
      if (c.event) SK_CUDA_IGNORE(cudaEventDestroy(c.event));
      if (c.stream) SK_CUDA_IGNORE(cudaStreamDestroy(c.stream));
    }
    for (auto& v : hw_params)
      for (auto p : v)
        if (p) nvjpegDecodeParamsDestroy(p);
    for (auto s : hw_state)
      if (s) nvjpegJpegStateDestroy(s);
    if (dec_gpu) nvjpegDecoderDestroy(dec_gpu);
    if (dec_host) nvjpegDecoderDestroy(dec_host);
    if (handle) nvjpegDestroy(handle);
  }
};

NvjpegDecoder::~NvjpegDecoder() = default;

Result<std::unique_ptr<NvjpegDecoder>> NvjpegDecoder::Create(int device, int threads, int max_batch, int sets,
                                                            bool use_hardware) {
  std::unique_ptr<NvjpegDecoder> d(new NvjpegDecoder());
  d->impl_ = std::make_unique<Impl>();
  Impl& m = *d->impl_;
  m.device = device;
  SK_CUDA_RETURN(cudaSetDevice(device));
  m.dev_alloc.dev_malloc = &BlockCache::DevMalloc;
  m.dev_alloc.dev_free = &BlockCache::DevFree;
  m.dev_alloc.dev_ctx = &m.dev_cache;
  m.pinned_alloc.pinned_malloc = &BlockCache::DevMalloc;
  m.pinned_alloc.pinned_free = &BlockCache::DevFree;
  m.pinned_alloc.pinned_ctx = &m.pinned_cache;
  // The hardware backend exists only on GPUs with JPEG engines (A100, H100, H200, ...).
  if (use_hardware && nvjpegCreateExV2(NVJPEG_BACKEND_HARDWARE, &m.dev_alloc, &m.pinned_alloc, 0, &m.handle) ==
                          NVJPEG_STATUS_SUCCESS) {
    d->hw_ = true;
  } else {
    m.handle = nullptr;
    SK_NVJPEG_RETURN(nvjpegCreateExV2(NVJPEG_BACKEND_DEFAULT, &m.dev_alloc, &m.pinned_alloc, 0, &m.handle));
  }
  // Grown buffers get 1 MiB of headroom: fewer growths (each now only a cache lookup).
  (void)nvjpegSetDeviceMemoryPadding(size_t(1) << 20, m.handle);
  (void)nvjpegSetPinnedMemoryPadding(size_t(1) << 20, m.handle);
  int least_priority = 0, greatest_priority = 0;
  SK_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  if (d->hw_) {
    m.hw_state.assign(size_t(sets), nullptr);
    m.hw_params.assign(size_t(sets), std::vector<nvjpegDecodeParams_t>(size_t(max_batch), nullptr));
    for (int s = 0; s < sets; ++s) {
      SK_NVJPEG_RETURN(nvjpegJpegStateCreate(m.handle, &m.hw_state[size_t(s)]));
      for (auto& p : m.hw_params[size_t(s)]) {
        SK_NVJPEG_RETURN(nvjpegDecodeParamsCreate(m.handle, &p));
        SK_NVJPEG_RETURN(nvjpegDecodeParamsSetOutputFormat(p, NVJPEG_OUTPUT_RGBI));
      }
      // Optional: size the hardware decoder's pools up front (ignored when unsupported).
      (void)nvjpegDecodeBatchedPreAllocate(m.handle, m.hw_state[size_t(s)], max_batch, 640, 480, NVJPEG_CSS_420,
                                           NVJPEG_OUTPUT_RGBI);
    }
    m.hw_data.resize(size_t(max_batch));
    m.hw_len.resize(size_t(max_batch));
    m.hw_out.resize(size_t(max_batch));
  }
  d->cuda_ = nvjpegDecoderCreate(m.handle, NVJPEG_BACKEND_GPU_HYBRID, &m.dec_gpu) == NVJPEG_STATUS_SUCCESS;
  if (!d->cuda_) m.dec_gpu = nullptr;
  if (nvjpegDecoderCreate(m.handle, NVJPEG_BACKEND_HYBRID, &m.dec_host) != NVJPEG_STATUS_SUCCESS) {
    m.dec_host = nullptr;
  } else {
    d->cuda_ = true;
  }
  m.ctx.resize(size_t(threads));
  for (auto& c : m.ctx) {
    SK_NVJPEG_RETURN(nvjpegJpegStreamCreate(m.handle, &c.jstream));
    SK_NVJPEG_RETURN(nvjpegDecodeParamsCreate(m.handle, &c.params));
    SK_NVJPEG_RETURN(nvjpegDecodeParamsSetOutputFormat(c.params, NVJPEG_OUTPUT_RGBI));
    if (!d->cuda_) continue;
    SK_NVJPEG_RETURN(nvjpegBufferPinnedCreateV2(m.handle, &m.pinned_alloc, &c.pinned));
    SK_NVJPEG_RETURN(nvjpegBufferDeviceCreateV2(m.handle, &m.dev_alloc, &c.devbuf));
    if (m.dec_gpu) {
      SK_NVJPEG_RETURN(nvjpegDecoderStateCreate(m.handle, m.dec_gpu, &c.st_gpu));
      SK_NVJPEG_RETURN(nvjpegStateAttachPinnedBuffer(c.st_gpu, c.pinned));
      SK_NVJPEG_RETURN(nvjpegStateAttachDeviceBuffer(c.st_gpu, c.devbuf));
    }
    if (m.dec_host) {
      SK_NVJPEG_RETURN(nvjpegDecoderStateCreate(m.handle, m.dec_host, &c.st_host));
      SK_NVJPEG_RETURN(nvjpegStateAttachPinnedBuffer(c.st_host, c.pinned));
      SK_NVJPEG_RETURN(nvjpegStateAttachDeviceBuffer(c.st_host, c.devbuf));
    }
    // The lowest priority: the model's kernels go first (docs/gpu.md).
    SK_CUDA_RETURN(cudaStreamCreateWithPriority(&c.stream, cudaStreamNonBlocking, least_priority));
    SK_CUDA_RETURN(cudaEventCreateWithFlags(&c.event, cudaEventDisableTiming));
  }
  return d;
}

bool NvjpegDecoder::Inspect(int tid, bool hw_candidate, NvItem* item) {
  Impl& m = *impl_;
  Impl::Ctx& c = m.ctx[size_t(tid)];
  if (nvjpegJpegStreamParseHeader(m.handle, item->data, item->size, c.jstream) != NVJPEG_STATUS_SUCCESS) return false;
  const bool want_roi = item->roi;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool roi = attempt == 0 && want_roi;
    if (attempt == 1 && !want_roi) break;
    if (roi) {
      if (nvjpegDecodeParamsSetROI(c.params, item->x, item->y, item->w, item->h) != NVJPEG_STATUS_SUCCESS) continue;
    } else {
      nvjpegDecodeParamsSetROI(c.params, 0, 0, -1, -1);
    }
    int unsupported = 1;
    if (hw_ && hw_candidate &&
        nvjpegDecodeBatchedSupportedEx(m.handle, c.jstream, c.params, &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0) {
      item->roi = roi;
      item->backend = 1;
      return true;
    }
    unsupported = 1;
    if (m.dec_gpu && nvjpegDecoderJpegSupported(m.dec_gpu, c.jstream, c.params, &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0) {
      item->roi = roi;
      item->backend = 2;
      return true;
    }
    unsupported = 1;
    if (m.dec_host &&
        nvjpegDecoderJpegSupported(m.dec_host, c.jstream, c.params, &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0) {
      item->roi = roi;
      item->backend = 3;
      return true;
    }
  }
  return false;
}

Status NvjpegDecoder::DecodeHardware(int set, const std::vector<NvItem*>& items, void* stream) {
  if (items.empty()) return Status::OK();
  Impl& m = *impl_;
  const size_t n = items.size();
  if (n > m.hw_data.size()) return Status::Internal("hardware batch larger than the batch size");
  auto& params = m.hw_params[size_t(set)];
  for (size_t i = 0; i < n; ++i) {
    const NvItem& it = *items[i];
    m.hw_data[i] = it.data;
    m.hw_len[i] = it.size;
    nvjpegImage_t out{};
    out.channel[0] = it.dst;
    out.pitch[0] = size_t(it.pitch);
    m.hw_out[i] = out;
    if (it.roi)
      SK_NVJPEG_RETURN(nvjpegDecodeParamsSetROI(params[i], it.x, it.y, it.w, it.h));
    else
      SK_NVJPEG_RETURN(nvjpegDecodeParamsSetROI(params[i], 0, 0, -1, -1));
  }
  nvjpegJpegState_t st = m.hw_state[size_t(set)];
  SK_NVJPEG_RETURN(nvjpegDecodeBatchedInitialize(m.handle, st, int(n), 1, NVJPEG_OUTPUT_RGBI));
  SK_NVJPEG_RETURN(nvjpegDecodeBatchedEx(m.handle, st, m.hw_data.data(), m.hw_len.data(), m.hw_out.data(),
                                         params.data(), AsStream(stream)));
  return Status::OK();
}

Status NvjpegDecoder::DecodeCuda(int tid, const NvItem& it) {
  Impl& m = *impl_;
  Impl::Ctx& c = m.ctx[size_t(tid)];
  // The pinned buffer of the previous image of this thread must have been transferred.
  SK_CUDA_RETURN(cudaStreamSynchronize(c.stream));
  nvjpegJpegDecoder_t dec = it.backend == 2 ? m.dec_gpu : m.dec_host;
  nvjpegJpegState_t st = it.backend == 2 ? c.st_gpu : c.st_host;
  if (!dec || !st) return Status::Internal("no nvJPEG CUDA decoder for this image");
  SK_NVJPEG_RETURN(nvjpegJpegStreamParse(m.handle, it.data, it.size, 0, 0, c.jstream));
  if (it.roi)
    SK_NVJPEG_RETURN(nvjpegDecodeParamsSetROI(c.params, it.x, it.y, it.w, it.h));
  else
    SK_NVJPEG_RETURN(nvjpegDecodeParamsSetROI(c.params, 0, 0, -1, -1));
  SK_NVJPEG_RETURN(nvjpegDecodeJpegHost(m.handle, dec, st, c.params, c.jstream));
  SK_NVJPEG_RETURN(nvjpegDecodeJpegTransferToDevice(m.handle, dec, st, c.jstream, c.stream));
  nvjpegImage_t out{};
  out.channel[0] = it.dst;
  out.pitch[0] = size_t(it.pitch);
  SK_NVJPEG_RETURN(nvjpegDecodeJpegDevice(m.handle, dec, st, &out, c.stream));
  SK_CUDA_RETURN(cudaEventRecord(c.event, c.stream));
  c.used = true;
  return Status::OK();
}

size_t NvjpegDecoder::cached_device_bytes() const { return impl_->dev_cache.bytes(); }
size_t NvjpegDecoder::cached_pinned_bytes() const { return impl_->pinned_cache.bytes(); }

Status NvjpegDecoder::Join(void* stream) {
  for (auto& c : impl_->ctx) {
    if (!c.used) continue;
    SK_CUDA_RETURN(cudaStreamWaitEvent(AsStream(stream), c.event, 0));
    c.used = false;
  }
  return Status::OK();
}

}  // namespace shardkit::gpu
