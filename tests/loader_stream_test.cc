// The loader's streamed mode: shard order + per-rank ranges + bounded shuffle buffer,
// determinism, exactly-once coverage, resume, memory bound, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "pipeline/plan.h"
#include "shardkit/loader.h"
#include "shardkit/shardkit.h"
#include "loader_support.h"
#include "support.h"

using namespace shardkit;
using sk_test::MakeJpeg;
using sk_test::Drain;
using sk_test::OneBatch;
using sk_test::Seen;

namespace {

std::vector<Sample> MakeSamples(int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("c{}/img{:04d}", i % 5, i);
    s.set("jpg", Bytes::Copy(MakeJpeg(40 + (i % 4) * 16, 36 + (i % 3) * 20, 500 + uint32_t(i))));
    s.set_label(i % 5);
    out.push_back(std::move(s));
  }
  return out;
}

// Writes `samples` as wds shards of `per_shard` samples; returns the manifest address.
std::string WriteShards(const sk_test::TempDir& tmp, const std::vector<Sample>& samples, uint64_t per_shard) {
  WriteOptions wo;
  wo.samples_per_shard = per_shard;
  wo.class_names = {"a", "b", "c", "d", "e"};
  auto w = shardkit::Create(tmp / "train-%06d.tar", wo);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  for (auto& s : samples) REQUIRE((*w)->Write(s).ok());
  auto sum = (*w)->Finish();
  INFO(sum.status().ToString());
  REQUIRE(sum.ok());
  return tmp / "train.manifest.json";
}

// A dataset without random access: a reader over samples in memory. `claim` overrides
// the sample count its info() reports (nullopt: unknown).
class StreamOnly : public Dataset {
 public:
  StreamOnly(std::vector<Sample> s, std::optional<uint64_t> claim) : samples_(std::move(s)) {
    info_.format = "memstream";
    info_.address = "memstream:test";
    info_.num_samples = claim;
    info_.class_names = {"a", "b", "c", "d", "e"};
  }
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    struct R : SampleReader {
      const std::vector<Sample>* s;
      int delay_ms = 0;
      size_t i = 0;
      Result<bool> Next(Sample* out) override {
        if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        if (i >= s->size()) return false;
        *out = (*s)[i++];
        return true;
      }
    };
    auto r = std::make_unique<R>();
    r->s = &samples_;
    r->delay_ms = delay_ms;
    ++opened;
    return std::unique_ptr<SampleReader>(std::move(r));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return Status::Unsupported("streamed only");
  }
  mutable std::atomic<int> opened{0};  // (NewReader runs on the loader's reader thread)
  int delay_ms = 0;  // per sample read

 private:
  std::vector<Sample> samples_;
  DatasetInfo info_;
};

LoaderOptions StreamOpts() {
  LoaderOptions o;
  o.batch_size = 4;
  o.output_width = 24;
  o.output_height = 16;
  o.rank = 0;
  o.world_size = 1;
  o.threads = 2;
  o.seed = 5;
  o.stream = true;
  o.shuffle_buffer = 6;
  return o;
}

std::unique_ptr<Loader> MustCreate(const std::string& address, const LoaderOptions& o) {
  auto r = Loader::Create(address, o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

std::vector<std::string> AllKeys(const std::vector<Seen>& v) {
  std::vector<std::string> k;
  for (auto& b : v) k.insert(k.end(), b.keys.begin(), b.keys.end());
  return k;
}

}  // namespace

TEST_CASE("stream plan: rank segments cover the epoch exactly once, equal counts, any world size", "[loader][stream]") {
  using namespace shardkit::pipeline;
  const std::vector<std::vector<uint64_t>> layouts = {{7, 7, 7, 7, 7, 7, 3}, {10}, {0, 5, 0, 4}, {1, 1}, {30, 2, 9}};
  for (const auto& counts : layouts) {
    uint64_t n = 0;
    for (auto c : counts) n += c;
    for (uint32_t world = 1; world <= 5; ++world) {
      for (bool drop : {false, true}) {
        for (uint64_t epoch : {0, 3}) {
          auto order = ShardOrder(counts.size(), 11, epoch, true);
          Partition part = PartitionEpoch(n, world, 3, drop);
          std::map<std::pair<uint64_t, uint64_t>, int> seen;  // (shard, offset) -> times
          for (uint32_t r = 0; r < world; ++r) {
            uint64_t got = 0;
            for (const Segment& s : RankSegments(counts, order, r, world, 3, drop)) {
              REQUIRE(s.begin < s.end);
              REQUIRE(s.end <= counts[s.shard]);
              for (uint64_t o = s.begin; o < s.end; ++o) ++seen[{s.shard, o}];
              got += s.end - s.begin;
            }
            INFO("world " << world << " rank " << r << " drop " << drop);
            CHECK(got == part.per_rank);  // equal on every rank
          }
          uint64_t total = 0, twice = 0;
          for (auto& [where, times] : seen) {
            total += uint64_t(times);
            if (times > 1) twice += uint64_t(times - 1);
          }
          INFO("world " << world << " drop " << drop);
          CHECK(total == part.per_rank * world);
          if (drop) {
            CHECK(twice == 0);
            CHECK(seen.size() == n - part.dropped);
          } else {
            CHECK(seen.size() == n);       // every sample at least once
            CHECK(twice == part.padded);   // and only the pad more than once
          }
        }
      }
    }
  }
  // Shard order: a permutation, fixed per (seed, epoch), different across epochs.
  auto a = ShardOrder(20, 1, 0, true), b = ShardOrder(20, 1, 1, true);
  CHECK(a == ShardOrder(20, 1, 0, true));
  CHECK(a != b);
  std::sort(b.begin(), b.end());
  for (uint64_t i = 0; i < 20; ++i) CHECK(b[i] == i);
  CHECK(ShardOrder(5, 1, 0, false) == std::vector<uint64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("streamed loader: same seed and epoch give the same batches across runs and thread counts", "[loader][stream]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(45);
  std::string addr = WriteShards(tmp, samples, 7);  // 7 shards (the last one of 3)
  LoaderOptions o = StreamOpts();
  auto a = MustCreate(addr, o);
  REQUIRE(a->streaming());
  CHECK(a->num_samples() == 45);
  CHECK(a->num_batches() == 12);
  CHECK(a->class_names().size() == 5);
  o.threads = 1;
  o.prefetch = 2;
  auto b = MustCreate(addr, o);
  auto ea = Drain(*a), eb = Drain(*b);
  REQUIRE(ea.size() == 12);
  CHECK(ea == eb);
  // Every sample exactly once; the order is not the dataset's.
  auto keys = AllKeys(ea);
  std::multiset<std::string> got(keys.begin(), keys.end()), want;
  for (auto& s : samples) want.insert(s.key);
  CHECK(got == want);
  std::vector<std::string> stored;
  for (auto& s : samples) stored.push_back(s.key);
  CHECK(keys != stored);
  // Another epoch: another order, the same set; back to epoch 0: the same batches.
  a->set_epoch(1);
  auto e1 = Drain(*a);
  auto k1 = AllKeys(e1);
  CHECK(k1 != keys);
  CHECK(std::multiset<std::string>(k1.begin(), k1.end()) == want);
  a->set_epoch(0);
  CHECK(Drain(*a) == ea);
  // No shuffle: dataset order, shard after shard.
  o.shuffle = false;
  auto c = MustCreate(addr, o);
  CHECK(AllKeys(Drain(*c)) == stored);
}

TEST_CASE("streamed loader: a sample gets the same index, label and pixels as with random access", "[loader][stream]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(30);
  std::string addr = WriteShards(tmp, samples, 8);
  LoaderOptions o = StreamOpts();
  o.stream = false;
  auto ra = MustCreate(addr, o);
  REQUIRE(!ra->streaming());
  o.stream = true;
  auto st = MustCreate(addr, o);
  for (uint64_t e : {0, 2}) {
    ra->set_epoch(e);
    st->set_epoch(e);
    std::map<std::string, std::tuple<uint64_t, int64_t, uint64_t>> by_key;
    for (auto& b : Drain(*ra))
      for (size_t i = 0; i < b.keys.size(); ++i) by_key[b.keys[i]] = {b.indices[i], b.labels[i], b.rows[i]};
    size_t n = 0;
    for (auto& b : Drain(*st))
      for (size_t i = 0; i < b.keys.size(); ++i, ++n) {
        INFO(b.keys[i]);
        REQUIRE(by_key.count(b.keys[i]) == 1);
        CHECK(by_key[b.keys[i]] == std::make_tuple(b.indices[i], b.labels[i], b.rows[i]));
      }
    CHECK(n == 30);
  }
}

TEST_CASE("streamed loader: 3 ranks are disjoint, cover the epoch and yield equal batch counts", "[loader][stream]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(46);
  std::string addr = WriteShards(tmp, samples, 10);  // 5 shards: 10,10,10,10,6
  for (bool drop : {false, true}) {
    for (uint32_t world : {1u, 3u, 7u}) {  // 7 ranks: more ranks than shards
      std::multiset<std::string> got;
      uint64_t batches = 0;
      for (uint32_t r = 0; r < world; ++r) {
        LoaderOptions o = StreamOpts();
        o.rank = int(r);
        o.world_size = int(world);
        o.drop_last = drop;
        auto l = MustCreate(addr, o);
        auto ep = Drain(*l);
        INFO("world " << world << " rank " << r << " drop " << drop);
        CHECK(ep.size() == l->num_batches());
        if (r == 0) batches = ep.size();
        CHECK(ep.size() == batches);
        for (auto& k : AllKeys(ep)) got.insert(k);
      }
      pipeline::Partition part = pipeline::PartitionEpoch(46, world, 4, drop);
      std::set<std::string> distinct(got.begin(), got.end());
      INFO("world " << world << " drop " << drop);
      CHECK(got.size() == part.per_rank * world);
      if (drop) {
        CHECK(distinct.size() == got.size());  // nothing twice
        CHECK(distinct.size() == 46 - part.dropped);
      } else {
        CHECK(distinct.size() == 46);  // every sample, and only the pad twice
        CHECK(got.size() - distinct.size() == part.padded);
      }
    }
  }
}

TEST_CASE("streamed loader: resume at several batches equals the uninterrupted run, pixels included", "[loader][stream]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(45);
  std::string addr = WriteShards(tmp, samples, 7);
  for (int world : {1, 3}) {
    LoaderOptions o = StreamOpts();
    o.world_size = world;
    o.rank = world - 1;
    o.seed = 99;
    auto full = MustCreate(addr, o);
    full->set_epoch(3);
    auto ref = Drain(*full);
    REQUIRE(ref.size() == full->num_batches());
    for (uint64_t cut : {uint64_t(0), uint64_t(1), uint64_t(2), ref.size() - 1, ref.size()}) {
      auto a = MustCreate(addr, o);
      a->set_epoch(3);
      for (uint64_t i = 0; i < cut; ++i) {
        auto b = a->Next();
        REQUIRE(b.ok());
      }
      LoaderState st = a->save_state();
      CHECK(st.has_stream);
      CHECK(st.next_batch == cut);
      if (cut > 0 && cut < ref.size()) CHECK(!st.stream.buffer.empty());
      auto parsed = LoaderState::FromJson(st.ToJson());
      INFO(parsed.status().ToString());
      REQUIRE(parsed.ok());
      // A fresh loader (as in a new process), restored from the JSON.
      auto b = MustCreate(addr, o);
      Status rs = b->restore(*parsed);
      INFO("world " << world << " cut " << cut << ": " << rs.ToString());
      REQUIRE(rs.ok());
      auto rest = Drain(*b);
      REQUIRE(rest.size() == ref.size() - cut);
      for (size_t i = 0; i < rest.size(); ++i) CHECK(rest[i] == ref[cut + i]);
      // Without the stream position (e.g. a state from the GPU loader): replayed.
      LoaderState bare = st;
      bare.has_stream = false;
      bare.stream = {};
      auto c = MustCreate(addr, o);
      REQUIRE(c->restore(bare).ok());
      auto replay = Drain(*c);
      REQUIRE(replay.size() == rest.size());
      for (size_t i = 0; i < rest.size(); ++i) CHECK(replay[i] == rest[i]);
      // A position taken at another batch (as the GPU loader does when it moves a saved
      // state to the batch it needs): replayed, not used.
      if (cut >= 1) {
        LoaderState moved = st;
        moved.next_batch = cut - 1;
        auto d = MustCreate(addr, o);
        REQUIRE(d->restore(moved).ok());
        auto from = Drain(*d);
        REQUIRE(from.size() == ref.size() - (cut - 1));
        for (size_t i = 0; i < from.size(); ++i) CHECK(from[i] == ref[cut - 1 + i]);
      }
    }
  }
}

TEST_CASE("streamed loader: the shuffle buffer never holds more than the option", "[loader][stream]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(45);
  std::string addr = WriteShards(tmp, samples, 7);
  for (uint32_t cap : {0u, 1u, 5u, 16u, 1000u}) {
    LoaderOptions o = StreamOpts();
    o.shuffle_buffer = cap;
    auto l = MustCreate(addr, o);
    uint64_t most = 0;
    for (;;) {
      auto b = l->Next();
      REQUIRE(b.ok());
      if (b->end_of_epoch()) break;
      auto s = l->stream_stats();
      most = std::max(most, s.max_buffered);
      CHECK(s.max_buffered <= std::max<uint64_t>(cap, 1));
      CHECK(l->save_state().stream.buffer.size() <= std::max<uint64_t>(cap, 1));
    }
    auto s = l->stream_stats();
    INFO("shuffle_buffer " << cap);
    CHECK(s.streaming);
    CHECK(s.buffer_capacity == std::max<uint64_t>(cap, 1));
    CHECK(most == std::min<uint64_t>(std::max<uint64_t>(cap, 1), 45));  // filled up to the option
    CHECK(s.samples_read == 45);  // one rank: every sample read once, nothing re-read
  }
  // Without shuffling the buffer holds one sample and the order is the stored one.
  LoaderOptions o = StreamOpts();
  o.shuffle_buffer = 0;
  o.shuffle = true;
  auto l = MustCreate(addr, o);
  auto keys = AllKeys(Drain(*l));
  // Shards permuted, samples in stored order inside each: runs of consecutive keys.
  size_t breaks = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    int prev = std::stoi(keys[i - 1].substr(keys[i - 1].size() - 4));
    int cur = std::stoi(keys[i].substr(keys[i].size() - 4));
    if (cur != prev + 1) ++breaks;
  }
  CHECK(breaks <= 6);  // at most one break between consecutive shards
  CHECK(breaks >= 1);  // and the shard order is not the stored one
}

TEST_CASE("streamed loader: chosen by itself for a dataset without random access, and counts unknown sizes",
          "[loader][stream]") {
  auto samples = MakeSamples(13);
  auto ds = std::make_unique<StreamOnly>(samples, std::nullopt);
  StreamOnly* raw = ds.get();
  LoaderOptions o = StreamOpts();
  o.stream = false;
  auto r = Loader::Create(std::move(ds), o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  auto& l = *r;
  CHECK(l->streaming());
  CHECK(l->num_samples() == 13);  // counted by one pass
  CHECK(raw->opened.load() >= 1);
  auto ep = Drain(*l);
  CHECK(ep.size() == 4);
  auto keys = AllKeys(ep);
  CHECK(std::set<std::string>(keys.begin(), keys.end()).size() == 13);
}

TEST_CASE("streamed loader: metadata that disagrees with a shard, and a state from another dataset, are errors",
          "[loader][stream]") {
  auto samples = MakeSamples(13);
  {
    // The dataset claims 15 samples: the stream ends early, named.
    auto ds = std::make_unique<StreamOnly>(samples, 15);
    LoaderOptions o = StreamOpts();
    o.shuffle_buffer = 0;
    auto l = Loader::Create(std::move(ds), o);
    REQUIRE(l.ok());
    Status err;
    for (int i = 0; i < 10; ++i) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        err = b.status();
        break;
      }
      REQUIRE(!b->end_of_epoch());
    }
    INFO(err.ToString());
    CHECK(err.code() == Code::kCorrupt);
    CHECK(err.ToString().find("ended after 13 samples") != std::string::npos);
    CHECK(err.ToString().find("memstream:test") != std::string::npos);
    CHECK((*l)->Next().status().code() == Code::kCorrupt);  // sticky until set_epoch
  }
  {
    // The dataset claims 10: the extra samples are reported, not dropped.
    auto ds = std::make_unique<StreamOnly>(samples, 10);
    auto l = Loader::Create(std::move(ds), StreamOpts());
    REQUIRE(l.ok());
    Status err;
    for (int i = 0; i < 10 && err.ok(); ++i) {
      auto b = (*l)->Next();
      if (!b.ok()) err = b.status();
      else if (b->end_of_epoch()) break;
    }
    INFO(err.ToString());
    CHECK(err.code() == Code::kCorrupt);
    CHECK(err.where().key == "c0/img0010");
  }
  {
    // A saved buffer whose key no longer matches the dataset.
    auto l = Loader::Create(std::make_unique<StreamOnly>(samples, std::nullopt), StreamOpts());
    REQUIRE(l.ok());
    REQUIRE((*l)->Next().ok());
    LoaderState st = (*l)->save_state();
    REQUIRE(!st.stream.buffer.empty());
    st.stream.buffer[0].key = "renamed/key";
    auto m = Loader::Create(std::make_unique<StreamOnly>(samples, std::nullopt), StreamOpts());
    REQUIRE(m.ok());
    Status rs = (*m)->restore(st);
    INFO(rs.ToString());
    CHECK(rs.code() == Code::kCorrupt);
    CHECK(rs.where().key == "renamed/key");
    // A random-access loader refuses a streamed state.
    LoaderOptions o = StreamOpts();
    o.stream = false;
    sk_test::TempDir tmp;
    std::string addr = WriteShards(tmp, samples, 5);
    auto ra = MustCreate(addr, o);
    LoaderState good = (*l)->save_state();
    CHECK(ra->restore(good).code() == Code::kInvalidArgument);
    // A next batch beyond the epoch is refused, with or without the stream position.
    LoaderState far = (*l)->save_state();
    far.next_batch = (*l)->num_batches() + 1;
    far.stream.next_batch = far.next_batch;
    CHECK((*l)->restore(far).code() == Code::kInvalidArgument);
    far.has_stream = false;
    CHECK_THAT((*l)->restore(far).message(), Catch::Contains("of an epoch of"));
  }
}

TEST_CASE("streamed loader: a sample that fails to decode is named (kError) or skipped and counted (kSkip)",
          "[loader][stream]") {
  auto samples = MakeSamples(13);
  samples[6].set("jpg", Bytes::Copy(std::string("\xff\xd8\xff\xe0 not a jpeg", 15)));
  for (auto policy : {DecodeErrorPolicy::kError, DecodeErrorPolicy::kSkip}) {
    LoaderOptions o = StreamOpts();
    o.on_error = policy;
    auto l = Loader::Create(std::make_unique<StreamOnly>(samples, 13), o);
    REQUIRE(l.ok());
    Status err;
    size_t rows = 0;
    for (;;) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        err = b.status();
        break;
      }
      if (b->end_of_epoch()) break;
      rows += b->size();
    }
    if (policy == DecodeErrorPolicy::kError) {
      INFO(err.ToString());
      CHECK(!err.ok());
      CHECK(err.where().key == "c1/img0006");
      CHECK(err.where().index == 6);
    } else {
      CHECK(err.ok());
      CHECK(rows == 12);
      auto sk = (*l)->skipped();
      REQUIRE(sk.size() == 1);
      CHECK(sk[0].where().key == "c1/img0006");
    }
  }
}

TEST_CASE("streamed loader: destroying it mid-epoch with a slow stream returns promptly", "[loader][stream]") {
  auto ds = std::make_unique<StreamOnly>(MakeSamples(40), 40);
  ds->delay_ms = 20;
  LoaderOptions o = StreamOpts();
  o.shuffle_buffer = 8;
  auto l = Loader::Create(std::move(ds), o);
  REQUIRE(l.ok());
  REQUIRE((*l)->Next().ok());  // the reader thread is now reading ahead
  auto t0 = std::chrono::steady_clock::now();
  l->reset();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 0.5);
}

// ---- Prefetching across epochs (LoaderOptions::prefetch_next_epoch) ----

namespace {

std::vector<Seen> FreshEpoch(const std::string& addr, LoaderOptions o, uint64_t epoch) {
  o.prefetch_next_epoch = false;
  auto l = MustCreate(addr, o);
  l->set_epoch(epoch);
  return Drain(*l);
}

}  // namespace

TEST_CASE("streamed loader: prefetching the next epoch changes nothing the consumer sees", "[loader][stream][prefetch]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(45);
  std::string addr = WriteShards(tmp, samples, 7);
  struct Cfg {
    int world, rank;
    bool drop_last;
    uint32_t buffer;
    int prefetch;
  };
  const Cfg cfgs[] = {
      {1, 0, false, 6, 4},   // 12 batches, the last of 1
      {3, 1, false, 5, 2},   // 15 per rank, a shard split between ranks
      {3, 2, true, 0, 3},    // no sample shuffle, drop_last: 3 full batches
      {2, 0, false, 64, 1},  // a buffer larger than the rank's range, one pool buffer
  };
  for (const Cfg& c : cfgs) {
    LoaderOptions o = StreamOpts();
    o.world_size = c.world;
    o.rank = c.rank;
    o.drop_last = c.drop_last;
    o.shuffle_buffer = c.buffer;
    o.prefetch = c.prefetch;
    INFO("rank " << c.rank << "/" << c.world << " buffer " << c.buffer << " prefetch " << c.prefetch);
    auto [off, on] = sk_test::SameWithAndWithoutPrefetch(o, [&](const LoaderOptions& x) { return MustCreate(addr, x); });
    CHECK(off->prefetch_stats().speculated == 0);
    CHECK(on->prefetch_stats().adopted > 0);
  }
  // Decode errors (kError: named, in their own epoch; kSkip: counted in it).
  auto bad = samples;
  bad[6].set("jpg", Bytes::Copy(std::string("\xff\xd8\xff\xe0 not a jpeg", 15)));
  bad[30].set("jpg", Bytes::Copy(std::string("nothing")));
  for (auto policy : {DecodeErrorPolicy::kError, DecodeErrorPolicy::kSkip}) {
    LoaderOptions o = StreamOpts();
    o.on_error = policy;
    INFO("policy " << int(policy));
    auto [off, on] = sk_test::SameWithAndWithoutPrefetch(o, [&](const LoaderOptions& x) {
      auto l = Loader::Create(std::make_unique<StreamOnly>(bad, 45), x);
      REQUIRE(l.ok());
      return std::move(l).value();
    });
    // (kError: every epoch fails early here; nothing is submitted after an error)
    if (policy == DecodeErrorPolicy::kSkip) CHECK(on->prefetch_stats().adopted > 0);
  }
}

TEST_CASE("streamed loader: after a slow consumer the first Next() of epoch e + 1 does not wait",
          "[loader][stream][prefetch]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(45);
  std::string addr = WriteShards(tmp, samples, 7);
  LoaderOptions o = StreamOpts();  // 12 batches of 4
  o.prefetch = 3;
  auto l = MustCreate(addr, o);
  auto e0 = Drain(*l);
  auto s0 = l->stream_stats();
  REQUIRE(sk_test::WaitAhead(*l, 3));  // every buffer holds a batch of epoch 1, no more
  CHECK(l->prefetch_stats().speculated == 3);
  // The current epoch's counters and state are still epoch 0's.
  auto s = l->stream_stats();
  CHECK(s.samples_read == 45);
  CHECK(s.samples_read == s0.samples_read);
  CHECK(s.max_buffered == s0.max_buffered);
  CHECK(s.max_buffered <= 6);
  CHECK(l->save_state().epoch == 0);
  CHECK(l->save_state().stream.epoch == 0);
  CHECK(l->save_state().next_batch == 12);
  l->set_epoch(1);
  auto r = l->Next();
  REQUIRE(r.ok());
  CHECK(!l->prefetch_stats().last_next_waited);
  CHECK(l->prefetch_stats().adopted == 3);
  std::vector<Seen> e1{OneBatch(*r)};
  r->Release();
  for (auto& b : Drain(*l)) e1.push_back(b);
  CHECK(e1 == FreshEpoch(addr, o, 1));
  CHECK(l->stream_stats().samples_read == 45);  // epoch 1's reads, counted once
  CHECK(l->stream_stats().max_buffered <= 6);
  CHECK(e0 == FreshEpoch(addr, o, 0));
}

TEST_CASE("streamed loader: set_epoch to another epoch, or restore(), drops the prefetched batches",
          "[loader][stream][prefetch]") {
  sk_test::TempDir tmp;
  auto samples = MakeSamples(30);
  std::string addr = WriteShards(tmp, samples, 7);
  LoaderOptions o = StreamOpts();
  o.prefetch = 3;
  auto l = MustCreate(addr, o);
  Drain(*l);
  REQUIRE(sk_test::WaitAhead(*l, 1));
  l->set_epoch(5);
  CHECK(l->prefetch_stats().discarded >= 1);
  CHECK(l->prefetch_stats().adopted == 0);
  CHECK(Drain(*l) == FreshEpoch(addr, o, 5));
  REQUIRE(sk_test::WaitAhead(*l, 1));
  // Resume in the middle of epoch 6 from a state of an uninterrupted run.
  auto ref = MustCreate(addr, o);
  ref->set_epoch(6);
  REQUIRE(ref->Next().ok());
  REQUIRE(ref->Next().ok());
  LoaderState st = ref->save_state();
  auto rest = Drain(*ref);
  const uint64_t before = l->prefetch_stats().discarded;
  REQUIRE(l->restore(st).ok());
  CHECK(l->prefetch_stats().discarded > before);
  CHECK(l->prefetch_stats().adopted == 0);
  CHECK(Drain(*l) == rest);
  // Epoch 7 after that resumed epoch 6: prefetched, adopted, the same batches.
  REQUIRE(sk_test::WaitAhead(*l, 1));
  l->set_epoch(7);
  CHECK(l->prefetch_stats().adopted >= 1);
  CHECK(Drain(*l) == FreshEpoch(addr, o, 7));
}

TEST_CASE("streamed loader: destroying it while it prefetches the next epoch returns promptly",
          "[loader][stream][prefetch]") {
  for (int how = 0; how < 2; ++how) {
    auto ds = std::make_unique<StreamOnly>(MakeSamples(12), 12);
    ds->delay_ms = 20;  // per sample read: the reader is busy with epoch 1 after epoch 0
    LoaderOptions o = StreamOpts();
    o.shuffle_buffer = 8;
    auto l = Loader::Create(std::move(ds), o);
    REQUIRE(l.ok());
    Drain(**l);
    auto t0 = std::chrono::steady_clock::now();
    if (how == 0) l->reset();
    else (*l)->set_epoch(3);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("took " << s << " s");
    CHECK(s < 0.5);
  }
}
