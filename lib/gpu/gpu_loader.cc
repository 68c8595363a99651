// gpu/gpu_loader.cc: GpuLoader (shardkit/gpu.h): the decoder decision, the options
// resolved once, then one of the paths (loader_impl.h: copy_path.cc, decode_path.cc).
#include "gpu/loader_impl.h"

namespace shardkit {

using gpu_detail::Clock;

namespace {

Result<std::unique_ptr<GpuLoader::Impl>> MakeImpl(std::shared_ptr<RandomAccess> data, std::unique_ptr<Dataset> ds,
                                                   std::string_view address, const LoaderOptions& opts,
                                                   const GpuOptions& gopts) {
  // A mixture opens its own sources (both paths); a dataset given beside it is a mistake,
  // refused as Loader::Create refuses it.
  if (!opts.sources.empty() && (!address.empty() || data || ds))
    return Status::Invalid(fmt::format("give {} or LoaderOptions::sources (a mixture), not both",
                                       address.empty() ? std::string("a dataset")
                                                       : fmt::format("an address ('{}')", address)));
  std::string why = CudaUnavailableReason();
  if (!why.empty()) return Status::Unsupported(why);
  int count = CudaDeviceCount();
  if (gopts.device < 0 || gopts.device >= count)
    return Status::Invalid(fmt::format("CUDA device {} does not exist ({} found)", gopts.device, count));
  // The decoder first: the thread default depends on it.
  // The decode path reads by random access: a streamed read (LoaderOptions::stream) goes
  // through the copy path, whose CPU Loader streams.
  // A mixture (LoaderOptions::sources) reads its sources by random access: both paths.
  DecoderKind kind = gopts.decoder;
  if (kind == DecoderKind::kAuto) kind = NvjpegCompiled() && !opts.stream ? DecoderKind::kGpu : DecoderKind::kCpu;
  if (kind == DecoderKind::kGpu && opts.stream)
    return Status::Unsupported("decoder=gpu reads the dataset by random access; a streamed read (stream=True) is "
                               "decoded on the host: use decoder=cpu or auto");
  GpuOptions resolved = gopts;
  resolved.decoder = kind;
  LoaderOptions o = opts;
  SK_RETURN_IF_ERROR(pipeline::ResolveOptions(&o, resolved));
  if (kind == DecoderKind::kGpu && !NvjpegCompiled() && !gopts.force_cpu_decode)
    return Status::Unsupported("decoder=gpu: this build has no nvJPEG (nvjpeg.h or libnvjpeg was not found when "
                               "configuring); use decoder=cpu or auto");
  if (kind == DecoderKind::kCpu) return gpu_detail::MakeCopyImpl(o, gopts, kind, std::move(data), std::move(ds), address);
  return gpu_detail::MakeDecodeImpl(o, gopts, kind, std::move(data), std::move(ds), address);
}

}  // namespace

// ---------------------------------------------------------------------------------------

GpuLoader::GpuLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuLoader::~GpuLoader() = default;

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::string_view address, const LoaderOptions& opts,
                                                     const GpuOptions& gopts) {
  SK_ASSIGN_OR_RETURN(auto impl, MakeImpl(nullptr, nullptr, address, opts, gopts));
  return std::unique_ptr<GpuLoader>(new GpuLoader(std::move(impl)));
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::shared_ptr<RandomAccess> data, const LoaderOptions& opts,
                                                     const GpuOptions& gopts) {
  if (!data) return Status::Invalid("no dataset");
  SK_ASSIGN_OR_RETURN(auto impl, MakeImpl(std::move(data), nullptr, "", opts, gopts));
  return std::unique_ptr<GpuLoader>(new GpuLoader(std::move(impl)));
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::Create(std::unique_ptr<Dataset> ds, const LoaderOptions& opts,
                                                     const GpuOptions& gopts) {
  if (!ds) return Status::Invalid("no dataset");
  SK_ASSIGN_OR_RETURN(auto impl, MakeImpl(nullptr, std::move(ds), "", opts, gopts));
  return std::unique_ptr<GpuLoader>(new GpuLoader(std::move(impl)));
}

void GpuLoader::set_epoch(uint64_t e) { impl_->SetEpoch(e); }
uint64_t GpuLoader::epoch() const { return impl_->out.epoch; }
uint64_t GpuLoader::num_batches() const { return impl_->NumBatches(); }
uint64_t GpuLoader::num_samples() const { return impl_->NumSamples(); }
DecoderKind GpuLoader::decoder() const { return impl_->kind; }
int GpuLoader::threads() const {
  // (GpuOptions::host_threads sizes the decode path's pool only.)
  return impl_->kind == DecoderKind::kGpu && impl_->g.host_threads > 0 ? impl_->g.host_threads : impl_->o.threads;
}
void* GpuLoader::stream() const { return impl_->stream; }
std::vector<Status> GpuLoader::skipped() const { return impl_->Skipped(); }

Result<DeviceBatch> GpuLoader::Next() {
  auto t0 = Clock::now();
  auto r = impl_->Next();
  auto t1 = Clock::now();
  const double wait = std::chrono::duration<double>(t1 - t0).count();
  impl_->wait_s += wait;
  if (r.ok() && !r->end_of_epoch()) {
    if (impl_->last_return != Clock::time_point{})
      impl_->Observe(wait, std::chrono::duration<double>(t1 - impl_->last_return).count());
    impl_->last_return = t1;
  } else {
    impl_->last_return = {};  // an epoch's end: the next step time starts afresh
  }
  return r;
}

LoaderState GpuLoader::save_state() const {
  return impl_->out.State(impl_->o, impl_->Shape(), impl_->PlanStart());
}

Status GpuLoader::restore(const LoaderState& s) { return impl_->RestoreState(s); }

GpuLoader::Profile GpuLoader::profile() const { return impl_->Profile(); }

GpuLoader::Stats GpuLoader::stats() const {
  Stats s;
  s.batches = impl_->batches.load();
  s.images_hardware = impl_->hw.load();
  s.images_cuda = impl_->cuda.load();
  s.images_host = impl_->host.load();
  s.images_roi = impl_->roi.load();
  s.bytes_uploaded = impl_->uploaded.load();
  s.next_wait_s = impl_->wait_s;
  s.hardware_share = impl_->HardwareShare();
  s.adaptive = impl_->Adaptive();
  s.nvjpeg_device_bytes = impl_->NvjpegBytes();
  s.next_epoch_ready = impl_->ReadyAhead();
  s.next_epoch_adopted = impl_->AdoptedAhead();
  return s;
}

}  // namespace shardkit
