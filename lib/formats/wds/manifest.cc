// The wds manifest (manifest.h).
#include "formats/wds/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "io/file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "io/shard_cache.h"
#include "formats/wds/index.h"
#include "formats/wds/names.h"

namespace shardkit::formats::wds {

using json = nlohmann::json;

Result<Manifest> ReadManifest(const std::string& path, std::string* unreadable, bool trust) {
  SK_ASSIGN_OR_RETURN(std::string text, io::IsUrl(path) ? io::ReadAnyFile(path) : io::ReadFile(path));
  const paths::Confinement inside(path, trust);
  Manifest m;
  unreadable->clear();
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "wds")
      return Status::Corrupt("not a shardkit wds manifest (\"format\" is not \"wds\")", Location{.file = path});
    m.num_samples = json_count::Get(j.at("num_samples"), "num_samples");
    m.class_names = j.value("class_names", std::vector<std::string>{});
    try {
      m.fields = j.value("fields", std::vector<std::string>{});
    } catch (const std::exception& e) {
      m.fields_error = e.what();
    }
    m.channel_order = j.value("channel_order", std::string());
    if (m.channel_order != "" && m.channel_order != "bgr" && m.channel_order != "rgb")
      throw std::runtime_error("channel_order '" + m.channel_order + "' is not bgr or rgb");
    if (j.contains("transform")) {
      if (!j["transform"].is_object()) throw std::runtime_error("transform is not an object");
      m.transform = j["transform"].dump();
    }
    size_t i = 0;
    for (const auto& s : j.at("shards")) {
      ShardInfo si;
      auto resolved = inside.Resolve(s.at("path").get<std::string>(), fmt::format("shards[{}].path", i++));
      if (!resolved.ok()) return resolved.status();
      si.path = std::move(*resolved);
      si.address = "wds:" + si.path;
      si.samples = json_count::Get(s.at("samples"), "samples");
      si.bytes = json_count::Get(s.at("bytes"), "bytes");
      si.checksum = s.value("checksum", "");
      m.shards.push_back(std::move(si));
    }
  } catch (const std::exception& e) {
    *unreadable = e.what();
    return Manifest{};
  }
  return m;
}

std::string ManifestText(const std::string& pattern, uint64_t num_samples, const std::vector<std::string>& class_names,
                         const std::vector<std::string>& fields, const std::vector<ShardInfo>& shard_infos,
                         bool write_index, uint64_t* total_bytes, const std::string& channel_order,
                         const std::string& transform) {
  json j;
  j["format"] = "wds";
  j["version"] = 1;
  j["pattern"] = BaseOf(pattern);
  j["num_samples"] = num_samples;
  j["class_names"] = class_names;
  j["fields"] = fields;
  if (!channel_order.empty() && std::find(fields.begin(), fields.end(), "npy") != fields.end())
    j["channel_order"] = channel_order;
  if (!transform.empty()) j["transform"] = json::parse(transform);
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
