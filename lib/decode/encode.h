// decode/encode.h (internal): encoding pixels as image files, for `convert --encode
// png|jpeg[:Q]|webp[:Q]` (ConvertOptions::encode): decoded arrays (the "npy" field), and
// the RGB pixels of a transformed image (decode/transform.h).
//
// Input: a NumPy .npy of uint8, C order, shape [H, W] (gray), [H, W, 1], [H, W, 3]
// (RGB) or [H, W, 4] (RGBA; PNG only). PNG through libpng's simplified API (lossless:
// decoding it gives the same pixels); JPEG through libjpeg-turbo (TurboJPEG) at quality
// Q, 4:2:0 for colour; WebP through libwebp (lossy at quality Q, when the build has
// libwebp: SHARDKIT_HAVE_WEBP). Every encoder is deterministic: the same pixels give the
// same bytes on every run and thread. The caller is responsible for the channel order: a BGR array must
// be converted first (convert refuses to encode a source that says its arrays are BGR).
//
// Thread safety: pure functions; safe from any number of threads.
#pragma once

#include <string>
#include <string_view>

#include "core/pickle.h"
#include "shardkit/bytes.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::decode {

// What --encode asks for: "png", "jpeg[:Q]" (also "jpg[:Q]") or "webp[:Q]", 1 <= Q <= 100,
// default 90; kInvalidArgument otherwise, and for webp in a build without libwebp.
struct EncodeSpec {
  bool png = true;
  int quality = 90;
  bool webp = false;  // (png false) lossy WebP at `quality` instead of JPEG
  std::string ext() const { return png ? "png" : webp ? "webp" : "jpg"; }
  // As ParseEncodeSpec reads it: "png", "jpeg:90", "webp:80".
  std::string ToString() const;
};
Result<EncodeSpec> ParseEncodeSpec(std::string_view s);

// Encodes 8-bit pixels: `channels` 1 (gray), 3 (RGB) or 4 (RGBA: PNG and WebP only), rows
// `stride` bytes apart.
Result<Bytes> EncodePixels(const uint8_t* pixels, int width, int height, int channels, size_t stride,
                           const EncodeSpec& spec);

// A .npy decoded array as image pixels: uint8 [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]
// in C order, rows packed (`array` keeps the bytes). kUnsupported naming what is not.
struct NpyImage {
  pickle::NdArray array;
  int width = 0, height = 0, channels = 1;
  const uint8_t* pixels() const { return reinterpret_cast<const uint8_t*>(array.data.data()); }
};
Result<NpyImage> ParseNpyImage(const Bytes& npy);

// Encodes one .npy array as a PNG or JPEG file.
Result<Bytes> EncodeNpy(const Bytes& npy, const EncodeSpec& spec);

// Replaces a sample's "npy" field by the encoded image (field "png" or "jpg"); a sample
// without "npy" is left as it is. Errors name the sample key.
Status EncodeSampleArrays(Sample* s, const EncodeSpec& spec);

}  // namespace shardkit::decode
