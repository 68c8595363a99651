#include "core/paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <xxhash.h>

namespace shardkit::paths {

namespace {
Status ExpandOne(std::string_view p, std::vector<std::string>* out) {
  auto open = p.find('{');
  if (open == std::string_view::npos) {
    if (p.find('}') != std::string_view::npos)
      return Status::Invalid(fmt::format("unbalanced '}}' in pattern '{}'", p));
    out->emplace_back(p);
    return Status::OK();
  }
  auto close = p.find('}', open);
  if (close == std::string_view::npos) return Status::Invalid(fmt::format("unbalanced '{{' in pattern '{}'", p));
  std::string_view body = p.substr(open + 1, close - open - 1);
  auto dots = body.find("..");
  std::vector<std::string> items;
  if (dots != std::string_view::npos) {
    std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
    auto all_digits = [](std::string_view s) {
      if (s.empty()) return false;
      for (char c : s)
        if (c < '0' || c > '9') return false;
      return true;
    };
    if (!all_digits(a) || !all_digits(b))
      return Status::Invalid(fmt::format("bad brace range '{{{}}}' in pattern '{}': expected {{START..END}} with decimal numbers", body, p));
    if (a.size() > 19 || b.size() > 19)  // (std::stoull would throw)
      return Status::Invalid(fmt::format("brace range '{{{}}}' is too large", body));
    uint64_t lo = std::stoull(std::string(a)), hi = std::stoull(std::string(b));
    if (hi < lo) return Status::Invalid(fmt::format("brace range '{{{}}}' in pattern '{}' runs backwards", body, p));
    if (hi - lo > 10'000'000) return Status::Invalid(fmt::format("brace range '{{{}}}' is too large", body));
    size_t width = a.size();
    for (uint64_t i = lo; i <= hi; ++i) items.push_back(fmt::format("{:0{}}", i, width));
  } else {
    size_t start = 0;
    for (;;) {
      auto comma = body.find(',', start);
      items.emplace_back(body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  }
  std::string prefix(p.substr(0, open));
  std::vector<std::string> tails;
  SK_RETURN_IF_ERROR(ExpandOne(p.substr(close + 1), &tails));
  for (const auto& it : items)
    for (const auto& t : tails) out->push_back(prefix + it + t);
  return Status::OK();
}
}  // namespace

Result<std::vector<std::string>> ExpandBraces(std::string_view pattern) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    auto sep = pattern.find("::", start);
    std::string_view part = pattern.substr(start, sep == std::string_view::npos ? std::string_view::npos : sep - start);
    if (part.empty()) return Status::Invalid(fmt::format("empty element in shard list '{}'", pattern));
    SK_RETURN_IF_ERROR(ExpandOne(part, &out));
    if (sep == std::string_view::npos) break;
    start = sep + 2;
  }
  return out;
}

Status CheckShardPattern(std::string_view pattern) {
  int conversions = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < pattern.size() && (pattern[j] == '0' || pattern[j] == '-')) ++j;
    while (j < pattern.size() && pattern[j] >= '0' && pattern[j] <= '9') ++j;
    if (j >= pattern.size() || (pattern[j] != 'd' && pattern[j] != 'u' && pattern[j] != 'i'))
      return Status::Invalid(fmt::format(
          "bad shard pattern '{}': only one integer conversion such as %06d is allowed (use %% for a literal %)",
          pattern));
    ++conversions;
    i = j;
  }
  if (conversions != 1)
    return Status::Invalid(fmt::format(
        "bad shard pattern '{}': it needs exactly one integer conversion such as 'out/train-%06d.tar' (found {})",
        pattern, conversions));
  return Status::OK();
}

std::string FormatShardPattern(std::string_view pattern, uint64_t index) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%';
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool zero = false;
    while (j < pattern.size() && (pattern[j] == '0' || pattern[j] == '-')) zero |= pattern[j++] == '0';
    size_t width = 0;
    while (j < pattern.size() && pattern[j] >= '0' && pattern[j] <= '9') width = width * 10 + size_t(pattern[j++] - '0');
    std::string num = std::to_string(index);
    if (num.size() < width) num.insert(0, width - num.size(), zero ? '0' : ' ');
    out += num;
    i = j;
  }
  return out;
}

std::optional<uint64_t> ShardNumberIn(std::string_view pattern, std::string_view name) {
  auto slash = pattern.rfind('/');
  std::string_view base = slash == std::string_view::npos ? pattern : pattern.substr(slash + 1);
  std::string prefix;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] != '%') {
      prefix += base[i];
    } else if (i + 1 < base.size() && base[i + 1] == '%') {
      prefix += '%';
      ++i;
    } else {
      break;
    }
  }
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 19 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i) return std::nullopt;
  return std::stoull(std::string(name.substr(i, j - i)));
}

Status CheckSafeKey(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return Status::Invalid(fmt::format("unsafe key: {}", why), Location{.key = std::string(key)});
  };
  if (key.empty()) return bad("empty key");
  if (key.find('\0') != std::string_view::npos) return bad("NUL byte in key");
  if (key.front() == '/') return bad("absolute path would escape the output directory");
  size_t start = 0;
  for (;;) {
    auto slash = key.find('/', start);
    std::string_view comp = key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (comp.empty()) return bad("empty path component");
    if (comp == "." || comp == "..") return bad("'.' or '..' component would escape the output directory");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::OK();
}

namespace {
bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}
bool IsRemoteAddress(std::string_view s) {
  return StartsWithNoCase(s, "http://") || StartsWithNoCase(s, "https://") || StartsWithNoCase(s, "s3://");
}
// "scheme:" at the start of an entry: 2+ letters, digits, '+', '-', '.' (the first a
// letter) and ':' followed by "//", or a scheme shardkit itself acts on.
bool HasScheme(std::string_view e) {
  size_t colon = e.find(':');
  if (colon == std::string_view::npos || colon < 2) return false;
  if (!std::isalpha(static_cast<unsigned char>(e[0]))) return false;
  for (size_t i = 1; i < colon; ++i) {
    unsigned char c = static_cast<unsigned char>(e[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return false;
  }
  if (e.substr(colon + 1, 2) == "//") return true;
  std::string scheme = Lower(e.substr(0, colon));
  return scheme == "file" || scheme == "pipe" || scheme == "http" || scheme == "https" || scheme == "s3";
}
}  // namespace

// At most this many elements of a list or range in one entry are expanded and checked.
static constexpr uint64_t kMaxListed = 64;

// How many names ExpandBraces(e) gives, without building them (UINT64_MAX: more than
// fits); malformed braces count 1 (ExpandBraces then says what is wrong).
static uint64_t BraceCount(std::string_view e) {
  auto mul = [](uint64_t a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; };
  uint64_t total = 0;
  size_t start = 0;
  for (;;) {
    size_t sep = e.find("::", start);
    std::string_view part = e.substr(start, sep == std::string_view::npos ? std::string_view::npos : sep - start);
    uint64_t n = 1;
    for (size_t open = part.find('{'); open != std::string_view::npos; open = part.find('{', open + 1)) {
      size_t close = part.find('}', open);
      if (close == std::string_view::npos) break;
      std::string_view body = part.substr(open + 1, close - open - 1);
      size_t dots = body.find("..");
      uint64_t items = 1;
      if (dots != std::string_view::npos) {
        std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
        if (a.size() > 19 || b.size() > 19) {
          items = UINT64_MAX;
        } else if (!a.empty() && !b.empty() && a.find_first_not_of("0123456789") == std::string_view::npos &&
                   b.find_first_not_of("0123456789") == std::string_view::npos) {
          uint64_t lo = std::stoull(std::string(a)), hi = std::stoull(std::string(b));
          items = hi >= lo ? hi - lo + 1 : 1;
        }
      } else {
        items = 1 + uint64_t(std::count(body.begin(), body.end(), ','));
      }
      n = mul(n, items);
      open = close;
    }
    total = total + n < total ? UINT64_MAX : total + n;
    if (sep == std::string_view::npos) break;
    start = sep + 2;
  }
  return total;
}

Confinement::Confinement(std::string description, bool trust, bool offer_trust)
    : description_(std::move(description)),
      remote_(IsRemoteAddress(description_)),
      trust_(trust),
      offer_trust_(offer_trust) {
  if (remote_) {
    // scheme://authority/prefix/name[?query]: everything before the last '/' of the path.
    std::string_view d = description_;
    d = d.substr(0, d.find_first_of("?#"));
    size_t authority = d.find("://") + 3;
    size_t slash = d.rfind('/');
    dir_ = std::string(slash == std::string_view::npos || slash < authority ? d : d.substr(0, slash));
    return;
  }
  dir_ = std::filesystem::path(description_).parent_path().string();
  if (dir_.empty()) dir_ = ".";
  std::error_code ec;
  auto real = std::filesystem::weakly_canonical(dir_, ec);
  if (!ec) real_dir_ = real.string();
}

Status Confinement::Refuse(std::string_view entry, std::string_view what, std::string_view rule) const {
  return Status::Invalid(fmt::format("{} '{}' is refused: {} (the files a {} names must lie inside its own {}{})",
                                     what, entry, rule, offer_trust_ ? "manifest" : "dataset description",
                                     remote_ ? "location" : "directory",
                                     offer_trust_ ? "; --trust-manifest / trust_manifest=True takes them as written" : ""),
                         Location{.file = description_})
      .With(Detail::kOutsideDataset);
}

namespace {

// The '/'-separated segments of `path` with "." dropped and ".." taking the one
// before it back (empty segments kept or dropped), or nullopt when a ".." has nothing
// left to take back.
std::optional<std::vector<std::string_view>> Segments(std::string_view path, bool keep_empty) {
  std::vector<std::string_view> segs;
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    std::string_view seg = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg == "..") {
      if (segs.empty()) return std::nullopt;
      segs.pop_back();
    } else if (seg != "." && (keep_empty || !seg.empty())) {
      segs.push_back(seg);
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return segs;
}

}  // namespace

Result<std::string> Confinement::Resolve(std::string_view entry, std::string_view what) const {
  return Resolve(entry, what, entry);
}

// `whole`: the entry as the description holds it (a list or range `entry` came from).
Result<std::string> Confinement::Resolve(std::string_view entry, std::string_view what, std::string_view whole) const {
  auto Refuse = [&](std::string_view, std::string_view w, std::string_view rule) {
    return this->Refuse(whole, w, whole == entry ? std::string(rule) : fmt::format("its element '{}': {}", entry, rule));
  };
  if (entry.empty()) return Refuse(entry, what, "it is empty");
  if (entry.find('\0') != std::string_view::npos) return Refuse(entry, what, "it holds a NUL byte");
  if (StartsWithNoCase(entry, "pipe:")) return Refuse(entry, what, "a manifest may not name a command ('pipe:')");
  // A list or range names one file at most here; each element is held to the rules.
  if (entry.find('{') != std::string_view::npos || entry.find('}') != std::string_view::npos ||
      entry.find("::") != std::string_view::npos) {
    // Counted before it is expanded: "{0..9999999}{0..9999999}" must not be built.
    if (uint64_t n = BraceCount(entry); n > kMaxListed)
      return Refuse(entry, what, fmt::format("it names {} files; an entry names one", n == UINT64_MAX ? std::string("too many") : std::to_string(n)));
    auto list = ExpandBraces(entry);
    if (!list.ok()) return Refuse(entry, what, list.status().message());
    for (const auto& e : *list) {
      if (e.find_first_of("{}") != std::string::npos || e.find("::") != std::string::npos)
        return Refuse(entry, what, "a nested list or range");
      auto one = Resolve(e, what, whole);
      if (!one.ok()) return one;
    }
    if (list->size() != 1)
      return Refuse(entry, what, fmt::format("it names {} files; an entry names one", list->size()));
    return Resolve((*list)[0], what, whole);
  }
  if (trust_) {
    if (!remote_) {
      if (entry.front() == '/' || IsRemoteAddress(entry)) return std::string(entry);
      if (dir_ != ".") return dir_ + "/" + std::string(entry);
      return entry.find(':') != std::string_view::npos ? "./" + std::string(entry) : std::string(entry);
    }
    std::string full;
    if (IsRemoteAddress(entry)) {
      full = std::string(entry);
    } else if (entry.front() == '/') {
      size_t root = dir_.find('/', dir_.find("://") + 3);  // the same scheme, host and port
      full = (root == std::string::npos ? dir_ : dir_.substr(0, root)) + std::string(entry);
    } else {
      full = dir_ + "/" + std::string(entry);
    }
    // An object key is not a file path: "a/../b" is resolved here, as a browser would,
    // not sent as a key of its own. Climbing above the host or bucket is refused.
    size_t authority = full.find("://") + 3;
    size_t path_at = full.find('/', authority);
    if (path_at == std::string::npos) return full;
    size_t query_at = full.find_first_of("?#", path_at);
    std::string_view path = std::string_view(full).substr(path_at + 1, query_at == std::string::npos ? std::string::npos : query_at - path_at - 1);
    auto segs = Segments(path, /*keep_empty=*/true);
    if (!segs) return Refuse(entry, what, "'..' climbs above the server's or bucket's root");
    std::string out = full.substr(0, path_at);
    for (auto seg : *segs) (out += '/') += seg;
    if (query_at != std::string::npos) out += full.substr(query_at);
    return out;
  }
  if (HasScheme(entry)) return Refuse(entry, what, "it names another location (a scheme such as file:// or http://)");
  if (entry.front() == '/') return Refuse(entry, what, "an absolute path");
  if (entry.find('\\') != std::string_view::npos && remote_) return Refuse(entry, what, "a backslash in a remote entry");
  if (remote_ && entry.find_first_of("%?#") != std::string_view::npos)
    return Refuse(entry, what, "'%', '?' or '#' in a remote entry (a server would decode or split it)");
  // Lexically: "." and empty components drop, ".." takes one back and may not climb out.
  auto parts = Segments(entry, /*keep_empty=*/false);
  if (!parts) return Refuse(entry, what, "'..' climbs out of the dataset's location");
  if (parts->empty()) return Refuse(entry, what, "it names the dataset's location itself, not a file in it");
  std::string rel;
  for (auto p : *parts) {
    if (!rel.empty()) rel += '/';
    rel += p;
  }
  std::string out;
  if (dir_ == ".")
    out = rel.find(':') != std::string::npos ? "./" + rel : rel;
  else
    out = dir_ + "/" + rel;
  if (!remote_ && !real_dir_.empty()) {
    // Symbolic links: where the file really is must be under where the directory really is.
    std::error_code ec;
    auto real = std::filesystem::weakly_canonical(out, ec);
    if (!ec) {
      std::string r = real.string();
      std::string base = real_dir_ == "/" ? real_dir_ : real_dir_ + "/";
      if (r.compare(0, base.size(), base) != 0)
        return Refuse(entry, what, "it resolves through a symbolic link to a file outside the dataset's directory");
    }
  }
  return out;
}

std::string_view BaseName(std::string_view key) {
  auto slash = key.rfind('/');
  return slash == std::string_view::npos ? key : key.substr(slash + 1);
}

std::string ChecksumString(uint64_t h) { return fmt::format("xxh3:{:016x}", h); }

std::optional<uint64_t> ParseChecksumString(std::string_view s) {
  if (s.size() != 21 || s.substr(0, 5) != "xxh3:") return std::nullopt;
  uint64_t h = 0;
  auto [end, ec] = std::from_chars(s.data() + 5, s.data() + s.size(), h, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return h;
}

uint64_t Hash(const void* data, size_t size) { return XXH3_64bits(data, size); }

void AddSampleToDigest(XXH3_state_t* st, std::string_view key, uint64_t sample_sum) {
  uint64_t len = key.size();
  XXH3_64bits_update(st, &sample_sum, sizeof sample_sum);
  XXH3_64bits_update(st, &len, sizeof len);
  XXH3_64bits_update(st, key.data(), key.size());
}

Result<uint64_t> HashFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "cannot open", Location{.file = path});
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::string buf(1 << 20, '\0');
  uint64_t off = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      XXH3_freeState(st);
      return Status::FromErrno(e, "read failed", Location{.file = path, .offset = int64_t(off)});
    }
    if (n == 0) break;
    XXH3_64bits_update(st, buf.data(), size_t(n));
    off += uint64_t(n);
  }
  ::close(fd);
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool HasExtension(std::string_view path, std::initializer_list<std::string_view> exts) {
  std::string l = Lower(path);
  for (std::string_view e : exts)
    if (l.size() > e.size() && l.compare(l.size() - e.size(), e.size(), e) == 0) return true;
  return false;
}

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

bool IsAvifFileType(const uint8_t* p, size_t n) {
  if (n < 16 || std::memcmp(p + 4, "ftyp", 4) != 0) return false;
  const uint32_t box = uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
  if (box < 16) return false;
  auto avif_brand = [&](size_t at) { return std::memcmp(p + at, "avif", 4) == 0 || std::memcmp(p + at, "avis", 4) == 0; };
  if (avif_brand(8)) return true;  // the major brand
  const size_t end = std::min<size_t>(box, n);
  for (size_t at = 16; at + 4 <= end; at += 4)  // the compatible brands, after the minor version
    if (avif_brand(at)) return true;
  return false;
}

std::string SniffImageExt(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return "jpg";
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return "png";
  if (n >= 6 && (std::memcmp(p, "GIF87a", 6) == 0 || std::memcmp(p, "GIF89a", 6) == 0)) return "gif";
  if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) return "webp";
  if (IsAvifFileType(p, n)) return "avif";
  if ((n >= 2 && p[0] == 0xFF && p[1] == 0x0A) ||
      (n >= 12 && std::memcmp(p, "\0\0\0\x0CJXL \r\n\x87\n", 12) == 0))
    return "jxl";
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') return "bmp";
  return "bin";
}

std::string RelativeTo(const std::string& path, const std::string& base) {
  std::error_code ec;
  auto abs_path = std::filesystem::absolute(path, ec);
  if (ec) return path;
  auto abs_base = std::filesystem::absolute(base, ec);
  if (ec) return path;
  auto rel = abs_path.lexically_normal().lexically_proximate(abs_base.lexically_normal());
  return rel.empty() ? path : rel.string();
}

Result<std::map<std::string, std::string>> ParsePairs(std::string_view text, std::string_view what,
                                                      std::string_view shape) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? text.size() : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      return Status::Invalid(fmt::format("{}: '{}' is not {}", what, item, shape));
    out[std::string(item.substr(0, eq))] = std::string(item.substr(eq + 1));
  }
  return out;
}

}  // namespace shardkit::paths
