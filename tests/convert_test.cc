// Convert/Shard pipeline against an in-memory fake format (no files), plus the
// helpers: shard plans, the shuffle permutation, byte sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "core/front_end.h"
#include "shardkit/convert.h"

using namespace shardkit;

namespace {

Sample MakeSample(uint64_t i) {
  Sample s;
  s.key = "k/" + std::to_string(1000000 + i);
  s.set("jpg", Bytes::Copy("payload-" + std::to_string(i) + std::string(i % 7, 'x')));
  s.set_label(int64_t(i % 3));
  return s;
}

class FakeReader : public SampleReader {
 public:
  FakeReader(uint64_t n, int64_t fail_at) : n_(n), fail_at_(fail_at) {}
  Result<bool> Next(Sample* out) override {
    if (int64_t(i_) == fail_at_) return Status::Corrupt("bad sample", Location{.file = "fake"});
    if (i_ >= n_) return false;
    *out = MakeSample(i_++);
    return true;
  }

 private:
  uint64_t n_, i_ = 0;
  int64_t fail_at_;
};

class FakeRandom : public RandomAccess {
 public:
  FakeRandom(uint64_t n, int64_t fail_at, std::atomic<int>* calls, const std::function<void(uint64_t)>* on_get)
      : n_(n), fail_at_(fail_at), calls_(calls), on_get_(on_get) {}
  uint64_t size() const override { return n_; }
  Status Get(uint64_t i, Sample* out) const override {
    ++*calls_;
    if (*on_get_) (*on_get_)(i);
    if (int64_t(i) == fail_at_) return Status::Corrupt("bad sample", Location{.file = "fake"});
    if (i >= n_) return Status::Invalid("index out of range");
    *out = MakeSample(i);
    return Status::OK();
  }

 private:
  uint64_t n_;
  int64_t fail_at_;
  std::atomic<int>* calls_;
  const std::function<void(uint64_t)>* on_get_;
};

class FakeDataset : public Dataset {
 public:
  FakeDataset(uint64_t n, bool random, int64_t fail_at = -1) : random_(random), fail_at_(fail_at) {
    info_.format = "fake";
    info_.address = "fake:mem";
    info_.num_samples = n;
    info_.class_names = {"a", "b", "c"};
  }
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new FakeReader(*info_.num_samples, fail_at_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    if (!random_) return Status::Unsupported("no random access here");
    return std::shared_ptr<RandomAccess>(new FakeRandom(*info_.num_samples, fail_at_, &calls, &on_get));
  }
  mutable std::atomic<int> calls{0};
  std::function<void(uint64_t)> on_get;  // called in Get(i), after counting the call

 private:
  DatasetInfo info_;
  bool random_;
  int64_t fail_at_;
};

class FakeWriter : public SampleWriter {
 public:
  explicit FakeWriter(int64_t fail_at = -1) : fail_at_(fail_at) {}
  Status Write(const Sample& s) override {
    if (int64_t(got.size()) == fail_at_) return Status::IOError("disk full", Location{.file = "out"});
    got.push_back(s);
    return Status::OK();
  }
  Result<WriteSummary> Finish() override {
    finished = true;
    WriteSummary w;
    w.samples = got.size();
    w.bytes = 123;
    w.shards.push_back(ShardInfo{.path = "out", .samples = got.size(), .bytes = 123});
    return w;
  }
  std::vector<Sample> got;
  bool finished = false;

 private:
  int64_t fail_at_;
};

std::vector<std::string> Keys(const std::vector<Sample>& v) {
  std::vector<std::string> k;
  for (auto& s : v) k.push_back(s.key);
  return k;
}

}  // namespace

TEST_CASE("ConvertDataset keeps order and bytes, sequential and with threads") {
  for (bool random : {false, true}) {
    for (int threads : {1, 4}) {
      for (size_t window : {size_t(1), size_t(7), size_t(256)}) {
        FakeDataset ds(100, random);
        FakeWriter w;
        ConvertOptions o;
        o.threads = threads;
        o.window = window;
        int calls = 0;
        ConvertProgress last;
        auto r = ConvertDataset(ds, &w, o, [&](const ConvertProgress& p) { ++calls, last = p; });
        INFO("random=" << random << " threads=" << threads << " window=" << window);
        REQUIRE(r.ok());
        REQUIRE(w.finished);
        REQUIRE(w.got.size() == 100);
        uint64_t bytes = 0;
        for (uint64_t i = 0; i < 100; ++i) {
          Sample want = MakeSample(i);
          REQUIRE(w.got[i].key == want.key);
          REQUIRE(w.got[i].find("jpg")->data == want.find("jpg")->data);
          REQUIRE(w.got[i].label() == want.label());
          bytes += want.bytes();
        }
        CHECK(r->samples == 100);
        CHECK(r->payload_bytes == bytes);
        CHECK(r->bytes == 123);
        REQUIRE(r->shards.size() == 1);
        CHECK(calls >= 1);
        CHECK(last.samples == 100);
        CHECK(last.bytes == bytes);
        REQUIRE(last.total.has_value());
        CHECK(*last.total == 100);
      }
    }
  }
}

TEST_CASE("ConvertDataset shuffle is a seeded permutation, the same for any thread count") {
  FakeDataset ds(500, true);
  auto run = [&](uint64_t seed, int threads) {
    FakeWriter w;
    ConvertOptions o;
    o.shuffle = true;
    o.seed = seed;
    o.threads = threads;
    o.window = 64;
    auto r = ConvertDataset(ds, &w, o);
    REQUIRE(r.ok());
    return Keys(w.got);
  };
  auto a = run(7, 1), b = run(7, 4), c = run(8, 1);
  CHECK(a == b);
  CHECK(a != c);
  std::vector<std::string> want;
  for (uint64_t i = 0; i < 500; ++i) want.push_back(MakeSample(i).key);
  CHECK(a != want);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == want);
  // The order is ShufflePermutation's.
  auto p = ShufflePermutation(500, 7);
  for (uint64_t i = 0; i < 500; ++i) REQUIRE(a[i] == MakeSample(p[i]).key);
}

TEST_CASE("ConvertDataset shuffle without random access is a clear Unsupported error") {
  FakeDataset ds(10, false);
  FakeWriter w;
  ConvertOptions o;
  o.shuffle = true;
  auto r = ConvertDataset(ds, &w, o);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kUnsupported);
  CHECK_THAT(r.status().message(), Catch::Contains("--shuffle needs random access"));
  CHECK_THAT(r.status().message(), Catch::Contains("fake:mem"));
  CHECK(w.got.empty());
  CHECK(!w.finished);
}

TEST_CASE("ConvertDataset reports read errors with the sample index, and write errors with the key") {
  for (bool random : {false, true}) {
    for (int threads : {1, 3}) {
      FakeDataset ds(50, random, 33);
      FakeWriter w;
      ConvertOptions o;
      o.threads = threads;
      o.window = 8;
      auto r = ConvertDataset(ds, &w, o);
      REQUIRE(!r.ok());
      CHECK(r.status().code() == Code::kCorrupt);
      CHECK(r.status().where().index == 33);
      CHECK(r.status().where().file == "fake");
      CHECK(!w.finished);
    }
  }
  FakeDataset ds(50, true);
  FakeWriter w(/*fail_at=*/20);
  ConvertOptions o;
  o.threads = 2;
  o.window = 4;
  auto r = ConvertDataset(ds, &w, o);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kIOError);
  CHECK(r.status().where().key == MakeSample(20).key);
  CHECK_THAT(r.status().ToString(), Catch::Contains("disk full"));
}

TEST_CASE("ConvertDataset reads at most two windows ahead") {
  FakeDataset ds(1000, true);
  struct Slow : FakeWriter {
    const FakeDataset* ds;
    int max_ahead = 0;
    Status Write(const Sample& s) override {
      max_ahead = std::max<int>(max_ahead, ds->calls.load() - int(got.size()));
      return FakeWriter::Write(s);
    }
  } w;
  w.ds = &ds;
  ConvertOptions o;
  o.threads = 4;
  o.window = 10;
  REQUIRE(ConvertDataset(ds, &w, o).ok());
  CHECK(w.max_ahead <= 20);
  CHECK(w.got.size() == 1000);
}

TEST_CASE("ConvertDataset: a slow sample holds up no other reader, which read on up to two windows ahead") {
  // Window 4, 3 threads. While sample 5 (the second window's) is read, the first window is
  // written and the other readers go on to sample 11, the end of two windows from sample 4:
  // 12 reads. (Readers that waited for each window to finish would stop at 8, and sample 5
  // would give up waiting after 5 s.)
  FakeDataset ds(100, true);
  int seen = 0;
  ds.on_get = [&](uint64_t i) {
    if (i != 5) return;
    for (int k = 0; k < 500 && ds.calls.load() < 12; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (no 13th read comes)
    seen = ds.calls.load();
  };
  FakeWriter w;
  ConvertOptions o;
  o.threads = 3;
  o.window = 4;
  REQUIRE(ConvertDataset(ds, &w, o).ok());
  CHECK(seen == 12);
  REQUIRE(w.got.size() == 100);
  for (uint64_t i = 0; i < 100; ++i) REQUIRE(w.got[i].key == MakeSample(i).key);
}

TEST_CASE("EvenShardPlan differs by at most one and sums to the total") {
  CHECK(EvenShardPlan(10, 3) == std::vector<uint64_t>{4, 3, 3});
  CHECK(EvenShardPlan(9, 3) == std::vector<uint64_t>{3, 3, 3});
  CHECK(EvenShardPlan(2, 4) == std::vector<uint64_t>{1, 1, 0, 0});
  CHECK(EvenShardPlan(5, 0).empty());
  for (uint64_t total : {0, 1, 17, 1000, 1281167})
    for (uint64_t n : {1, 2, 7, 64, 1024}) {
      auto p = EvenShardPlan(total, n);
      REQUIRE(p.size() == n);
      uint64_t sum = 0;
      for (auto x : p) sum += x;
      CHECK(sum == total);
      CHECK(*std::max_element(p.begin(), p.end()) - *std::min_element(p.begin(), p.end()) <= 1);
    }
}

TEST_CASE("ShufflePermutation is deterministic and a permutation") {
  auto a = ShufflePermutation(1000, 42), b = ShufflePermutation(1000, 42);
  CHECK(a == b);
  CHECK(a != ShufflePermutation(1000, 43));
  std::set<uint64_t> s(a.begin(), a.end());
  CHECK(s.size() == 1000);
  CHECK(*s.rbegin() == 999);
  CHECK(ShufflePermutation(0, 1).empty());
  CHECK(ShufflePermutation(1, 1) == std::vector<uint64_t>{0});
}

TEST_CASE("ParseByteSize accepts decimal and binary units and names bad strings") {
  CHECK(*ParseByteSize("1000000") == 1000000);
  CHECK(*ParseByteSize("500MB") == 500000000);
  CHECK(*ParseByteSize("500mb") == 500000000);
  CHECK(*ParseByteSize("1GiB") == (1ull << 30));
  CHECK(*ParseByteSize("1 GiB") == (1ull << 30));
  CHECK(*ParseByteSize("64KiB") == 65536);
  CHECK(*ParseByteSize("1.5GB") == 1500000000);
  CHECK(*ParseByteSize("2k") == 2000);
  CHECK(*ParseByteSize("7B") == 7);
  CHECK(*ParseByteSize("16TiB") == (16ull << 40));
  for (const char* bad : {"", "GiB", "12XB", "-5", "1.2.3", "abc", "99999999999999999999999", "20000000TB"}) {
    auto r = ParseByteSize(bad);
    INFO(bad);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(std::string("'") + bad + "'"));
  }
}
