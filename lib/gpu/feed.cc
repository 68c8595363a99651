// gpu/feed.cc: Feed (shardkit/feed.h), the loader's front door: where batches are made,
// which decoder, and the fallback, decided once for every front end. Built with and
// without CUDA (GpuLoader then says "built without CUDA").
#include "shardkit/feed.h"

#include <fmt/format.h>

#include "shardkit/dataset.h"

namespace shardkit {

namespace {

// decoder=gpu where it cannot run: why, in the words a caller acts on.
std::string GpuDecoderUnavailable(int device) {
  if (!CudaCompiled() || !NvjpegCompiled())
    return fmt::format("decoder=gpu needs the CUDA build of shardkit (built with {}: a wheel or build made where "
                       "the CUDA toolkit{} is found); this one has none: use decoder=cpu or auto",
                       CudaCompiled() ? "nvJPEG" : "CUDA", CudaCompiled() ? "'s nvJPEG" : "");
  if (device < 0)
    return "decoder=gpu decodes on a CUDA device: name one (FeedOptions::device; Python: device=\"cuda:N\")";
  return "";
}

}  // namespace

Feed::~Feed() = default;

Result<std::unique_ptr<Feed>> Feed::Create(std::string_view address, const LoaderOptions& opts,
                                           const FeedOptions& fopts) {
  std::unique_ptr<Feed> f(new Feed());
  const DecoderKind asked = fopts.gpu.decoder;
  if (asked == DecoderKind::kGpu) {
    std::string why = GpuDecoderUnavailable(fopts.device);
    if (!why.empty()) return Status::Unsupported(why);
  }
  if (!opts.sources.empty()) {  // a mixture: each loader opens its sources
    if (!address.empty())
      return Status::Invalid(fmt::format("give an address ('{}') or LoaderOptions::sources (a mixture), not both",
                                         address));
    if (fopts.device >= 0 && CudaCompiled()) {
      GpuOptions g = fopts.gpu;
      g.device = fopts.device;
      Result<std::unique_ptr<GpuLoader>> gl = GpuLoader::Create("", opts, g);
      if (gl.ok()) {
        f->device_ = std::move(gl).value();
        return f;
      }
      if (gl.status().code() != Code::kUnsupported || asked == DecoderKind::kGpu) return gl.status();
      f->fallback_ = fmt::format("device batches unavailable ({}); decoding on the host", gl.status().message());
    }
    SK_ASSIGN_OR_RETURN(f->host_, Loader::Create(opts));
    return f;
  }
  // One open: the loaders take the dataset (a fallback opens it again).
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Open(address, opts.open));
  f->class_names_ = ds->info().class_names;
  if (fopts.device >= 0 && CudaCompiled()) {
    GpuOptions g = fopts.gpu;
    g.device = fopts.device;
    Result<std::unique_ptr<GpuLoader>> gl = GpuLoader::Create(std::move(ds), opts, g);
    if (gl.ok()) {
      f->device_ = std::move(gl).value();
      return f;
    }
    // The library cannot use the device: decoder gpu fails; cpu and auto make host
    // batches, for the caller to copy (and say why).
    if (gl.status().code() != Code::kUnsupported || asked == DecoderKind::kGpu) return gl.status();
    f->fallback_ = fmt::format("device batches unavailable ({}); decoding on the host", gl.status().message());
    SK_ASSIGN_OR_RETURN(ds, Open(address, opts.open));
  }
  SK_ASSIGN_OR_RETURN(f->host_, Loader::Create(std::move(ds), opts));
  return f;
}

DecoderKind Feed::decoder() const { return device_ ? device_->decoder() : DecoderKind::kCpu; }
int Feed::threads() const { return device_ ? device_->threads() : host_->options().threads; }
uint64_t Feed::epoch() const { return device_ ? device_->epoch() : host_->epoch(); }
uint64_t Feed::num_batches() const { return device_ ? device_->num_batches() : host_->num_batches(); }
uint64_t Feed::num_samples() const { return device_ ? device_->num_samples() : host_->num_samples(); }
int Feed::rank() const { return device_ ? device_->save_state().rank : host_->rank(); }
int Feed::world_size() const { return device_ ? device_->save_state().world_size : host_->world_size(); }
void Feed::set_epoch(uint64_t e) {
  if (device_) device_->set_epoch(e);
  else host_->set_epoch(e);
}
LoaderState Feed::save_state() const { return device_ ? device_->save_state() : host_->save_state(); }
Status Feed::restore(const LoaderState& s) { return device_ ? device_->restore(s) : host_->restore(s); }
std::vector<Status> Feed::skipped() const { return device_ ? device_->skipped() : host_->skipped(); }

}  // namespace shardkit
