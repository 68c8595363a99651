#include "core/paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

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

std::string SniffImageExt(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return "jpg";
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return "png";
  if (n >= 6 && (std::memcmp(p, "GIF87a", 6) == 0 || std::memcmp(p, "GIF89a", 6) == 0)) return "gif";
  if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) return "webp";
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') return "bmp";
  return "bin";
}

}  // namespace shardkit::paths
