// pipeline/resize.h (internal): crop box -> output pixels of one batch row.
//
// Separable resize with a triangle (bilinear) filter whose support widens with the
// downscale factor, as PIL's BILINEAR resize (and torchvision's antialias=True): for
// output pixel i along an axis, center c = box0 + (i + 0.5) * s with s = box_len / out,
// support r = max(s, 1), taps x in [floor(c - r + 0.5), floor(c + r + 0.5)) clipped to
// the box's pixel range, weights tri((x + 0.5 - c) / max(s, 1)) normalised to sum 1.
// Vertical pass first (uint8 in, float accumulate), then horizontal, then flip,
// normalisation ((v / 255 - mean) / std for floats; uint8 rounds half up) and the
// store in the requested dtype and layout.
//
// Threading: Resizer holds scratch; one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pipeline/plan.h"
#include "shardkit/loader.h"

namespace shardkit::pipeline {

struct OutputSpec {
  int width = 224, height = 224;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};

// The weights of one axis.
struct AxisWeights {
  int taps = 0;                 // max taps per output pixel
  std::vector<int> start;       // first source pixel per output pixel
  std::vector<int> count;       // taps used per output pixel
  std::vector<float> w;         // taps per output pixel, zero-padded
};
// box0/len in source pixels; [lo, hi) the source pixels that may be read.
void ComputeAxis(double box0, double len, int out, int lo, int hi, AxisWeights* a);

class Resizer {
 public:
  // src: RGB rows `stride` bytes apart, at least covering the box. dst: the batch row
  // (out.width * out.height * 3 elements of out.dtype).
  void Run(const uint8_t* src, size_t stride, int src_w, int src_h, const CropBox& box, bool flip,
           const OutputSpec& out, void* dst);

 private:
  AxisWeights wx_, wy_;
  std::vector<float> tmp_;  // one row: vertical result (RGB) and the output row (RGBx)
};

uint16_t FloatToHalf(float f);
uint16_t FloatToBFloat16(float f);
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t h);

}  // namespace shardkit::pipeline
