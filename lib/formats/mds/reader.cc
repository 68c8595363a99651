// Reading MDS: a directory (all shards of index.json) or one shard file of it.
// Random access is O(1): the shard's offset table gives each sample's range.
// Uncompressed shards are mapped once and kept; zstd shards are decompressed on
// first use into a small cache (samples keep their shard's buffer alive).
// The sequential reader checks each shard's recorded hashes before handing out
// its first sample; random access does not (verify reads sequentially).
#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "io/any_file.h"
#include "core/paths.h"
#include "formats/channel_order.h"
#include "formats/mds/mds.h"

namespace shardkit::formats::mds {

namespace {

// Decompressed shards kept at most (bytes); more are evicted oldest first.
constexpr uint64_t kZipCacheBytes = 1ull << 30;

class ShardCache {
 public:
  ShardCache(std::shared_ptr<const Index> idx, std::shared_ptr<FileSystem> fs)
      : idx_(std::move(idx)), fs_(std::move(fs)), slots_(idx_->shards.size()) {}

  // The loaded shard s (without hash checks: Load() with check_hashes does them).
  Result<std::shared_ptr<const ShardData>> Get(size_t s) {
    Slot& slot = slots_[s];
    if (slot.fast.load(std::memory_order_acquire)) return slot.keep;
    return Load(s, false);
  }

  Result<std::shared_ptr<const ShardData>> Load(size_t s, bool check_hashes) {
    const ShardMeta& m = idx_->shards[s];
    Slot& slot = slots_[s];
    if (!m.zip) {
      std::lock_guard<std::mutex> lock(slot.mu);
      if (slot.keep && !check_hashes) return slot.keep;
      SK_ASSIGN_OR_RETURN(auto d, LoadShard(m, fs_, LoadOptions{.check_hashes = check_hashes}));
      if (!slot.keep) {
        slot.keep = d;
        slot.fast.store(d.get(), std::memory_order_release);
      }
      return slot.keep;
    }
    if (!check_hashes) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = lru_.begin(); it != lru_.end(); ++it)
        if (it->first == s) {
          lru_.splice(lru_.begin(), lru_, it);
          return it->second;
        }
    }
    SK_ASSIGN_OR_RETURN(auto d, LoadShard(m, fs_, LoadOptions{.check_hashes = check_hashes}));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->first == s) {
        cached_ -= it->second->size;
        lru_.erase(it);
        break;
      }
    lru_.emplace_front(s, d);
    cached_ += d->size;
    while (cached_ > kZipCacheBytes && lru_.size() > 1) {
      cached_ -= lru_.back().second->size;
      lru_.pop_back();
    }
    return d;
  }

  const Index& index() const { return *idx_; }

 private:
  struct Slot {
    std::mutex mu;
    std::shared_ptr<const ShardData> keep;
    std::atomic<const ShardData*> fast{nullptr};
  };
  std::shared_ptr<const Index> idx_;
  std::shared_ptr<FileSystem> fs_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::list<std::pair<size_t, std::shared_ptr<const ShardData>>> lru_;
  uint64_t cached_ = 0;
};

class MdsAccess : public RandomAccess {
 public:
  explicit MdsAccess(std::shared_ptr<ShardCache> cache) : cache_(std::move(cache)) {
    for (const auto& m : cache_->index().shards) ends_.push_back(m.first + m.samples);
    base_ = cache_->index().shards.empty() ? 0 : cache_->index().shards[0].first;
  }
  uint64_t size() const override { return ends_.empty() ? 0 : ends_.back() - base_; }
  Status Get(uint64_t index, Sample* out) const override {
    if (index >= size())
      return Status::Invalid(fmt::format("sample index {} out of range [0, {})", index, size()),
                             Location{.file = cache_->index().index_path, .index = int64_t(index)});
    uint64_t g = index + base_;
    size_t s = size_t(std::upper_bound(ends_.begin(), ends_.end(), g) - ends_.begin());
    const ShardMeta& m = cache_->index().shards[s];
    SK_ASSIGN_OR_RETURN(auto d, cache_->Get(s));
    return DecodeSample(*d, m, g - m.first, out);
  }

 private:
  std::shared_ptr<ShardCache> cache_;
  std::vector<uint64_t> ends_;
  uint64_t base_ = 0;
};

class MdsReader : public SampleReader {
 public:
  explicit MdsReader(std::shared_ptr<ShardCache> cache) : cache_(std::move(cache)) {}

  // Loads (and checks) the first non-empty shard, so that a damaged first shard fails here.
  Status Start() { return Enter(); }

  Result<bool> Next(Sample* out) override {
    if (!failed_.ok()) return failed_;
    for (;;) {
      if (shard_ >= cache_->index().shards.size()) return false;
      if (!cur_) {
        Status st = Enter();
        if (!st.ok()) return failed_ = st;
        continue;
      }
      const ShardMeta& m = cache_->index().shards[shard_];
      if (i_ < m.samples) {
        Status st = DecodeSample(*cur_, m, i_, out);
        if (!st.ok()) return failed_ = st;
        ++i_;
        return true;
      }
      cur_.reset();
      ++shard_;
      i_ = 0;
    }
  }

 private:
  Status Enter() {
    while (shard_ < cache_->index().shards.size() && cache_->index().shards[shard_].samples == 0) {
      // An empty shard still has to be what index.json says.
      SK_ASSIGN_OR_RETURN(auto d, cache_->Load(shard_, true));
      (void)d;
      ++shard_;
    }
    if (shard_ >= cache_->index().shards.size()) return Status::OK();
    SK_ASSIGN_OR_RETURN(cur_, cache_->Load(shard_, true));
    i_ = 0;
    return Status::OK();
  }

  std::shared_ptr<ShardCache> cache_;
  size_t shard_ = 0;
  uint64_t i_ = 0;
  std::shared_ptr<const ShardData> cur_;
  Status failed_;
};

class MdsDataset : public Dataset {
 public:
  MdsDataset(std::shared_ptr<const Index> idx, std::shared_ptr<FileSystem> fs, DatasetInfo info)
      : cache_(std::make_shared<ShardCache>(std::move(idx), std::move(fs))), info_(std::move(info)) {}
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    auto r = std::make_unique<MdsReader>(cache_);
    SK_RETURN_IF_ERROR(r->Start());
    return std::unique_ptr<SampleReader>(std::move(r));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return std::shared_ptr<RandomAccess>(std::make_shared<MdsAccess>(cache_));
  }

 private:
  std::shared_ptr<ShardCache> cache_;
  DatasetInfo info_;
};

}  // namespace

Result<std::unique_ptr<Dataset>> OpenMds(const std::string& path, const OpenOptions& opts) {
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, io::FileSystemOf(path, opts.filesystem));
  Target t = Resolve(path);
  if (t.dir.empty())
    return Status::NotFound("not an MDS dataset: expected a directory holding index.json, its index.json, or one "
                            "shard.NNNNN.mds file of it",
                            Location{.file = path});
  SK_ASSIGN_OR_RETURN(Index idx, ReadIndex(t.dir, fs));
  if (!t.shard_file.empty()) {
    std::string want = t.dir + "/" + t.shard_file;
    std::vector<ShardMeta> one;
    for (auto& m : idx.shards)
      if (m.path == want) one.push_back(std::move(m));
    if (one.empty())
      return Status::NotFound(fmt::format("index.json lists no shard '{}'", t.shard_file),
                              Location{.file = idx.index_path});
    idx.shards = std::move(one);
    idx.num_samples = idx.shards[0].samples;
    std::set<std::string> fields;
    for (const auto& c : idx.shards[0].columns)
      if (c.role == Role::kField) fields.insert(c.ext);
    idx.fields.assign(fields.begin(), fields.end());
  }
  DatasetInfo info;
  info.format = "mds";
  info.address = "mds:" + path;
  info.num_samples = idx.num_samples;
  info.class_names = idx.class_names;
  info.fields = idx.fields;
  std::set<std::string> algos, unchecked, compressions;
  for (const auto& m : idx.shards) {
    // Every shard is there with the size index.json records (cheap locally; hashes are
    // checked when a shard is read in order). A remote shard's size is checked when it is
    // fetched: one request per shard at open would be slow for thousands of them.
    Location at{.file = m.path, .shard = m.index};
    if (!io::IsUrl(m.path)) {
      SK_ASSIGN_OR_RETURN(FileInfo fi, fs->Stat(m.path));
      if (fi.type != FileType::kFile)
        return Status::NotFound(fmt::format("shard file listed in index.json (shards[{}]) does not exist", m.index), at);
      if (fi.size != m.file_bytes()) {
        Status st = Status::Corrupt(fmt::format("file has {} bytes but index.json records {} (shards[{}].{}.bytes)",
                                                fi.size, m.file_bytes(), m.index, m.zip ? "zip_data" : "raw_data"),
                                    at);
        st.With(Detail::kShardChecksum);
        return st;
      }
    }
    ShardInfo si;
    si.path = m.path;
    si.samples = m.samples;
    si.bytes = m.file_bytes();
    si.address = "mds:" + m.path;
    const FileRef& stored = m.zip ? *m.zip : m.raw;
    auto x = stored.hashes.find("xxh3_64");
    if (x != stored.hashes.end()) si.checksum = "xxh3:" + x->second;
    info.total_bytes += si.bytes;
    info.shards.push_back(std::move(si));
    for (const FileRef* f : {&m.raw, m.zip ? &*m.zip : nullptr})
      if (f)
        for (const auto& [a, h] : f->hashes) (KnownHash(a) ? algos : unchecked).insert(a);
    if (!m.compression.empty()) compressions.insert(m.compression);
  }
  auto join = [](const std::set<std::string>& s) {
    std::string out;
    for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  if (!algos.empty())
    info.shard_checksums_where = fmt::format("index.json's {} of each shard file, checked before its first sample is "
                                             "read in order",
                                             join(algos));
  if (!unchecked.empty()) info.extra["hashes_unchecked"] = join(unchecked);
  info.extra["compression"] = compressions.empty() ? "none" : join(compressions);
  info.extra["hashes"] = algos.empty() && unchecked.empty() ? "none" : join(algos) + (unchecked.empty() ? "" : (algos.empty() ? "" : ", ") + join(unchecked));
  if (!idx.shards.empty()) {
    std::string cols;
    for (const auto& c : idx.shards[0].columns)
      cols += fmt::format("{}{}:{}->{}", cols.empty() ? "" : ", ", c.name, c.encoding,
                          c.role == Role::kKey ? "key" : c.ext);
    info.extra["columns"] = cols;
  }
  info.extra["index"] = idx.index_path;
  if (!idx.transform.empty()) info.extra["transform"] = idx.transform;  // as shardkit.json records it
  // Decoded arrays: the order shardkit.json records, or mds.channels.
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder(idx.channel_order, "shardkit.json", "mds.channels", opts, &info));
  auto shared = std::make_shared<const Index>(std::move(idx));
  std::unique_ptr<Dataset> ds = std::make_unique<MdsDataset>(std::move(shared), std::move(fs), info);
  if (to_rgb) return WithBgrToRgb(std::move(ds), std::move(info));
  return ds;
}

Result<std::vector<SampleExtent>> LocateSamples(const std::string& shard_path, int64_t) {
  Target t = Resolve(shard_path);
  if (t.dir.empty()) return Status::NotFound("not an MDS shard", Location{.file = shard_path});
  SK_ASSIGN_OR_RETURN(auto fs, io::FileSystemOf(t.dir));
  SK_ASSIGN_OR_RETURN(Index idx, ReadIndex(t.dir, fs));
  for (const auto& m : idx.shards) {
    if (m.path != shard_path && m.path != t.dir + "/" + t.shard_file) continue;
    SK_ASSIGN_OR_RETURN(auto d, LoadShard(m, fs, LoadOptions{}));
    std::vector<SampleExtent> out;
    Sample s;
    for (uint64_t i = 0; i < m.samples; ++i) {
      SK_RETURN_IF_ERROR(DecodeSample(*d, m, i, &s));
      out.push_back(SampleExtent{s.key, d->offset(i)});
    }
    return out;
  }
  return Status::NotFound("index.json lists no such shard", Location{.file = shard_path});
}

}  // namespace shardkit::formats::mds
