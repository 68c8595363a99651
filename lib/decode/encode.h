// decode/encode.h (internal): encoding decoded arrays (the "npy" field) as image files,
// for `convert --encode png|jpeg:Q` (ConvertOptions::encode).
//
// Input: a NumPy .npy of uint8, C order, shape [H, W] (gray), [H, W, 1], [H, W, 3]
// (RGB) or [H, W, 4] (RGBA; PNG only). PNG through libpng's simplified API (lossless:
// decoding it gives the same pixels); JPEG through libjpeg-turbo (TurboJPEG) at quality
// Q, 4:2:0 for colour. The caller is responsible for the channel order: a BGR array must
// be converted first (convert refuses to encode a source that says its arrays are BGR).
//
// Thread safety: pure functions; safe from any number of threads.
#pragma once

#include <string>
#include <string_view>

#include "shardkit/bytes.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::decode {

// What --encode asks for: "png" or "jpeg:Q" (1 <= Q <= 100); kInvalidArgument otherwise.
struct EncodeSpec {
  bool png = true;
  int quality = 90;
  std::string ext() const { return png ? "png" : "jpg"; }
};
Result<EncodeSpec> ParseEncodeSpec(std::string_view s);

// Encodes one .npy array as a PNG or JPEG file.
Result<Bytes> EncodeNpy(const Bytes& npy, const EncodeSpec& spec);

// Replaces a sample's "npy" field by the encoded image (field "png" or "jpg"); a sample
// without "npy" is left as it is. Errors name the sample key.
Status EncodeSampleArrays(Sample* s, const EncodeSpec& spec);

}  // namespace shardkit::decode
