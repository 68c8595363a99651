#include "formats/tar/tar.h"

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

bool HeaderChecksumOk(const uint8_t* h, uint64_t* stored_out, uint64_t* computed_out) {
  uint64_t stored = 0;
  if (!ParseNumber(h + kChksum, kChksumLen, &stored)) return false;
  uint64_t usum = 0;
  int64_t ssum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    uint8_t c = (i >= kChksum && i < kChksum + kChksumLen) ? ' ' : h[i];
    usum += c;
    ssum += int8_t(c);
  }
  if (stored_out) *stored_out = stored;
  if (computed_out) *computed_out = usum;
  return stored == usum || int64_t(stored) == ssum;
}

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

Status Scanner::Skip(uint64_t n) {
  SK_ASSIGN_OR_RETURN(uint64_t done, src_->Consume(n));
  if (done != n)  // Next() checked that these bytes exist
    return Bad(src_->position(), "the source ended before bytes it held (changed while read?)");
  return Status::OK();
}

Status Scanner::CheckEnd(uint64_t zero_at) {
  // One zero block was found at zero_at. A second one (or the end of the file)
  // ends the archive; after that only zero padding may follow.
  uint64_t next = zero_at + kBlock;
  SK_ASSIGN_OR_RETURN(std::span<const uint8_t> a, src_->Ahead(2 * kBlock));
  if (a.size() >= 2 * kBlock && !AllZero(a.data() + kBlock, kBlock))
    return Bad(next, "a lone zero block inside the archive (damaged or concatenated tar)");
  SK_RETURN_IF_ERROR(Skip(kBlock));
  for (;;) {
    SK_ASSIGN_OR_RETURN(a, src_->Ahead(64 << 10));
    if (a.empty()) break;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i]) return Bad(src_->position() + i, "trailing garbage after the end-of-archive blocks");
    SK_RETURN_IF_ERROR(Skip(a.size()));
  }
  done_ = true;
  return Status::OK();
}

Result<Bytes> Scanner::TakeData() {
  if (done_ || data_left_ == 0) return Bytes();
  uint64_t n = data_left_;
  SK_ASSIGN_OR_RETURN(Bytes b, src_->Take(n));
  data_left_ = 0;
  if (b.size() != n) return Bad(src_->position(), "the source ended before bytes it held (changed while read?)");
  return b;
}

Result<bool> Scanner::Next(Member* m) {
  if (done_) return false;
  if (data_left_ + pad_left_) {
    SK_RETURN_IF_ERROR(Skip(data_left_ + pad_left_));
    data_left_ = pad_left_ = 0;
  }
  std::string long_name, pax_path;
  bool have_long = false, pax_has_size = false, sparse = false;
  uint64_t pax_size = 0;
  const uint64_t first = src_->position();
  const int64_t total = src_->size();  // -1: a stream, whose sizes are checked by reading ahead
  for (;;) {
    const uint64_t pos = src_->position();
    SK_ASSIGN_OR_RETURN(std::span<const uint8_t> a, src_->Ahead(kBlock));
    if (a.empty()) {
      if (pos == 0) return Bad(0, "empty file: not a tar archive");
      return Bad(pos, "missing end-of-archive blocks (truncated shard?)");
    }
    if (a.size() < kBlock)
      return Bad(pos, fmt::format("truncated tar header: {} bytes left, 512 needed", a.size()));
    const uint8_t* h = a.data();
    if (AllZero(h, kBlock)) {
      if (have_long || !pax_path.empty() || pax_has_size)
        return Bad(first, "extended header not followed by a member");
      SK_RETURN_IF_ERROR(CheckEnd(pos));
      return false;
    }
    uint64_t stored = 0, usum = 0;
    if (!ParseNumber(h + kChksum, kChksumLen, &stored))
      return Bad(pos, "bad tar header checksum field (not a tar archive, or damaged)");
    if (!HeaderChecksumOk(h, &stored, &usum))
      return Bad(pos, fmt::format("tar header checksum mismatch (stored {}, computed {}): damaged or not a tar",
                                  stored, usum));
    uint64_t size = 0;
    if (!ParseNumber(h + kSize, kSizeLen, &size)) return Bad(pos, "bad size field in tar header");
    char type = char(h[kType]);
    if (pax_has_size && type != 'x' && type != 'g') size = pax_size;
    const uint64_t data_off = pos + kBlock;
    const uint64_t padded = (size + kBlock - 1) / kBlock * kBlock;
    // The bytes after the header: counted when the size is known, else read
    // ahead (a stream; memory then follows the bytes that arrive, as they arrive).
    uint64_t left = 0;
    if (total >= 0) {
      left = uint64_t(total) - data_off;
    } else {
      SK_ASSIGN_OR_RETURN(a, src_->Ahead(size_t(kBlock + padded)));
      h = a.data();
      left = a.size() - kBlock;
    }
    if (size > left)
      return Bad(pos, fmt::format("member declares {} bytes but only {} remain in the file (truncated?)", size,
                                  left));
    if (padded > left) return Bad(data_off + size, "truncated padding after the last member");
    switch (type) {
      case 'x':
      case 'L': {
        if (size > kMaxExtHeader)
          return Bad(pos, type == 'x' ? "pax extended header too large" : "GNU long name too large");
        if (total >= 0) {
          SK_ASSIGN_OR_RETURN(a, src_->Ahead(size_t(kBlock + size)));
          h = a.data();
        }
        const uint8_t* d = h + kBlock;
        if (type == 'x') {
          std::string err = ParsePax(d, size, &pax_path, &pax_has_size, &pax_size, &sparse);
          if (!err.empty()) return Bad(pos, err);
        } else {
          long_name = CString(d, size);
          have_long = true;
        }
        SK_RETURN_IF_ERROR(Skip(kBlock + padded));
        continue;
      }
      case 'g':  // global pax header: attributes we do not use
      case 'K':  // GNU long link name: links are refused later anyway
        SK_RETURN_IF_ERROR(Skip(kBlock + padded));
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
    SK_RETURN_IF_ERROR(Skip(kBlock));
    data_left_ = size;
    pad_left_ = padded - size;
    return true;
  }
}

}  // namespace shardkit::tar
