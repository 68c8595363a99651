// sk_codec_bench: one-thread decode rate of JPEG, WebP, AVIF and JPEG XL made from the
// same pixels, in megapixels per CPU-second, through shardkit's ImageDecoder (full image
// to 8-bit RGB, as verify --decode and conversion decode).
//
//   sk_codec_bench FOLDER [--count N] [--repeat R]
//
// The first N images (sorted by path) of FOLDER (any depth; JPEG or PNG) are decoded to
// RGB once, then encoded from those pixels by: turbojpeg (quality 90, 4:2:0), cwebp
// (-q 90), avifenc (-s 6 --min 18 --max 26, 4:2:0), cjxl (-d 1.0, effort 7), plus the
// lossless modes of WebP and JPEG XL. Each file set is then decoded R times (default 3),
// the sets alternating per pass; the best pass counts. Thread CPU time is measured, so
// the other processes of a shared machine cost little. Output: per codec the bits per
// pixel, the mean absolute error against the source pixels (0..255) and MP/s.
// The command-line encoders must be on PATH (webp, libavif-bin, libjxl-tools).
#include <time.h>
#include <turbojpeg.h>
#include <png.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "decode/jpeg.h"

using namespace shardkit;
namespace fs = std::filesystem;

namespace {

struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;
};

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + t.tv_nsec * 1e-9;
}

std::string Read(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool Decode(decode::ImageDecoder& dec, const std::string& bytes, Image* out) {
  decode::Region r;
  Status st = dec.DecodeAll(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &r);
  if (!st.ok()) {
    std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
    return false;
  }
  out->w = r.width;
  out->h = r.height;
  out->rgb.resize(size_t(r.width) * r.height * 3);
  for (int y = 0; y < r.height; ++y)
    std::copy_n(r.pixels + r.stride * size_t(y), size_t(r.width) * 3, out->rgb.data() + size_t(y) * r.width * 3);
  return true;
}

void WritePng(const std::string& path, const Image& im) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = uint32_t(im.w);
  img.height = uint32_t(im.h);
  img.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&img, path.c_str(), 0, im.rgb.data(), 0, nullptr)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string EncodeJpeg(const Image& im) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  if (tjCompress2(tj, im.rgb.data(), im.w, 0, im.h, TJPF_RGB, &buf, &len, TJSAMP_420, 90, 0) != 0) {
    std::fprintf(stderr, "turbojpeg: %s\n", tjGetErrorStr2(tj));
    std::exit(1);
  }
  std::string out(reinterpret_cast<char*>(buf), len);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

std::string Encode(const std::string& cmd, const std::string& out) {
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) {
    std::fprintf(stderr, "failed: %s\n", cmd.c_str());
    std::exit(1);
  }
  return Read(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: sk_codec_bench FOLDER [--count N] [--repeat R]\n");
    return 2;
  }
  std::string folder = argv[1];
  size_t count = 20;
  int repeat = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--count") count = size_t(std::atol(argv[i + 1]));
    else if (a == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<std::string> paths;
  for (auto& e : fs::recursive_directory_iterator(folder)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.size() > count) paths.resize(count);
  if (paths.empty()) {
    std::fprintf(stderr, "no images in %s\n", folder.c_str());
    return 1;
  }
  const fs::path tmp = fs::temp_directory_path() / fmt::format("sk_codec_bench.{}", getpid());
  fs::create_directories(tmp);
  struct Codec {
    std::string name, settings;
    std::vector<std::string> files;
    double best_mps = 0, bytes = 0, abs_err = 0;
  };
  std::vector<Codec> codecs = {{"JPEG", "turbojpeg q90 4:2:0"},
                               {"WebP", "cwebp -q 90"},
                               {"WebP lossless", "cwebp -lossless"},
                               {"AVIF", "avifenc -s 6 --min 18 --max 26 (4:2:0)"},
                               {"JPEG XL", "cjxl -d 1.0 (effort 7)"},
                               {"JPEG XL lossless", "cjxl -d 0 (effort 7)"}};
  decode::ImageDecoder dec;
  std::vector<Image> sources;
  double pixels = 0;
  for (const auto& p : paths) {
    Image im;
    if (!Decode(dec, Read(p), &im)) return 1;
    const std::string png = (tmp / "src.png").string(), o = (tmp / "out").string();
    WritePng(png, im);
    codecs[0].files.push_back(EncodeJpeg(im));
    codecs[1].files.push_back(Encode(fmt::format("cwebp -quiet -q 90 {} -o {}.webp", png, o), o + ".webp"));
    codecs[2].files.push_back(Encode(fmt::format("cwebp -quiet -lossless {} -o {}.webp", png, o), o + ".webp"));
    codecs[3].files.push_back(
        Encode(fmt::format("avifenc -j 1 -s 6 --min 18 --max 26 -y 420 {} {}.avif", png, o), o + ".avif"));
    codecs[4].files.push_back(Encode(fmt::format("cjxl {} {}.jxl -d 1.0", png, o), o + ".jxl"));
    codecs[5].files.push_back(Encode(fmt::format("cjxl {} {}.jxl -d 0", png, o), o + ".jxl"));
    pixels += double(im.w) * im.h;
    sources.push_back(std::move(im));
  }
  fs::remove_all(tmp);
  for (auto& c : codecs) {
    Image im;
    for (size_t i = 0; i < c.files.size(); ++i) {
      c.bytes += double(c.files[i].size());
      if (!Decode(dec, c.files[i], &im)) return 1;
      double e = 0;
      for (size_t k = 0; k < im.rgb.size(); ++k) e += std::abs(int(im.rgb[k]) - int(sources[i].rgb[k]));
      c.abs_err += e;
    }
    c.abs_err /= pixels * 3;
  }
  for (int pass = 0; pass < repeat; ++pass) {
    for (auto& c : codecs) {
      decode::Region r;
      const double t0 = ThreadSeconds();
      for (const auto& f : c.files)
        if (!dec.DecodeAll(reinterpret_cast<const uint8_t*>(f.data()), f.size(), &r).ok()) return 1;
      const double mps = pixels / 1e6 / (ThreadSeconds() - t0);
      c.best_mps = std::max(c.best_mps, mps);
    }
  }
  std::printf("%zu images, %.1f megapixels; one thread, full decode to RGB, best of %d passes\n", paths.size(),
              pixels / 1e6, repeat);
  std::printf("%-17s %-40s %8s %9s %8s\n", "codec", "made with", "bits/px", "mean err", "MP/s");
  for (const auto& c : codecs)
    std::printf("%-17s %-40s %8.2f %9.2f %8.1f\n", c.name.c_str(), c.settings.c_str(), c.bytes * 8 / pixels,
                c.abs_err, c.best_mps);
  return 0;
}
