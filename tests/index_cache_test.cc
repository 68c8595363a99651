// Tests of the random-access index within a budget (issue 15,
// lib/formats/wds/index_cache.h): the LRU of compact per-shard indexes, and the
// wds reader through it.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "formats/wds/index_cache.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using namespace shardkit::formats::wds;
using sk_test::TempDir;

namespace {

// A procedural shard: `per` samples, keys "s<shard>/<j>", a jpg (and on odd samples a json).
ShardIndex MakeShard(size_t k, size_t per) {
  ShardIndex idx;
  idx.path = fmt::format("proc-{}.tar", k);
  uint64_t off = 0;
  for (size_t j = 0; j < per; ++j) {
    SampleRef s;
    s.key = fmt::format("s{}/{}", k, j);
    s.offset = off;
    uint64_t size = 100 + (k * 7 + j * 13) % 900;
    s.fields.push_back(FieldRef{"jpg", off + 512, size});
    off += 512 + (size + 511) / 512 * 512;
    if (j % 2) {
      s.fields.push_back(FieldRef{"json", off + 1024, 10 + j});  // a pax header before it
      off += 1536;
    }
    idx.samples.push_back(std::move(s));
  }
  idx.file_size = off + 1024;
  return idx;
}

void CheckSampleOf(const CompactShardIndex& c, size_t k, size_t j, size_t per) {
  SampleRef want = MakeShard(k, per).samples[j];
  INFO("shard " << k << " sample " << j);
  CHECK(c.key(j) == want.key);
  CHECK(c.offset(j) == want.offset);
  SampleRef got = c.Ref(j);
  REQUIRE(got.fields.size() == want.fields.size());
  for (size_t f = 0; f < got.fields.size(); ++f) {
    CHECK(got.fields[f].ext == want.fields[f].ext);
    CHECK(got.fields[f].offset == want.fields[f].offset);
    CHECK(got.fields[f].size == want.fields[f].size);
  }
}

ShardIndexCache::Loader ProceduralLoader(size_t per, std::atomic<int>* loads = nullptr) {
  return [per, loads](size_t k) -> Result<ShardIndexCache::Index> {
    if (loads) loads->fetch_add(1);
    return CompactShardIndex::From(MakeShard(k, per), int64_t(k));
  };
}

}  // namespace

TEST_CASE("index cache: compact index holds the same samples in fewer bytes", "[index]") {
  ShardIndex big = MakeShard(3, 1000);
  auto c = CompactShardIndex::From(big, 3);
  REQUIRE(c.ok());
  REQUIRE((*c)->size() == 1000);
  for (size_t j : {0, 1, 2, 517, 999}) CheckSampleOf(**c, 3, j, 1000);
  // 1.5 fields and a ~6-char key a sample: about 4+6+4+4+4 + 1.5*17 bytes.
  CHECK((*c)->bytes() < 1000 * 64);
  CHECK((*c)->bytes() > 1000 * 30);
  // Too many extensions for the compact form: a clear error, not a wrong index.
  ShardIndex many;
  many.path = "many.tar";
  for (int e = 0; e < 300; ++e) many.samples.push_back(SampleRef{fmt::format("k{}", e), uint64_t(e) * 1024,
                                                                 {FieldRef{fmt::format("e{}", e), uint64_t(e) * 1024 + 512, 1}}});
  auto bad = CompactShardIndex::From(many, 9);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == Code::kUnsupported);
  CHECK(bad.status().where().file == "many.tar");
}

TEST_CASE("index cache: locator maps global indexes to shards, empty shards included", "[index]") {
  ShardLocator loc({3, 0, 2, 0, 0, 4});
  CHECK(loc.size() == 9);
  CHECK(loc.Locate(0) == std::pair<size_t, uint64_t>{0, 0});
  CHECK(loc.Locate(2) == std::pair<size_t, uint64_t>{0, 2});
  CHECK(loc.Locate(3) == std::pair<size_t, uint64_t>{2, 0});
  CHECK(loc.Locate(4) == std::pair<size_t, uint64_t>{2, 1});
  CHECK(loc.Locate(5) == std::pair<size_t, uint64_t>{5, 0});
  CHECK(loc.Locate(8) == std::pair<size_t, uint64_t>{5, 3});
}

TEST_CASE("index cache: stays within budget under random access, evicted shards reload identical", "[index]") {
  const size_t per = 100, shards = 200;
  const uint64_t one = (*CompactShardIndex::From(MakeShard(0, per), 0))->bytes();
  const uint64_t budget = one * 5 + one / 2;  // room for 5 shards
  std::atomic<int> loads{0};
  ShardIndexCache cache(budget, ProceduralLoader(per, &loads));
  std::mt19937_64 rng(42);
  for (int i = 0; i < 3000; ++i) {
    size_t k = rng() % shards, j = rng() % per;
    auto idx = cache.Get(k);
    REQUIRE(idx.ok());
    CheckSampleOf(**idx, k, j, per);
    auto st = cache.stats();
    REQUIRE(st.bytes <= budget);
    REQUIRE(st.entries <= 5);
  }
  auto st = cache.stats();
  CHECK(st.peak_bytes <= budget);
  CHECK(st.evictions > 1000);
  CHECK(st.loads == uint64_t(loads.load()));
  CHECK(st.loads > shards);  // shards were loaded again after their eviction
  CHECK(st.hits + st.loads == 3000);
  // The most recently used stay: a shard just read is a hit.
  REQUIRE(cache.Get(17).ok());
  int before = loads.load();
  REQUIRE(cache.Get(17).ok());
  CHECK(loads.load() == before);
  // An index held by a reader stays valid after its eviction.
  auto held = cache.Get(199);
  REQUIRE(held.ok());
  for (size_t k = 0; k < 20; ++k) REQUIRE(cache.Get(k).ok());
  CheckSampleOf(**held, 199, per - 1, per);
}

TEST_CASE("index cache: a budget smaller than one shard keeps one shard at a time", "[index]") {
  const size_t per = 50;
  std::atomic<int> loads{0};
  ShardIndexCache cache(1, ProceduralLoader(per, &loads));
  for (size_t k : {4, 4, 4, 9, 9, 4}) {
    auto idx = cache.Get(k);
    REQUIRE(idx.ok());
    CheckSampleOf(**idx, k, per / 2, per);
    CHECK(cache.stats().entries == 1);
  }
  CHECK(loads.load() == 3);  // 4, 9, 4: consecutive reads of one shard hit
}

TEST_CASE("index cache: 8 threads get correct samples, each shard loaded once at a time", "[index]") {
  const size_t per = 64, shards = 300;
  const uint64_t one = (*CompactShardIndex::From(MakeShard(0, per), 0))->bytes();
  for (uint64_t budget : {uint64_t(1), one * 8, one * 1000}) {
    INFO("budget " << budget);
    std::atomic<int> loads{0};
    ShardIndexCache cache(budget, ProceduralLoader(per, &loads));
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(t);
        for (int i = 0; i < 2000; ++i) {
          size_t k = (i % 3 == 0) ? size_t(7) : rng() % shards, j = rng() % per;  // shard 7: hot, shared
          auto idx = cache.Get(k);
          if (!idx.ok() || (*idx)->key(j) != fmt::format("s{}/{}", k, j) ||
              (*idx)->Ref(j).fields.size() != (j % 2 ? 2u : 1u))
            wrong.fetch_add(1);
        }
      });
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    auto st = cache.stats();
    CHECK(st.hits + st.loads == 16000);
    if (budget >= one * 1000) CHECK(st.loads == shards);  // all fit: each loaded exactly once
    if (budget >= one) CHECK(st.peak_bytes <= budget);
  }
}

TEST_CASE("index cache: a failed load is reported to every waiter and retried later", "[index]") {
  std::atomic<int> calls{0};
  ShardIndexCache cache(1 << 20, [&](size_t k) -> Result<ShardIndexCache::Index> {
    if (calls.fetch_add(1) == 0) return Status::IOError("flaky", Location{.file = "x.tar", .shard = int64_t(k)});
    return CompactShardIndex::From(MakeShard(k, 10), int64_t(k));
  });
  auto a = cache.Get(2);
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().where().file == "x.tar");
  auto b = cache.Get(2);
  REQUIRE(b.ok());
  CHECK((*b)->key(3) == "s2/3");
}

TEST_CASE("index cache: the budget is the open option, the library reads no SHARDKIT_INDEX_BUDGET", "[index]") {
  // Issue 13: tuning knobs are options. The environment variable (honoured by the CLI
  // and Python, which turn it into the option) changes nothing in the library.
  ::setenv("SHARDKIT_INDEX_BUDGET", "16MiB", 1);
  OpenOptions o;
  CHECK(*IndexBudgetOf(o) == kDefaultIndexBudget);
  o.format_options["wds.index_budget"] = "1000";
  CHECK(*IndexBudgetOf(o) == 1000);
  o.format_options["wds.index_budget"] = "lots";
  auto bad = IndexBudgetOf(o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("wds.index_budget 'lots'") != std::string::npos);
  // A value that does not parse in the environment no longer fails an open.
  ::setenv("SHARDKIT_INDEX_BUDGET", "nope", 1);
  o.format_options.clear();
  CHECK(*IndexBudgetOf(o) == kDefaultIndexBudget);
  ::unsetenv("SHARDKIT_INDEX_BUDGET");
}

namespace {

std::vector<Sample> WriteShards(const std::string& pattern, int n, uint64_t per_shard) {
  std::vector<Sample> samples;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("k/{:04d}", i);
    s.set("jpg", Bytes::Take(sk_test::MakeJpeg(8 + i % 5, 8, uint32_t(i + 1))));
    s.set_label(i % 4);
    samples.push_back(std::move(s));
  }
  WriteOptions wo;
  wo.samples_per_shard = per_shard;
  auto w = Create("wds:" + pattern, wo);
  REQUIRE(w.ok());
  for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
  REQUIRE((*w)->Finish().ok());
  return samples;
}

void CheckSample(const Sample& got, const Sample& want) {
  INFO("key " << want.key);
  CHECK(got.key == want.key);
  REQUIRE(got.fields.size() == want.fields.size());
  for (size_t j = 0; j < got.fields.size(); ++j) {
    CHECK(got.fields[j].ext == want.fields[j].ext);
    CHECK(got.fields[j].data == want.fields[j].data);
  }
}

}  // namespace

TEST_CASE("index cache: wds random access within a tiny budget reads every sample right, from 8 threads", "[index][wds]") {
  TempDir t;
  auto samples = WriteShards(t / "d/x-%06d.tar", 120, 6);  // 20 shards
  for (std::string budget : {"1", "2000", "64MiB"}) {
    for (std::string addr : {t / "d/x.manifest.json", t / "d/x-{000000..000019}.tar"}) {
      INFO(addr << " budget " << budget);
      OpenOptions o;
      o.format_options["wds.index_budget"] = budget;
      auto ds = Open(addr, o);
      REQUIRE(ds.ok());
      auto ra = (*ds)->NewRandomAccess();
      REQUIRE(ra.ok());
      REQUIRE((*ra)->size() == samples.size());
      std::vector<std::thread> threads;
      std::atomic<int> failures{0};
      std::vector<std::vector<std::pair<size_t, Sample>>> got(8);
      for (int th = 0; th < 8; ++th)
        threads.emplace_back([&, th] {
          std::mt19937_64 rng(th + 1);
          for (int r = 0; r < 300; ++r) {
            size_t i = rng() % samples.size();
            Sample s;
            if (!(*ra)->Get(i, &s).ok()) ++failures;
            got[th].emplace_back(i, std::move(s));
          }
        });
      for (auto& th : threads) th.join();
      CHECK(failures == 0);
      for (const auto& v : got)
        for (const auto& [i, s] : v) CheckSample(s, samples[i]);
    }
  }
}

TEST_CASE("index cache: a shard whose index disagrees with the manifest's count is corrupt, named", "[index][wds]") {
  TempDir t;
  auto samples = WriteShards(t / "m/x-%06d.tar", 12, 4);  // 3 shards of 4
  // The manifest claims 5 samples in shard 1 (and 13 in all, so that it is consistent).
  std::string mp = t / "m/x.manifest.json";
  auto j = nlohmann::json::parse(sk_test::ReadFile(mp));
  j["num_samples"] = 13;
  j["shards"][1]["samples"] = 5;
  sk_test::WriteFile(mp, j.dump(2));
  OpenOptions o;
  o.format_options["wds.index_budget"] = "1";
  auto ds = Open(mp, o);
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  Sample s;
  REQUIRE((*ra)->Get(0, &s).ok());  // shard 0 is fine
  CheckSample(s, samples[0]);
  Status st = (*ra)->Get(5, &s);
  REQUIRE(st.code() == Code::kCorrupt);
  CHECK(st.where().file == t / "m/x-000001.tar");
  CHECK(st.where().shard == 1);
  CHECK(st.message().find("holds 4 samples") != std::string::npos);
  CHECK(st.message().find("said 5") != std::string::npos);
  CHECK(st.ToString().find("x-000001.tar") != std::string::npos);
  // Shard 0 again (evicted meanwhile: budget of one shard): still right.
  REQUIRE((*ra)->Get(3, &s).ok());
  CheckSample(s, samples[3]);
}

TEST_CASE("index cache: SHARDKIT_INDEX_BUDGET reaches the option through the CLI only, below the flag", "[index][wds]") {
  TempDir t;
  WriteShards(t / "e/x-%06d.tar", 8, 4);
  const std::string manifest = t / "e/x.manifest.json";
  // The library: an unparsable variable changes nothing (no environment is read).
  ::setenv("SHARDKIT_INDEX_BUDGET", "nope", 1);
  auto ds = Open(manifest);
  INFO(ds.status().ToString());
  CHECK(ds.ok());
  ::unsetenv("SHARDKIT_INDEX_BUDGET");
  // The command turns the variable into the option: a bad value is a usage error naming it.
  auto info = sk_test::Cli("info " + sk_test::Q(manifest));
  CHECK(info.exit_code == 0);
  auto bad = sk_test::Run("SHARDKIT_INDEX_BUDGET=nope " + sk_test::Q(SHARDKIT_CLI) + " info " + sk_test::Q(manifest) +
                          " 2>&1");
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.find("SHARDKIT_INDEX_BUDGET 'nope'") != std::string::npos);
  // --source-option wds.index_budget wins over the variable (here: the option's bad value is named).
  auto both = sk_test::Run("SHARDKIT_INDEX_BUDGET=64MiB " + sk_test::Q(SHARDKIT_CLI) + " convert " +
                           sk_test::Q(manifest) + " " + sk_test::Q("folder:" + (t / "out")) +
                           " --source-option wds.index_budget=lots 2>&1");
  CHECK(both.exit_code != 0);
  CHECK(both.out.find("wds.index_budget 'lots'") != std::string::npos);
  auto good = sk_test::Run("SHARDKIT_INDEX_BUDGET=1 " + sk_test::Q(SHARDKIT_CLI) + " convert " + sk_test::Q(manifest) +
                           " " + sk_test::Q("folder:" + (t / "out2")) + " 2>&1");
  INFO(good.out);
  CHECK(good.exit_code == 0);
}
