// The front ends' helpers (front_end.h).
#include "core/front_end.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/cores.h"

namespace shardkit {

Result<uint64_t> ParseByteSize(std::string_view s) {
  auto bad = [&](std::string_view why) {
    return Status::Invalid(fmt::format(
        "bad size '{}': {}; expected a number with an optional unit (B, KB, MB, GB, TB, KiB, "
        "MiB, GiB, TiB), e.g. 1GiB, 500MB, 1000000",
        s, why));
  };
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  size_t num_begin = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num(s.substr(num_begin, i - num_begin));
  if (num.empty() || num == "." || std::count(num.begin(), num.end(), '.') > 1)
    return bad("no number");
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  std::string unit;
  for (; i < s.size(); ++i) unit += char(std::tolower(static_cast<unsigned char>(s[i])));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1000ull},
      {"kb", 1000ull},
      {"m", 1000000ull},
      {"mb", 1000000ull},
      {"g", 1000000000ull},
      {"gb", 1000000000ull},
      {"t", 1000000000000ull},
      {"tb", 1000000000000ull},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
  };
  uint64_t mult = 0;
  for (auto& [name, m] : kUnits)
    if (unit == name) mult = m;
  if (mult == 0) return bad(fmt::format("unknown unit '{}'", unit));
  auto dot = num.find('.');
  if (dot == std::string::npos) {
    if (num.size() > 20) return bad("too large");
    unsigned __int128 v = 0;
    for (char c : num) v = v * 10 + unsigned(c - '0');
    v *= mult;
    if (v > std::numeric_limits<uint64_t>::max()) return bad("too large");
    return uint64_t(v);
  }
  long double v = std::stold(num) * static_cast<long double>(mult);
  if (v >= 18446744073709551615.0L) return bad("too large");
  return uint64_t(v + 0.5L);
}

int DefaultCopyThreads() { return std::clamp(core::UsableCores(), 2, 8); }

std::string StagingDirFromEnvironment() {
  for (const char* name : {"SHARDKIT_STAGING_DIR", "TMPDIR"})
    if (const char* d = std::getenv(name); d && *d) return d;
  return {};
}

}  // namespace shardkit
