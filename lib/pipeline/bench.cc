// shardkit bench: random-read latency and throughput, interleaved across datasets.
#include "pipeline/bench_render.h"
#include "shardkit/bench.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/cores.h"
#include "io/page_cache.h"
#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) without modulo bias (Lemire's method is overkill here: rejection).
uint64_t Below(uint64_t& s, uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t r = SplitMix64(s);
    if (r < limit) return r % n;
  }
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Samples held in memory: the floor of the random-access path itself.
class MemoryAccess : public RandomAccess {
 public:
  explicit MemoryAccess(std::vector<Sample> s) : s_(std::move(s)) {}
  uint64_t size() const override { return s_.size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= s_.size()) return Status::Invalid("index out of range");
    *out = s_[i];
    return Status::OK();
  }

 private:
  std::vector<Sample> s_;
};

struct Target {
  std::string address;
  std::string format;
  std::unique_ptr<Dataset> ds;
  std::shared_ptr<RandomAccess> ra;
  std::unique_ptr<SampleReader> seq;
  std::vector<std::string> files;  // for --cold
  bool warm = false;               // read once in full already (to count a stream)
  bool file_per_sample = false;    // DatasetInfo::file_per_sample: the baseline
};

// Reads up to `limit` samples of t in order with a reader of its own; returns how many there were.
Result<uint64_t> CountSamples(Target& t, uint64_t limit = UINT64_MAX) {
  SK_ASSIGN_OR_RETURN(auto rd, t.ds->NewReader());
  Sample s;
  uint64_t k = 0;
  for (; k < limit; ++k) {
    auto more = rd->Next(&s);
    if (!more.ok()) return std::move(more).take_status().At(Location{.file = t.address});
    if (!*more) break;
  }
  return k;
}

std::vector<std::string> CollectFiles(const std::string& address, const DatasetInfo& info) {
  std::set<std::string> out;
  auto path = formats::SplitScheme(address).second;
  for (auto& f : io::LocalFilesUnder(path)) out.insert(std::move(f));
  for (const auto& s : info.shards)
    for (auto& f : io::LocalFilesUnder(s.path)) out.insert(std::move(f));
  return {out.begin(), out.end()};
}

struct Accum {
  std::vector<float> lat_us;
  uint64_t samples = 0, bytes = 0;
  double wall = 0, cpu = 0;
  double cache_kept_sum = 0;
  int cache_drops = 0;
};

enum class Mode { kView, kCopy, kSeq };
const char* ModeName(Mode m) { return m == Mode::kView ? "random-view" : m == Mode::kCopy ? "random-copy" : "sequential"; }

// The pass's readers: n of them at once, on a TBB arena of n slots (the bench's own thread
// and n - 1 of TBB's workers, which stay alive between slices, so that thread start-up --
// tens of microseconds, as long as hundreds of sub-microsecond views -- stays out of the
// figures). Run(job) calls job(t) once for each t in [0, n), each on a thread of its own:
// the n calls meet at a start gate, so that none starts reading while another is still
// waking up, and Run returns when every one has returned. The caller keeps a
// tbb::global_control that lets TBB have n threads (RunBench).
//
// Thread safety: Run() is called by one thread at a time (the bench's own).
class WorkerPool {
 public:
  explicit WorkerPool(int n) : n_(n), arena_(n, 1) {}
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return n_; }

  void Run(const std::function<void(int)>& job) {
    arena_.execute([&] {
      tbb::parallel_for(0, n_, 1, [&](int t) {
        StartGate();
        job(t);
      });
    });
  }

 private:
  // Waits until all n readers have arrived: a short spin (yielding, for more threads than
  // cores), not a futex, whose wake-up would skew the starts. TBB does not promise n
  // threads at once: after a second without them, the readers start as they come (the
  // slice is then slower, never stuck).
  void StartGate() {
    uint64_t g = gate_gen_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      gate_gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    const auto give_up = Clock::now() + std::chrono::seconds(1);
    for (int spins = 0; gate_gen_.load(std::memory_order_acquire) == g; ++spins) {
      if (spins <= 64) continue;
      std::this_thread::yield();
      if ((spins & 1023) == 0 && Clock::now() > give_up) {
        // Open the gate for this slice (once: whoever moves it first).
        if (gate_gen_.compare_exchange_strong(g, g + 1, std::memory_order_acq_rel)) arrived_.store(0, std::memory_order_relaxed);
        return;
      }
    }
  }

  const int n_;
  tbb::task_arena arena_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> gate_gen_{0};
};

// One timed slice [lo, hi) of a pass, split in contiguous parts over the pool's
// workers. make(t, a) builds worker t's reader (its buffers; untimed), whose
// calls read(k, &bytes) are timed one by one. The slice's wall time is the span
// from the first worker's start to the last one's end, taken inside the workers
// (the release and the join stay out); CPU time is the process's over the slice.
template <class MakeReader>
Status TimedSlice(WorkerPool& pool, size_t lo, size_t hi, const MakeReader& make, Accum* acc) {
  const size_t threads = size_t(pool.size());
  struct alignas(64) Slot {
    std::vector<float> lat;
    uint64_t bytes = 0;
    Clock::time_point t0, t1;
    Status err;
  };
  std::vector<Slot> slots(threads);
  double cpu0 = CpuSeconds();
  pool.Run([&](int t) {
    Slot& slot = slots[size_t(t)];
    const size_t n = hi - lo, a = lo + n * size_t(t) / threads, b = lo + n * size_t(t + 1) / threads;
    slot.lat.reserve(b - a);
    auto read = make(t, a);
    uint64_t bytes = 0;
    slot.t0 = Clock::now();
    for (size_t k = a; k < b; ++k) {
      uint64_t nb = 0;
      auto r0 = Clock::now();
      Status st = read(k, &nb);
      auto r1 = Clock::now();
      if (!st.ok()) {
        slot.err = std::move(st);
        break;
      }
      slot.lat.push_back(float(std::chrono::duration<double, std::micro>(r1 - r0).count()));
      bytes += nb;
    }
    slot.t1 = Clock::now();
    slot.bytes = bytes;
  });
  acc->cpu += CpuSeconds() - cpu0;
  std::optional<Clock::time_point> first, last;
  for (const auto& s : slots) {
    if (!s.err.ok()) return s.err;
    if (s.lat.empty()) continue;
    if (!first || s.t0 < *first) first = s.t0;
    if (!last || s.t1 > *last) last = s.t1;
  }
  if (first) acc->wall += std::chrono::duration<double>(*last - *first).count();
  for (auto& s : slots) {
    acc->lat_us.insert(acc->lat_us.end(), s.lat.begin(), s.lat.end());
    acc->bytes += s.bytes;
    acc->samples += s.lat.size();
  }
  return Status::OK();
}

// Reads order[lo, hi) through `ra` on the pool's workers (random-view; with
// copy, random-copy: every field copied into the worker's own buffer).
Status RandomPass(WorkerPool& pool, const RandomAccess& ra, const std::vector<uint64_t>& order, size_t lo, size_t hi,
                  bool copy, Accum* acc) {
  auto make = [&](int, size_t) {
    return [&ra, &order, copy, buf = std::vector<uint8_t>(), s = Sample()](size_t k, uint64_t* nb) mutable -> Status {
      Status st = ra.Get(order[k], &s);
      if (!st.ok()) return st.At(Location{.index = int64_t(order[k])});
      *nb = s.bytes();
      if (copy) {
        if (buf.size() < *nb) buf.resize(*nb);
        size_t off = 0;
        for (const auto& f : s.fields) {
          if (f.data.size()) std::memcpy(buf.data() + off, f.data.data(), f.data.size());
          off += f.data.size();
        }
      }
      return Status::OK();
    };
  };
  return TimedSlice(pool, lo, hi, make, acc);
}

// The memcpy floor: copies of the same sizes from a buffer larger than the
// caches, each worker walking it from its own starting point.
void FloorPass(WorkerPool& pool, const std::vector<uint64_t>& sizes, size_t lo, size_t hi,
               const std::vector<uint8_t>& src, Accum* acc) {
  auto make = [&](int t, size_t a) {
    uint64_t off = (uint64_t(t) * 7919 * 4096 + a * 104729) % src.size();
    return [&sizes, &src, off, dst = std::vector<uint8_t>(1 << 20)](size_t k, uint64_t* nb) mutable -> Status {
      *nb = std::min<uint64_t>(sizes[k], src.size());
      if (dst.size() < *nb) dst.resize(*nb);
      if (off + *nb > src.size()) off = 0;
      std::memcpy(dst.data(), src.data() + off, *nb);
      off = (off + *nb + 4096) % src.size();
      return Status::OK();
    };
  };
  Status st = TimedSlice(pool, lo, hi, make, acc);
  (void)st;  // a memcpy does not fail
}

Status SeqPass(Target& tg, uint64_t n, Accum* acc) {
  Sample s;
  double cpu0 = CpuSeconds();
  auto t0 = Clock::now();
  for (uint64_t k = 0; k < n; ++k) {
    auto r0 = Clock::now();
    if (!tg.seq) {
      SK_ASSIGN_OR_RETURN(tg.seq, tg.ds->NewReader());
    }
    SK_ASSIGN_OR_RETURN(bool more, tg.seq->Next(&s));
    if (!more) {  // wrap around
      tg.seq.reset();
      SK_ASSIGN_OR_RETURN(tg.seq, tg.ds->NewReader());
      SK_ASSIGN_OR_RETURN(more, tg.seq->Next(&s));
      if (!more) return Status::Invalid("dataset is empty", Location{.file = tg.address});
    }
    acc->lat_us.push_back(float(std::chrono::duration<double, std::micro>(Clock::now() - r0).count()));
    acc->bytes += s.bytes();
    acc->samples++;
  }
  acc->wall += std::chrono::duration<double>(Clock::now() - t0).count();
  acc->cpu += CpuSeconds() - cpu0;
  return Status::OK();
}

Status OpenTarget(Target& t, bool need_random, const OpenOptions& open) {
  t.seq.reset();
  t.ra.reset();
  t.ds.reset();
  SK_ASSIGN_OR_RETURN(t.ds, Open(t.address, open));
  t.format = t.ds->info().format;
  t.file_per_sample = t.ds->info().file_per_sample;
  if (need_random) {
    auto ra = t.ds->NewRandomAccess();
    if (!ra.ok()) {
      Status s = std::move(ra).take_status();
      return Status(s.code(), fmt::format("dataset '{}' ({}) has no random access, which random mode needs (measure it with "
                                "--mode sequential): {}",
                                t.address, t.format, s.message()),
                    s.where());
    }
    t.ra = std::move(ra).value();
  }
  return Status::OK();
}

BenchRow MakeRow(const std::string& ds, const std::string& fmt_, Mode m, int threads, Accum& a, bool cold) {
  BenchRow r;
  r.dataset = ds;
  r.format = fmt_;
  r.mode = ModeName(m);
  r.threads = threads;
  r.latency = ComputeLatency(a.lat_us);
  r.samples_per_s = a.wall > 0 ? double(a.samples) / a.wall : 0;
  r.mb_per_s = a.wall > 0 ? double(a.bytes) / 1e6 / a.wall : 0;
  r.cpu_us_per_sample = a.samples ? a.cpu * 1e6 / double(a.samples) : 0;
  r.cold = cold;
  r.cache_kept = a.cache_drops ? a.cache_kept_sum / a.cache_drops : 0;
  r.bytes = a.bytes;
  return r;
}

}  // namespace

std::vector<uint64_t> BenchOrder(uint64_t seed, uint64_t size, uint64_t n) {
  std::vector<uint64_t> out;
  if (size == 0) return out;
  out.reserve(n);
  uint64_t s = seed ^ 0x53484152444b4954ull;  // "SHARDKIT"
  std::vector<uint64_t> perm(size);
  while (out.size() < n) {
    for (uint64_t i = 0; i < size; ++i) perm[i] = i;
    for (uint64_t i = size - 1; i > 0; --i) std::swap(perm[i], perm[Below(s, i + 1)]);
    for (uint64_t i = 0; i < size && out.size() < n; ++i) out.push_back(perm[i]);
  }
  return out;
}

LatencyStats ComputeLatency(std::vector<float>& us) {
  LatencyStats r;
  r.count = us.size();
  if (us.empty()) return r;
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) {
    size_t idx = size_t(std::ceil(p * double(us.size())));
    idx = idx == 0 ? 0 : idx - 1;
    return double(us[std::min(idx, us.size() - 1)]);
  };
  r.p50 = pct(0.50);
  r.p90 = pct(0.90);
  r.p99 = pct(0.99);
  r.p999 = pct(0.999);
  r.max = double(us.back());
  double sum = 0;
  for (float v : us) sum += v;
  r.mean = sum / double(us.size());
  return r;
}

Result<BenchReport> RunBench(const std::vector<std::string>& addresses, const BenchOptions& opts,
                             const BenchProgress& progress) {
  if (addresses.empty()) return Status::Invalid("bench needs at least one dataset");
  if (!opts.random && !opts.sequential) return Status::Invalid("bench needs a mode: random, sequential or both");
  std::vector<int> threads = opts.threads;
  if (threads.empty()) threads = {1};
  for (int t : threads)
    if (t < 1 || t > 1024) return Status::Invalid(fmt::format("bad thread count {}", t));
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };

  std::vector<Target> targets(addresses.size());
  uint64_t min_size = UINT64_MAX;
  for (size_t i = 0; i < addresses.size(); ++i) {
    targets[i].address = addresses[i];
    SK_RETURN_IF_ERROR(OpenTarget(targets[i], opts.random, opts.open));
    targets[i].files = CollectFiles(addresses[i], targets[i].ds->info());
    uint64_t n = opts.random ? targets[i].ra->size() : targets[i].ds->info().num_samples.value_or(UINT64_MAX);
    if (n == UINT64_MAX && !opts.samples && opts.seconds <= 0) {
      // A stream of unknown length (pipe: shards): read it once to size the passes; this is its warm-up too.
      say(fmt::format("counting the samples of {}", addresses[i]));
      SK_ASSIGN_OR_RETURN(n, CountSamples(targets[i]));
      targets[i].warm = true;
    }
    if (n == 0) return Status::Invalid("dataset is empty", Location{.file = addresses[i]});
    min_size = std::min(min_size, n);
  }
  uint64_t n = opts.samples ? opts.samples : std::min<uint64_t>(min_size == UINT64_MAX ? 20000 : min_size, 20000);
  if (opts.seconds > 0 && !opts.samples) {
    // Calibrate: time a few reads of every dataset, then size a pass to take about `seconds`.
    say("calibrating");
    double per_sample = 0;
    for (auto& t : targets) {
      Sample s;
      uint64_t k = 0;
      auto c0 = Clock::now();
      if (t.ra) {
        auto probe = BenchOrder(opts.seed + 1, t.ra->size(), std::min<uint64_t>(t.ra->size(), 200));
        for (uint64_t i : probe) {
          SK_RETURN_IF_ERROR(t.ra->Get(i, &s));
          ++k;
        }
      } else {
        SK_ASSIGN_OR_RETURN(auto rd, t.ds->NewReader());
        for (; k < 200; ++k) {
          SK_ASSIGN_OR_RETURN(bool more, rd->Next(&s));
          if (!more) break;
        }
      }
      if (k) per_sample += std::chrono::duration<double>(Clock::now() - c0).count() / double(k);
    }
    n = per_sample > 0 ? uint64_t(std::clamp(opts.seconds / per_sample, 100.0, 1e8)) : 1000;
  }
  int slices = std::max(1, opts.slices);
  if (uint64_t(slices) > n) slices = int(n);
  // With several datasets of different sizes, index into the smallest so every
  // dataset reads the same sample positions.
  std::vector<uint64_t> order = BenchOrder(opts.seed, min_size == UINT64_MAX ? n : min_size, n);

  BenchReport report;
  // Warm-up: one untimed read of every sample the passes will touch.
  if (!opts.cold) {
    say("warm-up");
    for (auto& t : targets) {
      Sample s;
      if (t.ra) {
        std::vector<uint64_t> uniq(order.begin(), order.end());
        std::sort(uniq.begin(), uniq.end());
        uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
        volatile uint8_t sink = 0;
        for (uint64_t i : uniq) {
          SK_RETURN_IF_ERROR(t.ra->Get(i, &s).At(Location{.file = t.address, .index = int64_t(i)}));
          for (const auto& f : s.fields)
            for (size_t k = 0; k < f.data.size(); k += 4096) sink = sink + f.data.data()[k];
        }
      } else if (t.files.empty()) {
        // Nothing on disk to touch (a stream): read the samples the first slices will read.
        if (!t.warm) SK_RETURN_IF_ERROR(CountSamples(t, n).status());
      } else {
        io::ReadThrough(t.files);
      }
    }
  }

  // One worker pool per thread count, started when first needed and kept for the run; TBB
  // may have as many threads as the largest count asks (its default is the cores).
  std::unique_ptr<tbb::global_control> allow_threads;
  if (const int most = *std::max_element(threads.begin(), threads.end()); most > tbb::info::default_concurrency())
    allow_threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, size_t(most));
  std::map<int, std::unique_ptr<WorkerPool>> pools;
  auto pool = [&](int th) -> WorkerPool& {
    auto& p = pools[th];
    if (!p) p = std::make_unique<WorkerPool>(th);
    return *p;
  };
  auto slice_bounds = [&](int k) { return std::pair<size_t, size_t>(n * size_t(k) / size_t(slices), n * size_t(k + 1) / size_t(slices)); };
  std::vector<Mode> modes;
  if (opts.random) modes = {Mode::kView, Mode::kCopy};
  if (opts.sequential) modes.push_back(Mode::kSeq);

  for (Mode m : modes) {
    for (int th : threads) {
      if (m == Mode::kSeq && th != threads.front()) continue;  // a sequential reader is one thread
      int used_threads = m == Mode::kSeq ? 1 : th;
      say(fmt::format("{} with {} thread(s)", ModeName(m), used_threads));
      std::vector<Accum> acc(targets.size());
      for (int k = 0; k < slices; ++k) {
        auto [lo, hi] = slice_bounds(k);
        for (size_t i = 0; i < targets.size(); ++i) {
          auto& t = targets[i];
          if (opts.cold) {
            t.seq.reset();
            t.ra.reset();
            t.ds.reset();
            acc[i].cache_kept_sum += io::DropFromPageCache(t.files);
            acc[i].cache_drops++;
            SK_RETURN_IF_ERROR(OpenTarget(t, opts.random, opts.open));
          }
          if (m == Mode::kSeq) {
            SK_RETURN_IF_ERROR(SeqPass(t, hi - lo, &acc[i]).At(Location{.file = t.address}));
          } else {
            SK_RETURN_IF_ERROR(RandomPass(pool(used_threads), *t.ra, order, lo, hi, m == Mode::kCopy, &acc[i])
                                   .At(Location{.file = t.address}));
          }
        }
      }
      for (size_t i = 0; i < targets.size(); ++i) {
        std::vector<float> cdf = acc[i].lat_us;
        report.rows.push_back(MakeRow(targets[i].address, targets[i].format, m, used_threads, acc[i], opts.cold));
        report.rows.back().baseline = targets[i].file_per_sample;
        if (used_threads == 1) {
          std::sort(cdf.begin(), cdf.end());
          report.cdfs.emplace_back(report.rows.size() - 1, std::move(cdf));
        }
      }
    }
  }

  if (opts.floor && opts.random) {
    // Sample sizes of the order, from the first dataset.
    auto& t0 = targets.front();
    if (!t0.ra) SK_RETURN_IF_ERROR(OpenTarget(t0, true, opts.open));
    std::vector<uint64_t> sizes(order.size());
    uint64_t total = 0, max_size = 0;
    std::map<uint64_t, uint64_t> size_of;
    Sample s;
    for (size_t k = 0; k < order.size(); ++k) {
      auto it = size_of.find(order[k]);
      if (it == size_of.end()) {
        SK_RETURN_IF_ERROR(t0.ra->Get(order[k], &s));
        it = size_of.emplace(order[k], s.bytes()).first;
        total += s.bytes();
      }
      sizes[k] = it->second;
      max_size = std::max(max_size, it->second);
    }
    // Floor 1: memcpy of the same sizes from a buffer as large as the data read (>= 256 MiB, <= 2 GiB).
    uint64_t src_size = std::clamp<uint64_t>(total, 256ull << 20, 2ull << 30);
    src_size = std::max(src_size, max_size + 8192);
    std::vector<uint8_t> src(src_size);
    for (size_t i = 0; i < src.size(); i += 64) src[i] = uint8_t(i * 131);
    for (int th : threads) {
      say(fmt::format("memcpy floor with {} thread(s)", th));
      Accum a;
      for (int k = 0; k < slices; ++k) {
        auto [lo, hi] = slice_bounds(k);
        FloorPass(pool(th), sizes, lo, hi, src, &a);
      }
      std::vector<float> cdf = a.lat_us;
      report.rows.push_back(MakeRow("floor:memcpy", "memcpy", Mode::kCopy, th, a, false));
      if (th == 1) {
        std::sort(cdf.begin(), cdf.end());
        report.cdfs.emplace_back(report.rows.size() - 1, std::move(cdf));
      }
    }
    src.clear();
    src.shrink_to_fit();
    // Floor 2: the first dataset held in memory (owned copies), through the same interface.
    if (total <= (4ull << 30)) {
      std::vector<Sample> mem(t0.ra->size());
      for (const auto& [idx, sz] : size_of) {
        (void)sz;
        SK_RETURN_IF_ERROR(t0.ra->Get(idx, &s));
        Sample& d = mem[idx];
        d.key = s.key;
        for (const auto& f : s.fields) d.fields.push_back(Field{f.ext, Bytes::Copy(f.data.data(), f.data.size())});
      }
      MemoryAccess ma(std::move(mem));
      std::string name = "memory:" + t0.address;
      // Warm-up, as for the datasets: one untimed read of every sample, through the
      // workers (the copies were just made by this thread, after the floor's memcpy
      // had flushed the caches; without it the first timed pass pays for that).
      {
        Accum warm;
        SK_RETURN_IF_ERROR(RandomPass(pool(threads.front()), ma, order, 0, order.size(), false, &warm));
      }
      for (Mode m : {Mode::kView, Mode::kCopy}) {
        for (int th : threads) {
          Accum a;
          for (int k = 0; k < slices; ++k) {
            auto [lo, hi] = slice_bounds(k);
            SK_RETURN_IF_ERROR(RandomPass(pool(th), ma, order, lo, hi, m == Mode::kCopy, &a));
          }
          std::vector<float> cdf = a.lat_us;
          report.rows.push_back(MakeRow(name, "memory", m, th, a, false));
          if (th == 1 && m == Mode::kCopy) {
            std::sort(cdf.begin(), cdf.end());
            report.cdfs.emplace_back(report.rows.size() - 1, std::move(cdf));
          }
        }
      }
    } else {
      report.notes.push_back("the in-memory floor was skipped: the samples read exceed 4 GiB");
    }
  }
  if (opts.cold) {
    for (const auto& r : report.rows)
      if (r.cold && r.cache_kept > 0.05)
        report.notes.push_back(fmt::format("{}: the kernel kept {:.0f}% of the file pages after POSIX_FADV_DONTNEED",
                                           r.dataset, r.cache_kept * 100));
    report.notes.push_back("cold: page cache dropped with posix_fadvise(DONTNEED) before each slice of each pass");
  } else {
    report.notes.push_back("warm: every sample read once before the measured passes");
  }
  std::sort(report.notes.begin(), report.notes.end());
  report.notes.erase(std::unique(report.notes.begin(), report.notes.end()), report.notes.end());
  return report;
}

namespace {
// p50 of the matching baseline row (the first dataset of one file per sample, same
// mode and threads).
const BenchRow* Baseline(const BenchReport& r, const BenchRow& row) {
  for (const auto& b : r.rows)
    if (b.baseline && b.mode == row.mode && b.threads == row.threads) return &b;
  return nullptr;
}
const BenchRow* Floor(const BenchReport& r, int threads) {
  for (const auto& b : r.rows)
    if (b.format == "memcpy" && b.threads == threads) return &b;
  return nullptr;
}
}  // namespace

Result<LoaderBenchResult> RunLoaderBench(const std::string& address, const LoaderBenchOptions& opts) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Open(address, opts.open));
  LoaderOptions lo = opts.loader;
  lo.open = opts.open;  // streamed mode opens each shard with them too
  SK_ASSIGN_OR_RETURN(auto loader, Loader::Create(std::move(ds), lo));
  LoaderBenchResult r;
  r.dataset = address;
  r.threads = opts.loader.threads > 0 ? opts.loader.threads : core::UsableCores();
  r.batch_size = opts.loader.batch_size;
  r.step_ms = opts.step_ms;
  uint64_t want = opts.batches ? opts.batches : std::min<uint64_t>(loader->num_batches(), 200);
  auto busy = [&](double ms) {
    auto until = Clock::now() + std::chrono::duration<double, std::milli>(ms);
    while (Clock::now() < until) {
    }
  };
  // One untimed batch: the pipeline fills up and the page cache warms as in training.
  {
    SK_ASSIGN_OR_RETURN(Batch b, loader->Next());
    if (b.end_of_epoch()) return Status::Invalid("the dataset yields no batch", Location{.file = address});
  }
  std::vector<float> waits;
  double waited = 0;
  uint64_t epoch = 0;
  auto t0 = Clock::now();
  while (r.batches < want) {
    auto w0 = Clock::now();
    SK_ASSIGN_OR_RETURN(Batch b, loader->Next());
    if (b.end_of_epoch()) {
      loader->set_epoch(++epoch);
      continue;
    }
    double w = std::chrono::duration<double, std::milli>(Clock::now() - w0).count();
    waits.push_back(float(w));
    waited += w;
    r.images += b.size();
    r.batches++;
    if (opts.step_ms > 0) busy(opts.step_ms);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.batches_per_s = r.seconds > 0 ? double(r.batches) / r.seconds : 0;
  r.images_per_s = r.seconds > 0 ? double(r.images) / r.seconds : 0;
  r.wait_ms = ComputeLatency(waits);
  r.stall_share = r.seconds > 0 ? waited / 1e3 / r.seconds : 0;
  return r;
}

std::string LoaderBenchTable(const std::vector<LoaderBenchResult>& rs) {
  std::string out = fmt::format("{:<40} {:>4} {:>6} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}\n", "dataset", "thr",
                                "batch", "step ms", "batches/s", "images/s", "wait p50", "wait p99", "wait max",
                                "stall");
  bool unmeasured = false;
  for (const auto& r : rs) {
    std::string name = r.dataset.size() > 40 ? "..." + r.dataset.substr(r.dataset.size() - 37) : r.dataset;
    // Without a model step the consumer only waits: "stall" would read ~100% and mean nothing.
    std::string stall = r.step_ms > 0 ? fmt::format("{:.1f}%", r.stall_share * 100) : "-";
    unmeasured = unmeasured || r.step_ms <= 0;
    out += fmt::format("{:<40} {:>4} {:>6} {:>8.1f} {:>10.2f} {:>10.0f} {:>9.2f} {:>9.2f} {:>9.2f} {:>8}\n", name,
                       r.threads, r.batch_size, r.step_ms, r.batches_per_s, r.images_per_s, r.wait_ms.p50,
                       r.wait_ms.p99, r.wait_ms.max, stall);
  }
  out += "images/s: the feed rate with nothing else to do; wait: the consumer's time in Next() per batch (ms); "
         "stall: waiting / wall time, the share of a training step lost to input\n";
  if (unmeasured)
    out += "stall is measured only with a model step: pass --step-ms MS, the model's time per batch on its GPU "
           "(e.g. 50), and the consumer works that long between batches\n";
  return out;
}

std::string LoaderBenchJson(const std::vector<LoaderBenchResult>& rs) {
  nlohmann::json j;
  j["schema"] = "shardkit-bench-loader-v1";
  j["rows"] = nlohmann::json::array();
  for (const auto& r : rs)
    j["rows"].push_back({{"dataset", r.dataset},
                         {"threads", r.threads},
                         {"batch_size", r.batch_size},
                         {"step_ms", r.step_ms},
                         {"batches", r.batches},
                         {"images", r.images},
                         {"seconds", r.seconds},
                         {"batches_per_s", r.batches_per_s},
                         {"images_per_s", r.images_per_s},
                         {"wait_ms", {{"p50", r.wait_ms.p50}, {"p90", r.wait_ms.p90}, {"p99", r.wait_ms.p99},
                                      {"max", r.wait_ms.max}, {"mean", r.wait_ms.mean}}},
                         {"stall_share", r.step_ms > 0 ? nlohmann::json(r.stall_share) : nlohmann::json()}});
  return j.dump(2) + "\n";
}

std::string BenchTable(const BenchReport& r) {
  std::string out = fmt::format("{:<40} {:<11} {:>3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>8} {:>9} {:>9}\n",
                                "dataset", "mode", "thr", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us",
                                "samples/s", "MB/s", "cpu us", "vs folder", "vs floor");
  bool views = false;
  for (const auto& row : r.rows) {
    std::string name = row.dataset.size() > 40 ? "..." + row.dataset.substr(row.dataset.size() - 37) : row.dataset;
    // A zero-copy view moves no bytes: a "MB/s" of it would be the mapped bytes over the
    // time to hand out pointers, a figure no disk or network reaches.
    const bool view = row.mode == "random-view";
    views = views || view;
    std::string mbs = view ? std::string("view") : fmt::format("{:.1f}", row.mb_per_s);
    const BenchRow* b = Baseline(r, row);
    const BenchRow* f = row.mode == "random-copy" ? Floor(r, row.threads) : nullptr;
    std::string vs_b = b && row.latency.p50 > 0 && b != &row ? fmt::format("{:.1f}x", b->latency.p50 / row.latency.p50) : "";
    std::string vs_f = f && f->latency.p50 > 0 && f != &row ? fmt::format("{:.2f}x", row.latency.p50 / f->latency.p50) : "";
    out += fmt::format("{:<40} {:<11} {:>3} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.1f} {:>10.0f} {:>9} {:>8.2f} {:>9} {:>9}\n",
                       name, row.mode, row.threads, row.latency.p50, row.latency.p90, row.latency.p99,
                       row.latency.p999, row.latency.max, row.samples_per_s, mbs, row.cpu_us_per_sample,
                       vs_b, vs_f);
  }
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  if (views)
    out += "MB/s \"view\": random-view hands out pointers into mapped or cached data and copies no bytes; "
           "compare views in samples/s, and bytes moved in the random-copy rows\n";
  out += "vs folder: the folder's p50 / this p50 (higher is better); vs floor: this copy p50 / memcpy p50 of the same sizes\n";
  return out;
}

std::string BenchJson(const BenchReport& r) {
  nlohmann::json j;
  j["schema"] = "shardkit-bench-v1";
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"dataset", row.dataset},
                         {"format", row.format},
                         {"mode", row.mode},
                         {"threads", row.threads},
                         {"cold", row.cold},
                         {"cache_kept", row.cache_kept},
                         {"samples", row.latency.count},
                         {"bytes", row.bytes},
                         {"latency_us",
                          {{"p50", row.latency.p50},
                           {"p90", row.latency.p90},
                           {"p99", row.latency.p99},
                           {"p99.9", row.latency.p999},
                           {"max", row.latency.max},
                           {"mean", row.latency.mean}}},
                         {"samples_per_s", row.samples_per_s},
                         {"mb_per_s", row.mb_per_s},
                         {"zero_copy", row.mode == "random-view"},
                         {"cpu_us_per_sample", row.cpu_us_per_sample}});
  }
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

namespace {
std::string XmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') o += '?';
        else o += c;
    }
  }
  return o;
}
const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// "0", "950/s", "12.5k/s", "10.97M/s".
std::string HumanRate(double v) {
  if (v >= 1e6) return fmt::format("{:g}M/s", std::round(v / 1e4) / 100);
  if (v >= 1e3) return fmt::format("{:g}k/s", std::round(v / 10) / 100);
  if (v == 0) return "0";
  return fmt::format("{:g}/s", std::round(v * 100) / 100);
}

// Microseconds as "10 us", "1 ms", "2.5 s".
std::string HumanMicros(double us) {
  if (us >= 1e6) return fmt::format("{:g} s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:g} ms", us / 1e3);
  return fmt::format("{:g} us", us);
}

// Dash pattern of a mode's lines (the colour is the dataset's).
const char* ModeDash(const std::string& mode) {
  if (mode == "random-copy") return "7,4";
  if (mode == "sequential") return "2,3";
  return "";  // random-view (and anything else): solid
}

std::string DashAttr(const std::string& mode) {
  const char* d = ModeDash(mode);
  return *d ? fmt::format(" stroke-dasharray=\"{}\"", d) : std::string();
}

}  // namespace

// Two panels side by side (latency CDF of the single-thread passes; throughput versus
// threads), one colour per dataset in both (in the report's row order), one dash pattern
// per mode, and the legend below the panels, outside the plot areas.
std::string BenchSvg(const BenchReport& r) {
  // Datasets and modes in the order of the report's rows (the table's order).
  std::vector<std::string> datasets, modes, formats;
  std::vector<int> th;
  uint64_t n_lo = UINT64_MAX, n_hi = 0;
  bool cold = false;
  for (const auto& row : r.rows) {
    if (std::find(datasets.begin(), datasets.end(), row.dataset) == datasets.end()) {
      datasets.push_back(row.dataset);
      formats.push_back(row.format);
    }
    if (std::find(modes.begin(), modes.end(), row.mode) == modes.end()) modes.push_back(row.mode);
    if (std::find(th.begin(), th.end(), row.threads) == th.end()) th.push_back(row.threads);
    if (row.latency.count) n_lo = std::min(n_lo, row.latency.count), n_hi = std::max(n_hi, row.latency.count);
    cold = cold || row.cold;
  }
  std::sort(th.begin(), th.end());
  auto color = [&](const std::string& ds) {
    size_t i = size_t(std::find(datasets.begin(), datasets.end(), ds) - datasets.begin());
    return kColors[i % 10];
  };
  auto join = [](const std::vector<std::string>& v) {
    std::string o;
    for (const auto& x : v) o += (o.empty() ? "" : ", ") + x;
    return o;
  };
  std::vector<std::string> ths;
  for (int t : th) ths.push_back(std::to_string(t));

  const int pw = 460, ph = 300, ox1 = 80, ox2 = 630, oy = 90;
  const int W = ox2 + pw + 30;
  // The legend flows left to right below the panels, in the rows' order, wrapping at the
  // right edge (text width estimated at 7 px a character).
  std::vector<std::string> labels;
  std::vector<std::pair<int, int>> at;  // x, row
  for (size_t i = 0, x = ox1, row = 0; i < datasets.size(); ++i) {
    std::string label = datasets[i];
    if (label.size() > 70) label = "..." + label.substr(label.size() - 67);
    size_t w = 32 + 7 * (label.size() + formats[i].size() + 3) + 24;
    if (x > size_t(ox1) && x + w > size_t(W - 20)) x = ox1, ++row;
    labels.push_back(label);
    at.emplace_back(int(x), int(row));
    x += w;
  }
  const int legend_y = oy + ph + 62, legend_rows = at.empty() ? 0 : at.back().second + 1;
  const int H = legend_y + 20 * legend_rows + 34;
  std::string s = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, W, H);
  // Title: what ran.
  std::string samples = n_hi == 0 ? std::string("no samples")
                        : n_lo == n_hi ? fmt::format("{} samples per pass", n_hi)
                                       : fmt::format("{}-{} samples per pass", n_lo, n_hi);
  s += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"17\" font-weight=\"bold\">shardkit bench: {}</text>\n",
                   ox1, XmlEscape(join(modes)));
  s += fmt::format("<text x=\"{}\" y=\"48\" fill=\"#444\">threads {}; {}; {} page cache; {} dataset{}</text>\n",
                   ox1, XmlEscape(join(ths)), samples, cold ? "cold" : "warm", datasets.size(),
                   datasets.size() == 1 ? "" : "s");

  // Panel 1: latency CDF of the single-thread passes, log10 time axis.
  double lo = 1e30, hi = 0;
  for (const auto& [row, v] : r.cdfs)
    if (!v.empty()) lo = std::min(lo, double(std::max(v.front(), 0.01f))), hi = std::max(hi, double(v.back()));
  if (hi <= 0) lo = 0.1, hi = 1000;
  double l0 = std::floor(std::log10(lo)), l1 = std::ceil(std::log10(std::max(hi, lo * 10)));
  auto xl = [&](double us) { return ox1 + (std::log10(std::max(us, lo)) - l0) / (l1 - l0) * pw; };
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">Read latency, 1 thread (CDF)</text>\n", ox1, oy - 12);
  for (double d = l0; d <= l1; d += 1) {
    double x = ox1 + (d - l0) / (l1 - l0) * pw;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/>\n", x, oy, x, oy + ph);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x, oy + ph + 16,
                     HumanMicros(std::pow(10.0, d)));
  }
  for (int q = 0; q <= 4; ++q) {
    double y = oy + ph - q * ph / 4.0;
    if (q > 0 && q < 4)
      s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", ox1, y, ox1 + pw, y);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}%</text>\n", ox1 - 6, y + 4, q * 25);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time per sample (log scale)</text>\n",
                   ox1 + pw / 2, oy + ph + 34);
  s += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">reads done within</text>\n",
                   ox1 - 48, oy + ph / 2);
  // Series in row order: r.cdfs follows the rows.
  for (const auto& [row, v] : r.cdfs) {
    if (v.empty()) continue;
    const auto& br = r.rows[row];
    std::string pts;
    size_t step = std::max<size_t>(1, v.size() / 300);
    for (size_t i = 0; i < v.size(); i += step)
      pts += fmt::format("{:.1f},{:.1f} ", xl(double(v[i])), oy + ph - double(i + 1) / double(v.size()) * ph);
    pts += fmt::format("{:.1f},{:.1f}", xl(double(v.back())), double(oy));
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{} points=\"{}\">"
                     "<title>{} ({})</title></polyline>\n",
                     color(br.dataset), DashAttr(br.mode), pts, XmlEscape(br.dataset), XmlEscape(br.mode));
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", ox1, oy, pw, ph);

  // Panel 2: throughput versus threads, one line per dataset and mode, on a log10 rate
  // axis: the rows span from a remote reader's hundreds of samples/s to a view's
  // millions, and a linear axis squeezes all but the fastest against zero.
  double minr = 1e300, maxr = 0;
  std::vector<std::pair<const BenchRow*, std::vector<std::pair<int, double>>>> series;  // first row, points
  for (const auto& row : r.rows) {
    auto it = std::find_if(series.begin(), series.end(), [&](const auto& x) {
      return x.first->dataset == row.dataset && x.first->mode == row.mode;
    });
    if (it == series.end()) it = series.insert(series.end(), {&row, {}});
    it->second.emplace_back(row.threads, row.samples_per_s);
    maxr = std::max(maxr, row.samples_per_s);
    if (row.samples_per_s > 0) minr = std::min(minr, row.samples_per_s);
  }
  if (maxr <= 0) minr = 1, maxr = 10;
  const double d0 = std::floor(std::log10(minr)), d1 = std::max(d0 + 1, std::ceil(std::log10(maxr)));
  auto xt = [&](int t) {
    size_t i = size_t(std::find(th.begin(), th.end(), t) - th.begin());
    return th.size() == 1 ? ox2 + pw / 2.0 : ox2 + 20 + double(i) / double(th.size() - 1) * (pw - 40);
  };
  // A rate of 0 (a pass that read nothing) sits on the bottom edge.
  auto yr = [&](double v) {
    double l = v > 0 ? std::log10(v) : d0;
    return oy + ph - (std::max(l, d0) - d0) / (d1 - d0) * ph;
  };
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">Throughput versus threads</text>\n", ox2, oy - 12);
  for (int t : th) {
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eee\"/>\n", xt(t), oy, xt(t), oy + ph);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", xt(t), oy + ph + 16, t);
  }
  for (double d = d0; d <= d1; d += 1) {
    double v = std::pow(10.0, d), y = yr(v);
    if (d > d0) s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", ox2, y, ox2 + pw, y);
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", ox2 - 6, y + 4, HumanRate(v));
    for (int m : {2, 5})  // unlabelled minor lines at 2x and 5x of each decade
      if (d < d1)
        s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#f2f2f2\"/>\n", ox2,
                         yr(m * v), ox2 + pw, yr(m * v));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">threads (worker threads reading)</text>\n",
                   ox2 + pw / 2, oy + ph + 34);
  s += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">samples per second "
                   "(log scale)</text>\n",
                   ox2 - 60, oy + ph / 2);
  for (auto& [first, pts] : series) {
    std::sort(pts.begin(), pts.end());
    std::string p;
    for (auto [t, v] : pts) p += fmt::format("{:.1f},{:.1f} ", xt(t), yr(v));
    const char* c = color(first->dataset);
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{} points=\"{}\">"
                     "<title>{} ({})</title></polyline>\n",
                     c, DashAttr(first->mode), p, XmlEscape(first->dataset), XmlEscape(first->mode));
    for (auto [t, v] : pts)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\">"
                       "<title>{}: {} threads, {}</title></circle>\n",
                       xt(t), yr(v), c, XmlEscape(first->dataset + " (" + first->mode + ")"), t, HumanRate(v));
  }
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", ox2, oy, pw, ph);

  // Legend, below both panels: one colour per dataset, one dash pattern per mode.
  for (size_t i = 0; i < datasets.size(); ++i) {
    int x = at[i].first, y = legend_y + 20 * at[i].second;
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"4\"/>\n", x, y - 4,
                     x + 24, y - 4, color(datasets[i]));
    s += fmt::format("<text x=\"{}\" y=\"{}\">{} <tspan fill=\"#666\">({})</tspan></text>\n", x + 32, y,
                     XmlEscape(labels[i]), XmlEscape(formats[i]));
  }
  int x = ox1, y = legend_y + 20 * legend_rows + 8;
  s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#444\">modes:</text>\n", x, y);
  x += 52;
  for (const auto& m : modes) {
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\" stroke-width=\"1.8\"{}/>\n", x, y - 4,
                     x + 34, y - 4, DashAttr(m));
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x + 40, y, XmlEscape(m));
    x += 56 + 7 * int(m.size());
  }
  s += "</svg>\n";
  return s;
}

}  // namespace shardkit
