// gpu/jpeg_header.h (internal): the facts of a JPEG header that decide where it can be
// decoded, read from its markers up to the first scan (no library needed).
//
// Routing (docs/gpu.md): a stream without its EOI marker (truncated), 4 components (CMYK/YCCK), an Adobe APP14 marker saying RGB
// (transform 0) with 3 components, a precision other than 8 bits, lossless or
// arithmetic-coded frames go to the host decoder. Baseline/extended Huffman 3-component
// frames with standard chroma subsampling may go to the hardware engines; progressive
// and grayscale frames to nvJPEG's CUDA backends.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardkit::gpu {

struct JpegHeader {
  int sof = 0;             // the frame marker: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...
  int precision = 0;
  int width = 0, height = 0;
  int components = 0;
  int h[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};  // sampling factors per component
  int adobe_transform = -1;  // APP14 "Adobe" transform byte, -1 when absent
  bool complete = false;     // the data ends with an EOI marker (trailing zeros allowed)
};

enum class JpegClass {
  kHardware,  // baseline/extended Huffman, 8-bit, 3 components, 4:4:4/4:2:2/4:2:0/4:4:0
  kCuda,      // progressive 8-bit with 1 or 3 components, or other 8-bit Huffman 1/3 component frames
  kHost,      // everything else (CMYK, YCCK, Adobe RGB, 12-bit, lossless, arithmetic, unparsable)
};

// Reads markers from SOI to the first SOS. False when the data is not a JPEG or the
// header is truncated or malformed before a frame header was found.
bool ParseJpegHeader(const uint8_t* data, size_t size, JpegHeader* out);

JpegClass Classify(const JpegHeader& h);

}  // namespace shardkit::gpu
