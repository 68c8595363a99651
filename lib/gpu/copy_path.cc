// gpu/copy_path.cc: the GPU loader's copy path (loader_impl.h, docs/gpu.md).
#include "gpu/loader_impl.h"

namespace shardkit::gpu_detail {

namespace {

// ---------------------------------------------------------------------------------------
// The copy path: CPU Loader (uint8 NHWC, pinned) -> cudaMemcpyAsync -> convert kernel.

struct CopyImpl final : ProducerImpl {
  std::unique_ptr<Loader> loader;  // used by the producer thread only while it runs
  struct Pending {
    Batch host;
    cudaEvent_t copied;
  };
  std::deque<Pending> pending;  // host batches whose copy may still be running (producer)
  std::vector<cudaEvent_t> free_events;
  size_t max_pending = 2;
  // restore(): the state the next BeginEpoch gives the CPU loader (an elastic resume), and
  // where the current plan starts (consumer thread).
  std::optional<LoaderState> pending_state;
  uint64_t plan_start = 0;

  ~CopyImpl() override {
    Stop();
    SK_CUDA_IGNORE(cudaSetDevice(g.device));
    if (stream) SK_CUDA_IGNORE(cudaStreamSynchronize(stream));
    for (auto& p : pending) free_events.push_back(p.copied);
    pending.clear();
    for (auto e : free_events) SK_CUDA_IGNORE(cudaEventDestroy(e));
    loader.reset();
  }

  Status Init(std::shared_ptr<RandomAccess> data, std::unique_ptr<Dataset> ds, std::string_view address) {
    LoaderOptions inner = o;
    inner.dtype = DType::kUint8;
    inner.layout = Layout::kNHWC;
    inner.pin_memory = true;
    std::string why;
    inner.allocator = PinnedHostAllocator(&why);
    if (!inner.allocator) return Status::Unsupported(why);
    // Host batches: the CPU loader's read-ahead, plus those whose copy is in flight.
    inner.prefetch = std::max(o.prefetch, 2) + 2;
    max_pending = size_t(inner.prefetch - 2);
    if (data) {
      SK_ASSIGN_OR_RETURN(loader, Loader::Create(std::move(data), inner));
    } else if (ds) {
      SK_ASSIGN_OR_RETURN(loader, Loader::Create(std::move(ds), inner));
    } else {
      SK_ASSIGN_OR_RETURN(loader, Loader::Create(address, inner));
    }
    const size_t u8 = RowElems() * o.batch_size;
    const bool same = o.dtype == DType::kUint8 && o.layout == Layout::kNHWC;
    SK_RETURN_IF_ERROR(InitCommon(RowElems() * DTypeSize(o.dtype) * o.batch_size, same ? 0 : u8, same));
    for (size_t i = 0; i < max_pending + 1; ++i) {
      cudaEvent_t e;
      SK_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      free_events.push_back(e);
    }
    return Start(0);
  }

  Status BeginEpoch(uint64_t e, uint64_t start) override {
    if (pending_state) {
      LoaderState st = std::move(*pending_state);
      pending_state.reset();
      SK_RETURN_IF_ERROR(loader->restore(st));
      plan_start = loader->save_state().start;
    } else if (start == 0) {
      loader->set_epoch(e);
      plan_start = 0;
    } else {
      LoaderState st = loader->save_state();
      st.epoch = e;
      st.next_batch = start;
      SK_RETURN_IF_ERROR(loader->restore(st));
    }
    return Status::OK();  // (Start clears the skipped rows)
  }
  uint64_t NumBatches() const override { return loader->num_batches(); }
  uint64_t NumSamples() const override { return loader->num_samples(); }
  pipeline::PlanShape Shape() const override {
    pipeline::PlanShape s = pipeline::ShapeOf(loader->num_samples(), nullptr, loader->streaming());
    s.epoch_size = loader->epoch_size();
    s.sources = loader->mixture();
    return s;
  }
  uint64_t PlanStart() const override { return plan_start; }
  Status RestoreState(const LoaderState& s) override {
    SK_ASSIGN_OR_RETURN(pipeline::ResumeAt at, pipeline::PlanRestore(s, o, Shape()));
    pending_state = s;
    return Restore(s.epoch, at.next_batch);
  }

  // Returns host batches whose copy has finished to the CPU loader's pool; waits for the
  // oldest while max_pending are out, or for every one with `all`.
  Status Reap(bool all = false) {
    while (!pending.empty()) {
      cudaEvent_t ev = pending.front().copied;
      cudaError_t q = all || pending.size() >= max_pending ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        break;
      }
      if (q != cudaSuccess) return gpu::CudaError(q, "cudaEventQuery(copy)");
      free_events.push_back(ev);
      pending.pop_front();
    }
    return Status::OK();
  }

  void Produce(uint64_t, uint64_t) override {
    for (;;) {
      int slot = ring->Acquire(&stop);
      if (slot < 0) return;  // stopped
      QueueItem it;
      Status st = Reap();
      Result<Batch> r = st.ok() ? loader->Next() : Result<Batch>(st);
      if (o.on_error == DecodeErrorPolicy::kSkip) {
        std::vector<Status> sk = loader->skipped();
        std::lock_guard<std::mutex> lk(mu);
        out.skipped.swap(sk);
      }
      if (!r.ok()) {
        ring->Abandon(slot);
        it.st = std::move(r).take_status();
        Push(std::move(it));
        return;  // stays failed until set_epoch, as the CPU loader
      }
      Batch hb = std::move(r).value();
      if (hb.end_of_epoch()) {
        ring->Abandon(slot);
        // Give every host batch back to the CPU loader once its copy is done, so that
        // its whole pool can prefetch the next epoch (LoaderOptions::prefetch_next_epoch)
        // while the consumer finishes this one.
        if (Status rs = Reap(/*all=*/true); !rs.ok()) {
          it.st = std::move(rs);
          Push(std::move(it));
          return;
        }
        it.batch = GpuLoaderAccess::End();
        Push(std::move(it));
        return;
      }
      st = Upload(hb, slot);
      if (st.ok() && free_events.empty()) st = Status::Internal("copy events exhausted");
      cudaEvent_t ev = st.ok() ? free_events.back() : nullptr;
      if (st.ok()) {
        cudaError_t ce = cudaEventRecord(ev, stream);  // after the copy and the conversion
        if (ce != cudaSuccess) st = gpu::CudaError(ce, "cudaEventRecord(copy)");
      }
      if (!st.ok()) {
        ring->Abandon(slot);
        it.st = st;
        Push(std::move(it));
        return;
      }
      free_events.pop_back();
      it.host = hb.size();
      std::vector<std::vector<std::optional<Bytes>>> fields(hb.num_fields());
      for (size_t f = 0; f < fields.size(); ++f) fields[f] = hb.field(f);
      it.batch = GpuLoaderAccess::Make(ring, slot, o.dtype, o.layout, int64_t(hb.size()), o.output_height,
                                       o.output_width, hb.labels(), hb.keys(), hb.indices(), hb.epoch(), hb.index(),
                                       std::move(fields), hb.sources());
      pending.push_back({std::move(hb), ev});
      Push(std::move(it));
      if (stop.load()) return;
    }
  }

  Status Upload(const Batch& hb, int slot) {
    auto& s = ring->slots[size_t(slot)];
    // Do not overwrite the slot before the consumer's stream is done with it.
    SK_CUDA_RETURN(cudaStreamWaitEvent(stream, s.released, 0));
    const size_t bytes = hb.bytes();
    SK_CUDA_RETURN(cudaMemcpyAsync(s.staging, hb.data(), bytes, cudaMemcpyHostToDevice, stream));
    uploaded += bytes;
    if (!(o.dtype == DType::kUint8 && o.layout == Layout::kNHWC)) {
      SK_RETURN_IF_ERROR(gpu::LaunchConvert(s.staging, s.out, int(hb.size()), o.output_height, o.output_width,
                                            o.dtype, o.layout, norm, stream));
    }
    SK_CUDA_RETURN(cudaEventRecord(s.ready, stream));
    return Status::OK();
  }
};

}  // namespace

Result<std::unique_ptr<GpuLoader::Impl>> MakeCopyImpl(const LoaderOptions& o, const GpuOptions& g, DecoderKind kind,
                                                      std::shared_ptr<RandomAccess> data, std::unique_ptr<Dataset> ds,
                                                      std::string_view address) {
  auto impl = std::make_unique<CopyImpl>();
  impl->o = o;
  impl->g = g;
  impl->kind = kind;
  SK_RETURN_IF_ERROR(impl->Init(std::move(data), std::move(ds), address));
  return std::unique_ptr<GpuLoader::Impl>(std::move(impl));
}

}  // namespace shardkit::gpu_detail
