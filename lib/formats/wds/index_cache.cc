// The random-access index within a budget (index_cache.h).
#include "core/front_end.h"
#include "formats/wds/index_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "shardkit/convert.h"

namespace shardkit::formats::wds {

Result<uint64_t> IndexBudgetOf(const OpenOptions& opts) {
  // The option only: the library reads no environment (the CLI and Python turn
  // SHARDKIT_INDEX_BUDGET into this option).
  auto it = opts.format_options.find("wds.index_budget");
  if (it == opts.format_options.end()) return kDefaultIndexBudget;
  const std::string& text = it->second;
  auto r = ParseByteSize(text);
  if (!r.ok())
    return Status::Invalid(fmt::format("wds.index_budget '{}' is not a size (the random-access index's memory budget, "
                                       "e.g. 64MiB, 1GB or a number of bytes)",
                                       text));
  return *r;
}

ShardLocator::ShardLocator(const std::vector<uint64_t>& counts) {
  firsts_.reserve(counts.size());
  for (uint64_t c : counts) {
    firsts_.push_back(total_);
    total_ += c;
  }
}

std::pair<size_t, uint64_t> ShardLocator::Locate(uint64_t i) const {
  // The last shard whose first index is <= i (empty shards share their first with the next).
  size_t k = size_t(std::upper_bound(firsts_.begin(), firsts_.end(), i) - firsts_.begin()) - 1;
  return {k, i - firsts_[k]};
}

namespace {
constexpr size_t kMapAtLeast = 32 << 10;  // blocks this large are mappings of their own
}  // namespace

CompactShardIndex::~CompactShardIndex() {
  if (mapped_) ::munmap(block_, block_size_);
  else delete[] static_cast<char*>(block_);
}

Result<std::shared_ptr<const CompactShardIndex>> CompactShardIndex::From(const ShardIndex& idx, int64_t shard) {
  auto c = std::make_shared<CompactShardIndex>();
  auto too_big = [&](const char* what) {
    return Status::Unsupported(fmt::format("shard's index is too large for the reader's compact index ({})", what),
                               Location{.file = idx.path, .shard = shard});
  };
  const size_t n = idx.samples.size();
  size_t keys = 0, members = 0;
  for (const auto& s : idx.samples) {
    keys += s.key.size();
    members += s.fields.size();
    if (s.fields.empty() || s.fields.front().offset < s.offset || s.fields.front().offset - s.offset > UINT32_MAX)
      return Status::Corrupt(fmt::format("sample '{}' has no field after its header", s.key),
                             Location{.file = idx.path, .shard = shard, .offset = int64_t(s.offset), .key = s.key});
  }
  if (keys > UINT32_MAX) return too_big("over 4 GiB of keys");
  if (members > UINT32_MAX) return too_big("over 2^32 members");
  // One block: fields (8-aligned), three arrays of uint32 per sample, a byte per member, the keys.
  const size_t size = members * sizeof(Field) + 3 * n * sizeof(uint32_t) + members + keys;
  if (size >= kMapAtLeast) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return Status::FromErrno(errno, fmt::format("cannot map {} bytes for the shard's index", size),
                               Location{.file = idx.path, .shard = shard});
    c->block_ = p;
    c->mapped_ = true;
  } else {
    c->block_ = new char[size ? size : 1];
  }
  c->block_size_ = size;
  char* at = static_cast<char*>(c->block_);
  c->fields_ = reinterpret_cast<Field*>(at);
  at += members * sizeof(Field);
  c->key_ends_ = reinterpret_cast<uint32_t*>(at);
  at += n * sizeof(uint32_t);
  c->header_ = reinterpret_cast<uint32_t*>(at);
  at += n * sizeof(uint32_t);
  c->field_ends_ = reinterpret_cast<uint32_t*>(at);
  at += n * sizeof(uint32_t);
  c->ext_of_ = reinterpret_cast<uint8_t*>(at);
  at += members;
  c->keys_ = at;
  c->n_ = n;
  uint32_t key_end = 0, field_end = 0;
  for (size_t i = 0; i < n; ++i) {
    const SampleRef& s = idx.samples[i];
    std::memcpy(c->keys_ + key_end, s.key.data(), s.key.size());
    key_end += uint32_t(s.key.size());
    c->key_ends_[i] = key_end;
    c->header_[i] = uint32_t(s.fields.front().offset - s.offset);
    for (const auto& f : s.fields) {
      size_t e = std::find(c->exts_.begin(), c->exts_.end(), f.ext) - c->exts_.begin();
      if (e == c->exts_.size()) {
        if (e == 255) return too_big("over 255 distinct extensions");
        c->exts_.push_back(f.ext);
      }
      c->ext_of_[field_end] = uint8_t(e);
      c->fields_[field_end] = Field{f.offset, f.size};
      ++field_end;
    }
    c->field_ends_[i] = field_end;
  }
  c->file_size_ = idx.file_size;
  uint64_t b = sizeof(CompactShardIndex) + (c->mapped_ ? (size + 4095) / 4096 * 4096 : size);
  for (const auto& e : c->exts_) b += sizeof(std::string) + e.capacity();
  c->bytes_ = b;
  return std::shared_ptr<const CompactShardIndex>(std::move(c));
}

SampleRef CompactShardIndex::Ref(size_t i) const {
  SampleRef r;
  r.key = std::string(key(i));
  r.offset = offset(i);
  for (size_t f = field_begin(i); f < field_end(i); ++f)
    r.fields.push_back(FieldRef{ext(f), fields_[f].offset, fields_[f].size});
  return r;
}

void FillSample(const io::MappedFile& map, const std::shared_ptr<const void>& owner, const CompactShardIndex& idx,
                size_t i, Sample* out) {
  out->clear();
  out->key = idx.key(i);
  for (size_t f = idx.field_begin(i); f < idx.field_end(i); ++f) {
    const auto& fr = idx.field(f);
    out->set(idx.ext(f), Bytes(owner, map.data() + fr.offset, fr.size));
  }
}

Result<ShardIndexCache::Index> ShardIndexCache::Get(size_t shard) {
  std::unique_lock lock(mu_);
  for (;;) {
    auto it = map_.find(shard);
    if (it == map_.end()) break;
    if (it->second.index) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.index;
    }
    loaded_.wait(lock);  // another thread is loading it; then look again (it may have failed)
  }
  map_.emplace(shard, Entry{nullptr, lru_.end()});
  lock.unlock();
  Result<Index> r = Status::Internal("index loader did not run");
  try {
    r = loader_(shard);
    if (r.ok() && !*r) r = Status::Internal("index loader returned no index");
  } catch (...) {
    lock.lock();
    map_.erase(shard);
    loaded_.notify_all();
    throw;
  }
  lock.lock();
  if (!r.ok()) {
    map_.erase(shard);
  } else {
    ++loads_;
    InsertLocked(shard, *r);
  }
  loaded_.notify_all();
  return r;
}

void ShardIndexCache::Put(size_t shard, Index idx) {
  if (!idx) return;
  std::lock_guard lock(mu_);
  if (map_.count(shard)) return;
  map_.emplace(shard, Entry{nullptr, lru_.end()});
  InsertLocked(shard, std::move(idx));
}

void ShardIndexCache::InsertLocked(size_t shard, Index idx) {
  Entry& e = map_.at(shard);
  bytes_ += idx->bytes();
  e.index = std::move(idx);
  lru_.push_front(shard);
  e.lru = lru_.begin();
  // Evict the least recently used until within budget; the newest always stays.
  while (bytes_ > budget_ && lru_.size() > 1) {
    size_t victim = lru_.back();
    lru_.pop_back();
    auto v = map_.find(victim);
    bytes_ -= v->second.index->bytes();
    map_.erase(v);
    ++evictions_;
  }
  peak_ = std::max(peak_, bytes_);
}

ShardIndexCache::Stats ShardIndexCache::stats() const {
  std::lock_guard lock(mu_);
  return Stats{budget_, bytes_, peak_, lru_.size(), hits_, loads_, evictions_};
}

}  // namespace shardkit::formats::wds
