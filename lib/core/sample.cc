#include "shardkit/sample.h"

#include <algorithm>
#include <charconv>

#include <xxhash.h>

namespace shardkit {

Bytes Bytes::Copy(const void* data, size_t size) {
  if (size == 0) return Bytes();
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[size]);
  std::memcpy(buf.get(), data, size);
  const uint8_t* p = buf.get();
  return Bytes(std::shared_ptr<const void>(buf, p), p, size);
}

Bytes Bytes::Take(std::string s) {
  auto owner = std::make_shared<std::string>(std::move(s));
  const auto* p = reinterpret_cast<const uint8_t*>(owner->data());
  size_t n = owner->size();
  return Bytes(std::shared_ptr<const void>(owner, p), p, n);
}

Bytes Bytes::Take(std::vector<uint8_t> v) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(v));
  const uint8_t* p = owner->data();
  size_t n = owner->size();
  return Bytes(std::shared_ptr<const void>(owner, p), p, n);
}

namespace {
auto LowerBound(const std::vector<Field>& f, std::string_view ext) {
  return std::lower_bound(f.begin(), f.end(), ext,
                          [](const Field& a, std::string_view e) { return a.ext < e; });
}
}  // namespace

const Field* Sample::find(std::string_view ext) const {
  auto it = LowerBound(fields, ext);
  return (it != fields.end() && it->ext == ext) ? &*it : nullptr;
}

void Sample::set(std::string ext, Bytes data) {
  auto it = LowerBound(fields, ext);
  if (it != fields.end() && it->ext == ext) {
    fields[it - fields.begin()].data = std::move(data);
    fields[it - fields.begin()].source_ext.clear();
  } else {
    fields.insert(fields.begin() + (it - fields.begin()), Field{std::move(ext), std::move(data)});
  }
}

void Sample::erase(std::string_view ext) {
  auto it = LowerBound(fields, ext);
  if (it != fields.end() && it->ext == ext) fields.erase(fields.begin() + (it - fields.begin()));
}

std::optional<int64_t> Sample::label() const {
  const Field* f = find("cls");
  if (!f) return std::nullopt;
  std::string_view v = f->data.view();
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\r')) v.remove_suffix(1);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty()) return std::nullopt;
  return out;
}

void Sample::set_label(int64_t label) { set("cls", Bytes::Take(std::to_string(label))); }

bool IsImageExt(std::string_view ext) {
  static const char* kExts[] = {"jpg", "jpeg", "png", "webp", "avif", "jxl", "bmp", "ppm", "pgm", "tif", "tiff", "gif"};
  for (const char* e : kExts)
    if (ext == e) return true;
  return false;
}

const Field* Sample::image() const {
  for (const auto& f : fields)
    if (IsImageExt(f.ext)) return &f;
  return nullptr;
}

uint64_t Sample::bytes() const {
  uint64_t n = 0;
  for (const auto& f : fields) n += f.data.size();
  return n;
}

uint64_t Sample::checksum() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& f : fields) {
    XXH3_64bits_update(st, f.ext.data(), f.ext.size() + 1);  // include the NUL as separator
    uint64_t n = f.data.size();
    XXH3_64bits_update(st, &n, sizeof n);
    if (n) XXH3_64bits_update(st, f.data.data(), n);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace shardkit
