#include "pipeline/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

void Resizer::Run(const uint8_t* src, size_t stride, int src_w, int src_h, const CropBox& box, bool flip,
                  const OutputSpec& out, void* dst) {
  const int ow = out.width, oh = out.height;
  const int xlo = std::max(0, int(std::floor(box.x + 1e-9)));
  const int xhi = std::min(src_w, std::max(xlo + 1, int(std::ceil(box.x + box.w - 1e-9))));
  const int ylo = std::max(0, int(std::floor(box.y + 1e-9)));
  const int yhi = std::min(src_h, std::max(ylo + 1, int(std::ceil(box.y + box.h - 1e-9))));
  ComputeAxis(box.x, box.w, ow, xlo, xhi, &wx_);
  ComputeAxis(box.y, box.h, oh, ylo, yhi, &wy_);
  // Rows of the source that the vertical pass reads.
  int rlo = yhi, rhi = ylo;
  for (int j = 0; j < oh; ++j) {
    rlo = std::min(rlo, wy_.start[j]);
    rhi = std::max(rhi, wy_.start[j] + wy_.count[j]);
  }
  const int rows = rhi - rlo;
  tmp_.resize(size_t(rows) * ow * 3);
  // Horizontal pass.
  const int tx = wx_.taps;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = src + stride * size_t(rlo + r);
    float* t = &tmp_[size_t(r) * ow * 3];
    for (int i = 0; i < ow; ++i) {
      const float* w = &wx_.w[size_t(i) * tx];
      const uint8_t* p = row + size_t(wx_.start[i]) * 3;
      float a0 = 0, a1 = 0, a2 = 0;
      const int n = wx_.count[i];
      for (int k = 0; k < n; ++k, p += 3) {
        a0 += w[k] * p[0];
        a1 += w[k] * p[1];
        a2 += w[k] * p[2];
      }
      t[i * 3 + 0] = a0;
      t[i * 3 + 1] = a1;
      t[i * 3 + 2] = a2;
    }
  }
  // Vertical pass, flip, normalise, store.
  line_.resize(size_t(ow) * 3);
  float mul[3], add[3];
  const bool is_u8 = out.dtype == DType::kUint8;
  for (int c = 0; c < 3; ++c) {
    mul[c] = is_u8 ? 1.f : 1.f / (255.f * out.std[c]);
    add[c] = is_u8 ? 0.f : -out.mean[c] / out.std[c];
  }
  const size_t plane = size_t(ow) * oh;
  const int ty = wy_.taps;
  for (int j = 0; j < oh; ++j) {
    const float* w = &wy_.w[size_t(j) * ty];
    const int n = wy_.count[j];
    const float* base = &tmp_[size_t(wy_.start[j] - rlo) * ow * 3];
    float* L = line_.data();
    for (int i = 0; i < ow * 3; ++i) L[i] = 0.f;
    for (int k = 0; k < n; ++k) {
      const float* t = base + size_t(k) * ow * 3;
      const float wk = w[k];
      for (int i = 0; i < ow * 3; ++i) L[i] += wk * t[i];
    }
    for (int i = 0; i < ow; ++i) {
      const int xo = flip ? ow - 1 - i : i;
      for (int c = 0; c < 3; ++c) {
        float v = L[i * 3 + c];
        size_t at = out.layout == Layout::kNCHW ? size_t(c) * plane + size_t(j) * ow + xo
                                                 : (size_t(j) * ow + xo) * 3 + c;
        switch (out.dtype) {
          case DType::kUint8: {
            float r = std::nearbyint(std::clamp(v, 0.f, 255.f));
            static_cast<uint8_t*>(dst)[at] = uint8_t(r);
            break;
          }
          case DType::kFloat32: static_cast<float*>(dst)[at] = v * mul[c] + add[c]; break;
          case DType::kFloat16: static_cast<uint16_t*>(dst)[at] = FloatToHalf(v * mul[c] + add[c]); break;
          case DType::kBFloat16: static_cast<uint16_t*>(dst)[at] = FloatToBFloat16(v * mul[c] + add[c]); break;
        }
      }
    }
  }
}

}  // namespace shardkit::pipeline
