#include "formats/tar.h"

#include <cstring>

#include <fmt/format.h>

namespace shardkit::tar {

namespace {
// ustar header field offsets and lengths.
constexpr size_t kName = 0, kNameLen = 100;
constexpr size_t kSize = 124, kSizeLen = 12;
constexpr size_t kChksum = 148, kChksumLen = 8;
constexpr size_t kType = 156;
constexpr size_t kMagic = 257;
constexpr size_t kPrefix = 345, kPrefixLen = 155;
// A pax or GNU long-name record larger than this is refused (names are < 4 KiB).
constexpr uint64_t kMaxExtHeader = 1 << 20;

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

std::string CString(const uint8_t* p, size_t max) {
  size_t n = 0;
  while (n < max && p[n]) ++n;
  return std::string(reinterpret_cast<const char*>(p), n);
}

std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) out += char(c);
    else if (c >= 0x80) out += char(c);  // keep UTF-8 bytes as they are
    else out += fmt::format("\\x{:02x}", c);
    if (out.size() > 200) return out + "...";
  }
  return out;
}

// Parses pax records "LEN key=value\n" into path/size. Returns an error message or "".
std::string ParsePax(const uint8_t* p, uint64_t n, std::string* path, bool* has_size, uint64_t* size,
                     bool* sparse) {
  uint64_t i = 0;
  while (i < n) {
    if (p[i] == 0) break;  // some writers pad with NULs
    uint64_t len = 0, j = i;
    while (j < n && p[j] >= '0' && p[j] <= '9') {
      len = len * 10 + (p[j] - '0');
      if (len > n) return "pax record length exceeds the header";
      ++j;
    }
    if (j == i || j >= n || p[j] != ' ') return "malformed pax record length";
    if (len < (j - i) + 3 || i + len > n) return "pax record length out of range";
    if (p[i + len - 1] != '\n') return "pax record does not end with a newline";
    std::string_view rec(reinterpret_cast<const char*>(p + j + 1), i + len - 1 - (j + 1));
    auto eq = rec.find('=');
    if (eq == std::string_view::npos) return "pax record without '='";
    std::string_view key = rec.substr(0, eq), val = rec.substr(eq + 1);
    if (key == "path") {
      *path = std::string(val);
    } else if (key == "size") {
      uint64_t v = 0;
      if (val.empty() || val.size() > 19) return "bad pax size";
      for (char c : val) {
        if (c < '0' || c > '9') return "bad pax size";
        v = v * 10 + uint64_t(c - '0');
      }
      *has_size = true;
      *size = v;
    } else if (key.substr(0, 11) == "GNU.sparse.") {
      *sparse = true;
    }
    i += len;
  }
  return "";
}
}  // namespace

bool ParseNumber(const uint8_t* f, size_t len, uint64_t* out) {
  if (len == 0) return false;
  if (f[0] & 0x80) {
    if (f[0] != 0x80) return false;  // negative or oversized base-256
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | f[i];
    }
    if (v >> 62) return false;
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && f[i] == ' ') ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < len; ++i) {
    uint8_t c = f[i];
    if (c == ' ' || c == 0) break;
    if (c < '0' || c > '7') return false;
    if (v >> 60) return false;
    v = v * 8 + (c - '0');
    any = true;
  }
  for (; i < len; ++i)
    if (f[i] != ' ' && f[i] != 0) return false;
  *out = any ? v : 0;
  return true;
}

Status Scanner::CheckEnd(uint64_t zero_at) {
  // One zero block was found at zero_at. A second one (or the end of the file)
  // ends the archive; after that only zero padding may follow.
  uint64_t next = zero_at + kBlock;
  if (next + kBlock <= size_ && !AllZero(data_ + next, kBlock))
    return Bad(next, "a lone zero block inside the archive (damaged or concatenated tar)");
  for (uint64_t i = next; i < size_; ++i)
    if (data_[i]) return Bad(i, "trailing garbage after the end-of-archive blocks");
  done_ = true;
  return Status::OK();
}

Result<bool> Scanner::Next(Member* m) {
  if (done_) return false;
  std::string long_name, pax_path;
  bool have_long = false, pax_has_size = false, sparse = false;
  uint64_t pax_size = 0;
  uint64_t first = pos_;
  for (;;) {
    if (pos_ == size_) {
      if (size_ == 0) return Bad(0, "empty file: not a tar archive");
      return Bad(pos_, "missing end-of-archive blocks (truncated shard?)");
    }
    if (size_ - pos_ < kBlock)
      return Bad(pos_, fmt::format("truncated tar header: {} bytes left, 512 needed", size_ - pos_));
    const uint8_t* h = data_ + pos_;
    if (AllZero(h, kBlock)) {
      if (have_long || !pax_path.empty() || pax_has_size)
        return Bad(first, "extended header not followed by a member");
      SK_RETURN_IF_ERROR(CheckEnd(pos_));
      return false;
    }
    uint64_t stored = 0;
    if (!ParseNumber(h + kChksum, kChksumLen, &stored))
      return Bad(pos_, "bad tar header checksum field (not a tar archive, or damaged)");
    uint64_t usum = 0;
    int64_t ssum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      uint8_t c = (i >= kChksum && i < kChksum + kChksumLen) ? ' ' : h[i];
      usum += c;
      ssum += int8_t(c);
    }
    if (stored != usum && int64_t(stored) != ssum)
      return Bad(pos_, fmt::format("tar header checksum mismatch (stored {}, computed {}): damaged or not a tar",
                                   stored, usum));
    uint64_t size = 0;
    if (!ParseNumber(h + kSize, kSizeLen, &size)) return Bad(pos_, "bad size field in tar header");
    char type = char(h[kType]);
    if (pax_has_size && type != 'x' && type != 'g') size = pax_size;
    uint64_t data_off = pos_ + kBlock;
    uint64_t left = size_ - data_off;
    if (size > left)
      return Bad(pos_, fmt::format("member declares {} bytes but only {} remain in the file (truncated?)", size,
                                   left));
    uint64_t padded = (size + kBlock - 1) / kBlock * kBlock;
    if (padded > left) return Bad(data_off + size, "truncated padding after the last member");
    const uint8_t* d = data_ + data_off;
    switch (type) {
      case 'x': {
        if (size > kMaxExtHeader) return Bad(pos_, "pax extended header too large");
        std::string err = ParsePax(d, size, &pax_path, &pax_has_size, &pax_size, &sparse);
        if (!err.empty()) return Bad(pos_, err);
        pos_ = data_off + padded;
        continue;
      }
      case 'g':  // global pax header: attributes we do not use
        pos_ = data_off + padded;
        continue;
      case 'L': {
        if (size > kMaxExtHeader) return Bad(pos_, "GNU long name too large");
        long_name = CString(d, size);
        have_long = true;
        pos_ = data_off + padded;
        continue;
      }
      case 'K':  // GNU long link name: links are refused later anyway
        pos_ = data_off + padded;
        continue;
      default:
        break;
    }
    m->header_offset = first;
    m->data_offset = data_off;
    m->size = size;
    if (!pax_path.empty()) {
      m->name = pax_path;
    } else if (have_long) {
      m->name = long_name;
    } else {
      m->name = CString(h + kName, kNameLen);
      // POSIX ustar keeps a name prefix; GNU's "ustar  " magic uses that area for other things.
      if (std::memcmp(h + kMagic, "ustar\0", 6) == 0 && h[kPrefix] != 0)
        m->name = CString(h + kPrefix, kPrefixLen) + "/" + m->name;
    }
    if (type == '\0' || type == '7') type = '0';
    if (type == '0' && !m->name.empty() && m->name.back() == '/') type = '5';
    if (sparse || type == 'S')
      return Status::Unsupported(fmt::format("sparse tar member '{}' is not supported", Printable(m->name)),
                                 Location{.file = path_, .offset = int64_t(first)});
    m->type = type;
    pos_ = data_off + padded;
    return true;
  }
}

}  // namespace shardkit::tar
