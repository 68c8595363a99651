// gpu/device_batch.cc: DeviceBatch, the device ring, and CUDA availability.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "gpu/cuda_util.h"
#include "gpu/ring.h"
#include "shardkit/gpu.h"

namespace shardkit {

bool CudaCompiled() { return true; }

bool NvjpegCompiled() {
#ifdef SHARDKIT_HAVE_NVJPEG
  return true;
#else
  return false;
#endif
}

std::string CudaUnavailableReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return "";
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {
class PinnedAllocator final : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void Deallocate(void* p, size_t) override {
    if (p) SK_CUDA_IGNORE(cudaFreeHost(p));
  }
  bool pinned() const override { return true; }
};
}  // namespace

std::shared_ptr<HostAllocator> PinnedHostAllocator(std::string* why) {
  std::string r = CudaUnavailableReason();
  if (!r.empty()) {
    if (why) *why = r;
    return nullptr;
  }
  return std::make_shared<PinnedAllocator>();
}

const char* DecoderName(DecoderKind d) {
  switch (d) {
    case DecoderKind::kCpu: return "cpu";
    case DecoderKind::kGpu: return "gpu";
    case DecoderKind::kAuto: return "auto";
  }
  return "?";
}

// ---- the ring ----

namespace detail {

DeviceRing::~DeviceRing() {
  if (slots.empty()) return;
  SK_CUDA_IGNORE(cudaSetDevice(device));
  for (auto& s : slots) {
    // Work reading or writing the slot may still be queued: wait for it.
    if (s.released) SK_CUDA_IGNORE(cudaEventSynchronize(s.released));
    if (s.ready) SK_CUDA_IGNORE(cudaEventSynchronize(s.ready));
    if (s.staging && s.staging != s.out) SK_CUDA_IGNORE(cudaFree(s.staging));
    if (s.out) SK_CUDA_IGNORE(cudaFree(s.out));
    if (s.ready) SK_CUDA_IGNORE(cudaEventDestroy(s.ready));
    if (s.released) SK_CUDA_IGNORE(cudaEventDestroy(s.released));
  }
}

Status DeviceRing::Init(int dev, int count, size_t out_b, size_t staging_b, bool staging_is_out) {
  device = dev;
  out_bytes = out_b;
  staging_bytes = staging_b;
  SK_CUDA_RETURN(cudaSetDevice(dev));
  slots.resize(size_t(count));
  for (auto& s : slots) {
    SK_CUDA_RETURN(cudaMalloc(&s.out, out_b));
    if (staging_is_out) {
      s.staging = static_cast<uint8_t*>(s.out);
    } else if (staging_b > 0) {
      void* p = nullptr;
      SK_CUDA_RETURN(cudaMalloc(&p, staging_b));
      s.staging = static_cast<uint8_t*>(p);
    }
    SK_CUDA_RETURN(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
    SK_CUDA_RETURN(cudaEventCreateWithFlags(&s.released, cudaEventDisableTiming));
  }
  return Status::OK();
}

int DeviceRing::TryAcquire() {
  std::lock_guard<std::mutex> lk(mu);
  for (size_t k = 0; k < slots.size(); ++k) {
    size_t i = (next + k) % slots.size();
    if (!slots[i].held) {
      slots[i].held = true;
      next = (i + 1) % slots.size();
      return int(i);
    }
  }
  return -1;
}

int DeviceRing::Acquire(const std::atomic<bool>* stop) {
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    if (stop->load()) return -1;
    for (size_t k = 0; k < slots.size(); ++k) {
      size_t i = (next + k) % slots.size();
      if (!slots[i].held) {
        slots[i].held = true;
        next = (i + 1) % slots.size();
        return int(i);
      }
    }
    cv.wait(lk);
  }
}

void DeviceRing::Release(int slot, void* stream) {
  {
    std::lock_guard<std::mutex> lk(mu);
    Slot& s = slots[size_t(slot)];
    SK_CUDA_IGNORE(cudaSetDevice(device));
    if (cudaEventRecord(s.released, gpu::AsStream(stream)) != cudaSuccess) {
      // The stream is unusable (e.g. destroyed): fall back to a full wait.
      (void)cudaGetLastError();
      SK_CUDA_IGNORE(cudaDeviceSynchronize());
    }
    s.held = false;
    s.handed = false;
  }
  cv.notify_all();
}

void DeviceRing::MarkHanded(int slot) {
  std::lock_guard<std::mutex> lk(mu);
  slots[size_t(slot)].handed = true;
}

int DeviceRing::Handed() {
  std::lock_guard<std::mutex> lk(mu);
  int k = 0;
  for (auto& s : slots) k += s.handed ? 1 : 0;
  return k;
}

void DeviceRing::Abandon(int slot) {
  {
    std::lock_guard<std::mutex> lk(mu);
    slots[size_t(slot)].held = false;
  }
  cv.notify_all();
}

}  // namespace detail

// ---- DeviceBatch ----

DeviceBatch::DeviceBatch(DeviceBatch&& o) noexcept { *this = std::move(o); }

DeviceBatch& DeviceBatch::operator=(DeviceBatch&& o) noexcept {
  if (this == &o) return *this;
  Release();
  ring_ = std::move(o.ring_);
  slot_ = o.slot_;
  o.slot_ = -1;
  end_ = o.end_;
  data_ = o.data_;
  o.data_ = nullptr;
  dtype_ = o.dtype_;
  layout_ = o.layout_;
  std::memcpy(shape_, o.shape_, sizeof(shape_));
  labels_ = std::move(o.labels_);
  keys_ = std::move(o.keys_);
  indices_ = std::move(o.indices_);
  sources_ = std::move(o.sources_);
  fields_ = std::move(o.fields_);
  epoch_ = o.epoch_;
  index_ = o.index_;
  device_ = o.device_;
  return *this;
}

DeviceBatch::~DeviceBatch() { Release(); }

size_t DeviceBatch::bytes() const {
  return size_t(shape_[0]) * size_t(shape_[1]) * size_t(shape_[2]) * size_t(shape_[3]) * DTypeSize(dtype_);
}

void* DeviceBatch::ready_event() const {
  if (!ring_ || slot_ < 0) return nullptr;
  return ring_->slots[size_t(slot_)].ready;
}

Status DeviceBatch::WaitOn(void* stream) const {
  if (!ring_ || slot_ < 0) return Status::Invalid("empty DeviceBatch");
  SK_CUDA_RETURN(cudaSetDevice(device_));
  SK_CUDA_RETURN(cudaStreamWaitEvent(gpu::AsStream(stream), ring_->slots[size_t(slot_)].ready, 0));
  return Status::OK();
}

Status DeviceBatch::Synchronize() const {
  if (!ring_ || slot_ < 0) return Status::Invalid("empty DeviceBatch");
  SK_CUDA_RETURN(cudaSetDevice(device_));
  SK_CUDA_RETURN(cudaEventSynchronize(ring_->slots[size_t(slot_)].ready));
  return Status::OK();
}

Status DeviceBatch::CopyToHost(void* dst) const {
  SK_RETURN_IF_ERROR(Synchronize());
  SK_CUDA_RETURN(cudaMemcpy(dst, data_, bytes(), cudaMemcpyDeviceToHost));
  return Status::OK();
}

void DeviceBatch::Release(void* stream) {
  if (ring_ && slot_ >= 0) ring_->Release(slot_, stream);
  ring_.reset();
  slot_ = -1;
  data_ = nullptr;
}

void DeviceBatch::Release() {
  if (ring_ && slot_ >= 0) {
    void* s = ring_->consumer_stream;
    Release(s);
  }
}

}  // namespace shardkit

// ---- testing helpers ----

#include "gpu/kernels.h"
#include "gpu/testing.h"

namespace shardkit::gpu::testing {

Status CreateStream(int device, void** stream) {
  SK_CUDA_RETURN(cudaSetDevice(device));
  cudaStream_t s;
  SK_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return Status::OK();
}
Status DestroyStream(void* stream) {
  SK_CUDA_RETURN(cudaStreamDestroy(AsStream(stream)));
  return Status::OK();
}
Status CreateEvent(void** event, bool timing) {
  cudaEvent_t e;
  SK_CUDA_RETURN(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  *event = e;
  return Status::OK();
}
Status DestroyEvent(void* event) {
  SK_CUDA_RETURN(cudaEventDestroy(AsEvent(event)));
  return Status::OK();
}
Status RecordEvent(void* event, void* stream) {
  SK_CUDA_RETURN(cudaEventRecord(AsEvent(event), AsStream(stream)));
  return Status::OK();
}
Status EventDone(void* event, bool* done) {
  cudaError_t e = cudaEventQuery(AsEvent(event));
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    *done = false;
    return Status::OK();
  }
  SK_CUDA_RETURN(e);
  *done = true;
  return Status::OK();
}
Status SyncEvent(void* event) {
  SK_CUDA_RETURN(cudaEventSynchronize(AsEvent(event)));
  return Status::OK();
}
Status ElapsedMs(void* start, void* end, float* ms) {
  SK_CUDA_RETURN(cudaEventElapsedTime(ms, AsEvent(start), AsEvent(end)));
  return Status::OK();
}
Status SyncStream(void* stream) {
  SK_CUDA_RETURN(cudaStreamSynchronize(AsStream(stream)));
  return Status::OK();
}
Status DeviceMemoryUsed(int device, size_t* used) {
  SK_CUDA_RETURN(cudaSetDevice(device));
  size_t free_b = 0, total = 0;
  SK_CUDA_RETURN(cudaMemGetInfo(&free_b, &total));
  *used = total - free_b;
  return Status::OK();
}
Status Spin(void* stream, uint64_t ns) { return LaunchSpin(stream, ns); }

}  // namespace shardkit::gpu::testing
