// sk_parts_bench: the internet-scale goals of issue 15, on synthetic data (no source
// files needed).
//  1. Plans at 10^9 samples: the epoch order (a keyed bijection, pipeline/plan.h),
//     a loader rank's first index and share, a `convert --part`'s plan (shard
//     boundaries by samples per shard, the part's slice and its first source index);
//     set-up + first lookup time and the process's peak memory.
//  2. Merge of many parts' records (default 100,000 parts, one shard each, made here
//     in a scratch directory): the time of Merge() and the memory it adds.
// Usage: sk_parts_bench [--samples N] [--parts P] [--dir SCRATCH] [--skip-merge]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_memory.h"
#include "io/file.h"
#include "formats/wds/parts.h"
#include "pipeline/plan.h"
#include "shardkit/convert.h"
#include "shardkit/loader.h"

using namespace shardkit;
using sk_bench::Clock;

namespace {

using sk_bench::Ms;

// The process's peak resident memory (VmHWM), in MB.
double PeakMb() { return sk_bench::ProcessRss().peak_mb; }

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1'000'000'000ull, parts = 100'000;
  std::string dir = "/tmp/sk_parts_bench";
  bool merge = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--samples" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--parts" && i + 1 < argc) parts = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--skip-merge") merge = false;
    else {
      fmt::print(stderr, "usage: sk_parts_bench [--samples N] [--parts P] [--dir SCRATCH] [--skip-merge]\n");
      return 2;
    }
  }
  fmt::print("| measure | samples | time | peak RSS |\n|---|---|---|---|\n");
  // 1a. The epoch order and a loader rank's first index.
  auto t0 = Clock::now();
  pipeline::Bijection order(n, 1234, pipeline::PermutationStream(0));
  uint64_t first = order(0);
  auto t1 = Clock::now();
  fmt::print("| epoch order: set-up + first index ({}) | {} | {:.3f} ms | {:.1f} MB |\n", first, n, Ms(t0, t1), PeakMb());
  // 1b. The loader's plan as the loader holds it (pipeline::RankOrder, per position):
  // one rank of one, and rank 3 of 1024; then a rank's share written out.
  for (int world : {1, 1024}) {
    LoaderOptions lo;
    lo.seed = 1234;
    lo.shuffle = true;
    lo.rank = world == 1 ? 0 : 3;
    lo.world_size = world;
    lo.batch_size = 256;
    t0 = Clock::now();
    pipeline::RankOrder ro(n, lo, 0);
    uint64_t f = ro[0];
    t1 = Clock::now();
    fmt::print("| loader plan (RankOrder), rank {} of {}: set-up + first index ({}) of {} | {} | {:.3f} ms | {:.1f} MB |\n",
               lo.rank, world, f, ro.size(), n, Ms(t0, t1), PeakMb());
  }
  // 1c. A loader rank's share written out (rank 3 of 1024 ranks, batch 256).
  LoaderOptions o;
  o.seed = 1234;
  o.shuffle = true;
  o.rank = 3;
  o.world_size = 1024;
  o.batch_size = 256;
  t0 = Clock::now();
  std::vector<uint64_t> share = pipeline::LoaderEpochOrder(n, o, 0);
  t1 = Clock::now();
  fmt::print("| loader: rank 3 of 1024, its whole share ({} indices) | {} | {:.1f} ms | {:.1f} MB |\n", share.size(), n,
             Ms(t0, t1), PeakMb());
  share.clear();
  share.shrink_to_fit();
  // 1d. convert --part 417/1000 --samples-per-shard 10000 --shuffle: the shard plan, the
  // part's slice, its first source index.
  t0 = Clock::now();
  const uint64_t per_shard = 10000, count = 1000, index = 417;
  std::vector<uint64_t> counts;
  for (uint64_t left = n; left > 0; left -= std::min(left, per_shard)) counts.push_back(std::min(left, per_shard));
  const uint64_t a = counts.size() * index / count, b = counts.size() * (index + 1) / count;
  uint64_t begin = 0;
  for (uint64_t i = 0; i < a; ++i) begin += counts[i];
  pipeline::Bijection shuffle(n, 7, pipeline::Mix64(0x53687566666c65ull));
  uint64_t src = shuffle(begin);
  t1 = Clock::now();
  fmt::print("| convert --part 417/1000: plan of {} shards, shards {}..{}, first source index {} | {} | {:.3f} ms | {:.1f} MB |\n",
             counts.size(), a, b - 1, src, n, Ms(t0, t1), PeakMb());
  // Per-position cost of the order.
  t0 = Clock::now();
  uint64_t x = 0;
  for (uint64_t i = 0; i < 1'000'000; ++i) x ^= shuffle((begin + i) % n);  // positions < n only
  t1 = Clock::now();
  fmt::print("| 10^6 positions of the order (xor {:x}) | {} | {:.1f} ms | {:.1f} MB |\n", x & 0xfff, n, Ms(t0, t1), PeakMb());
  std::fflush(stdout);
  if (!merge) return 0;

  // 2. Merge: `parts` records of one shard each (tiny files; no DALI index).
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string pattern = dir + "/t-%07d.tar";
  WriteOptions w;
  w.write_index = false;
  w.part.count = parts;
  w.part.total_shards = parts;
  w.part.total_samples = parts * 100;
  w.part.plan = R"({"source":"synthetic","shards":)" + std::to_string(parts) + "}";
  t0 = Clock::now();
  for (uint64_t i = 0; i < parts; ++i) {
    std::string shard = fmt::format("{}/t-{:07d}.tar", dir, i);
    { std::ofstream(shard) << "x"; }
    { std::ofstream(shard + ".xxh3") << "x"; }
    w.part.index = i;
    w.part.first_shard = i;
    uint64_t total = 0;
    std::string text = formats::wds::PartRecordText(pattern, w, {"cls", "jpg"},
                                                    {ShardInfo{shard, 100, 1, "xxh3:0000000000000000", ""}}, 100, {}, &total);
    std::ofstream(formats::wds::PartRecordPath(pattern, i, parts)) << text;
  }
  t1 = Clock::now();
  fmt::print("| (set-up: {} records, shards and checksum files written) | | {:.0f} ms | |\n", parts, Ms(t0, t1));
  const double before = PeakMb();
  t0 = Clock::now();
  auto m = formats::wds::MergeParts(pattern, MergeOptions{});
  t1 = Clock::now();
  if (!m.ok()) {
    fmt::print(stderr, "merge failed: {}\n", m.status().ToString());
    return 1;
  }
  fmt::print("| merge of {} parts' records ({} shards, {} samples) | {} | {:.2f} s | {:.1f} MB (+{:.1f}) |\n", m->parts,
             m->shards, m->samples, m->samples, Ms(t0, t1) / 1000, PeakMb(), PeakMb() - before);
  std::fflush(stdout);
  std::filesystem::remove_all(dir);
  return 0;
}
