// Internal: the random-access index of a sharded dataset within a memory
// budget (issue 15): the wds reader's per-shard indexes are loaded on demand
// and kept in a least-recently-used cache of a stated size, so that a rank
// reading a dataset of 10^9 samples holds only the counts of its shards (8
// bytes a shard) and the indexes of the shards it read last.
//
//  - ShardLocator: global sample index -> (shard, index in the shard), from the
//    per-shard sample counts (the manifest's, or each .idx's), by binary search
//    over their prefix sums. Nothing per sample.
//  - CompactShardIndex: one shard's index in flat arrays in one block of
//    memory (keys one after another, offsets and sizes in arrays, fields'
//    extensions as a byte into a small per-shard table): 12 + key length + 17
//    per field bytes a sample (a 2-field sample with a 10-character key: 56
//    bytes; the std::vector/std::string ShardIndex it is made from takes ~176).
//    A block of 32 KiB or more is an anonymous mapping of its own, given back
//    to the system when the index is evicted (from malloc, blocks made by one
//    thread and freed by another would stay in the first thread's arena).
//  - ShardIndexCache: the LRU of compact indexes, bounded by a byte budget
//    (IndexBudgetOf: OpenOptions::format_options["wds.index_budget"], else
//    kDefaultIndexBudget; "64MiB", "1GB", a number of bytes; the library reads no
//    environment: the CLI and Python turn SHARDKIT_INDEX_BUDGET into the option). Whole shard indexes are evicted, least recently
//    used first; the one just loaded is always kept, so a budget smaller than
//    one shard's index still works, one shard at a time (the budget is then
//    exceeded by that one index).
//
// Thread safety: ShardIndexCache::Get, Put and stats may be called from any
// number of threads at once. A shard's index is loaded once however many
// threads ask for it at the same time (the others wait for that load), and
// outside the cache's lock, so loads of distinct shards run in parallel. Get
// returns a shared_ptr: an index stays valid while a caller holds it, even
// after the cache has evicted it (its bytes then no longer count against the
// budget; a caller holds it only while it reads a sample). Errors are not
// cached: the next Get loads again. ShardLocator and CompactShardIndex are
// immutable once built.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/wds/shard_index.h"
#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

inline constexpr uint64_t kDefaultIndexBudget = 64ull << 20;  // 64 MiB

// The budget for a dataset opened with `opts` (see above); kInvalidArgument
// naming the setting when its value does not parse.
Result<uint64_t> IndexBudgetOf(const OpenOptions& opts);

class ShardLocator {
 public:
  ShardLocator() = default;
  explicit ShardLocator(const std::vector<uint64_t>& counts);
  uint64_t size() const { return total_; }
  size_t shards() const { return firsts_.size(); }
  uint64_t first(size_t shard) const { return firsts_[shard]; }
  // The shard holding global index i (< size()) and i's index in it.
  std::pair<size_t, uint64_t> Locate(uint64_t i) const;

 private:
  std::vector<uint64_t> firsts_;  // first global index of each shard
  uint64_t total_ = 0;
};

class CompactShardIndex {
 public:
  struct Field {
    uint64_t offset = 0;  // of the data
    uint64_t size = 0;
  };
  // The compact form of `idx`; kUnsupported when a shard exceeds the compact
  // form's limits (4 GiB of keys or 2^32 members, 255 extensions).
  static Result<std::shared_ptr<const CompactShardIndex>> From(const ShardIndex& idx, int64_t shard);

  CompactShardIndex() = default;
  CompactShardIndex(const CompactShardIndex&) = delete;
  CompactShardIndex& operator=(const CompactShardIndex&) = delete;
  ~CompactShardIndex();

  size_t size() const { return n_; }
  std::string_view key(size_t i) const {
    uint32_t a = i ? key_ends_[i - 1] : 0;
    return std::string_view(keys_ + a, key_ends_[i] - a);
  }
  uint64_t offset(size_t i) const { return fields_[field_begin(i)].offset - header_[i]; }
  size_t field_begin(size_t i) const { return i ? field_ends_[i - 1] : 0; }
  size_t field_end(size_t i) const { return field_ends_[i]; }
  const Field& field(size_t f) const { return fields_[f]; }
  const std::string& ext(size_t f) const { return exts_[ext_of_[f]]; }
  // Sample i as the reader's SampleRef (allocates: for header checks and remote reads).
  SampleRef Ref(size_t i) const;
  // Bytes this index holds (its arrays' capacities and the object).
  uint64_t bytes() const { return bytes_; }
  uint64_t file_size() const { return file_size_; }

 private:
  // All in block_ (block_size_ bytes; mapped_: an anonymous mapping, else new[]):
  Field* fields_ = nullptr;         // per member
  uint32_t* key_ends_ = nullptr;    // per sample: end of its key in keys_
  uint32_t* header_ = nullptr;      // per sample: first field's data offset - the sample's offset
  uint32_t* field_ends_ = nullptr;  // per sample: end of its fields in fields_
  uint8_t* ext_of_ = nullptr;       // per member: its extension in exts_
  char* keys_ = nullptr;            // every key, one after another
  void* block_ = nullptr;
  size_t block_size_ = 0;
  bool mapped_ = false;
  size_t n_ = 0;
  std::vector<std::string> exts_;
  uint64_t file_size_ = 0;
  uint64_t bytes_ = 0;
};

// Fills *out with sample i of `idx` as views of `map`; `owner` keeps `map` alive.
void FillSample(const io::MappedFile& map, const std::shared_ptr<const void>& owner, const CompactShardIndex& idx,
                size_t i, Sample* out);

class ShardIndexCache {
 public:
  using Index = std::shared_ptr<const CompactShardIndex>;
  using Loader = std::function<Result<Index>(size_t shard)>;
  struct Stats {
    uint64_t budget = 0;
    uint64_t bytes = 0;      // held by the cache now
    uint64_t peak_bytes = 0; // the most it held at once
    size_t entries = 0;
    uint64_t hits = 0, loads = 0, evictions = 0;
  };

  ShardIndexCache(uint64_t budget, Loader loader) : budget_(budget), loader_(std::move(loader)) {}
  ShardIndexCache(const ShardIndexCache&) = delete;
  ShardIndexCache& operator=(const ShardIndexCache&) = delete;

  // Shard `shard`'s index: the cached one, else loaded (by this thread, or by
  // another already loading it).
  Result<Index> Get(size_t shard);
  // Offers an index already made (e.g. a shard scanned at open): kept like a
  // load, unless the shard is cached already.
  void Put(size_t shard, Index idx);
  Stats stats() const;
  uint64_t budget() const { return budget_; }

 private:
  struct Entry {
    Index index;  // null while loading
    std::list<size_t>::iterator lru;
  };
  void InsertLocked(size_t shard, Index idx);  // the slot exists (loading or new)

  const uint64_t budget_;
  Loader loader_;
  mutable std::mutex mu_;
  std::condition_variable loaded_;
  std::unordered_map<size_t, Entry> map_;
  std::list<size_t> lru_;  // most recently used first; loaded entries only
  uint64_t bytes_ = 0, peak_ = 0, hits_ = 0, loads_ = 0, evictions_ = 0;
};

}  // namespace shardkit::formats::wds
