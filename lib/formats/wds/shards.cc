// The wds format's answers to the format contract: see formats/wds/shards.h.
#include "formats/wds/shards.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/any_file.h"
#include "core/paths.h"
#include "io/shard_cache.h"
#include "formats/tar/tar.h"
#include "formats/wds/index.h"
#include "formats/wds/manifest.h"
#include "formats/wds/names.h"

namespace shardkit::formats::wds {

namespace {

using json = nlohmann::json;

constexpr std::string_view kManifestSuffix = ".manifest.json";

// Whether a 512-byte block is a tar header, by the scanner's rules
// (tar::HeaderChecksumOk) and, when it carries one, a well-formed ustar magic.
bool IsTarHeader(const uint8_t* b) {
  if (b[0] == '\0' || !tar::HeaderChecksumOk(b)) return false;
  if (std::memcmp(b + 257, "ustar", 5) == 0) return b[262] == '\0' || b[262] == ' ';
  return true;  // v7: no magic
}

// 100 when the file's first block is a tar header, 0 when it is not, -1 when
// it cannot be read (missing, a directory, shorter than a block).
int TarContent(const std::string& path) {
  if (io::IsUrl(path)) return -1;  // (a remote address is bid on by its name: no request per bid)
  auto head = io::ReadAnyHead(path, 512);
  if (!head.ok() || head->size() != 512) return -1;
  return IsTarHeader(reinterpret_cast<const uint8_t*>(head->data())) ? 100 : 0;
}

// 100 when the file is JSON whose "format" is "wds", 0 when it is another JSON
// object, -1 when it cannot be read or parsed.
int ManifestContent(const std::string& path) {
  if (io::IsUrl(path)) return -1;
  auto size = io::RegularFileSize(path);
  if (!size.ok() || *size > (64 << 20)) return -1;
  auto text = io::ReadFile(path);
  if (!text.ok()) return -1;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return -1;
  auto f = j.find("format");
  return f != j.end() && f->is_string() && *f == "wds" ? 100 : 0;
}

}  // namespace

int BidRead(const std::string& path) {
  if (IsPipe(path)) return 90;
  std::string p = paths::Lower(path);
  if (paths::EndsWith(p, kManifestSuffix)) {
    int c = ManifestContent(path);
    return c == 100 ? 100 : 90;  // a manifest that is not ours still opens with a clear error
  }
  if (p.find('{') != std::string::npos || p.find("::") != std::string::npos) {
    auto r = paths::ExpandBraces(path);
    if (!r.ok() || r->empty()) return 0;
    for (const auto& e : *r)
      if (!paths::EndsWith(paths::Lower(e), ".tar") && !IsPipe(e)) return 0;
    return 90;
  }
  int c = TarContent(path);
  if (c == 100) return 100;
  if (paths::EndsWith(p, ".tar")) return 90;  // a damaged first header is still a shard to report on
  return 0;
}

Result<ShardListing> ListShards(const std::string& path, const OpenOptions& opts) {
  ShardListing out;
  if (paths::EndsWith(path, kManifestSuffix)) {
    out.metadata = path;
    SK_ASSIGN_OR_RETURN(Manifest m, ReadManifest(path, &out.unreadable, opts.trust_manifest));
    if (!out.unreadable.empty()) return out;
    out.num_samples = m.num_samples;
    out.class_names = std::move(m.class_names);
    out.channel_order = m.channel_order;
    for (auto& si : m.shards)
      out.shards.push_back(ShardListing::Shard{si.path, si.address, si.samples, si.bytes, si.checksum});
    return out;
  }
  SK_ASSIGN_OR_RETURN(auto list, paths::ExpandBraces(path));
  bool single = list.size() == 1 && list[0] == path;
  if (single && !(io::IsUrl(path) ? io::AnyExists(path) : io::Exists(path))) return Status::NotFound("no such shard", Location{.file = path});
  for (auto& p : list) out.shards.push_back(ShardListing::Shard{p, "wds:" + p, std::nullopt, std::nullopt, ""});
  return out;
}

Result<std::vector<SampleExtent>> LocateSamples(const std::string& shard_path, int64_t shard) {
  SK_ASSIGN_OR_RETURN(ShardMembers m, ScanShardMembers(shard_path, shard));
  std::vector<SampleExtent> out;
  out.reserve(m.keys.size());
  for (size_t i = 0; i < m.keys.size(); ++i) {
    size_t first = i == 0 ? 0 : m.sample_ends[i - 1];
    if (first >= m.members.size()) break;
    out.push_back(SampleExtent{std::move(m.keys[i]), m.members[first].offset});
  }
  return out;
}

}  // namespace shardkit::formats::wds
