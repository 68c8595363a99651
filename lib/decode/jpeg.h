// decode/jpeg.h (internal): decoding the region of an image that a crop needs.
//
// JPEG through libjpeg (libjpeg-turbo's jpeglib.h): the header is read first, the
// caller picks the crop box from the image size, then only that region is decoded
// (jpeg_crop_scanline for columns, jpeg_skip_scanlines for rows above, the rows below
// are never decoded) and, when allowed and the box is much larger than the output, at a
// reduced DCT scale (scale_num/8). CMYK and YCCK come out RGB (Adobe files are taken
// as inverted CMYK, as Photoshop and PIL write them), grayscale too.
// PNG (detected by its magic bytes, whatever the file's name) through libpng's
// simplified API: fully decoded to 8-bit RGB (16-bit samples reduced to 8, palette and
// grayscale expanded, alpha dropped), then the box is a view into it. WebP, AVIF and
// JPEG XL (decode/codecs.h) likewise: decoded whole, then viewed.
//
// Safety: libjpeg errors longjmp back into the decoder (never exit()); warnings that
// mean the output would be wrong (premature end, corrupt entropy data) are errors, the
// rest are counted. Declared dimensions over Limits are refused before any pixel memory
// is allocated; a progressive JPEG may not have more than Limits::max_scans scans.
//
// Threading: an ImageDecoder is used by one thread at a time (keep one per thread);
// distinct decoders are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "decode/crop_box.h"
#include "shardkit/status.h"

namespace shardkit::decode {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kAvif, kJxl, kPixels };  // kPixels: FromPixels
// By magic bytes (core/paths.h, SniffImageExt), never by a name: FF D8 FF is JPEG,
// 89 'P' 'N' 'G' PNG, "RIFF" .... "WEBP" WebP, an ISO-BMFF 'ftyp' box with brand avif or
// avis AVIF, FF 0A or the container signature 00 00 00 0C "JXL " 0D 0A 87 0A JPEG XL.
ImageFormat Sniff(const uint8_t* data, size_t size);
// "JPEG", "PNG", "WebP", "AVIF", "JPEG XL", "pixels", "unknown".
const char* FormatName(ImageFormat f);

struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0, height = 0;  // as decoded (after JPEG XL's orientation and AVIF's irot/imir)
  // As stored: 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK (JPEG); PNG, WebP, AVIF and JPEG XL count
  // an alpha channel too (2 gray + alpha, 4 RGBA).
  int components = 0;
  int bit_depth = 8;        // bits per stored sample (PNG 16, AVIF 10/12, JPEG XL up to 16)
  bool progressive = false;
  bool cmyk = false;
};

// Speed/quality knobs of libjpeg measured in docs/loader.md ("Performance"); the
// defaults are libjpeg's (ISLOW, fancy upsampling), which the loader keeps: the faster
// settings cost more accuracy than they gain speed there. Used by the benchmark.
struct DecodeSettings {
  bool fast_idct = false;         // JDCT_IFAST instead of libjpeg's default JDCT_ISLOW
  bool fancy_upsampling = true;   // false: merged (non-fancy) chroma upsampling
};

// The decompression-bomb guard's default: 200 megapixels (600 MB of RGB), above any
// camera's image yet far below what a header can declare (a 16-byte PNG header can ask
// for 4 gigapixels). LoaderOptions::max_pixels and VerifyOptions::max_pixels default to it.
inline constexpr uint64_t kDefaultMaxPixels = 200'000'000;

struct Limits {
  int max_side = 32768;                     // width or height above this: refused
  uint64_t max_pixels = kDefaultMaxPixels;  // width * height above this: refused
  int max_scans = 500;                      // progressive JPEG scans
  uint64_t max_memory = 1ull << 30;         // libjpeg's working memory
};

// The check every codec makes on the size a header declares, before allocating pixels:
// kCorrupt "image has zero size WxH", or "image declares WxH pixels, over the limit (S per
// side, P in all)" when a side is over max_side or the area over max_pixels.
Status CheckDimensions(const Limits& limits, uint64_t width, uint64_t height);

// The DCT scale (num / 8, num in 8, 4, 2, 1) at which a w x h JPEG decodes to the fewest
// pixels that still cover min_w x min_h: only the scales libjpeg-turbo has SIMD IDCTs for;
// the others (7/8, 6/8, ...) run plain C IDCTs that cost more than they save.
int SimdDctScale(double w, double h, double min_w, double min_h);

// The decoded pixels of a region: RGB, 3 bytes per pixel, rows `stride` bytes apart.
// `box` is the requested crop in these pixels' coordinates (fractional after DCT
// scaling); it lies inside [0, width) x [0, height).
struct Region {
  const uint8_t* pixels = nullptr;
  int width = 0, height = 0;
  size_t stride = 0;
  CropBox box;
  int scale_num = 8;  // decoded at scale_num/8 of the full size
};

class ImageDecoder {
 public:
  explicit ImageDecoder(Limits limits = {}, DecodeSettings settings = {});
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads the header, calls choose(info) for the crop box (source pixels), decodes the
  // region. min_out_w/min_out_h > 0 allow DCT scaling (1/2, 1/4, 1/8) down to the smallest
  // scale at which the box still covers that many pixels in both dimensions; 0 decodes at
  // full scale. (The loader passes the output size times LoaderOptions::dct_min_cover,
  // so a box of 1.5x the output may be decoded at 1/2 and upsampled by 4/3.) The pixels stay valid
  // until the next call on this decoder.
  Status Decode(const uint8_t* data, size_t size,
                const std::function<CropBox(const ImageInfo&)>& choose,
                double min_out_w, double min_out_h, Region* out, ImageInfo* info_out = nullptr);

  // The whole image at full scale (no crop, no DCT scaling): what conversion and
  // `verify --decode` need. Same validity as Decode.
  Status DecodeAll(const uint8_t* data, size_t size, Region* out, ImageInfo* info_out = nullptr);

  // An already decoded image (a NumPy array of the "npy" field: uint8, `channels` 1 (gray)
  // or 3 (RGB, or BGR when `bgr`), rows `stride` bytes apart) as a Region, the same one a
  // lossless PNG of these pixels gives: choose(info) picks the box, Limits apply. RGB
  // pixels are used in place (no copy: they must outlive the Region); gray is expanded to
  // RGB and BGR reordered into this decoder's buffer.
  Status FromPixels(const uint8_t* pixels, int width, int height, int channels, size_t stride, bool bgr,
                    const std::function<CropBox(const ImageInfo&)>& choose, Region* out,
                    ImageInfo* info_out = nullptr);

  const DecodeSettings& settings() const;

  // Warnings seen and tolerated (not errors) since construction.
  uint64_t tolerated_warnings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardkit::decode
