// gpu/no_cuda.cc: the GPU API in a build without CUDA: nothing is usable and every entry
// point says so (kUnsupported, "built without CUDA").
#include "gpu/testing.h"
#include "shardkit/gpu.h"

namespace shardkit {
namespace {
const char kWhy[] = "built without CUDA (SHARDKIT_WITH_CUDA=OFF or no CUDA toolkit found when configuring)";
Status No() { return Status::Unsupported(kWhy); }
}  // namespace

bool CudaCompiled() { return false; }
bool NvjpegCompiled() { return false; }
int CudaDeviceCount() { return 0; }
std::string CudaUnavailableReason() { return kWhy; }
std::shared_ptr<HostAllocator> PinnedHostAllocator(std::string* why) {
  if (why) *why = kWhy;
  return nullptr;
}
const char* DecoderName(DecoderKind d) {
  switch (d) {
    case DecoderKind::kCpu: return "cpu";
    case DecoderKind::kGpu: return "gpu";
    case DecoderKind::kAuto: return "auto";
  }
  return "?";
}

DeviceBatch::DeviceBatch(DeviceBatch&& o) noexcept { *this = std::move(o); }
DeviceBatch& DeviceBatch::operator=(DeviceBatch&& o) noexcept {
  end_ = o.end_;
  return *this;
}
DeviceBatch::~DeviceBatch() = default;
size_t DeviceBatch::bytes() const { return 0; }
void* DeviceBatch::ready_event() const { return nullptr; }
Status DeviceBatch::WaitOn(void*) const { return No(); }
Status DeviceBatch::Synchronize() const { return No(); }
Status DeviceBatch::CopyToHost(void*) const { return No(); }
void DeviceBatch::Release(void*) {}
void DeviceBatch::Release() {}

struct GpuLoader::Impl {};
GpuLoader::GpuLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuLoader::~GpuLoader() = default;
Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::string_view, const LoaderOptions&, const GpuOptions&) {
  return No();
}
Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::shared_ptr<RandomAccess>, const LoaderOptions&,
                                                     const GpuOptions&) {
  return No();
}
Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::unique_ptr<Dataset>, const LoaderOptions&,
                                                     const GpuOptions&) {
  return No();
}
void GpuLoader::set_epoch(uint64_t) {}
uint64_t GpuLoader::epoch() const { return 0; }
uint64_t GpuLoader::num_batches() const { return 0; }
uint64_t GpuLoader::num_samples() const { return 0; }
DecoderKind GpuLoader::decoder() const { return DecoderKind::kCpu; }
int GpuLoader::threads() const { return 0; }
void* GpuLoader::stream() const { return nullptr; }
Result<DeviceBatch> GpuLoader::Next() { return No(); }
std::vector<Status> GpuLoader::skipped() const { return {}; }
LoaderState GpuLoader::save_state() const { return {}; }
Status GpuLoader::restore(const LoaderState&) { return No(); }
GpuLoader::Stats GpuLoader::stats() const { return {}; }
GpuLoader::Profile GpuLoader::profile() const { return {}; }

namespace gpu::testing {
Status CreateStream(int, void**) { return No(); }
Status DestroyStream(void*) { return No(); }
Status CreateEvent(void**, bool) { return No(); }
Status DestroyEvent(void*) { return No(); }
Status RecordEvent(void*, void*) { return No(); }
Status EventDone(void*, bool*) { return No(); }
Status SyncEvent(void*) { return No(); }
Status ElapsedMs(void*, void*, float*) { return No(); }
Status SyncStream(void*) { return No(); }
Status DeviceMemoryUsed(int, size_t*) { return No(); }
Status Spin(void*, uint64_t) { return No(); }
}  // namespace gpu::testing

}  // namespace shardkit
