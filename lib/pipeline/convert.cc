// Convert and Shard: source dataset -> samples -> destination writer.
//
// The copy runs in windows of `window` samples, and at most two windows are in memory: from
// the first sample being written on. With threads > 1 and a source with random access,
// `threads` workers read (and transform) samples by index continuously within that bound, so
// a slow image holds up no other worker; with threads > 1 and a source read in order, the
// next window is read while the current one is written.
#include "shardkit/convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <future>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "core/cores.h"
#include "io/any_file.h"
#include "io/file.h"
#include "core/paths.h"
#include "decode/encode.h"
#include "decode/transform.h"
#include "pipeline/select.h"
#include "formats/channel_order.h"
#include "formats/leave_out.h"
#include "formats/registry.h"
#include "core/redact.h"
#include "io/upload_staging.h"
#include "pipeline/plan.h"

namespace shardkit {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The registry name an output address resolves to (scheme, else the best write bid).
std::string OutputFormat(std::string_view address) {
  auto [scheme, rest] = formats::SplitScheme(address);
  if (!scheme.empty()) return scheme;
  std::string best;
  int best_bid = 0;
  for (const auto& f : formats::All()) {
    int b = f.bid_write(rest);
    if (b > best_bid) best_bid = b, best = f.name;
  }
  return best;
}

// The --shuffle write order: a keyed bijection of [0, n), evaluated per position.
pipeline::Bijection ShuffleOrder(uint64_t n, uint64_t seed) {
  return pipeline::Bijection(n, seed, pipeline::Mix64(0x53687566666c65ull /* "Shuffle" */));
}

// Reads the source window by window: all of it, or positions [begin, end) of the
// write order (a part; needs random access), the order being `order` when given.
class Fetcher {
 public:
  Fetcher(const ConvertOptions& opts, uint64_t begin = 0, uint64_t end = UINT64_MAX,
          const pipeline::Bijection* order = nullptr)
      : opts_(opts), window_(std::max<size_t>(1, opts.window)), begin_(begin), end_(end), order_(order) {}
  Fetcher(const Fetcher&) = delete;
  Fetcher& operator=(const Fetcher&) = delete;
  ~Fetcher() {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Status Init(const Dataset& src) {
    total_ = src.info().num_samples;
    const bool ranged = begin_ != 0 || end_ != UINT64_MAX;
    if (opts_.shuffle || opts_.threads > 1 || ranged) {
      auto r = src.NewRandomAccess();
      if (r.ok()) {
        ra_ = std::move(r).value();
        total_ = ra_->size();
      } else if (opts_.shuffle) {
        Status st = r.status();
        return Status(st.code() == Code::kUnsupported ? Code::kUnsupported : st.code(),
                      fmt::format("--shuffle needs random access by index, which the {} dataset "
                                  "'{}' does not offer ({}); convert it to a format with random "
                                  "access first, or drop --shuffle",
                                  src.info().format, src.info().address, st.message()),
                      st.where());
      }
    }
    if (!ra_ && ranged) return Status::Unsupported("a part of a conversion reads its slice by index: the source needs random access");
    if (!ra_) {
      auto r = src.NewReader();
      if (!r.ok()) return std::move(r).take_status();
      reader_ = std::move(r).value();
    }
    if (opts_.shuffle && !order_) {
      perm_.emplace(ShuffleOrder(ra_->size(), opts_.seed));
      order_ = &*perm_;
    }
    if (opts_.verify_source && src.info().sample_checksums == SampleChecksums::kList) {
      // The source's recorded checksums, when it has one for every sample (a source
      // with some missing is verify's finding, not checked here).
      auto sums = src.RecordedChecksums();
      if (!sums.ok() && sums.status().code() == Code::kCorrupt) return std::move(sums).take_status();
      const uint64_t n = ra_ ? ra_->size() : total_.value_or(0);
      if (sums.ok() && !sums->empty() && sums->size() == n) recorded_ = std::move(*sums);
    }
    if (ra_) {
      end_ = std::min<uint64_t>(end_, ra_->size());
      begin_ = std::min(begin_, end_);
      next_ = begin_;
      total_ = end_ - begin_;
      if (begin_ == end_) eof_ = true;
    }
    return Status::OK();
  }

  std::optional<uint64_t> total() const { return total_; }
  bool eof() const { return eof_; }
  // Next() is served by workers that read ahead on their own (threads > 1, random access):
  // the caller needs no thread of its own to overlap reading and writing.
  bool streams() const { return ra_ && opts_.threads > 1; }
  // Samples checked against the source's recorded checksums so far.
  uint64_t checked() const { return checked_.load(std::memory_order_relaxed); }
  // Decoded arrays are encoded as images while read (on the reading threads).
  void SetEncode(const decode::EncodeSpec& spec) { encode_ = spec; }
  // Image fields are transformed while read (decode/transform.h), on the reading threads;
  // with `skip_bad` a sample whose image does not decode is marked (Skipped()) instead of
  // failing the read.
  void SetTransform(const decode::TransformSpec& spec, bool skip_bad) {
    transform_ = spec;
    skip_bad_ = skip_bad;
  }
  // A sample that --skip-bad leaves out: why, or nullptr for one to write.
  static const Field* Skipped(const Sample& s) { return s.find(kSkippedField); }
  // Colour arrays are refused with `message` (formats::RefuseColourArrays): the source
  // records no channel order and the output needs one.
  void SetColourRefusal(std::string message) { refuse_colour_ = std::move(message); }

  // Fills `batch` with the next window (empty at the end); with `hashes`, each sample's
  // image hash as read, before any transform (--dedup in one pass), on the reading threads.
  Status Next(std::vector<Sample>* batch, std::vector<std::optional<pipeline::ImageHash>>* hashes = nullptr) {
    batch->clear();
    if (hashes) hashes->clear();
    if (eof_) return Status::OK();
    if (streams()) return NextStreamed(batch, hashes);
    if (ra_) {
      const uint64_t end = std::min<uint64_t>(end_, next_ + window_);
      batch->resize(end - next_);
      if (hashes) hashes->resize(end - next_);
      for (size_t j = 0; next_ < end; ++j, ++next_) {
        Status st = Get(next_, &(*batch)[j], hashes ? &(*hashes)[j] : nullptr);
        if (!st.ok()) return st;
      }
      if (end >= end_) eof_ = true;
      return Status::OK();
    }
    while (batch->size() < window_) {
      Sample s;
      auto more = reader_->Next(&s);
      if (!more.ok()) {
        Status st = std::move(more).take_status();
        st.At(Location{.index = int64_t(next_)});
        return st;
      }
      if (!*more) {
        eof_ = true;
        break;
      }
      if (Status st = CheckRecorded(s, next_); !st.ok()) return st;
      if (hashes) hashes->push_back(pipeline::Deduplicator::Hash(s));
      if (Status st = PrepareArrays(&s); !st.ok()) {
        st.At(Location{.index = int64_t(next_)});
        return st;
      }
      batch->push_back(std::move(s));
      ++next_;
    }
    return Status::OK();
  }

 private:
  // The field that marks a sample --skip-bad leaves out (its only field; the data is the
  // reason). No real field has this name: extensions are lowercase text.
  static constexpr std::string_view kSkippedField = "\x01skipped";

  // Reads write position `pos` (source index: order_(pos)) into `s`, checked and
  // transformed, with its image hash when `h` is given. Thread-safe.
  Status Get(uint64_t pos, Sample* s, std::optional<pipeline::ImageHash>* h) {
    const uint64_t idx = order_ ? (*order_)(pos) : pos;
    Status st = ra_->Get(idx, s);
    if (st.ok()) st = CheckRecorded(*s, idx);
    if (st.ok() && h) *h = pipeline::Deduplicator::Hash(*s);
    if (st.ok()) st = PrepareArrays(s);
    if (!st.ok()) st.At(Location{.index = int64_t(idx)});
    return st;
  }

  // Next() by the workers (streams()): the window [next_, next_ + window_) in order, each
  // sample as soon as a worker has it. The previous window, which the caller has written,
  // is released first: the workers may read up to two windows from this one's start.
  Status NextStreamed(std::vector<Sample>* batch, std::vector<std::optional<pipeline::ImageHash>>* hashes) {
    const uint64_t end = std::min<uint64_t>(end_, next_ + window_);
    std::unique_lock lk(mu_);
    if (workers_.empty()) {  // the first call starts them
      hashing_ = hashes != nullptr;
      ring_.resize(2 * window_);
      claim_ = next_;
      const int n = int(std::min<uint64_t>(uint64_t(opts_.threads), end_ - next_));
      for (int t = 0; t < n; ++t) workers_.emplace_back([this] { Work(); });
    }
    released_ = next_;
    work_cv_.notify_all();
    for (; next_ < end; ++next_) {
      Slot& slot = ring_[next_ % ring_.size()];
      done_cv_.wait(lk, [&] { return slot.done; });
      slot.done = false;
      if (!slot.status.ok()) {
        eof_ = true;  // nothing more is served after an error
        return std::move(slot.status);
      }
      batch->push_back(std::move(slot.sample));
      if (hashes) hashes->push_back(slot.hash);
    }
    if (end >= end_) eof_ = true;
    return Status::OK();
  }

  // A worker: takes the next write position while it lies within two windows of the first
  // one the caller still holds, reads it into its slot, and so on to the end.
  void Work() {
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return quit_ || claim_ >= end_ || claim_ < released_ + ring_.size(); });
      if (quit_ || claim_ >= end_) return;
      const uint64_t pos = claim_++;
      Slot& slot = ring_[pos % ring_.size()];
      lk.unlock();
      slot.sample = Sample{};
      slot.hash.reset();
      Status st = Get(pos, &slot.sample, hashing_ ? &slot.hash : nullptr);
      lk.lock();
      slot.status = std::move(st);
      slot.done = true;
      done_cv_.notify_one();  // (only the caller waits on it)
    }
  }

  Status PrepareArrays(Sample* s) const {
    if (!refuse_colour_.empty()) SK_RETURN_IF_ERROR(formats::RefuseColourArrays(*s, refuse_colour_));
    if (transform_) {
      Status st = decode::TransformSampleImages(s, *transform_);
      if (!st.ok() && skip_bad_ && (st.code() == Code::kCorrupt || st.code() == Code::kUnsupported)) {
        s->fields.clear();
        s->set(std::string(kSkippedField), Bytes::Take(st.message()));
        return Status::OK();
      }
      SK_RETURN_IF_ERROR(st);
    }
    if (encode_) return decode::EncodeSampleArrays(s, *encode_);
    return Status::OK();
  }

  // The sample at source index `idx` against the checksum the source records for it.
  Status CheckRecorded(const Sample& s, uint64_t idx) {
    if (idx >= recorded_.size()) return Status::OK();
    checked_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t got = s.checksum();
    if (got == recorded_[idx]) return Status::OK();
    Status st = Status::Corrupt(
        fmt::format("sample '{}' does not match the checksum its source records (xxh3 {:016x}, read {:016x}): the "
                    "source is damaged and its bytes are not written under fresh checksums. `shardkit verify` "
                    "names every damaged sample; --no-verify-source converts the data as it is",
                    s.key, recorded_[idx], got),
        Location{.key = s.key, .index = int64_t(idx)});
    return st.With(Detail::kSampleChecksum);
  }

  const ConvertOptions& opts_;
  const size_t window_;
  std::vector<uint64_t> recorded_;  // the source's checksums, one per sample (empty: none checked)
  std::atomic<uint64_t> checked_{0};
  std::optional<uint64_t> total_;
  std::shared_ptr<RandomAccess> ra_;
  std::unique_ptr<SampleReader> reader_;
  std::optional<pipeline::Bijection> perm_;
  uint64_t begin_, end_;
  const pipeline::Bijection* order_;
  std::optional<decode::EncodeSpec> encode_;  // ConvertOptions::encode
  std::optional<decode::TransformSpec> transform_;  // ConvertOptions::resize, ::encode
  bool skip_bad_ = false;                           // ConvertOptions::skip_bad
  std::string refuse_colour_;                 // SetColourRefusal
  uint64_t next_ = 0;
  bool eof_ = false;
  // streams(): a ring of 2 * window_ slots, position p in slot p % size.
  struct Slot {
    Sample sample;
    std::optional<pipeline::ImageHash> hash;
    Status status;
    bool done = false;  // read, not yet taken by Next()
  };
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Slot> ring_;
  std::vector<std::thread> workers_;
  uint64_t claim_ = 0;     // the next position a worker takes
  uint64_t released_ = 0;  // positions before it are taken and written: their slots are free
  bool hashing_ = false;   // the workers hash each image (--dedup in this pass)
  bool quit_ = false;
};

// A source that yielded no samples (ConvertOptions::allow_empty is not set).
Status EmptySource(const Dataset& src) {
  std::string what = src.info().format;
  return Status::Invalid(fmt::format("the {} source holds no samples: nothing to convert (pass --allow-empty, "
                                     "allow_empty=True in Python, to write an empty dataset)",
                                     what.empty() ? "dataset" : what),
                         Location{.file = src.info().address});
}

// The Code::kCancelled of a copy stopped by RequestStop() (a signal) after `written` samples.
Status Interrupted(int sig, uint64_t written, std::optional<uint64_t> total) {
  const char* abbrev = sig > 0 ? sigabbrev_np(sig) : nullptr;
  std::string name = abbrev ? fmt::format("SIG{}", abbrev) : sig > 0 ? fmt::format("signal {}", sig) : "a stop request";
  return Status::Cancelled(total ? fmt::format("interrupted by {} after {} of {} samples", name, written, *total)
                                 : fmt::format("interrupted by {} after {} samples", name, written));
}

// A testing aid: SHARDKIT_TEST_RAISE=SIG@N makes the copy loop raise signal SIG (a number)
// just before sample N is written (N = the sample count: just before Finish()), so that
// the interruption tests stop a conversion at a chosen point with a real signal.
struct StopHook {
  uint64_t at = UINT64_MAX;
  int signal = 0;
};
StopHook StopHookFromEnvironment() {
  StopHook h;
  const char* v = std::getenv("SHARDKIT_TEST_RAISE");
  unsigned long long at = 0;
  int sig = 0;
  if (v && std::sscanf(v, "%d@%llu", &sig, &at) == 2 && sig > 0) h = StopHook{at, sig};
  return h;
}

// The copy loop: windows from `fetch` into `dst`, then Finish().
// `refuse_colour`: the output needs the channel order of colour arrays and the source
// records none (CopyInto); --encode adds its own.
// `skipped`: the samples --skip-bad left out (key, reason), in write order.
// `slots`: `dst` follows a shard plan, and each sample left out uses its position there
// (formats/leave_out.h).
// `dedup`: --dedup in this pass (the source in order, not shuffled or split): a sample
// whose image repeats an earlier one's is dropped here.
Result<ConvertSummary> ConvertFetched(Fetcher* fetcher, const Dataset& src, SampleWriter* dst,
                                      const ConvertOptions& opts, const ProgressFn& progress,
                                      std::string refuse_colour = {},
                                      std::vector<std::pair<std::string, std::string>>* skipped = nullptr,
                                      formats::LeavesOut* slots = nullptr,
                                      pipeline::Deduplicator* dedup = nullptr) {
  Fetcher& fetch = *fetcher;
  std::vector<std::pair<std::string, std::string>> skipped_here;
  if (!skipped) skipped = &skipped_here;
  const auto t0 = Clock::now();
  if (opts.threads < 1) return Status::Invalid(fmt::format("--threads must be >= 1, got {}", opts.threads));
  SK_RETURN_IF_ERROR(fetch.Init(src));
  const formats::ArrayOrder order = formats::ArrayOrderOf(src.info());
  SK_ASSIGN_OR_RETURN(std::optional<decode::TransformSpec> transform,
                      decode::ParseTransform(opts.resize, opts.encode, opts.max_pixels));
  if (transform) fetch.SetTransform(*transform, opts.skip_bad);
  if (!opts.encode.empty() && opts.encode != "keep") {
    const std::string opt = formats::ChannelOption(src.info());
    if (order == formats::ArrayOrder::kBgr)
      return Status::Invalid(fmt::format(
          "--encode {}: the source's decoded arrays are BGR ({}); image files are RGB: convert them on read "
          "(--source-option {}=bgr-to-rgb) or say they are RGB ({}=rgb)",
          opts.encode, src.info().extra.at("channel_order"), opt, opt));
    SK_ASSIGN_OR_RETURN(decode::EncodeSpec spec, decode::ParseEncodeSpec(opts.encode));
    fetch.SetEncode(spec);
    if (order == formats::ArrayOrder::kUnknown && refuse_colour.empty())
      refuse_colour = formats::UnknownOrderMessage(src.info(), "--encode " + opts.encode);
  }
  if (!refuse_colour.empty()) fetch.SetColourRefusal(std::move(refuse_colour));

  ConvertSummary sum;
  ConvertProgress prog;
  prog.total = fetch.total();
  auto last_report = t0;
  auto report = [&](bool force) {
    if (!progress) return;
    auto now = Clock::now();
    if (!force && now - last_report < std::chrono::milliseconds(100)) return;
    last_report = now;
    prog.samples = sum.samples;
    prog.bytes = sum.payload_bytes;
    prog.elapsed = Since(t0);
    progress(prog);
  };

  const StopHook stop_hook = StopHookFromEnvironment();
  std::vector<Sample> cur, nxt;
  std::vector<std::optional<pipeline::ImageHash>> cur_h, nxt_h;  // --dedup in this pass
  uint64_t position = 0;  // of the sample in the source (dedup: no order, no range)
  SK_RETURN_IF_ERROR(fetch.Next(&cur, dedup ? &cur_h : nullptr));
  while (!cur.empty()) {
    // Read the next window while this one is written (threads > 1, a source read in order;
    // a streaming fetcher reads ahead on its own workers).
    std::future<Status> ahead;
    bool more = !fetch.eof();
    if (more && opts.threads > 1 && !fetch.streams())
      ahead = std::async(std::launch::async, [&] { return fetch.Next(&nxt, dedup ? &nxt_h : nullptr); });
    for (size_t j = 0; j < cur.size(); ++j, ++position) {
      const Sample& s = cur[j];
      // An early return waits for the window being read ahead first.
      auto stop = [&](Status st) {
        if (ahead.valid()) (void)ahead.get();
        return st;
      };
      if (dedup) {
        Result<bool> repeats = dedup->Repeats(position, s.key, cur_h[j]);
        if (!repeats.ok()) return stop(repeats.status());
        if (*repeats) continue;
      }
      if (const Field* why = Fetcher::Skipped(s)) {  // --skip-bad
        skipped->emplace_back(s.key, why->data.str());
        if (slots) {
          Status st = slots->LeaveOut(s.key, skipped->back().second);
          if (!st.ok()) return stop(st.At(Location{.key = s.key}));
        }
        continue;
      }
      if (stop_hook.at == sum.samples) std::raise(stop_hook.signal);
      if (int sig = StopRequested()) return stop(Interrupted(sig, sum.samples, prog.total));
      if (Status st = dst->Write(s); !st.ok()) return stop(st.At(Location{.key = s.key}));
      ++sum.samples;
      sum.payload_bytes += s.bytes();
      report(false);
    }
    if (more) {
      Status st = ahead.valid() ? ahead.get() : fetch.Next(&nxt, dedup ? &nxt_h : nullptr);
      if (!st.ok()) return st;
    } else {
      nxt.clear();
    }
    std::swap(cur, nxt);
    std::swap(cur_h, nxt_h);
  }
  if (stop_hook.at == sum.samples) std::raise(stop_hook.signal);
  if (int sig = StopRequested()) return Interrupted(sig, sum.samples, prog.total);
  if (!skipped->empty() && sum.samples == 0 && !opts.allow_empty && opts.part.count == 0)
    return Status::Invalid(fmt::format("--skip-bad left out every sample ({}; the first, '{}': {}): nothing to "
                                       "write",
                                       skipped->size(), skipped->front().first, skipped->front().second));
  if (sum.samples == 0 && !opts.allow_empty && opts.part.count == 0) return EmptySource(src);
  auto fin = dst->Finish();
  if (!fin.ok()) return std::move(fin).take_status();
  sum.bytes = fin->bytes;
  sum.shards = std::move(fin->shards);
  if (fin->samples != sum.samples)
    return Status::Internal(fmt::format("the writer reports {} samples, {} were written",
                                        fin->samples, sum.samples));
  sum.source_checksums_checked = fetch.checked();
  sum.skipped = skipped->size();
  if (transform) sum.transform = transform->RecordJson();
  const auto& extra = src.info().extra;
  if (auto n = extra.find("non_image_files"); n != extra.end()) {
    auto ex = extra.find("non_image_examples");
    sum.notes.push_back(fmt::format("left out {} file(s) of the source that are not images and share no image's "
                                    "name ({}{}); --source-option folder.files=all keeps them as samples",
                                    n->second, ex != extra.end() ? ex->second : "", n->second == "1" ? "" : ", ..."));
  }
  sum.seconds = Since(t0);
  report(true);
  return sum;
}

// The summary of an output that --resume found complete (nothing written).
ConvertSummary CompleteSummary(WriteSummary w) {
  ConvertSummary sum;
  sum.samples = w.samples;
  sum.bytes = w.bytes;
  sum.shards = std::move(w.shards);
  sum.already_complete = true;
  return sum;
}

// The number of samples of `in` known without reading them: its metadata's, else its
// random access's size; nullopt for a source read in order only.
std::optional<uint64_t> KnownSize(const Dataset& in) {
  if (in.info().num_samples) return in.info().num_samples;
  if (auto ra = in.NewRandomAccess(); ra.ok()) return (*ra)->size();
  return std::nullopt;
}

// The shards that --samples-per-shard `k` (0: one shard) cuts `n` samples into.
std::vector<uint64_t> CountPlan(uint64_t n, uint64_t k) {
  if (k == 0) k = std::max<uint64_t>(n, 1);
  std::vector<uint64_t> counts;
  for (uint64_t left = n; left > 0; left -= std::min(left, k)) counts.push_back(std::min(left, k));
  return counts;
}

// The global plan of a conversion split into parts, and this part's share of it.
struct PartPlan {
  std::optional<pipeline::Bijection> order;  // write position -> source index (none: identity)
  std::vector<uint64_t> shard_counts;  // samples per shard, the whole output
  uint64_t first_shard = 0, end_shard = 0;
  uint64_t begin = 0, end = 0;         // write positions of this part
};

// Every part computes the same plan: the order (--shuffle's permutation), the shard
// boundaries (a shard plan, samples per shard, or the sizes: the format's
// plan_by_size over the source's samples in write order), then takes shards
// [S*I/N, S*(I+1)/N) of the S shards.
Result<PartPlan> MakePartPlan(const Dataset& in, const formats::Format& fmt, ConvertOptions* c, std::string_view src) {
  const PartSpec& part = c->part;
  if (part.count == 0 || part.index >= part.count)
    return Status::Invalid(fmt::format("bad part {}/{}: expected 0 <= I < N", part.index, part.count));
  if (!fmt.writes_shards || !fmt.merge)
    return Status::Unsupported(fmt::format(
        "--part: the {0} format writes one file or tree for the whole dataset, which separate processes cannot "
        "write side by side and no merge can join without rewriting it; write tar shards (wds:out/x-%06d.tar) "
        "with --part and merge them, then convert the merged dataset to {0} in one process",
        fmt.name));
  auto ra_r = in.NewRandomAccess();
  if (!ra_r.ok())
    return Status::Unsupported(fmt::format("--part reads its slice of the source by index, which the {} dataset "
                                           "'{}' does not offer ({}); convert it to a format with random access "
                                           "first",
                                           in.info().format, src, ra_r.status().message()));
  std::shared_ptr<RandomAccess> ra = std::move(ra_r).value();
  const uint64_t n = ra->size();
  PartPlan p;
  if (c->shuffle) p.order.emplace(ShuffleOrder(n, c->seed));
  WriteOptions& w = c->write;
  if (!w.shard_plan.empty()) {
    p.shard_counts = w.shard_plan;
  } else if (w.shard_size == std::numeric_limits<uint64_t>::max()) {
    p.shard_counts = CountPlan(n, w.samples_per_shard);
  } else {
    if (!fmt.plan_by_size) return Status::Unsupported(fmt::format("the {} writer cannot plan shards by size", fmt.name));
    if (!w.transform.empty())
      return Status::Invalid(fmt::format("--part with --resize or --encode {}: shards cut by size need the sizes of "
                                         "the transformed images before any part starts; cut them by "
                                         "--samples-per-shard or --num-shards",
                                         c->encode.empty() ? "jpeg:90" : c->encode));
    auto get = [&](uint64_t pos, Sample* s) {
      uint64_t idx = p.order ? (*p.order)(pos) : pos;
      Status st = ra->Get(idx, s);
      if (!st.ok()) st.At(Location{.index = int64_t(idx)});
      return st;
    };
    SK_ASSIGN_OR_RETURN(p.shard_counts, fmt.plan_by_size(w, n, get, c->threads));
  }
  const uint64_t shards = p.shard_counts.size();
  p.first_shard = uint64_t((unsigned __int128)shards * part.index / part.count);
  p.end_shard = uint64_t((unsigned __int128)shards * (part.index + 1) / part.count);
  for (uint64_t i = 0; i < p.end_shard; ++i) {
    if (i < p.first_shard) p.begin += p.shard_counts[i];
    p.end += p.shard_counts[i];
  }
  // What every part must agree on; merge names the first member that differs.
  nlohmann::json plan;
  plan["source"] = io::RedactAddress(src);  // written into part records: never a secret (core/redact.h)
  plan["source_format"] = in.info().format;
  plan["source_samples"] = n;
  plan["shuffle"] = c->shuffle;
  plan["seed"] = c->shuffle ? c->seed : 0;
  plan["shard_size"] = w.shard_plan.empty() ? w.shard_size : 0;
  plan["samples_per_shard"] = w.shard_plan.empty() ? w.samples_per_shard : 0;
  plan["num_shards"] = w.shard_plan.empty() ? 0 : w.shard_plan.size();
  plan["key_dots"] = w.key_dots == KeyDots::kReplace ? "replace" : "error";
  plan["write_index"] = w.write_index;
  plan["transform"] = w.transform;  // (its max_pixels too: an image may be left out by it)
  plan["max_pixels"] = c->max_pixels;
  plan["class_names"] = w.class_names;
  plan["select"] = c->select;
  plan["dedup"] = c->dedup;
  plan["parts"] = part.count;
  plan["shards"] = shards;
  plan["boundaries"] = fmt::format("xxh3:{:016x}", XXH3_64bits(p.shard_counts.data(), shards * sizeof(uint64_t)));
  w.part.index = part.index;
  w.part.count = part.count;
  w.part.first_shard = p.first_shard;
  w.part.total_shards = shards;
  w.part.total_samples = n;
  w.part.plan = plan.dump();
  w.shard_plan.assign(p.shard_counts.begin() + int64_t(p.first_shard), p.shard_counts.begin() + int64_t(p.end_shard));
  return p;
}

// skipped.json (--skip-bad; pipeline::SkippedJson), once the output is complete.
Result<std::string> WriteSkippedList(const std::string& out_address, std::string_view src, const ConvertOptions& c,
                                     const std::vector<std::pair<std::string, std::string>>& skipped) {
  return pipeline::WriteSidecar(out_address, "skipped.json", pipeline::SkippedJson(io::RedactAddress(src), skipped),
                                c.write.filesystem);
}

// The copy behind Convert() and Shard(): `in` into `out_address` with `c`, a part of
// it (c.part), or nothing when --resume finds it complete.
// `remote_address`: a remote output staged at `out_address` with nothing staged yet;
// --resume then also looks for a finished output there.
// `dedup`: --dedup in the copy's own read (Narrow()).
Result<ConvertSummary> CopyInto(const Dataset& in, std::string_view src, const std::string& out_address,
                                ConvertOptions c, const ProgressFn& progress, const std::string& remote_address,
                                pipeline::Deduplicator* dedup) {
  std::string out_path;
  SK_ASSIGN_OR_RETURN(const formats::Format* fmt, formats::Resolve(out_address, true, &out_path));
  if (c.write.class_names.empty()) c.write.class_names = in.info().class_names;
  if (c.skip_bad && c.part.count == 0 && c.write.shard_plan.empty() && fmt->writes_shards &&
      c.write.samples_per_shard > 0 && c.write.shard_size == std::numeric_limits<uint64_t>::max()) {
    // --skip-bad --samples-per-shard K: K positions of the source per shard, as the
    // plan of a part counts them, so that one process and parts write the same shards
    // (a sample left out leaves its shard one short; formats/leave_out.h). A source of
    // unknown size keeps K written samples per shard (it cannot be split into parts).
    if (std::optional<uint64_t> n = KnownSize(in); n && *n > 0) {
      c.write.shard_plan = CountPlan(*n, c.write.samples_per_shard);
      c.write.samples_per_shard = 0;
    }
  }
  {  // The transform, recorded by the writer (wds: the manifest's "transform").
    SK_ASSIGN_OR_RETURN(std::optional<decode::TransformSpec> t,
                        decode::ParseTransform(c.resize, c.encode, c.max_pixels));
    if (t) c.write.transform = t->RecordJson();
    // How the samples were chosen, in the same record, so that verify --against chooses
    // alike from the source (and knows which samples --skip-bad left out).
    if (!c.select.empty() || c.dedup || c.skip_bad) {
      nlohmann::ordered_json j = c.write.transform.empty() ? nlohmann::ordered_json::object()
                                                           : nlohmann::ordered_json::parse(c.write.transform);
      if (!c.select.empty()) {
        j["select"] = c.select;
        if (c.select.rfind("fraction=", 0) == 0) j["seed"] = c.seed;
      }
      if (c.dedup) j["dedup"] = true;
      if (c.skip_bad) j["skip_bad"] = true;
      c.write.transform = j.dump();
    }
  }
  // The channel order of decoded arrays, as the source says it ("decoded arrays: bgr ...",
  // the words convert's --encode check reads): every writer records it beside the arrays
  // (docs/existing-data.md), and none converts it.
  const formats::ArrayOrder order = formats::ArrayOrderOf(in.info());
  if (c.write.array_channels.empty() && order == formats::ArrayOrder::kBgr) c.write.array_channels = "bgr";
  if (c.write.array_channels.empty() && order == formats::ArrayOrder::kRgb) c.write.array_channels = "rgb";
  std::optional<PartPlan> plan;
  if (c.part.count > 0) {
    SK_ASSIGN_OR_RETURN(plan, MakePartPlan(in, *fmt, &c, src));
  }
  if (c.write.resume) {
    // A rerun of a finished conversion (or part): check it and write nothing.
    std::optional<WriteSummary> done;
    if (fmt->finished) {
      SK_ASSIGN_OR_RETURN(done, fmt->finished(out_path, c.write));
      if (!done && !remote_address.empty()) {
        std::string remote_path;
        if (formats::Resolve(remote_address, true, &remote_path).ok()) {
          SK_ASSIGN_OR_RETURN(done, fmt->finished(remote_path, c.write));
        }
      }
    } else if (auto d = Open(out_address, OpenOptions{.filesystem = c.write.filesystem}); d.ok()) {
      // Formats that publish the whole output at the end: it is there, so it finished.
      std::optional<uint64_t> have = (*d)->info().num_samples, want = KnownSize(in);
      if (have && want && *have == *want) done = WriteSummary{*have, (*d)->info().total_bytes, (*d)->info().shards};
    }
    if (done) {
      if (!plan) {
        const std::optional<uint64_t> want = KnownSize(in);
        // (--skip-bad: fewer, the ones left out are listed beside it.)
        if (want && (c.skip_bad ? done->samples > *want : *want != done->samples))
          return Status::Invalid(fmt::format("--resume: the finished output holds {} samples, the source {}; start "
                                             "over with --overwrite",
                                             done->samples, *want),
                                 Location{.file = out_path});
      } else if (c.skip_bad ? done->samples > plan->end - plan->begin : done->samples != plan->end - plan->begin) {
        return Status::Invalid(fmt::format("--resume: the finished part holds {} samples, its plan {}; start over "
                                           "with --overwrite",
                                           done->samples, plan->end - plan->begin),
                               Location{.file = out_path});
      }
      ConvertSummary sum = CompleteSummary(std::move(*done));
      sum.part = c.part;
      return sum;
    }
  }
  // An empty source fails before anything is created (a part of a known-empty source too).
  if (in.info().num_samples == 0 && !c.allow_empty) return EmptySource(in);
  // --resume of an unfinished output of a format that cannot continue one: start over,
  // replacing what the interrupted write left under final names (a killed TFRecord or
  // RecordIO write's complete shards).
  if (c.write.resume && !fmt->resumes) c.write.overwrite = true;
  // A writer that would record an order the source does not know refuses colour arrays.
  std::string refuse_colour;
  if (fmt->records_assumed_channel_order && c.write.array_channels.empty() && order == formats::ArrayOrder::kUnknown)
    refuse_colour = formats::UnknownOrderMessage(in.info(), fmt::format("the {} writer records a channel order", fmt->name));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<SampleWriter> out, Create(out_address, c.write));
  // --skip-bad under a shard plan: a sample left out keeps its position (formats/leave_out.h).
  formats::LeavesOut* slots = nullptr;
  if (c.skip_bad && !c.write.shard_plan.empty()) {
    slots = dynamic_cast<formats::LeavesOut*>(out.get());
    if (!slots)
      return Status::Unsupported(fmt::format("--skip-bad with a shard plan (--part, --num-shards): the {} writer "
                                             "cannot leave a planned sample out; cut shards by --shard-size",
                                             fmt->name));
  }
  std::vector<std::pair<std::string, std::string>> skipped;
  if (!plan) {
    Fetcher fetch(c);
    SK_ASSIGN_OR_RETURN(ConvertSummary sum, ConvertFetched(&fetch, in, out.get(), c, progress,
                                                           std::move(refuse_colour), &skipped, slots, dedup));
    if (c.skip_bad) {
      SK_ASSIGN_OR_RETURN(sum.skipped_file, WriteSkippedList(out_address, src, c, skipped));
    }
    return sum;
  }
  if (dedup) return Status::Internal("--dedup in one pass with a part plan");
  // The part's slice of the write order, through the same copy loop; its record lists
  // what --skip-bad left out, and merge writes skipped.json from the records.
  Fetcher fetch(c, plan->begin, plan->end, plan->order ? &*plan->order : nullptr);
  SK_ASSIGN_OR_RETURN(ConvertSummary sum, ConvertFetched(&fetch, in, out.get(), c, progress,
                                                         std::move(refuse_colour), &skipped, slots));
  sum.part = c.part;
  return sum;
}

}  // namespace

namespace {

// A part stages a remote output in a directory of its own (io/upload_staging.h):
// parts on one machine must not share one (each removes its own when done).
std::string StagingTag(const PartSpec& part) {
  return part.count > 0 ? fmt::format("-part-{}-of-{}", part.index, part.count) : std::string();
}

}  // namespace

Status CheckTransformOptions(std::string_view resize, std::string_view encode) {
  if (!encode.empty() && encode != "keep") SK_RETURN_IF_ERROR(decode::ParseEncodeSpec(encode).status());
  return decode::ParseTransform(resize, encode, 0).status();
}

std::vector<uint64_t> EvenShardPlan(uint64_t total, uint64_t num_shards) {
  std::vector<uint64_t> plan;
  if (num_shards == 0) return plan;
  plan.assign(num_shards, total / num_shards);
  for (uint64_t i = 0; i < total % num_shards; ++i) ++plan[i];
  return plan;
}

std::vector<uint64_t> ShufflePermutation(uint64_t n, uint64_t seed) {
  pipeline::Bijection b = ShuffleOrder(n, seed);
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = b(i);
  return p;
}


namespace {
// A staged remote output's failure: an existing output is named by its remote address
// (the writer saw it through the staging file system, under its staged name), and a
// staging directory the writer left empty (it refused before writing) is removed.
Result<ConvertSummary> Staged(Result<ConvertSummary> r, const io::StagedOutput& staged) {
  if (r.ok() || !staged.uploader) return r;
  Status s = std::move(r).take_status();
  if (s.detail() == Detail::kOutputExists) s.where().file = staged.RemoteOf(s.where().file);
  staged.RemoveIfEmpty();
  return s;
}

// After a whole write with overwrite: removes what an earlier write of the same shard
// pattern left that the new output (`written`) does not hold: shards beyond the new
// count with the files beside them (Format::files_beside_shard), and part records
// (Format::part_files). Locally, or at the remote address. A destination that cannot
// list its directory (an HTTP PUT target) keeps them.
Status RemoveStaleOutputs(std::string_view address, const std::vector<ShardInfo>& written,
                          const std::shared_ptr<FileSystem>& local_fs) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* fmt, formats::Resolve(address, true, &path));
  if (!fmt->files_beside_shard || !paths::CheckShardPattern(path).ok()) return Status::OK();
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, io::FileSystemOf(path, local_fs));
  const std::string dir = io::DirName(path);
  auto listed = fs->ListDir(dir);
  if (!listed.ok()) return listed.status().code() == Code::kUnsupported ? Status::OK() : listed.status();
  std::vector<std::string> names;
  for (const auto& fi : *listed)
    if (fi.type == FileType::kFile) names.push_back(fi.name);
  std::set<std::string> kept, stale;
  for (const auto& si : written) kept.insert(std::string(paths::BaseName(si.path)));
  for (const auto& name : names) {
    auto n = paths::ShardNumberIn(path, name);
    if (!n) continue;
    const std::string shard = paths::FormatShardPattern(path, *n);
    if (kept.count(std::string(paths::BaseName(shard)))) continue;
    std::vector<std::string> files = fmt->files_beside_shard(shard);
    files.push_back(shard);
    for (const auto& f : files)
      if (paths::BaseName(f) == name) stale.insert(name);
  }
  if (fmt->part_files)
    for (auto& p : fmt->part_files(path, names)) stale.insert(std::move(p));
  for (const auto& name : stale) {
    const std::string p = dir + "/" + name;
    Status st = fs->Remove(p);
    if (!st.ok() && st.code() != Code::kNotFound)
      return Status(st.code(),
                    fmt::format("the output is complete, but a file an earlier write of the same pattern left "
                                "could not be removed: {}",
                                st.message()),
                    Location{.file = p});
  }
  return Status::OK();
}

// The source's open options: random access checks what the records keep too while
// convert checks its source (OpenOptions::check_records).
OpenOptions SourceOpenOptions(OpenOptions o, bool verify_source) {
  o.check_records = o.check_records || verify_source;
  return o;
}

// Writes `in` to `address`: a remote output through a local staging directory
// (io/upload_staging.h), every upload waited for, then what an earlier write of the
// same pattern left removed when overwriting (RemoveStaleOutputs). Shard paths in
// the summary are the remote addresses.
Result<ConvertSummary> WriteTo(const Dataset& in, std::string_view src, const std::string& address, ConvertOptions c,
                               const ProgressFn& progress, pipeline::Deduplicator* dedup) {
  std::string target = address;
  {  // the format's defaults, before a part plan or a journal records the options
    std::string path;
    if (auto f = formats::Resolve(address, true, &path); f.ok()) {
      SK_RETURN_IF_ERROR(formats::CheckWriteOptions(**f, c.write));
      c.write = formats::ApplyFormatDefaults(**f, c.write);
    }
  }
  const std::shared_ptr<FileSystem> local_fs = c.write.filesystem;
  io::StagedOutput staged;  // a remote output: written locally, each finished file uploaded (upload_staging.h)
  if (io::IsRemoteOutput(address)) {
    SK_ASSIGN_OR_RETURN(staged, io::StageRemoteOutput(address, c.write.filesystem, c.staging_dir, StagingTag(c.part)));
    c.write.filesystem = staged.fs;
    target = staged.address;
  }
  SK_ASSIGN_OR_RETURN(ConvertSummary sum,
                      Staged(CopyInto(in, src, target, c, progress, staged.fresh ? staged.remote : std::string(),
                                      dedup),
                             staged));
  SK_RETURN_IF_ERROR(staged.Finish());
  for (auto& si : sum.shards) si.path = staged.RemoteOf(si.path);
  if ((c.write.overwrite || c.write.resume) && c.part.count == 0 && !sum.already_complete)
    SK_RETURN_IF_ERROR(RemoveStaleOutputs(address, sum.shards, local_fs));
  return sum;
}
// --select / --dedup (pipeline/select.h): the source narrowed to the chosen samples;
// `in` itself when neither is asked for. --dedup reads every sample before the write,
// unless nothing planned before the first write depends on which samples it keeps (one
// process, the source's order, no --num-shards (`num_shards`), no --resume, which checks
// a finished output's count, and no --skip-bad count plan): then *one_pass drops them in
// the copy's own read, which reads each image once instead of twice. Both drop the same
// samples (pipeline::Deduplicator); Finish() completes the report.
struct Narrowed {
  std::unique_ptr<Dataset> in;
  pipeline::SelectReport report;
  std::unique_ptr<pipeline::Deduplicator> one_pass;
  void Finish() {
    if (!one_pass) return;
    report.duplicates = std::move(one_pass->duplicates());
    report.kept = report.selected - report.duplicates.size();
  }
};
Result<Narrowed> Narrow(std::unique_ptr<Dataset> in, const ConvertOptions& c, uint64_t num_shards) {
  Narrowed n;
  if (c.select.empty() && !c.dedup) {
    n.in = std::move(in);
    return n;
  }
  SK_ASSIGN_OR_RETURN(pipeline::SelectSpec spec, pipeline::ParseSelect(c.select));
  const bool in_pass = c.dedup && c.part.count == 0 && !c.shuffle && num_shards == 0 && !c.write.resume &&
                       !(c.skip_bad && c.write.samples_per_shard > 0);
  if (in_pass && in->NewRandomAccess().ok()) {
    if (!c.select.empty()) {
      SK_ASSIGN_OR_RETURN(in, pipeline::SelectSamples(std::shared_ptr<const Dataset>(std::move(in)), spec,
                                                      /*dedup=*/false, c.seed, std::max(1, c.threads), &n.report));
    }
    SK_ASSIGN_OR_RETURN(std::shared_ptr<RandomAccess> ra, in->NewRandomAccess());
    if (c.select.empty()) n.report.source_samples = n.report.selected = n.report.kept = ra->size();
    n.one_pass = std::make_unique<pipeline::Deduplicator>(std::move(ra));
    n.in = std::move(in);
    return n;
  }
  SK_ASSIGN_OR_RETURN(n.in, pipeline::SelectSamples(std::shared_ptr<const Dataset>(std::move(in)), spec, c.dedup,
                                                    c.seed, std::max(1, c.threads), &n.report));
  return n;
}

// The selection's part of the summary, and duplicates.json (written whole, then renamed,
// after the output is complete; by every part alike, the same bytes).
Status FinishSelection(std::string_view src, std::string_view dst, const ConvertOptions& c,
                       const pipeline::SelectReport& report, ConvertSummary* sum) {
  if (c.select.empty() && !c.dedup) return Status::OK();
  sum->source_samples = report.source_samples;
  sum->selected = report.selected;
  sum->duplicates = report.duplicates.size();
  if (report.keys_not_found > 0)
    sum->notes.push_back(fmt::format("{} of the {} keys listed by --select {} are not in the source",
                                     report.keys_not_found, report.keys_listed, c.select));
  if (!c.dedup) return Status::OK();
  SK_ASSIGN_OR_RETURN(std::string path, pipeline::WriteSidecar(dst, "duplicates.json",
                                                     pipeline::DuplicatesJson(io::RedactAddress(src), report),
                                                     c.write.filesystem));
  sum->duplicates_file = path;
  return Status::OK();
}

}  // namespace

Result<ConvertSummary> ConvertDataset(const Dataset& src, SampleWriter* dst,
                                      const ConvertOptions& opts, const ProgressFn& progress) {
  Fetcher fetch(opts);
  return ConvertFetched(&fetch, src, dst, opts, progress);
}

Result<ConvertSummary> Convert(std::string_view src, std::string_view dst, const ConvertOptions& opts,
                               const ProgressFn& progress) {
  const auto t0 = Clock::now();
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> source, Open(src, SourceOpenOptions(opts.open, opts.verify_source)));
  SK_ASSIGN_OR_RETURN(Narrowed chosen, Narrow(std::move(source), opts, /*num_shards=*/0));
  const std::unique_ptr<Dataset>& in = chosen.in;
  SK_ASSIGN_OR_RETURN(ConvertSummary sum, WriteTo(*in, src, std::string(dst), opts, progress, chosen.one_pass.get()));
  chosen.Finish();
  SK_RETURN_IF_ERROR(FinishSelection(src, dst, opts, chosen.report, &sum));
  sum.source = std::string(src);
  sum.destination = std::string(dst);
  sum.source_format = in->info().format;
  sum.destination_format = OutputFormat(dst);
  if (auto f = formats::Find(sum.destination_format)) sum.destination_shards = f->output_is_shards;
  sum.seconds = Since(t0);
  return sum;
}

Result<ConvertSummary> Shard(std::string_view src, std::string_view dst, const ShardOptions& opts,
                             const ProgressFn& progress) {
  const auto t0 = Clock::now();
  int ways = (opts.num_shards > 0) + (opts.samples_per_shard > 0) + (opts.shard_size > 0);
  if (ways > 1)
    return Status::Invalid("give at most one of --num-shards, --samples-per-shard, --shard-size");
  // The format whose writer cuts shards (Format::writes_shards) writes them.
  const formats::Format* sharded = formats::ShardWriter();
  if (!sharded) return Status::Unsupported("no format of this build writes shards");
  SK_RETURN_IF_ERROR(formats::CheckScheme(dst));
  auto [scheme, rest] = formats::SplitScheme(dst);
  if (!scheme.empty() && !formats::Find(scheme)->writes_shards)
    return Status::Invalid(
        fmt::format("shard writes WebDataset tar shards, but '{}' names the {} format; use "
                    "`shardkit convert` for other formats",
                    dst, scheme),
        Location{.file = rest});
  // A scheme that writes shards, or an unprefixed pattern that such a format bids on
  // (out/x-%05d.tfrecord), picks that format instead of the first.
  if (!scheme.empty()) sharded = formats::Find(scheme);
  std::string bid_path;
  if (auto r = formats::Resolve(dst, true, &bid_path); scheme.empty() && r.ok() && (*r)->writes_shards) sharded = *r;
  const std::string out_address = std::string(sharded->name) + ":" + rest;

  ConvertOptions c;
  c.shuffle = opts.shuffle;
  c.seed = opts.seed;
  c.threads = opts.threads;
  c.open = opts.open;
  c.write.overwrite = opts.overwrite;
  c.write.filesystem = opts.filesystem;
  c.write.key_dots = opts.key_dots;
  c.write.resume = opts.resume;
  c.write.write_index = opts.write_index;
  c.part = opts.part;
  c.staging_dir = opts.staging_dir;
  c.verify_source = opts.verify_source;
  c.allow_empty = opts.allow_empty;
  c.resize = opts.resize;
  c.encode = opts.encode;
  c.skip_bad = opts.skip_bad;
  c.max_pixels = opts.max_pixels;
  c.select = opts.select;
  c.dedup = opts.dedup;
  if (opts.samples_per_shard > 0) {
    c.write.samples_per_shard = opts.samples_per_shard;
    c.write.shard_size = std::numeric_limits<uint64_t>::max();
  } else if (opts.shard_size > 0) {
    c.write.shard_size = opts.shard_size;
  }

  SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> source, Open(src, SourceOpenOptions(opts.open, opts.verify_source)));
  SK_ASSIGN_OR_RETURN(Narrowed chosen, Narrow(std::move(source), c, opts.num_shards));
  const std::unique_ptr<Dataset>& in = chosen.in;
  c.write.class_names = in->info().class_names;
  if (opts.num_shards > 0) {
    std::optional<uint64_t> total = KnownSize(*in);
    if (!total) {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<SampleReader> r, in->NewReader());
      uint64_t n = 0;
      Sample s;
      for (;;) {
        SK_ASSIGN_OR_RETURN(bool more, r->Next(&s));
        if (!more) break;
        ++n;
      }
      total = n;
    }
    if (opts.num_shards > *total)
      return Status::Invalid(fmt::format("--num-shards {} is more than the {} samples of '{}'; "
                                         "every shard must hold at least one sample",
                                         opts.num_shards, *total, src));
    c.write.shard_plan = EvenShardPlan(*total, opts.num_shards);
    c.write.shard_size = std::numeric_limits<uint64_t>::max();
    c.write.samples_per_shard = 0;
  }
  SK_ASSIGN_OR_RETURN(ConvertSummary sum, WriteTo(*in, src, out_address, c, progress, chosen.one_pass.get()));
  chosen.Finish();
  SK_RETURN_IF_ERROR(FinishSelection(src, out_address, c, chosen.report, &sum));
  if (!c.write.shard_plan.empty() && c.part.count == 0 && !sum.already_complete) {
    // (--skip-bad: a shard holds its plan less the samples left out of it.)
    bool same = sum.shards.size() == c.write.shard_plan.size();
    for (size_t i = 0; same && i < sum.shards.size(); ++i)
      same = c.skip_bad ? sum.shards[i].samples <= c.write.shard_plan[i] : sum.shards[i].samples == c.write.shard_plan[i];
    if (!same)
      return Status::Internal(fmt::format(
          "the shard writer wrote {} shards, not the {} of the plan (is WriteOptions::shard_plan "
          "supported by this build?)",
          sum.shards.size(), c.write.shard_plan.size()));
  }
  sum.source = std::string(src);
  sum.destination = std::string(dst);
  sum.source_format = in->info().format;
  sum.destination_format = sharded->name;
  sum.destination_shards = true;
  sum.seconds = Since(t0);
  return sum;
}


}  // namespace shardkit
