// Reading MXNet RecordIO (recordio.h): each .rec is mapped; the sequential
// reader walks its records in file order (checking them against the .idx when
// there is one); random access goes through the .idx (sorted by offset at
// open, so both orders agree). Keys, class names and per-sample checksums come
// from FILE.shardkit.json when shardkit wrote the file (with the channel order
// of decoded arrays and the transform applied at conversion), else keys are the .idx keys or, without an .idx, each
// record's header id.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/any_file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "formats/channel_order.h"
#include "formats/recordio/recordio.h"

namespace shardkit::formats::recordio {

std::string StemOf(const std::string& rec_path) {
  if (paths::HasExtension(rec_path, {".rec"})) return rec_path.substr(0, rec_path.size() - 4);
  return rec_path;
}
std::string IdxPathFor(const std::string& rec_path) { return StemOf(rec_path) + ".idx"; }
std::string MetaPathFor(const std::string& rec_path) { return StemOf(rec_path) + ".shardkit.json"; }

namespace {

std::string FloatJson(float f) {
  if (std::isnan(f)) return "\"nan\"";
  if (std::isinf(f)) return f > 0 ? "\"inf\"" : "\"-inf\"";
  return fmt::format("{}", f);  // shortest text that reads back as the same float
}

}  // namespace

void SetLabelFields(const ImageRecord& r, Sample* out) {
  if (r.flag == 0) {
    float l = r.label;
    if (std::isfinite(l) && l == std::nearbyint(l) && std::fabs(l) < 2147483648.0f && !(l == 0 && std::signbit(l))) {
      out->set("cls", Bytes::Copy(std::to_string(int64_t(l))));
    } else {
      out->set("labels.json", Bytes::Copy(FloatJson(l)));
    }
    return;
  }
  std::string j = "[";
  for (size_t i = 0; i < r.labels.size(); ++i) {
    if (i) j += ", ";
    j += FloatJson(r.labels[i]);
  }
  j += "]";
  out->set("labels.json", Bytes::Take(std::move(j)));
}

namespace {

using json = nlohmann::json;

// What shardkit wrote beside a .rec (MetaPathFor).
struct Meta {
  bool present = false;
  std::vector<std::string> keys;
  std::vector<std::string> class_names;
  std::vector<std::string> fields;
  std::vector<uint64_t> checksums;
  std::map<uint64_t, std::string> exts;  // record -> payload extension, where sniffing says otherwise
  std::set<uint64_t> unlabeled;          // records whose sample had no label (the header holds 0)
  std::string channel_order;             // of decoded arrays: "bgr", "rgb" or "" (not recorded)
  std::string transform;                 // the transform's JSON object as text, or "" (not recorded)
};

Result<Meta> ReadMeta(const std::string& rec_path) {
  Meta m;
  std::string path = MetaPathFor(rec_path);
  if (!io::Exists(path)) return m;
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  json j = json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return Status::Corrupt(fmt::format("bad shardkit sidecar: {}", why), Location{.file = path});
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!json_count::MemberIs(j, "format", "recordio")) return bad("\"format\" is not \"recordio\"");
  try {
    m.keys = j.at("keys").get<std::vector<std::string>>();
    if (j.contains("class_names")) m.class_names = j.at("class_names").get<std::vector<std::string>>();
    if (j.contains("fields")) m.fields = j.at("fields").get<std::vector<std::string>>();
    if (j.contains("checksums")) m.checksums = j.at("checksums").get<std::vector<uint64_t>>();
    if (j.contains("exts"))
      for (auto& [k, v] : j.at("exts").items()) m.exts[std::stoull(k)] = v.get<std::string>();
    if (j.contains("unlabeled"))
      for (uint64_t i : j.at("unlabeled").get<std::vector<uint64_t>>()) m.unlabeled.insert(i);
    m.channel_order = j.value("channel_order", std::string());
    if (auto t = j.find("transform"); t != j.end()) {
      if (!t->is_object()) return bad("transform is not a JSON object");
      m.transform = t->dump();
    }
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  if (m.channel_order != "" && m.channel_order != "bgr" && m.channel_order != "rgb")
    return bad(fmt::format("channel_order '{}' is not bgr or rgb", m.channel_order));
  if (!m.checksums.empty() && m.checksums.size() != m.keys.size())
    return bad(fmt::format("{} checksums for {} keys", m.checksums.size(), m.keys.size()));
  for (const auto& [i, e] : m.exts)
    if (i >= m.keys.size() || e.empty()) return bad(fmt::format("payload extension of record {} out of range", i));
  m.present = true;
  return m;
}

struct Shard {
  std::string path;
  std::string idx_path;  // empty when there is no .idx
  int64_t number = 0;
  std::shared_ptr<io::MappedFile> map;
  std::vector<IdxEntry> idx;  // sorted by offset
  Meta meta;
  uint64_t first = 0;  // global index of its first sample
  std::optional<uint64_t> count;
};

Status OpenShard(Shard* sh, const io::CacheOptions& cache) {
  Location at{.file = sh->path, .shard = sh->number};
  auto size = io::RegularFileSize(sh->path);
  if (!size.ok() && size.status().code() == Code::kNotFound) return Status::NotFound("no such RecordIO file", at);
  if (!size.ok()) return Status(size.status()).At(at);
  SK_ASSIGN_OR_RETURN(sh->map, io::MapAny(sh->path, cache));
  SK_ASSIGN_OR_RETURN(sh->meta, ReadMeta(sh->path));
  std::string idx_path = IdxPathFor(sh->path);
  if (io::Exists(idx_path)) {
    sh->idx_path = idx_path;
    SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(idx_path));
    SK_ASSIGN_OR_RETURN(sh->idx, ParseIdx(text, idx_path));
    std::stable_sort(sh->idx.begin(), sh->idx.end(),
                     [](const IdxEntry& a, const IdxEntry& b) { return a.offset < b.offset; });
    const uint64_t size = sh->map->size();
    for (size_t i = 0; i < sh->idx.size(); ++i) {
      const IdxEntry& e = sh->idx[i];
      Location at{.file = sh->path, .shard = sh->number, .offset = int64_t(e.offset), .key = e.key};
      if (e.offset >= size || size - e.offset < 8)
        return Status::Corrupt(fmt::format("the .idx '{}' points key '{}' at offset {}, outside the file ({} bytes)",
                                           idx_path, e.key, e.offset, size),
                               at)
            .With(Detail::kIndexEntry);
      if (e.offset % 4 != 0 || (i > 0 && sh->idx[i - 1].offset == e.offset))
        return Status::Corrupt(fmt::format("the .idx '{}' points key '{}' at offset {}, which is not the start of "
                                           "a record ({})",
                                           idx_path, e.key, e.offset,
                                           e.offset % 4 ? "records start at multiples of 4"
                                                        : "another key points there too"),
                               at)
            .With(Detail::kIndexEntry);
    }
    sh->count = sh->idx.size();
    if (sh->meta.present && sh->meta.keys.size() != sh->idx.size())
      return Status::Corrupt(fmt::format("the .idx lists {} records but {} lists {} keys", sh->idx.size(),
                                         MetaPathFor(sh->path), sh->meta.keys.size()),
                             Location{.file = idx_path, .shard = sh->number});
  } else if (sh->meta.present) {
    sh->count = sh->meta.keys.size();
  }
  return Status::OK();
}

// Turns one record of a shard into a sample; `local` is its place in the shard.
Status FillSample(const Shard& sh, uint64_t local, uint64_t offset, const Record& rec, Bytes joined,
                  const std::shared_ptr<const void>& owner, Sample* out) {
  out->clear();
  Location at{.file = sh.path, .shard = sh.number, .offset = int64_t(offset), .index = int64_t(sh.first + local)};
  ImageRecord ir;
  SK_RETURN_IF_ERROR(ParseImageRecord(rec.payload, at, &ir));
  const uint8_t* img = reinterpret_cast<const uint8_t*>(ir.image.data());
  Bytes image;
  if (rec.joined) {
    image = joined.slice(size_t(img - joined.data()), ir.image.size());
  } else {
    image = Bytes(owner, img, ir.image.size());
  }
  if (sh.meta.present && local < sh.meta.keys.size()) out->key = sh.meta.keys[local];
  else if (local < sh.idx.size()) out->key = sh.idx[local].key;
  else out->key = std::to_string(ir.id);
  std::string ext;
  if (auto it = sh.meta.exts.find(local); it != sh.meta.exts.end()) ext = it->second;
  else ext = paths::SniffImageExt(img, ir.image.size());
  SetLabelFields(ir, out);
  if (sh.meta.unlabeled.count(local) && ir.flag == 0 && ir.label == 0) out->erase("cls");
  out->set(std::move(ext), std::move(image));
  return Status::OK();
}

// Reads the record at `offset`; a joined payload is moved into *joined.
Status ReadAt(const Shard& sh, uint64_t offset, std::string* scratch, Record* rec, Bytes* joined) {
  SK_RETURN_IF_ERROR(ReadRecord(sh.map->data(), sh.map->size(), offset, sh.path, scratch, rec).At(
      Location{.shard = sh.number}));
  if (rec->joined) {
    *joined = Bytes::Take(std::move(*scratch));
    rec->payload = joined->view();
    scratch->clear();
  }
  return Status::OK();
}

class RecReader : public SampleReader {
 public:
  explicit RecReader(std::shared_ptr<const std::vector<Shard>> shards) : shards_(std::move(shards)) {}

  Result<bool> Next(Sample* out) override {
    while (shard_ < shards_->size()) {
      const Shard& sh = (*shards_)[shard_];
      const uint64_t size = sh.map->size();
      if (offset_ >= size) {
        if (!sh.idx_path.empty() && local_ != sh.idx.size())
          return Status::Corrupt(fmt::format("the .idx '{}' lists {} records but the file holds {}", sh.idx_path,
                                             sh.idx.size(), local_),
                                 Location{.file = sh.path, .shard = sh.number})
              .With(Detail::kIndexEntry);
        if (sh.meta.present && local_ != sh.meta.keys.size())
          return Status::Corrupt(fmt::format("'{}' lists {} keys but the file holds {} records",
                                             MetaPathFor(sh.path), sh.meta.keys.size(), local_),
                                 Location{.file = sh.path, .shard = sh.number});
        ++shard_;
        offset_ = 0;
        local_ = 0;
        continue;
      }
      if (!sh.idx_path.empty()) {
        if (local_ >= sh.idx.size())
          return Status::Corrupt(fmt::format("the file holds more records than the {} its .idx '{}' lists",
                                             sh.idx.size(), sh.idx_path),
                                 Location{.file = sh.path, .shard = sh.number, .offset = int64_t(offset_)})
              .With(Detail::kIndexEntry);
        if (sh.idx[local_].offset != offset_)
          return Status::Corrupt(fmt::format("record {} starts at offset {} but the .idx '{}' points key '{}' at "
                                             "offset {}",
                                             local_, offset_, sh.idx_path, sh.idx[local_].key, sh.idx[local_].offset),
                                 Location{.file = sh.path, .shard = sh.number,
                                          .offset = int64_t(sh.idx[local_].offset), .key = sh.idx[local_].key})
              .With(Detail::kIndexEntry);
      }
      Record rec;
      Bytes joined;
      SK_RETURN_IF_ERROR(ReadAt(sh, offset_, &scratch_, &rec, &joined)
                             .At(Location{.index = int64_t(sh.first + local_)}));
      SK_RETURN_IF_ERROR(FillSample(sh, local_, offset_, rec, joined, sh.map, out));
      offset_ = rec.next;
      ++local_;
      return true;
    }
    return false;
  }

 private:
  std::shared_ptr<const std::vector<Shard>> shards_;
  size_t shard_ = 0;
  uint64_t offset_ = 0, local_ = 0;
  std::string scratch_;
};

class RecRandomAccess : public RandomAccess {
 public:
  RecRandomAccess(std::shared_ptr<const std::vector<Shard>> shards, uint64_t total)
      : shards_(std::move(shards)), owner_(shards_), total_(total) {}
  uint64_t size() const override { return total_; }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= total_)
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", i, total_),
                             Location{.index = int64_t(i)});
    auto it = std::upper_bound(shards_->begin(), shards_->end(), i,
                               [](uint64_t v, const Shard& s) { return v < s.first; });
    const Shard& sh = *(it - 1);
    const uint64_t local = i - sh.first;
    const IdxEntry& e = sh.idx[local];
    Record rec;
    Bytes joined;
    std::string scratch;
    Status st = ReadAt(sh, e.offset, &scratch, &rec, &joined);
    if (!st.ok()) {
      Location at{.file = sh.path, .shard = sh.number, .offset = int64_t(e.offset), .key = e.key,
                  .index = int64_t(i)};
      if (st.where().offset == int64_t(e.offset))  // the entry's own header is wrong
        return Status::Corrupt(fmt::format("the .idx '{}' points key '{}' at offset {}, which is not the start of "
                                           "a record: {}",
                                           sh.idx_path, e.key, e.offset, st.message()),
                               at)
            .With(Detail::kIndexEntry);
      return st.At(at);
    }
    return FillSample(sh, local, e.offset, rec, joined, owner_.Owner(), out);
  }

 private:
  std::shared_ptr<const std::vector<Shard>> shards_;
  core::PerThreadViewOwner owner_;
  uint64_t total_;
};

class RecDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new RecReader(shards_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    uint64_t total = 0;
    for (const auto& sh : *shards_) {
      if (sh.idx_path.empty())
        return Status::Unsupported(
            fmt::format("'{}' has no index ({}): it reads in order only; run `shardkit index {}` to make one "
                        "for random access",
                        sh.path, IdxPathFor(sh.path), sh.path),
            Location{.file = sh.path, .shard = sh.number});
      total += sh.idx.size();
    }
    return std::shared_ptr<RandomAccess>(new RecRandomAccess(shards_, total));
  }
  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    std::vector<uint64_t> all;
    for (const auto& sh : *shards_) {
      if (sh.meta.checksums.empty()) {
        if (!all.empty())
          return Status::NotFound("no per-sample checksums for this file but earlier ones have them",
                                  Location{.file = sh.path, .shard = sh.number});
        continue;
      }
      all.insert(all.end(), sh.meta.checksums.begin(), sh.meta.checksums.end());
    }
    return all;
  }

  DatasetInfo info_;
  std::shared_ptr<const std::vector<Shard>> shards_;
};

}  // namespace

Result<std::unique_ptr<Dataset>> Open(const std::string& path, const OpenOptions& opts) {
  SK_ASSIGN_OR_RETURN(std::vector<std::string> list, paths::ExpandBraces(path));
  auto shards = std::make_shared<std::vector<Shard>>();
  auto ds = std::make_unique<RecDataset>();
  DatasetInfo& info = ds->info_;
  info.format = "recordio";
  info.address = path;
  std::set<std::string> fields;
  bool known = true, sums = !list.empty(), fields_known = true;
  uint64_t total = 0;
  std::string no_idx, recorded, recorded_in;
  std::string transform;                     // as the first sidecar records it ("" none)
  std::optional<std::string> transform_in;   // that sidecar
  for (size_t i = 0; i < list.size(); ++i) {
    Shard sh;
    sh.path = list[i];
    sh.number = list.size() > 1 ? int64_t(i) : -1;
    SK_RETURN_IF_ERROR(OpenShard(&sh, io::CacheOptions{opts.cache_dir, opts.cache_bytes}));
    sh.first = total;
    if (sh.count) total += *sh.count;
    else known = false;
    if (sh.idx_path.empty() && no_idx.empty()) no_idx = sh.path;
    if (sh.meta.checksums.empty()) sums = false;
    if (info.class_names.empty()) info.class_names = sh.meta.class_names;
    // Files that record a channel order agree (a file without arrays records none).
    if (!sh.meta.channel_order.empty()) {
      if (recorded.empty()) {
        recorded = sh.meta.channel_order;
        recorded_in = MetaPathFor(sh.path);
      } else if (sh.meta.channel_order != recorded) {
        return Status::Corrupt(fmt::format("the channel order of decoded arrays is '{}' here but '{}' in '{}'",
                                           sh.meta.channel_order, recorded, recorded_in),
                               Location{.file = MetaPathFor(sh.path), .shard = sh.number});
      }
    }
    // Files with a sidecar record one transform (or none): a mix would have the images
    // of one file checked against another's rule.
    if (sh.meta.present) {
      if (!transform_in) {
        transform = sh.meta.transform;
        transform_in = MetaPathFor(sh.path);
      } else if (sh.meta.transform != transform) {
        return Status::Corrupt(fmt::format("the transform recorded here is {} but {} in '{}'",
                                           sh.meta.transform.empty() ? "none" : sh.meta.transform,
                                           transform.empty() ? "none" : transform, *transform_in),
                               Location{.file = MetaPathFor(sh.path), .shard = sh.number});
      }
    }
    if (sh.meta.present && !sh.meta.fields.empty()) fields.insert(sh.meta.fields.begin(), sh.meta.fields.end());
    else fields_known = false;
    info.shards.push_back(ShardInfo{sh.path, sh.count.value_or(0), sh.map->size(), "", "recordio:" + sh.path});
    info.total_bytes += sh.map->size();
    shards->push_back(std::move(sh));
  }
  if (known) info.num_samples = total;
  if (!fields_known && !shards->empty() && shards->front().map->size() > 0) {
    // Written by another tool: the fields of the first record.
    Shard& sh = shards->front();
    Record rec;
    std::string scratch;
    Bytes joined;
    Sample s;
    if (ReadAt(sh, 0, &scratch, &rec, &joined).ok() && FillSample(sh, 0, 0, rec, joined, sh.map, &s).ok())
      for (const auto& f : s.fields) fields.insert(f.ext);
  }
  info.fields.assign(fields.begin(), fields.end());
  info.extra["index"] = no_idx.empty() ? "FILE.idx beside each .rec: random access"
                                       : fmt::format("none for '{}': sequential reading only (`shardkit index` makes "
                                                     "one)",
                                                     no_idx);
  if (sums) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "xxh3 list in FILE.shardkit.json beside each .rec";
  }
  if (!transform.empty()) info.extra["transform"] = transform;
  // Decoded arrays: the order the sidecars record, or recordio.channels.
  ds->shards_ = std::move(shards);
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder(recorded, recorded_in.empty() ? path : recorded_in,
                                                     "recordio.channels", opts, &info));
  if (to_rgb) {
    DatasetInfo copy = info;
    return WithBgrToRgb(std::move(ds), std::move(copy));
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}

}  // namespace shardkit::formats::recordio
