// gpu/decode_path.cc: the GPU loader's decode path (loader_impl.h, docs/gpu.md).
#include "gpu/loader_impl.h"
#include "pipeline/row_pool.h"

namespace shardkit::gpu_detail {

namespace {

// The GPU decode path's host threads (pipeline::RowPool, a TBB arena): phase-1 rows and,
// urgent, the submitter's CUDA-backend rows; each thread sets the device as it enters.
using pipeline::RowPool;

// Counts items down; Wait() returns when all have run. The count goes down under the
// mutex, so the latch may be destroyed as soon as Wait() returns.
struct Latch {
  std::mutex m;
  std::condition_variable cv;
  size_t left = 0;
  void Done() {
    std::lock_guard<std::mutex> lk(m);
    if (--left == 0) cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return left == 0; });
  }
};

// ---------------------------------------------------------------------------------------
// The GPU decode path.

struct Row {
  Sample sample;
  Status st;
  int64_t label = -1;
  int route = 0;  // 0 host, 1 hardware, 2 GPU_HYBRID, 3 HYBRID
#ifdef SHARDKIT_HAVE_NVJPEG
  gpu::NvItem item;
#endif
  const uint8_t* data = nullptr;
  size_t size = 0;
  const Field* image = nullptr;  // the image field (in `sample`): data, size
  std::vector<std::optional<Bytes>> fields;  // LoaderOptions::fields
  std::vector<uint8_t> pixels;  // host route: the box's pixels, packed rows
  int pw = 0, ph = 0;           // their width, height
  bool flip = false;
  pipeline::AxisWeights wx, wy;
  size_t blob_off = 0, pix_off = 0, arena_off = 0, bits_off = 0;
  bool pix_direct = false;   // host route: its pixels are in the set's staging at pix_off
  bool bits_direct = false;  // engines: its bitstream is in the set's `bits` (item.data)
  // Bytes of the region to resize (host pixels or nvJPEG output), packed rows.
  size_t box_bytes() const { return size_t(pw) * ph * 3; }
};

struct Set {
  std::vector<Row> rows;
  uint8_t* host = nullptr;  // pinned: host pixels | descs | weights (uploaded), bitstreams
  size_t host_cap = 0;
  // Phase 1 writes straight into pinned staging where it has room, so the packer copies
  // only what did not fit: host-route pixels into [0, pix_cap) of `host`, the engines'
  // bitstreams into [0, bits_cap) of `bits` (offsets taken with fetch_add). The packer
  // sizes both from the batches before; the producer zeroes the counters before posting.
  std::atomic<size_t> pix_used{0}, bits_used{0};
  size_t pix_cap = 0;
  uint8_t* bits = nullptr;  // pinned, never uploaded: nvJPEG reads the bitstreams from it
  size_t bits_cap = 0;
  size_t desc_off = 0;  // where the packer put the descriptors (then the weights) in `dev`
  uint8_t* dev = nullptr;   // the same on the device
  size_t dev_cap = 0;
  uint8_t* arena = nullptr; // nvJPEG outputs
  size_t arena_cap = 0;
  cudaEvent_t done = nullptr;
  cudaEvent_t decoded = nullptr;  // on the loader's stream after the batch's decode (decoder stage)
  // Phase 1 of the set's batch (DecodeImpl::Produce): its rows not yet done, their
  // thread time, when it was posted, and an error that replaces the batch.
  std::atomic<size_t> left{0};
  std::atomic<double> row_s{0};
  std::chrono::steady_clock::time_point posted{};
  Status err;
  uint64_t epoch = 0, batch = 0;  // which batch the set holds (written by the producer)
  uint64_t batches = 0;           // how many its epoch's plan has (its last: batch + 1)
  std::vector<uint64_t> index;    // its rows' sample indices, in order
  std::vector<size_t> keep;  // the rows kept (packer), decoded and resized (submitter)
};

struct DecodeImpl final : ProducerImpl {
  DecoderKind kind_requested = DecoderKind::kGpu;  // GpuOptions::decoder as asked (auto or gpu)
  std::unique_ptr<Dataset> dataset;
  std::shared_ptr<RandomAccess> data;
  pipeline::SourceFacts facts;  // of `dataset` (none when made from a RandomAccess)
  uint64_t n = 0;               // samples, or the mixture's items
  // A mixture (LoaderOptions::sources): its plan and the sources' label offsets; null
  // for one dataset.
  std::shared_ptr<const pipeline::Mixture> mix;
  std::vector<int64_t> label_offsets;
  pipeline::Partition part;  // an epoch's cut from position 0 (every epoch after a resume)
  // The consumer's epoch: its plan's cut and start (an elastic restore() continues the
  // epoch's order from a position; pipeline/plan.h), and the start the next BeginEpoch
  // takes (restore() sets it). Consumer thread.
  pipeline::Partition plan_part;
  uint64_t plan_start = 0, restore_from = 0;
  pipeline::RrcParams rrc;
  std::unique_ptr<RowPool> pool;  // the host threads (phase 1, CUDA-backend rows)
  std::unique_ptr<tbb::task_arena> pack_arena;
  // One per host thread, made on its first row with the options' decoder limits.
  tbb::enumerable_thread_specific<decode::ImageDecoder> host_decoders{
      [this] { return decode::ImageDecoder(pipeline::DecodeLimits(o)); }};
#ifdef SHARDKIT_HAVE_NVJPEG
  std::unique_ptr<gpu::NvjpegDecoder> nv;
#endif
  // Batches in flight per epoch: one being decoded (submitter), one being packed, the
  // rest in phase 1. Each set holds its batch's rows, staging and nvJPEG outputs.
  static constexpr int kSets = 4;
  Set sets[kSets];
  pipeline::RankOrder order;  // the producer's epoch, evaluated per position (plan.h)
  double hw_load = 1.0;  // GpuOptions::hardware_load, resolved

  // Adaptive placement (decoder auto, hardware_load unset): pipeline/placement.h. Which
  // image goes where depends on the share when its batch is prepared, so on timing;
  // crops and order never do.
  bool adaptive = false;
  pipeline::PlacementController placement{GpuOptions::kDefaultHardwareLoad};
  std::atomic<double> last_prepare_s{0}, last_acquire_s{0}, last_decode_s{0};
  // The resizes into the ring run on a stream of their own (lowest priority too), after
  // an event of the decode on `stream`: the decoder stage's next hardware batch then
  // never queues behind a resize that waits for the consumer to release a ring slot.
  cudaStream_t out_stream = nullptr;

  void Observe(double wait_s, double step_s) override {
    if (adaptive)
      placement.Observe(wait_s, step_s, last_prepare_s.load(), last_acquire_s.load(), last_decode_s.load());
  }
  double HardwareShare() const override { return adaptive ? placement.share() : hw_load; }
  bool Adaptive() const override { return adaptive; }
  size_t NvjpegBytes() const override {
#ifdef SHARDKIT_HAVE_NVJPEG
    return nv ? nv->cached_device_bytes() : 0;
#else
    return 0;
#endif
  }

  // GpuOptions::profile: where the producer's time goes, read by GpuLoader::profile()
  // (host seconds per phase; GPU milliseconds of the hardware decode and the resize, from
  // timing events read back when a set is reused). The producer and the submitter add to
  // it while the consumer may read it: atomics (ev and pending stay the producer's and
  // the submitter's, ordered by their handoff, as before).
  struct Profile {
    bool on = false;
    std::atomic<uint64_t> batches{0}, gpu_timed{0};
    std::atomic<double> acquire{0}, wait_set{0}, phase1{0}, handoff{0}, pack{0}, hw_call{0}, cuda_rows{0}, tail{0};
    std::atomic<double> rows_nvjpeg{0}, rows_host{0};  // phase 1, thread-seconds per route
    std::atomic<double> gpu_hw_ms{0}, gpu_resize_ms{0};
    cudaEvent_t ev[kSets][3] = {};
    bool pending[kSets] = {};
  } prof;
  using PClock = std::chrono::steady_clock;
  static double Since(PClock::time_point t) { return std::chrono::duration<double>(PClock::now() - t).count(); }
  void ProfileCollect(int si) {
    if (!prof.on || !prof.pending[si]) return;
    float a = 0, b = 0;
    const bool ta = cudaEventElapsedTime(&a, prof.ev[si][0], prof.ev[si][1]) == cudaSuccess;
    const bool tb = cudaEventElapsedTime(&b, prof.ev[si][1], prof.ev[si][2]) == cudaSuccess;
    if (ta) prof.gpu_hw_ms += a;
    if (tb) prof.gpu_resize_ms += b;
    if (ta && tb) ++prof.gpu_timed;
    prof.pending[si] = false;
  }
  GpuLoader::Profile Profile() const override {
    GpuLoader::Profile p;
    p.enabled = prof.on;
    p.batches = prof.batches.load();
    p.acquire_s = prof.acquire.load();
    p.wait_set_s = prof.wait_set.load();
    p.phase1_s = prof.phase1.load();
    p.handoff_s = prof.handoff.load();
    p.pack_s = prof.pack.load();
    p.hw_call_s = prof.hw_call.load();
    p.cuda_rows_s = prof.cuda_rows.load();
    p.tail_s = prof.tail.load();
    p.rows_nvjpeg_s = prof.rows_nvjpeg.load();
    p.rows_host_s = prof.rows_host.load();
    p.gpu_hw_decode_ms = prof.gpu_hw_ms.load();
    p.gpu_resize_ms = prof.gpu_resize_ms.load();
    p.gpu_timed = prof.gpu_timed.load();
    return p;
  }

  ~DecodeImpl() override {
    Stop();
    pool.reset();  // (idle: Produce waits for its items)
    SK_CUDA_IGNORE(cudaSetDevice(g.device));
    if (stream) SK_CUDA_IGNORE(cudaStreamSynchronize(stream));
    if (out_stream) {
      SK_CUDA_IGNORE(cudaStreamSynchronize(out_stream));
      SK_CUDA_IGNORE(cudaStreamDestroy(out_stream));
    }
    for (auto& e2 : prof.ev)
      for (auto& e : e2)
        if (e) SK_CUDA_IGNORE(cudaEventDestroy(e));
    for (auto& s : sets) {
      if (s.done) SK_CUDA_IGNORE(cudaEventSynchronize(s.done));
      if (s.host) SK_CUDA_IGNORE(cudaFreeHost(s.host));
      if (s.bits) SK_CUDA_IGNORE(cudaFreeHost(s.bits));
      if (s.dev) SK_CUDA_IGNORE(cudaFree(s.dev));
      if (s.arena) SK_CUDA_IGNORE(cudaFree(s.arena));
      if (s.done) SK_CUDA_IGNORE(cudaEventDestroy(s.done));
      if (s.decoded) SK_CUDA_IGNORE(cudaEventDestroy(s.decoded));
    }
    for (auto& [p, pinned] : retired) {
      if (pinned) {
        SK_CUDA_IGNORE(cudaFreeHost(p));
      } else {
        SK_CUDA_IGNORE(cudaFree(p));
      }
    }
#ifdef SHARDKIT_HAVE_NVJPEG
    nv.reset();
#endif
  }

  Status Init() {
    n = data->size();
    part = pipeline::RankOrder(pipeline::OrderOf(mix, n, o, 0), 0, o).partition();
    rrc = {o.scale_min, o.scale_max, o.ratio_min, o.ratio_max, o.flip_p};
    // Default: the CPUs minus two, one for the consumer's thread and one for the decoder,
    // which spins in nvJPEG's batched call for most of the engines' time (CUDA's default
    // scheduling spins while there are more cores than contexts); the producer only posts
    // rows to them. With all but one, the engines' batches waited for a core (issue 16's
    // third table: 14 threads fed ResNet-18 faster than 16).
    int threads = g.host_threads > 0 ? g.host_threads : o.threads;
    pool = std::make_unique<RowPool>(threads, std::min(threads, 4), [device = g.device] {
      (void)cudaSetDevice(device);  // (an error surfaces in the item's own CUDA calls)
    });
    // The packer's parallel copies run in an arena of their own: on the host threads they
    // would queue behind phase-1 decodes of the next batches.
    pack_arena = std::make_unique<tbb::task_arena>(std::min(threads, 4));
    hw_load = pipeline::ResolvedHardwareLoad(g);  // (in [0, 1]: checked by Validate)
    adaptive = kind_requested == DecoderKind::kAuto && g.hardware_load < 0;
    SK_RETURN_IF_ERROR(InitCommon(RowElems() * DTypeSize(o.dtype) * o.batch_size, 0, false));
    SK_RETURN_IF_ERROR(CreateLowestPriorityStream(&out_stream));
    if (g.profile) {
      prof.on = true;
      for (auto& e2 : prof.ev)
        for (auto& e : e2) SK_CUDA_RETURN(cudaEventCreate(&e));
    }
    for (auto& s : sets) {
      s.rows.resize(o.batch_size);
      SK_CUDA_RETURN(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      SK_CUDA_RETURN(cudaEventCreateWithFlags(&s.decoded, cudaEventDisableTiming));
      // First sizes: 64 KiB of weights and descriptors per row; nvJPEG output for a
      // 500x400 region per row. They grow (rarely) to what batches need.
      SK_RETURN_IF_ERROR(Grow(&s.host, &s.host_cap, size_t(o.batch_size) * (64 << 10), true));
      SK_RETURN_IF_ERROR(Grow(&s.dev, &s.dev_cap, size_t(o.batch_size) * (64 << 10), false));
      if (!g.force_cpu_decode && NvjpegCompiled())
        SK_RETURN_IF_ERROR(Grow(&s.arena, &s.arena_cap, size_t(o.batch_size) * 500 * 400 * 3, false));
    }
#ifdef SHARDKIT_HAVE_NVJPEG
    if (!g.force_cpu_decode) {
      SK_ASSIGN_OR_RETURN(nv, gpu::NvjpegDecoder::Create(g.device, pool->size(), int(o.batch_size), kSets,
                                                         g.hardware_decoder));
    }
#endif
    return Start(0);
  }

  uint64_t NumBatches() const override { return plan_part.num_batches; }
  uint64_t NumSamples() const override { return n; }
  pipeline::PlanShape Shape() const override { return pipeline::ShapeOf(n, mix.get(), false); }
  uint64_t PlanStart() const override { return plan_start; }

  // Batch `start` of epoch e, in the plan from position restore_from of the epoch's order.
  Status BeginEpoch(uint64_t e, uint64_t) override {
    order = pipeline::RankOrder(pipeline::OrderOf(mix, n, o, e), restore_from, o);
    plan_part = order.partition();
    plan_start = order.start();
    restore_from = 0;
    ahead_skipped.clear();
    return Status::OK();  // (Start clears the skipped rows)
  }
  // Any world size and batch size (pipeline::PlanRestore): the plan of the saved epoch from
  // the saved global position.
  Status RestoreState(const LoaderState& s) override {
    SK_ASSIGN_OR_RETURN(pipeline::ResumeAt at, pipeline::PlanRestore(s, o, Shape()));
    restore_from = at.start;
    return Restore(s.epoch, at.next_batch);
  }

  // Between epochs (LoaderOptions::prefetch_next_epoch): once the last batch of the
  // consumer's epoch e is posted, the flow goes on with epoch e + 1 (the ring and the
  // sets bound how far). set_epoch(e + 1) after the end of e keeps those batches; any
  // other set_epoch, or restore(), stops the flow and starts it again. Rows of epoch
  // e + 1 skipped under kSkip wait in ahead_skipped until their epoch is adopted.
  bool Continues() const { return o.prefetch_next_epoch && part.num_batches > 0; }
  std::vector<Status> ahead_skipped;  // (under mu)
  std::atomic<uint64_t> adopted{0};   // batches of a next epoch kept by set_epoch

  void SetEpoch(uint64_t x) override {
    {
      std::lock_guard<std::mutex> lk(mu);
      // (An error waiting in the queue: start again, as a fresh loader would retry.)
      const bool running = producer.joinable() && out.sticky.ok() &&
                           std::none_of(queue.begin(), queue.end(), [](const QueueItem& it) { return !it.st.ok(); });
      // Already at the start of epoch x (a set_epoch(x) right after Create or after an
      // adoption): the flow is making exactly these batches.
      if (running && !out.ended && out.epoch == x && out.next == 0 && plan_start == 0) return;
      if (running && out.ended && Continues() && out.epoch != UINT64_MAX && x == out.epoch + 1) {
        adopted += QueuedBatches();
        plan_part = part;  // (the epochs made ahead start at position 0)
        plan_start = 0;
        out.Start(x, 0);  // (last_return was reset when Next() returned the end)
        out.skipped = std::move(ahead_skipped);
        ahead_skipped.clear();
        cv.notify_all();  // the producer may wait for this adoption (Produce)
        return;
      }
    }
    ProducerImpl::SetEpoch(x);
  }
  uint64_t AdoptedAhead() const override { return adopted.load(); }
  uint64_t ReadyAhead() const override {
    std::lock_guard<std::mutex> lk(mu);
    return out.ended ? QueuedBatches() : 0;
  }
  // The batches waiting in the queue (mu held): after the end of an epoch, the next's.
  uint64_t QueuedBatches() const {
    return uint64_t(std::count_if(queue.begin(), queue.end(),
                                  [](const QueueItem& it) { return it.st.ok() && !it.batch.end_of_epoch(); }));
  }

  // Four stages, a thread each, so that the host work of later batches overlaps the GPU
  // submission of batch b (nvjpegDecodeBatchedEx blocks its caller for most of the
  // engines' time). The batches flow in sequence q = 0, 1, ... (batch `start` of epoch e,
  // then the epoch's next batches, then the next epochs' while the flow continues); set
  // q % kSets holds batch q:
  // - this one (the producer) waits until q's set is free (the submitter is done with
  //   q - kSets on the host, and the GPU with its buffers), then posts q's phase-1 rows
  //   (read, parse, plan, host decode) to the host threads and goes on to q + 1 without
  //   waiting for them: several batches are in phase 1 at once, so a batch's slowest
  //   rows overlap the next batch's first ones;
  // - the packer takes the batches in order as their last row is done: settles the
  //   rows' errors, packs descriptors, weights, host pixels and bitstreams, uploads;
  // - the decoder takes the packed batches in order: the decode on the GPU (hardware
  //   batch on its thread, which nvJPEG's call blocks for most of the engines' time,
  //   CUDA-backend rows at the same time on the host threads), then an event on the
  //   loader's stream;
  // - the submitter takes the decoded batches in order: a ring slot, the resize (on
  //   out_stream, after the decode's event), and the push (and an epoch's end after its
  //   last batch). Packing batch q + 1 while the engines decode batch q, and resizing and
  //   pushing batch q while they decode q + 1, keeps the engines' calls back to back.
  struct Flow {
    std::mutex m;
    std::condition_variable cv;
    uint64_t posted = 0;    // batches [0, posted) of the sequence have their phase 1 posted
    uint64_t packed = 0;    // the packer is done with [0, packed)
    uint64_t decoded = 0;   // the decoder is done with [0, decoded)
    uint64_t finished = 0;  // the submitter is done with [0, finished) on the host
    bool producer_done = false, packer_done = false, decoder_done = false, submitter_done = false;
    size_t items = 0;       // phase-1 rows posted and not yet run

    // A stage's progress (`counter` = n, or a done flag set), under m; wakes the others.
    void Mark(uint64_t* counter, uint64_t n) {
      std::lock_guard<std::mutex> lk(m);
      *counter = n;
      cv.notify_all();
    }
    void Mark(bool* flag) {
      std::lock_guard<std::mutex> lk(m);
      *flag = true;
      cv.notify_all();
    }
  };

  // Waits on f.cv for `pred` or for stop (Stop() does not know this condition variable:
  // a short timeout reads it again).
  template <typename Pred>
  void WaitFor(std::unique_lock<std::mutex>& lk, Flow& f, Pred pred) {
    while (!pred() && !stop.load()) f.cv.wait_for(lk, std::chrono::milliseconds(20));
  }

  void Decoder(Flow& f) {
    // A failure to start is the first batch's error (the submitter pushes it).
    Status started;
    if (cudaError_t ce = cudaSetDevice(g.device); ce != cudaSuccess)
      started = gpu::CudaError(ce, "cudaSetDevice (GPU loader decoder)");
    for (uint64_t q = 0;; ++q) {
      Set& set = sets[q % kSets];
      auto tw = PClock::now();
      {
        std::unique_lock<std::mutex> lk(f.m);
        WaitFor(lk, f, [&] { return f.packed > q || f.packer_done || f.submitter_done; });
        if (stop.load() || f.packed <= q || f.submitter_done) break;  // stopped, or no batch q
      }
      if (prof.on) prof.handoff += Since(tw);
      if (set.err.ok()) set.err = started;
      if (set.err.ok()) {
        auto td = PClock::now();
        set.err = DecodeBatch(set, int(q % kSets));
        if (set.err.ok())
          if (cudaError_t ce = cudaEventRecord(set.decoded, stream); ce != cudaSuccess)
            set.err = gpu::CudaError(ce, "cudaEventRecord(decoded)");
        last_decode_s.store(Since(td));
      }
      const bool bad = !set.err.ok();
      f.Mark(&f.decoded, q + 1);
      if (bad) break;  // (the submitter pushes the error)
    }
    f.Mark(&f.decoder_done);
  }

  void Submitter(Flow& f) {
    bool bad = false;
    if (cudaError_t ce = cudaSetDevice(g.device); ce != cudaSuccess) {
      Push({gpu::CudaError(ce, "cudaSetDevice (GPU loader submitter)"), {}});
      bad = true;
    }
    for (uint64_t q = 0; !bad; ++q) {
      Set& set = sets[q % kSets];
      {
        std::unique_lock<std::mutex> lk(f.m);
        WaitFor(lk, f, [&] { return f.decoded > q || f.decoder_done; });
        if (stop.load() || f.decoded <= q) break;  // stopped, or no batch q
      }
      QueueItem it;
      if (!set.err.ok()) {
        it.st = set.err;
      } else {
        auto t0 = PClock::now();
        int slot = ring->Acquire(&stop);
        if (slot < 0) break;  // stopped
        const double acq = Since(t0);
        last_acquire_s.store(acq);
        if (prof.on) prof.acquire += acq;
        auto r = Output(set, int(q % kSets), slot, &it);
        if (r.ok()) {
          it.batch = std::move(r).value();
        } else {
          it.st = std::move(r).take_status();
          ring->Abandon(slot);
        }
      }
      bad = !it.st.ok();
      const bool last = !bad && set.batch + 1 == set.batches;
      Push(std::move(it));  // (an error stays until set_epoch)
      if (last) Push({Status::OK(), GpuLoaderAccess::End()});
      f.Mark(&f.finished, q + 1);
    }
    f.Mark(&f.submitter_done);
  }

  void Packer(Flow& f) {
    for (uint64_t q = 0;; ++q) {
      Set& set = sets[q % kSets];
      {
        std::unique_lock<std::mutex> lk(f.m);
        WaitFor(lk, f, [&] {
          return (f.posted > q && set.left.load() == 0) || (f.producer_done && f.posted <= q) || f.submitter_done;
        });
        if (stop.load() || f.posted <= q || f.submitter_done) break;
      }
      if (set.err.ok()) set.err = PackBatch(set);
      const bool bad = !set.err.ok();
      f.Mark(&f.packed, q + 1);
      if (bad) break;  // (the submitter pushes the error)
    }
    f.Mark(&f.packer_done);
  }

  void Produce(uint64_t e, uint64_t start) override {
    Flow f;
    std::thread sub([&] { Submitter(f); });
    std::thread dec([&] { Decoder(f); });
    std::thread pk([&] {
      (void)cudaSetDevice(g.device);  // (an error surfaces in Pack's CUDA calls)
      Packer(f);
    });
    // An epoch with no batch left (restored at its end, or too small for one batch):
    // its end comes before anything of the next.
    if (start >= order.num_batches()) Push({Status::OK(), GpuLoaderAccess::End()});
    uint64_t ep = e, b = start;
    for (uint64_t q = 0;; ++q, ++b) {
      if (b >= order.num_batches()) {
        if (!Continues() || ep == UINT64_MAX) break;
        // Epoch ep + 1 only once ep is the consumer's (ep may itself be one made ahead):
        // the flow runs at most one epoch ahead of the consumer.
        {
          std::unique_lock<std::mutex> lk(mu);  // (Stop() sets `stop` without mu: poll it)
          while (!stop.load() && !(out.epoch == ep && out.sticky.ok()))
            cv.wait_for(lk, std::chrono::milliseconds(20));
        }
        if (stop.load()) break;
        ++ep;
        b = 0;
        order = pipeline::RankOrder(pipeline::OrderOf(mix, n, o, ep), 0, o);  // (the producer's alone while it runs)
      }
      Set& set = sets[q % kSets];
      auto t0 = PClock::now();
      {
        std::unique_lock<std::mutex> lk(f.m);
        WaitFor(lk, f, [&] { return f.submitter_done || q < f.finished + kSets; });
        if (f.submitter_done || stop.load()) break;
      }
      cudaError_t ce = cudaEventSynchronize(set.done);  // the GPU is done with its buffers
      if (prof.on) {
        prof.wait_set += Since(t0);
        ProfileCollect(int(q % kSets));
        ++prof.batches;
      }
      set.err = ce == cudaSuccess ? Status::OK() : gpu::CudaError(ce, "cudaEventSynchronize(set)");
      const pipeline::BatchRows rows = pipeline::RowsOf(order.size(), o.batch_size, b);
      set.epoch = ep;
      set.batch = b;
      set.batches = order.num_batches();
      set.index.resize(rows.count());
      for (size_t i = 0; i < rows.count(); ++i) set.index[i] = order[rows.begin + i];
      if (set.err.ok()) data->Prefetch(set.index.data(), set.index.size());  // (remote shards: reads start now)
      const size_t count = set.err.ok() ? rows.count() : 0;
      set.pix_used.store(0);
      set.bits_used.store(0);
      set.left.store(count);
      set.row_s.store(0);
      set.posted = PClock::now();
      {
        std::lock_guard<std::mutex> lk(f.m);
        f.posted = q + 1;
        f.items += count;
      }
      if (count) PostRows(f, set);
      f.cv.notify_all();
      if (!set.err.ok()) break;
    }
    {
      std::unique_lock<std::mutex> lk(f.m);
      f.producer_done = true;
      f.cv.notify_all();
      // Every posted row has run (they use the sets), and the submitter has seen the end.
      f.cv.wait(lk, [&] { return f.items == 0 && f.submitter_done && f.decoder_done && f.packer_done; });
    }
    sub.join();
    dec.join();
    pk.join();
  }

  // Phase 1 of a batch's rows, posted to the host threads (producer thread).
  void PostRows(Flow& f, Set& set) {
    std::vector<RowPool::Item> items;
    items.reserve(set.index.size());
    for (size_t i = 0; i < set.index.size(); ++i)
      items.push_back([this, &f, &set, e = set.epoch, i, index = set.index[i]](int tid) {
        PrepareRow(f, set, e, i, index, tid);
      });
    pool->Post(std::move(items), /*urgent=*/false);
  }

  // One phase-1 row (a host thread). The batch's last row records the batch's host time
  // per thread (the placement's measure of the host side: what the batch costs the host
  // threads without a barrier) and wakes the submitter.
  void PrepareRow(Flow& f, Set& set, uint64_t e, size_t i, uint64_t index, int tid) {
    Row& r = set.rows[i];
    auto tr = PClock::now();
    if (stop.load(std::memory_order_relaxed)) {
      r.st = pipeline::Stopped();
    } else {
      Prepare(set, r, e, index, tid);  // (exceptions: the row's kInternal)
    }
    const double dt = Since(tr);
    set.row_s += dt;
    if (prof.on) (r.route == 0 ? prof.rows_host : prof.rows_nvjpeg) += dt;
    const bool last = set.left.fetch_sub(1) == 1;
    if (last) {
      last_prepare_s.store(set.row_s.load() / pool->size());
      if (prof.on) prof.phase1 += Since(set.posted);
    }
    std::lock_guard<std::mutex> lk(f.m);  // (the last use of f: Produce waits for items == 0)
    --f.items;
    if (last || f.items == 0) f.cv.notify_all();
  }

  // --- one batch ---

  // Host route: libjpeg-turbo / libpng with the CPU loader's exact call
  // (pipeline::DecodeCrop), then the box's pixels packed and the weights computed as
  // pipeline::Resizer does.
  Status DecodeOnHost(Set& set, Row& r, uint64_t e, uint64_t index, const Location& where) {
    pipeline::Augment aug;
    decode::Region reg;
    SK_RETURN_IF_ERROR(pipeline::DecodeImage(host_decoders.local(), o, rrc, e, index, *r.image, &facts, where, &aug, &reg));
    int xlo, xhi, ylo, yhi;
    gpu::BoxWeights(reg.box, reg.width, reg.height, o.output_width, o.output_height, &r.wx, &r.wy, &xlo, &ylo, &xhi,
                    &yhi);
    gpu::ShiftStarts(&r.wx, xlo);
    gpu::ShiftStarts(&r.wy, ylo);
    r.pw = xhi - xlo;
    r.ph = yhi - ylo;
    uint8_t* dst = Reserve(set.pix_used, set.pix_cap, set.host, r.box_bytes(), &r.pix_off);
    r.pix_direct = dst != nullptr;
    if (!dst) {
      r.pixels.resize(r.box_bytes());
      dst = r.pixels.data();
    }
    for (int y = 0; y < r.ph; ++y)
      std::memcpy(dst + size_t(y) * r.pw * 3, reg.pixels + reg.stride * size_t(ylo + y) + size_t(xlo) * 3,
                  size_t(r.pw) * 3);
    r.flip = aug.flip;
    r.route = 0;
    return Status::OK();
  }

#ifdef SHARDKIT_HAVE_NVJPEG
  // nvJPEG route: the box from the header's size; true when nvJPEG takes the image.
  bool TryNvjpeg(Set& set, Row& r, int tid, uint64_t e, uint64_t index) {
    gpu::JpegHeader h;
    if (!gpu::ParseJpegHeader(r.data, r.size, &h)) return false;
    gpu::JpegClass cls = gpu::Classify(h);
    if (cls == gpu::JpegClass::kHost) return false;
    // The engines' share: a fixed function of the sample index (see hardware_load), or
    // of the index and the adaptive share.
    const double load = adaptive ? placement.share() : hw_load;
    if (cls == gpu::JpegClass::kHardware && load < 1.0 &&
        double(pipeline::Mix64(index ^ 0x6877'6c6f'6164ull) >> 11) * 0x1.0p-53 >= load)
      return false;
    if (adaptive && cls != gpu::JpegClass::kHardware && !placement.cuda_on()) return false;
    // Over the limits: the host decoder refuses it (naming the declared size), before
    // nvJPEG would allocate its output.
    if (!decode::CheckDimensions(pipeline::DecodeLimits(o), uint64_t(h.width), uint64_t(h.height)).ok()) return false;
    pipeline::Augment aug = pipeline::ChooseCrop(o, rrc, e, index, h.width, h.height);
    int xlo, xhi, ylo, yhi;
    gpu::BoxWeights(aug.box, h.width, h.height, o.output_width, o.output_height, &r.wx, &r.wy, &xlo, &ylo, &xhi, &yhi);
    gpu::NvItem& it = r.item;
    it = gpu::NvItem{};
    it.data = r.data;
    it.size = r.size;
    it.roi = g.roi_decode && (xlo > 0 || ylo > 0 || xhi < h.width || yhi < h.height);
    it.x = xlo, it.y = ylo, it.w = xhi - xlo, it.h = yhi - ylo;
    if (!nv->Inspect(tid, cls == gpu::JpegClass::kHardware, &it)) return false;
    if (it.roi) {
      gpu::ShiftStarts(&r.wx, xlo);
      gpu::ShiftStarts(&r.wy, ylo);
      r.pw = it.w;
      r.ph = it.h;
    } else {
      r.pw = h.width;
      r.ph = h.height;
    }
    it.pitch = int64_t(r.pw) * 3;
    r.flip = aug.flip;
    r.route = it.backend;
    if (r.route == 1) {  // the engines read their bitstreams from pinned memory
      size_t off = 0;
      uint8_t* dst = Reserve(set.bits_used, set.bits_cap, set.bits, r.size, &off);
      r.bits_direct = dst != nullptr;
      if (dst) {
        std::memcpy(dst, r.data, r.size);
        it.data = dst;
      }
    }
    return true;
  }
#endif

  // The GPU path's row decoder (pipeline/engine.h): nvJPEG when it takes the image,
  // else the host decoder. `tid`: the host thread's index in the pool.
  void Prepare(Set& set, Row& r, uint64_t e, uint64_t index, [[maybe_unused]] int tid) {
    r.route = 0;
    r.label = -1;
    r.fields.clear();
    r.st = pipeline::RunRow(
        data.get(), o, index, nullptr, &r.sample,
        [&](const pipeline::RowHead& h) -> Status {
          r.label = pipeline::MixtureLabel(mix.get(), label_offsets, index, h.label);
          r.image = h.image;
          r.data = h.image->data.data();
          r.size = h.image->data.size();
          r.fields = h.fields;
#ifdef SHARDKIT_HAVE_NVJPEG
          if (nv && h.image->ext != "npy" && TryNvjpeg(set, r, tid, e, index))  // (decoded arrays: the host route)
            return Status::OK();
#endif
          return DecodeOnHost(set, r, e, index, h.where);
        },
        &facts);
  }

  // Buffers only grow, to the high-water mark of the batches seen (then memory stays
  // flat). A replaced buffer is retired, not freed: cudaFree/cudaFreeHost would wait for
  // the whole device, including the consumer's kernels.
  std::vector<std::pair<void*, bool>> retired;  // (pointer, pinned), freed at destruction
  std::mutex retired_mu;  // (the packer and a retrying submitter may grow at once)

  // `keep`: bytes at the start of a pinned buffer that a replacement takes along.
  Status Grow(uint8_t** p, size_t* cap, size_t need, bool pinned, size_t keep = 0) {
    if (need <= *cap) return Status::OK();
    size_t c = std::max(need + need / 2, size_t(1) << 20);
    void* q = nullptr;
    if (pinned) {
      SK_CUDA_RETURN(cudaHostAlloc(&q, c, cudaHostAllocDefault));
      if (keep && *p) std::memcpy(q, *p, std::min(keep, *cap));
    } else {
      SK_CUDA_RETURN(cudaMalloc(&q, c));
    }
    if (*p) {
      std::lock_guard<std::mutex> lk(retired_mu);
      retired.emplace_back(*p, pinned);
    }
    *p = static_cast<uint8_t*>(q);
    *cap = c;
    return Status::OK();
  }

  // `bytes` of a set's pinned staging for a phase-1 row (any host thread): its address and
  // offset, or null when the staging has no room left (the row keeps its own copy).
  static uint8_t* Reserve(std::atomic<size_t>& used, size_t cap, uint8_t* base, size_t bytes, size_t* off) {
    const size_t need = Align(bytes, 64);
    const size_t at = used.fetch_add(need, std::memory_order_relaxed);
    if (!base || at + need > cap) return nullptr;
    *off = at;
    return base + at;
  }

  // pipeline::SettleRows, the skipped rows of epoch e appended to `out.skipped`, or to
  // ahead_skipped while e is not the consumer's epoch yet.
  Status Settle(const std::vector<Status>& rows, std::vector<size_t>* keep, uint64_t e) {
    std::vector<Status> sk;
    Status st = pipeline::SettleRows(rows, o.on_error, keep, &sk);
    if (!sk.empty()) {
      std::lock_guard<std::mutex> lk(mu);
      auto& to = e == out.epoch ? out.skipped : ahead_skipped;
      for (auto& x : sk) to.push_back(std::move(x));
    }
    return st;
  }

  // The rows kept (errors: kError fails the batch at the first one; kSkip drops and
  // counts), packed and uploaded (packer thread, batches in order).
  Status PackBatch(Set& set) {
    const size_t count = set.index.size();
    if (stop.load()) return pipeline::Stopped();
    std::vector<Status> row_st(count);
    for (size_t i = 0; i < count; ++i) row_st[i] = set.rows[i].st;
    set.keep.clear();
    SK_RETURN_IF_ERROR(Settle(row_st, &set.keep, set.epoch));
    return Pack(set, set.keep);
  }

  // The decode of a packed batch on the GPU; an nvJPEG failure is redone on the host
  // (decoder thread).
  Status DecodeBatch(Set& set, int set_index) {
    const uint64_t e = set.epoch;
    if (stop.load()) return pipeline::Stopped();
    std::vector<size_t>& keep = set.keep;
    for (int attempt = 0;; ++attempt) {
      Status st = attempt == 0 ? DecodeOnGpu(set, set_index, keep) : Launch(set, set_index, keep);
      if (st.ok()) break;
      if (attempt > 0 || st.code() != Code::kCorrupt) return st;
      // An nvJPEG failure: let the host decode every row nvJPEG had, then launch again.
      SK_CUDA_RETURN(cudaStreamSynchronize(stream));
      std::vector<size_t> redo;
      for (size_t i : keep)
        if (set.rows[i].route != 0) redo.push_back(i);
      Latch done;
      done.left = redo.size();
      std::vector<RowPool::Item> items;
      for (size_t i : redo)
        items.push_back([&, i](int) {
          Row& r = set.rows[i];
          uint64_t index = set.index[i];
          const Location where{.key = r.sample.key, .index = int64_t(index)};
          try {
            r.st = DecodeOnHost(set, r, e, index, where);
          } catch (const std::exception& ex) {  // (a pool thread must not throw: the latch waits)
            r.st = Status::Internal(std::string("host decode: ") + ex.what(), where);
          }
          done.Done();
        });
      if (!redo.empty()) pool->Post(std::move(items), /*urgent=*/true);
      done.Wait();
      std::vector<size_t> kept;
      std::vector<Status> row_st(keep.size());
      for (size_t k = 0; k < keep.size(); ++k) row_st[k] = set.rows[keep[k]].st;
      SK_RETURN_IF_ERROR(Settle(row_st, &kept, e));
      for (size_t& k : kept) k = keep[k];
      keep.swap(kept);
    }
    return Status::OK();
  }

  // The output of a decoded batch: wait for the consumer to be done with the slot, then
  // resize into it (submitter thread).
  Result<DeviceBatch> Output(Set& set, int set_index, int slot, QueueItem* counts) {
    const uint64_t e = set.epoch, b = set.batch;
    if (stop.load()) return pipeline::Stopped();
    const std::vector<size_t>& keep = set.keep;
    auto tt = PClock::now();
    auto& s = ring->slots[size_t(slot)];
    cudaStream_t os = out_stream;
    SK_CUDA_RETURN(cudaStreamWaitEvent(os, set.decoded, 0));
    SK_CUDA_RETURN(cudaStreamWaitEvent(os, s.released, 0));
    if (prof.on) SK_CUDA_RETURN(cudaEventRecord(prof.ev[set_index][1], os));
    const auto* descs = reinterpret_cast<const gpu::ResizeDesc*>(set.dev + set.desc_off);
    const auto* blob =
        reinterpret_cast<const uint32_t*>(set.dev + set.desc_off + Align(keep.size() * sizeof(gpu::ResizeDesc)));
    SK_RETURN_IF_ERROR(gpu::LaunchResize(descs, blob, int(keep.size()), o.output_height, o.output_width, o.dtype,
                                         o.layout, norm, s.out, os));
    SK_CUDA_RETURN(cudaEventRecord(s.ready, os));
    if (prof.on) {
      SK_CUDA_RETURN(cudaEventRecord(prof.ev[set_index][2], os));
      prof.pending[set_index] = true;
    }
    SK_CUDA_RETURN(cudaEventRecord(set.done, os));
    if (prof.on) prof.tail += Since(tt);

    std::vector<int64_t> labels;
    std::vector<std::string> keys;
    std::vector<uint64_t> indices;
    std::vector<std::vector<std::optional<Bytes>>> fields(o.fields.size());
    for (size_t i : keep) {
      const Row& r = set.rows[i];
      for (size_t f = 0; f < fields.size(); ++f) fields[f].push_back(r.fields[f]);
      labels.push_back(r.label);
      keys.push_back(r.sample.key);
      indices.push_back(set.index[i]);
      switch (r.route) {
        case 0: ++counts->host; break;
        case 1: ++counts->hw; break;
        default: ++counts->cuda; break;
      }
#ifdef SHARDKIT_HAVE_NVJPEG
      if (r.route != 0 && r.item.roi) ++counts->roi;
#endif
    }
    std::vector<uint32_t> sources = pipeline::MixtureSources(mix.get(), indices);
    return GpuLoaderAccess::Make(ring, slot, o.dtype, o.layout, int64_t(keep.size()), o.output_height,
                                 o.output_width, std::move(labels), std::move(keys), std::move(indices), e, b,
                                 std::move(fields), std::move(sources));
  }

  // Phase 2: pack and upload, then decode on the GPU. kCorrupt: nvJPEG refused
  // something (the caller retries on the host).
  Status Launch(Set& set, int set_index, const std::vector<size_t>& keep) {
    SK_RETURN_IF_ERROR(Pack(set, keep));
    return DecodeOnGpu(set, set_index, keep);
  }

  // Packs descriptors, weights, host pixels and the engines' bitstreams into the set's
  // pinned buffer and uploads them (the packer thread; the submitter when it retries).
  // Layout of `host` (and `dev`, which mirrors its first `total` bytes): the pixels phase 1
  // wrote there itself [0, direct_end), the other host-route pixels, the descriptors, the
  // weights; then (not uploaded) the bitstreams that did not fit in `bits`. Phase 1's
  // staging is then sized for the next batch of this set: most rows find room, and the
  // packer's serial copies (4.7 ms a batch on the H200 machine) shrink to the weights.
  Status Pack(Set& set, const std::vector<size_t>& keep) {
    const int ow = o.output_width, oh = o.output_height;
    auto tl = PClock::now();
    size_t direct_end = 0, words = 0, pix = 0, arena_bytes = 0, bits = 0, bits_direct = 0;
    for (size_t i : keep) {
      Row& r = set.rows[i];
      if (r.route == 0 && r.pix_direct) direct_end = std::max(direct_end, r.pix_off + Align(r.box_bytes(), 64));
    }
    direct_end = Align(direct_end);
    for (size_t i : keep) {
      Row& r = set.rows[i];
      r.blob_off = words;
      words += size_t(2 * ow) + size_t(ow) * r.wx.taps + size_t(2 * oh) + size_t(oh) * r.wy.taps;
      if (r.route == 0) {
        if (!r.pix_direct) {
          r.pix_off = direct_end + pix;
          pix += Align(r.box_bytes(), 64);
        }
      } else {
        r.arena_off = arena_bytes;
        arena_bytes += Align(r.box_bytes());
      }
      if (r.route == 1) {
        if (r.bits_direct) {
          bits_direct += Align(r.size, 64);
        } else {
          r.bits_off = bits;
          bits += Align(r.size, 64);
        }
      }
    }
    const size_t pix_end = Align(direct_end + pix);
    const size_t desc_bytes = Align(keep.size() * sizeof(gpu::ResizeDesc));
    const size_t blob_bytes = Align(words * 4);
    const size_t total = pix_end + desc_bytes + blob_bytes;
    // Room for this batch, and for the next one's pixels with a quarter to spare beside
    // twice this batch's descriptors and weights (the rest, pix_cap, phase 1 may fill).
    const size_t next_pix = Align(pix_end + pix_end / 4);
    const size_t reserve = 2 * (desc_bytes + blob_bytes);
    SK_RETURN_IF_ERROR(Grow(&set.host, &set.host_cap, std::max(total + bits, next_pix + reserve), true, direct_end));
    SK_RETURN_IF_ERROR(Grow(&set.dev, &set.dev_cap, total, false));
    SK_RETURN_IF_ERROR(Grow(&set.arena, &set.arena_cap, arena_bytes, false));
    // (A replaced `bits` stays valid until destruction: this batch's items point into it.)
    const size_t all_bits = bits_direct + bits;
    SK_RETURN_IF_ERROR(Grow(&set.bits, &set.bits_cap, all_bits + all_bits / 4, true));
    set.desc_off = pix_end;
    auto* descs = reinterpret_cast<gpu::ResizeDesc*>(set.host + pix_end);
    uint32_t* blob = reinterpret_cast<uint32_t*>(set.host + pix_end + desc_bytes);
    pack_arena->execute([&] { tbb::parallel_for(size_t(0), keep.size(), [&](size_t k) {
      Row& r = set.rows[keep[k]];
      gpu::ResizeDesc d;
      d.pitch = int64_t(r.pw) * 3;
      d.weights = r.blob_off;
      d.taps_x = r.wx.taps;
      d.taps_y = r.wy.taps;
      d.flip = r.flip ? 1 : 0;
      if (r.route == 0) {
        d.src = set.dev + r.pix_off;
        if (!r.pix_direct) std::memcpy(set.host + r.pix_off, r.pixels.data(), r.box_bytes());
      } else {
        d.src = set.arena + r.arena_off;
#ifdef SHARDKIT_HAVE_NVJPEG
        r.item.dst = set.arena + r.arena_off;
        r.item.pitch = d.pitch;
        if (r.route == 1 && !r.bits_direct) {
          uint8_t* pinned_bits = set.host + total + r.bits_off;
          std::memcpy(pinned_bits, r.data, r.size);
          r.item.data = pinned_bits;
        }
#endif
      }
      descs[k] = d;
      uint32_t* w = blob + r.blob_off;
      std::memcpy(w, r.wx.start.data(), size_t(ow) * 4);
      std::memcpy(w + ow, r.wx.count.data(), size_t(ow) * 4);
      std::memcpy(w + 2 * ow, r.wx.w.data(), size_t(ow) * r.wx.taps * 4);
      uint32_t* wy = w + 2 * ow + size_t(ow) * r.wx.taps;
      std::memcpy(wy, r.wy.start.data(), size_t(oh) * 4);
      std::memcpy(wy + oh, r.wy.count.data(), size_t(oh) * 4);
      std::memcpy(wy + 2 * oh, r.wy.w.data(), size_t(oh) * r.wy.taps * 4);
    }); });
    SK_CUDA_RETURN(cudaMemcpyAsync(set.dev, set.host, total, cudaMemcpyHostToDevice, stream));
    uploaded += total;
    set.pix_cap = set.host_cap - std::min(set.host_cap, reserve);
    if (prof.on) prof.pack += Since(tl);
    return Status::OK();
  }

  // The set's rows that nvJPEG takes: the hardware batch and the CUDA-backend rows
  // (submitter thread).
  Status DecodeOnGpu([[maybe_unused]] Set& set, [[maybe_unused]] int set_index,
                     [[maybe_unused]] const std::vector<size_t>& keep) {
#ifdef SHARDKIT_HAVE_NVJPEG
    if (nv) {
      std::vector<gpu::NvItem*> hw_items;
      std::vector<size_t> cuda_rows;
      for (size_t i : keep) {
        Row& r = set.rows[i];
        if (r.route == 1) hw_items.push_back(&r.item);
        if (r.route == 2 || r.route == 3) cuda_rows.push_back(i);
      }
      if (prof.on) SK_CUDA_RETURN(cudaEventRecord(prof.ev[set_index][0], stream));
      // The CUDA-backend rows decode on the host threads (before any phase-1 row) while
      // this thread submits the hardware batch (which blocks it for most of the engines'
      // time).
      std::atomic<bool> failed{false};
      std::string why;
      std::mutex why_mu;
      Latch done;
      done.left = cuda_rows.size();
      auto tc = PClock::now();
      if (!cuda_rows.empty()) {
        std::vector<RowPool::Item> items;
        for (size_t i : cuda_rows)
          items.push_back([&, i](int tid) {
            Status cst = nv->DecodeCuda(tid, set.rows[i].item);
            if (!cst.ok()) {
              failed.store(true);
              std::lock_guard<std::mutex> lk(why_mu);
              why = cst.ToString();
            }
            done.Done();
          });
        pool->Post(std::move(items), /*urgent=*/true);
      }
      auto th = PClock::now();
      Status hst = nv->DecodeHardware(set_index, hw_items, stream);
      if (prof.on) prof.hw_call += Since(th);
      done.Wait();
      if (!hst.ok()) return Status::Corrupt("nvJPEG hardware batch: " + hst.ToString());
      SK_RETURN_IF_ERROR(nv->Join(stream));
      if (prof.on) prof.cuda_rows += Since(tc);
      if (failed.load()) return Status::Corrupt("nvJPEG CUDA decode: " + why);
    }
#endif
    return Status::OK();
  }
};

}  // namespace

Result<std::unique_ptr<GpuLoader::Impl>> MakeDecodeImpl(const LoaderOptions& o, const GpuOptions& g,
                                                        DecoderKind kind, std::shared_ptr<RandomAccess> data,
                                                        std::unique_ptr<Dataset> ds, std::string_view address) {
  auto impl = std::make_unique<DecodeImpl>();
  impl->o = o;
  impl->g = g;
  impl->kind = kind;
  impl->kind_requested = g.decoder;
  if (data) {
    impl->data = std::move(data);
  } else if (!o.sources.empty()) {  // a mixture: every source by random access
    SK_ASSIGN_OR_RETURN(pipeline::OpenedMixture m, pipeline::OpenMixture(o));
    impl->data = std::move(m.data);
    impl->mix = std::move(m.mix);
    impl->label_offsets = std::move(m.label_offsets);
    impl->facts = std::move(m.facts);
    SK_RETURN_IF_ERROR(pipeline::CheckArrayColours(impl->data.get(), o, impl->facts));
  } else {
    if (ds) {
      impl->dataset = std::move(ds);
    } else {
      SK_ASSIGN_OR_RETURN(impl->dataset, Open(address, o.open));
    }
    Result<std::shared_ptr<RandomAccess>> ra = impl->dataset->NewRandomAccess();
    if (!ra.ok() && ra.status().code() == Code::kUnsupported && g.decoder == DecoderKind::kAuto) {
      // A dataset read only in order (pipe:, a shard list without sizes): the copy
      // path's CPU Loader streams it.
      return MakeCopyImpl(o, g, DecoderKind::kCpu, nullptr, std::move(impl->dataset), address);
    }
    SK_ASSIGN_OR_RETURN(impl->data, std::move(ra));
    impl->facts = pipeline::FactsOf(impl->dataset->info(), impl->data->size());
    SK_RETURN_IF_ERROR(pipeline::CheckArrayColours(impl->data.get(), o, impl->facts));
  }
  SK_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<GpuLoader::Impl>(std::move(impl));
}

}  // namespace shardkit::gpu_detail
