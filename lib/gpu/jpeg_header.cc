#include "gpu/jpeg_header.h"

namespace shardkit::gpu {

bool ParseJpegHeader(const uint8_t* d, size_t n, JpegHeader* out) {
  *out = JpegHeader{};
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return false;
  size_t p = 2;
  bool have_frame = false;
  while (p + 1 < n) {
    if (d[p] != 0xFF) return have_frame;  // garbage between segments
    while (p < n && d[p] == 0xFF) ++p;    // fill bytes
    if (p >= n) break;
    const int m = d[p++];
    if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
    if (m == 0xD9) break;                                              // EOI
    if (p + 2 > n) break;
    const size_t len = (size_t(d[p]) << 8) | d[p + 1];
    if (len < 2 || p + len > n) break;
    const uint8_t* s = d + p + 2;
    const size_t sl = len - 2;
    const bool is_sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (is_sof && !have_frame) {
      if (sl < 6) return false;
      out->sof = m;
      out->precision = s[0];
      out->height = (s[1] << 8) | s[2];
      out->width = (s[3] << 8) | s[4];
      out->components = s[5];
      if (sl < 6 + size_t(out->components) * 3) return false;
      for (int c = 0; c < out->components && c < 4; ++c) {
        out->h[c] = s[6 + c * 3 + 1] >> 4;
        out->v[c] = s[6 + c * 3 + 1] & 15;
      }
      have_frame = true;
    } else if (m == 0xEE && sl >= 12 && s[0] == 'A' && s[1] == 'd' && s[2] == 'o' && s[3] == 'b' && s[4] == 'e') {
      out->adobe_transform = s[11];
    } else if (m == 0xDA) {
      break;  // first scan: the header is over
    }
    p += len;
  }
  if (!have_frame || out->width <= 0 || out->height <= 0) return false;
  // A complete stream ends with EOI (possibly followed by zero padding); a truncated one
  // is left to the host decoder, whose error names the problem.
  size_t e = n;
  while (e > 2 && d[e - 1] == 0) --e;
  out->complete = e >= 4 && d[e - 2] == 0xFF && d[e - 1] == 0xD9;
  return true;
}

JpegClass Classify(const JpegHeader& h) {
  if (!h.complete) return JpegClass::kHost;
  if (h.precision != 8) return JpegClass::kHost;
  if (h.components != 1 && h.components != 3) return JpegClass::kHost;  // CMYK / YCCK / other
  if (h.components == 3 && h.adobe_transform == 0) return JpegClass::kHost;  // Adobe RGB (not YCbCr)
  const bool huffman_sequential = h.sof == 0xC0 || h.sof == 0xC1;
  const bool progressive = h.sof == 0xC2;
  if (!huffman_sequential && !progressive) return JpegClass::kHost;  // lossless, arithmetic, hierarchical
  if (progressive || h.components == 1) return JpegClass::kCuda;
  // Chroma planes must be 1x1 and luma one of 1x1, 2x1, 2x2, 1x2.
  if (h.h[1] != 1 || h.v[1] != 1 || h.h[2] != 1 || h.v[2] != 1) return JpegClass::kCuda;
  const int hy = h.h[0], vy = h.v[0];
  const bool standard = (hy == 1 && vy == 1) || (hy == 2 && vy == 1) || (hy == 2 && vy == 2) || (hy == 1 && vy == 2);
  return standard ? JpegClass::kHardware : JpegClass::kCuda;
}

}  // namespace shardkit::gpu
