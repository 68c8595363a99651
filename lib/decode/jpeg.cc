#include "decode/jpeg.h"

#include "core/paths.h"
#include "decode/codecs.h"

#include <png.h>
#include <csetjmp>
#include <cstdio>
// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace shardkit::decode {

ImageFormat Sniff(const uint8_t* d, size_t n) {
  const std::string ext = paths::SniffImageExt(d, n);
  if (ext == "jpg") return ImageFormat::kJpeg;
  if (ext == "png") return ImageFormat::kPng;
  if (ext == "webp") return ImageFormat::kWebp;
  if (ext == "avif") return ImageFormat::kAvif;
  if (ext == "jxl") return ImageFormat::kJxl;
  return ImageFormat::kUnknown;
}

const char* FormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kAvif: return "AVIF";
    case ImageFormat::kJxl: return "JPEG XL";
    case ImageFormat::kPixels: return "pixels";
    default: return "unknown";
  }
}

Status CheckDimensions(const Limits& limits, uint64_t w, uint64_t h) {
  if (w == 0 || h == 0) return Status::Corrupt(fmt::format("image has zero size {}x{}", w, h));
  if (w > uint64_t(limits.max_side) || h > uint64_t(limits.max_side) || w * h > limits.max_pixels)
    return Status::Corrupt(fmt::format("image declares {}x{} pixels, over the limit ({} per side, {} in all)", w, h,
                                       limits.max_side, limits.max_pixels));
  return Status::OK();
}

namespace {

struct ErrorMgr {
  jpeg_error_mgr pub;
  jpeg_progress_mgr progress;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
  int max_scans = 0;
  uint64_t tolerated = 0;
};

ErrorMgr* Err(j_common_ptr c) { return reinterpret_cast<ErrorMgr*>(c->err); }

[[noreturn]] void ErrorExit(j_common_ptr c) {
  ErrorMgr* e = Err(c);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings after which the decoded pixels would be wrong.
bool FatalWarning(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_TOO_MUCH_DATA:
      return true;
    default:
      return false;
  }
}

void EmitMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  ErrorMgr* e = Err(c);
  if (FatalWarning(c->err->msg_code)) {
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
  }
  ++e->tolerated;
}

void OutputMessage(j_common_ptr) {}

void ProgressMonitor(j_common_ptr c) {
  if (!c->is_decompressor) return;
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  ErrorMgr* e = Err(c);
  if (d->progressive_mode && e->max_scans > 0 && d->input_scan_number > e->max_scans) {
    std::snprintf(e->message, sizeof e->message, "progressive JPEG has more than %d scans", e->max_scans);
    std::longjmp(e->jump, 1);
  }
}

int Floor(double v) { return int(std::floor(v + 1e-9)); }
int Ceil(double v) { return int(std::ceil(v - 1e-9)); }

// Clamps a box to the image and to at least one pixel.
CropBox ClampBox(CropBox b, int w, int h) {
  b.x = std::clamp(b.x, 0.0, double(w - 1));
  b.y = std::clamp(b.y, 0.0, double(h - 1));
  b.w = std::clamp(b.w, 1e-6, double(w) - b.x);
  b.h = std::clamp(b.h, 1e-6, double(h) - b.y);
  return b;
}

}  // namespace

struct ImageDecoder::Impl {
  Limits limits;
  DecodeSettings settings;
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  std::vector<uint8_t> buf;    // decoded pixels (3 or 4 channels)
  std::vector<JSAMPROW> rows;

  explicit Impl(Limits l, DecodeSettings s) : limits(l), settings(s) {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = ErrorExit;
    err.pub.emit_message = EmitMessage;
    err.pub.output_message = OutputMessage;
    err.progress.progress_monitor = ProgressMonitor;
    err.max_scans = l.max_scans;
    // libjpeg reports a failure to start (its version or struct size differs from the
    // jpeglib.h / jconfig.h this was compiled with: a build that mixed one libjpeg's
    // headers with another's library) through error_exit, so the jump must be set here too.
    if (setjmp(err.jump)) {
      start_error = err.message;
      return;
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &err.progress;
    created = true;
  }
  ~Impl() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  bool created = false;
  std::string start_error;  // libjpeg's message when it refused to start

  Status CheckSize(uint64_t w, uint64_t h) const { return CheckDimensions(limits, w, h); }

  // Only PODs live in this frame across setjmp; buffers are members.
  Status DecodeJpeg(const uint8_t* data, size_t size,
                    const std::function<CropBox(const ImageInfo&)>& choose, double min_w, double min_h,
                    Region* out, ImageInfo* info) {
    if (!created)
      return Status::Internal(fmt::format("libjpeg did not start: {} (shardkit was built with the headers of "
                                          "another libjpeg than the one it runs with)",
                                          start_error));
    if (setjmp(err.jump)) {
      jpeg_abort_decompress(&cinfo);
      return Status::Corrupt(fmt::format("JPEG: {}", err.message));
    }
    cinfo.mem->max_memory_to_use = long(limits.max_memory);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    {
      Status st = CheckSize(cinfo.image_width, cinfo.image_height);
      if (!st.ok()) {
        jpeg_abort_decompress(&cinfo);
        return st;
      }
    }
    info->format = ImageFormat::kJpeg;
    info->width = int(cinfo.image_width);
    info->height = int(cinfo.image_height);
    info->components = cinfo.num_components;
    info->progressive = cinfo.progressive_mode;
    info->cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    if (!info->cmyk && cinfo.num_components != 1 && cinfo.num_components != 3) {
      jpeg_abort_decompress(&cinfo);
      return Status::Corrupt(fmt::format("JPEG with {} components is not supported", cinfo.num_components));
    }
    CropBox box = ClampBox(choose(*info), info->width, info->height);
    const int num = min_w > 0 && min_h > 0 ? SimdDctScale(box.w, box.h, min_w, min_h) : 8;
    cinfo.scale_num = unsigned(num);
    cinfo.scale_denom = 8;
    cinfo.out_color_space = info->cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.dct_method = settings.fast_idct ? JDCT_IFAST : JDCT_ISLOW;
    cinfo.do_fancy_upsampling = settings.fancy_upsampling ? TRUE : FALSE;
    jpeg_start_decompress(&cinfo);
    const int comps = cinfo.out_color_components;
    const double s = double(cinfo.output_width) / cinfo.image_width;
    CropBox sb{box.x * s, box.y * s, box.w * s, box.h * s};
    int x0 = std::max(0, Floor(sb.x)), x1 = std::min(int(cinfo.output_width), std::max(x0 + 1, Ceil(sb.x + sb.w)));
    int y0 = std::max(0, Floor(sb.y)), y1 = std::min(int(cinfo.output_height), std::max(y0 + 1, Ceil(sb.y + sb.h)));
    // Two extra columns each side: fancy (triangle) chroma upsampling of a column reads
    // its neighbours, and libjpeg treats the edges of a cropped region as image edges.
    const int mx0 = std::max(0, x0 - 2), mx1 = std::min(int(cinfo.output_width), x1 + 2);
    JDIMENSION xoff = JDIMENSION(mx0), cw = JDIMENSION(mx1 - mx0);
    if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
    const int height = y1 - y0;
    const size_t stride = size_t(cinfo.output_width) * comps;  // output_width is now the cropped width
    buf.resize(stride * height);
    rows.resize(height);
    for (int r = 0; r < height; ++r) rows[r] = buf.data() + stride * r;
    if (y0 > 0) jpeg_skip_scanlines(&cinfo, JDIMENSION(y0));
    int done = 0;
    while (done < height) {
      JDIMENSION got = jpeg_read_scanlines(&cinfo, rows.data() + done, JDIMENSION(height - done));
      if (got == 0) break;
      done += int(got);
    }
    if (done < height) {
      jpeg_abort_decompress(&cinfo);
      return Status::Corrupt("JPEG: fewer scanlines than declared");
    }
    const int width = int(cinfo.output_width);
    jpeg_abort_decompress(&cinfo);  // the rows below the box are never decoded
    if (comps == 4) {  // CMYK -> RGB in place
      const bool inverted = cinfo.saw_Adobe_marker;
      for (int r = 0; r < height; ++r) {
        uint8_t* p = buf.data() + stride * r;
        uint8_t* q = buf.data() + size_t(width) * 3 * r;
        for (int x = 0; x < width; ++x, p += 4, q += 3) {
          int c = p[0], m = p[1], y = p[2], k = p[3];
          if (!inverted) { c = 255 - c; m = 255 - m; y = 255 - y; k = 255 - k; }
          // Inverted (Adobe) values are 255 - ink: R = (255 - C_ink)(255 - K_ink)/255.
          q[0] = uint8_t((c * k + 127) / 255);
          q[1] = uint8_t((m * k + 127) / 255);
          q[2] = uint8_t((y * k + 127) / 255);
        }
      }
    }
    out->pixels = buf.data();
    out->width = width;
    out->height = height;
    out->stride = size_t(width) * 3;
    out->box = {sb.x - double(xoff), sb.y - double(y0), sb.w, sb.h};
    out->scale_num = num;
    return Status::OK();
  }

  Status DecodePng(const uint8_t* data, size_t size,
                   const std::function<CropBox(const ImageInfo&)>& choose, Region* out,
                   ImageInfo* info) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, data, size))
      return Status::Corrupt(fmt::format("PNG: {}", img.message));
    Status st = CheckSize(img.width, img.height);
    if (!st.ok()) {
      png_image_free(&img);
      return st;
    }
    info->format = ImageFormat::kPng;
    info->width = int(img.width);
    info->height = int(img.height);
    info->components = int(PNG_IMAGE_SAMPLE_CHANNELS(img.format));
    info->bit_depth = PNG_IMAGE_SAMPLE_COMPONENT_SIZE(img.format) == 2 ? 16 : 8;
    CropBox box = ClampBox(choose(*info), info->width, info->height);
    // 16-bit samples are taken as sRGB-encoded (the simplified API would otherwise
    // assume linear light without a gAMA chunk and gamma-encode them): each becomes the
    // nearest 8-bit value, v * 255 / 65535 rounded, as other readers give.
    img.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
    // With alpha (an alpha channel or tRNS), RGBA is read and the alpha dropped here: the
    // simplified API would composite onto the buffer's previous contents instead.
    const bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    img.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    buf.resize(PNG_IMAGE_SIZE(img));
    if (!png_image_finish_read(&img, nullptr, buf.data(), 0, nullptr)) {
      std::string m = img.message;
      png_image_free(&img);
      return Status::Corrupt(fmt::format("PNG: {}", m));
    }
    if (img.warning_or_error & PNG_IMAGE_ERROR) return Status::Corrupt(fmt::format("PNG: {}", img.message));
    if (alpha) {
      const size_t n = size_t(img.width) * img.height;
      uint8_t* p = buf.data();
      for (size_t i = 0; i < n; ++i) std::memmove(p + 3 * i, p + 4 * i, 3);
    }
    out->pixels = buf.data();
    out->width = info->width;
    out->height = info->height;
    out->stride = size_t(info->width) * 3;
    out->box = box;
    out->scale_num = 8;
    return Status::OK();
  }

  // WebP, AVIF, JPEG XL (decode/codecs.h): decoded whole into `buf`, the box a view.
  Status DecodeWhole(ImageFormat f, const uint8_t* data, size_t size,
                     const std::function<CropBox(const ImageInfo&)>& choose, Region* out, ImageInfo* info) {
    Status st = f == ImageFormat::kWebp   ? DecodeWebp(data, size, limits, &buf, info)
                : f == ImageFormat::kAvif ? DecodeAvif(data, size, limits, &buf, info)
                                          : DecodeJxl(data, size, limits, &buf, info);
    if (!st.ok()) return st;
    out->pixels = buf.data();
    out->width = info->width;
    out->height = info->height;
    out->stride = size_t(info->width) * 3;
    out->box = ClampBox(choose(*info), info->width, info->height);
    out->scale_num = 8;
    return Status::OK();
  }
};

int SimdDctScale(double w, double h, double min_w, double min_h) {
  int num = 8;
  while (num > 1 && w * (num / 2) / 8.0 >= min_w && h * (num / 2) / 8.0 >= min_h) num /= 2;
  return num;
}

ImageDecoder::ImageDecoder(Limits limits, DecodeSettings settings)
    : impl_(std::make_unique<Impl>(limits, settings)) {}

const DecodeSettings& ImageDecoder::settings() const { return impl_->settings; }
ImageDecoder::~ImageDecoder() = default;

Status ImageDecoder::FromPixels(const uint8_t* pixels, int width, int height, int channels, size_t stride, bool bgr,
                                const std::function<CropBox(const ImageInfo&)>& choose, Region* out,
                                ImageInfo* info_out) {
  if (channels != 1 && channels != 3)
    return Status::Invalid(fmt::format("decoded image has {} channels (1 or 3 can be fed)", channels));
  if (width <= 0 || height <= 0) return Status::Corrupt(fmt::format("image has zero size {}x{}", width, height));
  SK_RETURN_IF_ERROR(impl_->CheckSize(uint64_t(width), uint64_t(height)));
  if (stride < size_t(width) * size_t(channels)) return Status::Invalid("decoded image rows overlap (stride too small)");
  ImageInfo info;
  info.format = ImageFormat::kPixels;
  info.width = width;
  info.height = height;
  info.components = channels;
  const CropBox box = ClampBox(choose(info), width, height);
  out->width = width;
  out->height = height;
  out->box = box;
  out->scale_num = 8;
  if (channels == 3 && !bgr) {
    out->pixels = pixels;
    out->stride = stride;
  } else {
    std::vector<uint8_t>& buf = impl_->buf;
    const size_t row = size_t(width) * 3;
    buf.resize(row * size_t(height));
    for (int y = 0; y < height; ++y) {
      const uint8_t* src = pixels + stride * size_t(y);
      uint8_t* dst = buf.data() + row * size_t(y);
      if (channels == 1) {
        for (int x = 0; x < width; ++x) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = src[x];
      } else {
        for (int x = 0; x < width; ++x) {
          dst[3 * x] = src[3 * x + 2];
          dst[3 * x + 1] = src[3 * x + 1];
          dst[3 * x + 2] = src[3 * x];
        }
      }
    }
    out->pixels = buf.data();
    out->stride = row;
  }
  if (info_out) *info_out = info;
  return Status::OK();
}

uint64_t ImageDecoder::tolerated_warnings() const { return impl_->err.tolerated; }

Status ImageDecoder::Decode(const uint8_t* data, size_t size,
                            const std::function<CropBox(const ImageInfo&)>& choose, double min_out_w,
                            double min_out_h, Region* out, ImageInfo* info_out) {
  ImageInfo info;
  Status st;
  switch (Sniff(data, size)) {
    case ImageFormat::kJpeg: st = impl_->DecodeJpeg(data, size, choose, min_out_w, min_out_h, out, &info); break;
    case ImageFormat::kPng: st = impl_->DecodePng(data, size, choose, out, &info); break;
    case ImageFormat::kWebp:
    case ImageFormat::kAvif:
    case ImageFormat::kJxl: st = impl_->DecodeWhole(Sniff(data, size), data, size, choose, out, &info); break;
    default: {
      std::string head;
      for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) head += fmt::format("{:02x}", data[i]);
      return Status::Corrupt(fmt::format("not a JPEG, PNG, WebP, AVIF or JPEG XL image (first bytes {}, {} bytes)",
                                         head.empty() ? "none" : head, size));
    }
  }
  if (info_out) *info_out = info;
  return st;
}

Status ImageDecoder::DecodeAll(const uint8_t* data, size_t size, Region* out, ImageInfo* info_out) {
  return Decode(
      data, size, [](const ImageInfo& i) { return CropBox{0, 0, double(i.width), double(i.height)}; }, 0, 0, out,
      info_out);
}

}  // namespace shardkit::decode
