#include "decode/codecs.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include <fmt/format.h>

#ifdef SHARDKIT_HAVE_WEBP
#include <webp/decode.h>
#endif
#ifdef SHARDKIT_HAVE_AVIF
#include <avif/avif.h>
#endif
#ifdef SHARDKIT_HAVE_JXL
#include <jxl/decode.h>
#endif

namespace shardkit::decode {

namespace {

[[maybe_unused]] Status LeftOut(const char* codec, const char* option) {
  return Status::Unsupported(fmt::format("{} image: shardkit was built without {} support (configure with "
                                         "-D{}=ON and its library installed)",
                                         codec, codec, option));
}

// Gray samples at the start of `px` (n of them) spread to RGB in place, back to front.
[[maybe_unused]] void GrayToRgb(std::vector<uint8_t>* px, size_t n) {
  px->resize(n * 3);
  uint8_t* p = px->data();
  for (size_t i = n; i-- > 0;) p[3 * i] = p[3 * i + 1] = p[3 * i + 2] = p[i];
}

uint32_t Be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

// Walks the boxes in [p, end): descends into meta (a full box), iprp and ipco, and keeps
// the largest ispe (width, height) seen.
void WalkBoxes(const uint8_t* p, const uint8_t* end, int depth, uint32_t* w, uint32_t* h) {
  while (end - p >= 8 && depth < 8) {
    uint64_t len = Be32(p);
    size_t head = 8;
    if (len == 1) {
      if (end - p < 16) return;
      len = uint64_t(Be32(p + 8)) << 32 | Be32(p + 12);
      head = 16;
    } else if (len == 0) {
      len = uint64_t(end - p);
    }
    if (len < head || len > uint64_t(end - p)) return;
    const uint8_t* body = p + head;
    const uint8_t* box_end = p + len;
    if (std::memcmp(p + 4, "meta", 4) == 0 && box_end - body >= 4) {
      WalkBoxes(body + 4, box_end, depth + 1, w, h);
    } else if (std::memcmp(p + 4, "iprp", 4) == 0 || std::memcmp(p + 4, "ipco", 4) == 0) {
      WalkBoxes(body, box_end, depth + 1, w, h);
    } else if (std::memcmp(p + 4, "ispe", 4) == 0 && box_end - body >= 12) {
      const uint32_t iw = Be32(body + 4), ih = Be32(body + 8);
      if (uint64_t(iw) * ih > uint64_t(*w) * *h) *w = iw, *h = ih;
    }
    p = box_end;
  }
}

}  // namespace

bool AvifDeclaredSize(const uint8_t* data, size_t size, uint32_t* width, uint32_t* height) {
  *width = *height = 0;
  WalkBoxes(data, data + size, 0, width, height);
  return *width > 0 && *height > 0;
}

// ---- WebP

Status DecodeWebp(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                  ImageInfo* info) {
#ifdef SHARDKIT_HAVE_WEBP
  WebPBitstreamFeatures f;
  const VP8StatusCode code = WebPGetFeatures(data, size, &f);
  if (code == VP8_STATUS_NOT_ENOUGH_DATA) return Status::Corrupt("WebP: truncated before the end of its header");
  if (code != VP8_STATUS_OK) return Status::Corrupt(fmt::format("WebP: bad header (libwebp status {})", int(code)));
  SK_RETURN_IF_ERROR(CheckDimensions(limits, uint64_t(f.width), uint64_t(f.height)));
  if (f.has_animation) return Status::Unsupported("WebP: an animated WebP is not supported (still images only)");
  info->format = ImageFormat::kWebp;
  info->width = f.width;
  info->height = f.height;
  info->components = f.has_alpha ? 4 : 3;
  info->bit_depth = 8;
  const size_t stride = size_t(f.width) * 3;
  rgb->resize(stride * size_t(f.height));
  if (!WebPDecodeRGBInto(data, size, rgb->data(), rgb->size(), int(stride)))
    return Status::Corrupt("WebP: the image data does not decode (corrupt or truncated)");
  return Status::OK();
#else
  (void)data, (void)size, (void)limits, (void)rgb, (void)info;
  return LeftOut("WebP", "SHARDKIT_WITH_WEBP");
#endif
}

// ---- AVIF

#ifdef SHARDKIT_HAVE_AVIF
namespace {

struct AvifDecoderFree {
  void operator()(avifDecoder* d) const { avifDecoderDestroy(d); }
};

Status AvifError(const char* step, avifResult r, const avifDecoder* d) {
  const char* diag = d->diag.error;
  return Status::Corrupt(fmt::format("AVIF: {}: {}{}{}", step, avifResultToString(r), *diag ? ": " : "", diag));
}

// The irot (counter-clockwise quarter turns) then imir transforms of `img` applied to the
// packed RGB pixels in `px` (w x h); w and h become the output's.
void Transform(const avifImage* img, std::vector<uint8_t>* px, int* w, int* h) {
  const bool rot = (img->transformFlags & AVIF_TRANSFORM_IROT) && (img->irot.angle & 3) != 0;
  const bool mir = (img->transformFlags & AVIF_TRANSFORM_IMIR) != 0;
  if (!rot && !mir) return;
  const int iw = *w, ih = *h;
  const int turns = rot ? img->irot.angle & 3 : 0;
  const int ow = turns & 1 ? ih : iw, oh = turns & 1 ? iw : ih;
  std::vector<uint8_t> out(px->size());
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < ow; ++x) {
      int dx = x, dy = y;  // the rotated image's pixel, before the mirror
      if (mir) {
        if (img->imir.mode == 0) dy = oh - 1 - y;  // top and bottom exchanged
        else dx = ow - 1 - x;                      // left and right exchanged
      }
      int sx, sy;  // its source pixel: undo `turns` counter-clockwise quarter turns
      switch (turns) {
        case 1: sx = iw - 1 - dy, sy = dx; break;
        case 2: sx = iw - 1 - dx, sy = ih - 1 - dy; break;
        case 3: sx = dy, sy = ih - 1 - dx; break;
        default: sx = dx, sy = dy; break;
      }
      std::memcpy(&out[(size_t(y) * ow + x) * 3], &(*px)[(size_t(sy) * iw + sx) * 3], 3);
    }
  }
  px->swap(out);
  *w = ow;
  *h = oh;
}

}  // namespace
#endif

Status DecodeAvif(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                  ImageInfo* info) {
#ifdef SHARDKIT_HAVE_AVIF
  // The declared size first, so that the refusal names it even where libavif's own
  // limit (set below) would stop the parse with a message of its own.
  uint32_t dw = 0, dh = 0;
  if (AvifDeclaredSize(data, size, &dw, &dh)) SK_RETURN_IF_ERROR(CheckDimensions(limits, dw, dh));
  std::unique_ptr<avifDecoder, AvifDecoderFree> d(avifDecoderCreate());
  if (!d) return Status::Internal("AVIF: libavif could not create a decoder");
  d->maxThreads = 1;  // one decoder per thread (the loader's threads)
  // dav1d where this libavif has it (Debian's does; first in libavif's own order too): the
  // wheel bundles no other AV1 decoder (python/build_backend/wheel_repair.py, STUB_PREFIXES).
  if (avifCodecName(AVIF_CODEC_CHOICE_DAV1D, AVIF_CODEC_FLAG_CAN_DECODE)) d->codecChoice = AVIF_CODEC_CHOICE_DAV1D;
  d->ignoreExif = AVIF_TRUE;
  d->ignoreXMP = AVIF_TRUE;
  d->strictFlags = AVIF_STRICT_DISABLED;  // as browsers read them (e.g. files without 'pixi')
  d->imageSizeLimit = uint32_t(std::min<uint64_t>(limits.max_pixels, std::numeric_limits<uint32_t>::max()));
  d->imageDimensionLimit = uint32_t(std::max(limits.max_side, 1));
  avifResult r = avifDecoderSetIOMemory(d.get(), data, size);
  if (r != AVIF_RESULT_OK) return AvifError("reading", r, d.get());
  r = avifDecoderParse(d.get());
  if (r != AVIF_RESULT_OK) return AvifError("parsing", r, d.get());
  SK_RETURN_IF_ERROR(CheckDimensions(limits, d->image->width, d->image->height));
  r = avifDecoderNextImage(d.get());
  if (r != AVIF_RESULT_OK) return AvifError("decoding", r, d.get());
  const avifImage* img = d->image;
  SK_RETURN_IF_ERROR(CheckDimensions(limits, img->width, img->height));
  info->format = ImageFormat::kAvif;
  info->components = (img->yuvFormat == AVIF_PIXEL_FORMAT_YUV400 ? 1 : 3) + (d->alphaPresent ? 1 : 0);
  info->bit_depth = int(img->depth);
  avifRGBImage out;
  avifRGBImageSetDefaults(&out, img);
  out.format = AVIF_RGB_FORMAT_RGB;
  out.depth = 8;
  out.rowBytes = img->width * 3;
  rgb->resize(size_t(out.rowBytes) * img->height);
  out.pixels = rgb->data();
  r = avifImageYUVToRGB(img, &out);
  if (r != AVIF_RESULT_OK) return AvifError("converting to RGB", r, d.get());
  int w = int(img->width), h = int(img->height);
  Transform(img, rgb, &w, &h);
  info->width = w;
  info->height = h;
  return Status::OK();
#else
  (void)data, (void)size, (void)limits, (void)rgb, (void)info;
  return LeftOut("AVIF", "SHARDKIT_WITH_AVIF");
#endif
}

// ---- JPEG XL

#ifdef SHARDKIT_HAVE_JXL
namespace {
struct JxlDecoderFree {
  void operator()(JxlDecoder* d) const { JxlDecoderDestroy(d); }
};
}  // namespace
#endif

Status DecodeJxl(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* rgb,
                 ImageInfo* info) {
#ifdef SHARDKIT_HAVE_JXL
  std::unique_ptr<JxlDecoder, JxlDecoderFree> d(JxlDecoderCreate(nullptr));
  if (!d) return Status::Internal("JPEG XL: libjxl could not create a decoder");
  if (JxlDecoderSubscribeEvents(d.get(), JXL_DEC_BASIC_INFO | JXL_DEC_FULL_IMAGE) != JXL_DEC_SUCCESS ||
      JxlDecoderSetInput(d.get(), data, size) != JXL_DEC_SUCCESS)
    return Status::Internal("JPEG XL: libjxl refused its setup");
  JxlDecoderCloseInput(d.get());
  JxlPixelFormat pf{3, JXL_TYPE_UINT8, JXL_NATIVE_ENDIAN, 0};
  bool have_info = false;
  for (;;) {
    const JxlDecoderStatus s = JxlDecoderProcessInput(d.get());
    switch (s) {
      case JXL_DEC_ERROR:
        return Status::Corrupt("JPEG XL: the data does not decode (corrupt)");
      case JXL_DEC_NEED_MORE_INPUT:
        return Status::Corrupt("JPEG XL: truncated (the data ends before the image)");
      case JXL_DEC_BASIC_INFO: {
        JxlBasicInfo bi;
        if (JxlDecoderGetBasicInfo(d.get(), &bi) != JXL_DEC_SUCCESS)
          return Status::Corrupt("JPEG XL: unreadable basic info");
        SK_RETURN_IF_ERROR(CheckDimensions(limits, bi.xsize, bi.ysize));
        // Orientations 5 to 8 transpose: libjxl's output is ysize x xsize.
        const bool transposed = bi.orientation >= JXL_ORIENT_TRANSPOSE;
        info->format = ImageFormat::kJxl;
        info->width = int(transposed ? bi.ysize : bi.xsize);
        info->height = int(transposed ? bi.xsize : bi.ysize);
        info->components = int(bi.num_color_channels + (bi.alpha_bits ? 1 : 0));
        info->bit_depth = int(bi.bits_per_sample);
        pf.num_channels = bi.num_color_channels == 1 ? 1 : 3;
        have_info = true;
        break;
      }
      case JXL_DEC_NEED_IMAGE_OUT_BUFFER: {
        if (!have_info) return Status::Corrupt("JPEG XL: pixels before the basic info");
        size_t need = 0;
        if (JxlDecoderImageOutBufferSize(d.get(), &pf, &need) != JXL_DEC_SUCCESS)
          return Status::Corrupt("JPEG XL: no output buffer size");
        const size_t expect = size_t(info->width) * size_t(info->height) * pf.num_channels;
        if (need != expect)
          return Status::Corrupt(fmt::format("JPEG XL: an output of {} bytes for a {}x{} image", need, info->width,
                                             info->height));
        rgb->resize(std::max(need, expect / pf.num_channels * 3));
        if (JxlDecoderSetImageOutBuffer(d.get(), &pf, rgb->data(), need) != JXL_DEC_SUCCESS)
          return Status::Corrupt("JPEG XL: libjxl refused the output buffer");
        break;
      }
      case JXL_DEC_FULL_IMAGE:  // the first frame: the image (an animation's first)
        if (pf.num_channels == 1) GrayToRgb(rgb, size_t(info->width) * size_t(info->height));
        return Status::OK();
      case JXL_DEC_SUCCESS:
        return Status::Corrupt("JPEG XL: the data ends without an image");
      default:
        return Status::Corrupt(fmt::format("JPEG XL: unexpected decoder event {}", int(s)));
    }
  }
#else
  (void)data, (void)size, (void)limits, (void)rgb, (void)info;
  return LeftOut("JPEG XL", "SHARDKIT_WITH_JXL");
#endif
}

}  // namespace shardkit::decode
