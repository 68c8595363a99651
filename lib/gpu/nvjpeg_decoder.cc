// gpu/nvjpeg_decoder.cc: see nvjpeg_decoder.h.
#include "gpu/nvjpeg_decoder.h"

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include <string>

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

}  // namespace

struct NvjpegDecoder::Impl {
  int device = 0;
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
  // The hardware backend exists only on GPUs with JPEG engines (A100, H100, H200, ...).
  if (use_hardware && nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &m.handle) == NVJPEG_STATUS_SUCCESS) {
    d->hw_ = true;
  } else {
    m.handle = nullptr;
    SK_NVJPEG_RETURN(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &m.handle));
  }
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
    SK_NVJPEG_RETURN(nvjpegBufferPinnedCreate(m.handle, nullptr, &c.pinned));
    SK_NVJPEG_RETURN(nvjpegBufferDeviceCreate(m.handle, nullptr, &c.devbuf));
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
    SK_CUDA_RETURN(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
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

Status NvjpegDecoder::Join(void* stream) {
  for (auto& c : impl_->ctx) {
    if (!c.used) continue;
    SK_CUDA_RETURN(cudaStreamWaitEvent(AsStream(stream), c.event, 0));
    c.used = false;
  }
  return Status::OK();
}

}  // namespace shardkit::gpu
