// The wds format's answers to the format contract: see formats/wds_shards.h.
#include "formats/wds_shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/paths.h"
#include "formats/tar.h"
#include "formats/wds_index.h"

namespace shardkit::formats::wds {

namespace {

using json = nlohmann::json;

constexpr std::string_view kManifestSuffix = ".manifest.json";
constexpr std::string_view kPipe = "pipe:";

bool IsPipe(std::string_view path) { return path.substr(0, kPipe.size()) == kPipe; }

std::string JoinDir(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir + "/" + name;
}

// Whether a 512-byte block is a tar header, by the scanner's rules
// (formats/tar.cc): its checksum field matches the sum of its bytes (the field
// counted as spaces; signed sums accepted, as old tars wrote them) and, when it
// carries one, the ustar magic is well formed.
bool IsTarHeader(const uint8_t* b) {
  uint64_t recorded = 0;
  if (b[0] == '\0' || !tar::ParseNumber(b + 148, 8, &recorded)) return false;
  uint64_t sum = 0;
  int64_t ssum = 0;
  for (size_t k = 0; k < 512; ++k) {
    uint8_t c = (k >= 148 && k < 156) ? ' ' : b[k];
    sum += c;
    ssum += static_cast<int8_t>(c);
  }
  if (recorded != sum && int64_t(recorded) != ssum) return false;
  if (std::memcmp(b + 257, "ustar", 5) == 0) return b[262] == '\0' || b[262] == ' ';
  return true;  // v7: no magic
}

// 100 when the file's first block is a tar header, 0 when it is not, -1 when
// it cannot be read (missing, a directory, shorter than a block).
int TarContent(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st{};
  uint8_t block[512];
  ssize_t r = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) r = ::pread(fd, block, sizeof block, 0);
  ::close(fd);
  if (r != ssize_t(sizeof block)) return -1;
  return IsTarHeader(block) ? 100 : 0;
}

// 100 when the file is JSON whose "format" is "wds", 0 when it is another JSON
// object, -1 when it cannot be read or parsed.
int ManifestContent(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) return -1;
  auto text = io::ReadFile(path);
  if (!text.ok()) return -1;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return -1;
  auto f = j.find("format");
  return f != j.end() && f->is_string() && *f == "wds" ? 100 : 0;
}

}  // namespace

Result<Manifest> ReadManifest(const std::string& path, std::string* unreadable) {
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  std::string dir = io::DirName(path);
  Manifest m;
  unreadable->clear();
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "wds")
      return Status::Corrupt("not a shardkit wds manifest (\"format\" is not \"wds\")", Location{.file = path});
    m.num_samples = j.at("num_samples").get<uint64_t>();
    m.class_names = j.value("class_names", std::vector<std::string>{});
    try {
      m.fields = j.value("fields", std::vector<std::string>{});
    } catch (const std::exception& e) {
      m.fields_error = e.what();
    }
    for (const auto& s : j.at("shards")) {
      ShardInfo si;
      std::string rel = s.at("path").get<std::string>();
      si.path = (!rel.empty() && rel[0] == '/') ? rel : JoinDir(dir, rel);
      si.address = "wds:" + si.path;
      si.samples = s.at("samples").get<uint64_t>();
      si.bytes = s.at("bytes").get<uint64_t>();
      si.checksum = s.value("checksum", "");
      m.shards.push_back(std::move(si));
    }
  } catch (const std::exception& e) {
    *unreadable = e.what();
    return Manifest{};
  }
  return m;
}

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

Result<ShardListing> ListShards(const std::string& path) {
  ShardListing out;
  if (paths::EndsWith(path, kManifestSuffix)) {
    out.metadata = path;
    SK_ASSIGN_OR_RETURN(Manifest m, ReadManifest(path, &out.unreadable));
    if (!out.unreadable.empty()) return out;
    out.num_samples = m.num_samples;
    out.class_names = std::move(m.class_names);
    for (auto& si : m.shards)
      out.shards.push_back(ShardListing::Shard{si.path, si.address, si.samples, si.bytes, si.checksum});
    return out;
  }
  SK_ASSIGN_OR_RETURN(auto list, paths::ExpandBraces(path));
  bool single = list.size() == 1 && list[0] == path;
  if (single && !io::Exists(path)) return Status::NotFound("no such shard", Location{.file = path});
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
