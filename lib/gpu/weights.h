// gpu/weights.h (internal, host): the resize weights of a crop box, computed by the CPU
// loader's own code (pipeline::ComputeAxis) with the same pixel ranges as
// pipeline::Resizer::Run, so that the GPU kernel filters exactly as the CPU does.
#pragma once

#include <algorithm>
#include <cmath>

#include "pipeline/plan.h"
#include "pipeline/resize.h"

namespace shardkit::gpu {

// The source pixel range [lo, hi) of a box along one axis, as Resizer::Run computes it.
inline void BoxRange(double start, double len, int size, int* lo, int* hi) {
  *lo = std::max(0, int(std::floor(start + 1e-9)));
  *hi = std::min(size, std::max(*lo + 1, int(std::ceil(start + len - 1e-9))));
}

// Weights of `box` in a src_w x src_h image for an out_w x out_h output, and the pixel
// rectangle [x0, x1) x [y0, y1) they read (starts are in image coordinates).
inline void BoxWeights(const pipeline::CropBox& box, int src_w, int src_h, int out_w, int out_h,
                       pipeline::AxisWeights* wx, pipeline::AxisWeights* wy, int* x0, int* y0, int* x1, int* y1) {
  BoxRange(box.x, box.w, src_w, x0, x1);
  BoxRange(box.y, box.h, src_h, y0, y1);
  pipeline::ComputeAxis(box.x, box.w, out_w, *x0, *x1, wx);
  pipeline::ComputeAxis(box.y, box.h, out_h, *y0, *y1, wy);
}

// Makes the starts relative to a copy of the image that begins at pixel `origin`.
inline void ShiftStarts(pipeline::AxisWeights* a, int origin) {
  for (auto& s : a->start) s -= origin;
}

}  // namespace shardkit::gpu
