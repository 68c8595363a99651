// The streaming reader: epoch plan -> read -> decode/crop/resize in parallel -> batches.
//
// Work is submitted per batch: each batch in flight is one task enqueued in the loader's
// TBB arena, which runs a parallel_for over its samples (sample i writes row i, so the
// order inside a batch never depends on timing). Up to `prefetch` batches exist at once
// (in flight, ready, or held by the consumer): one pool slot each. Next() waits for the
// batch it needs and tops up the submissions.
// Streamed mode (no random access, or LoaderOptions::stream): one reader thread runs
// pipeline::StreamReader (shard order, rank range, shuffle buffer) and queues each
// batch's samples; a job then decodes the samples it was given instead of Get()ting them.
// Between epochs (LoaderOptions::prefetch_next_epoch): once every batch of the current
// epoch e is submitted, free slots take batches of epoch e + 1 (`Impl::ahead`: its plan
// computed by a worker between two rows, or, streamed, read by the reader thread once it
// finished e). set_epoch(e + 1) adopts them as they are; anything else cancels and drops
// them. See docs/loader.md, "Between epochs".
#include "shardkit/loader.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#define TBB_PREVIEW_GLOBAL_CONTROL 1
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "decode/jpeg.h"
#include "pipeline/engine.h"
#include "pipeline/mixture.h"
#include "pipeline/plan.h"
#include "pipeline/resize.h"
#include "pipeline/stream.h"

namespace shardkit {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kUint8: return "uint8";
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kUint8: return 1;
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
  }
  return 1;
}

namespace {
class HeapAllocator final : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    size_t n = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    return std::aligned_alloc(4096, n);
  }
  void Deallocate(void* p, size_t) override { std::free(p); }
  bool pinned() const override { return false; }
};
}  // namespace

std::shared_ptr<HostAllocator> DefaultHostAllocator() {
  static auto a = std::make_shared<HeapAllocator>();
  return a;
}

// ---- LoaderState ----

std::string LoaderState::ToJson() const {
  nlohmann::json j = {{"version", 2},          {"seed", seed},
                      {"epoch", epoch},        {"next_batch", next_batch},
                      {"num_samples", num_samples}, {"rank", rank},
                      {"world_size", world_size},   {"batch_size", batch_size},
                      {"position", position},       {"start", start},
                      {"epoch_size", epoch_size}};
  if (!sources.empty()) {
    nlohmann::json src = nlohmann::json::array();
    for (const auto& [size, count] : sources) src.push_back({{"samples", size}, {"per_epoch", count}});
    j["sources"] = std::move(src);
  }
  if (has_stream) {
    nlohmann::json buf = nlohmann::json::array();
    for (const auto& e : stream.buffer) buf.push_back(nlohmann::json::array({e.shard, e.offset, e.key}));
    j["stream"] = {{"epoch", stream.epoch}, {"next_batch", stream.next_batch}, {"emitted", stream.emitted}, {"segment", stream.segment}, {"offset", stream.offset},
                   {"buffer", std::move(buf)}};
  }
  // A key that is not UTF-8 is written with U+FFFD in its place; restoring then reports
  // the mismatch (naming the key) rather than yielding other samples.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<LoaderState> LoaderState::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Invalid("loader state is not a JSON object");
  LoaderState s;
  try {
    s.version = j.at("version").get<int>();
    if (s.version != 1 && s.version != 2)
      return Status::Invalid(fmt::format("loader state version {} is not known to this shardkit (it reads 1 and 2)",
                                         s.version));
    s.seed = j.at("seed").get<uint64_t>();
    s.epoch = j.at("epoch").get<uint64_t>();
    s.next_batch = j.at("next_batch").get<uint64_t>();
    s.num_samples = j.at("num_samples").get<uint64_t>();
    s.rank = j.at("rank").get<int>();
    s.world_size = j.at("world_size").get<int>();
    s.batch_size = j.at("batch_size").get<uint32_t>();
    if (s.version >= 2) {
      s.position = j.at("position").get<uint64_t>();
      s.start = j.at("start").get<uint64_t>();
      s.epoch_size = j.at("epoch_size").get<uint64_t>();
      if (j.contains("sources"))
        for (const auto& e : j.at("sources"))
          s.sources.emplace_back(e.at("samples").get<uint64_t>(), e.at("per_epoch").get<uint64_t>());
    } else {  // one dataset, every plan from 0
      s.epoch_size = s.num_samples;
    }
    if (j.contains("stream")) {
      const nlohmann::json& st = j.at("stream");
      s.has_stream = true;
      s.stream.epoch = st.at("epoch").get<uint64_t>();
      s.stream.next_batch = st.at("next_batch").get<uint64_t>();
      s.stream.emitted = st.at("emitted").get<uint64_t>();
      s.stream.segment = st.at("segment").get<uint64_t>();
      s.stream.offset = st.at("offset").get<uint64_t>();
      for (const auto& e : st.at("buffer"))
        s.stream.buffer.push_back(StreamState::Entry{e.at(0).get<uint64_t>(), e.at(1).get<uint64_t>(),
                                                     e.at(2).get<std::string>()});
    }
  } catch (const std::exception& e) {
    return Status::Invalid(fmt::format("bad loader state: {}", e.what()));
  }
  return s;
}

// ---- the pool ----

namespace detail {
struct BatchPool {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<HostAllocator> alloc;
  size_t slot_bytes = 0;
  std::vector<void*> buffers;
  std::vector<int> state;  // kFree, kLoader, kConsumer
  enum { kFree = 0, kLoader = 1, kConsumer = 2 };

  ~BatchPool() {
    for (void* p : buffers)
      if (p) alloc->Deallocate(p, slot_bytes);
  }
  void Return(int slot) {
    {
      std::lock_guard<std::mutex> lk(mu);
      state[size_t(slot)] = kFree;
    }
    cv.notify_all();
  }
};
}  // namespace detail

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }

Batch& Batch::operator=(Batch&& o) noexcept {
  if (this == &o) return *this;
  Release();
  pool_ = std::move(o.pool_);
  slot_ = std::exchange(o.slot_, -1);
  end_ = std::exchange(o.end_, false);
  pinned_ = o.pinned_;
  data_ = std::exchange(o.data_, nullptr);
  dtype_ = o.dtype_;
  layout_ = o.layout_;
  std::memcpy(shape_, o.shape_, sizeof shape_);
  std::memset(o.shape_, 0, sizeof o.shape_);
  labels_ = std::move(o.labels_);
  keys_ = std::move(o.keys_);
  indices_ = std::move(o.indices_);
  sources_ = std::move(o.sources_);
  fields_ = std::move(o.fields_);
  epoch_ = o.epoch_;
  index_ = o.index_;
  return *this;
}

void Batch::Release() {
  if (pool_ && slot_ >= 0) pool_->Return(slot_);
  pool_.reset();
  slot_ = -1;
  data_ = nullptr;
  std::memset(shape_, 0, sizeof shape_);
  labels_.clear();
  keys_.clear();
  indices_.clear();
  sources_.clear();
  fields_.clear();
}

size_t Batch::bytes() const {
  return size_t(shape_[0]) * size_t(shape_[1]) * size_t(shape_[2]) * size_t(shape_[3]) * DTypeSize(dtype_);
}

// ---- the loader ----

namespace {
struct Worker {
  explicit Worker(const decode::Limits& limits) : decoder(limits) {}
  decode::ImageDecoder decoder;
  pipeline::Resizer resizer;
  Sample sample;
};

struct Job {
  uint64_t batch = 0;
  uint64_t epoch = 0;
  int slot = -1;
  bool done = false;
  std::atomic<bool> cancelled{false};  // dropped (set_epoch adopting the next epoch): rows stop
  size_t rows_total = 0;              // rows to decode, fixed at submission
  size_t next_row = 0;                // next row to claim (guarded by Impl::work_mu)
  std::atomic<size_t> rows_done{0};   // rows decoded; the last one finishes the job
  std::vector<uint64_t> indices;
  std::vector<int64_t> labels;
  std::vector<std::string> keys;
  std::vector<std::vector<std::optional<Bytes>>> fields;  // LoaderOptions::fields: [field][row]
  std::vector<Status> row_status;
  Status error;                 // first failure under kError, or kCancelled
  std::vector<Status> skipped;  // under kSkip
  size_t rows = 0;              // valid rows after compaction
  // Streamed mode: the samples, read ahead by the reader thread (dropped once decoded),
  // and the stream's position after them (the state before the next batch).
  std::vector<Sample> samples;
  pipeline::StreamPos post;
};

// Streamed mode: one batch's samples as the reader thread read them.
struct StreamInput {
  uint64_t epoch = 0;
  uint64_t batch = 0;
  std::vector<Sample> samples;
  std::vector<uint64_t> indices;
  Status error;  // reading failed at this batch: the batch becomes this error
  pipeline::StreamPos post;
};

pipeline::StreamPos ToPos(const StreamState& s) {
  pipeline::StreamPos p;
  p.emitted = s.emitted;
  p.segment = s.segment;
  p.offset = s.offset;
  for (const auto& e : s.buffer) p.buffer.push_back(pipeline::BufferEntry{e.shard, e.offset, e.key});
  return p;
}

StreamState FromPos(const pipeline::StreamPos& p) {
  StreamState s;
  s.emitted = p.emitted;
  s.segment = p.segment;
  s.offset = p.offset;
  for (const auto& e : p.buffer) s.buffer.push_back(StreamState::Entry{e.shard, e.offset, e.key});
  return s;
}

}  // namespace

struct Loader::Impl {
  std::unique_ptr<Dataset> dataset;  // when opened by address; outlives `data`
  std::shared_ptr<RandomAccess> data;
  std::vector<std::string> class_names;
  LoaderOptions o;
  uint64_t n = 0;
  pipeline::Partition stream_part;  // streamed mode's cut of every epoch (Init)
  pipeline::OutputSpec spec;
  pipeline::RrcParams rrc;
  pipeline::SourceFacts facts;  // the dataset's shard table and colour order, for rows
  size_t row_elems = 0, row_bytes = 0;
  bool pinned = false;

  std::unique_ptr<tbb::global_control> control;
  std::unique_ptr<tbb::task_arena> arena;
  // One per thread, made on its first row with the options' decoder limits.
  tbb::enumerable_thread_specific<Worker> workers{[this] { return Worker(pipeline::DecodeLimits(o)); }};
  std::shared_ptr<detail::BatchPool> pool;

  // Guarded by pool->mu.
  std::map<uint64_t, std::shared_ptr<Job>> jobs;
  int in_flight = 0;     // jobs submitted and not finished
  int tasks_live = 0;    // worker tasks enqueued and not exited
  // Jobs with rows nobody has claimed yet, oldest batch first (guarded by work_mu).
  // Workers always take the next row of the oldest batch, so batches finish in order,
  // one batch time apart, also right after set_epoch (no batch waits for all the
  // batches in flight to progress together).
  std::mutex work_mu;
  std::deque<std::shared_ptr<Job>> active;
  std::atomic<bool> cancel{false};

  // Consumer-thread state: the engine's delivery (pipeline/engine.h: epoch, next batch,
  // sticky error, skipped rows; out.epoch is also read by the reader thread and written
  // by Adopt under pool->mu), the batches submitted, the epoch's order.
  pipeline::Delivery out;
  uint64_t submitted = 0;
  pipeline::RankOrder order;  // evaluated per position: no table of the rank's indices
  // A mixture (LoaderOptions::sources): its plan and the sources' label offsets; null for
  // one dataset. `n` is then the mixture's items.
  std::shared_ptr<const pipeline::Mixture> mix;
  std::vector<int64_t> label_offsets;

  // Epoch e's order over the dataset or the mixture.
  pipeline::EpochOrder OrderOf(uint64_t e) const { return pipeline::OrderOf(mix, n, o, e); }
  pipeline::PlanShape Shape() const { return pipeline::ShapeOf(n, mix.get(), streaming); }
  // The current epoch's cut: streamed mode's, or the random-access plan's (`order`).
  const pipeline::Partition& Part() const { return streaming ? stream_part : order.partition(); }

  // ---- Streamed mode (see pipeline/stream.h). The reader thread runs the
  // StreamReader and queues up to kReadAhead batches of samples in `inputs`;
  // SubmitLocked turns them into jobs. `inputs`, `stats` guarded by pool->mu.
  static constexpr size_t kReadAhead = 2;
  bool streaming = false;
  std::unique_ptr<pipeline::StreamReader> stream;
  std::thread reader;
  std::atomic<bool> reader_stop{false};
  std::deque<std::shared_ptr<StreamInput>> inputs;
  Loader::StreamStats stats;
  pipeline::StreamPos pos_next;  // consumer thread: the stream's position before batch `next`

  // ---- The next epoch, started before set_epoch (guarded by pool->mu). Its batches are
  // submitted only once every batch of the current epoch is (so they never take a slot
  // the current epoch needs), by the consumer's SubmitLocked, the worker that computed
  // the plan, or the reader thread (SubmitAheadLocked).
  struct Ahead {
    bool on = false;       // an epoch is being prefetched
    uint64_t epoch = 0;    // always the current epoch + 1
    bool planned = false;  // random access: `order` is computed
    bool failed = false;   // streamed: its StreamReader::Start failed (set_epoch redoes it)
    pipeline::RankOrder order;
    uint64_t submitted = 0;
    std::map<uint64_t, std::shared_ptr<Job>> jobs;
    pipeline::StreamPos start;  // streamed: the stream's position before its batch 0
    Loader::StreamStats stats;  // streamed: the reader's counters for that epoch
  };
  Ahead ahead;
  uint64_t ahead_gen = 0;       // bumped whenever `ahead` is dropped or adopted
  std::atomic<bool> plan_pending{false};  // random access: `ahead`'s order is to be computed
  Loader::PrefetchStats pstats;  // guarded by pool->mu

  ~Impl() { Stop(); }

  // Everything but the source: partition, output spec, buffer pool, thread arena
  // (o validated and n set).
  Status Init();

  // Cancels and waits for every job in flight (the next epoch's too); frees the slots
  // of undelivered jobs and drops the prefetched next epoch.
  void Stop() {
    if (!pool) return;
    StopReader();
    cancel.store(true);
    std::unique_lock<std::mutex> lk(pool->mu);
    ++ahead_gen;       // a plan being computed is dropped ...
    ahead.on = false;  // ... and nothing more is planned or submitted for the next epoch
    pool->cv.wait(lk, [&] { return in_flight == 0 && tasks_live == 0; });
    for (auto& [b, job] : jobs) pool->state[size_t(job->slot)] = detail::BatchPool::kFree;
    jobs.clear();
    for (auto& [b, job] : ahead.jobs) pool->state[size_t(job->slot)] = detail::BatchPool::kFree;
    pstats.discarded += ahead.jobs.size();
    ahead = Ahead{};
    {
      std::lock_guard<std::mutex> wl(work_mu);
      active.clear();  // every row was claimed (and cancelled) by now
    }
    cancel.store(false);
  }

  void StopReader() {
    if (!reader.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(pool->mu);
      reader_stop.store(true);
    }
    pool->cv.notify_all();
    reader.join();
    reader_stop.store(false);
    std::lock_guard<std::mutex> lk(pool->mu);
    inputs.clear();
  }

  // The reader thread: batches first_batch, first_batch + 1, ... of epoch e (the
  // stream was started at it); then, with prefetch_next_epoch, epoch e + 1 from its
  // start, and so on, each once the one before is the consumer's epoch.
  void ReadLoop(uint64_t e, uint64_t first_batch) {
    for (;;) {
      if (!ReadEpoch(e, first_batch)) return;
      if (!o.prefetch_next_epoch || stream_part.num_batches == 0 || e == UINT64_MAX) return;
      {
        std::unique_lock<std::mutex> lk(pool->mu);
        // e may itself be a prefetched epoch: go on only once set_epoch(e) adopted it.
        pool->cv.wait(lk, [&] { return reader_stop.load() || out.epoch == e; });
        if (reader_stop.load()) return;
      }
      Status st;
      try {
        st = stream->Start(e + 1, uint32_t(o.rank), uint32_t(o.world_size), o.batch_size, o.drop_last, nullptr);
      } catch (const std::exception& ex) {
        st = Status::Internal(fmt::format("exception while starting the stream: {}", ex.what()));
      }
      {
        std::lock_guard<std::mutex> lk(pool->mu);
        if (reader_stop.load()) return;
        ahead = Ahead{};
        ahead.on = true;
        ahead.epoch = e + 1;
        if (!st.ok()) {
          ahead.failed = true;  // set_epoch(e + 1) starts it again (and reports the error)
          return;
        }
        ahead.start = stream->Position();
        CountersLocked(&ahead.stats);
      }
      ++e;
      first_batch = 0;
    }
  }

  // Copies the StreamReader's counters (reader thread, or consumer with the reader stopped).
  void CountersLocked(Loader::StreamStats* to) const {
    to->max_buffered = stream->max_buffered();
    to->samples_read = stream->samples_read();
    to->shards_opened = stream->shards_opened();
  }

  // Reads batches first_batch.. of epoch e into `inputs`. False when stopped or after a
  // reading error (queued as that batch).
  bool ReadEpoch(uint64_t e, uint64_t first_batch) {
    for (uint64_t b = first_batch; b < stream_part.num_batches; ++b) {
      {
        std::unique_lock<std::mutex> lk(pool->mu);
        pool->cv.wait(lk, [&] { return reader_stop.load() || inputs.size() < kReadAhead; });
        if (reader_stop.load()) return false;
      }
      std::shared_ptr<StreamInput> in;
      Status st;
      try {
        in = std::make_shared<StreamInput>();
        in->epoch = e;
        in->batch = b;
        const size_t count = pipeline::RowsOf(stream_part.per_rank, o.batch_size, b).count();
        in->samples.resize(count);
        in->indices.resize(count);
        for (size_t i = 0; i < count && st.ok(); ++i) {
          if (reader_stop.load(std::memory_order_relaxed)) return false;
          st = stream->Next(&in->samples[i], &in->indices[i]);
        }
        if (st.ok()) in->post = stream->Position();
      } catch (const std::exception& ex) {
        st = Status::Internal(fmt::format("exception while reading the stream: {}", ex.what()));
      }
      if (!st.ok()) {
        in = std::make_shared<StreamInput>();  // (small: no allocation of samples)
        in->epoch = e;
        in->batch = b;
        in->error = st;
      }
      {
        std::lock_guard<std::mutex> lk(pool->mu);
        inputs.push_back(in);
        // The consumer's counters are its epoch's; a prefetched epoch's wait in `ahead`.
        CountersLocked(e == out.epoch ? &stats : &ahead.stats);
        if (e != out.epoch) SubmitAheadLocked();  // decode it now, not at the consumer's next call
      }
      pool->cv.notify_all();
      if (!st.ok()) return false;
    }
    return true;
  }

  // Streamed mode: positions the stream at batch `start` of epoch e (from `at`, or by
  // replaying the stream from the epoch's start) and starts the reader thread.
  Status StreamReset(uint64_t e, uint64_t start, const pipeline::StreamPos* at) {
    Stop();
    start = std::min(start, stream_part.num_batches);
    out.Start(e, start);
    submitted = start;
    Status st = stream->Start(e, uint32_t(o.rank), uint32_t(o.world_size), o.batch_size, o.drop_last, at);
    if (st.ok() && !at) st = stream->Skip(std::min<uint64_t>(start * o.batch_size, stream_part.per_rank));
    {
      std::lock_guard<std::mutex> lk(pool->mu);
      CountersLocked(&stats);
    }
    if (!st.ok()) {
      out.Fail(st);
      return st;
    }
    pos_next = stream->Position();
    try {
      reader = std::thread([this, e, start] { ReadLoop(e, start); });
    } catch (const std::exception& ex) {
      return out.Fail(Status::Internal(fmt::format("cannot start the loader's reader thread: {}", ex.what())));
    }
    std::lock_guard<std::mutex> lk(pool->mu);
    SubmitLocked();
    return Status::OK();
  }

  // `adopt` (set_epoch): batch 0 of the prefetched next epoch keeps what was prefetched.
  // Batch `start` of epoch e; random access: of the plan from position `from` of the
  // epoch's order (0, or where an elastic restore continues).
  void Reset(uint64_t e, uint64_t start, bool adopt = false, uint64_t from = 0) {
    if (adopt && start == 0 && Adopt(e)) return;
    if (streaming) {
      (void)StreamReset(e, start, nullptr);  // an error is kept in `out.sticky` for Next()
      return;
    }
    Stop();
    order = pipeline::RankOrder(OrderOf(e), from, o);
    out.Start(e, std::min(start, order.num_batches()));
    submitted = out.next;
    std::lock_guard<std::mutex> lk(pool->mu);
    SubmitLocked();
  }

  // set_epoch(e) where e is the prefetched epoch: what is left of the current epoch is
  // cancelled (each worker stops after its sample) and freed; the prefetched batches
  // become the epoch's first ones, and the reader thread (streamed) goes on reading it.
  bool Adopt(uint64_t e) {
    std::unique_lock<std::mutex> lk(pool->mu);
    if (!ahead.on || ahead.epoch != e || ahead.failed || (!streaming && !ahead.planned)) return false;
    for (auto& [b, job] : jobs) job->cancelled.store(true);
    pool->cv.wait(lk, [&] {
      for (auto& [b, job] : jobs)
        if (!job->done) return false;
      return true;
    });
    for (auto& [b, job] : jobs) pool->state[size_t(job->slot)] = detail::BatchPool::kFree;
    jobs.clear();
    if (streaming) {  // the current epoch's batches read and not yet submitted
      while (!inputs.empty() && inputs.front()->epoch != e) inputs.pop_front();
      pos_next = std::move(ahead.start);
      stats = ahead.stats;
    }
    out.Start(e, 0);  // (the reader thread waits for this epoch before it reads epoch e + 1)
    order = std::move(ahead.order);
    jobs = std::move(ahead.jobs);
    submitted = ahead.submitted;
    pstats.adopted += jobs.size();
    ahead = Ahead{};
    ++ahead_gen;
    SubmitLocked();
    lk.unlock();
    pool->cv.notify_all();
    return true;
  }

  int FreeSlotLocked() const {
    for (size_t i = 0; i < pool->state.size(); ++i)
      if (pool->state[i] == detail::BatchPool::kFree) return int(i);
    return -1;
  }

  // Consumer thread: the current epoch's batches while slots are free; once all are
  // submitted, the next epoch's (planned first, in random-access mode).
  void SubmitLocked() {
    if (!SubmitEpochLocked(out.epoch, order, submitted, jobs, false)) return;
    if (!o.prefetch_next_epoch || Part().num_batches == 0 || out.epoch == UINT64_MAX) return;
    if (!streaming && !ahead.on) PlanAheadLocked();
    SubmitAheadLocked();
  }

  // Any thread holding pool->mu, once every batch of the current epoch is submitted
  // (guaranteed by whoever started `ahead`; dropping or adopting it bumps ahead_gen).
  void SubmitAheadLocked() {
    if (!ahead.on || ahead.failed || (!streaming && !ahead.planned)) return;
    SubmitEpochLocked(ahead.epoch, ahead.order, ahead.submitted, ahead.jobs, true);
  }

  // Random access: asks for epoch + 1's order (a permutation of the dataset:
  // milliseconds for a million samples), computed off the consumer's thread by the first
  // worker to finish a row (Work), or by this task when no worker is running.
  void PlanAheadLocked() {
    ahead = Ahead{};
    ahead.on = true;
    ahead.epoch = out.epoch + 1;
    plan_pending.store(true);
    ++tasks_live;  // Stop() waits for it like for a worker
    std::shared_ptr<detail::BatchPool> p = pool;
    arena->enqueue([this, p] {
      PlanIfPending(p);
      std::lock_guard<std::mutex> lk(p->mu);
      --tasks_live;
      p->cv.notify_all();
    });
  }

  // A worker or the planning task: computes `ahead`'s order if asked, then submits
  // its first batches into the free slots.
  void PlanIfPending(const std::shared_ptr<detail::BatchPool>& p) {
    if (!plan_pending.load(std::memory_order_relaxed) || !plan_pending.exchange(false)) return;
    uint64_t gen = 0, e = 0;
    {
      std::lock_guard<std::mutex> lk(p->mu);
      if (!ahead.on || ahead.planned) return;
      gen = ahead_gen;
      e = ahead.epoch;
    }
    pipeline::RankOrder ord(OrderOf(e), 0, o);
    std::lock_guard<std::mutex> lk(p->mu);
    if (gen == ahead_gen && ahead.on && ahead.epoch == e) {
      ahead.order = std::move(ord);
      ahead.planned = true;
      SubmitAheadLocked();
    }
  }

  // Submits batches `sub`.. of epoch e (order `ord`; streamed: from `inputs`) into
  // `js` while a slot (and, streamed, the batch's samples) is there. True once every
  // batch of the epoch is submitted.
  bool SubmitEpochLocked(uint64_t e, const pipeline::RankOrder& ord, uint64_t& sub,
                         std::map<uint64_t, std::shared_ptr<Job>>& js, bool speculative) {
    const uint64_t num_batches = streaming ? stream_part.num_batches : ord.num_batches();
    while (sub < num_batches) {
      const int slot = FreeSlotLocked();
      if (slot < 0) return false;
      std::shared_ptr<StreamInput> in;
      if (streaming) {
        if (inputs.empty()) return false;  // the reader thread has not read it yet
        // The current epoch's inputs come first; the next epoch's wait for them.
        if (speculative && inputs.front()->epoch != e) return false;
        in = std::move(inputs.front());
        inputs.pop_front();
        if ((in->epoch != e || in->batch != sub) && in->error.ok())
          in->error = Status::Internal(fmt::format("streamed batch {} of epoch {} arrived for batch {} of epoch {}",
                                                   in->batch, in->epoch, sub, e));
        pool->cv.notify_all();  // room in the read-ahead queue
      }
      pool->state[size_t(slot)] = detail::BatchPool::kLoader;
      auto job = std::make_shared<Job>();
      job->batch = sub;
      job->epoch = e;
      job->slot = slot;
      if (speculative) ++pstats.speculated;
      if (in) {
        job->indices = std::move(in->indices);
        job->samples = std::move(in->samples);
        job->post = std::move(in->post);
        if (!in->error.ok()) {  // nothing to decode: the batch is the reading error
          job->error = in->error;
          job->done = true;
          js[sub] = job;
          sub = num_batches;  // nothing after it
          return true;
        }
      } else {
        const pipeline::BatchRows rows = pipeline::RowsOf(ord.size(), o.batch_size, sub);
        job->indices.resize(rows.end - rows.begin);
        for (uint64_t k = rows.begin; k < rows.end; ++k) job->indices[k - rows.begin] = ord[k];
        // Remote shards: their range requests start now, before a worker reaches the batch.
        data->Prefetch(job->indices.data(), job->indices.size());
      }
      const size_t count = job->indices.size();
      job->rows_total = count;
      job->labels.assign(count, -1);
      job->keys.assign(count, std::string());
      job->fields.assign(o.fields.size(), std::vector<std::optional<Bytes>>(count));
      job->row_status.assign(count, Status::OK());
      js[sub] = job;
      ++sub;
      ++in_flight;
      if (count == 0) {  // nothing to decode (not produced by the partition; kept safe)
        FinishJob(*job);
        job->done = true;
        --in_flight;
        continue;
      }
      {
        std::lock_guard<std::mutex> wl(work_mu);
        active.push_back(job);
      }
      // Enough workers for this batch; those that find no row left exit at once.
      const size_t tasks = std::min(count, size_t(o.threads));
      tasks_live += int(tasks);
      std::shared_ptr<detail::BatchPool> p = pool;
      for (size_t t = 0; t < tasks; ++t) arena->enqueue([this, p] { Work(p); });
    }
    return true;
  }

  // A worker task: decodes the next unclaimed row of the oldest batch until none is left.
  // The Impl outlives it: Stop() (also in ~Impl) waits for tasks_live == 0.
  void Work(const std::shared_ptr<detail::BatchPool>& p) {
    for (;;) {
      PlanIfPending(p);
      std::shared_ptr<Job> job;
      size_t i = 0;
      {
        std::lock_guard<std::mutex> wl(work_mu);
        while (!active.empty() && active.front()->next_row >= active.front()->rows_total) active.pop_front();
        if (active.empty()) break;
        job = active.front();
        i = job->next_row++;
      }
      DecodeRow(*job, i);
      if (job->rows_done.fetch_add(1, std::memory_order_acq_rel) + 1 == job->rows_total) {
        FinishJob(*job);
        std::lock_guard<std::mutex> lk(p->mu);
        job->done = true;
        --in_flight;
        p->cv.notify_all();
      }
    }
    std::lock_guard<std::mutex> lk(p->mu);
    --tasks_live;
    p->cv.notify_all();
  }

  // The CPU loader's row decoder (pipeline/engine.h): the row's image decoded on the
  // host (DecodeCrop) and resized into its row of the batch. `given`: the sample already
  // read (streamed mode); null = Get(index) here.
  Status DecodeOne(Worker& w, uint64_t e, uint64_t index, const Sample* given, uint8_t* dst, int64_t* label,
                   std::string* key, Job& job, size_t row) {
    return pipeline::RunRow(
        data.get(), o, index, given, &w.sample,
        [&](const pipeline::RowHead& h) -> Status {
          *key = h.sample->key;
          *label = pipeline::MixtureLabel(mix.get(), label_offsets, index, h.label);
          for (size_t f = 0; f < h.fields.size(); ++f) job.fields[f][row] = h.fields[f];
          pipeline::Augment aug;
          decode::Region r;
          SK_RETURN_IF_ERROR(pipeline::DecodeImage(w.decoder, o, rrc, e, index, *h.image, &facts, h.where, &aug, &r));
          w.resizer.Run(r.pixels, r.stride, r.width, r.height, r.box, aug.flip, spec, dst);
          return Status::OK();
        },
        &facts);
  }

  void DecodeRow(Job& job, size_t i) {
    if (cancel.load(std::memory_order_relaxed) || job.cancelled.load(std::memory_order_relaxed)) {
      job.row_status[i] = pipeline::Stopped();
      return;
    }
    uint8_t* base = static_cast<uint8_t*>(pool->buffers[size_t(job.slot)]);
    try {
      job.row_status[i] = DecodeOne(workers.local(), job.epoch, job.indices[i],
                                    job.samples.empty() ? nullptr : &job.samples[i], base + i * row_bytes,
                                    &job.labels[i], &job.keys[i], job, i);
    } catch (const std::exception& ex) {  // (the worker's state; the row's own are caught in RunRow)
      job.row_status[i] = pipeline::RowException(ex, job.indices[i]);
    }
    // Streamed: this row's encoded bytes are no longer needed (each row is one worker's).
    if (!job.samples.empty()) job.samples[i] = Sample();
  }

  // After every row: the batch's error, or its rows compacted (kSkip).
  void FinishJob(Job& job) {
    uint8_t* base = static_cast<uint8_t*>(pool->buffers[size_t(job.slot)]);
    if (cancel.load() || job.cancelled.load()) {
      job.error = pipeline::Stopped();
      return;
    }
    // Assemble in order: the first failure (by row) under kError; compaction under kSkip.
    std::vector<size_t> keep;
    job.error = pipeline::SettleRows(job.row_status, o.on_error, &keep, &job.skipped);
    if (!job.error.ok()) return;
    size_t k = 0;
    for (size_t i : keep) {
      if (k != i) {
        std::memmove(base + k * row_bytes, base + i * row_bytes, row_bytes);
        job.labels[k] = job.labels[i];
        job.keys[k] = std::move(job.keys[i]);
        job.indices[k] = job.indices[i];
        for (auto& col : job.fields) col[k] = std::move(col[i]);
      }
      ++k;
    }
    job.rows = k;
    job.labels.resize(k);
    job.keys.resize(k);
    job.indices.resize(k);
    for (auto& col : job.fields) col.resize(k);
  }

  Result<Batch> Next(const std::shared_ptr<detail::BatchPool>& p) {
    if (!out.sticky.ok()) return out.sticky;
    Batch b;
    if (out.next >= Part().num_batches) {
      {
        // Buffers released since the last call go to the next epoch's batches.
        std::lock_guard<std::mutex> lk(p->mu);
        SubmitLocked();
      }
      b.end_ = true;
      b.epoch_ = out.epoch;
      b.index_ = out.next;
      return b;
    }
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(p->mu);
      SubmitLocked();
      auto it = jobs.find(out.next);
      // Streamed: a free buffer but no job yet means the reader thread is still reading
      // the batch (it always delivers: samples or an error).
      auto wait_for_reader = [&] {
        while (it == jobs.end() && streaming &&
               std::find(p->state.begin(), p->state.end(), int(detail::BatchPool::kFree)) != p->state.end()) {
          p->cv.wait(lk);
          SubmitLocked();
          it = jobs.find(out.next);
        }
      };
      wait_for_reader();
      if (it == jobs.end() && o.buffer_wait_ms > 0) {
        // Every buffer is held: wait for the consumer (another thread) to release one.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.buffer_wait_ms);
        while (it == jobs.end()) {
          if (p->cv.wait_until(lk, deadline) == std::cv_status::timeout) {
            SubmitLocked();
            it = jobs.find(out.next);
            break;
          }
          SubmitLocked();
          it = jobs.find(out.next);
        }
        wait_for_reader();  // a buffer came back, the batch is still being read
      }
      if (it == jobs.end())
        return Status::Invalid(fmt::format(
            "all {} batch buffers are held by the consumer{}: release a batch before calling Next() "
            "(or raise prefetch)", p->buffers.size(),
            o.buffer_wait_ms > 0 ? fmt::format(" (waited {} ms for one)", o.buffer_wait_ms) : ""));
      job = it->second;
      ++pstats.next_calls;
      pstats.last_next_waited = !job->done;
      if (!job->done) ++pstats.next_waited;
      p->cv.wait(lk, [&] { return job->done; });
      jobs.erase(it);
      if (!job->error.ok()) {
        p->state[size_t(job->slot)] = detail::BatchPool::kFree;
        out.Fail(job->error);
        lk.unlock();
        return out.sticky;
      }
      p->state[size_t(job->slot)] = detail::BatchPool::kConsumer;
      if (streaming) pos_next = std::move(job->post);
      out.Delivered(job->batch, &job->skipped);  // (job->batch == out.next: in plan order)
      SubmitLocked();
    }
    b.pool_ = p;
    b.slot_ = job->slot;
    b.pinned_ = pinned;
    b.data_ = p->buffers[size_t(job->slot)];
    b.dtype_ = o.dtype;
    b.layout_ = o.layout;
    const int64_t nrows = int64_t(job->rows);
    if (o.layout == Layout::kNCHW) {
      b.shape_[0] = nrows; b.shape_[1] = 3; b.shape_[2] = o.output_height; b.shape_[3] = o.output_width;
    } else {
      b.shape_[0] = nrows; b.shape_[1] = o.output_height; b.shape_[2] = o.output_width; b.shape_[3] = 3;
    }
    b.labels_ = std::move(job->labels);
    b.keys_ = std::move(job->keys);
    b.indices_ = std::move(job->indices);
    b.sources_ = pipeline::MixtureSources(mix.get(), b.indices_);
    b.fields_ = std::move(job->fields);
    b.epoch_ = out.epoch;
    b.index_ = job->batch;
    return b;
  }
};

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Loader::~Loader() = default;

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<RandomAccess> data, const LoaderOptions& opts) {
  if (!data) return Status::Invalid("no dataset");
  auto impl = std::make_unique<Impl>();
  impl->o = opts;
  SK_RETURN_IF_ERROR(pipeline::ResolveOptions(&impl->o));
  impl->data = std::move(data);
  impl->n = impl->data->size();
  SK_RETURN_IF_ERROR(impl->Init());
  impl->Reset(0, 0);
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Status Loader::Impl::Init() {
  Impl* impl = this;
  const LoaderOptions& o = impl->o;
  impl->stream_part = pipeline::PartitionEpoch(impl->n, uint32_t(o.world_size), o.batch_size, o.drop_last);
  impl->spec.width = o.output_width;
  impl->spec.height = o.output_height;
  impl->spec.dtype = o.dtype;
  impl->spec.layout = o.layout;
  for (int c = 0; c < 3; ++c) {
    impl->spec.mean[c] = o.mean[c];
    impl->spec.std[c] = o.std[c];
  }
  impl->rrc = {o.scale_min, o.scale_max, o.ratio_min, o.ratio_max, o.flip_p};
  impl->row_elems = size_t(o.output_width) * o.output_height * 3;
  impl->row_bytes = impl->row_elems * DTypeSize(o.dtype);

  auto pool = std::make_shared<detail::BatchPool>();
  pool->alloc = o.allocator ? o.allocator : DefaultHostAllocator();
  impl->pinned = pool->alloc->pinned();  // pin_memory without a pinned allocator: pageable
  pool->slot_bytes = impl->row_bytes * o.batch_size;
  pool->buffers.assign(size_t(o.prefetch), nullptr);
  pool->state.assign(size_t(o.prefetch), detail::BatchPool::kFree);
  for (auto& b : pool->buffers) {
    b = pool->alloc->Allocate(pool->slot_bytes);
    if (!b) return Status::IOError(fmt::format("cannot allocate {} batch buffers of {} bytes", o.prefetch, pool->slot_bytes));
    std::memset(b, 0, pool->slot_bytes);  // fault the pages in now, not during the first epoch
  }
  impl->pool = pool;
  // Let the arena have `threads` workers even beyond TBB's default (hardware - 1).
  if (size_t(o.threads) + 1 > size_t(tbb::info::default_concurrency()))
    impl->control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                          size_t(o.threads) + 1);
  impl->arena = std::make_unique<tbb::task_arena>(o.threads, 0);
  return Status::OK();
}

// Streamed mode over `ds`: a dataset whose shards are datasets of their own
// (ShardInfo::address: tar shards) streams shard by shard, each opened alone and read
// front to back; any other is one shard read through ds->NewReader().
Result<std::unique_ptr<Loader>> Loader::CreateStreamed(std::unique_ptr<Dataset> ds, const LoaderOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->o = opts;
  SK_RETURN_IF_ERROR(pipeline::ResolveOptions(&impl->o));
  const DatasetInfo& info = ds->info();
  std::vector<pipeline::StreamShard> shards;
  pipeline::ShardOpener opener;
  const Dataset* whole = ds.get();  // outlives the opener: both live in impl
  bool by_shard = !info.shards.empty();
  for (const auto& si : info.shards) by_shard = by_shard && !si.address.empty();
  if (by_shard) {
    std::vector<std::string> addresses;
    for (const auto& si : info.shards) {
      shards.push_back(pipeline::StreamShard{si.path, si.samples, 0});
      addresses.push_back(si.address);
    }
    opener = [addresses, oo = impl->o.open](uint64_t i) -> Result<pipeline::ShardReader> {
      pipeline::ShardReader r;
      SK_ASSIGN_OR_RETURN(r.dataset, Open(addresses[i], oo));
      SK_ASSIGN_OR_RETURN(r.reader, r.dataset->NewReader());
      return r;
    };
  } else {
    shards.push_back(pipeline::StreamShard{info.address, info.num_samples.value_or(0), 0});
    opener = [whole](uint64_t) -> Result<pipeline::ShardReader> {
      pipeline::ShardReader r;
      SK_ASSIGN_OR_RETURN(r.reader, whole->NewReader());
      return r;
    };
  }
  // Without the dataset's count, count every shard by reading it once.
  if (!info.num_samples) {
    for (uint64_t i = 0; i < shards.size(); ++i) {
      SK_ASSIGN_OR_RETURN(pipeline::ShardReader r, opener(i));
      Sample s;
      uint64_t c = 0;
      for (;;) {
        SK_ASSIGN_OR_RETURN(bool more, r.reader->Next(&s));
        if (!more) break;
        ++c;
      }
      shards[i].samples = c;
    }
  }
  uint64_t n = 0;
  for (auto& sh : shards) {
    sh.first = n;
    n += sh.samples;
  }
  impl->n = n;
  impl->streaming = true;
  impl->class_names = info.class_names;
  impl->facts = pipeline::FactsOf(info, n);
  SK_RETURN_IF_ERROR(impl->Init());
  impl->stream = std::make_unique<pipeline::StreamReader>(std::move(shards), std::move(opener),
                                                          impl->o.shuffle_buffer, impl->o.seed, impl->o.shuffle);
  impl->dataset = std::move(ds);
  SK_RETURN_IF_ERROR(impl->StreamReset(0, 0, nullptr));
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Result<std::unique_ptr<Loader>> Loader::Create(const LoaderOptions& opts) {
  if (opts.sources.empty()) return Status::Invalid("Loader::Create(options): no sources (LoaderOptions::sources)");
  auto impl = std::make_unique<Impl>();
  impl->o = opts;
  SK_RETURN_IF_ERROR(pipeline::ResolveOptions(&impl->o));
  if (impl->o.stream)
    return Status::Unsupported("a mixture of sources is read with random access; streamed mixtures are not "
                               "supported yet (LoaderOptions::stream)");
  SK_ASSIGN_OR_RETURN(pipeline::OpenedMixture m, pipeline::OpenMixture(impl->o));
  impl->data = std::move(m.data);
  impl->mix = std::move(m.mix);
  impl->label_offsets = std::move(m.label_offsets);
  impl->n = impl->data->size();
  impl->facts = std::move(m.facts);
  SK_RETURN_IF_ERROR(pipeline::CheckArrayColours(impl->data.get(), impl->o, impl->facts));
  SK_RETURN_IF_ERROR(impl->Init());
  impl->Reset(0, 0);
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Result<std::unique_ptr<Loader>> Loader::Create(std::string_view address, const LoaderOptions& opts) {
  if (!opts.sources.empty()) {
    if (!address.empty())
      return Status::Invalid(fmt::format("give an address ('{}') or LoaderOptions::sources (a mixture), not both",
                                         address));
    return Create(opts);
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Open(address, opts.open));
  return Create(std::move(ds), opts);
}

Result<std::unique_ptr<Loader>> Loader::Create(std::unique_ptr<Dataset> ds, const LoaderOptions& opts) {
  if (!ds) return Status::Invalid("no dataset");
  if (opts.stream) return CreateStreamed(std::move(ds), opts);
  Result<std::shared_ptr<RandomAccess>> rar = ds->NewRandomAccess();
  if (!rar.ok() && rar.status().code() == Code::kUnsupported) return CreateStreamed(std::move(ds), opts);
  SK_ASSIGN_OR_RETURN(std::shared_ptr<RandomAccess> ra, std::move(rar));
  if (!ra) return Status::Invalid("no dataset");
  auto impl = std::make_unique<Impl>();
  impl->o = opts;
  SK_RETURN_IF_ERROR(pipeline::ResolveOptions(&impl->o));
  impl->data = std::move(ra);
  impl->n = impl->data->size();
  impl->class_names = ds->info().class_names;
  // Known before the first row is decoded (Reset starts the workers).
  impl->facts = pipeline::FactsOf(ds->info(), impl->n);
  SK_RETURN_IF_ERROR(pipeline::CheckArrayColours(impl->data.get(), impl->o, impl->facts));
  SK_RETURN_IF_ERROR(impl->Init());
  // The dataset must outlive its RandomAccess: Impl declares `dataset` before `data`,
  // so `data` is destroyed first.
  impl->dataset = std::move(ds);
  impl->Reset(0, 0);
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

void Loader::set_epoch(uint64_t e) { impl_->Reset(e, 0, /*adopt=*/true); }
uint64_t Loader::epoch() const { return impl_->out.epoch; }
uint64_t Loader::num_batches() const { return impl_->Part().num_batches; }
uint64_t Loader::num_samples() const { return impl_->n; }
uint64_t Loader::epoch_size() const { return impl_->mix ? impl_->mix->epoch_size() : impl_->n; }
std::vector<std::pair<uint64_t, uint64_t>> Loader::mixture() const { return impl_->Shape().sources; }
int Loader::rank() const { return impl_->o.rank; }
int Loader::world_size() const { return impl_->o.world_size; }
const LoaderOptions& Loader::options() const { return impl_->o; }
const std::vector<std::string>& Loader::class_names() const { return impl_->class_names; }
Result<Batch> Loader::Next() { return impl_->Next(impl_->pool); }
std::vector<Status> Loader::skipped() const { return impl_->out.skipped; }
bool Loader::streaming() const { return impl_->streaming; }

Loader::PrefetchStats Loader::prefetch_stats() const {
  std::lock_guard<std::mutex> lk(impl_->pool->mu);
  PrefetchStats s = impl_->pstats;
  for (auto& [b, job] : impl_->ahead.jobs) {
    s.ready_ahead += job->done && job->error.ok();
    s.decoding_ahead += !job->done;
  }
  return s;
}

Loader::StreamStats Loader::stream_stats() const {
  if (!impl_->streaming) return {};
  std::lock_guard<std::mutex> lk(impl_->pool->mu);
  StreamStats s = impl_->stats;
  s.streaming = true;
  s.buffer_capacity = impl_->o.shuffle ? std::max<uint64_t>(impl_->o.shuffle_buffer, 1) : 1;
  return s;
}

LoaderState Loader::save_state() const {
  LoaderState s = impl_->out.State(impl_->o, impl_->Shape(), impl_->streaming ? 0 : impl_->order.start());
  if (impl_->streaming) {
    s.has_stream = true;
    s.stream = FromPos(impl_->pos_next);
    s.stream.epoch = impl_->out.epoch;
    s.stream.next_batch = impl_->out.next;
  }
  return s;
}

Status Loader::restore(const LoaderState& s) {
  const auto& o = impl_->o;
  if (!impl_->streaming && s.has_stream)
    return Status::Invalid("loader state is from a streamed loader; this loader reads with random access");
  SK_ASSIGN_OR_RETURN(pipeline::ResumeAt at_plan, pipeline::PlanRestore(s, o, impl_->Shape()));
  if (!impl_->streaming) {
    impl_->Reset(s.epoch, at_plan.next_batch, false, at_plan.start);
    return Status::OK();
  }
  // No position, or one from elsewhere (e.g. the GPU loader moving a saved state to
  // another batch): replay the stream to next_batch.
  if (!s.has_stream || s.stream.epoch != s.epoch || s.stream.next_batch != s.next_batch)
    return impl_->StreamReset(s.epoch, s.next_batch, nullptr);
  const uint64_t want = std::min<uint64_t>(s.next_batch * o.batch_size, impl_->stream_part.per_rank);
  if (s.stream.emitted != want)
    return Status::Invalid(fmt::format("streamed loader state has {} samples handed out at batch {} (expected {})",
                                       s.stream.emitted, s.next_batch, want));
  pipeline::StreamPos at = ToPos(s.stream);
  return impl_->StreamReset(s.epoch, s.next_batch, &at);
}

}  // namespace shardkit
