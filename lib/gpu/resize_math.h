// gpu/resize_math.h (internal): the arithmetic of one output pixel of the resize kernel,
// shared by the CUDA kernel and a host test that checks it against pipeline::Resizer
// bit for bit (so that the claim "same pixels, same weights -> same output" is tested
// where no GPU is present).
//
// Every product and sum is rounded on its own (no fused multiply-add): __fmul_rn /
// __fadd_rn on the device, volatile temporaries on the host. The order is the Resizer's:
// for each horizontal tap m, the vertical sum over taps k of w_y[k] * src[row k][col m]
// (starting from 0), then acc += w_x[m] * that sum (starting from 0).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SK_HD __host__ __device__ __forceinline__
#else
#define SK_HD inline
#endif

namespace shardkit::gpu {

SK_HD float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}

SK_HD float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}

// uint8 store: clamp to [0, 255], round half up.
SK_HD uint8_t ToU8(float v) {
  v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
  return uint8_t(int(AddRn(v, 0.5f)));
}

// Normalisation of a float output: v * mul + add, each rounded.
SK_HD float Affine(float v, float mul, float add) { return AddRn(MulRn(v, mul), add); }

// The filter of one output pixel. src: interleaved RGB rows `pitch` bytes apart, with the
// starts of the tables relative to src.
SK_HD void ResizePixel(const uint8_t* src, int64_t pitch, int sx, int cx, const float* wx, int sy, int cy,
                       const float* wy, float out[3]) {
  float l0 = 0.f, l1 = 0.f, l2 = 0.f;
  for (int m = 0; m < cx; ++m) {
    const uint8_t* col = src + int64_t(sy) * pitch + int64_t(sx + m) * 3;
    float v0 = 0.f, v1 = 0.f, v2 = 0.f;
    for (int k = 0; k < cy; ++k) {
      const uint8_t* p = col + k * pitch;
      const float w = wy[k];
      v0 = AddRn(v0, MulRn(w, float(p[0])));
      v1 = AddRn(v1, MulRn(w, float(p[1])));
      v2 = AddRn(v2, MulRn(w, float(p[2])));
    }
    const float w = wx[m];
    l0 = AddRn(l0, MulRn(w, v0));
    l1 = AddRn(l1, MulRn(w, v1));
    l2 = AddRn(l2, MulRn(w, v2));
  }
  out[0] = l0;
  out[1] = l1;
  out[2] = l2;
}

}  // namespace shardkit::gpu
