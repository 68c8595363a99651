// WebP, AVIF and JPEG XL decoding (decode/codecs.h), 16-bit and palette PNG, and the
// pixel limit of every codec, against independent encoders and decoders: cwebp/dwebp,
// avifenc/avifdec, cjxl/djxl (Debian's webp, libavif-bin, libjxl-tools) and Pillow
// (/usr/bin/python3). The tools are required: a missing one fails the test.
#include <catch2/catch.hpp>
#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/paths.h"
#include "decode/codecs.h"
#include "decode/jpeg.h"
#include "loader_support.h"
#include "shardkit/loader.h"
#include "shardkit/verify.h"
#include "support.h"

using namespace shardkit;
using namespace shardkit::decode;
using sk_test::Cli;
using sk_test::Q;
using sk_test::ReadFile;
using sk_test::TempDir;
using sk_test::WriteFile;

namespace {

struct Img {
  int w = 0, h = 0;
  std::vector<uint8_t> px;  // RGB, packed rows
};

// Smooth gradients with some texture: lossy codecs keep such pixels close.
Img Pattern(int w, int h, uint32_t seed) {
  Img im{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &im.px[(size_t(y) * w + x) * 3];
      p[0] = uint8_t((x * 255 / std::max(1, w - 1) + seed * 17) & 255);
      p[1] = uint8_t((y * 255 / std::max(1, h - 1) + seed * 29) & 255);
      p[2] = uint8_t(((x + y) * 2 + ((x / 8 + y / 8) % 2) * 40 + seed) & 255);
    }
  return im;
}

void WritePng(const std::string& path, const Img& im, int format = PNG_FORMAT_RGB) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = uint32_t(im.w);
  img.height = uint32_t(im.h);
  img.format = uint32_t(format);
  REQUIRE(png_image_write_to_file(&img, path.c_str(), 0, im.px.data(), 0, nullptr));
}

// A 16-bit RGB PNG (no gAMA/sRGB chunk) of `px` (big-endian samples written by libpng).
void WritePng16(const std::string& path, int w, int h, const std::vector<uint16_t>& px) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  REQUIRE(setjmp(png_jmpbuf(png)) == 0);
  png_init_io(png, f);
  png_set_IHDR(png, info, uint32_t(w), uint32_t(h), 16, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_set_swap(png);  // host (little-endian) order in, big-endian in the file
  for (int y = 0; y < h; ++y) png_write_row(png, reinterpret_cast<png_const_bytep>(&px[size_t(y) * w * 3]));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// A PNG written by a tool, read with libpng (8-bit files only: what the tools write here).
Img ReadPng(const std::string& path) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&img, path.c_str()));
  REQUIRE(PNG_IMAGE_SAMPLE_COMPONENT_SIZE(img.format) == 1);
  img.format = PNG_FORMAT_RGB;
  Img im{int(img.width), int(img.height), std::vector<uint8_t>(PNG_IMAGE_SIZE(img))};
  REQUIRE(png_image_finish_read(&img, nullptr, im.px.data(), 0, nullptr));
  return im;
}

// Runs a command that must succeed.
void Sh(const std::string& cmd) {
  auto r = sk_test::Run(cmd);
  INFO(cmd << "\n" << r.out << r.err);
  REQUIRE(r.exit_code == 0);
}

// The tool's path; the test fails (does not skip) without it: CI installs them
// (scripts/install-deps.sh).
std::string Tool(const std::string& name) {
  auto r = sk_test::Run("command -v " + name);
  INFO(name << " is needed (Debian: webp, libavif-bin, libjxl-tools; scripts/install-deps.sh)");
  REQUIRE(r.exit_code == 0);
  return name;
}

const char* kPython = "/usr/bin/python3";  // Debian's, with Pillow and numpy

Status DecodeBytes(const std::string& bytes, Img* out, ImageInfo* info = nullptr, Limits lim = {}) {
  ImageDecoder dec(lim);
  Region r;
  Status st = dec.DecodeAll(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &r, info);
  if (!st.ok()) return st;
  out->w = r.width;
  out->h = r.height;
  out->px.resize(size_t(r.width) * r.height * 3);
  for (int y = 0; y < r.height; ++y)
    std::memcpy(&out->px[size_t(y) * r.width * 3], r.pixels + r.stride * size_t(y), size_t(r.width) * 3);
  return st;
}

Img Ours(const std::string& bytes, ImageInfo* info = nullptr) {
  Img im;
  Status st = DecodeBytes(bytes, &im, info);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return im;
}

int MaxDiff(const Img& a, const Img& b) {
  REQUIRE(a.w == b.w);
  REQUIRE(a.h == b.h);
  int m = 0;
  for (size_t i = 0; i < a.px.size(); ++i) m = std::max(m, std::abs(int(a.px[i]) - int(b.px[i])));
  return m;
}

Status DecodeStatus(const std::string& bytes, Limits lim = {}) {
  Img im;
  return DecodeBytes(bytes, &im, nullptr, lim);
}

// One file of each codec made from `src` (a PNG) by the command-line encoders.
struct Encoded {
  std::string webp, avif, jxl;
};
Encoded EncodeAll(const TempDir& dir, const std::string& src, bool lossless) {
  Encoded e;
  const std::string w = dir / "e.webp", a = dir / "e.avif", j = dir / "e.jxl";
  Sh(fmt::format("{} -quiet {} {} -o {}", Tool("cwebp"), lossless ? "-lossless -exact" : "-q 80", Q(src), Q(w)));
  Sh(fmt::format("{} -j 1 -s 8 {} {} {}", Tool("avifenc"), lossless ? "--lossless" : "--min 8 --max 24", Q(src), Q(a)));
  Sh(fmt::format("{} {} {} {} --quiet", Tool("cjxl"), Q(src), Q(j), lossless ? "-d 0" : "-d 1.0"));
  e.webp = ReadFile(w);
  e.avif = ReadFile(a);
  e.jxl = ReadFile(j);
  return e;
}

// The file decoded by its codec's own command-line decoder to a PNG, read back.
Img ToolDecode(const TempDir& dir, const std::string& bytes, const std::string& ext) {
  const std::string in = dir / ("d." + ext), out = dir / ("d-" + ext + ".png");
  WriteFile(in, bytes);
  if (ext == "webp") Sh(fmt::format("{} -quiet {} -o {}", Tool("dwebp"), Q(in), Q(out)));
  if (ext == "avif") Sh(fmt::format("{} -j 1 -d 8 {} {}", Tool("avifdec"), Q(in), Q(out)));
  if (ext == "jxl") Sh(fmt::format("{} {} {} --bits_per_sample=8 --quiet", Tool("djxl"), Q(in), Q(out)));
  return ReadPng(out);
}

// Pillow's decode of a file to raw RGB.
Img PillowDecode(const TempDir& dir, const std::string& bytes) {
  const std::string in = dir / "p.img", out = dir / "p.rgb";
  WriteFile(in, bytes);
  Sh(fmt::format("{} -c \"import sys; from PIL import Image; im = Image.open(sys.argv[1]).convert('RGB'); "
                 "open(sys.argv[2], 'wb').write(im.tobytes()); print(im.size[0], im.size[1])\" {} {} > {}",
                 kPython, Q(in), Q(out), Q(dir / "p.size")));
  Img im;
  std::string size = ReadFile(dir / "p.size");
  REQUIRE(std::sscanf(size.c_str(), "%d %d", &im.w, &im.h) == 2);
  std::string raw = ReadFile(out);
  im.px.assign(raw.begin(), raw.end());
  REQUIRE(im.px.size() == size_t(im.w) * im.h * 3);
  return im;
}

uint32_t Be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint8_t(s[at + 3]);
}
void PutBe32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + size_t(i)] = char((v >> (24 - 8 * i)) & 255);
}

// Every truncation (at 1/8 steps) and a damaged header are kCorrupt; bytes flipped at
// random in the payload give kCorrupt or pixels, never another code or a crash.
void CheckDamage(const std::string& good, size_t header_at, const char* codec) {
  INFO(codec);
  for (int k = 0; k < 8; ++k) {
    const size_t cut = good.size() * size_t(k) / 8;
    INFO("truncated to " << cut << " of " << good.size() << " bytes");
    Status st = DecodeStatus(good.substr(0, cut));
    CHECK(st.code() == Code::kCorrupt);
  }
  std::string bad = good;
  for (size_t i = header_at; i < std::min(bad.size(), header_at + 16); ++i) bad[i] = char(0xFF ^ uint8_t(bad[i]));
  {
    Status st = DecodeStatus(bad);
    INFO(st.ToString());
    CHECK(st.code() == Code::kCorrupt);
  }
  uint32_t rng = 12345;
  for (int t = 0; t < 40; ++t) {
    std::string flip = good;
    for (int n = 0; n < 8; ++n) {
      rng = rng * 1664525u + 1013904223u;
      const size_t at = header_at + (rng >> 8) % (flip.size() - header_at);
      flip[at] = char(uint8_t(flip[at]) ^ uint8_t(1 + (rng & 0x7F)));
    }
    Status st = DecodeStatus(flip);
    INFO(st.ToString());
    CHECK((st.ok() || st.code() == Code::kCorrupt || st.code() == Code::kUnsupported));
  }
}

}  // namespace

TEST_CASE("codecs: WebP, AVIF and JPEG XL are told apart by their bytes", "[codecs]") {
  TempDir dir;
  WritePng(dir / "s.png", Pattern(32, 24, 1));
  Encoded e = EncodeAll(dir, dir / "s.png", true);
  auto sniff = [](const std::string& b) { return Sniff(reinterpret_cast<const uint8_t*>(b.data()), b.size()); };
  CHECK(sniff(e.webp) == ImageFormat::kWebp);
  CHECK(sniff(e.avif) == ImageFormat::kAvif);
  CHECK(sniff(e.jxl) == ImageFormat::kJxl);
  CHECK(paths::SniffImageExt(reinterpret_cast<const uint8_t*>(e.avif.data()), e.avif.size()) == "avif");
  CHECK(paths::SniffImageExt(reinterpret_cast<const uint8_t*>(e.jxl.data()), e.jxl.size()) == "jxl");
  // The JPEG XL container (cjxl writes one when asked to keep metadata boxes).
  const std::string box("\0\0\0\x0cJXL \r\n\x87\n", 12);
  CHECK(sniff(box + "\0\0\0\x14" "ftypjxl ") == ImageFormat::kJxl);
  // AVIF by a compatible brand when the major brand is another (mif1), and not by 'ftyp'
  // alone (a HEIC or MP4 is no AVIF).
  std::string mif = e.avif;
  REQUIRE(mif.substr(4, 4) == "ftyp");
  REQUIRE(Be32(mif, 0) >= 20);
  bool compatible = false;
  for (size_t at = 16; at + 4 <= Be32(mif, 0); at += 4) compatible |= mif.substr(at, 4) == "avif";
  REQUIRE(compatible);
  mif.replace(8, 4, "mif1");
  CHECK(sniff(mif) == ImageFormat::kAvif);
  std::string heic = mif;
  for (size_t at = 16; at + 4 <= Be32(heic, 0); at += 4)
    if (heic.substr(at, 4) == "avif" || heic.substr(at, 4) == "avis") heic.replace(at, 4, "heic");
  CHECK(sniff(heic) == ImageFormat::kUnknown);
  CHECK(sniff(std::string("RIFF\0\0\0\0WAVE", 12)) == ImageFormat::kUnknown);
  CHECK(LoaderOptions{}.max_pixels == kDefaultMaxPixels);
  CHECK(VerifyOptions{}.max_pixels == kDefaultMaxPixels);
  CHECK(IsImageExt("avif"));
  CHECK(IsImageExt("jxl"));
}

TEST_CASE("codecs: lossless files decode to the exact pixels", "[codecs]") {
  TempDir dir;
  const Img src = Pattern(97, 61, 3);  // odd sizes: no codec block aligns
  WritePng(dir / "s.png", src);
  Encoded e = EncodeAll(dir, dir / "s.png", true);
  for (auto [name, bytes] : {std::pair{"WebP", &e.webp}, {"AVIF", &e.avif}, {"JPEG XL", &e.jxl}}) {
    INFO(name);
    ImageInfo info;
    Img got = Ours(*bytes, &info);
    CHECK(info.width == 97);
    CHECK(info.height == 61);
    CHECK(MaxDiff(got, src) == 0);
  }
}

TEST_CASE("codecs: lossy files decode as the codecs' own decoders and Pillow do", "[codecs]") {
  TempDir dir;
  const Img src = Pattern(160, 120, 5);
  WritePng(dir / "s.png", src);
  Encoded e = EncodeAll(dir, dir / "s.png", false);
  // The same libraries decode underneath: the pixels agree within rounding of the colour
  // conversion, and stay near the source.
  Img webp = Ours(e.webp);
  CHECK(MaxDiff(webp, ToolDecode(dir, e.webp, "webp")) <= 1);
  CHECK(MaxDiff(webp, PillowDecode(dir, e.webp)) <= 1);
  Img avif = Ours(e.avif);
  CHECK(MaxDiff(avif, ToolDecode(dir, e.avif, "avif")) <= 1);
  Img jxl = Ours(e.jxl);
  CHECK(MaxDiff(jxl, ToolDecode(dir, e.jxl, "jxl")) <= 2);
  for (const Img* im : {&webp, &avif, &jxl}) {
    double sum = 0;
    for (size_t i = 0; i < src.px.size(); ++i) sum += std::abs(int(im->px[i]) - int(src.px[i]));
    INFO("mean error " << sum / double(src.px.size()));
    CHECK(sum / double(src.px.size()) < 12.0);  // (an image of other pixels is ~80 away)
  }
}

TEST_CASE("codecs: alpha is dropped, grayscale expanded, high bit depth reduced to 8 bits", "[codecs]") {
  TempDir dir;
  const Img src = Pattern(40, 30, 7);
  SECTION("WebP with alpha (Pillow, lossless, exact): the colour samples as stored") {
    WritePng(dir / "s.png", src);
    Sh(fmt::format("{} -c \"import sys; from PIL import Image; im = Image.open(sys.argv[1]).convert('RGBA'); "
                   "im.putalpha(Image.linear_gradient('L').resize(im.size).point(lambda v: 128 + v // 2)); "
                   "im.save(sys.argv[2], lossless=True, exact=True)\" {} {}",
                   kPython, Q(dir / "s.png"), Q(dir / "a.webp")));
    ImageInfo info;
    Img got = Ours(ReadFile(dir / "a.webp"), &info);
    CHECK(info.components == 4);
    CHECK(MaxDiff(got, src) == 0);
  }
  SECTION("grayscale JPEG XL and AVIF") {
    Img gray{src.w, src.h, std::vector<uint8_t>(size_t(src.w) * src.h)};
    for (size_t i = 0; i < gray.px.size(); ++i) gray.px[i] = src.px[i * 3 + 1];
    WritePng(dir / "g.png", gray, PNG_FORMAT_GRAY);
    Sh(fmt::format("{} {} {} -d 0 --quiet", Tool("cjxl"), Q(dir / "g.png"), Q(dir / "g.jxl")));
    ImageInfo info;
    Img got = Ours(ReadFile(dir / "g.jxl"), &info);
    CHECK(info.components == 1);
    for (size_t i = 0; i < gray.px.size(); ++i)
      for (int c = 0; c < 3; ++c) REQUIRE(got.px[i * 3 + size_t(c)] == gray.px[i]);
    Sh(fmt::format("{} -j 1 -s 8 --yuv 400 --min 0 --max 0 {} {}", Tool("avifenc"), Q(dir / "g.png"),
                   Q(dir / "g.avif")));
    const std::string avif = ReadFile(dir / "g.avif");
    got = Ours(avif, &info);
    CHECK(info.components == 1);
    CHECK(MaxDiff(got, ToolDecode(dir, avif, "avif")) <= 1);
    for (size_t i = 0; i < gray.px.size(); ++i) CHECK(got.px[i * 3] == got.px[i * 3 + 2]);
  }
  SECTION("10- and 12-bit AVIF, 16-bit JPEG XL and PNG") {
    WritePng(dir / "s.png", src);
    for (int depth : {10, 12}) {
      INFO("AVIF depth " << depth);
      const std::string a = dir / fmt::format("d{}.avif", depth);
      Sh(fmt::format("{} -j 1 -s 8 -d {} --min 4 --max 16 {} {}", Tool("avifenc"), depth, Q(dir / "s.png"), Q(a)));
      ImageInfo info;
      Img got = Ours(ReadFile(a), &info);
      CHECK(info.bit_depth == depth);
      CHECK(MaxDiff(got, ToolDecode(dir, ReadFile(a), "avif")) <= 1);
    }
    // 16-bit samples: the rule is the nearest 8-bit value (v * 255 / 65535, rounded), at
    // most 1 from v >> 8.
    std::vector<uint16_t> px16(src.px.size());
    for (size_t i = 0; i < px16.size(); ++i) px16[i] = uint16_t(src.px[i] * 257 + (i * 37) % 200);
    WritePng16(dir / "d16.png", src.w, src.h, px16);
    Sh(fmt::format("{} {} {} -d 0 --quiet", Tool("cjxl"), Q(dir / "d16.png"), Q(dir / "d16.jxl")));
    for (const char* f : {"d16.png", "d16.jxl"}) {
      INFO(f);
      ImageInfo info;
      Img got = Ours(ReadFile(dir / f), &info);
      CHECK(info.bit_depth == 16);
      int worst = 0;
      for (size_t i = 0; i < px16.size(); ++i) worst = std::max(worst, std::abs(int(got.px[i]) - (px16[i] >> 8)));
      CHECK(worst <= 1);
    }
  }
}

TEST_CASE("codecs: palette and 16-bit PNG decode to 8-bit RGB as numpy and Pillow read them", "[codecs]") {
  TempDir dir;
  // Pillow writes a palette PNG (with a tRNS chunk too) and a 16-bit one made with numpy;
  // its RGB for the palette image, numpy's samples >> 8 for the 16-bit one.
  Sh(fmt::format(
      "{} -c \"import sys, numpy as np; from PIL import Image\n"
      "rgb = np.zeros((30, 50, 3), np.uint8); rgb[..., 0] = np.arange(50) * 5; rgb[..., 1] = np.arange(30)[:, None] * 8\n"
      "p = Image.fromarray(rgb).quantize(colors=37); p.info['transparency'] = 3; p.save(sys.argv[1] + '/p.png', transparency=3)\n"
      "open(sys.argv[1] + '/p.rgb', 'wb').write(p.convert('RGB').tobytes())\n"
      "g = (np.arange(30 * 50, dtype=np.uint32).reshape(30, 50) * 43 % 65536).astype(np.uint16)\n"
      "Image.fromarray(g).save(sys.argv[1] + '/g16.png')\n"
      "open(sys.argv[1] + '/g16.raw', 'wb').write((g >> 8).astype(np.uint8).tobytes())\" {}",
      kPython, Q(dir.path())));
  ImageInfo info;
  Img pal = Ours(ReadFile(dir / "p.png"), &info);
  const std::string want = ReadFile(dir / "p.rgb");
  CHECK(std::string(pal.px.begin(), pal.px.end()) == want);
  Img g = Ours(ReadFile(dir / "g16.png"), &info);
  CHECK(info.bit_depth == 16);
  const std::string shifted = ReadFile(dir / "g16.raw");
  REQUIRE(shifted.size() == size_t(g.w) * g.h);
  int worst = 0;
  for (size_t i = 0; i < shifted.size(); ++i) {
    REQUIRE(g.px[i * 3] == g.px[i * 3 + 1]);
    worst = std::max(worst, std::abs(int(g.px[i * 3]) - int(uint8_t(shifted[i]))));
  }
  CHECK(worst <= 1);
}

TEST_CASE("codecs: AVIF rotation and mirror (irot, imir) are applied", "[codecs]") {
  TempDir dir;
  const Img src = Pattern(24, 16, 9);
  WritePng(dir / "s.png", src);
  Sh(fmt::format("{} -j 1 -s 8 --lossless {} {}", Tool("avifenc"), Q(dir / "s.png"), Q(dir / "plain.avif")));
  Sh(fmt::format("{} -j 1 -s 8 --lossless --irot 1 {} {}", Tool("avifenc"), Q(dir / "s.png"), Q(dir / "rot.avif")));
  Sh(fmt::format("{} -j 1 -s 8 --lossless --imir 1 {} {}", Tool("avifenc"), Q(dir / "s.png"), Q(dir / "mir.avif")));
  CHECK(MaxDiff(Ours(ReadFile(dir / "plain.avif")), src) == 0);
  // irot 1: a quarter turn anti-clockwise: the source's top-right corner is at the top left.
  Img rot = Ours(ReadFile(dir / "rot.avif"));
  REQUIRE(rot.w == src.h);
  REQUIRE(rot.h == src.w);
  for (int y = 0; y < rot.h; ++y)
    for (int x = 0; x < rot.w; ++x)
      for (int c = 0; c < 3; ++c)
        REQUIRE(rot.px[(size_t(y) * rot.w + x) * 3 + c] == src.px[(size_t(x) * src.w + (src.w - 1 - y)) * 3 + c]);
  // imir mode 1: left and right exchanged.
  Img mir = Ours(ReadFile(dir / "mir.avif"));
  REQUIRE(mir.w == src.w);
  for (int y = 0; y < mir.h; ++y)
    for (int x = 0; x < mir.w; ++x)
      for (int c = 0; c < 3; ++c)
        REQUIRE(mir.px[(size_t(y) * mir.w + x) * 3 + c] == src.px[(size_t(y) * src.w + (src.w - 1 - x)) * 3 + c]);
}

TEST_CASE("codecs: corrupt and truncated files are kCorrupt, never a crash", "[codecs]") {
  TempDir dir;
  WritePng(dir / "s.png", Pattern(64, 48, 11));
  for (bool lossless : {false, true}) {
    Encoded e = EncodeAll(dir, dir / "s.png", lossless);
    // The header bytes damaged: WebP's chunk header after RIFF/WEBP, AVIF's meta box
    // (after ftyp), JPEG XL's size header after FF 0A.
    CheckDamage(e.webp, 12, "WebP");
    CheckDamage(e.avif, Be32(e.avif, 0), "AVIF");
    CheckDamage(e.jxl, 2, "JPEG XL");
  }
}

TEST_CASE("codecs: an image declaring more than max_pixels is refused naming its size", "[codecs]") {
  TempDir dir;
  WritePng(dir / "s.png", Pattern(64, 48, 13));
  Encoded e = EncodeAll(dir, dir / "s.png", false);
  Sh(fmt::format("{} -quiet -q 80 {} -o {}", Tool("cwebp"), Q(dir / "s.png"), Q(dir / "l.webp")));
  const std::string png = ReadFile(dir / "s.png"), jpg = sk_test::MakeJpeg(64, 48, 13);
  Limits small;
  small.max_pixels = 3000;  // under 64 x 48 = 3072
  for (auto [name, bytes] : {std::pair{"JPEG", &jpg}, {"PNG", &png}, {"WebP", &e.webp}, {"AVIF", &e.avif},
                             {"JPEG XL", &e.jxl}}) {
    INFO(name);
    Status st = DecodeStatus(*bytes, small);
    CHECK(st.code() == Code::kCorrupt);
    CHECK_THAT(st.message(), Catch::Contains("declares 64x48 pixels, over the limit") && Catch::Contains("3000"));
    small.max_pixels = 3072;  // the limit itself is allowed
    CHECK(DecodeStatus(*bytes, small).ok());
    small.max_pixels = 3000;
  }
  // Headers that declare a huge size over a few bytes of data, with the default limit:
  // each is refused by its declared size (allocating it would take gigabytes).
  SECTION("PNG: IHDR (with its CRC) of 20000 x 20000") {
    std::string huge = png;
    REQUIRE(huge.substr(12, 4) == "IHDR");
    PutBe32(&huge, 16, 20000);
    PutBe32(&huge, 20, 20000);
    PutBe32(&huge, 29, uint32_t(crc32(0, reinterpret_cast<const Bytef*>(huge.data() + 12), 17)));
    CHECK_THAT(DecodeStatus(huge).message(), Catch::Contains("declares 20000x20000 pixels"));
  }
  SECTION("WebP: a VP8 frame of 16383 x 16383") {
    std::string huge = e.webp;
    REQUIRE(huge.substr(12, 4) == "VP8 ");
    REQUIRE(huge.substr(23, 3) == "\x9d\x01\x2a");
    huge[26] = char(0xFF), huge[27] = char(0x3F), huge[28] = char(0xFF), huge[29] = char(0x3F);
    CHECK_THAT(DecodeStatus(huge).message(), Catch::Contains("declares 16383x16383 pixels"));
  }
  SECTION("AVIF: ispe of 20000 x 20000") {
    std::string huge = e.avif;
    const size_t at = huge.find("ispe");
    REQUIRE(at != std::string::npos);
    PutBe32(&huge, at + 8, 20000);
    PutBe32(&huge, at + 12, 20000);
    Status st = DecodeStatus(huge);
    CHECK(st.code() == Code::kCorrupt);
    CHECK_THAT(st.message(), Catch::Contains("declares 20000x20000 pixels"));
    // Also when the limit is libavif's alone (the primary item's ispe checked by libavif).
    uint32_t w = 0, h = 0;
    CHECK(AvifDeclaredSize(reinterpret_cast<const uint8_t*>(huge.data()), huge.size(), &w, &h));
    CHECK(w == 20000);
  }
  SECTION("JPEG XL: a size header of 20000 x 20000 (hand-made codestream)") {
    // FF 0A, then LSB-first bits: small=0, height U32 selector 3 (1 + u(30)), ratio 1
    // (width = height), then all_default metadata.
    uint64_t bits = 0;
    int n = 0;
    auto put = [&](uint64_t v, int count) {
      bits |= v << n;
      n += count;
    };
    put(0, 1);
    put(3, 2);
    put(20000 - 1, 30);
    put(1, 3);
    put(1, 1);
    std::string cs("\xff\x0a", 2);
    for (int i = 0; i < 8; ++i) cs += char((bits >> (8 * i)) & 255);
    cs += std::string(32, '\0');
    Status st = DecodeStatus(cs);
    CHECK(st.code() == Code::kCorrupt);
    CHECK_THAT(st.message(), Catch::Contains("declares 20000x20000 pixels"));
  }
}

namespace {

// A class folder of the same images as lossless PNG, WebP, AVIF and JPEG XL, one folder
// per codec; `misnamed` adds a WebP named .jpg.
void MakeCodecFolders(const TempDir& dir) {
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 3; ++i) {
      const std::string name = fmt::format("c{}/img{}", c, i);
      for (const char* f : {"png", "webp", "avif", "jxl", "mixed"})
        std::filesystem::create_directories(dir / fmt::format("{}/c{}", f, c));
      const std::string png = dir / ("png/" + name + ".png");
      WritePng(png, Pattern(48 + 8 * i, 40 + 4 * c, uint32_t(c * 3 + i)));
      Sh(fmt::format("{} -quiet -lossless -exact {} -o {}", Tool("cwebp"), Q(png), Q(dir / ("webp/" + name + ".webp"))));
      Sh(fmt::format("{} -j 1 -s 9 --lossless {} {}", Tool("avifenc"), Q(png), Q(dir / ("avif/" + name + ".avif"))));
      Sh(fmt::format("{} {} {} -d 0 -e 1 --quiet", Tool("cjxl"), Q(png), Q(dir / ("jxl/" + name + ".jxl"))));
      // mixed: one codec per image, and a WebP named .jpg (chosen by its bytes).
      const char* ext[] = {"webp", "avif", "jxl"};
      const std::string from = dir / fmt::format("{}/{}.{}", ext[(c + i) % 3], name, ext[(c + i) % 3]);
      const std::string to = dir / fmt::format("mixed/{}.{}", name, c == 1 && i == 2 ? "jpg" : ext[(c + i) % 3]);
      if (c == 1 && i == 2) REQUIRE(std::string(ext[(c + i) % 3]) == "webp");
      std::filesystem::copy_file(from, to);
    }
}

std::vector<sk_test::Seen> Load(const std::string& address, LoaderOptions o = {}) {
  o.shuffle = false;
  o.batch_size = 3;
  o.threads = 2;
  o.mode = AugmentMode::kEval;
  o.output_width = o.output_height = 32;
  o.resize_size = 36;
  o.dtype = DType::kUint8;
  o.layout = Layout::kNHWC;
  o.rank = 0;
  o.world_size = 1;
  auto l = Loader::Create(address, o);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  return sk_test::Drain(**l);
}

}  // namespace

TEST_CASE("codecs: the loader and verify --decode read folders of WebP, AVIF and JPEG XL", "[codecs][loader]") {
  TempDir dir;
  MakeCodecFolders(dir);
  const auto want = Load("folder:" + dir / "png");
  REQUIRE(want.size() == 2);
  for (const char* f : {"webp", "avif", "jxl", "mixed"}) {
    INFO(f);
    CHECK(Load("folder:" + dir / f) == want);  // same keys, labels and pixels as the PNGs
    auto v = Cli("verify " + Q("folder:" + dir / f) + " --decode");
    INFO(v.out << v.err);
    CHECK(v.exit_code == 0);
    CHECK_THAT(v.out + v.err, Catch::Contains("6 images decoded"));
  }
  SECTION("a damaged file of each codec: the loader and verify name its key") {
    for (const char* f : {"c0/img0.webp", "c0/img1.avif", "c0/img2.jxl"}) {
      const std::string p = dir / ("mixed/" + std::string(f));
      const std::string b = ReadFile(p);
      WriteFile(p, b.substr(0, b.size() / 2));
    }
    auto v = Cli("verify " + Q("folder:" + dir / "mixed") + " --decode --json");
    INFO(v.out << v.err);
    CHECK(v.exit_code == 1);
    for (const char* key : {"c0/img0", "c0/img1", "c0/img2"}) CHECK_THAT(v.out, Catch::Contains(key));
    CHECK_THAT(v.out, Catch::Contains("WebP") && Catch::Contains("AVIF") && Catch::Contains("JPEG XL"));
    LoaderOptions o;
    o.shuffle = false;
    o.batch_size = 6;
    o.on_error = DecodeErrorPolicy::kError;
    o.rank = 0;
    o.world_size = 1;
    auto l = Loader::Create("folder:" + dir / "mixed", o);
    REQUIRE(l.ok());
    auto b = (*l)->Next();
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().code() == Code::kCorrupt);
    CHECK_THAT(b.status().ToString(), Catch::Contains("c0/img0"));
  }
  SECTION("max_pixels: the loader and verify refuse images over it, naming key and size") {
    LoaderOptions o;
    o.max_pixels = 2000;  // c0/img0 is 48x40 = 1920, the others are larger
    o.on_error = DecodeErrorPolicy::kSkip;
    o.shuffle = false;
    o.batch_size = 6;
    o.rank = 0;
    o.world_size = 1;
    auto l = Loader::Create("folder:" + dir / "mixed", o);
    REQUIRE(l.ok());
    auto b = (*l)->Next();
    REQUIRE(b.ok());
    CHECK(b->size() == 1);
    std::string skipped;
    for (const auto& st : (*l)->skipped()) skipped += st.ToString() + "\n";
    INFO(skipped);
    CHECK_THAT(skipped, Catch::Contains("c1/img2") && Catch::Contains("declares 64x44 pixels"));
    o.max_pixels = 0;
    CHECK(Loader::Create("folder:" + dir / "mixed", o).status().code() == Code::kInvalidArgument);
    auto v = Cli("verify " + Q("folder:" + dir / "mixed") + " --decode --max-pixels 2000");
    INFO(v.out << v.err);
    CHECK(v.exit_code == 1);
    CHECK_THAT(v.out, Catch::Contains("c0/img1") && Catch::Contains("declares 56x40 pixels"));
    VerifyOptions vo;
    vo.decode = true;
    vo.max_pixels = 2000;
    auto r = Verify("folder:" + dir / "mixed", vo);
    REQUIRE(r.ok());
    CHECK(r->count(FindingKind::kDecodeError) == 5);
    CHECK(Cli("verify " + Q("folder:" + dir / "mixed") + " --decode --max-pixels 0").exit_code == 2);
  }
}
