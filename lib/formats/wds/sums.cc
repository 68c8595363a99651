// The per-sample checksum sidecar of a shard (index.h has the layout).
#include <charconv>

#include <fmt/format.h>

#include "io/file.h"
#include "io/shard_cache.h"
#include "formats/wds/index.h"

namespace shardkit::formats::wds {

std::string SumsPath(const std::string& tar_path) { return tar_path + ".xxh3"; }

std::string SumsText(const std::vector<uint64_t>& sums) {
  std::string text = fmt::format("shardkit-sample-xxh3 v1 {}\n", sums.size());
  text.reserve(text.size() + sums.size() * 17);
  for (uint64_t v : sums) text += fmt::format("{:016x}\n", v);
  return text;
}

Result<std::vector<uint64_t>> ReadSums(const std::string& sums_path) {
  std::string text;
  if (io::IsUrl(sums_path)) {
    auto r = io::ReadAnyFile(sums_path);
    if (!r.ok() && r.status().code() == Code::kNotFound)
      return Status::NotFound("no per-sample checksum file", Location{.file = sums_path});
    SK_ASSIGN_OR_RETURN(text, std::move(r));
  } else {
    if (!io::Exists(sums_path)) return Status::NotFound("no per-sample checksum file", Location{.file = sums_path});
    SK_ASSIGN_OR_RETURN(text, io::ReadFile(sums_path));
  }
  auto bad = [&](std::string why, size_t line) {
    return Status::Corrupt(fmt::format("per-sample checksum file, line {}: {}", line, why),
                           Location{.file = sums_path});
  };
  size_t nl = text.find('\n');
  if (nl == std::string::npos || text.compare(0, 24, "shardkit-sample-xxh3 v1 ") != 0)
    return bad("expected 'shardkit-sample-xxh3 v1 <count>'", 1);
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(text.data() + 24, text.data() + nl, n);
  if (ec != std::errc() || p != text.data() + nl) return bad("bad count", 1);
  if (n > (text.size() - nl) / 17) return bad(fmt::format("declares {} checksums in {} bytes", n, text.size()), 1);
  std::vector<uint64_t> out;
  out.reserve(n);
  size_t pos = nl + 1;
  for (uint64_t i = 0; i < n; ++i) {
    if (pos + 17 > text.size() || text[pos + 16] != '\n') return bad("expected 16 hex digits", i + 2);
    uint64_t v = 0;
    auto [q, e2] = std::from_chars(text.data() + pos, text.data() + pos + 16, v, 16);
    if (e2 != std::errc() || q != text.data() + pos + 16) return bad("expected 16 hex digits", i + 2);
    out.push_back(v);
    pos += 17;
  }
  if (pos != text.size()) return bad("data after the last checksum", n + 2);
  return out;
}

}  // namespace shardkit::formats::wds
