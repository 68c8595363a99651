// formats/lmdb/internal.h (internal to lib/formats/lmdb/): what the lmdb format's files
// share. The format's layouts and its read and write rules are described in format.cc's
// header comment and docs/formats-lmdb.md.
//
//   env.cc      LMDB return codes as Status, the data file's meta-page check, whole-file
//               hashing, image header facts; the shared read-only environment (Env) is here
//   records.cc  value decoders: shardkit msgpack records, caffe Datums, wild layouts
//   reader.cc   the Dataset, its sequential reader and random access
//   writer.cc   the writer (transactions, durable points, resume)
//   format.cc   content bids and the registry row
//
// Thread safety: as stated on each declaration; Env is shared by every reader of one
// environment (its read transactions live in a pool it owns).
#pragma once

#include <lmdb.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/any_file.h"
#include "core/paths.h"
#include "formats/caffe.pb.h"
#include "formats/lmdb/lmdb.h"
#include "formats/lmdb/wild.h"
#include "formats/registry.h"
#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::lmdb {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The test knobs of lmdb.h (0: the default).
extern std::atomic<size_t> g_initial_map;
extern std::atomic<size_t> g_batch_samples;
extern std::atomic<size_t> g_durable_bytes;

inline constexpr const char* kMetaName = "shardkit.json";
inline constexpr const char* kResumeName = "resume.json";  // in "<dir>.partial" while writing
inline constexpr int kFormatVersion = 1;
inline constexpr size_t kDefaultMapSize = sizeof(size_t) >= 8 ? (size_t(1) << 40) : (size_t(1) << 30);
// Small transactions: without MDB_WRITEMAP a commit copies its dirty pages into
// the page cache (pwritev), and that copy is cheapest while they are still in the
// CPU cache. 2 MiB measured about 30% less CPU per conversion than 64 MiB here
// (docs/formats-lmdb.md). A commit that is not a durable point costs no sync.
inline constexpr size_t kBatchBytes = 2 << 20;
inline constexpr size_t kDefaultBatchSamples = 1000;
// A durable point (mdb_env_sync + resume.json) after this much payload or time
// since the last one. Commits in between are not synced: a crash loses at most
// this much work for --resume, and the conversion does not wait on the disk
// once per transaction. Finish() always syncs.
inline constexpr uint64_t kDurableBytes = uint64_t(1) << 30;
inline constexpr double kDurableSeconds = 30.0;
// Every this much committed payload, start the kernel's writeback of data.mdb
// (sync_file_range WRITE: it waits for nothing), so that the sync of a durable
// point or of Finish() finds most pages already on their way to the disk.
inline constexpr uint64_t kWritebackBytes = 32 << 20;

// A record's location with the sample key (the LMDB key stays in the message).
Location SampleLoc(Location loc, const std::string& sample_key);
bool IsMdbCorruption(int rc);
// An LMDB return code as a Status.
Status MdbStatus(int rc, std::string_view what, Location where);
// The shardkit layout's LMDB key of sample i: "%010d".
std::string IndexKey(uint64_t i);
// XXH3-64 of a whole file (the same value as paths::HashFile), read through a
// populated read-only mapping: no copy out of the page cache.
Result<uint64_t> HashMapped(const std::string& path);

// Image header facts for the caffe layout (0 where the header does not say).
struct ImageShape {
  int channels = 0, height = 0, width = 0;
};
ImageShape PeekShape(tjhandle tj, const Bytes& b);

// The data file's meta pages, checked before LMDB maps the file: a truncated data.mdb
// would otherwise make LMDB touch pages past the end of the file (SIGBUS) instead of
// reporting an error.
struct MetaFacts {
  uint64_t page_size = 0;
  uint64_t last_pg = 0;
  uint64_t entries = 0;
  uint64_t file_size = 0;
  uint64_t main_root = ~uint64_t(0);
  uint32_t main_depth = 0;
};
Result<MetaFacts> CheckDataFile(const std::string& data_path);

// [start, end) of every offset-0 mapping of the file with this inode.
std::vector<std::pair<uint64_t, uint64_t>> MapsOf(uint64_t inode);

// The shared, read-only environment.
class Env {
 public:
  ~Env() {
    for (MDB_txn* t : idle_) mdb_txn_abort(t);
    if (env_) mdb_env_close(env_);
  }

  // One Env per data file per process (LMDB forbids opening an environment twice
  // in one process): a second Open of the same directory shares the first.
  // `shown` (when not empty) names the directory in dir(), data_path() and errors: the
  // address of a remote LMDB whose local copy `dir` is.
  static Result<std::shared_ptr<Env>> Open(const std::string& dir, const std::string& shown = "") {
    static std::mutex mu;
    static std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<Env>> open;
    struct stat st;
    std::string data = dir + "/data.mdb";
    if (::stat(data.c_str(), &st) != 0)
      return errno == ENOENT ? Status::NotFound("no data.mdb in the LMDB directory", Location{.file = data})
                             : Status::FromErrno(errno, "cannot stat", Location{.file = data});
    std::pair<uint64_t, uint64_t> id{uint64_t(st.st_dev), uint64_t(st.st_ino)};
    std::lock_guard<std::mutex> g(mu);
    if (auto e = open[id].lock()) return e;
    SK_ASSIGN_OR_RETURN(auto e, OpenNew(dir));
    if (!shown.empty()) e->dir_ = shown, e->data_path_ = shown + "/data.mdb";
    open[id] = e;
    for (auto it = open.begin(); it != open.end();) it = it->second.expired() ? open.erase(it) : std::next(it);
    return e;
  }

  static Result<std::shared_ptr<Env>> OpenNew(const std::string& dir) {
    auto e = std::make_shared<Env>();
    e->dir_ = dir;
    e->data_path_ = dir + "/data.mdb";
    SK_ASSIGN_OR_RETURN(e->meta_, CheckDataFile(e->data_path_));
    Location loc{.file = e->data_path_};
    int rc = mdb_env_create(&e->env_);
    if (rc) return MdbStatus(rc, "mdb_env_create", loc);
    // Map exactly the file: anything LMDB follows past the end then faults
    // inside our bounds checks' reach rather than past EOF of a larger map.
    mdb_env_set_mapsize(e->env_, size_t(e->meta_.file_size));
    mdb_env_set_maxreaders(e->env_, 1024);
    unsigned flags = MDB_RDONLY | MDB_NOTLS;
    bool has_lock = io::Exists(dir + "/lock.mdb");
    if (!has_lock || ::access(dir.c_str(), W_OK) != 0) flags |= MDB_NOLOCK;
    e->nolock_ = (flags & MDB_NOLOCK) != 0;
    struct stat dst;
    if (::stat(e->data_path_.c_str(), &dst) != 0) return Status::FromErrno(errno, "cannot stat", loc);
    auto before = MapsOf(uint64_t(dst.st_ino));
    rc = mdb_env_open(e->env_, dir.c_str(), flags, 0644);
    if (rc) return MdbStatus(rc, "cannot open the LMDB environment", loc);
    // LMDB does not tell where it mapped the file (mdb_env_info's me_mapaddr is
    // the fixed-map address, null here): find the new mapping of data.mdb in
    // /proc/self/maps. Every page, key and value is bounds-checked against it,
    // and the B-tree is checked through it before LMDB walks it.
    auto after = MapsOf(uint64_t(dst.st_ino));
    for (const auto& m : after)
      if (std::find(before.begin(), before.end(), m) == before.end()) {
        e->map_ = reinterpret_cast<const uint8_t*>(uintptr_t(m.first));
        e->map_len_ = std::min<uint64_t>(m.second - m.first, e->meta_.file_size);
      }
    if (!e->map_) return Status::Internal("cannot find LMDB's mapping of data.mdb in /proc/self/maps", loc);
    SK_RETURN_IF_ERROR(e->CheckTree());
    MDB_txn* txn = nullptr;
    rc = mdb_txn_begin(e->env_, nullptr, MDB_RDONLY, &txn);
    if (rc) return MdbStatus(rc, "cannot begin a read transaction", loc);
    rc = mdb_dbi_open(txn, nullptr, 0, &e->dbi_);
    if (rc) {
      mdb_txn_abort(txn);
      return MdbStatus(rc, "cannot open the unnamed database", loc);
    }
    MDB_stat st;
    rc = mdb_stat(txn, e->dbi_, &st);
    if (rc) {
      mdb_txn_abort(txn);
      return MdbStatus(rc, "mdb_stat", loc);
    }
    e->entries_ = st.ms_entries;
    if (e->entries_ != e->meta_.entries) {
      mdb_txn_abort(txn);
      return Status::Corrupt(fmt::format("LMDB lists {} entries, its meta page {}", e->entries_, e->meta_.entries), loc);
    }
    e->Release(txn);
    return e;
  }

  // A read transaction for this thread's exclusive use until Release().
  Result<MDB_txn*> Acquire() const {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!idle_.empty()) {
        MDB_txn* t = idle_.back();
        idle_.pop_back();
        return t;
      }
    }
    MDB_txn* t = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &t);
    if (rc) return MdbStatus(rc, "cannot begin a read transaction", Location{.file = data_path_});
    return t;
  }
  // Returns a transaction to the pool. It stays open (see the file comment).
  void Release(MDB_txn* t) const {
    std::lock_guard<std::mutex> g(mu_);
    idle_.push_back(t);
  }

  // True when [p, p+n) lies inside the mapped file.
  bool InMap(const void* p, size_t n) const {
    auto* b = static_cast<const uint8_t*>(p);
    return map_ && b >= map_ && n <= map_len_ && uint64_t(b - map_) <= map_len_ - n;
  }

  // Walks the main B-tree through the map before LMDB does: LMDB trusts its
  // pages and reads wherever a damaged node offset or page number points.
  // Checks every branch and leaf page header, node bounds, child and overflow
  // page numbers, depth and the entry count. Reads only inside the mapped file.
  Status CheckTree() const {
    Location loc{.file = data_path_};
    const uint64_t psize = meta_.page_size, last = meta_.last_pg;
    if (meta_.main_root == ~uint64_t(0)) {
      if (meta_.entries != 0) return Status::Corrupt("LMDB meta page lists entries but no root page", loc);
      return Status::OK();
    }
    auto u16 = [](const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; };
    auto u64 = [](const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; };
    uint64_t leaf_entries = 0, pages = 0;
    struct Item { uint64_t pgno; uint32_t depth; };
    std::vector<Item> stack{{meta_.main_root, 1}};
    while (!stack.empty()) {
      Item it = stack.back();
      stack.pop_back();
      auto bad = [&](std::string why) {
        return Status::Corrupt(fmt::format("LMDB page {} is damaged: {}", it.pgno, why),
                               Location{.file = data_path_, .offset = int64_t(it.pgno * psize)});
      };
      if (it.pgno < 2 || it.pgno > last) return bad(fmt::format("page number outside 2..{}", last));
      if (it.depth > meta_.main_depth || it.depth > 64) return bad("tree deeper than the meta page says");
      if (++pages > last + 1) return bad("tree has a cycle");
      if ((it.pgno + 1) * psize > map_len_) return bad("past the end of the mapped file");
      const uint8_t* pg = map_ + it.pgno * psize;
      if (u64(pg) != it.pgno) return bad(fmt::format("header names page {}", u64(pg)));
      uint16_t flags = u16(pg + 10), lower = u16(pg + 12), upper = u16(pg + 14);
      bool branch = flags & 0x01, leaf = flags & 0x02;
      if (branch == leaf || (flags & (0x04 | 0x08 | 0x20 | 0x40)))
        return bad(fmt::format("flags 0x{:x} are not a plain branch or leaf page", flags));
      if (lower < 16 || (lower & 1) || lower > upper || upper > psize) return bad("bad lower/upper bounds");
      uint32_t n = (lower - 16) / 2;
      if (branch && it.depth == meta_.main_depth) return bad("branch page at leaf depth");
      if (leaf && it.depth != meta_.main_depth) return bad("leaf page above leaf depth");
      for (uint32_t i = 0; i < n; ++i) {
        uint32_t off = u16(pg + 16 + 2 * i);
        if (off < upper || off + 8 > psize) return bad(fmt::format("node {} offset {} out of bounds", i, off));
        const uint8_t* nd = pg + off;
        uint32_t lo = u16(nd), hi = u16(nd + 2), nflags = u16(nd + 4), ksize = u16(nd + 6);
        if (off + 8 + ksize > psize) return bad(fmt::format("node {} key runs past the page", i));
        if (branch) {
          uint64_t child = uint64_t(lo) | (uint64_t(hi) << 16) | (uint64_t(nflags) << 32);
          stack.push_back({child, it.depth + 1});
          continue;
        }
        uint64_t dsize = uint64_t(lo) | (uint64_t(hi) << 16);
        if (nflags & ~0x01u) return bad(fmt::format("node {} has flags 0x{:x} (sub-databases are not used)", i, nflags));
        if (nflags & 0x01) {  // F_BIGDATA: the value lives in overflow pages
          if (off + 8 + ksize + 8 > psize) return bad(fmt::format("node {} overflow page number runs past the page", i));
          uint64_t ov = u64(nd + 8 + ksize);
          uint64_t npages = (16 - 1 + dsize) / psize + 1;
          if (ov < 2 || ov > last || npages > last + 1 - ov)
            return bad(fmt::format("node {} value of {} bytes at overflow page {} runs past page {}", i, dsize, ov, last));
        } else if (off + 8 + ksize + dsize > psize) {
          return bad(fmt::format("node {} value runs past the page", i));
        }
        ++leaf_entries;
      }
    }
    if (leaf_entries != meta_.entries)
      return Status::Corrupt(fmt::format("LMDB tree holds {} entries, its meta page lists {}", leaf_entries, meta_.entries), loc);
    return Status::OK();
  }

  MDB_dbi dbi() const { return dbi_; }
  uint64_t entries() const { return entries_; }
  const std::string& dir() const { return dir_; }
  const std::string& data_path() const { return data_path_; }
  const MetaFacts& meta() const { return meta_; }
  bool nolock() const { return nolock_; }

 private:
  MDB_env* env_ = nullptr;
  MDB_dbi dbi_ = 0;
  std::string dir_, data_path_;
  MetaFacts meta_;
  const uint8_t* map_ = nullptr;
  uint64_t map_len_ = 0;
  uint64_t entries_ = 0;
  bool nolock_ = false;
  mutable std::mutex mu_;
  mutable std::vector<MDB_txn*> idle_;
};

// ---- value decoders (records.cc). `lkey` is the LMDB key, named in every error. ----

// A view into the map. `owner` keeps the map and the read transaction that found the
// value alive: the Env itself, or a random-access thread slot (which holds the Env).
Bytes View(const std::shared_ptr<const void>& owner, const void* p, size_t n);
// A shardkit record. check_payload: compare the payload with the record's xxh3
// (sequential reads, verify); random access skips that hash on the hot path.
Status DecodeRecord(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                    const MDB_val& v, uint64_t index, Sample* out, bool check_payload = true,
                    uint64_t* stored_sum = nullptr);
// "00000012_a/b.JPEG" -> key "a/b", ext "jpeg". Keys without the prefix or the
// extension keep what they have.
void SplitCaffeKey(std::string_view lkey, std::string* key, std::string* ext);
bool ParseDatum(const void* p, size_t n, caffe::Datum* d);
// A caffe Datum; `sums` (from shardkit.json) checks the sample when given.
Status DecodeDatum(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                   const MDB_val& v, uint64_t index, Sample* out, const std::vector<uint64_t>* sums = nullptr);
enum class Layout { kShardkit, kCaffe, kWild };  // kWild: formats/lmdb/wild.h
// A wild layout's value for one key, decoded (image bytes or a pickle); for the split
// layout (Catalog::label_keys) the label is read under its own key in `txn`, whose
// views `owner` keeps alive.
Status DecodeWild(const Env* env, const wild::Catalog& cat, const std::shared_ptr<const void>& owner,
                  std::string_view lkey, const MDB_val& v, uint64_t index, Sample* out, MDB_txn* txn);

// The registry row's hooks (reader.cc, writer.cc).
Result<std::unique_ptr<Dataset>> OpenDataset(const std::string& address, const OpenOptions& opts);
Result<std::unique_ptr<SampleWriter>> CreateWriter(const std::string& address, const WriteOptions& opts);

}  // namespace shardkit::formats::lmdb
