// gpu/kernels.h (internal): the CUDA kernels of the GPU feed, callable from C++ without
// CUDA headers (streams are void*, i.e. cudaStream_t).
//
// Arithmetic: every product and sum is rounded separately (__fmul_rn/__fadd_rn, no fused
// multiply-add) and in the same order as pipeline::Resizer on the host (vertical taps,
// then horizontal), so that the same
// source pixels, box and weights give bit-identical outputs on both.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardkit/loader.h"
#include "shardkit/status.h"

namespace shardkit::gpu {

// Per-channel affine map applied to values v in [0, 255]: out = v * mul + add, with
// mul = 1 / (255 * std) and add = -mean / std computed in float exactly as the host
// Resizer does (for uint8 output: clamp(v, 0, 255) rounded half up, as the Resizer).
struct Normalize {
  float mul[3] = {1, 1, 1};
  float add[3] = {0, 0, 0};
};
Normalize MakeNormalize(DType dtype, const float mean[3], const float std[3]);

// uint8 NHWC (n x h x w x 3, device) -> dst (device) in dtype/layout.
Status LaunchConvert(const uint8_t* src, void* dst, int n, int h, int w, DType dtype, Layout layout,
                     const Normalize& norm, void* stream);

// One output row of the batch: the source pixels (interleaved RGB on the device) and the
// separable filter of pipeline::ComputeAxis packed at `weights` (device, 4-byte words):
//   int start_x[out_w], int count_x[out_w], float w_x[out_w * taps_x],
//   int start_y[out_h], int count_y[out_h], float w_y[out_h * taps_y]
// where start_* index source pixels of `src` (already relative to src).
struct ResizeDesc {
  const uint8_t* src = nullptr;
  int64_t pitch = 0;  // bytes between rows of src
  uint64_t weights = 0;  // offset of this row's tables in the weight blob, in words
  int taps_x = 0, taps_y = 0;
  int flip = 0;
  int pad = 0;
};

// Resizes, flips, normalises and stores n rows into dst (device, n x 3 x out_h x out_w
// elements of dtype in layout). descs and blob are device pointers.
Status LaunchResize(const ResizeDesc* descs, const uint32_t* blob, int n, int out_h, int out_w, DType dtype,
                    Layout layout, const Normalize& norm, void* dst, void* stream);

// Tests and benchmarks: a kernel that keeps one SM busy for about `ns` nanoseconds
// (the consumer's "training step").
Status LaunchSpin(void* stream, uint64_t ns);

}  // namespace shardkit::gpu
