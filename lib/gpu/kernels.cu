// gpu/kernels.cu: conversion and crop-resize kernels (see kernels.h).
#include "gpu/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu/cuda_util.h"
#include "gpu/resize_math.h"

namespace shardkit::gpu {
namespace {

struct NormArgs {
  float mul[3];
  float add[3];
};

template <class T>
__device__ __forceinline__ void Store(T* dst, int64_t at, float v, float mul, float add);
template <>
__device__ __forceinline__ void Store<uint8_t>(uint8_t* dst, int64_t at, float v, float, float) {
  dst[at] = ToU8(v);
}
template <>
__device__ __forceinline__ void Store<float>(float* dst, int64_t at, float v, float mul, float add) {
  dst[at] = Affine(v, mul, add);
}
template <>
__device__ __forceinline__ void Store<__half>(__half* dst, int64_t at, float v, float mul, float add) {
  dst[at] = __float2half_rn(Affine(v, mul, add));
}
template <>
__device__ __forceinline__ void Store<__nv_bfloat16>(__nv_bfloat16* dst, int64_t at, float v, float mul, float add) {
  dst[at] = __float2bfloat16_rn(Affine(v, mul, add));
}

// One thread per output pixel; blockIdx.y is the batch row. The vertical sums of each
// tap column are recomputed per output pixel, in the host Resizer's order (vertical pass,
// then horizontal), so the result equals its two-pass computation bit for bit.
template <class T, bool kNchw>
__global__ void ResizeKernel(const ResizeDesc* __restrict__ descs, const uint32_t* __restrict__ blob, int out_h,
                             int out_w, NormArgs norm, T* __restrict__ dst) {
  const int n = blockIdx.y;
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= out_h * out_w) return;
  const int j = p / out_w, i = p - j * out_w;
  const ResizeDesc d = descs[n];
  const uint32_t* base = blob + d.weights;
  const int* start_x = reinterpret_cast<const int*>(base);
  const int* count_x = start_x + out_w;
  const float* w_x = reinterpret_cast<const float*>(count_x + out_w);
  const int* start_y = reinterpret_cast<const int*>(w_x + size_t(out_w) * d.taps_x);
  const int* count_y = start_y + out_h;
  const float* w_y = reinterpret_cast<const float*>(count_y + out_h);

  const int sx = start_x[i], cx = count_x[i];
  const float* wx = w_x + size_t(i) * d.taps_x;
  const int sy = start_y[j], cy = count_y[j];
  const float* wy = w_y + size_t(j) * d.taps_y;
  float l[3];
  ResizePixel(d.src, d.pitch, sx, cx, wx, sy, cy, wy, l);
  const int xo = d.flip ? out_w - 1 - i : i;
  const int64_t plane = int64_t(out_h) * out_w;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    int64_t at = kNchw ? (int64_t(n) * 3 + c) * plane + int64_t(j) * out_w + xo
                       : (int64_t(n) * plane + int64_t(j) * out_w + xo) * 3 + c;
    Store<T>(dst, at, l[c], norm.mul[c], norm.add[c]);
  }
}

__global__ void SpinKernel(uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
  }
}

NormArgs Args(const Normalize& n) {
  NormArgs a;
  for (int c = 0; c < 3; ++c) {
    a.mul[c] = n.mul[c];
    a.add[c] = n.add[c];
  }
  return a;
}

template <class T, bool kNchw>
__global__ void ConvertKernel(const uint8_t* __restrict__ src, int64_t ppi, int64_t total, NormArgs norm,
                              T* __restrict__ dst) {
  int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= total) return;
  const uint8_t* s = src + p * 3;
  const int64_t n = p / ppi, q = p - n * ppi;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    int64_t at = kNchw ? (n * 3 + c) * ppi + q : p * 3 + c;
    Store<T>(dst, at, float(s[c]), norm.mul[c], norm.add[c]);
  }
}

}  // namespace

// Launches KERNEL<T, nchw> for the dtype/layout pair, destination last.
#define SK_DISPATCH(KERNEL, dtype, layout, grid, block, stream, dst, ...)                          \
  do {                                                                                             \
    const bool nchw_ = (layout) == Layout::kNCHW;                                                  \
    switch (dtype) {                                                                               \
      case DType::kUint8:                                                                          \
        if (nchw_) KERNEL<uint8_t, true><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<uint8_t*>(dst)); \
        else KERNEL<uint8_t, false><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<uint8_t*>(dst));      \
        break;                                                                                     \
      case DType::kFloat32:                                                                        \
        if (nchw_) KERNEL<float, true><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<float*>(dst));     \
        else KERNEL<float, false><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<float*>(dst));          \
        break;                                                                                     \
      case DType::kFloat16:                                                                        \
        if (nchw_) KERNEL<__half, true><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<__half*>(dst));   \
        else KERNEL<__half, false><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<__half*>(dst));        \
        break;                                                                                     \
      case DType::kBFloat16:                                                                       \
        if (nchw_) KERNEL<__nv_bfloat16, true><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<__nv_bfloat16*>(dst)); \
        else KERNEL<__nv_bfloat16, false><<<grid, block, 0, stream>>>(__VA_ARGS__, static_cast<__nv_bfloat16*>(dst));      \
        break;                                                                                     \
    }                                                                                              \
  } while (0)

Normalize MakeNormalize(DType dtype, const float mean[3], const float std[3]) {
  Normalize n;
  const bool is_u8 = dtype == DType::kUint8;
  for (int c = 0; c < 3; ++c) {
    n.mul[c] = is_u8 ? 1.f : 1.f / (255.f * std[c]);
    n.add[c] = is_u8 ? 0.f : -mean[c] / std[c];
  }
  return n;
}

Status LaunchConvert(const uint8_t* src, void* dst, int n, int h, int w, DType dtype, Layout layout,
                     const Normalize& norm, void* stream) {
  const int64_t ppi = int64_t(h) * w, total = ppi * n;
  if (total == 0) return Status::OK();
  const int block = 256;
  dim3 grid(unsigned((total + block - 1) / block));
  SK_DISPATCH(ConvertKernel, dtype, layout, grid, dim3(block), AsStream(stream), dst, src, ppi, total, Args(norm));
  SK_CUDA_RETURN(cudaGetLastError());
  return Status::OK();
}

Status LaunchResize(const ResizeDesc* descs, const uint32_t* blob, int n, int out_h, int out_w, DType dtype,
                    Layout layout, const Normalize& norm, void* dst, void* stream) {
  if (n == 0) return Status::OK();
  const int block = 128;
  dim3 grid(unsigned((out_h * out_w + block - 1) / block), unsigned(n));
  SK_DISPATCH(ResizeKernel, dtype, layout, grid, dim3(block), AsStream(stream), dst, descs, blob, out_h, out_w,
              Args(norm));
  SK_CUDA_RETURN(cudaGetLastError());
  return Status::OK();
}

Status LaunchSpin(void* stream, uint64_t ns) {
  SpinKernel<<<1, 1, 0, AsStream(stream)>>>(ns);
  SK_CUDA_RETURN(cudaGetLastError());
  return Status::OK();
}

}  // namespace shardkit::gpu
