// The hot loops want vectorising (GCC's -O2 leaves them scalar) and, where the CPU has
// it, AVX2 (target_clones picks at load time).
#pragma GCC optimize("O3")
#include "pipeline/resize.h"

// ifunc resolvers run before a sanitizer's runtime is up: no clones in sanitized builds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SK_TARGET_CLONES
#else
#define SK_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace shardkit::pipeline {

void ComputeAxis(double box0, double len, int out, int lo, int hi, AxisWeights* a) {
  const double scale = len / out;
  const double fs = std::max(scale, 1.0);
  const double support = fs;  // triangle filter of radius 1, stretched
  a->taps = int(std::ceil(support)) * 2 + 1;
  a->start.assign(out, 0);
  a->count.assign(out, 0);
  a->w.assign(size_t(out) * a->taps, 0.f);
  const double inv = 1.0 / fs;
  for (int i = 0; i < out; ++i) {
    double c = box0 + (i + 0.5) * scale;
    int xmin = std::max(lo, int(std::floor(c - support + 0.5)));
    int xmax = std::min(hi, int(std::floor(c + support + 0.5)));
    if (xmax <= xmin) {  // degenerate: nearest pixel
      xmin = std::clamp(int(std::floor(c)), lo, hi - 1);
      xmax = xmin + 1;
    }
    xmax = std::min(xmax, xmin + a->taps);
    double sum = 0;
    float* w = &a->w[size_t(i) * a->taps];
    for (int x = xmin; x < xmax; ++x) {
      double t = std::abs((x + 0.5 - c) * inv);
      double v = t < 1.0 ? 1.0 - t : 0.0;
      w[x - xmin] = float(v);
      sum += v;
    }
    if (sum <= 0) {
      w[0] = 1.f;
      xmax = xmin + 1;
      sum = 1;
    } else {
      for (int k = 0; k < xmax - xmin; ++k) w[k] = float(w[k] / sum);
    }
    a->start[i] = xmin;
    a->count[i] = xmax - xmin;
  }
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int exp = int((x >> 23) & 0xff);
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = exp - 127 + 15;
  if (e >= 0x1f) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (uint32_t(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: correct
  return uint16_t(sign | h);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      x = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return uint16_t((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return uint16_t(x >> 16);
}

float BFloat16ToFloat(uint16_t h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

typedef float v4f __attribute__((vector_size(16)));

// Vertical taps over uint8 rows -> one float row (RGB interleaved, `len` floats).
SK_TARGET_CLONES
void VerticalRow(const uint8_t* src, size_t stride, const float* w, int n, size_t len, float* __restrict L) {
  for (size_t i = 0; i < len; ++i) L[i] = 0.f;
  for (int k = 0; k < n; ++k) {
    const uint8_t* __restrict t = src + size_t(k) * stride;
    const float wk = w[k];
    for (size_t i = 0; i < len; ++i) L[i] += wk * float(t[i]);
  }
}

__attribute__((always_inline)) inline v4f Load4(const float* p) {  // unaligned; lane 3 is the next pixel's R (ignored)
  v4f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// Horizontal taps straight from the RGB float row: one unaligned 4-float load per tap.
// Four output pixels per iteration: four independent accumulation chains keep the adder
// busy (two left it waiting on latency). Each pixel still sums its taps in order k =
// 0, 1, ..., so the result is bit-identical to one pixel at a time.
SK_TARGET_CLONES
void HorizontalRow(const float* L3, int xlo, const AxisWeights& wx, int ow, v4f* out) {
  const int tx = wx.taps;
  int i = 0;
  for (; i + 3 < ow; i += 4) {
    const float* w0 = &wx.w[size_t(i) * tx];
    const float* w1 = w0 + tx;
    const float* w2 = w1 + tx;
    const float* w3 = w2 + tx;
    const float* p0 = L3 + size_t(wx.start[i] - xlo) * 3;
    const float* p1 = L3 + size_t(wx.start[i + 1] - xlo) * 3;
    const float* p2 = L3 + size_t(wx.start[i + 2] - xlo) * 3;
    const float* p3 = L3 + size_t(wx.start[i + 3] - xlo) * 3;
    const int n0 = wx.count[i], n1 = wx.count[i + 1], n2 = wx.count[i + 2], n3 = wx.count[i + 3];
    v4f a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
    const int n = std::min(std::min(n0, n1), std::min(n2, n3));
    int k = 0;
    for (; k < n; ++k) {
      a0 += w0[k] * Load4(p0 + 3 * k);
      a1 += w1[k] * Load4(p1 + 3 * k);
      a2 += w2[k] * Load4(p2 + 3 * k);
      a3 += w3[k] * Load4(p3 + 3 * k);
    }
    for (int kk = k; kk < n0; ++kk) a0 += w0[kk] * Load4(p0 + 3 * kk);
    for (int kk = k; kk < n1; ++kk) a1 += w1[kk] * Load4(p1 + 3 * kk);
    for (int kk = k; kk < n2; ++kk) a2 += w2[kk] * Load4(p2 + 3 * kk);
    for (int kk = k; kk < n3; ++kk) a3 += w3[kk] * Load4(p3 + 3 * kk);
    out[i] = a0;
    out[i + 1] = a1;
    out[i + 2] = a2;
    out[i + 3] = a3;
  }
  for (; i < ow; ++i) {
    const float* w = &wx.w[size_t(i) * tx];
    const float* p = L3 + size_t(wx.start[i] - xlo) * 3;
    v4f acc = {0, 0, 0, 0};
    for (int k = 0; k < wx.count[i]; ++k) acc += w[k] * Load4(p + 3 * k);
    out[i] = acc;
  }
}

typedef int v4i __attribute__((vector_size(16)));
#if defined(__clang__)
#define SK_SHUFFLE(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define SK_SHUFFLE(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, v4i{i0, i1, i2, i3})
#endif

// 4 RGBx pixels -> the R, G, B lanes of those pixels (a 4x3 transpose), reversed when
// flipping, so that the NCHW planes get one 4-wide store each instead of 12 scalar ones.
__attribute__((always_inline)) inline void Transpose4(v4f p0, v4f p1, v4f p2, v4f p3, bool flip, v4f* r, v4f* g,
                                                      v4f* b) {
  const v4f t0 = SK_SHUFFLE(p0, p1, 0, 4, 1, 5);  // r0 r1 g0 g1
  const v4f t1 = SK_SHUFFLE(p2, p3, 0, 4, 1, 5);  // r2 r3 g2 g3
  const v4f t2 = SK_SHUFFLE(p0, p1, 2, 6, 2, 6);  // b0 b1 b0 b1
  const v4f t3 = SK_SHUFFLE(p2, p3, 2, 6, 2, 6);  // b2 b3 b2 b3
  if (flip) {
    *r = SK_SHUFFLE(t0, t1, 5, 4, 1, 0);
    *g = SK_SHUFFLE(t0, t1, 7, 6, 3, 2);
    *b = SK_SHUFFLE(t2, t3, 5, 4, 1, 0);
  } else {
    *r = SK_SHUFFLE(t0, t1, 0, 1, 4, 5);
    *g = SK_SHUFFLE(t0, t1, 2, 3, 6, 7);
    *b = SK_SHUFFLE(t2, t3, 0, 1, 4, 5);
  }
}

// always_inline: StoreRow's target clones (AVX2) then compile this body for their target.
template <class T, class Conv>
__attribute__((always_inline)) inline void StoreT(const float* L, int ow, int oh, int j, bool flip, const float* mul,
                                                  const float* add, Layout layout, T* dst, Conv conv) {
  const v4f m4 = {mul[0], mul[1], mul[2], 0.f}, a4 = {add[0], add[1], add[2], 0.f};
  const v4f* L4 = reinterpret_cast<const v4f*>(L);
  if (layout == Layout::kNCHW) {
    const size_t plane = size_t(ow) * oh;
    T* d0 = dst + size_t(j) * ow;
    T* d1 = d0 + plane;
    T* d2 = d1 + plane;
    int i = 0;
    for (; i + 4 <= ow; i += 4) {
      v4f r, g, b;
      Transpose4(L4[i] * m4 + a4, L4[i + 1] * m4 + a4, L4[i + 2] * m4 + a4, L4[i + 3] * m4 + a4, flip, &r, &g, &b);
      const int xo = flip ? ow - 4 - i : i;
      if constexpr (std::is_same_v<T, float>) {
        __builtin_memcpy(d0 + xo, &r, 16);
        __builtin_memcpy(d1 + xo, &g, 16);
        __builtin_memcpy(d2 + xo, &b, 16);
      } else {
        for (int k = 0; k < 4; ++k) {
          d0[xo + k] = conv(r[k]);
          d1[xo + k] = conv(g[k]);
          d2[xo + k] = conv(b[k]);
        }
      }
    }
    for (; i < ow; ++i) {
      const v4f v = L4[i] * m4 + a4;
      const int xo = flip ? ow - 1 - i : i;
      d0[xo] = conv(v[0]);
      d1[xo] = conv(v[1]);
      d2[xo] = conv(v[2]);
    }
  } else {
    T* d = dst + size_t(j) * ow * 3;
    for (int i = 0; i < ow; ++i) {
      const v4f v = L4[i] * m4 + a4;
      T* q = d + size_t(flip ? ow - 1 - i : i) * 3;
      q[0] = conv(v[0]);
      q[1] = conv(v[1]);
      q[2] = conv(v[2]);
    }
  }
}

SK_TARGET_CLONES
void StoreRow(const float* L, int ow, int oh, int j, bool flip, const float* mul, const float* add,
              const OutputSpec& out, void* dst) {
  switch (out.dtype) {
    case DType::kUint8:
      StoreT(L, ow, oh, j, flip, mul, add, out.layout, static_cast<uint8_t*>(dst), [](float v) {
        v = std::max(0.f, std::min(v, 255.f));  // minss/maxss, no branches
        return uint8_t(int(v + 0.5f));  // round half up (vectorises; nearbyint is a libm call)
      });
      break;
    case DType::kFloat32:
      StoreT(L, ow, oh, j, flip, mul, add, out.layout, static_cast<float*>(dst), [](float v) { return v; });
      break;
    case DType::kFloat16:
      StoreT(L, ow, oh, j, flip, mul, add, out.layout, static_cast<uint16_t*>(dst), FloatToHalf);
      break;
    case DType::kBFloat16:
      StoreT(L, ow, oh, j, flip, mul, add, out.layout, static_cast<uint16_t*>(dst), FloatToBFloat16);
      break;
  }
}

}  // namespace

void Resizer::Run(const uint8_t* src, size_t stride, int src_w, int src_h, const CropBox& box, bool flip,
                  const OutputSpec& out, void* dst) {
  const int ow = out.width, oh = out.height;
  const int xlo = std::max(0, int(std::floor(box.x + 1e-9)));
  const int xhi = std::min(src_w, std::max(xlo + 1, int(std::ceil(box.x + box.w - 1e-9))));
  const int ylo = std::max(0, int(std::floor(box.y + 1e-9)));
  const int yhi = std::min(src_h, std::max(ylo + 1, int(std::ceil(box.y + box.h - 1e-9))));
  ComputeAxis(box.x, box.w, ow, xlo, xhi, &wx_);
  ComputeAxis(box.y, box.h, oh, ylo, yhi, &wy_);
  // Vertical pass first (contiguous, vectorised, straight from the uint8 rows) over the
  // box's columns, then the horizontal taps on one float row at a time.
  const int cols = xhi - xlo;
  tmp_.resize(size_t(cols) * 3 + 4 + size_t(ow) * 4 + 4);
  float* L3 = tmp_.data();
  L3[size_t(cols) * 3] = 0.f;  // the 4th lane of the last pixel's load
  v4f* O4 = reinterpret_cast<v4f*>((reinterpret_cast<uintptr_t>(L3 + size_t(cols) * 3 + 1) + 15) & ~uintptr_t(15));
  float mul[3], add[3];
  const bool is_u8 = out.dtype == DType::kUint8;
  for (int c = 0; c < 3; ++c) {
    mul[c] = is_u8 ? 1.f : 1.f / (255.f * out.std[c]);
    add[c] = is_u8 ? 0.f : -out.mean[c] / out.std[c];
  }
  const int ty = wy_.taps;
  for (int j = 0; j < oh; ++j) {
    VerticalRow(src + stride * size_t(wy_.start[j]) + size_t(xlo) * 3, stride, &wy_.w[size_t(j) * ty], wy_.count[j],
                size_t(cols) * 3, L3);
    HorizontalRow(L3, xlo, wx_, ow, O4);
    StoreRow(reinterpret_cast<const float*>(O4), ow, oh, j, flip, mul, add, out, dst);
  }
}

}  // namespace shardkit::pipeline
