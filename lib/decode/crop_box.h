// decode/crop_box.h (internal): the crop box the decoder cuts out of an image.
// The epoch plan (pipeline/plan.h) draws boxes of this type; the decoder
// (decode/jpeg.h) takes one, so it lives below both.
#pragma once

namespace shardkit::decode {

// A crop box in source pixel coordinates (may be fractional in eval mode).
struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;
};

}  // namespace shardkit::decode
