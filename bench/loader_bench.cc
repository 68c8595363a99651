// sk_loader_bench: images/s of the streaming reader against a full libjpeg-turbo decode.
//
//   sk_loader_bench ADDRESS [--threads N] [--batch B] [--size S] [--epochs E] [--repeat R] [--dtype T]
//                   [--block K] [--try VARIANT]... [--quality N] [--no-loader]
//
// (a) and (b1) alternate block by block (K images, default 20; R passes, timed per image
// and summed, the order of the paths rotating per block), so that load from other
// processes hits both alike; the Loader runs R times and the best rate is reported.
// --try adds a (b1) variant of the decoding ("ifast", "merged", "cover=X", comma
// separated: libjpeg's IFAST DCT, merged upsampling, LoaderOptions::dct_min_cover),
// timed in the same rotation. --quality N compares each (b1) variant on the first N
// JPEGs with the float64 reference of tests/decode_test.cc (0..255 units).
// --no-loader stops after (b1).
//
// ADDRESS is a dataset address, or a plain ImageFolder directory (read into memory here
// while the folder format is not in the library). Every image is held in memory first,
// so the numbers are decode + augment throughput, not disk throughput.
// (a) and (b1) are CPU-time rates (images per CPU-second of the thread), the Loader's
// are wall-clock rates with the process's CPU use beside them.
//   (a) full decode, 1 thread: tjDecompress2 to RGB (libjpeg-turbo; CMYK and PNG
//       images go through shardkit's decoder at full size instead)
//   (b) shardkit's decode + RandomResizedCrop + resize + flip + normalise, 1 thread:
//       b1 the bare per-image path, b2 the Loader with threads = 1
//   (c) the Loader with N threads; efficiency = rate(N) / (N * rate(1))
#include <sys/resource.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "decode/jpeg.h"
#include "pipeline/plan.h"
#include "pipeline/resize.h"
#include "shardkit/loader.h"
#include "shardkit/shardkit.h"

using namespace shardkit;
namespace fs = std::filesystem;

namespace {

class MemData : public RandomAccess {
 public:
  std::vector<Sample> samples;
  uint64_t size() const override { return samples.size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= samples.size()) return Status::NotFound("no such sample");
    *out = samples[i];
    return Status::OK();
  }
};

Result<std::shared_ptr<MemData>> LoadAll(const std::string& address) {
  auto mem = std::make_shared<MemData>();
  auto ds = Open(address);
  if (ds.ok()) {
    SK_ASSIGN_OR_RETURN(auto reader, (*ds)->NewReader());
    Sample s;
    for (;;) {
      SK_ASSIGN_OR_RETURN(bool more, reader->Next(&s));
      if (!more) break;
      Sample c;
      c.key = s.key;
      for (auto& f : s.fields) c.set(f.ext, Bytes::Copy(f.data.data(), f.data.size()));
      mem->samples.push_back(std::move(c));
    }
    return mem;
  }
  if (!fs::is_directory(address)) return ds.status();
  std::vector<fs::path> classes;
  for (auto& e : fs::directory_iterator(address))
    if (e.is_directory()) classes.push_back(e.path());
  std::sort(classes.begin(), classes.end());
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(classes[c]))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      Sample s;
      s.key = classes[c].filename().string() + "/" + f.stem().string();
      s.set("jpg", Bytes::Take(ss.str()));
      s.set_label(int64_t(c));
      mem->samples.push_back(std::move(s));
    }
  }
  return mem;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// CPU time of the calling thread: insensitive to preemption by other processes.
double ThreadCpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct LoaderRun {
  double images_per_s = 0;
  double wait_s = 0;   // consumer time inside Next()
  double total_s = 0;
  double cores = 0;    // process CPU seconds per wall second
};

Result<LoaderRun> RunLoaderOnce(std::shared_ptr<MemData> data, LoaderOptions o, int epochs) {
  SK_ASSIGN_OR_RETURN(auto l, Loader::Create(data, o));
  uint64_t images = 0;
  l->set_epoch(0);  // Create() started epoch 0 already; restart the clock with it
  double wait = 0, t0 = Now(), c0 = CpuSeconds();
  for (int e = 0; e < epochs; ++e) {
    l->set_epoch(uint64_t(e));
    for (;;) {
      double w0 = Now();
      SK_ASSIGN_OR_RETURN(Batch b, l->Next());
      wait += Now() - w0;
      if (b.end_of_epoch()) break;
      images += b.size();
    }
  }
  double t = Now() - t0;
  return LoaderRun{images / t, wait, t, (CpuSeconds() - c0) / t};
}

// A decoding variant: libjpeg settings and LoaderOptions::dct_min_cover.
struct Variant {
  decode::DecodeSettings s;
  double cover = LoaderOptions{}.dct_min_cover;
};

// "ifast,merged,cover=0.75" (or "default"): relative to the loader's defaults.
std::optional<Variant> ParseSettings(const std::string& spec) {
  Variant v;
  decode::DecodeSettings& s = v.s;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "ifast") s.fast_idct = true;
    else if (item == "islow") s.fast_idct = false;
    else if (item == "merged") s.fancy_upsampling = false;
    else if (item == "fancy") s.fancy_upsampling = true;
    else if (item.rfind("cover=", 0) == 0) v.cover = std::stod(item.substr(6));
    else if (item != "default") return std::nullopt;
  }
  return v;
}

// The float64 reference of the tests: integer crop of the full decode, PIL-style
// antialiased bilinear resize (separable), values 0..255, HWC.
std::vector<double> Reference(const uint8_t* px, int w, int bx, int by, int bw, int bh, int ow, int oh) {
  auto axis = [](int len, int out) {
    std::vector<std::vector<std::pair<int, double>>> taps(out);
    double scale = double(len) / out, fs = std::max(scale, 1.0);
    for (int i = 0; i < out; ++i) {
      double c = (i + 0.5) * scale, sum = 0;
      int lo = std::max(0, int(std::floor(c - fs + 0.5))), hi = std::min(len, int(std::floor(c + fs + 0.5)));
      for (int x = lo; x < hi; ++x) {
        double t = std::abs((x + 0.5 - c) / fs), v = t < 1 ? 1 - t : 0;
        taps[i].push_back({x, v});
        sum += v;
      }
      for (auto& p : taps[i]) p.second /= sum;
    }
    return taps;
  };
  auto tx = axis(bw, ow), ty = axis(bh, oh);
  std::vector<double> mid(size_t(oh) * bw * 3, 0.0), out(size_t(ow) * oh * 3, 0.0);
  for (int j = 0; j < oh; ++j)
    for (auto [y, wy] : ty[j])
      for (int x = 0; x < bw * 3; ++x) mid[size_t(j) * bw * 3 + x] += wy * px[(size_t(by + y) * w + bx) * 3 + x];
  for (int j = 0; j < oh; ++j)
    for (int i = 0; i < ow; ++i)
      for (auto [x, wx] : tx[i])
        for (int c = 0; c < 3; ++c) out[(size_t(j) * ow + i) * 3 + c] += wx * mid[(size_t(j) * bw + x) * 3 + c];
  return out;
}

int g_repeat = 3;
Result<LoaderRun> RunLoader(std::shared_ptr<MemData> data, LoaderOptions o, int epochs) {
  LoaderRun best;
  for (int r = 0; r < g_repeat; ++r) {
    SK_ASSIGN_OR_RETURN(LoaderRun x, RunLoaderOnce(data, o, epochs));
    if (x.images_per_s > best.images_per_s) best = x;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ADDRESS [--threads N] [--batch B] [--size S] [--epochs E] [--repeat R] [--dtype uint8|float32|float16|bfloat16]\n", argv[0]);
    return 2;
  }
  std::string address = argv[1];
  int threads = int(std::thread::hardware_concurrency()), batch = 256, size = 224, epochs = 1, repeat = 3;
  DType dtype = DType::kFloat32;
  bool no_loader = false;
  int quality_n = 0, block = 20;
  std::vector<std::pair<std::string, Variant>> variants;
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--no-loader") {
      no_loader = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") threads = std::stoi(v);
    else if (k == "--batch") batch = std::stoi(v);
    else if (k == "--size") size = std::stoi(v);
    else if (k == "--epochs") epochs = std::stoi(v);
    else if (k == "--repeat") repeat = std::max(1, std::stoi(v));
    else if (k == "--quality") quality_n = std::stoi(v);
    else if (k == "--block") block = std::max(1, std::stoi(v));
    else if (k == "--try") {
      auto st = ParseSettings(v);
      if (!st) { std::fprintf(stderr, "bad --try %s (ifast,merged,cover=X,default)\n", v.c_str()); return 2; }
      variants.emplace_back(v, *st);
    }
    else if (k == "--dtype") dtype = v == "uint8" ? DType::kUint8 : v == "float16" ? DType::kFloat16 : v == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  g_repeat = repeat;
  auto loaded = LoadAll(address);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  auto data = *loaded;
  uint64_t bytes = 0;
  for (auto& s : data->samples) bytes += s.bytes();
  fmt::print("{} images, {:.1f} MB in memory; output {}x{} {}, batch {}, {} epoch(s), best of {}\n", data->samples.size(),
             bytes / 1e6, size, size, DTypeName(dtype), batch, epochs, repeat);

  // (a) and (b1) interleaved image by image, so that other processes' load drifts
  // affect both alike: per image, a full decode, then shardkit's crop path (with the
  // loader's default DecodeSettings), then each --try variant.
  variants.insert(variants.begin(), {fmt::format("loader default, cover={}", Variant{}.cover), Variant{}});
  const size_t nv = variants.size();
  double rate_a = 0;
  {
    tjhandle tj = tjInitDecompress();
    decode::ImageDecoder full_dec;
    std::vector<std::unique_ptr<decode::ImageDecoder>> decs;
    for (auto& v : variants) decs.push_back(std::make_unique<decode::ImageDecoder>(decode::Limits{}, v.second.s));
    std::vector<uint8_t> px;
    pipeline::Resizer rs;
    pipeline::OutputSpec spec;
    spec.width = spec.height = size;
    spec.dtype = dtype;
    std::vector<uint8_t> out(size_t(size) * size * 3 * DTypeSize(dtype));
    pipeline::RrcParams p;
    std::vector<std::map<int, uint64_t>> scales(nv);
    uint64_t pixels = 0, fallback = 0, n = 0;
    double ta = 0;
    std::vector<double> tb(nv, 0.0);
    for (int rep = 0; rep < repeat; ++rep)
      for (int e = 0; e < epochs; ++e)
        for (uint64_t blk = 0; blk < data->samples.size(); blk += block) {
          const uint64_t blk_end = std::min<uint64_t>(data->samples.size(), blk + block);
          // Per block of `block` images, each path decodes the block in turn, in a
          // rotating order: a path that runs right after another finds the caches
          // holding the other's buffers, so per-image alternation (block 1) charges each
          // path for the other's cache pollution; blocks measure each path warm, as
          // a loader thread runs it, while load drifts still hit all paths alike.
          for (size_t step = 0; step <= nv; ++step) {
            const size_t path = (step + blk / block) % (nv + 1);
            for (uint64_t i = blk; i < blk_end; ++i) {
              const Bytes& b = data->samples[i].image()->data;
              if (path == nv) {
                double t0 = ThreadCpu();
                int w, h, sub, cs;
                if (tjDecompressHeader3(tj, b.data(), b.size(), &w, &h, &sub, &cs) == 0 && cs != TJCS_CMYK && cs != TJCS_YCCK) {
                  px.resize(size_t(w) * h * 3);
                  if (tjDecompress2(tj, b.data(), b.size(), px.data(), w, 0, h, TJPF_RGB, 0) != 0)
                    std::fprintf(stderr, "%s: %s\n", data->samples[i].key.c_str(), tjGetErrorStr2(tj));
                  pixels += uint64_t(w) * h;
                } else {  // tjDecompress2 cannot give RGB from CMYK; PNG is not a JPEG
                  decode::Region r;
                  Status st = full_dec.Decode(b.data(), b.size(),
                                              [](const decode::ImageInfo& in) { return pipeline::CropBox{0, 0, double(in.width), double(in.height)}; },
                                              0, 0, &r);
                  if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
                  ++fallback;
                }
                ta += ThreadCpu() - t0;
                continue;
              }
              const size_t v = path;
              double t1 = ThreadCpu();
              pipeline::Augment aug;
              decode::Region r;
              Status st = decs[v]->Decode(b.data(), b.size(),
                                          [&](const decode::ImageInfo& info) {
                                            aug = pipeline::TrainAugment(0, uint64_t(e), i, info.width, info.height, p);
                                            return aug.box;
                                          },
                                          size * variants[v].second.cover, size * variants[v].second.cover, &r);
              if (st.ok()) {
                ++scales[v][r.scale_num];
                rs.Run(r.pixels, r.stride, r.width, r.height, r.box, aug.flip, spec, out.data());
              } else {
                std::fprintf(stderr, "%s\n", st.ToString().c_str());
              }
              tb[v] += ThreadCpu() - t1;
            }
          }
          n += blk_end - blk;
        }
    rate_a = n / ta;
    fmt::print("(a)  full decode (tjDecompress2 RGB), 1 thread:        {:8.1f} images/CPU-s ({:.0f} Mpx/s; {} CMYK/PNG via shardkit)\n",
               rate_a, pixels / ta / 1e6, fallback);
    for (size_t v = 0; v < nv; ++v) {
      std::string sc;
      for (auto [k, c] : scales[v]) sc += fmt::format(" {}/8:{}", k, c);
      fmt::print("(b1) shardkit decode+RRC+resize, bare, 1 thread:       {:8.1f} images/CPU-s ratio to (a) {:.2f}  [{}] (DCT scales{})\n",
                 n / tb[v], n / tb[v] / rate_a, variants[v].first, sc);
    }

    // Quality: the first quality_n JPEGs against the float64 reference of the tests
    // (full decode with default settings, integer crop box, antialiased bilinear).
    if (quality_n > 0) {
      pipeline::OutputSpec unit;
      unit.width = unit.height = size;
      unit.dtype = DType::kFloat32;
      unit.layout = Layout::kNHWC;
      for (int c = 0; c < 3; ++c) unit.mean[c] = 0, unit.std[c] = 1;
      std::vector<float> o(size_t(size) * size * 3);
      std::vector<double> sum(nv, 0), mx(nv, 0), worst_mean(nv, 0), sq(nv, 0);
      std::vector<std::vector<double>> img_means(nv);
      uint64_t values = 0, imgs = 0;
      for (uint64_t i = 0; i < data->samples.size() && int(imgs) < quality_n; ++i) {
        const Bytes& b = data->samples[i].image()->data;
        int w, h, sub, cs;
        if (tjDecompressHeader3(tj, b.data(), b.size(), &w, &h, &sub, &cs) != 0 || cs == TJCS_CMYK || cs == TJCS_YCCK) continue;
        px.resize(size_t(w) * h * 3);
        if (tjDecompress2(tj, b.data(), b.size(), px.data(), w, 0, h, TJPF_RGB, 0) != 0) continue;
        pipeline::Augment aug = pipeline::TrainAugment(0, 0, i, w, h, p);
        auto ref = Reference(px.data(), w, int(aug.box.x), int(aug.box.y), int(aug.box.w), int(aug.box.h), size, size);
        for (size_t v = 0; v < nv; ++v) {
          decode::Region r;
          Status st = decs[v]->Decode(b.data(), b.size(), [&](const decode::ImageInfo&) { return aug.box; },
                                      size * variants[v].second.cover, size * variants[v].second.cover, &r);
          if (!st.ok()) continue;
          rs.Run(r.pixels, r.stride, r.width, r.height, r.box, false, unit, o.data());
          double s1 = 0;
          for (size_t k = 0; k < ref.size(); ++k) {
            double d = std::abs(double(o[k]) * 255.0 - ref[k]);
            s1 += d;
            sq[v] += d * d;
            mx[v] = std::max(mx[v], d);
          }
          sum[v] += s1;
          worst_mean[v] = std::max(worst_mean[v], s1 / ref.size());
          img_means[v].push_back(s1 / ref.size());
        }
        values += ref.size();
        ++imgs;
      }
      for (size_t v = 0; v < nv; ++v) {
        auto m = img_means[v];
        std::sort(m.begin(), m.end());
        double p99 = m.empty() ? 0 : m[std::min(m.size() - 1, size_t(m.size() * 0.99))];
        fmt::print("     quality [{}] on {} images vs float64 reference (0..255): mean |err| {:.3f}, rms {:.3f}, "
                   "per-image mean p99 {:.3f} worst {:.3f}, max {:.1f}\n",
                   variants[v].first, imgs, sum[v] / values, std::sqrt(sq[v] / values), p99, worst_mean[v], mx[v]);
      }
    }
    tjDestroy(tj);
  }
  if (no_loader) return 0;

  LoaderOptions o;
  o.batch_size = uint32_t(batch);
  o.output_width = o.output_height = size;
  o.dtype = dtype;
  o.layout = dtype == DType::kUint8 ? Layout::kNHWC : Layout::kNCHW;
  o.rank = 0;
  o.world_size = 1;
  o.threads = 1;
  o.prefetch = 3;
  auto r1 = RunLoader(data, o, epochs);
  if (!r1.ok()) {
    std::fprintf(stderr, "%s\n", r1.status().ToString().c_str());
    return 1;
  }
  fmt::print("(b2) Loader, 1 thread:                                 {:8.1f} images/s  ratio to (a) {:.2f}  (CPU {:.2f} cores; {:.1f} images/CPU-s, ratio {:.2f})\n",
             r1->images_per_s, r1->images_per_s / rate_a, r1->cores, r1->images_per_s / r1->cores,
             r1->images_per_s / r1->cores / rate_a);
  for (int t = 2; t <= threads; t *= 2) {
    if (t * 2 > threads && t != threads) t = threads;
    o.threads = t;
    o.prefetch = std::max(3, t / 4 + 2);
    auto rn = RunLoader(data, o, epochs);
    if (!rn.ok()) {
      std::fprintf(stderr, "%s\n", rn.status().ToString().c_str());
      return 1;
    }
    fmt::print("(c)  Loader, {:2d} threads:                               {:8.1f} images/s  efficiency {:.2f}  (CPU {:.2f} cores, consumer waited {:.0f}%)\n",
               t, rn->images_per_s, rn->images_per_s / (t * r1->images_per_s), rn->cores, 100 * rn->wait_s / rn->total_s);
    if (t == threads) break;
  }
  return 0;
}
