// decode/transform.h (internal): the per-sample image transform of `convert --resize
// RULE --encode CODEC` (ConvertOptions::resize, ::encode).
//
// Every image field of a sample (a field whose extension is an image's: jpg, jpeg, png,
// webp, ...; compound names such as "seg.png" are data and stay as they are) is
//  1. decoded (ImageDecoder, under Limits: max_pixels from --max-pixels) to 8-bit RGB
//     (grayscale and CMYK/YCCK as the decoder gives them: RGB);
//  2. turned upright by its EXIF orientation (TIFF tag 0x0112, values 1..8, in a JPEG's
//     first APP1 "Exif" segment, a WebP's "EXIF" chunk or a PNG's "eXIf" chunk; anything
//     else, or no EXIF, counts as 1; AVIF's irot/imir and JPEG XL's orientation are
//     applied by their decoders, decode/codecs.h);
//  3. resized when it is larger than the rule allows (never enlarged): libjpeg's DCT
//     scaling (1/2, 1/4, 1/8) while the decoded image still covers the output size, then a
//     triangle filter whose support widens with the factor (PIL's BILINEAR) to the exact
//     size; the resize runs in the stored orientation and the small result is rotated,
//     which is the same as rotating first;
//     (A baseline 4:2:0 YCbCr JPEG, upright, to a JPEG output does steps 1, 3 and 4 in
//     YCbCr planes instead of RGB: SetPlaneRoute below.)
//  4. encoded with the chosen codec (encode.h); the output has no EXIF or other metadata.
//     The field takes the codec's extension (jpg, png, webp); the key is unchanged.
// An image already within the rule is decoded, turned upright and re-encoded all the
// same: every image of the output has the codec and orientation the record says.
// A sample without an image field but with a decoded array ("npy": uint8 [H, W],
// [H, W, 1], [H, W, 3] or [H, W, 4]) has the array through steps 3 and 4 in its place:
// within the rule encoded as it is (gray stays gray); larger, resized (gray stays gray,
// RGBA becomes RGB).
//
// Exact sizes (w x h: the upright source; never more than w or h):
//   short:S  short side > S: the short side becomes S, the long one round(long * S / short)
//   max:M    long side > M: the long side becomes M, the short one round(short * M / long)
//   fit:WxH  w > W or h > H: scaled by min(W / w, H / h); the side that limits is exactly W
//            (or H), the other round(side * W / w) (or * H / h), clipped to H (or W)
// round() is half up; no side is less than 1.
//
// Thread safety: the functions are pure, except that TransformSampleImages keeps one
// decoder per thread (thread_local): safe from any number of threads. The output depends
// only on the input bytes and the spec, never on the thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "decode/encode.h"
#include "decode/jpeg.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::decode {

struct ResizeRule {
  enum class Kind { kNone, kShort, kMax, kFit };
  Kind kind = Kind::kNone;
  int a = 0, b = 0;  // short:a, max:a, fit:axb
  // As ParseResize reads it ("short:256"); "" for kNone.
  std::string ToString() const;
};

// "short:S", "max:M" or "fit:WxH", sizes 1..65535; kInvalidArgument naming the text otherwise.
Result<ResizeRule> ParseResize(std::string_view s);

// The output size of an upright w x h image under the rule (see above).
void ResizedSize(const ResizeRule& rule, int w, int h, int* out_w, int* out_h);

// The EXIF orientation of a JPEG (1..8); 1 when it has none or the segment does not parse.
// Reads the markers before the first scan only, every offset bounds-checked.
int JpegOrientation(const uint8_t* data, size_t size);
// The same for any image (step 2 above): JPEG, WebP or PNG by magic bytes, every offset
// bounds-checked; 1 for the others.
int ImageOrientation(const uint8_t* data, size_t size);

// The size of an image turned upright: orientations 5..8 swap width and height.
inline void UprightSize(int orientation, int w, int h, int* out_w, int* out_h) {
  const bool swap = orientation >= 5 && orientation <= 8;
  *out_w = swap ? h : w;
  *out_h = swap ? w : h;
}

// What a conversion does to images.
struct TransformSpec {
  ResizeRule resize;
  EncodeSpec encode;
  Limits limits;
  // The record the output's metadata keeps: {"resize": "short:256", "encode": "jpeg:90",
  // "orientation": "applied"} (resize absent without one), as compact JSON.
  std::string RecordJson() const;
};

// The transform ConvertOptions ask for, or nullopt when images are copied as they are:
// `encode` "" or "keep" without `resize`. With `resize` the encoding defaults to jpeg:90;
// "keep" with a resize is an error (kept bytes cannot be resized). max_pixels 0: the
// decoder's default (Limits{}.max_pixels). kInvalidArgument naming the value on a bad one.
Result<std::optional<TransformSpec>> ParseTransform(std::string_view resize, std::string_view encode,
                                                    uint64_t max_pixels);

// Decodes, turns upright, resizes and encodes one image (see above); *out_w/*out_h get the
// output size when not null. Decoding errors are kCorrupt (an image over the limits too:
// the message gives its declared size) or kUnsupported; encoding errors kInternal.
Result<Bytes> TransformImage(const uint8_t* data, size_t size, const TransformSpec& spec, int* out_w = nullptr,
                             int* out_h = nullptr);

// Transforms every image field of `s` (see above). Errors name the key and the field.
Status TransformSampleImages(Sample* s, const TransformSpec& spec);

// The upright size of an encoded image (its header, or a decode at 1/8 scale), using a
// decoder of this thread. For verify's comparison of sizes.
Status UprightImageSize(const uint8_t* data, size_t size, const Limits& limits, int* w, int* h);

// Resizes 8-bit RGB pixels (rows `src_stride` bytes apart) to dst_w x dst_h (rows
// dst_w * 3 bytes apart) with the widening triangle filter; fixed point, deterministic.
void ResizeRgb(const uint8_t* src, int src_w, int src_h, size_t src_stride, uint8_t* dst, int dst_w, int dst_h);
// ResizeRgb's passes use AVX2 where the CPU has it, with results equal to the bit to the
// portable passes'. SetResampleSimd(false) keeps them to the portable ones (tests compare
// the two); it returns whether the SIMD passes are in use now.
bool SetResampleSimd(bool on);
// TransformImage takes a baseline 4:2:0 YCbCr JPEG, upright, to a JPEG output in YCbCr:
// decoded to its planes, each resized with the same filter (the chroma planes to the
// output's chroma size), encoded from the planes, skipping the colour conversions and the
// chroma resampling of the RGB route (which every other image takes, and this one where
// TurboJPEG reports an error or a warning). SetPlaneRoute(false) sends every image the RGB
// way (tests compare the two); it returns the previous setting.
bool SetPlaneRoute(bool on);

}  // namespace shardkit::decode
