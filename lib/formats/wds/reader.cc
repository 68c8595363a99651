// Reading wds shards (reader.h): a sequential reader over mapped, ranged and
// streamed shards, and random access through their indexes.
//
// Opening is lazy: a shard's index comes from its .idx (parsed, trusted: its
// member headers are not read) or the manifest's counts, so opening a dataset
// reads no shard bytes when indexes are there. A shard is opened on its first
// random read: mapped (a local file, or a remote one's copy in the cache), or,
// remote without a cache, opened for range requests. Its index is loaded on
// demand into the dataset's index cache (index_cache.h: an LRU within a byte
// budget, so a dataset of 10^9 samples is not held whole): checked against the
// member headers (else scanned), or, remote without a cache, fetched, each
// sample's headers then checked when the sample's byte range is read; an
// evicted index is loaded again the same way. `verify` reads every shard in order and so
// checks everything.
#include "formats/wds/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "io/any_file.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "formats/tar/tar.h"
#include "formats/wds/index.h"
#include "formats/wds/index_cache.h"
#include "formats/wds/manifest.h"
#include "formats/channel_order.h"
#include "formats/wds/names.h"
#include "formats/wds/pipe.h"
#include "formats/wds/ranged.h"
#include "formats/wds/shard_index.h"
#include "io/shard_cache.h"

namespace shardkit::formats::wds {

namespace {

Result<uint64_t> FileSize(const std::string& path, int64_t shard);

// One shard of an opened dataset, opened on first use (its index lives in
// Shards::indexes, loaded on demand and evicted within the budget).
struct ShardState {
  std::string path;  // as addressed (a local path or a URL)
  int64_t number = 0;
  uint64_t size = 0;                 // at open (stat, HEAD, or the manifest)
  std::optional<uint64_t> samples;   // at open (an index or the manifest), if known
  std::string checksum;              // "xxh3:..." of the whole shard (the manifest's), or empty
  std::mutex mu;
  std::atomic<bool> ready{false};
  Status status;
  std::shared_ptr<io::MappedFile> map;        // local, or the cache's copy
  std::shared_ptr<ReadableFile> remote;       // remote and no cache: ranged reads
  std::atomic<bool> check_headers{false};     // check each sample's member headers when it is read
};

struct Shards {
  std::vector<std::unique_ptr<ShardState>> list;
  io::CacheOptions cache;
  std::unique_ptr<ShardIndexCache> indexes;  // made at open (MakeIndexCache), loads through this object
};

// The index text beside a shard (local or remote), or kNotFound.
Result<std::string> IdxText(const std::string& shard_path) {
  std::string idx_path = IdxPathFor(shard_path);
  if (!io::IsUrl(idx_path)) {
    if (!io::Exists(idx_path)) return Status::NotFound("no index", Location{.file = idx_path});
    return io::ReadFile(idx_path);
  }
  return io::ReadAnyFile(idx_path);
}

// Opens a shard for random reads: maps it (a remote one's cached copy), or, remote
// without a cache, opens it for range requests. Once per shard (EnsureOpened).
Status OpenShard(ShardState& s, const io::CacheOptions& cache) {
  Location where{.file = s.path, .shard = s.number};
  std::string local = s.path;
  if (io::IsUrl(s.path)) {
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(s.path));
    if (cache.dir.empty()) {
      SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(s.path));
      if (f->size() != s.size)
        return Status::Corrupt(fmt::format("shard has {} bytes but had {} when the dataset was opened", f->size(), s.size),
                               where);
      s.remote = std::shared_ptr<ReadableFile>(std::move(f));
      return Status::OK();
    }
    SK_ASSIGN_OR_RETURN(local, io::CachedCopy(*fs, s.path, s.size, cache, s.checksum));
  }
  SK_ASSIGN_OR_RETURN(s.map, MapShard(local, s.number));
  if (s.map->size() != s.size)
    return Status::Corrupt(
        fmt::format("shard has {} bytes but had {} when the dataset was opened", s.map->size(), s.size), where);
  return Status::OK();
}

Status EnsureOpened(ShardState& s, const io::CacheOptions& cache) {
  if (s.ready.load(std::memory_order_acquire)) return s.status;
  std::lock_guard lock(s.mu);
  if (!s.ready.load(std::memory_order_relaxed)) {
    s.status = OpenShard(s, cache);
    s.ready.store(true, std::memory_order_release);
  }
  return s.status;
}

// Builds an opened shard's index (on its first read, and again after an eviction):
// its .idx checked against the member headers, else a scan; remote without a cache,
// the .idx as is.
Result<ShardIndex> BuildIndex(ShardState& s) {
  Location where{.file = s.path, .shard = s.number};
  ShardIndex built;
  if (s.remote) {
    auto text = IdxText(s.path);
    if (!text.ok()) {
      if (text.status().code() != Code::kNotFound) return std::move(text).take_status();
      return Status::Unsupported(
          fmt::format("remote shard has no index ({}): random access by range requests needs one; write it with "
                      "`shardkit index`, or pass a cache directory (--cache-dir / cache_dir=) to read a local copy",
                      BaseOf(IdxPathFor(s.path))),
          where);
    }
    SK_ASSIGN_OR_RETURN(built, ParseIdx(*text, IdxPathFor(s.path), s.path, s.size, nullptr, s.number));
  } else {
    bool have = false;
    auto text = IdxText(s.path);
    if (text.ok()) {
      auto r = ParseIdx(*text, IdxPathFor(s.path), s.path, s.size, s.map->data(), s.number);
      if (r.ok()) {
        built = std::move(r).value();
        have = true;
      }
    }
    if (!have) {
      auto scanned = ScanShard(*s.map, s.number);
      if (scanned.ok()) {
        built = std::move(scanned).value();
      } else if (auto trusted = text.ok() ? ParseIdx(*text, IdxPathFor(s.path), s.path, s.size, nullptr, s.number)
                                          : Result<ShardIndex>(scanned.status());
                 trusted.ok() && (!s.samples || trusted->samples.size() == *s.samples)) {
        // A damaged member somewhere in an indexed shard: the other samples stay
        // readable; each sample's headers are checked when it is read.
        built = std::move(trusted).value();
        s.check_headers.store(true, std::memory_order_release);
      } else {
        return std::move(scanned).take_status();
      }
    }
  }
  if (s.samples && built.samples.size() != *s.samples)
    return Status::Corrupt(fmt::format("shard holds {} samples but its index or manifest said {} when the dataset was "
                                       "opened (the shard or its .idx changed?)",
                                       built.samples.size(), *s.samples),
                           where);
  return built;
}

// The dataset's index cache: a shard's index is opened, built and made compact on demand.
Status MakeIndexCache(Shards& shards, const OpenOptions& opts) {
  SK_ASSIGN_OR_RETURN(uint64_t budget, IndexBudgetOf(opts));
  Shards* sh = &shards;  // owns the cache, so outlives every load
  shards.indexes = std::make_unique<ShardIndexCache>(budget, [sh](size_t k) -> Result<ShardIndexCache::Index> {
    ShardState& s = *sh->list[k];
    SK_RETURN_IF_ERROR(EnsureOpened(s, sh->cache));
    SK_ASSIGN_OR_RETURN(ShardIndex idx, BuildIndex(s));
    return CompactShardIndex::From(idx, s.number);
  });
  return Status::OK();
}

class WdsReader : public SampleReader {
 public:
  // checksums: each shard's "xxh3:..." (a manifest's), or empty.
  WdsReader(std::vector<std::string> paths, io::CacheOptions cache, std::vector<std::string> checksums)
      : paths_(std::move(paths)), cache_(std::move(cache)), checksums_(std::move(checksums)) {}

  Result<bool> Next(Sample* out) override {
    for (;;) {
      if (stream_) {
        SK_ASSIGN_OR_RETURN(bool more, stream_->Next(out));
        if (more) return true;
        stream_.reset();  // a pipe: the command has exited with status 0; a ranged shard: its end
        continue;
      }
      if (!cursor_) {
        if (next_ >= paths_.size()) return false;
        if (IsPipe(paths_[next_])) {
          stream_ = NewPipeShardReader(paths_[next_], int64_t(next_));
          ++next_;
          continue;
        }
        std::string local = paths_[next_];
        if (io::IsUrl(local)) {
          if (cache_.dir.empty()) {
            stream_ = NewRangedShardReader(paths_[next_], int64_t(next_));
            ++next_;
            continue;
          }
          SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(local));
          SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(local));
          SK_ASSIGN_OR_RETURN(local, io::CachedCopy(*fs, paths_[next_], f->size(), cache_,
                                                    next_ < checksums_.size() ? checksums_[next_] : std::string()));
        }
        SK_ASSIGN_OR_RETURN(map_, MapShard(local, int64_t(next_)));
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
  io::CacheOptions cache_;
  std::vector<std::string> checksums_;
  size_t next_ = 0;
  std::shared_ptr<io::MappedFile> map_;
  std::unique_ptr<SampleCursor> cursor_;
  std::unique_ptr<SampleReader> stream_;  // a `pipe:` shard being read (destroying it stops the command), or a remote one
};

class WdsRandomAccess : public RandomAccess {
 public:
  explicit WdsRandomAccess(std::shared_ptr<Shards> shards) : shards_(std::move(shards)), owner_(shards_) {
    std::vector<uint64_t> counts;
    counts.reserve(shards_->list.size());
    for (auto& s : shards_->list) {
      counts.push_back(*s->samples);
      ranged_.push_back(shards_->cache.dir.empty() && io::IsUrl(s->path));
    }
    any_ranged_ = std::find(ranged_.begin(), ranged_.end(), true) != ranged_.end();
    locator_ = ShardLocator(counts);
  }
  ~WdsRandomAccess() override {
    {
      std::lock_guard<std::mutex> lk(ra_.mu);
      ra_.stop = true;
    }
    ra_.work.notify_all();
    ra_.done.notify_all();
    for (auto& t : ra_.threads) t.join();
  }
  uint64_t size() const override { return locator_.size(); }

  // Remote shards read by ranges (no cache): the hinted samples' range requests run on
  // threads of this object's own, oldest hint first: kReadAheadThreads started by the
  // first hint, one more (up to kReadAheadMaxThreads) each time a Get() finds its sample
  // not yet fetched while requests wait for a free thread (a store far away: the
  // requests in flight, not the client's CPU, are the limit). At most kReadAheadEntries
  // samples and kReadAheadBytes bytes are held (a full table takes no more hints; the
  // oldest fetched and never read are dropped first).
  // Get() takes a fetched sample, waits for one being fetched, and reads one still queued
  // itself (so a hint never delays a read); a failed fetch is read again by Get(), which
  // reports it. The destructor waits for the requests in flight (each bounded by the
  // client's timeouts and retry budget).
  void Prefetch(const uint64_t* indices, size_t n) const override {
    if (!any_ranged_ || n == 0) return;
    std::lock_guard<std::mutex> lk(ra_.mu);
    if (ra_.stop) return;
    if (ra_.threads.empty()) {
      for (int t = 0; t < kReadAheadThreads; ++t) AddReaderLocked();
      if (ra_.threads.empty()) return;  // no threads to spare: Get() reads as before
    }
    PruneOrderLocked();
    size_t queued = 0;
    for (size_t j = 0; j < n; ++j) {
      const uint64_t i = indices[j];
      if (i >= locator_.size() || !ranged_[locator_.Locate(i).first] || ra_.table.count(i)) continue;
      bool room = true;
      while (room && (ra_.table.size() >= kReadAheadEntries || ra_.bytes >= kReadAheadBytes))
        room = DropOldestFetchedLocked();
      if (!room) break;  // all in flight or queued: no more hints now
      ra_.table.emplace(i, std::make_shared<Fetch>());
      ra_.queue.push_back(i);
      ra_.order.push_back(i);
      ++queued;
    }
    // As many reader threads as there are new requests (each wake-up is a context switch:
    // on a loaded machine a thundering herd costs the decoders more than the requests).
    if (queued >= ra_.threads.size()) {
      ra_.work.notify_all();
    } else {
      for (size_t j = 0; j < queued; ++j) ra_.work.notify_one();
    }
  }

  Status Get(uint64_t i, Sample* out) const override {
    if (i >= locator_.size())
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", i, locator_.size()),
                             Location{.index = int64_t(i)});
    auto [k, local] = locator_.Locate(i);
    ShardState& s = *shards_->list[k];
    SK_RETURN_IF_ERROR(EnsureOpened(s, shards_->cache));
    // This thread's last shard's index, held by this thread (an eviction by another
    // thread cannot free it); another shard's comes from the cache. Consecutive reads
    // of one shard then touch no lock and no shared reference count.
    SK_ASSIGN_OR_RETURN(std::shared_ptr<LastIndex> mine, last_.Get([]() -> Result<std::shared_ptr<LastIndex>> {
      return std::make_shared<LastIndex>();
    }));
    if (mine->shard != k || !mine->index) {
      mine->index.reset();
      SK_ASSIGN_OR_RETURN(mine->index, shards_->indexes->Get(k));
      mine->shard = k;
    }
    const CompactShardIndex* idx = mine->index.get();
    if (s.map && s.check_headers.load(std::memory_order_acquire)) {
      uint64_t off = idx->offset(local);
      SK_RETURN_IF_ERROR(CheckSampleHeaders(s.map->data() + off, s.map->size() - off, idx->Ref(local), s.path,
                                            s.number, false));
    }
    if (s.map) {
      // The views' owner keeps every shard's mapping alive, through a control block of this
      // thread's own (lib/core/per_thread.h).
      FillSample(*s.map, owner_.Owner(), *idx, local, out);
      return Status::OK();
    }
    // Remote: the sample's members (headers and data) in one range request, made ahead
    // by Prefetch or now.
    const SampleRef ref = idx->Ref(local);
    const FieldRef& last = ref.fields.back();
    const uint64_t length = last.offset + last.size - ref.offset;
    Block buf = TakeFetched(i);
    if (!buf.data) {
      SK_ASSIGN_OR_RETURN(buf, ReadRange(s, ref));
    }
    const auto* base = reinterpret_cast<const uint8_t*>(buf.data.get());
    SK_RETURN_IF_ERROR(CheckSampleHeaders(base, length, ref, s.path, s.number, true));
    out->clear();
    out->key = ref.key;
    std::shared_ptr<const void> owner(buf.data, buf.data.get());
    for (const auto& f : ref.fields) out->set(f.ext, Bytes(owner, base + (f.offset - ref.offset), f.size));
    return Status::OK();
  }

 private:
  // A thread's last index (its slot of last_): at most one shard's index per thread
  // is held beyond the cache's budget.
  struct alignas(64) LastIndex {
    size_t shard = 0;
    ShardIndexCache::Index index;
  };
  // A remote sample's bytes: read into memory that is not zeroed first.
  struct Block {
    std::shared_ptr<char[]> data;
    size_t size = 0;
  };
  // The sample's members, headers and data, in one range request of a remote shard.
  static Result<Block> ReadRange(ShardState& s, const SampleRef& ref) {
    const FieldRef& last = ref.fields.back();
    const uint64_t length = last.offset + last.size - ref.offset;
    Block buf{std::make_shared_for_overwrite<char[]>(size_t(length)), size_t(length)};  // (no zero fill)
    SK_ASSIGN_OR_RETURN(size_t n, s.remote->ReadAt(ref.offset, size_t(length), buf.data.get()));
    if (n != length)
      return Status::IOError(fmt::format("short read: {} of {} bytes", n, length),
                             Location{.file = s.path, .shard = s.number, .offset = int64_t(ref.offset), .key = ref.key});
    return buf;
  }

  // Read-ahead (Prefetch). A table entry is queued, then being fetched, then fetched
  // (bytes, or an error that Get() meets again by reading itself).
  static constexpr int kReadAheadThreads = 8, kReadAheadMaxThreads = 64;
  static constexpr size_t kReadAheadEntries = 4096;
  static constexpr uint64_t kReadAheadBytes = uint64_t(256) << 20;
  struct Fetch {
    enum { kQueued, kRunning, kDone } state = kQueued;
    Block bytes;  // null: the fetch failed
  };
  struct ReadAheadState {
    std::mutex mu;
    std::condition_variable work;  // the reader threads: a request queued (or stop)
    std::condition_variable done;  // Get()s: a fetch done (or stop)
    int waiting = 0;               // Get()s waiting on `done`
    bool stop = false;
    std::unordered_map<uint64_t, std::shared_ptr<Fetch>> table;
    std::deque<uint64_t> queue;  // queued, in hint order (entries Get() took are skipped)
    std::deque<uint64_t> order;  // every entry, oldest first (for dropping)
    uint64_t bytes = 0;          // of fetched entries in the table
    std::vector<std::thread> threads;
  };

  // One more reader thread (ra_.mu held); none when the system has no thread to spare.
  void AddReaderLocked() const {
    try {
      ra_.threads.emplace_back([this] { ReadAheadLoop(); });
    } catch (const std::system_error&) {
    }
  }

  // Drops the oldest fetched entry (ra_.mu held); false when none is fetched.
  bool DropOldestFetchedLocked() const {
    for (size_t j = 0; j < ra_.order.size(); ++j) {
      auto t = ra_.table.find(ra_.order[j]);
      if (t == ra_.table.end() || t->second->state != Fetch::kDone) continue;
      ra_.bytes -= t->second->bytes.size;
      ra_.table.erase(t);
      ra_.order.erase(ra_.order.begin() + std::ptrdiff_t(j));
      return true;
    }
    return false;
  }

  // Keeps `order` short (ra_.mu held): entries Get() took leave its front; an entry
  // hinted and never read (a cancelled batch) is dropped once twice the table's size of
  // hints came after it.
  void PruneOrderLocked() const {
    while (!ra_.order.empty()) {
      auto t = ra_.table.find(ra_.order.front());
      if (t != ra_.table.end()) {
        if (ra_.order.size() <= 2 * kReadAheadEntries || t->second->state != Fetch::kDone) return;
        ra_.bytes -= t->second->bytes.size;
        ra_.table.erase(t);
      }
      ra_.order.pop_front();
    }
  }

  // Get()'s side: the fetched bytes of sample i, or null (not hinted, still queued: now
  // the caller's, or failed).
  Block TakeFetched(uint64_t i) const {
    std::unique_lock<std::mutex> lk(ra_.mu);
    auto t = ra_.table.find(i);
    if (t == ra_.table.end()) return {};
    std::shared_ptr<Fetch> f = t->second;
    // Behind: this sample is not fetched yet and other requests wait for a thread.
    if (f->state != Fetch::kDone && !ra_.queue.empty() && ra_.threads.size() < size_t(kReadAheadMaxThreads))
      AddReaderLocked();
    if (f->state == Fetch::kQueued) {  // a reader thread would start it later than we can
      ra_.table.erase(t);
      return {};
    }
    ++ra_.waiting;
    ra_.done.wait(lk, [&] { return f->state == Fetch::kDone || ra_.stop; });
    --ra_.waiting;
    if (f->state != Fetch::kDone) return {};
    ra_.table.erase(i);
    ra_.bytes -= f->bytes.size;
    return std::move(f->bytes);
  }

  void ReadAheadLoop() const {
    std::unique_lock<std::mutex> lk(ra_.mu);
    for (;;) {
      ra_.work.wait(lk, [&] { return ra_.stop || !ra_.queue.empty(); });
      if (ra_.stop) return;
      const uint64_t i = ra_.queue.front();
      ra_.queue.pop_front();
      auto t = ra_.table.find(i);
      if (t == ra_.table.end() || t->second->state != Fetch::kQueued) continue;
      std::shared_ptr<Fetch> f = t->second;
      f->state = Fetch::kRunning;
      lk.unlock();
      Block bytes;
      try {
        auto [k, local] = locator_.Locate(i);
        ShardState& s = *shards_->list[k];
        if (EnsureOpened(s, shards_->cache).ok() && s.remote) {
          auto index = shards_->indexes->Get(k);
          if (index.ok()) {
            auto r = ReadRange(s, index.value()->Ref(local));
            if (r.ok()) bytes = std::move(r).value();
          }
        }
      } catch (...) {  // (bad_alloc: Get() reads it again and reports)
      }
      lk.lock();
      f->bytes = std::move(bytes);
      f->state = Fetch::kDone;
      ra_.bytes += f->bytes.size;
      if (ra_.waiting) ra_.done.notify_all();  // (Get()s waiting for one of these)
    }
  }

  std::shared_ptr<Shards> shards_;
  core::PerThreadViewOwner owner_;
  core::PerThread<LastIndex> last_;
  ShardLocator locator_;
  std::vector<bool> ranged_;  // per shard: read by range requests (remote, no cache)
  bool any_ranged_ = false;
  mutable ReadAheadState ra_;
};

class WdsDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }

  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    std::vector<std::string> checksums;
    for (const auto& s : shards_->list) checksums.push_back(s->checksum);
    if (checksums.size() != paths_.size()) checksums.clear();
    return std::unique_ptr<SampleReader>(new WdsReader(paths_, shards_->cache, std::move(checksums)));
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
    for (const auto& s : shards_->list)
      if (!s->samples)
        return Status::Unsupported(
            fmt::format("remote shard has no index ({}), so it is read as a stream, in order only: random access "
                        "needs the .idx beside it (`shardkit index`), a manifest, or a cache directory "
                        "(--cache-dir / cache_dir=) to read a local copy",
                        BaseOf(IdxPathFor(s->path))),
            Location{.file = s->path, .shard = s->number});
    // A shard that changed size since it was indexed could SIGBUS a mapping: a stat each (no reads).
    for (const auto& s : shards_->list) {
      if (io::IsUrl(s->path)) continue;  // checked when the shard is first read
      SK_ASSIGN_OR_RETURN(uint64_t size, FileSize(s->path, s->number));
      if (size != s->size)
        return Status::Corrupt(fmt::format("shard changed size since it was indexed ({} -> {} bytes)", s->size, size),
                               Location{.file = s->path, .shard = s->number});
    }
    return std::shared_ptr<RandomAccess>(new WdsRandomAccess(shards_));
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

  DatasetInfo info_;
  std::vector<std::string> paths_;
  std::shared_ptr<Shards> shards_ = std::make_shared<Shards>();
};

Result<uint64_t> FileSize(const std::string& path, int64_t shard) {
  auto st = io::StatAny(path);
  if (!st.ok()) return Status(st.status()).At(Location{.file = path, .shard = shard});
  if (st->type == FileType::kNotFound) return Status::NotFound("shard does not exist", Location{.file = path, .shard = shard});
  if (st->type != FileType::kFile) return Status::Invalid("shard is not a regular file", Location{.file = path, .shard = shard});
  return st->size;
}

// A cheap look at a trusted index against its local shard at open, without
// mapping it (three blocks read): the first and the last indexed member header
// and the end-of-archive block after the last member. An index of another or a
// rewritten shard fails it; the shard is then scanned at open, as before.
bool SpotCheck(const std::string& path, const ShardIndex& idx) {
  // An index without samples proves nothing about the shard (a damaged or foreign .idx
  // may parse to none, and trusting it would drop every sample): scan instead.
  if (idx.samples.empty()) return false;
  auto opened = FileSystem::Local()->OpenForRead(path);
  if (!opened.ok()) return false;
  const ReadableFile& file = **opened;
  auto block_at = [&](uint64_t offset, uint8_t* b) {
    auto got = file.ReadAt(offset, tar::kBlock, b);
    return got.ok() && *got == tar::kBlock;
  };
  auto header_ok = [&](const FieldRef& f) {
    uint8_t b[tar::kBlock];
    uint64_t size = 0;
    char type = 0;
    // What LoadIdx checks of a header (size and type; not its checksum).
    bool ok = f.offset >= tar::kBlock && block_at(f.offset - tar::kBlock, b) && tar::ParseNumber(b + 124, 12, &size) &&
              size == f.size;
    if (ok) type = char(b[156]);
    return ok && (type == '0' || type == '\0');
  };
  const FieldRef& last = idx.samples.back().fields.back();
  uint64_t end = last.offset + (last.size + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
  uint8_t z[tar::kBlock];
  return header_ok(idx.samples.front().fields.front()) && header_ok(last) && block_at(end, z) &&
         std::all_of(z, z + sizeof z, [](uint8_t c) { return c == 0; });
}

bool HasSums(const std::string& first_shard) {
  std::string sp = SumsPath(first_shard);
  return io::IsUrl(sp) ? io::AnyExists(sp) : io::Exists(sp);
}

// OpenOptions' cache only: the library reads no environment (the CLI's --cache-dir /
// --cache-bytes and Python's cache_dir= set these options; both also turn
// SHARDKIT_CACHE_DIR / SHARDKIT_CACHE_BYTES into them).
io::CacheOptions CacheOf(const OpenOptions& opts) { return io::CacheOptions{opts.cache_dir, opts.cache_bytes}; }

Result<std::unique_ptr<Dataset>> OpenManifest(const std::string& path, const OpenOptions& opts) {
  auto ds = std::make_unique<WdsDataset>();
  ds->shards_->cache = CacheOf(opts);
  SK_RETURN_IF_ERROR(MakeIndexCache(*ds->shards_, opts));
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  std::string unreadable;
  SK_ASSIGN_OR_RETURN(Manifest m, ReadManifest(path, &unreadable, opts.trust_manifest));
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
    // A remote shard is trusted to be what the manifest says until it is read
    // (its size is checked then): no request per shard at open.
    uint64_t size = si.bytes;
    if (!io::IsUrl(si.path)) {
      SK_ASSIGN_OR_RETURN(size, FileSize(si.path, int64_t(i)));
    }
    if (size != si.bytes)
      return Status::Corrupt(fmt::format("shard has {} bytes but the manifest says {}", size, si.bytes),
                             Location{.file = si.path, .shard = int64_t(i)});
    info.total_bytes += size;
    ds->paths_.push_back(si.path);
    auto st = std::make_unique<ShardState>();
    st->path = si.path;
    st->number = int64_t(i);
    st->size = size;
    st->samples = si.samples;
    st->checksum = si.checksum;
    ds->shards_->list.push_back(std::move(st));
  }
  if (!ds->paths_.empty() && HasSums(ds->paths_[0])) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  if (!m.transform.empty()) info.extra["transform"] = m.transform;
  // Decoded arrays: the order the manifest records, or wds.channels.
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder(m.channel_order, "the manifest", "wds.channels", opts, &info));
  if (to_rgb) return WithBgrToRgb(std::move(ds), info);
  return std::unique_ptr<Dataset>(std::move(ds));
}

}  // namespace

Result<std::unique_ptr<Dataset>> OpenWds(const std::string& path, const OpenOptions& opts) {
  if (paths::EndsWith(path, ".manifest.json")) return OpenManifest(path, opts);
  SK_ASSIGN_OR_RETURN(std::vector<std::string> paths, paths::ExpandBraces(path));
  auto ds = std::make_unique<WdsDataset>();
  ds->shards_->cache = CacheOf(opts);
  SK_RETURN_IF_ERROR(MakeIndexCache(*ds->shards_, opts));
  DatasetInfo& info = ds->info_;
  info.format = "wds";
  info.address = path;
  ds->paths_ = paths;
  std::set<std::string> exts;
  uint64_t samples = 0, skipped = 0;
  size_t pipes = 0, streamed = 0;
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
    auto st = std::make_unique<ShardState>();
    st->path = paths[i];
    st->number = int64_t(i);
    SK_ASSIGN_OR_RETURN(st->size, FileSize(paths[i], int64_t(i)));
    // The .idx, trusted (its member headers are checked when the shard is first read).
    std::shared_ptr<const ShardIndex> idx;
    auto text = IdxText(paths[i]);
    if (text.ok()) {
      auto r = ParseIdx(*text, IdxPathFor(paths[i]), paths[i], st->size, nullptr, int64_t(i));
      if (r.ok() && (io::IsUrl(paths[i]) || SpotCheck(paths[i], *r))) idx = std::make_shared<ShardIndex>(std::move(r).value());
    } else if (text.status().code() != Code::kNotFound && io::IsUrl(paths[i])) {
      return std::move(text).take_status();
    }
    if (!idx && (!io::IsUrl(paths[i]) || !ds->shards_->cache.dir.empty())) {
      // No usable index: scan the shard (this maps and reads it; a remote one from the cache's copy).
      std::string local = paths[i];
      if (io::IsUrl(local)) {
        SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(local));
        SK_ASSIGN_OR_RETURN(local, io::CachedCopy(*fs, paths[i], st->size, ds->shards_->cache));
      }
      SK_ASSIGN_OR_RETURN(auto map, MapShard(local, int64_t(i)));
      SK_ASSIGN_OR_RETURN(auto scanned, ScanShard(*map, int64_t(i)));
      idx = std::make_shared<ShardIndex>(std::move(scanned));
      if (map->size() == st->size) {
        // Opened, and its index offered to the cache (kept within the budget; rebuilt if evicted).
        st->map = map;
        st->ready.store(true);
        if (auto c = CompactShardIndex::From(*idx, int64_t(i)); c.ok())
          ds->shards_->indexes->Put(ds->shards_->list.size(), *c);
      }
    }
    if (idx) {
      st->samples = idx->samples.size();
      exts.insert(idx->exts.begin(), idx->exts.end());
      samples += idx->samples.size();
      skipped += idx->skipped;
      info.shards.push_back(ShardInfo{paths[i], idx->samples.size(), idx->file_size, "", "wds:" + paths[i]});
    } else {
      ++streamed;  // a remote shard without an index: read in order, as a stream
      info.shards.push_back(ShardInfo{paths[i], 0, st->size, "", "wds:" + paths[i]});
    }
    info.total_bytes += st->size;
    ds->shards_->list.push_back(std::move(st));
  }
  if (pipes == 0 && streamed == 0) {
    info.num_samples = samples;
    info.fields.assign(exts.begin(), exts.end());
  } else if (pipes) {
    // Sample count and fields are known only once the streams have been read.
    info.extra["access"] = "sequential: pipe: shards are streamed from a command, with no random access";
  } else {
    info.extra["access"] = "sequential: remote shards without an index are streamed, with no random access";
  }
  if (skipped) info.extra["skipped_members"] = std::to_string(skipped);
  if (!ds->paths_.empty() && !IsPipe(ds->paths_[0]) && HasSums(ds->paths_[0])) {
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = "a .xxh3 list beside each shard";
  }
  // Shards without their manifest record no channel order: wds.channels may say it.
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder("", path, "wds.channels", opts, &info));
  if (to_rgb) return WithBgrToRgb(std::move(ds), info);
  return std::unique_ptr<Dataset>(std::move(ds));
}
}  // namespace shardkit::formats::wds
