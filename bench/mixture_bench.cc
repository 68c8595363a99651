// sk_mixture_bench: issue 42's figures.
//
//   sk_mixture_bench loader ONE A B C [--threads N] [--rounds R] [--epochs E] [--batch B]
//     images/s of the CPU loader over ONE (one dataset) against the mixture of A, B and C
//     (each source once per epoch: repeat = 1), alternating R rounds (default 3, after a
//     warm-up round) of E epochs each (default 2), then the medians and their ratio
//     (mixture / one). The goal: >= 0.95.
//   sk_mixture_bench resume --samples N [--from W] [--to W2] [--batch B]
//     an elastic resume: a state saved by rank 0 of W ranks (default 64) half way through
//     an epoch of N procedural samples (one small JPEG each) restored by rank 0 of W2 ranks
//     (default 48): restore() plus the first Next(), and the process's resident memory
//     before and after, at positions 0.1%, 50% and 99.9% of the epoch; then the mixture
//     order's lookups for one batch at the same positions of a 3-source mixture of N.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench_memory.h"
#include "decode/encode.h"
#include "pipeline/plan.h"
#include "shardkit/loader.h"

using namespace shardkit;
using sk_bench::Clock;
using sk_bench::Ms;

namespace {

// N samples, every one the same small JPEG, keyed by its index: the loader's plan and
// bookkeeping at scale without a dataset on disk.
class Procedural : public RandomAccess {
 public:
  Procedural(uint64_t n, Bytes jpeg) : n_(n), jpeg_(std::move(jpeg)) {}
  uint64_t size() const override { return n_; }
  Status Get(uint64_t i, Sample* out) const override {
    out->fields.clear();
    out->key = fmt::format("{:012d}", i);
    out->set("jpg", jpeg_);
    out->set_label(int64_t(i % 1000));
    return Status::OK();
  }

 private:
  uint64_t n_;
  Bytes jpeg_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Images/s over `epochs` epochs from epoch e.
double Epochs(Loader& l, uint64_t e, int epochs) {
  uint64_t images = 0;
  const auto t0 = Clock::now();
  for (int k = 0; k < epochs; ++k) {
  l.set_epoch(e + uint64_t(k));
  for (;;) {
    auto b = l.Next();
    if (!b.ok()) {
      fmt::print(stderr, "{}\n", b.status().ToString());
      std::exit(1);
    }
    if (b->end_of_epoch()) break;
    images += b->size();
  }
  }
  return double(images) / (Ms(t0, Clock::now()) / 1000);
}

int LoaderBench(int argc, char** argv) {
  std::vector<std::string> pos;
  int threads = 2, rounds = 3, epochs = 2;
  uint32_t batch = 256;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--epochs" && i + 1 < argc) epochs = std::atoi(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = uint32_t(std::atoi(argv[++i]));
    else pos.push_back(a);
  }
  if (pos.size() != 4) {
    fmt::print(stderr, "usage: sk_mixture_bench loader ONE A B C [--threads N] [--rounds R] [--batch B]\n");
    return 2;
  }
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = threads;
  o.rank = 0;
  o.world_size = 1;
  o.dtype = DType::kUint8;
  o.layout = Layout::kNHWC;
  o.prefetch_next_epoch = false;  // a loader idles while the other is timed
  auto one = Loader::Create(pos[0], o);
  LoaderOptions m = o;
  for (int i = 1; i <= 3; ++i) m.sources.push_back(MixSourceSpec{.address = pos[size_t(i)], .repeat = 1});
  auto mix = Loader::Create(m);
  if (!one.ok() || !mix.ok()) {
    fmt::print(stderr, "{}\n", (!one.ok() ? one.status() : mix.status()).ToString());
    return 1;
  }
  fmt::print("one: {} samples; mixture: {} per epoch; {} threads, batch {}\n", (*one)->num_samples(),
             (*mix)->epoch_size(), threads, batch);
  // A warm-up round (both loaders start decoding epoch 0 at Create), then `rounds`.
  std::vector<double> r1, rm;
  for (int r = 0; r <= rounds; ++r) {
    const uint64_t e = uint64_t(1 + r * epochs);
    const double a = Epochs(**one, e, epochs), b = Epochs(**mix, e, epochs);
    if (r == 0) continue;
    r1.push_back(a);
    rm.push_back(b);
    fmt::print("round {}: one {:.0f} images/s, mixture {:.0f} images/s\n", r, a, b);
  }
  fmt::print("median: one {:.0f}, mixture {:.0f} images/s; mixture / one = {:.3f}\n", Median(r1), Median(rm),
             Median(rm) / Median(r1));
  return 0;
}

int ResumeBench(int argc, char** argv) {
  uint64_t n = 1'000'000;
  int from = 64, to = 48;
  uint32_t batch = 256;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--samples" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--from" && i + 1 < argc) from = std::atoi(argv[++i]);
    else if (a == "--to" && i + 1 < argc) to = std::atoi(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = uint32_t(std::atoi(argv[++i]));
  }
  std::vector<uint8_t> px(64 * 48 * 3, 128);
  decode::EncodeSpec js;
  js.png = false;  // JPEG, quality 90
  auto jpeg = decode::EncodePixels(px.data(), 64, 48, 3, 64 * 3, js);
  if (!jpeg.ok()) return 1;
  auto data = std::make_shared<Procedural>(n, std::move(*jpeg));
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = 2;
  o.prefetch = 2;
  o.output_width = o.output_height = 32;
  o.dtype = DType::kUint8;
  o.layout = Layout::kNHWC;
  o.seed = 7;
  o.rank = 0;
  o.world_size = to;
  o.prefetch_next_epoch = false;
  fmt::print("elastic resume: {} samples, rank 0 of {} -> rank 0 of {}, batch {}\n", n, from, to, batch);
  fmt::print("| position | restore + first batch | resident before | after |\n| --- | --- | --- | --- |\n");
  for (double frac : {0.001, 0.5, 0.999}) {
    auto l = Loader::Create(data, o);
    if (!l.ok()) {
      fmt::print(stderr, "{}\n", l.status().ToString());
      return 1;
    }
    // A state of rank 0 of `from` ranks after b batches (every rank in step).
    const uint64_t global = uint64_t(batch) * uint64_t(from);
    const uint64_t b = uint64_t(frac * double(n)) / global;
    LoaderState s;
    s.seed = o.seed;
    s.epoch = 3;
    s.next_batch = b;
    s.num_samples = n;
    s.rank = 0;
    s.world_size = from;
    s.batch_size = batch;
    s.epoch_size = n;
    s.position = std::min(n, b * global);
    const auto before = sk_bench::ProcessRss();
    const auto t0 = Clock::now();
    Status st = (*l)->restore(s);
    auto first = st.ok() ? (*l)->Next() : Result<Batch>(st);
    const double ms = Ms(t0, Clock::now());
    if (!first.ok()) {
      fmt::print(stderr, "{}\n", first.status().ToString());
      return 1;
    }
    const auto after = sk_bench::ProcessRss();
    fmt::print("| {} ({:.1f}%) | {:.1f} ms | {:.0f} MB | {:.0f} MB |\n", s.position, 100.0 * double(s.position) / double(n),
               ms, before.now_mb, after.now_mb);
  }
  // The mixture's order at scale: one batch of lookups (the loader's per-row cost).
  std::vector<pipeline::MixSource> src = {{.size = n / 2, .count = n / 2}, {.size = n / 3, .count = n / 3},
                                          {.size = n / 10, .count = n - n / 2 - n / 3}};
  auto mixp = std::make_shared<const pipeline::Mixture>(std::move(src));
  pipeline::EpochOrder ord(mixp, 7, 3, true);
  fmt::print("\n3-source mixture of {} positions: {} lookups (one batch)\n", ord.size(), batch);
  for (double frac : {0.001, 0.5, 0.999}) {
    const uint64_t p = uint64_t(frac * double(ord.size()));
    uint64_t sink = 0;
    const auto t0 = Clock::now();
    for (uint64_t k = 0; k < batch && p + k < ord.size(); ++k) sink ^= ord(p + k);
    fmt::print("  at {:.1f}%: {:.3f} ms ({})\n", frac * 100, Ms(t0, Clock::now()), sink & 1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "loader") return LoaderBench(argc, argv);
  if (mode == "resume") return ResumeBench(argc, argv);
  fmt::print(stderr, "usage: sk_mixture_bench loader ONE A B C [...] | resume --samples N [...]\n");
  return 2;
}
