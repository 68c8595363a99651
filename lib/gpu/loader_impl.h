// Internal: the GPU loader's parts (shardkit/gpu.h, docs/gpu.md). GpuLoader::Impl, what
// both paths share (ProducerImpl: a producer thread fills ring slots ahead of the
// consumer, a queue hands them out in order), and the factories of the two paths:
//   copy_path.cc    the copy path: the CPU Loader's pinned batches, uploaded and converted;
//   decode_path.cc  the GPU decode path: host threads prepare rows, a submitter drives
//                   nvJPEG and the resize;
//   gpu_loader.cc   the public class: the decoder decision, then one of the paths.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "decode/jpeg.h"
#include "gpu/cuda_util.h"
#include "gpu/jpeg_header.h"
#include "gpu/kernels.h"
#include "gpu/ring.h"
#include "gpu/weights.h"
#include "pipeline/engine.h"
#include "pipeline/mixture.h"
#include "pipeline/placement.h"
#include "pipeline/plan.h"
#include "pipeline/resize.h"
#include "shardkit/gpu.h"
#ifdef SHARDKIT_HAVE_NVJPEG
#include "gpu/nvjpeg_decoder.h"
#endif

namespace shardkit {

// Fills the private members of a DeviceBatch.
struct GpuLoaderAccess {
  static DeviceBatch End() {
    DeviceBatch b;
    b.end_ = true;
    return b;
  }
  static DeviceBatch Make(std::shared_ptr<detail::DeviceRing> ring, int slot, DType dtype, Layout layout, int64_t n,
                          int h, int w, std::vector<int64_t> labels, std::vector<std::string> keys,
                          std::vector<uint64_t> indices, uint64_t epoch, uint64_t index,
                          std::vector<std::vector<std::optional<Bytes>>> fields = {},
                          std::vector<uint32_t> sources = {}) {
    DeviceBatch b;
    b.data_ = ring->slots[size_t(slot)].out;
    b.device_ = ring->device;
    b.ring_ = std::move(ring);
    b.slot_ = slot;
    b.dtype_ = dtype;
    b.layout_ = layout;
    if (layout == Layout::kNCHW) {
      b.shape_[0] = n, b.shape_[1] = 3, b.shape_[2] = h, b.shape_[3] = w;
    } else {
      b.shape_[0] = n, b.shape_[1] = h, b.shape_[2] = w, b.shape_[3] = 3;
    }
    b.labels_ = std::move(labels);
    b.keys_ = std::move(keys);
    b.indices_ = std::move(indices);
    b.sources_ = std::move(sources);
    b.fields_ = std::move(fields);
    b.epoch_ = epoch;
    b.index_ = index;
    return b;
  }
};

struct GpuLoader::Impl {
  LoaderOptions o;
  GpuOptions g;
  DecoderKind kind = DecoderKind::kCpu;
  cudaStream_t stream = nullptr;
  std::shared_ptr<detail::DeviceRing> ring;
  gpu::Normalize norm;
  // The engine's delivery (pipeline/engine.h): epoch and next batch (save_state), the
  // sticky error, the end handed out, the skipped rows. Written under ProducerImpl::mu;
  // epoch and next are also read by the consumer thread (the only one that writes them).
  pipeline::Delivery out;
  std::atomic<uint64_t> batches{0}, hw{0}, cuda{0}, host{0}, roi{0}, uploaded{0};
  double wait_s = 0;
  // The consumer's last Next(): when it returned (for the consumer's step time).
  std::chrono::steady_clock::time_point last_return{};

  virtual ~Impl() {
    if (stream) {
      SK_CUDA_IGNORE(cudaSetDevice(g.device));
      SK_CUDA_IGNORE(cudaStreamSynchronize(stream));
      SK_CUDA_IGNORE(cudaStreamDestroy(stream));
    }
  }
  virtual void SetEpoch(uint64_t e) = 0;
  virtual Status Restore(uint64_t e, uint64_t next_batch) = 0;
  virtual Result<DeviceBatch> Next() = 0;
  virtual uint64_t NumBatches() const = 0;
  virtual uint64_t NumSamples() const = 0;
  // The plan's shape and start (save_state's global position; pipeline/engine.h).
  virtual pipeline::PlanShape Shape() const { return pipeline::ShapeOf(NumSamples(), nullptr, false); }
  virtual uint64_t PlanStart() const { return 0; }
  // restore(): on any world size and batch size (pipeline::PlanRestore), each path from
  // the saved global position of the epoch's order.
  virtual Status RestoreState(const LoaderState& s) = 0;
  virtual std::vector<Status> Skipped() const = 0;
  virtual GpuLoader::Profile Profile() const { return {}; }
  // Consumer thread, after each Next() that returned a batch: how long it waited in
  // Next() and how long since its previous Next() returned (its step).
  virtual void Observe(double /*wait_s*/, double /*step_s*/) {}
  // The engines' share now (< 0: no GPU decoding), whether it adapts, nvJPEG's buffers.
  virtual double HardwareShare() const { return -1; }
  virtual bool Adaptive() const { return false; }
  virtual size_t NvjpegBytes() const { return 0; }
  // Batches of the next epoch made ahead: waiting now, and kept by set_epoch so far.
  virtual uint64_t ReadyAhead() const { return 0; }
  virtual uint64_t AdoptedAhead() const { return 0; }

  // A stream of the lowest priority there is: where the consumer's stream has a higher
  // one, its kernels are scheduled before ours (docs/gpu.md).
  static Status CreateLowestPriorityStream(cudaStream_t* s) {
    int least = 0, greatest = 0;
    SK_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SK_CUDA_RETURN(cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, least));
    return Status::OK();
  }

  Status InitCommon(size_t out_bytes, size_t staging_bytes, bool staging_is_out) {
    SK_CUDA_RETURN(cudaSetDevice(g.device));
    SK_RETURN_IF_ERROR(CreateLowestPriorityStream(&stream));
    ring = std::make_shared<detail::DeviceRing>();
    ring->consumer_stream = g.consumer_stream;
    SK_RETURN_IF_ERROR(ring->Init(g.device, g.ring, out_bytes, staging_bytes, staging_is_out));
    norm = gpu::MakeNormalize(o.dtype, o.mean, o.std);
    return Status::OK();
  }
  size_t RowElems() const { return size_t(o.output_width) * o.output_height * 3; }
};

namespace gpu_detail {

using Clock = std::chrono::steady_clock;

inline size_t Align(size_t x, size_t a = 256) { return (x + a - 1) / a * a; }

// ---------------------------------------------------------------------------------------
// Both paths: a producer thread fills ring slots ahead of the consumer (at most ring
// batches: backpressure is the ring), a queue hands them out in order.


struct QueueItem {
  Status st;
  DeviceBatch batch;
  uint64_t hw = 0, cuda = 0, host = 0, roi = 0;  // counted when handed out
};

struct ProducerImpl : GpuLoader::Impl {
  std::thread producer;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<QueueItem> queue;

  // Consumer thread, producer stopped: position at batch `start` of epoch e.
  virtual Status BeginEpoch(uint64_t e, uint64_t start) = 0;
  // Producer thread: fill slots with the batches of epoch e from `start` on, then push
  // End (or an error).
  virtual void Produce(uint64_t e, uint64_t start) = 0;

  void Stop() {
    if (!producer.joinable()) return;
    stop.store(true);
    if (ring) ring->Wake();
    cv.notify_all();
    producer.join();
    stop.store(false);
    std::deque<QueueItem> q;
    {
      std::lock_guard<std::mutex> lk(mu);
      q.swap(queue);
    }
    for (auto& it : q) it.batch.Release(stream);  // never handed out: the loader's stream
  }

  Status Start(uint64_t e, uint64_t start = 0) {
    if (Status st = BeginEpoch(e, start); !st.ok()) {
      std::lock_guard<std::mutex> lk(mu);
      out.Fail(st);  // Next() reports it instead of waiting for a producer that never ran
      return st;
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      out.Start(e, start);  // (also clears the skipped rows)
    }
    producer = std::thread([this, e, start] {
      if (cudaSetDevice(g.device) != cudaSuccess) {
        Push({gpu::CudaError(cudaGetLastError(), "cudaSetDevice"), {}});
        return;
      }
      Produce(e, start);
    });
    return Status::OK();
  }

  void SetEpoch(uint64_t e) override {
    Stop();
    (void)Start(e);  // position 0 of an epoch is always valid
  }

  // `start` is within the epoch (GpuLoader::restore checked it: pipeline::PlanRestore).
  Status Restore(uint64_t e, uint64_t start) override {
    Stop();
    return Start(e, start);
  }

  // The rows skipped under kSkip (out.skipped): the copy path copies the CPU loader's
  // list, the decode path appends as its submitter settles batches.
  std::vector<Status> Skipped() const override {
    std::lock_guard<std::mutex> lk(mu);
    return out.skipped;
  }

  void Push(QueueItem it) {
    {
      std::lock_guard<std::mutex> lk(mu);
      queue.push_back(std::move(it));
    }
    cv.notify_all();
  }

  Result<DeviceBatch> Next() override {
    std::unique_lock<std::mutex> lk(mu);
    if (!out.sticky.ok()) return out.sticky;
    if (out.ended) return GpuLoaderAccess::End();
    if (queue.empty() && ring->Handed() >= int(ring->slots.size())) {
      // Every slot is held: wait (LoaderOptions::buffer_wait_ms) for the consumer to
      // release one from another thread; the producer then fills it and notifies.
      if (o.buffer_wait_ms <= 0 ||
          !cv.wait_for(lk, std::chrono::milliseconds(o.buffer_wait_ms), [&] { return !queue.empty(); }))
        return Status::Invalid(fmt::format("the consumer holds all {} device batches; release one before Next(){}",
                                           g.ring,
                                           o.buffer_wait_ms > 0 ? fmt::format(" (waited {} ms)", o.buffer_wait_ms)
                                                                : ""));
    }
    cv.wait(lk, [&] { return !queue.empty(); });
    QueueItem it = std::move(queue.front());
    queue.pop_front();
    if (!it.st.ok()) return out.Fail(std::move(it.st));
    if (it.batch.end_of_epoch()) {
      out.ended = true;
    } else {
      ring->MarkHanded(it.batch.slot());
      out.Delivered(it.batch.index());
      ++batches;
      hw += it.hw;
      cuda += it.cuda;
      host += it.host;
      roi += it.roi;
    }
    return std::move(it.batch);
  }
};

// The paths. `o` is resolved (pipeline::ResolveOptions), `g.decoder` as the caller asked,
// `kind` what is used. The data: `data`, else `ds`'s random access, else `address` opened
// with o.open.
Result<std::unique_ptr<GpuLoader::Impl>> MakeCopyImpl(const LoaderOptions& o, const GpuOptions& g, DecoderKind kind,
                                                      std::shared_ptr<RandomAccess> data, std::unique_ptr<Dataset> ds,
                                                      std::string_view address);
Result<std::unique_ptr<GpuLoader::Impl>> MakeDecodeImpl(const LoaderOptions& o, const GpuOptions& g,
                                                        DecoderKind kind, std::shared_ptr<RandomAccess> data,
                                                        std::unique_ptr<Dataset> ds, std::string_view address);

}  // namespace gpu_detail
}  // namespace shardkit
