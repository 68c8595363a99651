// shardkit/bench.h: random-read latency and read throughput of datasets.
//
// RunBench() reads samples of one or more datasets through the random-access
// interface (in a seeded random order) and/or the sequential reader, with one
// or more thread counts, and reports latency percentiles, throughput and CPU
// time per sample. Several datasets are measured interleaved (round-robin in
// slices) so that a comparison holds on a noisy machine. Each run also
// measures its own floor: a memcpy of the same sample sizes from memory, and
// the first dataset held in memory.
//
// Thread safety: RunBench() may be called from any thread; it starts and joins
// its own worker threads. It is not meant to run concurrently with itself
// (the measurements would disturb each other).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardkit/loader.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

struct BenchOptions {
  bool random = true;                 // random mode (by index, seeded order)
  bool sequential = false;            // sequential mode (stream in dataset order)
  std::vector<int> threads = {1};     // thread counts to measure
  uint64_t samples = 0;               // samples per measured pass (0: min(size, 20000))
  double seconds = 0;                 // or: size each pass to take about this long (calibrated)
  bool cold = false;                  // drop the files from the page cache before each pass
  uint64_t seed = 0;                  // random order
  int slices = 8;                     // interleaving: each pass is cut into this many slices
  bool floor = true;                  // measure the memcpy floor and the in-memory dataset
  OpenOptions open;                   // for every dataset (e.g. cache_dir of remote shards)
};

// Latency percentiles of single whole-sample reads, in microseconds.
struct LatencyStats {
  uint64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};

struct BenchRow {
  std::string dataset;   // address as given ("memory:<address>" / "floor:memcpy" for the floor rows)
  std::string format;    // "folder", "wds", ... ("memory", "memcpy")
  std::string mode;      // "random-view", "random-copy", "sequential"
  int threads = 1;
  LatencyStats latency;
  double samples_per_s = 0;
  double mb_per_s = 0;            // payload MB (1e6 bytes) per second (random-view: bytes handed out,
                                  // not moved; the table prints "view")
  double cpu_us_per_sample = 0;   // process CPU time / samples
  bool cold = false;
  double cache_kept = 0;          // with cold: share of file pages the kernel kept resident (0..1)
  uint64_t bytes = 0;             // payload bytes read in the pass
  // One file per sample (DatasetInfo::file_per_sample, an image folder): the
  // first such row of a mode and thread count is the "vs baseline" reference.
  bool baseline = false;
};

struct BenchReport {
  std::vector<BenchRow> rows;
  std::vector<std::string> notes;  // e.g. "kernel kept 12% of pages of x.tar after DONTNEED"
  // Per dataset and mode, the sorted latencies (us) of the last single-thread pass,
  // for CDF plots: {row index, latencies}.
  std::vector<std::pair<size_t, std::vector<float>>> cdfs;
};

using BenchProgress = std::function<void(const std::string& what)>;

SHARDKIT_API Result<BenchReport> RunBench(const std::vector<std::string>& addresses, const BenchOptions& opts,
                             const BenchProgress& progress = nullptr);

// The random read order: `n` indices drawn from [0, size) by a seeded
// permutation (repeating the permutation when n > size). Same seed, same order,
// on every machine.
SHARDKIT_API std::vector<uint64_t> BenchOrder(uint64_t seed, uint64_t size, uint64_t n);

// Percentiles by nearest rank over `us` (sorted in place).
SHARDKIT_API LatencyStats ComputeLatency(std::vector<float>& us);

// The whole input pipeline, as a training loop sees it: the streaming reader's
// batches/s and images/s, and how long the consumer waited in Next() for each
// batch. With step_ms > 0 the consumer spends that long per batch (a stand-in
// for a training step, busy-waiting), and stall_share is the share of the wall
// time it spent waiting: the part of a GPU's time lost to the input pipeline.
struct LoaderBenchOptions {
  LoaderOptions loader;
  uint64_t batches = 0;   // batches to time (0: one epoch, at most 200); a first one is untimed
  double step_ms = 0;     // simulated consumer work per batch
  OpenOptions open;       // for the dataset (e.g. cache_dir of remote shards)
};

struct LoaderBenchResult {
  std::string dataset;
  int threads = 0;
  uint32_t batch_size = 0;
  uint64_t batches = 0, images = 0;
  double seconds = 0;
  double batches_per_s = 0, images_per_s = 0;
  LatencyStats wait_ms;      // the consumer's wait in Next(), per batch, in milliseconds
  double stall_share = 0;    // waiting / wall time; meaningful only with step_ms > 0 (the
                             // table prints "-" and the JSON null without a step)
  double step_ms = 0;
};

SHARDKIT_API Result<LoaderBenchResult> RunLoaderBench(const std::string& address, const LoaderBenchOptions& opts);
// (The table, JSON and SVG renderings are the command's: lib/pipeline/bench_render.h.)

}  // namespace shardkit
