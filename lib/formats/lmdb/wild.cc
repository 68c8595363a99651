// LMDB layouts in the wild (see wild.h).
#include "formats/lmdb/wild.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "core/paths.h"
#include "core/pickle.h"

namespace shardkit::formats::lmdb::wild {

std::string_view Name(Kind k) { return k == Kind::kImage ? "image" : "pickle"; }

std::optional<Kind> Parse(std::string_view name) {
  if (name == "image") return Kind::kImage;
  if (name == "pickle") return Kind::kPickle;
  return std::nullopt;
}

std::string_view SniffImage(std::string_view b) {
  auto starts = [&](std::string_view m) { return b.size() >= m.size() && b.substr(0, m.size()) == m; };
  if (starts("\xff\xd8\xff")) return "jpg";
  if (starts("\x89PNG\r\n\x1a\n")) return "png";
  if (b.size() >= 12 && starts("RIFF") && b.substr(8, 4) == "WEBP") return "webp";
  if (paths::IsAvifFileType(reinterpret_cast<const uint8_t*>(b.data()), b.size())) return "avif";
  if (starts("\xff\x0a") || starts(std::string_view("\0\0\0\x0cJXL \r\n\x87\n", 12))) return "jxl";
  if (starts("BM") && b.size() >= 26) return "bmp";
  if (starts("GIF87a") || starts("GIF89a")) return "gif";
  if (starts(std::string_view("II*\0", 4)) || starts(std::string_view("MM\0*", 4))) return "tiff";
  return {};
}

std::optional<Kind> Detect(std::string_view value) {
  if (!SniffImage(value).empty()) return Kind::kImage;
  if (pickle::LooksLikePickle(value)) return Kind::kPickle;
  return std::nullopt;
}

bool IsSideEntry(std::string_view k) { return k.size() >= 4 && k.substr(0, 2) == "__" && k.substr(k.size() - 2) == "__"; }

namespace {

bool IsDecimal(std::string_view s) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "a/b/x.JPEG" -> parent "b"; "x.jpg" -> "".
std::string_view Parent(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return {};
  std::string_view dir = path.substr(0, slash);
  size_t s2 = dir.rfind('/');
  return s2 == std::string_view::npos ? dir : dir.substr(s2 + 1);
}

// The extension of the last path component (without the dot), or "".
std::string_view Extension(std::string_view path) {
  size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash) || dot + 1 == path.size())
    return {};
  return path.substr(dot + 1);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

}  // namespace

Catalog MakeCatalog(Kind kind, std::vector<std::string> keys) {
  Catalog c;
  c.kind = kind;
  c.numeric_keys = !keys.empty() && std::all_of(keys.begin(), keys.end(), [](const std::string& k) { return IsDecimal(k); });
  if (c.numeric_keys) {
    std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
      return std::stoull(a) < std::stoull(b);
    });
  }
  if (kind == Kind::kImage && !c.numeric_keys) {
    std::set<std::string> classes;
    bool all = true;
    for (const auto& k : keys) {
      std::string_view p = Parent(k);
      if (p.empty()) all = false;
      else classes.emplace(p);
    }
    if (all) c.class_names.assign(classes.begin(), classes.end());
  }
  c.keys = std::move(keys);
  return c;
}

Status CheckLen(std::string_view lkey, const Bytes& value, uint64_t samples, const std::string& where) {
  Location loc{.file = where, .key = std::string(lkey)};
  int64_t n = -1;
  if (pickle::LooksLikePickle(value.view())) {
    auto v = pickle::ParsePickle(value);
    if (!v.ok())
      return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': {}", lkey, where, v.status().message()), loc);
    if (v->kind == pickle::Value::Kind::kInt) n = v->i;
  } else if (IsDecimal(value.view())) {
    n = int64_t(std::stoull(value.str()));
  }
  if (n < 0)
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' is not a pickled int or decimal text", lkey, where), loc);
  if (uint64_t(n) != samples)
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' says {} samples, the LMDB holds {}", lkey, where, n, samples),
                           loc);
  return Status::OK();
}

Result<bool> SplitLayout(const std::vector<std::string>& keys, const std::map<std::string, Bytes>& counts,
                         const std::string& where, std::vector<std::string>* images,
                         std::vector<std::string>* labels) {
  auto digits = [](std::string_view k, std::string_view prefix) {
    return k.size() > prefix.size() && k.substr(0, prefix.size()) == prefix && IsDecimal(k.substr(prefix.size()));
  };
  // The label keys' prefix, then the image keys' (the first that any key has).
  std::string_view label_prefix, image_prefix;
  bool any_image_dash = false, any_image_under = false, any_bare = false;
  for (const auto& k : keys) {
    if (label_prefix.empty() && digits(k, "label-")) label_prefix = "label-";
    if (label_prefix.empty() && digits(k, "label_")) label_prefix = "label_";
    any_image_dash |= digits(k, "image-");
    any_image_under |= digits(k, "image_");
    any_bare |= IsDecimal(k);
  }
  const bool crnn_count = counts.count("num-samples") && any_image_dash;
  if (label_prefix.empty() && !crnn_count) return false;
  if (label_prefix.empty()) label_prefix = "label-";  // CRNN's, for the errors below
  if (any_image_dash) image_prefix = "image-";
  else if (any_image_under) image_prefix = "image_";
  else if (!any_bare) return false;  // labels without images of any known form: not a split layout
  std::set<std::string_view> image_ids, label_ids;
  for (const auto& k : keys) {
    std::string_view v = k;
    if (counts.count(k)) continue;
    if (digits(v, image_prefix) || (image_prefix.empty() && IsDecimal(v))) image_ids.insert(v.substr(image_prefix.size()));
    else if (digits(v, label_prefix)) label_ids.insert(v.substr(label_prefix.size()));
    else
      return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' is not part of the split layout its other keys have "
                                         "(images under '{}N', labels under '{}N')",
                                         k, where, image_prefix, label_prefix),
                             Location{.file = where, .key = k});
  }
  auto key = [](std::string_view prefix, std::string_view id) { return std::string(prefix) + std::string(id); };
  for (auto id : image_ids)
    if (!label_ids.count(id))
      return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' has no '{}'", key(image_prefix, id), where,
                                         key(label_prefix, id)),
                             Location{.file = where, .key = key(image_prefix, id)});
  for (auto id : label_ids)
    if (!image_ids.count(id))
      return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' has no '{}'", key(label_prefix, id), where,
                                         key(image_prefix, id)),
                             Location{.file = where, .key = key(label_prefix, id)});
  for (const auto& [ckey, value] : counts) SK_RETURN_IF_ERROR(CheckLen(ckey, value, image_ids.size(), where));
  std::vector<std::string_view> ids(image_ids.begin(), image_ids.end());
  std::stable_sort(ids.begin(), ids.end(), [](std::string_view a, std::string_view b) {
    // Numeric order without overflow: fewer significant digits first, then by text.
    auto strip = [](std::string_view d) {
      size_t i = d.find_first_not_of('0');
      return i == std::string_view::npos ? std::string_view() : d.substr(i);
    };
    auto x = strip(a), y = strip(b);
    return x.size() != y.size() ? x.size() < y.size() : x < y;
  });
  images->clear();
  labels->clear();
  for (auto id : ids) {
    images->push_back(key(image_prefix, id));
    labels->push_back(key(label_prefix, id));
  }
  return true;
}

bool IsGrayArray(std::string_view value) {
  // (A view without an owner: the result lives only in this function.)
  auto v = pickle::ParsePickle(Bytes(nullptr, reinterpret_cast<const uint8_t*>(value.data()), value.size()));
  if (!v.ok()) return false;
  using VK = pickle::Value::Kind;
  const pickle::Value* img = &*v;
  if ((v->kind == VK::kTuple || v->kind == VK::kList) && !v->items.empty()) img = &v->items[0];
  if (img->kind != VK::kArray) return false;
  const auto& shape = img->array.shape;
  return shape.size() == 2 || (shape.size() == 3 && shape[2] == 1);
}

Status Decode(const Catalog& cat, std::string_view lkey, const Bytes& value, uint64_t index, const std::string& where,
              Sample* out) {
  out->clear();
  Location loc{.file = where, .key = std::string(lkey), .index = int64_t(index)};
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' ({} layout): {}", lkey, where, Name(cat.kind), why), loc);
  };
  if (cat.kind == Kind::kImage) {
    std::string_view sniffed = SniffImage(value.view());
    if (sniffed.empty()) return bad("value is not an image file (no JPEG/PNG/WebP/BMP/GIF/TIFF signature)");
    std::string_view ext = cat.numeric_keys ? std::string_view() : Extension(lkey);
    std::string lext = Lower(ext);
    if (!ext.empty() && IsImageExt(lext)) {
      out->key.assign(lkey.substr(0, lkey.size() - ext.size() - 1));
      Field f{.ext = lext, .data = value, .source_ext = lext == ext ? std::string() : std::string(ext)};
      out->fields.push_back(std::move(f));
    } else {
      out->key.assign(lkey);
      out->set(std::string(sniffed), value);
    }
    if (out->key.empty()) return bad("empty sample key");
    if (!cat.class_names.empty()) {
      std::string_view p = Parent(lkey);
      auto it = std::lower_bound(cat.class_names.begin(), cat.class_names.end(), p);
      if (it == cat.class_names.end() || *it != p) return bad("parent folder is not a known class");
      out->set_label(int64_t(it - cat.class_names.begin()));
    }
    return Status::OK();
  }
  auto v = pickle::ParsePickle(value);
  if (!v.ok()) return Status(v.status().code(), fmt::format("LMDB key '{}' in '{}': {}", lkey, where, v.status().message()), loc);
  using VK = pickle::Value::Kind;
  const pickle::Value* img = nullptr;
  const pickle::Value* label = nullptr;
  if ((v->kind == VK::kTuple || v->kind == VK::kList) && !v->items.empty() && v->items.size() <= 2) {
    img = &v->items[0];
    if (v->items.size() == 2) label = &v->items[1];
  } else if (v->kind == VK::kArray || v->kind == VK::kBytes) {
    img = &*v;
  } else {
    return bad(fmt::format("value is a pickled {}, not (image, label)", v->type_name()));
  }
  out->key.assign(lkey);
  if (img->kind == VK::kArray) {
    if (img->array.shape.empty()) return bad("the image is a numpy scalar");
    Bytes npy = pickle::ToNpy(img->array);
    const auto& a = img->array;
    if (cat.gray && a.shape.size() == 3 && (a.shape[2] == 3 || a.shape[2] == 4))
      return bad(fmt::format("a {}-channel array in an LMDB whose first array is 2-D (grayscale, no channel order): "
                             "its channel order is unknown; say it with --source-option lmdb.channels=bgr (as "
                             "cv2.imread gives) or lmdb.channels=rgb",
                             a.shape[2]));
    if (cat.channels == "bgr-to-rgb" && pickle::HasColorChannels(a)) {
      if (a.fortran_order) return bad("bgr-to-rgb of a Fortran-order array");
      // ToNpy made an owned copy: swap in place (the uint8 x 3 loop vectorises; the generic
      // one made the loader 2.5x slower than from JPEG).
      pickle::SwapRedBlue(a, const_cast<uint8_t*>(npy.data()) + (npy.size() - a.data.size()));
    }
    out->set("npy", std::move(npy));
  } else if (img->kind == VK::kBytes) {
    std::string_view sniffed = SniffImage(img->bytes.view());
    if (sniffed.empty()) return bad("the image bytes are not an image file (no JPEG/PNG/WebP/BMP/GIF/TIFF signature)");
    out->set(std::string(sniffed), img->bytes);
  } else {
    return bad(fmt::format("the image is a {}, not a numpy array or bytes", img->type_name()));
  }
  if (label) {
    if (label->kind == VK::kInt) {
      out->set_label(label->i);
    } else if (label->kind == VK::kArray && label->array.shape.empty() &&
               (label->array.dtype.kind == 'i' || label->array.dtype.kind == 'u') && label->array.dtype.order != '>') {
      const auto& a = label->array;
      uint64_t u = 0;
      std::memcpy(&u, a.data.data(), a.dtype.itemsize);
      int64_t x = int64_t(u);
      if (a.dtype.kind == 'i' && a.dtype.itemsize < 8 && (u >> (8 * a.dtype.itemsize - 1)) & 1)
        x = int64_t(u | (~uint64_t(0) << (8 * a.dtype.itemsize)));
      out->set_label(x);
    } else if (label->kind != VK::kNone) {
      return bad(fmt::format("the label is a {}, not an int", label->type_name()));
    }
  }
  return Status::OK();
}

namespace {

// Pickle opcodes (Python's Lib/pickle.py names).
void Unicode(std::string* o, std::string_view s) {
  o->push_back('\x8c');  // SHORT_BINUNICODE (names below are short)
  o->push_back(char(s.size()));
  o->append(s);
}
void Int(std::string* o, int64_t v) {
  if (v >= 0 && v < 256) {
    o->push_back('K');  // BININT1
    o->push_back(char(v));
  } else if (v >= 0 && v < 65536) {
    o->push_back('M');  // BININT2
    o->push_back(char(v & 0xff));
    o->push_back(char(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    o->push_back('J');  // BININT, 4 bytes little endian
    uint32_t u = uint32_t(int32_t(v));
    for (int k = 0; k < 4; ++k) o->push_back(char((u >> (8 * k)) & 0xff));
  } else {
    o->push_back('\x8a');  // LONG1: 8 bytes two's complement little endian
    o->push_back('\x08');
    uint64_t u = uint64_t(v);
    for (int k = 0; k < 8; ++k) o->push_back(char((u >> (8 * k)) & 0xff));
  }
}
void BytesOp(std::string* o, const uint8_t* p, uint64_t n) {
  if (n < 256) {
    o->push_back('C');  // SHORT_BINBYTES
    o->push_back(char(n));
  } else if (n <= 0xffffffffull) {
    o->push_back('B');  // BINBYTES
    for (int k = 0; k < 4; ++k) o->push_back(char((n >> (8 * k)) & 0xff));
  } else {
    o->push_back('\x8e');  // BINBYTES8
    for (int k = 0; k < 8; ++k) o->push_back(char((n >> (8 * k)) & 0xff));
  }
  if (n) o->append(reinterpret_cast<const char*>(p), size_t(n));
}

}  // namespace

std::string PickleArray(const pickle::NdArray& arr, std::optional<int64_t> label) {
  std::string o;
  o.reserve(arr.data.size() + 256);
  o += "\x80\x04";  // PROTO 4
  o.push_back('(');  // MARK: the (array, label) tuple
  // numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')
  Unicode(&o, "numpy.core.multiarray");
  Unicode(&o, "_reconstruct");
  o.push_back('\x93');  // STACK_GLOBAL
  Unicode(&o, "numpy");
  Unicode(&o, "ndarray");
  o.push_back('\x93');
  Int(&o, 0);
  o.push_back('\x85');  // TUPLE1
  BytesOp(&o, reinterpret_cast<const uint8_t*>("b"), 1);
  o.push_back('\x87');  // TUPLE3
  o.push_back('R');     // REDUCE
  // BUILD state: (1, shape, dtype, is_fortran, raw bytes)
  o.push_back('(');
  Int(&o, 1);
  o.push_back('(');
  for (uint64_t d : arr.shape) Int(&o, int64_t(d));
  o.push_back('t');  // TUPLE
  // numpy.dtype('u1', False, True) with BUILD state (3, '|', None, None, None, -1, -1, 0)
  Unicode(&o, "numpy");
  Unicode(&o, "dtype");
  o.push_back('\x93');
  std::string descr = arr.dtype.descr();  // "|u1", "<f4"
  Unicode(&o, descr.substr(1));
  o.push_back('\x89');  // NEWFALSE
  o.push_back('\x88');  // NEWTRUE
  o.push_back('\x87');
  o.push_back('R');
  o.push_back('(');
  Int(&o, 3);
  Unicode(&o, descr.substr(0, 1));
  o += "NNN";
  Int(&o, -1);
  Int(&o, -1);
  Int(&o, 0);
  o.push_back('t');
  o.push_back('b');  // BUILD (the dtype)
  o.push_back(arr.fortran_order ? '\x88' : '\x89');
  BytesOp(&o, arr.data.data(), arr.data.size());
  o.push_back('t');
  o.push_back('b');  // BUILD (the array)
  if (label) Int(&o, *label);
  else o.push_back('N');
  o.push_back('t');  // TUPLE
  o.push_back('.');  // STOP
  return o;
}

}  // namespace shardkit::formats::lmdb::wild
