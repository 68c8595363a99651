// The per-sample image transform of convert (see transform.h).
#pragma GCC optimize("O3")
#include "decode/transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>
#include <turbojpeg.h>

namespace shardkit::decode {

namespace {

// "N" with 1 <= N <= 65535, or 0.
int ParseSide(std::string_view s) {
  if (s.empty() || s.size() > 5) return 0;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v >= 1 && v <= 65535 ? v : 0;
}

// round(a * b / c), half up, for positive values; at least 1.
int RoundRatio(int64_t a, int64_t b, int64_t c) {
  return int(std::max<int64_t>(1, (2 * a * b + c) / (2 * c)));
}

uint16_t Get16(const uint8_t* p, bool le) { return le ? uint16_t(p[0] | p[1] << 8) : uint16_t(p[0] << 8 | p[1]); }
uint32_t Get32(const uint8_t* p, bool le) {
  return le ? uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24
            : uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// The orientation tag of EXIF data: a TIFF block, after a "Exif\0\0" prefix where there
// is one (JPEG's APP1 always, WebP's and PNG's chunks as some writers do); 1 without one.
int ExifOrientation(const uint8_t* p, size_t n) {
  if (n >= 6 && std::memcmp(p, "Exif\0\0", 6) == 0) {
    p += 6;
    n -= 6;
  }
  if (n < 8) return 1;
  const uint8_t* t = p;
  const size_t tn = n;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') le = true;
  else if (t[0] == 'M' && t[1] == 'M') le = false;
  else return 1;
  if (Get16(t + 2, le) != 42) return 1;
  const uint32_t ifd = Get32(t + 4, le);
  if (ifd > tn || tn - ifd < 2) return 1;
  const uint32_t count = Get16(t + ifd, le);
  if ((tn - ifd - 2) / 12 < count) return 1;
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* e = t + ifd + 2 + 12 * i;
    if (Get16(e, le) != 0x0112) continue;
    // SHORT (3), count 1: the value sits in the first two bytes of the value field.
    if (Get16(e + 2, le) != 3 || Get32(e + 4, le) != 1) return 1;
    const int v = Get16(e + 8, le);
    return v >= 1 && v <= 8 ? v : 1;
  }
  return 1;
}

// The JPEG's markers before its first scan: the EXIF orientation and the frame's size.
struct JpegHead {
  int orientation = 1;
  int width = 0, height = 0;
  int sof = 0;  // the frame's marker: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...
};
JpegHead ScanJpeg(const uint8_t* d, size_t n) {
  JpegHead h;
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return h;
  bool exif_seen = false;
  size_t i = 2;
  while (i + 4 <= n) {
    if (d[i] != 0xFF) break;
    const uint8_t m = d[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) {  // no length
      i += 2;
      continue;
    }
    if (m == 0xDA || m == 0xD9) break;  // the first scan, or the end
    const size_t len = size_t(d[i + 2]) << 8 | d[i + 3];
    if (len < 2 || len > n - i - 2) break;
    const uint8_t* seg = d + i + 4;
    const size_t seg_n = len - 2;
    if (m == 0xE1 && !exif_seen && seg_n >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      exif_seen = true;  // the first Exif segment counts, as in libexif and PIL
      h.orientation = ExifOrientation(seg, seg_n);
    }
    const bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof && seg_n >= 5) {
      h.height = int(seg[1]) << 8 | seg[2];
      h.width = int(seg[3]) << 8 | seg[4];
      h.sof = m;
    }
    i += 2 + len;
  }
  return h;
}

// WebP's EXIF: the "EXIF" chunk of the RIFF container (extended format), or 1.
int WebpOrientation(const uint8_t* d, size_t n) {
  if (n < 12 || std::memcmp(d, "RIFF", 4) != 0 || std::memcmp(d + 8, "WEBP", 4) != 0) return 1;
  for (size_t i = 12; i + 8 <= n;) {
    const size_t len = Get32(d + i + 4, /*le=*/true);
    if (len > n - i - 8) break;
    if (std::memcmp(d + i, "EXIF", 4) == 0) return ExifOrientation(d + i + 8, len);
    i += 8 + len + (len & 1);  // (chunks are padded to an even size)
  }
  return 1;
}

// PNG's EXIF: the first "eXIf" chunk, or 1.
int PngOrientation(const uint8_t* d, size_t n) {
  if (n < 8 || std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) != 0) return 1;
  for (size_t i = 8; i + 12 <= n;) {
    const size_t len = Get32(d + i, /*le=*/false);
    if (len > n - i - 12) break;
    if (std::memcmp(d + i + 4, "eXIf", 4) == 0) return ExifOrientation(d + i + 8, len);
    if (std::memcmp(d + i + 4, "IEND", 4) == 0) break;
    i += 12 + len;
  }
  return 1;
}

// One axis of the triangle filter: for output pixel i, taps [start, start + count) of the
// source with 14-bit fixed-point weights that sum to exactly 1 << 14.
constexpr int kShift = 14;
struct Axis {
  int taps = 0;            // the same number of weights for every output pixel
  std::vector<int> start;  // the first input pixel of each output pixel's taps
  std::vector<int32_t> w;  // taps per output pixel (zero where the filter is)
};
// `scale`: input pixels per output pixel, in / out unless given (a chroma plane's: its
// luma plane's, so that both planes' samples keep their places).
void MakeAxis(int in, int out, Axis* a, double scale = 0) {
  if (scale <= 0) scale = double(in) / out;
  const double support = std::max(scale, 1.0);
  // Every output pixel gets `taps` weights over [start, start + taps), start clamped into
  // the image, so the inner loops have one trip count (the zeros add nothing).
  a->taps = std::min(in, int(std::ceil(support)) * 2 + 1);
  a->start.assign(out, 0);
  a->w.assign(size_t(out) * a->taps, 0);
  std::vector<double> f(size_t(a->taps) + 1);
  for (int i = 0; i < out; ++i) {
    const double c = (i + 0.5) * scale;
    int x0 = std::max(0, int(std::floor(c - support + 0.5)));
    int x1 = std::min(in, int(std::floor(c + support + 0.5)));
    x1 = std::min(x1, x0 + a->taps);
    double sum = 0;
    int n = 0;
    for (int x = x0; x < x1; ++x, ++n) {
      const double t = std::abs((x + 0.5 - c) / support);
      f[n] = t < 1.0 ? 1.0 - t : 0.0;
      sum += f[n];
    }
    if (n == 0 || sum <= 0) {  // degenerate: the nearest pixel
      x0 = std::clamp(int(std::floor(c)), 0, in - 1);
      n = 1;
      f[0] = sum = 1;
    }
    const int s0 = std::clamp(x0, 0, in - a->taps);
    int32_t* w = &a->w[size_t(i) * a->taps] + (x0 - s0);
    int32_t total = 0, big = 0;
    for (int k = 0; k < n; ++k) {
      w[k] = int32_t(std::lround(f[k] / sum * (1 << kShift)));
      total += w[k];
      if (w[k] > w[big]) big = k;
    }
    w[big] += (1 << kShift) - total;  // exact unit sum: a flat image stays flat
    a->start[i] = s0;
  }
}

inline uint8_t Clamp8(int32_t acc) {
  const int32_t v = (acc + (1 << (kShift - 1))) >> kShift;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Source (stored) pixel of upright pixel (x, y) for an orientation, W x H the stored size.
inline void StoredOf(int o, int x, int y, int W, int H, int* sx, int* sy) {
  switch (o) {
    case 2: *sx = W - 1 - x, *sy = y; break;
    case 3: *sx = W - 1 - x, *sy = H - 1 - y; break;
    case 4: *sx = x, *sy = H - 1 - y; break;
    case 5: *sx = y, *sy = x; break;
    case 6: *sx = y, *sy = H - 1 - x; break;
    case 7: *sx = W - 1 - y, *sy = H - 1 - x; break;
    case 8: *sx = W - 1 - y, *sy = x; break;
    default: *sx = x, *sy = y; break;
  }
}

// One decoder per thread (decoders are not thread-safe), made again when the limits differ.
ImageDecoder& ThreadDecoder(const Limits& l) {
  thread_local std::unique_ptr<ImageDecoder> dec;
  thread_local Limits have;
  if (!dec || have.max_pixels != l.max_pixels || have.max_side != l.max_side || have.max_scans != l.max_scans ||
      have.max_memory != l.max_memory) {
    dec = std::make_unique<ImageDecoder>(l);
    have = l;
  }
  return *dec;
}

CropBox Whole(const ImageInfo& im) { return CropBox{0, 0, double(im.width), double(im.height)}; }

}  // namespace

std::string ResizeRule::ToString() const {
  switch (kind) {
    case Kind::kShort: return fmt::format("short:{}", a);
    case Kind::kMax: return fmt::format("max:{}", a);
    case Kind::kFit: return fmt::format("fit:{}x{}", a, b);
    default: return "";
  }
}

Result<ResizeRule> ParseResize(std::string_view s) {
  ResizeRule r;
  const size_t colon = s.find(':');
  const std::string_view kind = s.substr(0, colon), arg = colon == std::string_view::npos ? "" : s.substr(colon + 1);
  if (kind == "short" || kind == "max") {
    r.kind = kind == "short" ? ResizeRule::Kind::kShort : ResizeRule::Kind::kMax;
    r.a = ParseSide(arg);
    if (r.a > 0) return r;
  } else if (kind == "fit") {
    const size_t x = arg.find('x');
    r.kind = ResizeRule::Kind::kFit;
    if (x != std::string_view::npos) {
      r.a = ParseSide(arg.substr(0, x));
      r.b = ParseSide(arg.substr(x + 1));
      if (r.a > 0 && r.b > 0) return r;
    }
  }
  return Status::Invalid(fmt::format(
      "--resize '{}': expected short:S, max:M or fit:WxH with sizes from 1 to 65535 pixels (e.g. short:256)", s));
}

void ResizedSize(const ResizeRule& r, int w, int h, int* ow, int* oh) {
  *ow = w, *oh = h;
  switch (r.kind) {
    case ResizeRule::Kind::kShort: {
      const int s = std::min(w, h);
      if (s <= r.a) return;
      if (w <= h) *ow = r.a, *oh = RoundRatio(h, r.a, w);
      else *oh = r.a, *ow = RoundRatio(w, r.a, h);
      return;
    }
    case ResizeRule::Kind::kMax: {
      const int l = std::max(w, h);
      if (l <= r.a) return;
      if (w >= h) *ow = r.a, *oh = RoundRatio(h, r.a, w);
      else *oh = r.a, *ow = RoundRatio(w, r.a, h);
      return;
    }
    case ResizeRule::Kind::kFit: {
      if (w <= r.a && h <= r.b) return;
      // W / w <= H / h: the width limits.
      if (int64_t(r.a) * h <= int64_t(r.b) * w) *ow = r.a, *oh = std::min(r.b, RoundRatio(h, r.a, w));
      else *oh = r.b, *ow = std::min(r.a, RoundRatio(w, r.b, h));
      return;
    }
    default: return;
  }
}

int JpegOrientation(const uint8_t* data, size_t size) { return ScanJpeg(data, size).orientation; }

int ImageOrientation(const uint8_t* data, size_t size) {
  switch (Sniff(data, size)) {
    case ImageFormat::kJpeg: return ScanJpeg(data, size).orientation;
    case ImageFormat::kWebp: return WebpOrientation(data, size);
    case ImageFormat::kPng: return PngOrientation(data, size);
    default: return 1;  // AVIF's irot/imir and JPEG XL's orientation: applied by their decoders
  }
}

std::string TransformSpec::RecordJson() const {
  nlohmann::ordered_json j;
  if (resize.kind != ResizeRule::Kind::kNone) j["resize"] = resize.ToString();
  j["encode"] = encode.ToString();
  j["orientation"] = "applied";
  return j.dump();
}

Result<std::optional<TransformSpec>> ParseTransform(std::string_view resize, std::string_view encode,
                                                    uint64_t max_pixels) {
  TransformSpec t;
  if (max_pixels > 0) t.limits.max_pixels = max_pixels;
  const bool keep = encode.empty() || encode == "keep";
  if (resize.empty() && keep) return std::optional<TransformSpec>();
  if (!resize.empty()) {
    SK_ASSIGN_OR_RETURN(t.resize, ParseResize(resize));
    if (encode == "keep")
      return Status::Invalid(fmt::format("--resize {} with --encode keep: kept bytes cannot be resized; give the "
                                         "codec of the output (--encode jpeg:90, the default with --resize, "
                                         "webp:Q or png)",
                                         resize));
  }
  if (keep) {
    t.encode.png = false;  // jpeg:90
  } else {
    SK_ASSIGN_OR_RETURN(t.encode, ParseEncodeSpec(encode));
  }
  return std::optional<TransformSpec>(std::move(t));
}

namespace {
// Rows of `row` bytes: out row y = the taps of ay over src's rows.
void VerticalPassScalar(const uint8_t* src, size_t sstride, size_t row, const Axis& ay, int dh, uint8_t* dst,
                        size_t dstride) {
  thread_local std::vector<int32_t> acc;
  acc.resize(row);
  for (int y = 0; y < dh; ++y) {
    std::fill(acc.begin(), acc.end(), 0);
    const int32_t* w = &ay.w[size_t(y) * ay.taps];
    for (int k = 0; k < ay.taps; ++k) {
      const uint8_t* p = src + sstride * size_t(ay.start[y] + k);
      const int32_t wk = w[k];
      for (size_t i = 0; i < row; ++i) acc[i] += wk * p[i];
    }
    uint8_t* out = dst + dstride * size_t(y);
    for (size_t i = 0; i < row; ++i) out[i] = Clamp8(acc[i]);
  }
}

// Rows of C-channel pixels (3: RGB, 1: a plane) to rows of ax's output width: output
// pixels [x0, dw).
template <int C>
void HorizontalPassScalar(const uint8_t* src, size_t sstride, const Axis& ax, int dw, int h, uint8_t* dst,
                          size_t dstride, int x0 = 0) {
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = src + sstride * size_t(y);
    uint8_t* out = dst + dstride * size_t(y);
    for (int x = x0; x < dw; ++x) {
      const int32_t* w = &ax.w[size_t(x) * ax.taps];
      const uint8_t* p = row + size_t(ax.start[x]) * C;
      int32_t acc[C] = {};
      for (int k = 0; k < ax.taps; ++k, p += C)
        for (int c = 0; c < C; ++c) acc[c] += w[k] * p[c];
      for (int c = 0; c < C; ++c) out[C * x + c] = Clamp8(acc[c]);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define SK_RESAMPLE_AVX2 1
// The same passes with AVX2 (chosen at run time): 8 bytes per instruction in the vertical
// pass, one pixel's three channels per instruction in the horizontal one. The results are
// the scalar passes' to the bit (the same integer arithmetic).
__attribute__((target("avx2"))) void VerticalPassAvx2(const uint8_t* src, size_t sstride, size_t row,
                                                      const Axis& ay, int dh, uint8_t* dst, size_t dstride) {
  const __m256i half = _mm256_set1_epi32(1 << (kShift - 1));
  for (int y = 0; y < dh; ++y) {
    const int32_t* w = &ay.w[size_t(y) * ay.taps];
    const uint8_t* rows = src + sstride * size_t(ay.start[y]);
    uint8_t* out = dst + dstride * size_t(y);
    size_t i = 0;
    for (; i + 16 <= row; i += 16) {
      __m256i a0 = half, a1 = half;
      const uint8_t* p = rows + i;
      for (int k = 0; k < ay.taps; ++k, p += sstride) {
        const __m256i wk = _mm256_set1_epi32(w[k]);
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(wk, _mm256_cvtepu8_epi32(v)));
        a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(wk, _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
      }
      a0 = _mm256_srai_epi32(a0, kShift);
      a1 = _mm256_srai_epi32(a1, kShift);
      // Saturating packs clamp to 0..255; packs work per 128-bit lane, hence the permute.
      const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(a0, a1), 0xD8);
      const __m128i b8 = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), b8);
    }
    for (; i < row; ++i) {  // the tail
      int32_t a = 0;
      const uint8_t* p = rows + i;
      for (int k = 0; k < ay.taps; ++k, p += sstride) a += w[k] * *p;
      out[i] = Clamp8(a);
    }
  }
}

// Every row must have 8 readable bytes after its last pixel: taps are loaded in pairs, 8
// bytes each (two pixels and 2 more). Each pair's two weights multiply the two pixels'
// channels as 16-bit integers and are summed into 32 bits by one pmaddwd.
__attribute__((target("avx2"))) void HorizontalPassAvx2(const uint8_t* src, size_t sstride, const Axis& ax,
                                                        int dw, int h, uint8_t* dst, size_t dstride) {
  const int pairs = (ax.taps + 1) / 2;
  thread_local std::vector<int16_t> wv;  // per output pixel and pair: w0 w1 w0 w1 w0 w1 0 0
  wv.assign(size_t(dw) * pairs * 8, 0);
  for (int x = 0; x < dw; ++x)
    for (int j = 0; j < pairs; ++j) {
      const int32_t* w = &ax.w[size_t(x) * ax.taps + 2 * j];
      const int16_t w0 = int16_t(w[0]), w1 = int16_t(2 * j + 1 < ax.taps ? w[1] : 0);
      int16_t* v = &wv[(size_t(x) * pairs + j) * 8];
      v[0] = v[2] = v[4] = w0;
      v[1] = v[3] = v[5] = w1;
    }
  // R0 R1 G0 G1 B0 B1 as 16-bit lanes from the bytes R0 G0 B0 R1 G1 B1.
  const __m128i order = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m128i half = _mm_set1_epi32(1 << (kShift - 1));
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = src + sstride * size_t(y);
    uint8_t* out = dst + dstride * size_t(y);
    const int16_t* w = wv.data();
    for (int x = 0; x < dw; ++x) {
      const uint8_t* p = row + size_t(ax.start[x]) * 3;
      __m128i a = half;
      for (int j = 0; j < pairs; ++j, p += 6, w += 8) {
        const __m128i v = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), order);
        a = _mm_add_epi32(a, _mm_madd_epi16(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
      }
      a = _mm_srai_epi32(a, kShift);
      const uint32_t o = uint32_t(_mm_cvtsi128_si32(_mm_packus_epi16(_mm_packus_epi32(a, a), a)));
      out[3 * x] = uint8_t(o);
      out[3 * x + 1] = uint8_t(o >> 8);
      out[3 * x + 2] = uint8_t(o >> 16);
    }
  }
}
#endif

std::atomic<bool> g_simd{true};

bool UseAvx2() {
#ifdef SK_RESAMPLE_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && g_simd.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void VerticalPass(const uint8_t* src, size_t sstride, size_t row, const Axis& ay, int dh, uint8_t* dst,
                  size_t dstride) {
#ifdef SK_RESAMPLE_AVX2
  if (UseAvx2()) return VerticalPassAvx2(src, sstride, row, ay, dh, dst, dstride);
#endif
  VerticalPassScalar(src, sstride, row, ay, dh, dst, dstride);
}

// src's rows must have 8 readable bytes after their last pixel.
void HorizontalPass(const uint8_t* src, size_t sstride, const Axis& ax, int dw, int h, uint8_t* dst,
                    size_t dstride) {
#ifdef SK_RESAMPLE_AVX2
  if (UseAvx2()) return HorizontalPassAvx2(src, sstride, ax, dw, h, dst, dstride);
#endif
  HorizontalPassScalar<3>(src, sstride, ax, dw, h, dst, dstride);
}

#ifdef SK_RESAMPLE_AVX2
// A plane's horizontal pass with AVX2, 8 output pixels at a time: pixel x's taps in groups of 8 bytes,
// widened to 16 bits, times their 16-bit weights (zero past the last tap) by pmaddwd, one
// 128-bit lane per pixel (x and x + 4 share a register); three rounds of phaddd leave the
// 8 sums in order. The integer sums are the scalar pass's; the last dw % 8 are scalar.
// Every row must have 8 readable bytes after its last pixel.
__attribute__((target("avx2"))) void HorizontalPassPlaneAvx2(const uint8_t* src, size_t sstride, const Axis& ax,
                                                             int dw, int h, uint8_t* dst, size_t dstride) {
  const int groups = (ax.taps + 7) / 8;
  const int blocks = dw / 8;
  // Per block, register r (pixels 8b + r and 8b + r + 4) and group j: 16 weights.
  thread_local std::vector<int16_t> wv;
  wv.assign(size_t(blocks) * 4 * groups * 16, 0);
  for (int b = 0; b < blocks; ++b)
    for (int r = 0; r < 4; ++r)
      for (int half = 0; half < 2; ++half) {
        const int x = 8 * b + r + 4 * half;
        for (int k = 0; k < ax.taps; ++k)
          wv[((size_t(b) * 4 + r) * groups + k / 8) * 16 + 8 * half + k % 8] =
              int16_t(ax.w[size_t(x) * ax.taps + k]);
      }
  const __m256i round = _mm256_set1_epi32(1 << (kShift - 1));
  for (int y = 0; y < h; ++y) {
    const uint8_t* row = src + sstride * size_t(y);
    uint8_t* out = dst + dstride * size_t(y);
    const int16_t* w = wv.data();
    for (int b = 0; b < blocks; ++b) {
      __m256i acc[4];
      for (int r = 0; r < 4; ++r) {
        const uint8_t* p0 = row + ax.start[8 * b + r];
        const uint8_t* p1 = row + ax.start[8 * b + r + 4];
        __m256i a = _mm256_setzero_si256();
        for (int j = 0; j < groups; ++j, p0 += 8, p1 += 8, w += 16) {
          const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0)),
                                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1)));
          a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_cvtepu8_epi16(v),
                                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))));
        }
        acc[r] = a;
      }
      // [x0 x1 x2 x3 | x4 x5 x6 x7] after three horizontal adds.
      __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
      s = _mm256_srai_epi32(_mm256_add_epi32(s, round), kShift);
      const __m256i p16 = _mm256_packus_epi32(s, s);        // per lane: 4 x 16 bits, twice
      const __m256i p8 = _mm256_packus_epi16(p16, p16);     // per lane: 4 bytes, four times
      const uint32_t lo = uint32_t(_mm_cvtsi128_si32(_mm256_castsi256_si128(p8)));
      const uint32_t hi = uint32_t(_mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1)));
      std::memcpy(out + 8 * b, &lo, 4);
      std::memcpy(out + 8 * b + 4, &hi, 4);
    }
  }
  if (8 * blocks < dw) HorizontalPassScalar<1>(src, sstride, ax, dw, h, dst, dstride, 8 * blocks);  // the tail
}
#endif

// A plane's rows (one byte per pixel) to rows of ax's output width; src's rows must have
// 8 readable bytes after their last pixel.
void HorizontalPassPlane(const uint8_t* src, size_t sstride, const Axis& ax, int dw, int h, uint8_t* dst,
                         size_t dstride) {
#ifdef SK_RESAMPLE_AVX2
  if (UseAvx2()) return HorizontalPassPlaneAvx2(src, sstride, ax, dw, h, dst, dstride);
#endif
  HorizontalPassScalar<1>(src, sstride, ax, dw, h, dst, dstride);
}

// ResizeRgb (channels 3) and a plane's resize (channels 1): dst's rows dstride apart.
// `sx`, `sy`: input pixels per output pixel when not sw / dw and sh / dh (MakeAxis); an
// axis whose size and scale stay is copied.
void Resize(int channels, const uint8_t* src, int sw, int sh, size_t sstride, uint8_t* dst, int dw, int dh,
            size_t dstride, double sx = 0, double sy = 0) {
  thread_local Axis ax, ay;
  thread_local std::vector<uint8_t> tmp;
  const bool resize_x = dw != sw || (sx > 0 && sx != 1.0), resize_y = dh != sh || (sy > 0 && sy != 1.0);
  // The vertical pass first, over whole rows (vectorised), into tmp (sw x dh); then the
  // horizontal one over the dh rows left. Intermediate values are rounded to 8 bits.
  const size_t in_row = size_t(sw) * channels, out_row = size_t(dw) * channels;
  if (!resize_x && !resize_y) {
    for (int y = 0; y < dh; ++y) std::memcpy(dst + dstride * size_t(y), src + sstride * size_t(y), out_row);
    return;
  }
  // tmp's rows: whole vectors, with 8 spare bytes for the horizontal pass's loads.
  const size_t row_vec = (in_row + 8 + 15) / 16 * 16;
  tmp.resize(row_vec * size_t(dh));
  if (resize_y) {
    MakeAxis(sh, dh, &ay, sy);
    VerticalPass(src, sstride, in_row, ay, dh, tmp.data(), row_vec);
  } else {
    for (int y = 0; y < dh; ++y) std::memcpy(tmp.data() + row_vec * size_t(y), src + sstride * size_t(y), in_row);
  }
  if (!resize_x) {
    for (int y = 0; y < dh; ++y) std::memcpy(dst + dstride * size_t(y), tmp.data() + row_vec * size_t(y), out_row);
    return;
  }
  MakeAxis(sw, dw, &ax, sx);
  if (channels == 3) HorizontalPass(tmp.data(), row_vec, ax, dw, dh, dst, dstride);
  else HorizontalPassPlane(tmp.data(), row_vec, ax, dw, dh, dst, dstride);
}
}  // namespace

bool SetResampleSimd(bool on) {
  g_simd.store(on);
  return UseAvx2();
}

void ResizeRgb(const uint8_t* src, int sw, int sh, size_t sstride, uint8_t* dst, int dw, int dh) {
  Resize(3, src, sw, sh, sstride, dst, dw, dh, size_t(dw) * 3);
}

namespace {

std::atomic<bool> g_planes{true};

// TurboJPEG handles of this thread.
struct TjHandles {
  tjhandle dec = tjInitDecompress(), enc = tjInitCompress();
  ~TjHandles() {
    if (dec) tjDestroy(dec);
    if (enc) tjDestroy(enc);
  }
};

// The JPEG-to-JPEG route in YCbCr: a baseline 4:2:0 YCbCr JPEG, upright, to a JPEG output
// is decoded to its Y, Cb and Cr planes (no chroma upsampling, no colour conversion) at
// the DCT scale the decoder would use, each plane resized on its own (the chroma planes
// to the output's chroma size), and encoded from the planes (no colour conversion, no
// chroma downsampling). nullopt where the image does not qualify or TurboJPEG reports
// anything (an error or a warning): the caller then takes the RGB route, which gives
// the error, or tolerates the warning, as the loader does.
std::optional<Bytes> TransformJpegPlanes(const uint8_t* data, size_t size, const JpegHead& head,
                                         const TransformSpec& spec, int* out_w, int* out_h) {
  if (!g_planes.load(std::memory_order_relaxed) || spec.encode.png || spec.encode.webp) return std::nullopt;
  if (head.orientation != 1 || (head.sof != 0xC0 && head.sof != 0xC1)) return std::nullopt;
  if (!CheckDimensions(spec.limits, uint64_t(head.width), uint64_t(head.height)).ok()) return std::nullopt;
  thread_local TjHandles tj;
  if (!tj.dec || !tj.enc) return std::nullopt;
  int w, h, sub, cs;
  if (tjDecompressHeader3(tj.dec, data, static_cast<unsigned long>(size), &w, &h, &sub, &cs) != 0 ||
      cs != TJCS_YCbCr || sub != TJSAMP_420 || w != head.width || h != head.height)
    return std::nullopt;
  int tw, th;
  ResizedSize(spec.resize, w, h, &tw, &th);
  const int num = SimdDctScale(w, h, tw, th);  // as the RGB route's decoder scales
  const int sw = (w * num + 7) / 8, sh = (h * num + 7) / 8;
  // TurboJPEG's planes: luma padded to whole chroma samples (2 x 2), chroma ceil(side / 2).
  const int yw = tjPlaneWidth(0, sw, TJSAMP_420), yh = tjPlaneHeight(0, sh, TJSAMP_420);
  const int cw = tjPlaneWidth(1, sw, TJSAMP_420), ch = tjPlaneHeight(1, sh, TJSAMP_420);
  thread_local std::vector<uint8_t> in, out;
  in.resize(size_t(yw) * yh + 2 * size_t(cw) * ch);
  unsigned char* ip[3] = {in.data(), in.data() + size_t(yw) * yh, in.data() + size_t(yw) * yh + size_t(cw) * ch};
  int is[3] = {yw, cw, cw};
  if (tjDecompressToYUVPlanes(tj.dec, data, static_cast<unsigned long>(size), ip, sw, is, sh, 0) != 0)
    return std::nullopt;
  const int tyw = tjPlaneWidth(0, tw, TJSAMP_420), tyh = tjPlaneHeight(0, th, TJSAMP_420);
  const int tcw = tjPlaneWidth(1, tw, TJSAMP_420), tch = tjPlaneHeight(1, th, TJSAMP_420);
  out.resize(size_t(tyw) * tyh + 2 * size_t(tcw) * tch);
  unsigned char* op[3] = {out.data(), out.data() + size_t(tyw) * tyh,
                          out.data() + size_t(tyw) * tyh + size_t(tcw) * tch};
  Resize(1, ip[0], sw, sh, size_t(yw), op[0], tw, th, size_t(tyw));
  for (int y = 0; y < th; ++y)  // the padding column and row repeat the edge
    for (int x = tw; x < tyw; ++x) op[0][size_t(tyw) * y + x] = op[0][size_t(tyw) * y + tw - 1];
  for (int y = th; y < tyh; ++y) std::memcpy(op[0] + size_t(tyw) * y, op[0] + size_t(tyw) * (th - 1), size_t(tyw));
  // Chroma sample i covers luma pixels 2i and 2i + 1 in both images: its plane scales by
  // the luma's factor (with odd sides, ceil(sw / 2) / ceil(tw / 2) would stretch it).
  const double sx = double(sw) / tw, sy = double(sh) / th;
  Resize(1, ip[1], cw, ch, size_t(cw), op[1], tcw, tch, size_t(tcw), sx, sy);
  Resize(1, ip[2], cw, ch, size_t(cw), op[2], tcw, tch, size_t(tcw), sx, sy);
  const unsigned char* cp[3] = {op[0], op[1], op[2]};
  int os[3] = {tyw, tcw, tcw};
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  if (tjCompressFromYUVPlanes(tj.enc, cp, tw, os, th, TJSAMP_420, &buf, &len, spec.encode.quality,
                              TJFLAG_ACCURATEDCT) != 0) {
    tjFree(buf);
    return std::nullopt;
  }
  Bytes b = Bytes::Copy(buf, len);
  tjFree(buf);
  if (out_w) *out_w = tw;
  if (out_h) *out_h = th;
  return b;
}

}  // namespace

bool SetPlaneRoute(bool on) { return g_planes.exchange(on); }

Result<Bytes> TransformImage(const uint8_t* data, size_t size, const TransformSpec& spec, int* out_w, int* out_h) {
  const bool jpeg = Sniff(data, size) == ImageFormat::kJpeg;
  const JpegHead head = jpeg ? ScanJpeg(data, size) : JpegHead{};
  if (jpeg) {
    if (std::optional<Bytes> b = TransformJpegPlanes(data, size, head, spec, out_w, out_h)) return std::move(*b);
  }
  // The output size in the stored orientation, when the header tells the size: DCT
  // scaling may go down to it.
  double min_w = 0, min_h = 0;
  if (jpeg && head.width > 0 && head.height > 0) {
    int uw, uh, tw, th;
    UprightSize(head.orientation, head.width, head.height, &uw, &uh);
    ResizedSize(spec.resize, uw, uh, &tw, &th);
    UprightSize(head.orientation, tw, th, &tw, &th);  // (its own inverse)
    min_w = tw, min_h = th;
  }
  ImageDecoder& dec = ThreadDecoder(spec.limits);
  Region reg;
  ImageInfo info;
  SK_RETURN_IF_ERROR(dec.Decode(data, size, Whole, min_w, min_h, &reg, &info));
  // The output size from the image's real size (the decoder's, not the scan's).
  const int o = jpeg ? head.orientation : ImageOrientation(data, size);
  int uw, uh, tw, th;
  UprightSize(o, info.width, info.height, &uw, &uh);
  ResizedSize(spec.resize, uw, uh, &tw, &th);
  int sw, sh;  // the output size in the stored orientation
  UprightSize(o, tw, th, &sw, &sh);
  thread_local std::vector<uint8_t> small, upright;
  const uint8_t* px = reg.pixels;
  size_t stride = reg.stride;
  if (reg.width != sw || reg.height != sh) {
    small.resize(size_t(sw) * 3 * size_t(sh));
    ResizeRgb(reg.pixels, reg.width, reg.height, reg.stride, small.data(), sw, sh);
    px = small.data();
    stride = size_t(sw) * 3;
  }
  if (o != 1) {
    upright.resize(size_t(tw) * 3 * size_t(th));
    for (int y = 0; y < th; ++y) {
      uint8_t* out = upright.data() + size_t(tw) * 3 * size_t(y);
      for (int x = 0; x < tw; ++x) {
        int sx, sy;
        StoredOf(o, x, y, sw, sh, &sx, &sy);
        std::memcpy(out + 3 * x, px + stride * size_t(sy) + 3 * size_t(sx), 3);
      }
    }
    px = upright.data();
    stride = size_t(tw) * 3;
  }
  if (out_w) *out_w = tw;
  if (out_h) *out_h = th;
  return EncodePixels(px, tw, th, 3, stride, spec.encode);
}

// A decoded array (NpyImage) through steps 3 and 4, with no EXIF to apply. Within the
// rule it is encoded as it is (gray stays gray, as --encode alone writes arrays); larger,
// it is resized as RGB and written back as gray where it was gray (RGBA loses its alpha).
Result<Bytes> TransformArray(const Bytes& npy, const TransformSpec& spec) {
  SK_ASSIGN_OR_RETURN(NpyImage img, ParseNpyImage(npy));
  SK_RETURN_IF_ERROR(CheckDimensions(spec.limits, uint64_t(img.width), uint64_t(img.height)));
  const int w = img.width, h = img.height, c = img.channels;
  int tw, th;
  ResizedSize(spec.resize, w, h, &tw, &th);
  if (tw == w && th == h) return EncodePixels(img.pixels(), w, h, c, size_t(w) * size_t(c), spec.encode);
  thread_local std::vector<uint8_t> rgb, small;
  const uint8_t* px = img.pixels();
  if (c != 3) {
    rgb.resize(size_t(w) * 3 * size_t(h));
    const size_t n = size_t(w) * size_t(h);
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < 3; ++k) rgb[i * 3 + k] = px[i * size_t(c) + (c == 1 ? 0 : k)];
    px = rgb.data();
  }
  small.resize(size_t(tw) * 3 * size_t(th));
  ResizeRgb(px, w, h, size_t(w) * 3, small.data(), tw, th);
  if (c == 1) {  // the three channels are equal: keep one
    const size_t n = size_t(tw) * size_t(th);
    for (size_t i = 0; i < n; ++i) small[i] = small[i * 3];
    return EncodePixels(small.data(), tw, th, 1, size_t(tw), spec.encode);
  }
  return EncodePixels(small.data(), tw, th, 3, size_t(tw) * 3, spec.encode);
}

Status TransformSampleImages(Sample* s, const TransformSpec& spec) {
  const Field* img = nullptr;
  for (const auto& f : s->fields) {
    if (!IsImageExt(f.ext)) continue;
    if (img)
      return Status::Invalid(fmt::format("sample '{}' has two image fields ('{}' and '{}'): a transform writes one "
                                         "image per sample",
                                         s->key, img->ext, f.ext),
                             Location{.key = s->key});
    img = &f;
  }
  if (!img) img = s->find("npy");  // a decoded array, else nothing to transform
  if (!img) return Status::OK();
  const std::string ext = img->ext, out_ext = spec.encode.ext();
  if (ext != out_ext && s->find(out_ext))
    return Status::Invalid(fmt::format("sample '{}' has a field '{}' beside its image '{}', which the transform "
                                       "would write as '{}'",
                                       s->key, out_ext, ext, out_ext),
                           Location{.key = s->key});
  auto r = ext == "npy" ? TransformArray(img->data, spec)
                        : TransformImage(reinterpret_cast<const uint8_t*>(img->data.data()), img->data.size(), spec);
  if (!r.ok()) {
    Status st = std::move(r).take_status();
    return Status(st.code(), fmt::format("sample '{}': field '{}': {}", s->key, ext, st.message()),
                  Location{.key = s->key});
  }
  s->erase(ext);
  s->set(out_ext, std::move(*r));
  return Status::OK();
}

Status UprightImageSize(const uint8_t* data, size_t size, const Limits& limits, int* w, int* h) {
  const int o = ImageOrientation(data, size);
  ImageDecoder& dec = ThreadDecoder(limits);
  Region reg;
  ImageInfo info;
  SK_RETURN_IF_ERROR(dec.Decode(data, size, Whole, 1, 1, &reg, &info));
  UprightSize(o, info.width, info.height, w, h);
  return Status::OK();
}

}  // namespace shardkit::decode
