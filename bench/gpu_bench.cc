// shardkit_gpu_bench: images/s of the ways shardkit can feed a GPU, on an image folder
// (the corpus of ../shared/corpus/make_corpus.py), held in memory so that storage is out
// of the measurement.
//
//   shardkit_gpu_bench DIR [--batch 256] [--epochs 2] [--threads 0] [--size 224] [--modes cpu,copy,gpu]
//                          [--hw-load X] [--profile]
//   --hw-load X: GpuOptions::hardware_load (the hardware engines' share, in [0, 1];
//                default: the library's, GpuOptions::kDefaultHardwareLoad)
//   --profile:   GpuOptions::profile; prints GpuLoader::profile() (where the GPU decode
//                path's producer spends its time) to stderr after each GPU decode run
//
// Modes (all RandomResizedCrop 224 + flip + normalize, float32 NCHW unless said):
//   cpu_loader       the CPU Loader alone, batches in host memory (uint8 NHWC: what the
//                    copy path carries; and float32 NCHW)
//   copy_path        CPU Loader -> pinned -> cudaMemcpyAsync -> convert kernel, float32 NCHW,
//                    with a synchronous consumer whose step (a kernel) takes 0, 0.5x and
//                    1.5x the CPU loader's time per batch; reports images/s against the
//                    CPU loader alone and against the slower of loader and consumer
//                    (vs_ideal), and the share of time the consumer waits in Next()
//   gpu_decode       nvJPEG (hardware + CUDA backends, host fallback) + resize kernel
// One JSON object per line on stdout: {"mode":..., "images_per_s":..., ...}.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/testing.h"
#include "shardkit/gpu.h"
#include "shardkit/loader.h"

using namespace shardkit;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

class MemData final : public RandomAccess {
 public:
  std::vector<Sample> samples;
  uint64_t size() const override { return samples.size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= samples.size()) return Status::NotFound("no such sample");
    *out = samples[i];
    return Status::OK();
  }
};

std::shared_ptr<MemData> LoadFolder(const std::string& root, uint64_t* bytes) {
  auto d = std::make_shared<MemData>();
  std::vector<std::string> classes;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  std::sort(classes.begin(), classes.end());
  *bytes = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(fs::path(root) / classes[c]))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      *bytes += s.size();
      Sample smp;
      smp.key = classes[c] + "/" + f.stem().string();
      smp.set("jpeg", Bytes::Take(std::move(s)));
      smp.set_label(int64_t(c));
      d->samples.push_back(std::move(smp));
    }
  }
  return d;
}

struct Args {
  std::string dir;
  uint32_t batch = 256;
  int epochs = 2;
  int threads = 0;
  int size = 224;
  std::string modes = "cpu,copy,gpu";  // --modes: which of the three to run
  double hw_load = -1;                 // --hw-load
  bool profile = false;                // --profile
  bool Has(const char* m) const { return ("," + modes + ",").find(std::string(",") + m + ",") != std::string::npos; }
};

LoaderOptions Opts(const Args& a, DType dt, Layout lay) {
  LoaderOptions o;
  o.batch_size = a.batch;
  o.threads = a.threads;
  o.prefetch = 4;
  o.output_width = o.output_height = a.size;
  o.dtype = dt;
  o.layout = lay;
  o.rank = 0;
  o.world_size = 1;
  o.seed = 1;
  return o;
}

void Fail(const Status& s, const char* what) {
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Time the consumer spent in Next() after the warm-up batch: at the first batch of an
// epoch (the pipeline restarts there) and at every other batch.
struct Waits {
  double epoch_start_s = 0, steady_s = 0, steady_max_s = 0;
  uint64_t steady_over_1ms = 0;
};

// Runs `epochs` epochs (after one warm-up batch), returns images/s.
template <class L, class OnBatch>
double Run(L& l, int epochs, uint64_t* images, double* seconds, OnBatch on_batch, Waits* waits = nullptr) {
  uint64_t n = 0;
  Clock::time_point t0;
  bool started = false;
  for (int e = 0; e < epochs; ++e) {
    l.set_epoch(uint64_t(e));
    for (uint64_t k = 0;; ++k) {
      auto tn = Clock::now();
      auto b = l.Next();
      const double w = std::chrono::duration<double>(Clock::now() - tn).count();
      if (!b.ok()) Fail(b.status(), "Next");
      if (b->end_of_epoch()) break;
      if (!started) {  // the first batch warms up threads, pools and the GPU
        on_batch(*b, true);
        t0 = Clock::now();
        started = true;
        continue;
      }
      if (waits) {
        if (k == 0) {
          waits->epoch_start_s += w;
        } else {
          waits->steady_s += w;
          waits->steady_max_s = std::max(waits->steady_max_s, w);
          if (w > 1e-3) ++waits->steady_over_1ms;
        }
      }
      n += b->size();
      on_batch(*b, false);
    }
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  *images = n;
  *seconds = s;
  return double(n) / s;
}

// GpuLoader::profile() per batch: host ms per phase of the producer and the submitter,
// GPU ms of the decode and the resize.
void PrintProfile(const GpuLoader::Profile& p) {
  if (!p.enabled || p.batches == 0) return;
  const double k = 1e3 / double(p.batches);
  const double t = p.gpu_timed ? 1.0 / double(p.gpu_timed) : 0.0;
  std::fprintf(stderr,
               "gpu_profile: %llu batches, ms/batch producer: acquire %.2f wait_set %.2f phase1 %.2f handoff %.2f | "
               "submitter: pack+upload %.2f hw_call %.2f cuda_rows %.2f tail %.2f | gpu: hw_decode %.2f resize %.2f\n",
               (unsigned long long)p.batches, p.acquire_s * k, p.wait_set_s * k, p.phase1_s * k, p.handoff_s * k,
               p.pack_s * k, p.hw_call_s * k, p.cuda_rows_s * k, p.tail_s * k, p.gpu_hw_decode_ms * t,
               p.gpu_resize_ms * t);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (k == "--batch") a.batch = uint32_t(std::stoul(val()));
    else if (k == "--epochs") a.epochs = std::stoi(val());
    else if (k == "--threads") a.threads = std::stoi(val());
    else if (k == "--size") a.size = std::stoi(val());
    else if (k == "--modes") a.modes = val();
    else if (k == "--hw-load") a.hw_load = std::stod(val());
    else if (k == "--profile") a.profile = true;
    else if (a.dir.empty()) a.dir = k;
    else { std::fprintf(stderr, "unknown argument %s\n", k.c_str()); return 2; }
  }
  if (a.dir.empty()) {
    std::fprintf(stderr, "usage: shardkit_gpu_bench DIR [--batch N] [--epochs N] [--threads N] [--size N] [--modes cpu,copy,gpu] "
                         "[--hw-load X] [--profile]\n");
    return 2;
  }
  uint64_t bytes = 0;
  auto data = LoadFolder(a.dir, &bytes);
  std::fprintf(stderr, "gpu_bench: %zu images, %.1f MB, batch %u, %d epochs\n", data->samples.size(), bytes / 1e6,
               a.batch, a.epochs);
  std::string why = CudaUnavailableReason();
  if (!why.empty()) {
    std::printf("{\"mode\":\"skipped\",\"reason\":\"%s\"}\n", why.c_str());
    return 0;
  }
  uint64_t n = 0;
  double s = 0;
  // 1. The CPU loader alone.
  double cpu_u8 = 0, cpu_f32 = 0;
  if (a.Has("cpu") || a.Has("copy"))
  for (DType dt : {DType::kUint8, DType::kFloat32}) {
    LoaderOptions o = Opts(a, dt, dt == DType::kUint8 ? Layout::kNHWC : Layout::kNCHW);
    auto l = Loader::Create(data, o);
    if (!l.ok()) Fail(l.status(), "Loader::Create");
    double r = Run(**l, a.epochs, &n, &s, [](Batch&, bool) {});
    (dt == DType::kUint8 ? cpu_u8 : cpu_f32) = r;
    std::printf("{\"mode\":\"cpu_loader_%s\",\"images_per_s\":%.1f,\"images\":%llu,\"seconds\":%.3f}\n",
                DTypeName(dt), r, (unsigned long long)n, s);
    std::fflush(stdout);
  }
  // 2. The copy path. The consumer is synchronous (it waits for its own step before the
  // next Next(), the worst case for overlap): no step; a step of half the CPU loader's
  // time per batch (loader-bound: the rate should be the CPU loader's); a step of 1.5x
  // (consumer-bound: the consumer should never wait, i.e. wait % < 2).
  void* consumer = nullptr;
  if (auto st = gpu::testing::CreateStream(0, &consumer); !st.ok()) Fail(st, "stream");
  const double batch_s = a.batch / cpu_u8;  // the CPU loader's time per batch
  if (a.Has("copy"))
  for (double frac : {0.0, 0.5, 1.5}) {
    GpuOptions g;
    g.decoder = DecoderKind::kCpu;
    g.consumer_stream = consumer;
    auto l = GpuLoader::Create(data, Opts(a, DType::kFloat32, Layout::kNCHW), g);
    if (!l.ok()) Fail(l.status(), "GpuLoader::Create(cpu)");
    const uint64_t spin_ns = uint64_t(frac * batch_s * 1e9);
    double wait0 = 0;
    Waits wt;
    double r = Run(**l, a.epochs, &n, &s, [&](DeviceBatch& b, bool warm) {
      if (warm) wait0 = (*l)->stats().next_wait_s;
      if (auto st = b.WaitOn(consumer); !st.ok()) Fail(st, "WaitOn");
      if (spin_ns) (void)gpu::testing::Spin(consumer, spin_ns);
      b.Release(consumer);
      (void)gpu::testing::SyncStream(consumer);
    }, &wt);
    auto st = (*l)->stats();
    double wait = st.next_wait_s - wait0;
    double ideal = frac > 1.0 ? 1.0 / (frac * batch_s) * a.batch : cpu_u8;  // the slower of the two
    std::printf("{\"mode\":\"copy_path\",\"consumer_step_ms\":%.2f,\"images_per_s\":%.1f,\"images\":%llu,"
                "\"seconds\":%.3f,\"consumer_wait_pct\":%.2f,\"vs_cpu_loader\":%.3f,\"vs_ideal\":%.3f,"
                "\"uploaded_mb\":%.1f,\"wait_epoch_start_ms\":%.2f,\"wait_steady_pct\":%.2f,"
                "\"wait_steady_max_ms\":%.2f,\"waits_over_1ms\":%llu}\n",
                spin_ns / 1e6, r, (unsigned long long)n, s, 100.0 * wait / s, r / cpu_u8, r / ideal,
                st.bytes_uploaded / 1e6, wt.epoch_start_s * 1e3, 100.0 * wt.steady_s / s, wt.steady_max_s * 1e3,
                (unsigned long long)wt.steady_over_1ms);
    std::fflush(stdout);
  }
  // 3. GPU decoding.
  if (!a.Has("gpu")) {
  } else if (NvjpegCompiled()) {
    for (bool roi : {true, false}) {
      GpuOptions g;
      g.decoder = DecoderKind::kGpu;
      g.roi_decode = roi;
      g.consumer_stream = consumer;
      g.hardware_load = a.hw_load;
      g.profile = a.profile;
      auto l = GpuLoader::Create(data, Opts(a, DType::kFloat32, Layout::kNCHW), g);
      if (!l.ok()) Fail(l.status(), "GpuLoader::Create(gpu)");
      double r = Run(**l, a.epochs, &n, &s, [&](DeviceBatch& b, bool) {
        (void)b.WaitOn(consumer);
        b.Release(consumer);
      });
      (void)gpu::testing::SyncStream(consumer);
      auto st = (*l)->stats();
      std::printf("{\"mode\":\"gpu_decode%s\",\"images_per_s\":%.1f,\"images\":%llu,\"seconds\":%.3f,"
                  "\"hardware\":%llu,\"cuda\":%llu,\"host\":%llu,\"roi\":%llu,\"vs_cpu_loader\":%.3f}\n",
                  roi ? "" : "_noroi", r, (unsigned long long)n, s, (unsigned long long)st.images_hardware,
                  (unsigned long long)st.images_cuda, (unsigned long long)st.images_host,
                  (unsigned long long)st.images_roi, cpu_f32 > 0 ? r / cpu_f32 : 0.0);
      std::fflush(stdout);
      if (a.profile) PrintProfile((*l)->profile());
    }
  } else {
    std::printf("{\"mode\":\"gpu_decode\",\"skipped\":\"built without nvJPEG\"}\n");
  }
  (void)gpu::testing::DestroyStream(consumer);
  return 0;
}
