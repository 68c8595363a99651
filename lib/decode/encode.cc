// Encoding pixels as PNG / JPEG / WebP (see encode.h).
#include "decode/encode.h"

#include <png.h>
#include <turbojpeg.h>
#ifdef SHARDKIT_HAVE_WEBP
#include <webp/encode.h>
#endif

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/pickle.h"

namespace shardkit::decode {

namespace {

// "Q" in 1..100, or nullopt.
std::optional<int> ParseQuality(std::string_view q) {
  int v = 0;
  if (q.empty() || q.size() > 3) return std::nullopt;
  for (char c : q) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v < 1 || v > 100) return std::nullopt;
  return v;
}

}  // namespace

std::string EncodeSpec::ToString() const {
  return png ? "png" : fmt::format("{}:{}", webp ? "webp" : "jpeg", quality);
}

Result<EncodeSpec> ParseEncodeSpec(std::string_view s) {
  EncodeSpec e;
  if (s == "png") return e;
  const size_t colon = s.find(':');
  const std::string_view codec = s.substr(0, colon);
  if (codec == "jpeg" || codec == "jpg" || codec == "webp") {
    std::optional<int> q = colon == std::string_view::npos ? std::optional<int>(90) : ParseQuality(s.substr(colon + 1));
    if (q) {
      e.png = false;
      e.webp = codec == "webp";
      e.quality = *q;
#ifndef SHARDKIT_HAVE_WEBP
      if (e.webp)
        return Status::Unsupported(fmt::format("--encode '{}': this build of shardkit has no WebP encoder (built "
                                               "without libwebp: SHARDKIT_WITH_WEBP=ON needs libwebp-dev)",
                                               s));
#endif
      return e;
    }
  }
  return Status::Invalid(
      fmt::format("--encode '{}': expected keep, png, jpeg[:Q] or webp[:Q] with the quality Q in 1..100", s));
}

Result<Bytes> EncodePixels(const uint8_t* pixels, int width, int height, int channels, size_t stride,
                           const EncodeSpec& spec) {
  const int w = width, h = height, c = channels;
  if (w <= 0 || h <= 0 || w > 65535 || h > 65535) return Status::Unsupported(fmt::format("cannot encode a {}x{} image", w, h));
  if (c != 1 && c != 3 && c != 4) return Status::Unsupported(fmt::format("cannot encode {} channels", c));
  if (spec.png) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = png_uint_32(w);
    img.height = png_uint_32(h);
    img.format = c == 1 ? PNG_FORMAT_GRAY : c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
    png_alloc_size_t size = 0;
    const png_int_32 row = png_int_32(stride);
    if (!png_image_write_to_memory(&img, nullptr, &size, 0, pixels, row, nullptr))
      return Status::Internal(fmt::format("libpng: {}", img.message));
    std::string out(size, '\0');
    if (!png_image_write_to_memory(&img, out.data(), &size, 0, pixels, row, nullptr))
      return Status::Internal(fmt::format("libpng: {}", img.message));
    out.resize(size);
    return Bytes::Take(std::move(out));
  }
  if (spec.webp) {
#ifdef SHARDKIT_HAVE_WEBP
    std::vector<uint8_t> rgb;
    if (c == 1) {  // libwebp takes RGB(A): gray is spread over three channels
      rgb.resize(size_t(w) * 3 * size_t(h));
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) std::memset(&rgb[(size_t(y) * w + x) * 3], pixels[stride * y + x], 3);
      pixels = rgb.data();
      stride = size_t(w) * 3;
    }
    uint8_t* out = nullptr;
    const size_t n = c == 4 ? WebPEncodeRGBA(pixels, w, h, int(stride), float(spec.quality), &out)
                            : WebPEncodeRGB(pixels, w, h, int(stride), float(spec.quality), &out);
    if (n == 0) {
      WebPFree(out);
      return Status::Internal(fmt::format("libwebp could not encode a {}x{} image", w, h));
    }
    Bytes b = Bytes::Copy(out, n);
    WebPFree(out);
    return b;
#else
    return Status::Unsupported("this build of shardkit has no WebP encoder (built without libwebp)");
#endif
  }
  if (c == 4) return Status::Unsupported("JPEG has no alpha channel: encode [H, W, 4] arrays as png or webp");
  tjhandle tj = tjInitCompress();
  if (!tj) return Status::Internal("tjInitCompress failed");
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  int rc = tjCompress2(tj, pixels, w, int(stride), h, c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len,
                       c == 1 ? TJSAMP_GRAY : TJSAMP_420, spec.quality, TJFLAG_ACCURATEDCT);
  std::string err = rc ? tjGetErrorStr2(tj) : "";
  tjDestroy(tj);
  if (rc) {
    tjFree(buf);
    return Status::Internal("libjpeg-turbo: " + err);
  }
  Bytes out = Bytes::Copy(buf, len);
  tjFree(buf);
  return out;
}

Result<NpyImage> ParseNpyImage(const Bytes& npy) {
  NpyImage img;
  SK_ASSIGN_OR_RETURN(img.array, pickle::ParseNpy(npy));
  const pickle::NdArray& a = img.array;
  if (a.dtype.kind != 'u' || a.dtype.itemsize != 1)
    return Status::Unsupported(fmt::format("cannot encode an array of dtype {} as an image (uint8 only)", a.dtype.descr()));
  if (a.fortran_order && a.shape.size() > 1) return Status::Unsupported("cannot encode a Fortran-order array");
  uint64_t h = 0, w = 0, c = 1;
  if (a.shape.size() == 2) {
    h = a.shape[0], w = a.shape[1];
  } else if (a.shape.size() == 3 && (a.shape[2] == 1 || a.shape[2] == 3 || a.shape[2] == 4)) {
    h = a.shape[0], w = a.shape[1], c = a.shape[2];
  } else {
    return Status::Unsupported("cannot encode an array that is not [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]");
  }
  if (h == 0 || w == 0 || h > 65535 || w > 65535) return Status::Unsupported(fmt::format("cannot encode a {}x{} image", w, h));
  img.width = int(w), img.height = int(h), img.channels = int(c);
  return img;
}

Result<Bytes> EncodeNpy(const Bytes& npy, const EncodeSpec& spec) {
  SK_ASSIGN_OR_RETURN(NpyImage img, ParseNpyImage(npy));
  return EncodePixels(img.pixels(), img.width, img.height, img.channels, size_t(img.width) * img.channels, spec);
}

Status EncodeSampleArrays(Sample* s, const EncodeSpec& spec) {
  const Field* f = s->find("npy");
  if (!f) return Status::OK();
  auto enc = EncodeNpy(f->data, spec);
  if (!enc.ok()) {
    Status st = std::move(enc).take_status();
    return Status(st.code(), fmt::format("sample '{}': field npy: {}", s->key, st.message()), Location{.key = s->key});
  }
  if (s->find(spec.ext())) return Status::Invalid(fmt::format("sample '{}' already has a field '{}'", s->key, spec.ext()), Location{.key = s->key});
  s->erase("npy");
  s->set(spec.ext(), std::move(*enc));
  return Status::OK();
}

}  // namespace shardkit::decode
