// Transforms at conversion (issue 41, part 1): --resize, --encode, EXIF orientation,
// --skip-bad, --max-pixels, the manifest's transform record and verify --against on it.
// Outputs are read back with an independent decoder: Debian's Pillow (/usr/bin/python3).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>
#include <zlib.h>

#include "core/pickle.h"
#include "decode/encode.h"
#include "decode/jpeg.h"
#include "decode/transform.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using sk_test::Q;
using sk_test::TempDir;
namespace fs = std::filesystem;

namespace {

const char* kPy = "/usr/bin/python3";  // Debian's, with Pillow (the `python3` on PATH has none)

// A smooth RGB image (a gradient that `seed` shifts), encoded by `spec`.
std::string Gradient(int w, int h, int seed, const decode::EncodeSpec& spec = {false, 95}) {
  std::vector<uint8_t> px(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &px[(size_t(y) * w + x) * 3];
      p[0] = uint8_t(x * 255 / std::max(1, w - 1));
      p[1] = uint8_t(y * 255 / std::max(1, h - 1));
      p[2] = uint8_t(60 + 20 * (seed % 8));
    }
  auto b = decode::EncodePixels(px.data(), w, h, 3, size_t(w) * 3, spec);
  REQUIRE(b.ok());
  return b->str();
}

// 64 x 32 RGB pixels: the top half red, the bottom half blue.
std::vector<uint8_t> RedOverBlue() {
  std::vector<uint8_t> px(64 * 32 * 3);
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 64; ++x) {
      uint8_t* p = &px[(size_t(y) * 64 + x) * 3];
      p[0] = y < 16 ? 230 : 10;
      p[1] = 10;
      p[2] = y < 16 ? 10 : 230;
    }
  return px;
}

// EXIF data: a big-endian TIFF block whose IFD0 holds Orientation = `o`.
std::string TiffWithOrientation(int o) {
  const unsigned char tiff[] = {'M', 'M', 0, 42, 0, 0, 0, 8,  // header, IFD0 at 8
                                0, 1,                           // one entry
                                0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, uint8_t(o), 0, 0,  // Orientation, SHORT, 1
                                0, 0, 0, 0};                    // no next IFD
  return std::string(reinterpret_cast<const char*>(tiff), sizeof tiff);
}

// A JPEG with an APP1 Exif segment holding Orientation = `o`, right after SOI.
std::string WithOrientation(const std::string& jpeg, int o) {
  std::string payload = std::string("Exif\0\0", 6) + TiffWithOrientation(o);
  const size_t len = payload.size() + 2;
  std::string seg = {'\xFF', '\xE1', char(len >> 8), char(len & 0xFF)};
  return jpeg.substr(0, 2) + seg + payload + jpeg.substr(2);
}

std::string Le32(uint32_t v) { return {char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; }
std::string Be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

// A simple-format WebP (RIFF, WEBP, one VP8/VP8L chunk) made an extended one (VP8X with
// the EXIF flag) with an "EXIF" chunk holding Orientation = `o` after the image.
std::string WebpWithOrientation(const std::string& webp, int w, int h, int o) {
  REQUIRE(webp.compare(0, 4, "RIFF") == 0);
  REQUIRE(webp.compare(8, 4, "WEBP") == 0);
  std::string vp8x = "VP8X" + Le32(10) + std::string(1, char(0x08)) + std::string(3, '\0') +
                     Le32(uint32_t(w - 1)).substr(0, 3) + Le32(uint32_t(h - 1)).substr(0, 3);
  std::string exif = TiffWithOrientation(o);
  std::string chunk = "EXIF" + Le32(uint32_t(exif.size())) + exif + std::string(exif.size() & 1, '\0');
  std::string body = "WEBP" + vp8x + webp.substr(12) + chunk;
  return "RIFF" + Le32(uint32_t(body.size())) + body;
}

// A PNG with an "eXIf" chunk holding Orientation = `o` right after IHDR.
std::string PngWithOrientation(const std::string& png, int o) {
  REQUIRE(png.compare(12, 4, "IHDR") == 0);
  const std::string data = TiffWithOrientation(o), typed = "eXIf" + data;
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(typed.data()), uInt(typed.size()));
  return png.substr(0, 33) + Be32(uint32_t(data.size())) + typed + Be32(uint32_t(crc)) + png.substr(33);
}

// `src` converted to tar shards in `dir` with --resize short:90 under a manifest that
// records short:100 (every image resized is then off by the record); the manifest's path.
std::string MisrecordedResize(const std::string& src, const std::string& dir, ConvertOptions o) {
  o.resize = "short:90";
  auto r = Convert(src, "wds:" + dir + "/t-%06d.tar", o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  std::string m = sk_test::ReadFile(dir + "/t.manifest.json");
  const size_t at = m.find("short:90");
  REQUIRE(at != std::string::npos);
  m.replace(at, 8, "short:100");
  sk_test::WriteFile(dir + "/t.manifest.json", m);
  return dir + "/t.manifest.json";
}

// The samples of a dataset, key -> sample.
std::map<std::string, Sample> ReadAll(const std::string& address) {
  auto ds = Open(address);
  REQUIRE(ds.ok());
  auto r = (*ds)->NewReader();
  REQUIRE(r.ok());
  std::map<std::string, Sample> out;
  Sample s;
  for (;;) {
    auto more = (*r)->Next(&s);
    REQUIRE(more.ok());
    if (!*more) break;
    out[s.key] = s;
  }
  return out;
}

// Pillow's view of an output image against its source: "FORMAT W H EXIF DIFF" where
// DIFF is the mean absolute difference from the source turned upright
// (ImageOps.exif_transpose) and resized by Pillow's BILINEAR to the same size.
std::string PilCompare(const std::string& src, const std::string& out) {
  TempDir t;
  sk_test::WriteFile(t / "c.py", R"(import sys
from PIL import Image, ImageOps, ImageChops, ImageStat
a = ImageOps.exif_transpose(Image.open(sys.argv[1])).convert('RGB')
b = Image.open(sys.argv[2])
b.load()
exif = int('exif' in b.info or len(b.getexif()) > 0)
ref = a.resize(b.size, Image.BILINEAR)
d = sum(ImageStat.Stat(ImageChops.difference(ref, b.convert('RGB'))).mean) / 3
print(b.format, b.size[0], b.size[1], exif, round(d, 2))
)");
  auto r = sk_test::Run(fmt::format("{} {} {} {}", kPy, Q(t / "c.py"), Q(src), Q(out)));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

struct PilView {
  std::string format;
  int w = 0, h = 0, exif = -1;
  double diff = -1;
};
PilView Parse(const std::string& line) {
  PilView v;
  std::istringstream in(line);
  in >> v.format >> v.w >> v.h >> v.exif >> v.diff;
  return v;
}

// A folder source: c0/a.jpg (640x480), c0/b.jpg (300x500), c1/c.png (200x120: within
// short:256, never enlarged), c1/d.jpg (1000x200).
void MakeSource(const std::string& root) {
  sk_test::WriteFile(root + "/c0/a.jpg", Gradient(640, 480, 1));
  sk_test::WriteFile(root + "/c0/b.jpg", Gradient(300, 500, 2));
  sk_test::WriteFile(root + "/c1/c.png", Gradient(200, 120, 3, decode::EncodeSpec{}));
  sk_test::WriteFile(root + "/c1/d.jpg", Gradient(1000, 200, 4));
}

// The bytes of every file under `dir`, by name.
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().filename().string()] = sk_test::ReadFile(e.path().string());
  return out;
}

// `src` converted with --resize max:128 into tar shards of 2 samples (--samples-per-shard
// alone: no byte limit) at DIR/t-%06d.tar, by `threads`, as `part`.
ConvertSummary ConvertByTwo(const std::string& src, const std::string& dir, int threads, PartSpec part,
                            bool skip_bad) {
  ConvertOptions o;
  o.resize = "max:128";
  o.skip_bad = skip_bad;
  o.threads = threads;
  o.part = part;
  o.write.samples_per_shard = 2;
  auto r = Convert(src, "wds:" + dir + "/t-%06d.tar", o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

// Files() of a merged output, without its part records (`.part-` names).
std::map<std::string, std::string> MergedFiles(const std::string& dir) {
  auto files = Files(dir);
  for (auto it = files.begin(); it != files.end();)
    it = it->first.find(".part-") != std::string::npos ? files.erase(it) : std::next(it);
  return files;
}

}  // namespace

TEST_CASE("transform: resize rules give exact sizes and never enlarge", "[transform]") {
  auto size = [](const char* rule, int w, int h) {
    auto r = decode::ParseResize(rule);
    REQUIRE(r.ok());
    int ow, oh;
    decode::ResizedSize(*r, w, h, &ow, &oh);
    return fmt::format("{}x{}", ow, oh);
  };
  CHECK(size("short:256", 640, 480) == "341x256");    // 640 * 256 / 480 = 341.33
  CHECK(size("short:256", 480, 640) == "256x341");
  CHECK(size("short:256", 500, 375) == "341x256");    // 341.33
  CHECK(size("short:256", 1000, 200) == "1000x200");  // short side already 200: kept
  CHECK(size("short:256", 256, 300) == "256x300");
  CHECK(size("short:100", 301, 200) == "151x100");    // 150.5 rounds half up
  CHECK(size("max:512", 1024, 768) == "512x384");
  CHECK(size("max:512", 300, 2000) == "77x512");      // 76.8
  CHECK(size("max:512", 512, 100) == "512x100");
  CHECK(size("fit:200x100", 400, 400) == "100x100");  // the height limits
  CHECK(size("fit:200x100", 1000, 100) == "200x20");  // the width limits
  CHECK(size("fit:200x100", 150, 90) == "150x90");    // inside already
  CHECK(size("max:10", 5000, 1) == "10x1");           // never below one pixel
  for (const char* bad : {"short:0", "short:-3", "short:", "short:abc", "max:99999999", "fit:10", "fit:0x5",
                          "fit:5x", "wide:10", "", "short:2.5"}) {
    INFO(bad);
    auto r = decode::ParseResize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(fmt::format("'{}'", bad)));
  }
  CHECK(decode::ParseEncodeSpec("jpeg")->quality == 90);
  CHECK(decode::ParseEncodeSpec("webp:75")->ext() == "webp");
  CHECK_FALSE(decode::ParseEncodeSpec("jpeg:0").ok());
  CHECK_FALSE(decode::ParseEncodeSpec("gif").ok());
  CHECK_FALSE(decode::ParseTransform("short:8", "keep", 0).ok());
  CHECK_FALSE(decode::ParseTransform("", "keep", 0)->has_value());
  CHECK(decode::ParseTransform("short:8", "", 0).value()->encode.ToString() == "jpeg:90");
}

TEST_CASE("transform: the triangle resize keeps a flat image flat and is exact on a pass-through",
          "[transform]") {
  std::vector<uint8_t> flat(97 * 61 * 3, 0);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = uint8_t(i % 3 == 0 ? 200 : i % 3 == 1 ? 17 : 255);
  std::vector<uint8_t> out(23 * 14 * 3);
  decode::ResizeRgb(flat.data(), 97, 61, 97 * 3, out.data(), 23, 14);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == flat[i % 3]);
  std::vector<uint8_t> same(97 * 61 * 3);
  decode::ResizeRgb(flat.data(), 97, 61, 97 * 3, same.data(), 97, 61);
  CHECK(same == flat);
}

TEST_CASE("transform: the SIMD resize passes equal the portable ones to the bit", "[transform]") {
  std::mt19937 rng(41);
  const bool simd = decode::SetResampleSimd(true);
  INFO("SIMD passes in use: " << simd);
  // Sizes that leave vector tails, one-pixel outputs, strided sources, up and down.
  const int sizes[][4] = {{97, 61, 23, 14}, {500, 375, 341, 256}, {17, 300, 1, 1}, {1, 1, 1, 1},
                          {640, 7, 256, 3},  {5, 640, 2, 256},    {33, 33, 64, 48}, {1594, 1062, 384, 256}};
  for (const auto& sz : sizes) {
    const int sw = sz[0], sh = sz[1], dw = sz[2], dh = sz[3];
    for (const size_t pad : {size_t(0), size_t(13)}) {
      const size_t stride = size_t(sw) * 3 + pad;
      // Exactly stride * (sh - 1) + sw * 3 bytes: a read past the last pixel shows under ASan.
      std::vector<uint8_t> src(stride * size_t(sh - 1) + size_t(sw) * 3);
      for (auto& b : src) b = uint8_t(rng());
      std::vector<uint8_t> a(size_t(dw) * dh * 3), b(a.size());
      decode::SetResampleSimd(true);
      decode::ResizeRgb(src.data(), sw, sh, stride, a.data(), dw, dh);
      decode::SetResampleSimd(false);
      decode::ResizeRgb(src.data(), sw, sh, stride, b.data(), dw, dh);
      INFO(sw << "x" << sh << " -> " << dw << "x" << dh << ", row padding " << pad);
      REQUIRE(a == b);
    }
  }
  decode::SetResampleSimd(true);
}

namespace {
// RGB pixels of an encoded image (our decoder).
std::vector<uint8_t> DecodedRgb(const Bytes& b, int* w, int* h) {
  decode::ImageDecoder dec;
  decode::Region r;
  REQUIRE(dec.DecodeAll(reinterpret_cast<const uint8_t*>(b.data()), b.size(), &r).ok());
  *w = r.width, *h = r.height;
  std::vector<uint8_t> px(size_t(r.width) * r.height * 3);
  for (int y = 0; y < r.height; ++y)
    std::memcpy(&px[size_t(y) * r.width * 3], r.pixels + r.stride * size_t(y), size_t(r.width) * 3);
  return px;
}
}  // namespace

TEST_CASE("transform: a baseline 4:2:0 JPEG goes through YCbCr planes, close to the RGB route, SIMD equal to "
          "portable", "[transform]") {
  // Odd and even sizes, DCT-scaled (1600 x 1067: 1/4 and 1/2), larger and smaller than the rule.
  const int sizes[][2] = {{500, 375}, {501, 377}, {97, 61}, {1600, 1067}, {255, 300}, {640, 7}, {333, 1001}};
  int differ = 0;
  for (const char* rule : {"short:256", "fit:100x80", "max:64"}) {
    auto spec = decode::ParseTransform(rule, "", 0);
    REQUIRE(spec.ok());
    for (const auto& sz : sizes) {
      INFO(rule << " " << sz[0] << "x" << sz[1]);
    for (const bool smooth : {false, true}) {
      INFO((smooth ? "gradient" : "pattern"));
      const std::string src = smooth ? Gradient(sz[0], sz[1], sz[0], decode::EncodeSpec{false, 90})
                                     : sk_test::MakeJpeg(sz[0], sz[1], uint32_t(sz[0] + sz[1]),
                                                         sk_test::JpegKind::kBaseline420, 90);
      const auto* d = reinterpret_cast<const uint8_t*>(src.data());
      int pw = 0, ph = 0, rw = 0, rh = 0;
      decode::SetPlaneRoute(true);
      auto planes = decode::TransformImage(d, src.size(), **spec, &pw, &ph);
      decode::SetResampleSimd(false);
      auto portable = decode::TransformImage(d, src.size(), **spec);
      decode::SetResampleSimd(true);
      decode::SetPlaneRoute(false);
      auto rgb = decode::TransformImage(d, src.size(), **spec, &rw, &rh);
      decode::SetPlaneRoute(true);
      REQUIRE(planes.ok());
      REQUIRE(portable.ok());
      REQUIRE(rgb.ok());
      CHECK(*planes == *portable);
      CHECK(pw == rw);
      CHECK(ph == rh);
      differ += *planes != *rgb;
      int w1, h1, w2, h2;
      const auto a = DecodedRgb(*planes, &w1, &h1), b = DecodedRgb(*rgb, &w2, &h2);
      REQUIRE(w1 == pw);
      REQUIRE(h1 == ph);
      REQUIRE(w2 == w1);
      REQUIRE(h2 == h1);
      // Against the truth: the source's pixels (our decoder, no DCT scaling) resized in RGB
      // without a second encode. The plane route is as close to it as the RGB route.
      int sw0, sh0;
      const auto full = DecodedRgb(Bytes::Copy(src), &sw0, &sh0);
      std::vector<uint8_t> ref(a.size());
      decode::ResizeRgb(full.data(), sw0, sh0, size_t(sw0) * 3, ref.data(), w1, h1);
      double ea = 0, eb = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ea += std::abs(int(a[i]) - int(ref[i]));
        eb += std::abs(int(b[i]) - int(ref[i]));
      }
      ea /= double(a.size()), eb /= double(a.size());
      INFO("mean absolute error, of 255: planes " << ea << ", RGB route " << eb);
      // On smooth content the two routes are as close; on the pattern's sawtooth edges of
      // unrelated channels (chroma at the finest scale) the plane route is up to 1.35x
      // further (the corpus's photographs: docs/benchmarks.md, equal within 1%).
      if (smooth) CHECK(ea <= eb + 0.5);
      else CHECK(ea <= eb * 1.4 + 0.5);
    }
    }
  }
  CHECK(differ > 0);  // (the route is taken)
}

TEST_CASE("transform: progressive, 4:4:4, gray, CMYK and rotated JPEGs take the RGB route", "[transform]") {
  auto spec = decode::ParseTransform("short:64", "", 0);
  REQUIRE(spec.ok());
  std::vector<std::string> srcs;
  for (auto kind : {sk_test::JpegKind::kProgressive, sk_test::JpegKind::kBaseline444, sk_test::JpegKind::kGray,
                    sk_test::JpegKind::kCmyk})
    srcs.push_back(sk_test::MakeJpeg(301, 203, 5, kind, 90));
  srcs.push_back(WithOrientation(sk_test::MakeJpeg(301, 203, 5, sk_test::JpegKind::kBaseline420, 90), 6));
  for (size_t i = 0; i < srcs.size(); ++i) {
    INFO("image " << i);
    const auto* d = reinterpret_cast<const uint8_t*>(srcs[i].data());
    decode::SetPlaneRoute(true);
    auto a = decode::TransformImage(d, srcs[i].size(), **spec);
    decode::SetPlaneRoute(false);
    auto b = decode::TransformImage(d, srcs[i].size(), **spec);
    decode::SetPlaneRoute(true);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
  }
}

TEST_CASE("transform: EXIF orientation 6 turns the image upright and the output carries no EXIF",
          "[transform]") {
  TempDir t;
  // Orientation 6 (rotate 90 degrees clockwise to display): upright the image is 32 x 64,
  // the left half blue, the right red.
  const std::vector<uint8_t> px = RedOverBlue();
  auto jpeg = decode::EncodePixels(px.data(), 64, 32, 3, 64 * 3, decode::EncodeSpec{false, 95});
  REQUIRE(jpeg.ok());
  const std::string src = WithOrientation(jpeg->str(), 6);
  CHECK(decode::JpegOrientation(reinterpret_cast<const uint8_t*>(src.data()), src.size()) == 6);
  sk_test::WriteFile(t / "in/c0/r.jpg", src);
  // Pillow reads the crafted segment as orientation 6 too.
  auto pil = sk_test::Run(fmt::format("{} -c {} {}", kPy,
                                      Q("import sys; from PIL import Image; print(Image.open(sys.argv[1]).getexif()[0x0112])"),
                                      Q(t / "in/c0/r.jpg")));
  CHECK(pil.out == "6\n");

  for (const char* encode : {"png", "jpeg:95"}) {
    INFO(encode);
    const std::string out = t / fmt::format("o-{}", encode[0]);
    ConvertOptions o;
    o.encode = encode;
    auto r = Convert(t / "in", "wds:" + out + "/t-%06d.tar", o);
    REQUIRE(r.ok());
    auto samples = ReadAll(out + "/t.manifest.json");
    REQUIRE(samples.size() == 1);
    const Sample& s = samples.begin()->second;
    const Field* img = s.image();
    REQUIRE(img != nullptr);
    CHECK(img->ext == (encode[0] == 'p' ? "png" : "jpg"));
    CHECK(img->data.str().find("Exif") == std::string::npos);
    sk_test::WriteFile(t / "out.img", img->data.str());
    PilView v = Parse(PilCompare(t / "in/c0/r.jpg", t / "out.img"));
    CHECK(v.w == 32);
    CHECK(v.h == 64);
    CHECK(v.exif == 0);
    CHECK(v.diff < 3);  // against Pillow's exif_transpose: the same pixels
    // And by pixels: left blue, right red.
    auto px_at = sk_test::Run(fmt::format(
        "{} -c {} {}", kPy, Q("import sys; from PIL import Image; i = Image.open(sys.argv[1]).convert('RGB'); "
                              "print(i.getpixel((4, 32)), i.getpixel((28, 32)))"),
        Q(t / "out.img")));
    INFO(px_at.out);
    CHECK_THAT(px_at.out, Catch::Matches(R"(\(\d+, \d+, 2\d\d\) \(2\d\d, \d+, \d+\)\s*)"));
  }
}

TEST_CASE("transform: a WebP's EXIF chunk and a PNG's eXIf chunk turn the image upright too", "[transform]") {
  TempDir t;
  // Orientation 6 makes RedOverBlue() 32 x 64.
  const std::vector<uint8_t> px = RedOverBlue();
  auto webp = decode::EncodePixels(px.data(), 64, 32, 3, 64 * 3, decode::EncodeSpec{false, 95, true});
  auto png = decode::EncodePixels(px.data(), 64, 32, 3, 64 * 3, decode::EncodeSpec{});
  REQUIRE(webp.ok());
  REQUIRE(png.ok());
  const std::map<std::string, std::string> src = {{"w.webp", WebpWithOrientation(webp->str(), 64, 32, 6)},
                                                  {"p.png", PngWithOrientation(png->str(), 6)}};
  for (const auto& [name, bytes] : src) {
    INFO(name);
    const auto* d = reinterpret_cast<const uint8_t*>(bytes.data());
    CHECK(decode::ImageOrientation(d, bytes.size()) == 6);
    sk_test::WriteFile(t / ("in/c0/" + name), bytes);
    // Pillow reads the crafted chunk as orientation 6 too.
    auto pil = sk_test::Run(fmt::format("{} -c {} {}", kPy,
                                        Q("import sys; from PIL import Image; print(Image.open(sys.argv[1]).getexif()[0x0112])"),
                                        Q(t / ("in/c0/" + name))));
    CHECK(pil.out == "6\n");
  }
  // Without a chunk, or with a damaged one: 1, never a read past the end.
  CHECK(decode::ImageOrientation(reinterpret_cast<const uint8_t*>(webp->data()), webp->size()) == 1);
  CHECK(decode::ImageOrientation(reinterpret_cast<const uint8_t*>(png->data()), png->size()) == 1);
  for (const auto& [name, bytes] : src)
    for (size_t cut = 0; cut < bytes.size(); cut += 7)
      CHECK(decode::ImageOrientation(reinterpret_cast<const uint8_t*>(bytes.data()), cut) >= 1);

  const std::string out = t / "o";
  ConvertOptions o;
  o.encode = "png";
  auto r = Convert(t / "in", "wds:" + out + "/t-%06d.tar", o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  auto samples = ReadAll(out + "/t.manifest.json");
  REQUIRE(samples.size() == 2);
  for (const auto& [key, s] : samples) {
    INFO(key);
    const Field* img = s.image();
    REQUIRE(img != nullptr);
    sk_test::WriteFile(t / "out.png", img->data.str());
    const std::string name = key.find("/w") != std::string::npos ? "w.webp" : "p.png";
    PilView v = Parse(PilCompare(t / ("in/c0/" + name), t / "out.png"));
    CHECK(v.w == 32);
    CHECK(v.h == 64);
    CHECK(v.exif == 0);
    CHECK(v.diff < 3);  // against Pillow's exif_transpose
  }
}

TEST_CASE("transform: decoded arrays (npy) are resized by the rule and encoded as RGB images", "[transform]") {
  decode::TransformSpec spec;
  spec.resize = *decode::ParseResize("short:100");
  spec.encode = decode::EncodeSpec{};  // png: lossless, so the pixels can be checked
  // 300 x 200 of one colour, as [H, W] (gray), [H, W, 3] and [H, W, 4] (alpha dropped).
  for (uint64_t c : {0, 3, 4}) {
    INFO("channels " << c);
    pickle::NdArray a;
    a.shape = c ? std::vector<uint64_t>{200, 300, c} : std::vector<uint64_t>{200, 300};
    std::vector<uint8_t> px(200 * 300 * std::max<uint64_t>(c, 1));
    for (size_t i = 0; i < px.size(); ++i) px[i] = c == 0 ? 90 : uint8_t(std::array<int, 4>{200, 120, 40, 7}[i % c]);
    a.data = Bytes::Copy(px.data(), px.size());
    Sample s;
    s.key = "k";
    s.set("npy", pickle::ToNpy(a));
    s.set("cls", Bytes::Copy("3", 1));
    REQUIRE(decode::TransformSampleImages(&s, spec).ok());
    CHECK(s.find("npy") == nullptr);
    CHECK(s.find("cls") != nullptr);
    const Field* img = s.find("png");
    REQUIRE(img != nullptr);
    decode::ImageDecoder dec;
    decode::Region reg;
    decode::ImageInfo info;
    auto whole = [](const decode::ImageInfo& im) {
      return decode::CropBox{0, 0, double(im.width), double(im.height)};
    };
    REQUIRE(dec.Decode(reinterpret_cast<const uint8_t*>(img->data.data()), img->data.size(), whole, 1, 1, &reg,
                       &info)
                .ok());
    CHECK(info.width == 150);
    CHECK(info.height == 100);
    CHECK(info.components == (c == 0 ? 1 : 3));  // gray stays gray; RGBA resized is RGB
    const uint8_t want[3] = {uint8_t(c ? 200 : 90), uint8_t(c ? 120 : 90), uint8_t(c ? 40 : 90)};
    for (int y = 0; y < reg.height; y += 13)
      for (int x = 0; x < reg.width; x += 17) CHECK(std::memcmp(reg.pixels + reg.stride * y + 3 * x, want, 3) == 0);
  }
  // Within the rule an array is encoded as it is: RGBA keeps its alpha.
  {
    pickle::NdArray a;
    a.shape = {50, 60, 4};
    std::vector<uint8_t> px(50 * 60 * 4, 77);
    a.data = Bytes::Copy(px.data(), px.size());
    Sample s;
    s.key = "small";
    s.set("npy", pickle::ToNpy(a));
    REQUIRE(decode::TransformSampleImages(&s, spec).ok());
    const Field* img = s.find("png");
    REQUIRE(img != nullptr);
    auto same = decode::EncodeNpy(pickle::ToNpy(a), spec.encode);
    REQUIRE(same.ok());
    CHECK(img->data.str() == same->str());
  }
  // An array that is no image is refused naming the sample.
  pickle::NdArray f;
  f.dtype = {'f', 4, '<'};
  f.shape = {2, 2};
  float v[4] = {};
  f.data = Bytes::Copy(v, sizeof v);
  Sample bad;
  bad.key = "floats";
  bad.set("npy", pickle::ToNpy(f));
  Status st = decode::TransformSampleImages(&bad, spec);
  CHECK(st.code() == Code::kUnsupported);
  CHECK_THAT(st.message(), Catch::Contains("sample 'floats'") && Catch::Contains("uint8 only"));
}

TEST_CASE("transform: --resize and --encode jpeg, webp and png decode in Pillow to the rule's size",
          "[transform]") {
  TempDir t;
  MakeSource(t / "in");
  const std::map<std::string, std::string> want = {
      {"c0/a", "341 256"}, {"c0/b", "256 427"}, {"c1/c", "200 120"}, {"c1/d", "1000 200"}};
  const std::map<std::string, std::string> src = {
      {"c0/a", t / "in/c0/a.jpg"}, {"c0/b", t / "in/c0/b.jpg"}, {"c1/c", t / "in/c1/c.png"}, {"c1/d", t / "in/c1/d.jpg"}};
  for (std::string encode : {"", "webp:90", "png"}) {
    INFO("encode '" << encode << "'");
    const std::string out = t / fmt::format("o{}", encode.empty() ? "" : encode.substr(0, 1));
    ConvertOptions o;
    o.resize = "short:256";
    o.encode = encode;
    o.threads = 3;
    auto r = Convert(t / "in", "wds:" + out + "/t-%06d.tar", o);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(nlohmann::json::parse(r->transform) ==
          nlohmann::json{{"resize", "short:256"}, {"encode", encode.empty() ? "jpeg:90" : encode}, {"orientation", "applied"}});
    auto m = nlohmann::json::parse(sk_test::ReadFile(out + "/t.manifest.json"));
    CHECK(m["transform"]["resize"] == "short:256");
    auto samples = ReadAll(out + "/t.manifest.json");
    REQUIRE(samples.size() == 4);
    const std::string ext = encode.empty() ? "jpg" : encode == "png" ? "png" : "webp";
    const std::string pil_format = encode.empty() ? "JPEG" : encode == "png" ? "PNG" : "WEBP";
    for (const auto& [key, s] : samples) {
      INFO(key);
      REQUIRE(s.find(ext) != nullptr);
      CHECK(s.find("cls") != nullptr);
      sk_test::WriteFile(t / "x.img", s.find(ext)->data.str());
      PilView v = Parse(PilCompare(src.at(key), t / "x.img"));
      CHECK(v.format == pil_format);
      CHECK(fmt::format("{} {}", v.w, v.h) == want.at(key));
      CHECK(v.exif == 0);
      CHECK(v.diff >= 0);
      CHECK(v.diff < (encode == "png" ? 2.5 : 4.0));  // close to Pillow's own BILINEAR resize
    }
  }
}

TEST_CASE("transform: the output is the same for any thread count and for parts, and --resume continues it",
          "[transform][parts]") {
  TempDir t;
  MakeSource(t / "in");
  sk_test::WriteFile(t / "in/c0/e.jpg", WithOrientation(Gradient(400, 300, 5), 8));
  auto run = [&](const std::string& dir, int threads, PartSpec part = {}) {
    ConvertByTwo(t / "in", dir, threads, part, /*skip_bad=*/false);
  };
  run(t / "one", 1);
  run(t / "four", 4);
  run(t / "parts", 2, PartSpec{0, 2, "test"});
  run(t / "parts", 2, PartSpec{1, 2, "test"});
  auto merged = Merge("wds:" + (t / "parts/t-%06d.tar"));
  INFO(merged.status().ToString());
  REQUIRE(merged.ok());
  auto one = Files(t / "one");
  CHECK(one.size() >= 3 * 3 + 1);  // 3 shards with .idx and .xxh3, the manifest
  CHECK(Files(t / "four") == one);
  CHECK(MergedFiles(t / "parts") == one);

  // A size-cut plan cannot be made before the images are transformed.
  ConvertOptions o;
  o.resize = "max:128";
  o.part = PartSpec{0, 2, "test"};
  auto sized = Convert(t / "in", "wds:" + (t / "sized/t-%06d.tar"), o);
  REQUIRE_FALSE(sized.ok());
  CHECK_THAT(sized.status().message(), Catch::Contains("--samples-per-shard"));

  // Interrupted after 3 samples (SIGTERM), then resumed: the bytes of an uninterrupted run.
  const std::string cmd = fmt::format("convert {} {} --resize max:128 --samples-per-shard 2 --threads 2",
                                      Q(t / "in"), Q("wds:" + (t / "res/t-%06d.tar")));
  auto killed = sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE=15@3 {} {}", Q(SHARDKIT_CLI), cmd));
  CHECK(killed.exit_code == 143);
  CHECK_FALSE(fs::exists(t / "res/t.manifest.json"));
  // A resume with another rule is refused by name, before a byte is written.
  const std::string other = fmt::format("convert {} {} --resize max:64 --samples-per-shard 2 --threads 2 --resume",
                                        Q(t / "in"), Q("wds:" + (t / "res/t-%06d.tar")));
  auto refused = sk_test::Cli(other);
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.err, Catch::Contains("transform") && Catch::Contains("max:128"));
  auto resumed = sk_test::Cli(cmd + " --resume");
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(Files(t / "res") == one);
}

TEST_CASE("transform: an image that does not decode fails naming its key, or --skip-bad lists it in skipped.json",
          "[transform]") {
  TempDir t;
  MakeSource(t / "in");
  std::string broken = Gradient(300, 200, 6);
  broken.resize(broken.size() / 3);  // truncated
  sk_test::WriteFile(t / "in/c1/broken.jpg", broken);
  sk_test::WriteFile(t / "in/c1/notjpeg.jpg", "GIF89a this is no JPEG");

  ConvertOptions o;
  o.resize = "short:64";
  auto fail = Convert(t / "in", "wds:" + (t / "a/t-%06d.tar"), o);
  REQUIRE_FALSE(fail.ok());
  CHECK_THAT(fail.status().ToString(), Catch::Contains("c1/broken"));
  CHECK_FALSE(fs::exists(t / "a/t.manifest.json"));
  CHECK_FALSE(fs::exists(t / "a/t-000000.tar"));

  o.skip_bad = true;
  auto ok = Convert(t / "in", "wds:" + (t / "b/t-%06d.tar"), o);
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  CHECK(ok->samples == 4);
  CHECK(ok->skipped == 2);
  CHECK(ok->skipped_file == t / "b/skipped.json");
  auto j = nlohmann::json::parse(sk_test::ReadFile(t / "b/skipped.json"));
  CHECK(j["count"] == 2);
  REQUIRE(j["skipped"].size() == 2);
  CHECK(j["skipped"][0]["key"] == "c1/broken");
  CHECK(j["skipped"][1]["key"] == "c1/notjpeg");
  CHECK_THAT(j["skipped"][1]["reason"].get<std::string>(), Catch::Contains("c1/notjpeg"));
  CHECK(ReadAll(t / "b/t.manifest.json").size() == 4);

  // Under --num-shards the plan counts source samples: [a, b, broken] and [c, d, notjpeg].
  ShardOptions so;
  so.resize = "short:64";
  so.skip_bad = true;
  so.num_shards = 2;
  auto planned = Shard(t / "in", t / "c/t-%06d.tar", so);
  INFO(planned.status().ToString());
  REQUIRE(planned.ok());
  REQUIRE(planned->shards.size() == 2);
  CHECK(planned->shards[0].samples == 2);
  CHECK(planned->shards[1].samples == 2);
  CHECK(planned->skipped == 2);

  // The command line: the summary and --json count them.
  auto cli = sk_test::Cli(fmt::format("shard {} {} --resize short:64 --skip-bad --json", Q(t / "in"),
                                      Q(t / "d/t-%06d.tar")));
  INFO(cli.err);
  REQUIRE(cli.exit_code == 0);
  auto js = nlohmann::json::parse(cli.out);
  CHECK(js["skipped"] == 2);
  CHECK(js["samples"] == 4);
  CHECK(js["transform"]["encode"] == "jpeg:90");
  auto plain = sk_test::Cli(fmt::format("convert {} {} --resize short:64", Q(t / "in"), Q("wds:" + (t / "e/t-%06d.tar"))));
  CHECK(plain.exit_code == 1);
  CHECK_THAT(plain.err, Catch::Contains("c1/broken"));
}

TEST_CASE("transform: --skip-bad under a shard plan keeps every sample in its planned shard, in one process, in "
          "parts and resumed",
          "[transform][parts]") {
  TempDir t;
  MakeSource(t / "in");
  std::string broken = Gradient(300, 200, 6);
  broken.resize(broken.size() / 3);  // truncated
  sk_test::WriteFile(t / "in/c1/bad2.jpg", Gradient(200, 200, 7).substr(0, 200));  // a JPEG header only
  sk_test::WriteFile(t / "in/c1/broken.jpg", broken);
  sk_test::WriteFile(t / "in/c1/notjpeg.jpg", "GIF89a this is no JPEG");
  // Source order a, b | bad2, broken | c, d | notjpeg: by 2 per shard, shards 1 and 3 are
  // all left out and written empty, so that the shard numbers stay the plan's.
  auto run = [&](const std::string& dir, int threads, PartSpec part = {}) {
    return ConvertByTwo(t / "in", dir, threads, part, /*skip_bad=*/true);
  };
  ConvertSummary one_sum = run(t / "one", 1);
  REQUIRE(one_sum.shards.size() == 4);
  CHECK(one_sum.shards[0].samples == 2);
  CHECK(one_sum.shards[1].samples == 0);
  CHECK(one_sum.shards[2].samples == 2);
  CHECK(one_sum.shards[3].samples == 0);
  CHECK(one_sum.samples == 4);
  CHECK(one_sum.skipped == 3);
  auto read = ReadAll(t / "one/t.manifest.json");
  CHECK(read.size() == 4);
  CHECK(read.count("c0/a") == 1);
  CHECK(read.count("c1/d") == 1);
  auto list = nlohmann::json::parse(sk_test::ReadFile(t / "one/skipped.json"));
  REQUIRE(list["skipped"].size() == 3);
  CHECK(list["skipped"][0]["key"] == "c1/bad2");
  CHECK(list["skipped"][2]["key"] == "c1/notjpeg");
  // verify: the empty shards are the plan's, noted and not findings.
  auto checked = Verify(t / "one/t.manifest.json", VerifyOptions{});
  REQUIRE(checked.ok());
  CHECK(checked->findings.empty());
  CHECK_THAT(checked->notes, Catch::VectorContains(std::string(
                                 "2 of 4 shards empty: --skip-bad left out every sample the shard plan gave them (not "
                                 "findings)")));
  auto one = Files(t / "one");
  run(t / "four", 4);
  CHECK(Files(t / "four") == one);

  // Two parts and three (part 1 of 3 holds only the empty shard 1), then merge: the
  // same shards, manifest and skipped.json.
  for (uint64_t parts : {2, 3}) {
    const std::string dir = t / fmt::format("parts{}", parts);
    for (uint64_t i = 0; i < parts; ++i) {
      ConvertSummary part = run(dir, 2, PartSpec{i, parts, "test"});
      CHECK(part.skipped_file.empty());  // the record lists them; merge writes the file
    }
    auto merged = Merge("wds:" + dir + "/t-%06d.tar");
    INFO(merged.status().ToString());
    REQUIRE(merged.ok());
    REQUIRE(merged->skipped);
    CHECK(merged->skipped->size() == 3);
    CHECK(merged->samples == 4);
    CHECK(MergedFiles(dir) == one);
  }
  // A record that lost its list no longer adds up to the plan: merge names the counts.
  {
    const std::string rec = t / "parts2/t.part-00000-of-00002.json";
    auto j = nlohmann::json::parse(sk_test::ReadFile(rec));
    REQUIRE(j.contains("skipped"));
    j.erase("skipped");
    sk_test::WriteFile(rec, j.dump(1) + "\n");
    auto refused = Merge("wds:" + (t / "parts2/t-%06d.tar"));
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.status().message(), Catch::Contains("4 samples and left out 1") && Catch::Contains("7"));
  }

  // Interrupted (SIGTERM) just before the fourth sample (d) is written: shard 0 and the empty 1
  // are committed, then --resume continues to the bytes of an uninterrupted run. A part
  // interrupted after its last planned position does the same.
  const std::string cmd = fmt::format("convert {} {} --resize max:128 --samples-per-shard 2 --skip-bad --threads 2",
                                      Q(t / "in"), Q("wds:" + (t / "res/t-%06d.tar")));
  auto killed = sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE=15@3 {} {}", Q(SHARDKIT_CLI), cmd));
  CHECK(killed.exit_code == 143);
  auto resumed = sk_test::Cli(cmd + " --resume");
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(Files(t / "res") == one);
  {  // A left-out image that decodes on resume is another source: refused by name.
    const std::string again = fmt::format("convert {} {} --resize max:128 --samples-per-shard 2 --skip-bad",
                                          Q(t / "in2"), Q("wds:" + (t / "res2/t-%06d.tar")));
    fs::copy(t / "in", t / "in2", fs::copy_options::recursive);
    CHECK(sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE=15@3 {} {}", Q(SHARDKIT_CLI), again)).exit_code == 143);
    sk_test::WriteFile(t / "in2/c1/bad2.jpg", Gradient(200, 200, 7));
    auto refused = sk_test::Cli(again + " --resume");
    CHECK(refused.exit_code != 0);
    CHECK_THAT(refused.err, Catch::Contains("c1/bad2") && Catch::Contains("left this sample out"));
  }
  const std::string part_cmd = fmt::format("convert {} {} --resize max:128 --samples-per-shard 2 --skip-bad --json",
                                           Q(t / "in"), Q("wds:" + (t / "pres/t-%06d.tar")));
  auto part_killed = sk_test::Run(fmt::format("SHARDKIT_TEST_RAISE=15@2 {} {} --part 0/2", Q(SHARDKIT_CLI), part_cmd));
  CHECK(part_killed.exit_code == 143);
  for (const char* p : {"0/2", "1/2"}) {
    auto r = sk_test::Cli(fmt::format("{} --part {} --resume", part_cmd, p));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(nlohmann::json::parse(r.out)["skipped"] == (std::string(p) == "0/2" ? 2 : 1));
  }
  auto m = sk_test::Cli(fmt::format("merge {} --json", Q("wds:" + (t / "pres/t-%06d.tar"))));
  INFO(m.err);
  REQUIRE(m.exit_code == 0);
  CHECK(nlohmann::json::parse(m.out)["skipped"] == 3);
  CHECK(MergedFiles(t / "pres") == one);

  // TFRecord follows the plan alike, its empty shards read back as empty.
  ShardOptions so;
  so.resize = "max:128";
  so.skip_bad = true;
  so.samples_per_shard = 2;
  auto tf = Shard(t / "in", "tfrecord:" + (t / "tf/x-%05d.tfrecord"), so);
  INFO(tf.status().ToString());
  REQUIRE(tf.ok());
  REQUIRE(tf->shards.size() == 4);
  CHECK(tf->shards[1].samples == 0);
  CHECK(ReadAll(t / "tf/x.tfrecord.json").size() == 4);
}

TEST_CASE("transform: --max-pixels refuses a larger image naming its key and declared size", "[transform]") {
  TempDir t;
  MakeSource(t / "in");
  ConvertOptions o;
  o.encode = "jpeg:80";
  o.max_pixels = 300 * 500;  // b.jpg (300x500) is within; a.jpg (640x480) and d.jpg (1000x200) are not
  auto r = Convert(t / "in", "wds:" + (t / "a/t-%06d.tar"), o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().ToString(), Catch::Contains("c0/a"));
  CHECK_THAT(r.status().ToString(), Catch::Contains("640x480"));
  o.skip_bad = true;
  auto s = Convert(t / "in", "wds:" + (t / "b/t-%06d.tar"), o);
  REQUIRE(s.ok());
  CHECK(s->samples == 2);
  auto j = nlohmann::json::parse(sk_test::ReadFile(t / "b/skipped.json"));
  REQUIRE(j["skipped"].size() == 2);
  CHECK(j["skipped"][0]["key"] == "c0/a");
  CHECK(j["skipped"][1]["key"] == "c1/d");
  CHECK_THAT(j["skipped"][1]["reason"].get<std::string>(), Catch::Contains("1000x200"));
}

TEST_CASE("transform: verify --against checks a transformed dataset by keys, labels and sizes", "[transform][verify]") {
  TempDir t;
  MakeSource(t / "in");
  sk_test::WriteFile(t / "in/c0/e.jpg", WithOrientation(Gradient(400, 300, 5), 6));
  ConvertOptions o;
  o.resize = "short:100";
  REQUIRE(Convert(t / "in", "wds:" + (t / "a/t-%06d.tar"), o).ok());
  VerifyOptions v;
  v.against = t / "in";
  auto good = Verify(t / "a/t.manifest.json", v);
  REQUIRE(good.ok());
  INFO((good->findings.empty() ? std::string() : good->findings[0].message));
  CHECK(good->findings.empty());
  CHECK(good->count(FindingKind::kDifferent) == 0);

  // The same data under a record that claims another rule: every resized image is off.
  auto bad = Verify(MisrecordedResize(t / "in", t / "b", o), v);
  REQUIRE(bad.ok());
  CHECK(bad->count(FindingKind::kDifferent) == 5);  // every image's short side is over 90
  bool named = false;
  for (const auto& f : bad->findings)
    if (f.where.key == "c0/e" && f.message.find("the resize rule gives 100x133") != std::string::npos) named = true;
  CHECK(named);
  auto cli = sk_test::Cli(fmt::format("verify {} --against {}", Q(t / "b/t.manifest.json"), Q(t / "in")));
  CHECK(cli.exit_code == 1);
  auto cli_ok = sk_test::Cli(fmt::format("verify {} --against {}", Q(t / "a/t.manifest.json"), Q(t / "in")));
  INFO(cli_ok.out << cli_ok.err);
  CHECK(cli_ok.exit_code == 0);
}

TEST_CASE("transform: a dataset of decoded arrays converts with --resize and verify --against passes",
          "[transform][verify]") {
  TempDir t;
  {
    WriteOptions wo;
    wo.class_names = {"a", "b"};
    wo.array_channels = "rgb";
    auto w = Create("wds:" + (t / "src/s-%06d.tar"), wo);
    REQUIRE(w.ok());
    for (int i = 0; i < 4; ++i) {
      pickle::NdArray a;
      const uint64_t h = 120 + 40 * uint64_t(i), wd = 260 - 30 * uint64_t(i);
      a.shape = {h, wd, 3};
      std::vector<uint8_t> px(h * wd * 3, uint8_t(40 * i));
      a.data = Bytes::Copy(px.data(), px.size());
      Sample s;
      s.key = fmt::format("k{}", i);
      s.set("npy", pickle::ToNpy(a));
      s.set_label(i % 2);
      REQUIRE((*w)->Write(s).ok());
    }
    REQUIRE((*w)->Finish().ok());
  }
  ConvertOptions o;
  o.resize = "short:100";
  o.encode = "png";
  auto conv = Convert(t / "src/s.manifest.json", "wds:" + (t / "out/t-%06d.tar"), o);
  INFO(conv.status().ToString());
  REQUIRE(conv.ok());
  auto samples = ReadAll(t / "out/t.manifest.json");
  REQUIRE(samples.size() == 4);
  CHECK(samples.at("k0").find("npy") == nullptr);
  REQUIRE(samples.at("k0").find("png") != nullptr);
  VerifyOptions v;
  v.against = t / "src/s.manifest.json";
  auto good = Verify(t / "out/t.manifest.json", v);
  REQUIRE(good.ok());
  INFO((good->findings.empty() ? std::string() : good->findings[0].message));
  CHECK(good->findings.empty());
  // Under a record that claims another rule, every array's image is off.
  auto bad = Verify(MisrecordedResize(t / "src/s.manifest.json", t / "b", o), v);
  REQUIRE(bad.ok());
  CHECK(bad->count(FindingKind::kDifferent) == 4);
}

TEST_CASE("transform: every output format records the transform, gives it back and verify --against passes",
          "[transform][verify]") {
  TempDir t;
  MakeSource(t / "in");
  sk_test::WriteFile(t / "in/c0/e.jpg", WithOrientation(Gradient(400, 300, 5), 6));
  struct Case {
    std::string format, out, open, record;  // record: the file holding it (hdf5: the file of the attribute)
  };
  const std::vector<Case> cases = {
      {"lmdb", "lmdb:" + (t / "l.lmdb"), "lmdb:" + (t / "l.lmdb"), t / "l.lmdb/shardkit.json"},
      {"hdf5", "hdf5:" + (t / "h.h5"), "hdf5:" + (t / "h.h5"), t / "h.h5"},
      {"mds", "mds:" + (t / "m"), "mds:" + (t / "m"), t / "m/shardkit.json"},
      {"tfrecord", "tfrecord:" + (t / "f/t-%05d.tfrecord"), t / "f/t.tfrecord.json", t / "f/t.tfrecord.json"},
      {"recordio", "recordio:" + (t / "r/t.rec"), "recordio:" + (t / "r/t.rec"), t / "r/t.shardkit.json"},
      {"folder", "folder:" + (t / "d"), "folder:" + (t / "d"), t / "d/.shardkit-folder.json"},
  };
  const nlohmann::json want = {{"resize", "short:100"}, {"encode", "jpeg:90"}, {"orientation", "applied"}};
  for (const Case& c : cases) {
    INFO(c.format);
    ConvertOptions o;
    o.resize = "short:100";
    auto r = Convert(t / "in", c.out, o);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(nlohmann::json::parse(r->transform) == want);
    auto ds = Open(c.open);
    INFO(ds.status().ToString());
    REQUIRE(ds.ok());
    const auto& extra = (*ds)->info().extra;
    auto it = extra.find("transform");
    REQUIRE(it != extra.end());
    CHECK(it->second == nlohmann::json::parse(r->transform).dump());  // the record, compact
    CHECK(nlohmann::json::parse(it->second) == want);
    // The record in the format's own metadata.
    if (c.format == "hdf5") {
      auto py = sk_test::Run(fmt::format("{} -c {} {}", kPy,
                                         Q("import sys, h5py; v = h5py.File(sys.argv[1], 'r').attrs['transform']; "
                                           "print(v.decode() if isinstance(v, bytes) else v)"),
                                         Q(c.record)));
      INFO(py.err);
      REQUIRE(py.exit_code == 0);
      CHECK(nlohmann::json::parse(py.out) == want);
    } else {
      CHECK(nlohmann::json::parse(sk_test::ReadFile(c.record))["transform"] == want);
    }
    // verify --against: the images differ by design; keys, labels and sizes agree.
    VerifyOptions v;
    v.against = t / "in";
    auto good = Verify(c.open, v);
    INFO(good.status().ToString());
    REQUIRE(good.ok());
    INFO((good->findings.empty() ? std::string() : good->findings[0].message));
    CHECK(good->findings.empty());
    auto cli = sk_test::Cli(fmt::format("verify {} --against {}", Q(c.open), Q(t / "in")));
    INFO(cli.out << cli.err);
    CHECK(cli.exit_code == 0);
  }

  // A record that is not a JSON object is refused, naming the file that holds it.
  for (const Case& c : cases) {
    INFO(c.format);
    if (c.format == "hdf5") {
      auto py = sk_test::Run(fmt::format("{} -c {} {}", kPy,
                                         Q("import sys, h5py; f = h5py.File(sys.argv[1], 'r+'); "
                                           "f.attrs['transform'] = '\"short:100\"'; f.close()"),
                                         Q(c.record)));
      INFO(py.err);
      REQUIRE(py.exit_code == 0);
    } else {
      auto j = nlohmann::json::parse(sk_test::ReadFile(c.record));
      j["transform"] = "short:100";
      sk_test::WriteFile(c.record, j.dump());
    }
    auto ds = Open(c.open);
    REQUIRE_FALSE(ds.ok());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK_THAT(ds.status().ToString(), Catch::Contains("transform is not a JSON object"));
    CHECK_THAT(ds.status().ToString(), Catch::Contains(c.record));
  }

  // A transform to record that is not a JSON object is the caller's error.
  WriteOptions w;
  w.transform = "[1]";
  w.class_names = {"c0"};
  auto wr = Create("lmdb:" + (t / "bad.lmdb"), w);
  REQUIRE(wr.ok());
  auto fin = (*wr)->Finish();
  REQUIRE_FALSE(fin.ok());
  CHECK(fin.status().code() == Code::kInvalidArgument);
  CHECK_THAT(fin.status().message(), Catch::Contains("not a JSON object"));
}

TEST_CASE("transform: bad --resize and --encode values are usage errors", "[transform][cli]") {
  TempDir t;
  MakeSource(t / "in");
  const std::string in = Q(t / "in"), out = Q("wds:" + (t / "o/t-%06d.tar"));
  for (std::string args : {"--resize short:0", "--resize max:-5", "--resize fit:10", "--resize banana",
                           "--encode gif", "--encode jpeg:101", "--resize short:64 --encode keep", "--skip-bad"}) {
    for (const char* cmd : {"convert", "shard"}) {
      INFO(cmd << " " << args);
      auto r = sk_test::Cli(fmt::format("{} {} {} {}", cmd, in, out, args));
      CHECK(r.exit_code == 2);
      CHECK_THAT(r.err, Catch::StartsWith("shardkit: error: "));
      const std::string value = args.substr(args.find(' ') + 1, args.find(' ', args.find(' ') + 1) - args.find(' ') - 1);
      if (args != "--skip-bad") CHECK_THAT(r.err, Catch::Contains(value));
      CHECK_FALSE(fs::exists(t / "o"));
    }
  }
}
