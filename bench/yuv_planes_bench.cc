// Issue 41: what resizing in YCbCr planes would save of the codec's time in
// `convert --resize`. For each 4:2:0 YCbCr JPEG given (others are passed over), one
// thread, best of 3 passes:
//   decode  at the scale convert uses (the smallest of 8/8, 4/8, 2/8, 1/8 whose short side
//           stays >= TARGET) to RGB (tjDecompress2), and to Y, Cb, Cr planes
//           (tjDecompressToYUVPlanes: no chroma upsampling, no colour conversion);
//   encode  an image of the output size (short side TARGET, from the decoded pixels) at
//           quality 90, 4:2:0, accurate DCT, from RGB (tjCompress2) and from planes
//           (tjCompressFromYUVPlanes: no colour conversion, no chroma downsampling).
//   sk_yuv_planes_bench TARGET FILE...     (e.g. 256 $(find corpus -type f | sort | head -1500))
// Prints seconds per route and planes / RGB; docs/benchmarks.md, "Transform at conversion".
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <turbojpeg.h>

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET FILE...\n", argv[0]);
    return 2;
  }
  const int target = std::atoi(argv[1]);
  if (target < 1) {
    std::fprintf(stderr, "TARGET must be a positive short side, got '%s'\n", argv[1]);
    return 2;
  }
  tjhandle d = tjInitDecompress(), c = tjInitCompress();
  std::vector<std::vector<unsigned char>> files;
  for (int i = 2; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<unsigned char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    int w, h, sub, cs;
    if (b.size() > 3 && tjDecompressHeader3(d, b.data(), (unsigned long)b.size(), &w, &h, &sub, &cs) == 0 &&
        cs == TJCS_YCbCr && sub == TJSAMP_420)
      files.push_back(std::move(b));
  }
  std::vector<unsigned char> rgb, y, u, v;
  double best[4] = {0, 0, 0, 0};  // decode RGB, decode planes, encode RGB, encode planes
  size_t failed = 0;
  for (int pass = 0; pass < 3; ++pass) {
    double t[4] = {0, 0, 0, 0};
    for (auto& f : files) {
      int w, h, sub, cs;
      tjDecompressHeader3(d, f.data(), (unsigned long)f.size(), &w, &h, &sub, &cs);
      int num = 8;
      while (num > 1 && std::min(w, h) * (num / 2) / 8 >= target) num /= 2;
      const int sw = (w * num + 7) / 8, sh = (h * num + 7) / 8;
      // (TurboJPEG pads the luma plane to the chroma's multiple: 2 x 2 for 4:2:0)
      const int yw = tjPlaneWidth(0, sw, TJSAMP_420), yh = tjPlaneHeight(0, sh, TJSAMP_420);
      const int cw = tjPlaneWidth(1, sw, TJSAMP_420), ch = tjPlaneHeight(1, sh, TJSAMP_420);
      rgb.resize(size_t(sw) * sh * 3);
      y.resize(size_t(yw) * yh);
      u.resize(size_t(cw) * ch);
      v.resize(size_t(cw) * ch);
      unsigned char* planes[3] = {y.data(), u.data(), v.data()};
      int strides[3] = {yw, cw, cw};
      const auto a = Clock::now();
      const int r1 = tjDecompress2(d, f.data(), (unsigned long)f.size(), rgb.data(), sw, 0, sh, TJPF_RGB, 0);
      const auto b = Clock::now();
      const int r2 = tjDecompressToYUVPlanes(d, f.data(), (unsigned long)f.size(), planes, sw, strides, sh, 0);
      const auto e = Clock::now();
      if (r1 != 0 || r2 != 0) ++failed;  // (warnings too; the time counts all the same)
      // The output size: short side `target` (never larger than the decoded image).
      int ow = sw, oh = sh;
      if (std::min(sw, sh) > target) {
        if (sw < sh) ow = target, oh = int(int64_t(sh) * target / sw);
        else oh = target, ow = int(int64_t(sw) * target / sh);
      }
      int ostrides[3] = {yw, cw, cw};  // the decoded planes' top-left corner
      const unsigned char* cplanes[3] = {y.data(), u.data(), v.data()};
      unsigned char* jb = nullptr;
      unsigned long jl = 0;
      const auto g = Clock::now();
      tjCompress2(c, rgb.data(), ow, sw * 3, oh, TJPF_RGB, &jb, &jl, TJSAMP_420, 90, TJFLAG_ACCURATEDCT);
      const auto k = Clock::now();
      tjCompressFromYUVPlanes(c, cplanes, ow, ostrides, oh, TJSAMP_420, &jb, &jl, 90, TJFLAG_ACCURATEDCT);
      const auto m = Clock::now();
      tjFree(jb);
      t[0] += Seconds(a, b);
      t[1] += Seconds(b, e);
      t[2] += Seconds(g, k);
      t[3] += Seconds(k, m);
    }
    for (int i = 0; i < 4; ++i) best[i] = pass == 0 ? t[i] : std::min(best[i], t[i]);
  }
  tjDestroy(d);
  tjDestroy(c);
  std::printf("%zu 4:2:0 JPEGs, short side %d, one thread, best of 3%s\n", files.size(), target,
              failed ? " (some decodes gave warnings)" : "");
  std::printf("decode  to RGB %.3f s   to planes %.3f s   planes / RGB %.2f\n", best[0], best[1], best[1] / best[0]);
  std::printf("encode  from RGB %.3f s   from planes %.3f s   planes / RGB %.2f\n", best[2], best[3],
              best[3] / best[2]);
  return 0;
}
