// sk_index_bench: issue 15's random-access index within a budget, on a procedural
// dataset (no disk): by default 1,000,000 shards x 1,000 samples = 10^9 samples.
// A shard's index is made on demand by a procedural source (keys, a jpg and a cls
// member per sample at tar offsets) and goes through the same path as the wds
// reader's (formats/wds/index_cache.h): ShardIndex -> CompactShardIndex, kept in a
// ShardIndexCache within the budget, global index -> shard by ShardLocator.
//  1. Bytes per sample: the std::vector/std::string ShardIndex vs the compact one.
//  2. Loader rank 3 of 8 and `convert --part 417/1000 --shuffle`: plan set-up (the
//     order, the shard counts, the cache) + the first index lookup; time and RSS.
//  3. Random lookups from T threads through the cache: RSS (now and peak), cache bytes.
// Usage: sk_index_bench [--shards S] [--per-shard K] [--lookups L] [--threads T]
//                       [--budget BYTES]   (default: the reader's, 64MiB)
#include <fmt/format.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_memory.h"
#include "formats/wds/index_cache.h"
#include "pipeline/plan.h"
#include "shardkit/convert.h"
#include "shardkit/loader.h"

using namespace shardkit;
using namespace shardkit::formats::wds;
using sk_bench::Clock;

namespace {

using sk_bench::Ms;

// VmRSS and VmHWM of this process, in MB.
std::pair<double, double> RssMb() {
  sk_bench::Rss r = sk_bench::ProcessRss();
  return {r.now_mb, r.peak_mb};
}

uint64_t HeapBytes() { return mallinfo2().uordblks; }

// The procedural shard k: `per` samples, keys = the global index in 10 digits, each
// sample a 512-byte header + jpg of 20..100 kB, then a header + a 3-byte cls, in tar layout.
ShardIndex MakeShard(uint64_t k, uint64_t per) {
  ShardIndex idx;
  idx.path = fmt::format("synthetic-{:07d}.tar", k);
  idx.samples.reserve(per);
  uint64_t off = 0;
  for (uint64_t j = 0; j < per; ++j) {
    uint64_t g = k * per + j;
    uint64_t jpg = 20000 + pipeline::Mix64(g) % 80000;
    SampleRef s;
    s.key = fmt::format("{:010d}", g);
    s.offset = off;
    s.fields.push_back(FieldRef{"jpg", off + 512, jpg});
    off += 512 + (jpg + 511) / 512 * 512;
    s.fields.push_back(FieldRef{"cls", off + 512, 3});
    off += 1024;
    idx.samples.push_back(std::move(s));
  }
  idx.exts = {"cls", "jpg"};
  idx.file_size = off + 1024;
  return idx;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t shards = 1'000'000, per = 1000, lookups = 100'000;
  unsigned threads = 8;
  std::string budget_text;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--shards" && i + 1 < argc) shards = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--per-shard" && i + 1 < argc) per = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--lookups" && i + 1 < argc) lookups = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--threads" && i + 1 < argc) threads = unsigned(std::strtoul(argv[++i], nullptr, 10));
    else if (a == "--budget" && i + 1 < argc) budget_text = argv[++i];
    else {
      fmt::print(stderr, "usage: sk_index_bench [--shards S] [--per-shard K] [--lookups L] [--threads T] [--budget B]\n");
      return 2;
    }
  }
  if (shards == 0 || per == 0 || threads == 0) return 2;
  OpenOptions oo;
  if (!budget_text.empty()) oo.format_options["wds.index_budget"] = budget_text;
  auto budget = IndexBudgetOf(oo);
  if (!budget.ok()) {
    fmt::print(stderr, "{}\n", budget.status().ToString());
    return 2;
  }
  const uint64_t n = shards * per;

  // 1. Bytes per sample, before (ShardIndex) and after (CompactShardIndex).
  {
    uint64_t h0 = HeapBytes();
    ShardIndex big = MakeShard(7, per);
    uint64_t h1 = HeapBytes();
    auto c = CompactShardIndex::From(big, 7);
    if (!c.ok()) return 1;
    // The compact index is one block (a mapping of its own from 32 KiB on, which malloc's
    // statistics do not see): its size, rounded up to pages, is what it counts against the budget.
    fmt::print("index of one shard of {} samples (2 fields, 10-char keys): ShardIndex {:.1f} bytes/sample "
               "(malloc'd), compact {:.1f} bytes/sample (its block)\n\n",
               per, double(h1 - h0) / per, double((*c)->bytes()) / per);
  }

  fmt::print("| measure | samples | time | RSS now / peak |\n|---|---|---|---|\n");
  auto [rss0, hwm0] = RssMb();
  fmt::print("| (process before the plan) | | | {:.1f} / {:.1f} MB |\n", rss0, hwm0);

  // 2a. Loader rank 3 of 8: order, locator, cache, first lookup.
  auto t0 = Clock::now();
  ShardLocator locator;
  {
    std::vector<uint64_t> counts(shards, per);  // the manifest's counts
    locator = ShardLocator(counts);
  }
  ShardIndexCache cache(*budget, [per](size_t k) -> Result<ShardIndexCache::Index> {
    ShardIndex idx = MakeShard(k, per);
    return CompactShardIndex::From(idx, int64_t(k));
  });
  LoaderOptions lo;
  lo.seed = 1234;
  lo.shuffle = true;
  lo.rank = 3;
  lo.world_size = 8;
  lo.batch_size = 256;
  pipeline::RankOrder order(n, lo, 0);
  uint64_t g = order[0];
  auto [k, local] = locator.Locate(g);
  auto first = cache.Get(k);
  if (!first.ok()) return 1;
  std::string key((*first)->key(local));
  auto t1 = Clock::now();
  auto [rss1, hwm1] = RssMb();
  fmt::print("| loader rank 3 of 8: plan set-up + first lookup (sample {}, key {}) | {} | {:.1f} ms | {:.1f} / {:.1f} MB |\n",
             g, key, n, Ms(t0, t1), rss1, hwm1);
  if (key != fmt::format("{:010d}", g)) {
    fmt::print(stderr, "wrong sample: {} for {}\n", key, g);
    return 1;
  }

  // 2b. convert --part 417/1000 --samples-per-shard 10000 --shuffle --seed 7: the part's
  // first source index through the same locator and cache.
  t0 = Clock::now();
  const uint64_t per_out = 10000, parts = 1000, part = 417;
  const uint64_t out_shards = (n + per_out - 1) / per_out;
  const uint64_t begin = std::min(n, out_shards * part / parts * per_out);
  pipeline::Bijection shuffle(n, 7, pipeline::Mix64(0x53687566666c65ull));
  uint64_t src = shuffle(begin);
  auto [k2, local2] = locator.Locate(src);
  auto second = cache.Get(k2);
  if (!second.ok()) return 1;
  std::string key2((*second)->key(local2));
  t1 = Clock::now();
  auto [rss2, hwm2] = RssMb();
  fmt::print("| convert --part 417/1000: plan + first source lookup (sample {}, key {}) | {} | {:.3f} ms | {:.1f} / {:.1f} MB |\n",
             src, key2, n, Ms(t0, t1), rss2, hwm2);

  // 3. Random lookups from `threads` threads: thread t takes positions t, t+T, ... of the rank's order.
  std::atomic<uint64_t> bad{0};
  t0 = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (uint64_t p = t; p < lookups; p += threads) {
        uint64_t gi = order[p % order.size()];
        auto [kk, ll] = locator.Locate(gi);
        auto idx = cache.Get(kk);
        if (!idx.ok() || (*idx)->key(ll) != fmt::format("{:010d}", gi)) bad.fetch_add(1);
      }
    });
  for (auto& th : pool) th.join();
  t1 = Clock::now();
  auto st = cache.stats();
  auto [rss3, hwm3] = RssMb();
  fmt::print("| {} random lookups, {} threads ({} loads, {} hits, {} evictions; {} wrong) | {} | {:.2f} s ({:.1f} us/lookup) "
             "| {:.1f} / {:.1f} MB |\n",
             lookups, threads, st.loads, st.hits, st.evictions, bad.load(), n, Ms(t0, t1) / 1000,
             Ms(t0, t1) * 1000 / double(lookups), rss3, hwm3);
  fmt::print("| index cache: budget {:.1f} MiB, holds {:.1f} MiB in {} shards (peak {:.1f} MiB) | | | |\n",
             st.budget / 1048576.0, st.bytes / 1048576.0, st.entries, st.peak_bytes / 1048576.0);
  return bad.load() == 0 ? 0 : 1;
}
