// sk_loader_bench: images/s of the streaming reader against a full libjpeg-turbo decode.
//
//   sk_loader_bench ADDRESS [--threads N] [--batch B] [--size S] [--epochs E] [--repeat R] [--dtype T]
//
// (a) and (b1) alternate image by image (R passes, timed per image and summed), so that
// load from other processes hits both alike; the Loader runs R times and the best rate
// is reported.
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
#include <map>
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
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") threads = std::stoi(v);
    else if (k == "--batch") batch = std::stoi(v);
    else if (k == "--size") size = std::stoi(v);
    else if (k == "--epochs") epochs = std::stoi(v);
    else if (k == "--repeat") repeat = std::max(1, std::stoi(v));
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
  // affect both alike: per image, a full decode, then shardkit's crop path.
  double rate_a = 0, rate_b1 = 0;
  {
    tjhandle tj = tjInitDecompress();
    decode::ImageDecoder full_dec, dec;
    std::vector<uint8_t> px;
    pipeline::Resizer rs;
    pipeline::OutputSpec spec;
    spec.width = spec.height = size;
    spec.dtype = dtype;
    std::vector<uint8_t> out(size_t(size) * size * 3 * DTypeSize(dtype));
    pipeline::RrcParams p;
    std::map<int, uint64_t> scales;
    uint64_t pixels = 0, fallback = 0, n = 0;
    double ta = 0, tb = 0;
    for (int rep = 0; rep < repeat; ++rep)
      for (int e = 0; e < epochs; ++e)
        for (uint64_t i = 0; i < data->samples.size(); ++i) {
          const Bytes& b = data->samples[i].image()->data;
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
          double t1 = ThreadCpu();
          pipeline::Augment aug;
          decode::Region r;
          Status st = dec.Decode(b.data(), b.size(),
                                 [&](const decode::ImageInfo& info) {
                                   aug = pipeline::TrainAugment(0, uint64_t(e), i, info.width, info.height, p);
                                   return aug.box;
                                 },
                                 size, size, &r);
          if (st.ok()) {
            ++scales[r.scale_num];
            rs.Run(r.pixels, r.stride, r.width, r.height, r.box, aug.flip, spec, out.data());
          } else {
            std::fprintf(stderr, "%s\n", st.ToString().c_str());
          }
          double t2 = ThreadCpu();
          ta += t1 - t0;
          tb += t2 - t1;
          ++n;
        }
    tjDestroy(tj);
    rate_a = n / ta;
    rate_b1 = n / tb;
    fmt::print("(a)  full decode (tjDecompress2 RGB), 1 thread:        {:8.1f} images/CPU-s ({:.0f} Mpx/s; {} CMYK/PNG via shardkit)\n",
               rate_a, pixels / ta / 1e6, fallback);
    std::string sc;
    for (auto [k, v] : scales) sc += fmt::format(" {}/8:{}", k, v);
    fmt::print("(b1) shardkit decode+RRC+resize, bare, 1 thread:       {:8.1f} images/CPU-s ratio to (a) {:.2f}  (DCT scales{})\n",
               rate_b1, rate_b1 / rate_a, sc);
  }

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
