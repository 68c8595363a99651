// The wds manifest (manifest.h).
#include "formats/wds/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "formats/wds/index.h"
#include "formats/wds/names.h"

namespace shardkit::formats::wds {

using json = nlohmann::json;

Status ParseManifest(const std::string& path, const std::string& text, DatasetInfo* out) {
  DatasetInfo& info = *out;
  info.format = "wds";
  info.address = path;
  std::string dir = io::DirName(path);
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "wds")
      return Status::Corrupt("not a shardkit wds manifest (\"format\" is not \"wds\")", Location{.file = path});
    info.num_samples = j.at("num_samples").get<uint64_t>();
    info.class_names = j.value("class_names", std::vector<std::string>{});
    info.fields = j.value("fields", std::vector<std::string>{});
    uint64_t sum = 0;
    for (const auto& s : j.at("shards")) {
      ShardInfo si;
      std::string rel = s.at("path").get<std::string>();
      si.path = (!rel.empty() && rel[0] == '/') ? rel : JoinDir(dir, rel);
      si.samples = s.at("samples").get<uint64_t>();
      si.bytes = s.at("bytes").get<uint64_t>();
      si.checksum = s.value("checksum", "");
      sum += si.samples;
      info.shards.push_back(std::move(si));
    }
    if (sum != *info.num_samples)
      return Status::Corrupt(fmt::format("manifest says {} samples but its shards add up to {}", *info.num_samples,
                                         sum),
                             Location{.file = path});
  } catch (const std::exception& e) {
    return Status::Corrupt(fmt::format("bad manifest: {}", e.what()), Location{.file = path});
  }
  return Status::OK();
}

std::string ManifestText(const std::string& pattern, uint64_t num_samples, const std::vector<std::string>& class_names,
                         const std::vector<std::string>& fields, const std::vector<ShardInfo>& shard_infos,
                         bool write_index, uint64_t* total_bytes) {
  json j;
  j["format"] = "wds";
  j["version"] = 1;
  j["pattern"] = BaseOf(pattern);
  j["num_samples"] = num_samples;
  j["class_names"] = class_names;
  j["fields"] = fields;
  uint64_t total = 0;
  json shards = json::array();
  for (const auto& s : shard_infos) {
    json o;
    o["path"] = BaseOf(s.path);
    o["samples"] = s.samples;
    o["bytes"] = s.bytes;
    o["checksum"] = s.checksum;
    if (write_index) o["index"] = BaseOf(IdxPathFor(s.path));
    o["sample_checksums"] = BaseOf(SumsPath(s.path));
    shards.push_back(std::move(o));
    total += s.bytes;
  }
  j["total_bytes"] = total;
  j["shards"] = std::move(shards);
  *total_bytes = total;
  return j.dump(2) + "\n";
}

}  // namespace shardkit::formats::wds
