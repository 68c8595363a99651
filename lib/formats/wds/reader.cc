// Reading wds shards (reader.h): a sequential reader over mapped and streamed
// shards, and random access over mapped ones through their indexes.
#include "formats/wds/reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "core/file.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "formats/wds/index.h"
#include "formats/wds/manifest.h"
#include "formats/wds/names.h"
#include "formats/wds/pipe.h"
#include "formats/wds/shard_index.h"

namespace shardkit::formats::wds {

namespace {

class WdsReader : public SampleReader {
 public:
  explicit WdsReader(std::vector<std::string> paths) : paths_(std::move(paths)) {}

  Result<bool> Next(Sample* out) override {
    for (;;) {
      if (pipe_) {
        SK_ASSIGN_OR_RETURN(bool more, pipe_->Next(out));
        if (more) return true;
        pipe_.reset();  // the command has exited with status 0
        continue;
      }
      if (!cursor_) {
        if (next_ >= paths_.size()) return false;
        if (IsPipe(paths_[next_])) {
          pipe_ = NewPipeShardReader(paths_[next_], int64_t(next_));
          ++next_;
          continue;
        }
        SK_ASSIGN_OR_RETURN(map_, MapShard(paths_[next_], int64_t(next_)));
        cursor_ = std::make_unique<SampleCursor>(*map_, int64_t(next_));
        ++next_;
      }
      SampleRef ref;
      SK_ASSIGN_OR_RETURN(bool more, cursor_->Next(&ref));
      if (!more) {
        cursor_.reset();
        map_.reset();
        continue;
      }
      FillSample(*map_, map_, ref, out);
      return true;
    }
  }

 private:
  std::vector<std::string> paths_;
  size_t next_ = 0;
  std::shared_ptr<io::MappedFile> map_;
  std::unique_ptr<SampleCursor> cursor_;
  std::unique_ptr<SampleReader> pipe_;  // a `pipe:` shard being read; destroying it stops the command
};

class WdsRandomAccess : public RandomAccess {
 public:
  struct Shard {
    std::shared_ptr<io::MappedFile> map;
    std::shared_ptr<const ShardIndex> index;
    uint64_t first = 0;  // global index of its first sample
  };
  explicit WdsRandomAccess(std::vector<Shard> shards)
      : shards_(std::make_shared<std::vector<Shard>>(std::move(shards))), owner_(shards_) {
    for (auto& s : *shards_) {
      s.first = total_;
      total_ += s.index->samples.size();
    }
  }
  uint64_t size() const override { return total_; }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= total_)
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", i, total_),
                             Location{.index = int64_t(i)});
    auto it = std::upper_bound(shards_->begin(), shards_->end(), i,
                               [](uint64_t v, const Shard& s) { return v < s.first; });
    const Shard& s = *(it - 1);
    // The views' owner keeps every shard's mapping alive, through a control block of this
    // thread's own (lib/core/per_thread.h).
    FillSample(*s.map, owner_.Owner(), s.index->samples[i - s.first], out);
    return Status::OK();
  }

 private:
  std::shared_ptr<std::vector<Shard>> shards_;
  core::PerThreadViewOwner owner_;
  uint64_t total_ = 0;
};

class WdsDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }

  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new WdsReader(paths_));
  }

  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    for (size_t i = 0; i < paths_.size(); ++i)
      if (IsPipe(paths_[i]))
        return Status::Unsupported(
            fmt::format("'{}' is a stream (the output of a command), readable in order only: it has no random "
                        "access by index; read it sequentially, or convert it to a format with random access "
                        "first (e.g. `shardkit convert '{}' out.lmdb`)",
                        paths_[i], info_.address),
            Location{.file = paths_[i], .shard = int64_t(i)});
    std::vector<WdsRandomAccess::Shard> shards;
    for (size_t i = 0; i < paths_.size(); ++i) {
      WdsRandomAccess::Shard s;
      SK_ASSIGN_OR_RETURN(s.map, MapShard(paths_[i], int64_t(i)));
      SK_ASSIGN_OR_RETURN(s.index, Index(i, *s.map));
      // A shard that changed size since it was indexed could SIGBUS a mapping.
      if (s.map->size() != s.index->file_size)
        return Status::Corrupt(fmt::format("shard changed size since it was indexed ({} -> {} bytes)",
                                           s.index->file_size, s.map->size()),
                               Location{.file = paths_[i], .shard = int64_t(i)});
      shards.push_back(std::move(s));
    }
    return std::shared_ptr<RandomAccess>(new WdsRandomAccess(std::move(shards)));
  }

  // The checksums of every shard's sidecar, concatenated; empty when no shard
  // has one; an error when only some have, or one disagrees with its shard.
  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    std::vector<uint64_t> all;
    for (const auto& p : paths_)
      if (IsPipe(p)) return all;  // a streamed shard's sidecar cannot be fetched
    size_t with = 0;
    for (size_t i = 0; i < paths_.size(); ++i) {
      std::string sp = wds::SumsPath(paths_[i]);
      auto r = wds::ReadSums(sp);
      if (!r.ok() && r.status().code() == Code::kNotFound) {
        if (with > 0)
          return Status::NotFound("shard has no per-sample checksum file (" + BaseOf(sp) + ") but others have",
                                  Location{.file = paths_[i], .shard = int64_t(i)});
        continue;
      }
      if (!r.ok()) {
        Status s = std::move(r).take_status();
        s.At(Location{.shard = int64_t(i)});
        return s;
      }
      if (with != i)
        return Status::NotFound("earlier shards have no per-sample checksum file but this one has",
                                Location{.file = paths_[i], .shard = int64_t(i)});
      ++with;
      if (i < info_.shards.size() && r->size() != info_.shards[i].samples)
        return Status::Corrupt(fmt::format("{} holds {} checksums for {} samples", BaseOf(sp), r->size(),
                                           info_.shards[i].samples),
                               Location{.file = sp, .shard = int64_t(i)});
      all.insert(all.end(), r->begin(), r->end());
    }
    return all;
  }

  // The index of shard i: cached, else from its .idx when consistent, else a scan.
  Result<std::shared_ptr<const ShardIndex>> Index(size_t i, const io::MappedFile& map) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (indexes_[i] && indexes_[i]->file_size == map.size()) return indexes_[i];
    }
    std::shared_ptr<const ShardIndex> idx;
    std::string idx_path = IdxPathFor(paths_[i]);
    if (io::Exists(idx_path)) {
      auto r = LoadIdx(idx_path, map, int64_t(i));
      if (r.ok()) idx = std::make_shared<ShardIndex>(std::move(r).value());
    }
    if (!idx) {
      SK_ASSIGN_OR_RETURN(auto scanned, ScanShard(map, int64_t(i)));
      idx = std::make_shared<ShardIndex>(std::move(scanned));
    }
    std::lock_guard<std::mutex> lock(mu_);
    indexes_[i] = idx;
    return idx;
  }

  DatasetInfo info_;
  std::vector<std::string> paths_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const ShardIndex>> indexes_;
};

Result<uint64_t> FileSize(const std::string& path, int64_t shard) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT ? Status::NotFound("shard does not exist", Location{.file = path, .shard = shard})
                           : Status::FromErrno(errno, "cannot stat shard", Location{.file = path, .shard = shard});
  if (!S_ISREG(st.st_mode))
    return Status::Invalid("shard is not a regular file", Location{.file = path, .shard = shard});
  return uint64_t(st.st_size);
}

Result<std::unique_ptr<Dataset>> OpenManifest(const std::string& path) {
  auto ds = std::make_unique<WdsDataset>();
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  std::string unreadable;
  SK_ASSIGN_OR_RETURN(Manifest m, ReadManifest(path, &unreadable));
  if (!m.fields_error.empty()) unreadable = m.fields_error;
  if (!unreadable.empty()) return Status::Corrupt(fmt::format("bad manifest: {}", unreadable), Location{.file = path});
  info.num_samples = m.num_samples;
  info.class_names = std::move(m.class_names);
  info.fields = std::move(m.fields);
  info.shards = std::move(m.shards);
  uint64_t sum = 0;
  for (const auto& si : info.shards) sum += si.samples;
  if (sum != *info.num_samples)
    return Status::Corrupt(fmt::format("manifest says {} samples but its shards add up to {}", *info.num_samples, sum),
                           Location{.file = path});
  for (size_t i = 0; i < info.shards.size(); ++i) {
    const auto& si = info.shards[i];
    SK_ASSIGN_OR_RETURN(uint64_t size, FileSize(si.path, int64_t(i)));
    if (size != si.bytes)
      return Status::Corrupt(fmt::format("shard has {} bytes but the manifest says {}", size, si.bytes),
                             Location{.file = si.path, .shard = int64_t(i)});
    info.total_bytes += size;
    ds->paths_.push_back(si.path);
  }
  ds->indexes_.resize(ds->paths_.size());
  if (!ds->paths_.empty() && io::Exists(SumsPath(ds->paths_[0]))) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}

}  // namespace

Result<std::unique_ptr<Dataset>> OpenWds(const std::string& path, const OpenOptions&) {
  if (paths::EndsWith(path, ".manifest.json")) return OpenManifest(path);
  SK_ASSIGN_OR_RETURN(std::vector<std::string> paths, paths::ExpandBraces(path));
  auto ds = std::make_unique<WdsDataset>();
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  ds->paths_ = paths;
  ds->indexes_.resize(paths.size());
  std::set<std::string> exts;
  uint64_t samples = 0, skipped = 0;
  size_t pipes = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (IsPipe(paths[i])) {
      // Not run here: a command may be a download, and runs once per reader.
      if (paths[i].find_first_not_of(" \t", kPipe.size()) == std::string::npos)
        return Status::Invalid("'pipe:' needs a command, e.g. 'pipe:cat shard.tar'",
                               Location{.file = paths[i], .shard = int64_t(i)});
      info.shards.push_back(ShardInfo{paths[i], 0, 0, "", "wds:" + paths[i]});
      ++pipes;
      continue;
    }
    SK_ASSIGN_OR_RETURN(uint64_t size, FileSize(paths[i], int64_t(i)));
    (void)size;
    SK_ASSIGN_OR_RETURN(auto map, MapShard(paths[i], int64_t(i)));
    SK_ASSIGN_OR_RETURN(auto idx, ds->Index(i, *map));
    exts.insert(idx->exts.begin(), idx->exts.end());
    samples += idx->samples.size();
    skipped += idx->skipped;
    info.shards.push_back(ShardInfo{paths[i], idx->samples.size(), idx->file_size, "", "wds:" + paths[i]});
    info.total_bytes += idx->file_size;
  }
  if (pipes == 0) {
    info.num_samples = samples;
    info.fields.assign(exts.begin(), exts.end());
  } else {
    // Sample count and fields are known only once the streams have been read.
    info.extra["access"] = "sequential: pipe: shards are streamed from a command, with no random access";
  }
  if (skipped) info.extra["skipped_members"] = std::to_string(skipped);
  if (!ds->paths_.empty() && io::Exists(SumsPath(ds->paths_[0]))) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}
}  // namespace shardkit::formats::wds
