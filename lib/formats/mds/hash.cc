// The hash algorithms streaming records in index.json, as its get_hash()
// hexdigest()s them: xxhash's xxh32/xxh64/xxh3_64/xxh3_128 (= xxh128) in
// canonical (big-endian) hex, and hashlib's md5 and sha1.
#include <algorithm>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/md5.h"
#include "formats/mds/mds.h"

namespace shardkit::formats::mds {

namespace {

// SHA-1 (FIPS 180-4, section 6.1), incremental.
class Sha1 {
 public:
  void Update(const uint8_t* p, size_t n) {
    len_ += n;
    if (used_) {
      size_t take = std::min(n, size_t(64) - used_);
      std::memcpy(buf_ + used_, p, take);
      used_ += take, p += take, n -= take;
      if (used_ < 64) return;
      Block(buf_);
      used_ = 0;
    }
    for (; n >= 64; p += 64, n -= 64) Block(p);
    std::memcpy(buf_, p, n);
    used_ = n;
  }
  std::string Hex() {
    uint64_t bits = len_ * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = used_ < 56 ? 56 - used_ : 120 - used_;
    for (int i = 0; i < 8; ++i) pad[padlen + size_t(i)] = uint8_t(bits >> (56 - 8 * i));
    Update(pad, padlen + 8);
    return fmt::format("{:08x}{:08x}{:08x}{:08x}{:08x}", h_[0], h_[1], h_[2], h_[3], h_[4]);
  }

 private:
  static uint32_t Rol(uint32_t x, int s) { return (x << s) | (x >> (32 - s)); }
  void Block(const uint8_t* b) {
    uint32_t w[80];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(b[4 * t]) << 24 | uint32_t(b[4 * t + 1]) << 16 | uint32_t(b[4 * t + 2]) << 8 | b[4 * t + 3];
    for (int t = 16; t < 80; ++t) w[t] = Rol(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);
    uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4];
    for (int t = 0; t < 80; ++t) {
      uint32_t f, k;
      if (t < 20) f = (bb & c) | (~bb & d), k = 0x5A827999u;
      else if (t < 40) f = bb ^ c ^ d, k = 0x6ED9EBA1u;
      else if (t < 60) f = (bb & c) | (bb & d) | (c & d), k = 0x8F1BBCDCu;
      else f = bb ^ c ^ d, k = 0xCA62C1D6u;
      uint32_t tmp = Rol(a, 5) + f + e + k + w[t];
      e = d, d = c, c = Rol(bb, 30), bb = a, a = tmp;
    }
    h_[0] += a, h_[1] += bb, h_[2] += c, h_[3] += d, h_[4] += e;
  }
  uint32_t h_[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t len_ = 0;
};

}  // namespace

bool KnownHash(std::string_view a) {
  return a == "xxh32" || a == "xxh64" || a == "xxh3_64" || a == "xxh3_128" || a == "xxh128" || a == "md5" ||
         a == "sha1";
}

struct Hasher::State {
  std::string algo;
  XXH32_state_t* x32 = nullptr;
  XXH64_state_t* x64 = nullptr;
  XXH3_state_t* x3 = nullptr;
  std::unique_ptr<md5::Md5> md5;
  std::unique_ptr<Sha1> sha1;
  ~State() {
    if (x32) XXH32_freeState(x32);
    if (x64) XXH64_freeState(x64);
    if (x3) XXH3_freeState(x3);
  }
};

Hasher::Hasher(std::string_view algo) : st_(std::make_unique<State>()) {
  st_->algo = std::string(algo);
  if (algo == "xxh32") XXH32_reset(st_->x32 = XXH32_createState(), 0);
  else if (algo == "xxh64") XXH64_reset(st_->x64 = XXH64_createState(), 0);
  else if (algo == "xxh3_64") XXH3_64bits_reset(st_->x3 = XXH3_createState());
  else if (algo == "xxh3_128" || algo == "xxh128") XXH3_128bits_reset(st_->x3 = XXH3_createState());
  else if (algo == "md5") st_->md5 = std::make_unique<md5::Md5>();
  else if (algo == "sha1") st_->sha1 = std::make_unique<Sha1>();
}
Hasher::~Hasher() = default;

void Hasher::Update(const void* data, size_t size) {
  if (size == 0) return;  // an empty view's data() may be null (memcpy must not see it)
  State& s = *st_;
  if (s.x32) XXH32_update(s.x32, data, size);
  else if (s.x64) XXH64_update(s.x64, data, size);
  else if (s.x3 && s.algo == "xxh3_64") XXH3_64bits_update(s.x3, data, size);
  else if (s.x3) XXH3_128bits_update(s.x3, data, size);
  else if (s.md5) s.md5->Update(data, size);
  else if (s.sha1) s.sha1->Update(static_cast<const uint8_t*>(data), size);
}

Result<std::string> Hasher::Hex() {
  State& s = *st_;
  if (s.x32) return fmt::format("{:08x}", XXH32_digest(s.x32));
  if (s.x64) return fmt::format("{:016x}", XXH64_digest(s.x64));
  if (s.x3 && s.algo == "xxh3_64") return fmt::format("{:016x}", XXH3_64bits_digest(s.x3));
  if (s.x3) {
    XXH128_hash_t h = XXH3_128bits_digest(s.x3);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
  }
  if (s.md5) return s.md5->HexDigest();
  if (s.sha1) return s.sha1->Hex();
  return Status::Unsupported(fmt::format("hash algorithm '{}' is not computed by shardkit (known: md5, sha1, xxh32, "
                                         "xxh64, xxh3_64, xxh3_128, xxh128)",
                                         s.algo));
}

Result<std::string> HashHex(std::string_view a, const void* data, size_t size) {
  Hasher h(a);
  h.Update(data, size);
  return h.Hex();
}

}  // namespace shardkit::formats::mds
