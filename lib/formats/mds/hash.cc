// The hash algorithms streaming records in index.json, as its get_hash()
// hexdigest()s them: xxhash's xxh32/xxh64/xxh3_64/xxh3_128 (= xxh128) in
// canonical (big-endian) hex, and hashlib's md5 and sha1.
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/md5.h"
#include "formats/mds/mds.h"

namespace shardkit::formats::mds {

namespace {

// SHA-1 (FIPS 180-4, section 6.1).
std::string Sha1Hex(const uint8_t* p, size_t n) {
  uint32_t h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  auto rol = [](uint32_t x, int s) { return (x << s) | (x >> (32 - s)); };
  auto block = [&](const uint8_t* b) {
    uint32_t w[80];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(b[4 * t]) << 24 | uint32_t(b[4 * t + 1]) << 16 | uint32_t(b[4 * t + 2]) << 8 | b[4 * t + 3];
    for (int t = 16; t < 80; ++t) w[t] = rol(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; ++t) {
      uint32_t f, k;
      if (t < 20) f = (bb & c) | (~bb & d), k = 0x5A827999u;
      else if (t < 40) f = bb ^ c ^ d, k = 0x6ED9EBA1u;
      else if (t < 60) f = (bb & c) | (bb & d) | (c & d), k = 0x8F1BBCDCu;
      else f = bb ^ c ^ d, k = 0xCA62C1D6u;
      uint32_t tmp = rol(a, 5) + f + e + k + w[t];
      e = d, d = c, c = rol(bb, 30), bb = a, a = tmp;
    }
    h[0] += a, h[1] += bb, h[2] += c, h[3] += d, h[4] += e;
  };
  size_t full = n / 64;
  for (size_t i = 0; i < full; ++i) block(p + 64 * i);
  uint8_t tail[128] = {};
  size_t rest = n - 64 * full;
  if (rest) std::memcpy(tail, p + 64 * full, rest);
  tail[rest] = 0x80;
  size_t len = rest + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = uint64_t(n) * 8;
  for (int i = 0; i < 8; ++i) tail[len - 1 - i] = uint8_t(bits >> (8 * i));
  block(tail);
  if (len == 128) block(tail + 64);
  return fmt::format("{:08x}{:08x}{:08x}{:08x}{:08x}", h[0], h[1], h[2], h[3], h[4]);
}

}  // namespace

bool KnownHash(std::string_view a) {
  return a == "xxh32" || a == "xxh64" || a == "xxh3_64" || a == "xxh3_128" || a == "xxh128" || a == "md5" ||
         a == "sha1";
}

Result<std::string> HashHex(std::string_view a, const void* data, size_t size) {
  if (a == "xxh32") return fmt::format("{:08x}", XXH32(data, size, 0));
  if (a == "xxh64") return fmt::format("{:016x}", XXH64(data, size, 0));
  if (a == "xxh3_64") return fmt::format("{:016x}", XXH3_64bits(data, size));
  if (a == "xxh3_128" || a == "xxh128") {
    XXH128_hash_t h = XXH3_128bits(data, size);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
  }
  if (a == "md5") {
    md5::Md5 m;
    m.Update(data, size);
    return m.HexDigest();
  }
  if (a == "sha1") return Sha1Hex(static_cast<const uint8_t*>(data), size);
  return Status::Unsupported(fmt::format("hash algorithm '{}' is not computed by shardkit (known: md5, sha1, xxh32, "
                                         "xxh64, xxh3_64, xxh3_128, xxh128)",
                                         a));
}

}  // namespace shardkit::formats::mds
