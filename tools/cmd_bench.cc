// `shardkit bench`: random-read latency and read throughput, side by side.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <unistd.h>

#include "pipeline/bench_render.h"
#include "cli.h"
#include "io/file.h"
#include "shardkit/bench.h"

namespace shardkit::cli {

namespace {
bool ParseThreads(const std::string& s, std::vector<int>* out) {
  out->clear();
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      size_t used = 0;
      int v = std::stoi(part, &used);
      if (used != part.size() || v < 1 || v > 1024) return false;
      out->push_back(v);
    } catch (...) {
      return false;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !out->empty();
}
}  // namespace

RunFn SetupBench(CLI::App* sub) {
  struct Flags {
    std::vector<std::string> addresses;
    std::string mode = "random";
    std::string threads = "1";
    uint64_t samples = 0;
    double seconds = 0;
    bool cold = false;
    uint64_t seed = 0;
    bool json = false;
    std::string plot;
    bool no_floor = false;
    bool loader = false;
    uint32_t batch_size = 256;
    uint64_t batches = 0;
    double step_ms = 0;
    std::string dtype = "float32";
    uint64_t max_pixels = 200'000'000;
    OpenOptions open;  // --cache-dir / --cache-bytes, then the environment
  };
  auto f = std::make_shared<Flags>();
  AddCacheOptions(sub, &f->open);
  sub->add_option("DATASET", f->addresses,
                  "One or more dataset addresses (the same data in different formats, and the source folder "
                  "as the one-file-per-sample baseline); measured interleaved")
      ->required();
  sub->add_option("--mode", f->mode, "random (by index, seeded order), sequential (stream in order), or both")
      ->check(CLI::IsMember({"random", "sequential", "both"}));
  sub->add_option("--threads", f->threads, "Comma-separated thread counts to measure, e.g. 1,2,4 (default 1)");
  auto* samples = sub->add_option("--samples", f->samples,
                                  "Samples per measured pass (default: the dataset size, at most 20000)");
  sub->add_option("--seconds", f->seconds, "Instead of --samples: about this many seconds per measured pass")
      ->excludes(samples);
  sub->add_flag("--cold", f->cold,
                "Drop the datasets' files from the page cache (posix_fadvise DONTNEED) before each slice of "
                "each pass, so the figures show storage, not memory; without it a warm-up pass runs first");
  sub->add_option("--seed", f->seed, "Seed of the random read order (default 0)");
  sub->add_flag("--json", f->json, "Print the report as JSON (schema shardkit-bench-v1, see docs/bench.md)");
  sub->add_option("--plot", f->plot, "Write an SVG with the latency CDFs and throughput versus threads");
  sub->add_flag("--no-floor", f->no_floor, "Skip the memcpy floor and the in-memory dataset rows");
  sub->add_flag("--loader", f->loader,
                "Measure the whole input pipeline instead: the streaming reader (RandomResizedCrop 224, flip, "
                "normalize) with each --threads count; reports batches/s, images/s and the consumer's wait");
  sub->add_option("--batch-size", f->batch_size, "With --loader: images per batch (default 256)");
  sub->add_option("--batches", f->batches, "With --loader: batches to time (default one epoch, at most 200)");
  sub->add_option("--step-ms", f->step_ms,
                  "With --loader: simulated training step per batch in ms; the stall column is then the share "
                  "of time a training step would wait for input");
  sub->add_option("--dtype", f->dtype, "With --loader: float32, float16, bfloat16 or uint8 (default float32)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16", "uint8"}));
  sub->add_option("--max-pixels", f->max_pixels,
                  "With --loader: images declaring more pixels (width x height) are refused (decompression-bomb "
                  "guard)")
      ->default_val(f->max_pixels)
      ->check(CLI::PositiveNumber);
  sub->footer(std::string("Reports per dataset, mode and thread count: latency p50/p90/p99/p99.9/max of whole-sample\n"
                          "reads (us), samples/s, MB/s and CPU us per sample. random-view hands out zero-copy views;\n"
                          "random-copy also copies the bytes into the caller's buffer. The floor rows are a memcpy\n"
                          "of the same sizes and the first dataset held in memory, measured in the same run.\n"
                          "Examples:\n"
                          "  shardkit bench images/ out/train.manifest.json lmdb:train.lmdb train.h5\n"
                          "  shardkit bench train.lmdb --threads 1,2,4,8 --seconds 5 --plot bench.svg\n"
                          "  shardkit bench out/train.manifest.json --mode both --cold --json\n"
                          "  shardkit bench out/train.manifest.json --loader --threads 1,2 --step-ms 50\n"
                          "  shardkit bench 'pipe:cat train-000000.tar' --mode sequential   (a stream: no random access)\n") +
              kEnvironmentHelp + kExitHelp);
  return [f]() -> int {
    if (Status st = OpenOptionsFromEnvironment(&f->open); !st.ok()) return UsageError(st.message());
    if (f->loader) {
      std::vector<int> threads;
      if (!ParseThreads(f->threads, &threads))
        return UsageError(fmt::format("--threads: '{}' is not a comma-separated list of thread counts", f->threads));
      if (f->batch_size == 0) return UsageError("--batch-size must be at least 1");
      std::vector<LoaderBenchResult> rows;
      for (const auto& a : f->addresses)
        for (int t : threads) {
          LoaderBenchOptions o;
          o.loader.threads = t;
          o.loader.batch_size = f->batch_size;
          o.loader.max_pixels = f->max_pixels;
          o.loader.rank = 0;
          o.loader.world_size = 1;
          o.loader.dtype = f->dtype == "uint8"      ? DType::kUint8
                           : f->dtype == "float16"  ? DType::kFloat16
                           : f->dtype == "bfloat16" ? DType::kBFloat16
                                                    : DType::kFloat32;
          o.loader.layout = o.loader.dtype == DType::kUint8 ? Layout::kNHWC : Layout::kNCHW;
          o.batches = f->batches;
          o.step_ms = f->step_ms;
          o.open = f->open;
          auto r = RunLoaderBench(a, o);
          if (!r.ok()) return Fail(r.status());
          rows.push_back(*r);
        }
      std::fputs(f->json ? LoaderBenchJson(rows).c_str() : LoaderBenchTable(rows).c_str(), stdout);
      return kExitOk;
    }
    BenchOptions o;
    o.random = f->mode != "sequential";
    o.sequential = f->mode != "random";
    if (!ParseThreads(f->threads, &o.threads))
      return UsageError(fmt::format("--threads: '{}' is not a comma-separated list of thread counts (1..1024)",
                                    f->threads));
    o.samples = f->samples;
    o.seconds = f->seconds;
    o.cold = f->cold;
    o.seed = f->seed;
    o.floor = !f->no_floor;
    o.open = f->open;
    bool tty = ::isatty(2);
    auto progress = [tty](const std::string& what) {
      if (tty) std::fprintf(stderr, "\r\033[Kbench: %s", what.c_str());
    };
    auto r = RunBench(f->addresses, o, progress);
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (!r.ok()) return Fail(r.status());
    if (!f->plot.empty()) {
      Status st = io::WriteFileAtomic(f->plot, BenchSvg(*r));
      if (!st.ok()) return Fail(st);
    }
    std::fputs(f->json ? BenchJson(*r).c_str() : BenchTable(*r).c_str(), stdout);
    return kExitOk;
  };
}

}  // namespace shardkit::cli
