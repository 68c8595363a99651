// Encoding decoded arrays as PNG / JPEG (see encode.h).
#include "decode/encode.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "core/pickle.h"

namespace shardkit::decode {

Result<EncodeSpec> ParseEncodeSpec(std::string_view s) {
  EncodeSpec e;
  if (s == "png") return e;
  if (s.rfind("jpeg:", 0) == 0 || s.rfind("jpg:", 0) == 0) {
    std::string_view q = s.substr(s.find(':') + 1);
    int v = 0;
    bool ok = !q.empty() && q.size() <= 3;
    for (char c : q) {
      if (c < '0' || c > '9') ok = false;
      else v = v * 10 + (c - '0');
    }
    if (ok && v >= 1 && v <= 100) {
      e.png = false;
      e.quality = v;
      return e;
    }
  }
  return Status::Invalid(fmt::format("--encode '{}': expected png or jpeg:Q with Q in 1..100", s));
}

Result<Bytes> EncodeNpy(const Bytes& npy, const EncodeSpec& spec) {
  SK_ASSIGN_OR_RETURN(pickle::NdArray a, pickle::ParseNpy(npy));
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
  if (spec.png) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = png_uint_32(w);
    img.height = png_uint_32(h);
    img.format = c == 1 ? PNG_FORMAT_GRAY : c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
    png_alloc_size_t size = 0;
    if (!png_image_write_to_memory(&img, nullptr, &size, 0, a.data.data(), 0, nullptr))
      return Status::Internal(fmt::format("libpng: {}", img.message));
    std::string out(size, '\0');
    if (!png_image_write_to_memory(&img, out.data(), &size, 0, a.data.data(), 0, nullptr))
      return Status::Internal(fmt::format("libpng: {}", img.message));
    out.resize(size);
    return Bytes::Take(std::move(out));
  }
  if (c == 4) return Status::Unsupported("JPEG has no alpha channel: encode [H, W, 4] arrays as png");
  tjhandle tj = tjInitCompress();
  if (!tj) return Status::Internal("tjInitCompress failed");
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  int rc = tjCompress2(tj, a.data.data(), int(w), 0, int(h), c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len,
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
