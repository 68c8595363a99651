// Reading TFRecord files: every file mapped (or inflated, when compressed), its
// frames indexed at open (from a DALI .idx beside it when present and valid,
// else by walking the headers, each length CRC checked), records parsed on
// demand. A record's data CRC is checked the first time it is read (the
// sequential reader and Get() share the per-record "checked" marks).
#include <atomic>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "formats/channel_order.h"
#include "formats/tfrecord/example.h"
#include "formats/tfrecord/frames.h"
#include "formats/tfrecord/tfrecord.h"

namespace shardkit::formats::tfrecord {

namespace {

using json = nlohmann::json;

struct TfFile {
  FileData data;
  std::vector<Frame> frames;
  uint64_t first = 0;  // dataset index of its first record
  std::string index_source;
};

// What a manifest written by shardkit says.
struct ManifestInfo {
  std::vector<std::string> class_names;
  std::map<std::string, std::string> field_map;
  std::vector<ShardListing::Shard> shards;
  std::optional<uint64_t> num_samples;
  std::string channel_order;  // of decoded arrays: "bgr", "rgb" or "" (not recorded)
  std::string transform;      // the transform's JSON object as text, or "" (not recorded)
};

Result<ManifestInfo> ReadManifest(const std::string& path, bool trust) {
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  json j = json::parse(text, nullptr, false);
  Location at{.file = path};
  if (j.is_discarded() || !j.is_object()) return Status::Corrupt("TFRecord manifest is not a JSON object", at);
  if (!json_count::MemberIs(j, "format", "tfrecord"))
    return Status::Corrupt("JSON file is not a TFRecord manifest (its \"format\" is not \"tfrecord\")", at);
  ManifestInfo m;
  try {
    m.class_names = j.value("class_names", std::vector<std::string>{});
    m.field_map = j.value("field_map", std::map<std::string, std::string>{});
    if (j.contains("num_samples")) m.num_samples = json_count::Get(j.at("num_samples"), "num_samples");
    m.channel_order = j.value("channel_order", std::string());
    if (m.channel_order != "" && m.channel_order != "bgr" && m.channel_order != "rgb")
      return Status::Corrupt(fmt::format("TFRecord manifest: channel_order '{}' is not bgr or rgb", m.channel_order),
                             at);
    if (auto t = j.find("transform"); t != j.end()) {
      if (!t->is_object()) return Status::Corrupt("TFRecord manifest: transform is not a JSON object", at);
      m.transform = t->dump();
    }
    const paths::Confinement inside(path, trust);
    size_t i = 0;
    for (const auto& s : j.at("shards")) {
      auto resolved = inside.Resolve(s.at("path").get<std::string>(), fmt::format("shards[{}].path", i++));
      if (!resolved.ok()) return resolved.status();
      const std::string& p = *resolved;
      m.shards.push_back(ShardListing::Shard{p, "tfrecord:" + p, json_count::Value(s, "samples", 0),
                                             json_count::Value(s, "bytes", 0), s.value("checksum", std::string())});
    }
  } catch (const json::exception& e) {
    return Status::Corrupt(fmt::format("TFRecord manifest is malformed: {}", e.what()), at);
  }
  return m;
}

class TfDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override;
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override;

  uint64_t size() const { return total_; }
  Status Read(uint64_t i, Sample* out) const {
    if (i >= total_) return Status::Invalid(fmt::format("index {} out of range [0, {})", i, total_));
    size_t fi = size_t(std::upper_bound(firsts_.begin(), firsts_.end(), i) - firsts_.begin()) - 1;
    const TfFile& f = files_[fi];
    const Frame& fr = f.frames[i - f.first];
    if (!checked_[i].load(std::memory_order_acquire)) {
      Status st = CheckData(f.data, fr, int64_t(i));
      if (!st.ok()) {
        // Name the key when the damaged record still parses.
        Sample s;
        Bytes rec(f.data.owner, f.data.data + fr.offset + kHeaderBytes, fr.length);
        if (RecordToSample(mapping_, rec, i, &s, Location{}).ok()) st.where().key = s.key;
        return st.At(Location{.shard = int64_t(fi)});
      }
      checked_[i].store(1, std::memory_order_release);
    }
    Bytes rec(f.data.owner, f.data.data + fr.offset + kHeaderBytes, fr.length);
    return RecordToSample(mapping_, rec, i, out,
                          Location{.file = f.data.path, .shard = int64_t(fi), .offset = int64_t(fr.offset),
                                   .index = int64_t(i)});
  }

  static Result<std::unique_ptr<Dataset>> Open(const std::string& path, const OpenOptions& opts);

 private:
  DatasetInfo info_;
  std::vector<TfFile> files_;
  std::vector<uint64_t> firsts_;
  uint64_t total_ = 0;
  Mapping mapping_;
  std::unique_ptr<std::atomic<uint8_t>[]> checked_;
};

class TfReader : public SampleReader {
 public:
  explicit TfReader(const TfDataset* d) : d_(d) {}
  Result<bool> Next(Sample* out) override {
    if (next_ >= d_->size()) return false;
    // The frames are known, so a damaged record is skipped over after its error.
    SK_RETURN_IF_ERROR(d_->Read(next_++, out));
    return true;
  }

 private:
  const TfDataset* d_;
  uint64_t next_ = 0;
};

class TfRandomAccess : public RandomAccess {
 public:
  explicit TfRandomAccess(const TfDataset* d) : d_(d) {}
  uint64_t size() const override { return d_->size(); }
  Status Get(uint64_t index, Sample* out) const override { return d_->Read(index, out); }

 private:
  const TfDataset* d_;
};

Result<std::unique_ptr<SampleReader>> TfDataset::NewReader() const {
  return std::unique_ptr<SampleReader>(new TfReader(this));
}
Result<std::shared_ptr<RandomAccess>> TfDataset::NewRandomAccess() const {
  return std::shared_ptr<RandomAccess>(new TfRandomAccess(this));
}

Result<std::unique_ptr<Dataset>> TfDataset::Open(const std::string& path, const OpenOptions& opts) {
  auto d = std::unique_ptr<TfDataset>(new TfDataset());
  std::vector<std::string> paths_list;
  std::vector<std::string> checksums;
  ManifestInfo man;
  bool from_manifest = paths::EndsWith(paths::Lower(path), kManifestSuffix);
  if (from_manifest) {
    SK_ASSIGN_OR_RETURN(man, ReadManifest(path, opts.trust_manifest));
    for (const auto& s : man.shards) paths_list.push_back(s.path), checksums.push_back(s.checksum);
    d->info_.class_names = man.class_names;
  } else {
    SK_ASSIGN_OR_RETURN(paths_list, paths::ExpandBraces(path));
    checksums.assign(paths_list.size(), "");
  }
  if (paths_list.empty()) return Status::Invalid("the address names no TFRecord file", Location{.file = path});
  std::string compressions;
  bool any_idx = false;
  for (size_t i = 0; i < paths_list.size(); ++i) {
    TfFile f;
    auto loaded = LoadFile(paths_list[i], io::CacheOptions{opts.cache_dir, opts.cache_bytes});
    if (!loaded.ok()) return std::move(loaded).take_status().At(Location{.shard = int64_t(i)});
    f.data = std::move(*loaded);
    std::string idx = IdxPathFor(f.data.path);
    std::string text;
    if (f.data.compression == Compression::kNone && idx != f.data.path && io::Exists(idx) && !io::IsDir(idx)) {
      SK_ASSIGN_OR_RETURN(text, io::ReadFile(idx));
      // A tar shard's DALI index ("v1.2 N", x.idx beside x.tar) is not one of ours: scan instead.
      if (text.rfind("v1.", 0) == 0) text.clear();
    }
    if (!text.empty()) {
      auto fr = FramesFromIdx(f.data, idx, text);
      if (!fr.ok()) return std::move(fr).take_status().At(Location{.shard = int64_t(i)});
      f.frames = std::move(*fr);
      f.index_source = "idx";
      any_idx = true;
    } else {
      auto fr = ScanFrames(f.data);
      if (!fr.ok()) return std::move(fr).take_status().At(Location{.shard = int64_t(i)});
      f.frames = std::move(*fr);
    }
    f.first = d->total_;
    d->total_ += f.frames.size();
    std::string c = CompressionName(f.data.compression);
    if (compressions.find(c) == std::string::npos) compressions += (compressions.empty() ? "" : ",") + c;
    ShardInfo si;
    si.path = f.data.path;
    si.samples = f.frames.size();
    si.bytes = f.data.disk_bytes;
    si.checksum = checksums[i];
    si.address = "tfrecord:" + f.data.path;
    d->info_.total_bytes += si.bytes;
    d->info_.shards.push_back(std::move(si));
    d->firsts_.push_back(f.first);
    d->files_.push_back(std::move(f));
  }
  if (from_manifest && man.num_samples && *man.num_samples != d->total_)
    return Status::Corrupt(fmt::format("manifest says {} records, the files hold {}", *man.num_samples, d->total_),
                           Location{.file = path});
  d->checked_.reset(new std::atomic<uint8_t>[d->total_]());
  for (uint64_t i = 0; i < d->total_; ++i) d->checked_[i].store(0, std::memory_order_relaxed);
  // The mapping: the field map given, else the manifest's, else detected from the first record.
  const std::map<std::string, std::string>& fm = !opts.field_map.empty() ? opts.field_map : man.field_map;
  if (d->total_ == 0) {
    if (!fm.empty()) {
      SK_ASSIGN_OR_RETURN(d->mapping_, FieldMapMapping(fm));
    } else {
      d->mapping_.preset = "none";
    }
  } else {
    // The first record whose data CRC holds (a damaged one is verify's finding, not a
    // reason to refuse the dataset), else the first.
    uint64_t pick = 0;
    for (uint64_t i = 0; i < std::min<uint64_t>(d->total_, 8); ++i) {
      size_t fi = size_t(std::upper_bound(d->firsts_.begin(), d->firsts_.end(), i) - d->firsts_.begin()) - 1;
      const TfFile& f = d->files_[fi];
      if (CheckData(f.data, f.frames[i - f.first]).ok()) {
        pick = i;
        break;
      }
    }
    size_t fi = size_t(std::upper_bound(d->firsts_.begin(), d->firsts_.end(), pick) - d->firsts_.begin()) - 1;
    const TfFile& f0 = d->files_[fi];
    const Frame& fr = f0.frames[pick - f0.first];
    std::string_view rec(reinterpret_cast<const char*>(f0.data.data + fr.offset + kHeaderBytes), fr.length);
    SK_ASSIGN_OR_RETURN(d->mapping_, DetectMapping(rec, fm,
                                                   Location{.file = f0.data.path, .shard = int64_t(fi),
                                                            .offset = int64_t(fr.offset), .index = int64_t(pick)}));
    Sample s;
    if (d->Read(pick, &s).ok())
      for (const auto& fl : s.fields) d->info_.fields.push_back(fl.ext);
  }
  d->info_.format = "tfrecord";
  d->info_.address = "tfrecord:" + path;
  d->info_.num_samples = d->total_;
  d->info_.extra["preset"] = d->mapping_.preset;
  if (!man.transform.empty()) d->info_.extra["transform"] = man.transform;  // as the manifest records it
  d->info_.extra["compression"] = compressions;
  d->info_.extra["index"] = any_idx ? "DALI .idx beside the files (checked)" : "scanned at open";
  d->info_.sample_checksums = SampleChecksums::kInRecords;
  d->info_.sample_checksums_where =
      "CRC32C of each record's length and data (TFRecord framing), checked on read";
  // Decoded arrays: the order the manifest records, or tfrecord.channels.
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder(man.channel_order, from_manifest ? "the manifest" : path,
                                                     "tfrecord.channels", opts, &d->info_));
  if (to_rgb) {
    DatasetInfo info = d->info_;
    return WithBgrToRgb(std::move(d), std::move(info));
  }
  return std::unique_ptr<Dataset>(std::move(d));
}

}  // namespace

std::string ManifestPathFor(const std::string& pattern) {
  size_t pct = std::string::npos;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (i + 1 < pattern.size() && pattern[i + 1] == '%') {
      ++i;
      continue;
    }
    pct = i;
    break;
  }
  std::string stem;
  if (pct != std::string::npos) {
    stem = pattern.substr(0, pct);
    while (!stem.empty() && (stem.back() == '-' || stem.back() == '_' || stem.back() == '.')) stem.pop_back();
    if (stem.empty() || stem.back() == '/') stem += "tfrecord";
  } else {
    stem = pattern;
    for (std::string_view ext : {".tfrecords", ".tfrecord"})
      if (paths::EndsWith(paths::Lower(stem), ext) && stem.size() > ext.size()) {
        stem.resize(stem.size() - ext.size());
        break;
      }
  }
  return stem + std::string(kManifestSuffix);
}

Result<std::unique_ptr<Dataset>> OpenTfrecord(const std::string& path, const OpenOptions& opts) {
  return TfDataset::Open(path, opts);
}

Result<ShardListing> ListShards(const std::string& path, const OpenOptions& opts) {
  ShardListing out;
  if (paths::EndsWith(paths::Lower(path), kManifestSuffix)) {
    out.metadata = path;
    auto m = ReadManifest(path, opts.trust_manifest);
    if (!m.ok()) {
      if (m.status().code() != Code::kCorrupt) return m.status();
      out.unreadable = m.status().message();
      return out;
    }
    out.num_samples = m->num_samples;
    out.class_names = m->class_names;
    out.channel_order = m->channel_order;
    out.shards = m->shards;
    return out;
  }
  SK_ASSIGN_OR_RETURN(auto list, paths::ExpandBraces(path));
  bool single = list.size() == 1 && list[0] == path;
  if (single && !io::Exists(path)) return Status::NotFound("no such file", Location{.file = path});
  for (auto& p : list) out.shards.push_back(ShardListing::Shard{p, "tfrecord:" + p, std::nullopt, std::nullopt, ""});
  return out;
}

}  // namespace shardkit::formats::tfrecord
