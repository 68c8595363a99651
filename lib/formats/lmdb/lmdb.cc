// lmdb format: one LMDB environment directory (data.mdb, lock.mdb) plus
// shardkit.json. Two layouts; docs/formats-lmdb.md describes both byte for byte.
//
//  "shardkit": LMDB key = "%010d" sample index; value = one msgpack map
//      {"key": str (bin if not UTF-8), "fields": {ext: bin, ...}, "xxh3": uint64}.
//  "caffe":    LMDB key = "%08d_<key>.<image ext>"; value = caffe Datum
//      (encoded = true, data = image bytes, label, channels/height/width).
//
// Writing: into "<dir>.partial", MDB_APPEND, batches of 1000 samples or 2 MiB
// per transaction (not synced), a durable point (sync + resume.json) every
// 1 GiB or 30 s, MDB_MAP_FULL handled by aborting, growing the map and
// replaying the batch; in Finish() mdb_env_sync(1) while data.mdb is hashed,
// shardkit.json, then rename and fsync of the parent directory.
//
// Reading: MDB_RDONLY | MDB_NOTLS, plus MDB_NOLOCK when the directory has no
// lock.mdb or is not writable, so a reader never creates a lock file. Values are
// zero-copy views into LMDB's map. Read transactions live in a pool owned by the
// shared Env and are never reset; random access gives each calling thread one of
// them (a ReadSlot, found without a lock). Every Bytes handed out keeps its slot or
// the Env (and so the read transaction it came from) alive, which pins the
// snapshot the bytes belong to: a writer in another process cannot reuse those
// pages while the bytes exist.
#include "formats/lmdb/lmdb.h"
#include "formats/lmdb/wild.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/resume.h"
#include "core/paths.h"
#include "core/per_thread.h"
#include "formats/caffe.pb.h"
#include "formats/registry.h"

namespace shardkit::formats {

namespace lmdb {
namespace {
std::atomic<size_t> g_initial_map{0};
std::atomic<size_t> g_batch_samples{0};
std::atomic<size_t> g_durable_bytes{0};
}  // namespace
void SetInitialMapSizeForTest(size_t bytes) { g_initial_map = bytes; }
void SetBatchSamplesForTest(size_t n) { g_batch_samples = n; }
void SetDurableBytesForTest(size_t bytes) { g_durable_bytes = bytes; }
}  // namespace lmdb

namespace {

namespace fs = std::filesystem;
namespace wild = lmdb::wild;
using json = nlohmann::json;

// A record's location with the sample key (the LMDB key stays in the message).
Location SampleLoc(Location loc, const std::string& sample_key) {
  loc.key = sample_key;
  return loc;
}

constexpr const char* kMetaName = "shardkit.json";
constexpr const char* kResumeName = "resume.json";  // in "<dir>.partial" while writing
constexpr int kFormatVersion = 1;
constexpr size_t kDefaultMapSize = sizeof(size_t) >= 8 ? (size_t(1) << 40) : (size_t(1) << 30);
// Small transactions: without MDB_WRITEMAP a commit copies its dirty pages into
// the page cache (pwritev), and that copy is cheapest while they are still in the
// CPU cache. 2 MiB measured about 30% less CPU per conversion than 64 MiB here
// (docs/formats-lmdb.md). A commit that is not a durable point costs no sync.
constexpr size_t kBatchBytes = 2 << 20;
constexpr size_t kDefaultBatchSamples = 1000;
// A durable point (mdb_env_sync + resume.json) after this much payload or time
// since the last one. Commits in between are not synced: a crash loses at most
// this much work for --resume, and the conversion does not wait on the disk
// once per transaction. Finish() always syncs.
constexpr uint64_t kDurableBytes = uint64_t(1) << 30;
constexpr double kDurableSeconds = 30.0;
// Every this much committed payload, start the kernel's writeback of data.mdb
// (sync_file_range WRITE: it waits for nothing), so that the sync of a durable
// point or of Finish() finds most pages already on their way to the disk.
constexpr uint64_t kWritebackBytes = 32 << 20;

bool IsMdbCorruption(int rc) {
  return rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH ||
         rc == MDB_BAD_VALSIZE || rc == MDB_INCOMPATIBLE;
}

// An LMDB return code as a Status.
Status MdbStatus(int rc, std::string_view what, Location where) {
  std::string msg = fmt::format("{}: {}", what, mdb_strerror(rc));
  if (IsMdbCorruption(rc)) return Status::Corrupt(std::move(msg), std::move(where));
  if (rc > 0) return Status::FromErrno(rc, std::string(what), std::move(where));
  return Status::IOError(std::move(msg), std::move(where));
}

std::string IndexKey(uint64_t i) { return fmt::format("{:010d}", i); }

// XXH3-64 of a whole file (the same value as paths::HashFile), read through a
// populated read-only mapping: no copy out of the page cache.
Result<uint64_t> HashMapped(const std::string& path) {
  Location loc{.file = path};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "cannot open", loc);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "cannot stat", loc);
  }
  size_t n = size_t(st.st_size);
  if (n == 0) {
    ::close(fd);
    return XXH3_64bits(nullptr, 0);
  }
  void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return paths::HashFile(path);  // e.g. no address space: read() instead
  uint64_t h = XXH3_64bits(p, n);
  ::munmap(p, n);
  return h;
}

// ----------------------------------------------------------------------------
// Image header facts for the caffe layout.

struct ImageShape {
  int channels = 0, height = 0, width = 0;
};

ImageShape PeekShape(tjhandle tj, const Bytes& b) {
  ImageShape s;
  const uint8_t* p = b.data();
  size_t n = b.size();
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && tj) {
    int w = 0, h = 0, sub = 0, cs = 0;
    if (tjDecompressHeader3(tj, p, static_cast<unsigned long>(n), &w, &h, &sub, &cs) == 0) {
      s.width = w, s.height = h;
      s.channels = cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3;
    }
  } else if (n >= 26 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 && std::memcmp(p + 12, "IHDR", 4) == 0) {
    auto be32 = [&](size_t o) { return (uint32_t(p[o]) << 24) | (uint32_t(p[o + 1]) << 16) | (uint32_t(p[o + 2]) << 8) | p[o + 3]; };
    uint32_t w = be32(16), h = be32(20);
    if (w <= INT32_MAX && h <= INT32_MAX) {
      s.width = int(w), s.height = int(h);
      switch (p[25]) {
        case 0: s.channels = 1; break;
        case 2: case 3: s.channels = 3; break;
        case 4: s.channels = 2; break;
        case 6: s.channels = 4; break;
        default: s.channels = 0;
      }
    }
  }
  return s;
}

// ----------------------------------------------------------------------------
// The data file's meta pages, checked before LMDB maps the file: a truncated
// data.mdb would otherwise make LMDB touch pages past the end of the file
// (SIGBUS) instead of reporting an error.

struct MetaFacts {
  uint64_t page_size = 0;
  uint64_t last_pg = 0;
  uint64_t entries = 0;
  uint64_t file_size = 0;
  uint64_t main_root = ~uint64_t(0);
  uint32_t main_depth = 0;
};

Result<MetaFacts> CheckDataFile(const std::string& data_path) {
  Location loc{.file = data_path};
  int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? Status::NotFound("no data.mdb in the LMDB directory", loc)
                           : Status::FromErrno(errno, "cannot open", loc);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "cannot stat", loc);
  }
  MetaFacts f;
  f.file_size = uint64_t(st.st_size);
  // Layout of a meta page (64-bit LMDB 0.9): 16-byte page header, then MDB_meta:
  // magic u32 @16, version u32 @20, address @24, mapsize @32, dbs[FREE] @40
  // (md_pad = page size), dbs[MAIN] @88 (entries @120, root @128), last_pg @136, txnid @144.
  auto read_meta = [&](uint64_t off, uint8_t* buf) -> bool {
    return ::pread(fd, buf, 152, off_t(off)) == 152;
  };
  uint8_t m0[152], m1[152];
  bool ok0 = f.file_size >= 152 && read_meta(0, m0);
  auto u32 = [](const uint8_t* b, size_t o) { uint32_t v; std::memcpy(&v, b + o, 4); return v; };
  auto u64 = [](const uint8_t* b, size_t o) { uint64_t v; std::memcpy(&v, b + o, 8); return v; };
  if (!ok0 || u32(m0, 16) != 0xBEEFC0DE) {
    ::close(fd);
    return Status::Corrupt(
        fmt::format("not an LMDB data file (file of {} bytes, no LMDB magic in the first meta page)", f.file_size), loc);
  }
  if (u32(m0, 20) != 1) {
    ::close(fd);
    return Status::Corrupt(fmt::format("unsupported LMDB data version {}", u32(m0, 20)), loc);
  }
  f.page_size = u32(m0, 40);
  if (f.page_size < 512 || f.page_size > (1 << 16) || (f.page_size & (f.page_size - 1)) != 0) {
    ::close(fd);
    return Status::Corrupt(fmt::format("LMDB meta page declares a bad page size {}", f.page_size), loc);
  }
  bool ok1 = f.file_size >= f.page_size + 152 && read_meta(f.page_size, m1) && u32(m1, 16) == 0xBEEFC0DE;
  ::close(fd);
  if (!ok1) return Status::Corrupt("LMDB data file is truncated or damaged (second meta page missing)", loc);
  // LMDB takes the page size from the newer meta page: both must agree.
  if (u32(m1, 40) != f.page_size || u32(m1, 20) != 1)
    return Status::Corrupt(fmt::format("LMDB meta pages disagree (page size {} vs {}, version {})", f.page_size,
                                       u32(m1, 40), u32(m1, 20)),
                           loc);
  const uint8_t* m = u64(m1, 144) > u64(m0, 144) ? m1 : m0;
  f.last_pg = u64(m, 136);
  f.entries = u64(m, 120);
  uint64_t root = u64(m, 128);
  f.main_root = root;
  f.main_depth = uint32_t(m[94]) | (uint32_t(m[95]) << 8);
  if (f.last_pg > (uint64_t(1) << 48) || (f.last_pg + 1) * f.page_size > f.file_size)
    return Status::Corrupt(fmt::format("LMDB data file is truncated: the meta page says it holds {} pages of {} bytes "
                                       "({} bytes) but the file has {} bytes",
                                       f.last_pg + 1, f.page_size, (f.last_pg + 1) * f.page_size, f.file_size),
                           loc);
  if (root != ~uint64_t(0) && root > f.last_pg)
    return Status::Corrupt(fmt::format("LMDB meta page points its root at page {} past the last page {}", root, f.last_pg), loc);
  return f;
}

// ----------------------------------------------------------------------------
// The shared, read-only environment.

// [start, end) of every offset-0 mapping of the file with this inode.
std::vector<std::pair<uint64_t, uint64_t>> MapsOf(uint64_t inode) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  auto text = io::ReadFile("/proc/self/maps");
  if (!text.ok()) return out;
  std::string_view all = *text;
  while (!all.empty()) {
    size_t nl = all.find('\n');
    std::string line(all.substr(0, nl));
    all.remove_prefix(nl == std::string_view::npos ? all.size() : nl + 1);
    unsigned long long lo = 0, hi = 0, off = 0, ino = 0;
    char perms[8] = {0}, dev[32] = {0};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %31s %llu", &lo, &hi, perms, &off, dev, &ino) != 6) continue;
    if (ino == inode && off == 0) out.emplace_back(lo, hi);
  }
  return out;
}

class Env {
 public:
  ~Env() {
    for (MDB_txn* t : idle_) mdb_txn_abort(t);
    if (env_) mdb_env_close(env_);
  }

  // One Env per data file per process (LMDB forbids opening an environment twice
  // in one process): a second Open of the same directory shares the first.
  static Result<std::shared_ptr<Env>> Open(const std::string& dir) {
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

// ----------------------------------------------------------------------------
// Value decoders. `lkey` is the LMDB key, named in every error.

// A view into the map. `owner` keeps the map and the read transaction that
// found the value alive: the Env itself, or a random-access thread slot (which
// holds the Env).
Bytes View(const std::shared_ptr<const void>& owner, const void* p, size_t n) {
  return Bytes(std::shared_ptr<const void>(owner, p), static_cast<const uint8_t*>(p), n);
}

// check_payload: compare the payload with the record's xxh3 (sequential reads, verify);
// random access skips that hash (a few us per 100 kB) on the hot path, like the other formats.
Status DecodeRecord(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                    const MDB_val& v, uint64_t index, Sample* out, bool check_payload = true,
                    uint64_t* stored_sum = nullptr) {
  out->clear();
  Location loc{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)};
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value is not a shardkit record: {}", lkey,
                                       env->data_path(), why),
                           loc);
  };
  if (!env->InMap(v.mv_data, v.mv_size)) return bad("value lies outside the data file");
  msgpack::object_handle oh;
  try {
    std::size_t off = 0;
    auto ref_all = [](msgpack::type::object_type, std::size_t, void*) { return true; };
    oh = msgpack::unpack(static_cast<const char*>(v.mv_data), v.mv_size, off, ref_all, nullptr,
                         msgpack::unpack_limit(0, 1 << 16, 1 << 20, 0xffffffff, 0, 4));
    if (off != v.mv_size) return bad(fmt::format("{} trailing bytes after the msgpack map", v.mv_size - off));
  } catch (const std::exception& e) {
    return bad(fmt::format("msgpack: {}", e.what()));
  }
  const msgpack::object& o = oh.get();
  if (o.type != msgpack::type::MAP) return bad("not a msgpack map");
  bool have_key = false, have_fields = false;
  std::optional<uint64_t> sum, key_sum;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& kv = o.via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR) return bad("a map key is not a string");
    std::string_view name(kv.key.via.str.ptr, kv.key.via.str.size);
    if (name == "key") {
      if (kv.val.type == msgpack::type::STR) out->key.assign(kv.val.via.str.ptr, kv.val.via.str.size);
      else if (kv.val.type == msgpack::type::BIN) out->key.assign(kv.val.via.bin.ptr, kv.val.via.bin.size);
      else return bad("\"key\" is neither str nor bin");
      have_key = true;
    } else if (name == "fields") {
      if (kv.val.type != msgpack::type::MAP) return bad("\"fields\" is not a map");
      const auto& fm = kv.val.via.map;
      out->fields.reserve(fm.size);
      for (uint32_t j = 0; j < fm.size; ++j) {
        const auto& f = fm.ptr[j];
        if (f.key.type != msgpack::type::STR || f.val.type != msgpack::type::BIN)
          return bad("a field is not str -> bin");
        std::string ext(f.key.via.str.ptr, f.key.via.str.size);
        if (ext.empty()) return bad("empty field name");
        if (out->find(ext)) return bad(fmt::format("field '{}' twice", ext));
        out->set(std::move(ext), View(owner, f.val.via.bin.ptr, f.val.via.bin.size));
      }
      have_fields = true;
    } else if (name == "xxh3") {
      if (kv.val.type != msgpack::type::POSITIVE_INTEGER) return bad("\"xxh3\" is not an unsigned integer");
      sum = kv.val.via.u64;
    } else if (name == "key_xxh3") {
      if (kv.val.type != msgpack::type::POSITIVE_INTEGER) return bad("\"key_xxh3\" is not an unsigned integer");
      key_sum = kv.val.via.u64;
    } else {
      // Strict: a damaged name ("xxh3" -> "xxh2") must not switch a check off.
      return bad(fmt::format("unknown record entry '{}'", name));
    }
  }
  if (!have_key || !have_fields) return bad("missing \"key\" or \"fields\"");
  if (out->key.empty()) return bad("empty sample key");
  if (key_sum && *key_sum != paths::Hash(out->key.data(), out->key.size()))
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': the sample key '{}' does not match its stored key_xxh3",
                                       lkey, env->data_path(), out->key),
                           loc);
  if (stored_sum) *stored_sum = sum ? *sum : 0;
  if (check_payload && sum && *sum != out->checksum())
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': checksum mismatch for sample '{}' (stored {}, computed {})",
                                       lkey, env->data_path(), out->key, paths::ChecksumString(*sum),
                                       paths::ChecksumString(out->checksum())),
                           SampleLoc(loc, out->key))
        .With(Detail::kSampleChecksum);
  return Status::OK();
}

// "00000012_a/b.JPEG" -> key "a/b", ext "jpeg". Keys without the prefix or the
// extension keep what they have.
void SplitCaffeKey(std::string_view lkey, std::string* key, std::string* ext) {
  size_t us = lkey.find('_');
  if (us != std::string_view::npos && us >= 1) {
    bool digits = true;
    for (size_t i = 0; i < us; ++i) digits &= lkey[i] >= '0' && lkey[i] <= '9';
    if (digits) lkey.remove_prefix(us + 1);
  }
  size_t slash = lkey.rfind('/');
  size_t dot = lkey.rfind('.');
  if (dot != std::string_view::npos && (slash == std::string_view::npos || dot > slash) && dot + 1 < lkey.size() &&
      dot > (slash == std::string_view::npos ? 0 : slash + 1)) {
    *key = std::string(lkey.substr(0, dot));
    *ext = paths::Lower(lkey.substr(dot + 1));
  } else {
    *key = std::string(lkey);
    ext->clear();
  }
}

bool ParseDatum(const void* p, size_t n, caffe::Datum* d) {
  if (n > size_t(INT32_MAX)) return false;
  if (!d->ParseFromArray(p, int(n))) return false;
  return d->GetReflection()->GetUnknownFields(*d).empty();
}

Status DecodeDatum(const Env* env, const std::shared_ptr<const void>& owner, std::string_view lkey,
                   const MDB_val& v, uint64_t index, Sample* out, const std::vector<uint64_t>* sums = nullptr) {
  out->clear();
  Location loc{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)};
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value is not a caffe Datum: {}", lkey,
                                       env->data_path(), why),
                           loc);
  };
  if (!env->InMap(v.mv_data, v.mv_size)) return bad("value lies outside the data file");
  caffe::Datum d;
  if (!ParseDatum(v.mv_data, v.mv_size, &d)) return bad("protobuf parse failed");
  std::string ext;
  SplitCaffeKey(lkey, &out->key, &ext);
  if (out->key.empty()) return bad("empty sample key");
  // Zero-copy: locate d.data() inside the value (the parser copied it).
  auto data_view = [&]() -> Bytes {
    const std::string& s = d.data();
    std::string_view val(static_cast<const char*>(v.mv_data), v.mv_size);
    // A bytes field ends the way it was written: tag, length, payload. Find the
    // payload at its position by searching from the end for an exact match.
    if (!s.empty() && s.size() <= val.size()) {
      size_t pos = val.rfind(std::string_view(s));
      if (pos != std::string_view::npos) return View(owner, val.data() + pos, s.size());
    }
    return Bytes::Copy(s);
  };
  if (d.encoded()) {
    Bytes img = data_view();
    if (img.empty()) return bad("encoded Datum without image bytes");
    std::string spelled;  // the key's own spelling of the extension ("JPEG"), kept for writing back
    if (!ext.empty() && lkey.size() > ext.size()) spelled = std::string(lkey.substr(lkey.size() - ext.size()));
    if (ext.empty() || !IsImageExt(ext)) ext = paths::SniffImageExt(img.data(), img.size());
    out->set(ext, std::move(img));
    if (spelled != ext && paths::Lower(spelled) == ext) {
      for (auto& f : out->fields)
        if (f.ext == ext) f.source_ext = spelled;
    }
  } else {
    uint64_t c = uint64_t(std::max(d.channels(), 0)), h = uint64_t(std::max(d.height(), 0)),
             w = uint64_t(std::max(d.width(), 0));
    json shape = {{"channels", c}, {"height", h}, {"width", w}, {"order", "CHW"}, {"colors", "BGR"}};
    if (d.has_data() && !d.data().empty()) {
      if (d.data().size() != c * h * w)
        return bad(fmt::format("raw Datum holds {} bytes, not channels*height*width = {}", d.data().size(), c * h * w));
      shape["dtype"] = "uint8";
      out->set("raw", data_view());
    } else if (d.float_data_size() > 0) {
      if (uint64_t(d.float_data_size()) != c * h * w)
        return bad(fmt::format("raw Datum holds {} floats, not channels*height*width = {}", d.float_data_size(), c * h * w));
      shape["dtype"] = "float32";
      out->set("raw", Bytes::Copy(d.float_data().data(), size_t(d.float_data_size()) * sizeof(float)));
    } else {
      return bad("Datum holds neither data nor float_data");
    }
    out->set("shape", Bytes::Take(shape.dump()));
  }
  if (d.has_label()) out->set_label(d.label());
  if (sums && index < sums->size() && (*sums)[index] != out->checksum())
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': checksum mismatch for sample '{}' (shardkit.json has {}, "
                                       "computed {})",
                                       lkey, env->data_path(), out->key, paths::ChecksumString((*sums)[index]),
                                       paths::ChecksumString(out->checksum())),
                           SampleLoc(loc, out->key))
        .With(Detail::kSampleChecksum);
  return Status::OK();
}

enum class Layout { kShardkit, kCaffe, kWild };  // kWild: formats/lmdb/wild.h

// A wild layout's value for one key, decoded (image bytes or a pickle).
Status DecodeWild(const Env* env, const wild::Catalog& cat, const std::shared_ptr<const void>& owner,
                  std::string_view lkey, const MDB_val& v, uint64_t index, Sample* out) {
  if (!env->InMap(v.mv_data, v.mv_size))
    return Status::Corrupt(fmt::format("LMDB key '{}' in '{}': value lies outside the data file", lkey, env->data_path()),
                           Location{.file = env->dir(), .key = std::string(lkey), .index = int64_t(index)});
  return wild::Decode(cat, lkey, View(owner, v.mv_data, v.mv_size), index, env->data_path(), out);
}

// ----------------------------------------------------------------------------
// Reading.

class LmdbDataset;

class LmdbReader : public SampleReader {
 public:
  LmdbReader(std::shared_ptr<Env> env, Layout layout, uint64_t count, std::shared_ptr<const std::vector<uint64_t>> sums,
             std::shared_ptr<const wild::Catalog> wild = nullptr)
      : env_(std::move(env)), layout_(layout), count_(count), sums_(std::move(sums)), wild_(std::move(wild)) {}
  ~LmdbReader() override {
    if (cur_) mdb_cursor_close(cur_);
    if (txn_) env_->Release(txn_);
  }

  Result<bool> Next(Sample* out) override {
    Location loc{.file = env_->data_path(), .index = int64_t(index_)};
    if (!txn_) {
      SK_ASSIGN_OR_RETURN(txn_, env_->Acquire());
      int rc = mdb_cursor_open(txn_, env_->dbi(), &cur_);
      if (rc) return MdbStatus(rc, "cannot open a cursor", loc);
    }
    if (done_) return false;
    if (layout_ == Layout::kWild) return NextWild(out);
    MDB_val k, v;
    int rc = mdb_cursor_get(cur_, &k, &v, index_ == 0 ? MDB_FIRST : MDB_NEXT);
    if (rc == MDB_NOTFOUND) {
      done_ = true;
      if (index_ != count_)
        return Status::Corrupt(fmt::format("LMDB in '{}' ended after {} of {} samples", env_->dir(), index_, count_), loc);
      return false;
    }
    if (rc) return MdbStatus(rc, fmt::format("cursor read after sample {}", index_), loc);
    if (!env_->InMap(k.mv_data, k.mv_size))
      return Status::Corrupt(fmt::format("LMDB key at index {} lies outside the data file", index_), loc);
    std::string_view lkey(static_cast<const char*>(k.mv_data), k.mv_size);
    if (index_ >= count_)
      return Status::Corrupt(fmt::format("LMDB in '{}' holds more than the {} samples its metadata lists (key '{}')",
                                         env_->dir(), count_, lkey),
                             Location{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index_)});
    if (layout_ == Layout::kShardkit) {
      std::string want = IndexKey(index_);
      if (lkey != want)
        return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' where '{}' was expected (missing or extra sample)",
                                           lkey, env_->dir(), want),
                               Location{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index_)});
      SK_RETURN_IF_ERROR(DecodeRecord(env_.get(), env_, lkey, v, index_, out));
    } else {
      SK_RETURN_IF_ERROR(DecodeDatum(env_.get(), env_, lkey, v, index_, out, sums_.get()));
    }
    ++index_;
    return true;
  }

 private:
  // Wild layouts: the catalog's order (numeric keys by value), one mdb_get each.
  Result<bool> NextWild(Sample* out) {
    if (index_ >= wild_->keys.size()) {
      done_ = true;
      return false;
    }
    const std::string& lkey = wild_->keys[index_];
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())}, v;
    int rc = mdb_get(txn_, env_->dbi(), &k, &v);
    if (rc) return MdbStatus(rc, fmt::format("reading LMDB key '{}'", lkey), Location{.file = env_->dir(), .key = lkey});
    SK_RETURN_IF_ERROR(DecodeWild(env_.get(), *wild_, env_, lkey, v, index_, out));
    ++index_;
    return true;
  }

  std::shared_ptr<Env> env_;
  Layout layout_;
  uint64_t count_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;
  std::shared_ptr<const wild::Catalog> wild_;
  MDB_txn* txn_ = nullptr;
  MDB_cursor* cur_ = nullptr;
  uint64_t index_ = 0;
  bool done_ = false;
};

// Random access: one read transaction per thread, no lock on the hot path.
//
// Each thread that calls Get() on an LmdbRandomAccess gets a ReadSlot of its
// own (core::PerThread): a read transaction from the Env's pool, used by that
// thread only. The slot is the owner of the views Get() hands out, so their
// reference counts live in a per-thread control block instead of one shared by
// every thread. A slot's transaction is never reset or renewed: the views of
// earlier Get()s stay valid, from one snapshot, for as long as they are held.
// The slot gives its transaction back to the Env's pool when the
// LmdbRandomAccess and every view of the slot are gone; a slot whose thread
// exited goes to the next new thread (MDB_NOTLS lets a read transaction move
// between threads that do not use it at the same time). Cache-line aligned (see
// core/per_thread.h).
struct alignas(64) ReadSlot {
  ReadSlot(std::shared_ptr<Env> e, MDB_txn* t) : env(std::move(e)), txn(t) {}
  ~ReadSlot() { env->Release(txn); }
  std::shared_ptr<Env> env;
  MDB_txn* txn;
};

class LmdbRandomAccess : public RandomAccess {
 public:
  LmdbRandomAccess(std::shared_ptr<Env> env, Layout layout, uint64_t count,
                   std::shared_ptr<const std::vector<std::string>> keys,
                   std::shared_ptr<const std::vector<uint64_t>> sums, std::shared_ptr<const wild::Catalog> wild = nullptr)
      : env_(std::move(env)), layout_(layout), count_(count), keys_(std::move(keys)), sums_(std::move(sums)),
        wild_(std::move(wild)) {}
  uint64_t size() const override { return count_; }

  Status Get(uint64_t index, Sample* out) const override {
    if (index >= count_)
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", index, count_),
                             Location{.file = env_->dir(), .index = int64_t(index)});
    char buf[24];
    std::string_view lkey;
    if (layout_ == Layout::kShardkit) {
      auto r = fmt::format_to_n(buf, sizeof buf, "{:010d}", index);
      lkey = std::string_view(buf, r.size);
    } else if (layout_ == Layout::kWild) {
      lkey = wild_->keys[index];
    } else {
      lkey = (*keys_)[index];
    }
    SK_ASSIGN_OR_RETURN(std::shared_ptr<ReadSlot> slot, ThisThreadsSlot());
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())}, v;
    int rc = mdb_get(slot->txn, env_->dbi(), &k, &v);
    if (rc) {
      Location loc{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index)};
      if (rc == MDB_NOTFOUND)
        return Status::Corrupt(fmt::format("LMDB key '{}' of sample {} is missing from '{}'", lkey, index, env_->dir()),
                               loc);
      return MdbStatus(rc, fmt::format("reading LMDB key '{}'", lkey), loc);
    }
    std::shared_ptr<const void> owner(std::move(slot));
    // The random-access hot path does not hash payloads (see DecodeRecord); verify does.
    if (layout_ == Layout::kShardkit)
      return DecodeRecord(env_.get(), owner, lkey, v, index, out, /*check_payload=*/false);
    if (layout_ == Layout::kWild) return DecodeWild(env_.get(), *wild_, owner, lkey, v, index, out);
    return DecodeDatum(env_.get(), owner, lkey, v, index, out, nullptr);
  }

 private:
  Result<std::shared_ptr<ReadSlot>> ThisThreadsSlot() const {
    return slots_.Get([&]() -> Result<std::shared_ptr<ReadSlot>> {
      SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
      return std::make_shared<ReadSlot>(env_, txn);
    });
  }

  std::shared_ptr<Env> env_;
  Layout layout_;
  uint64_t count_;
  std::shared_ptr<const std::vector<std::string>> keys_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;
  std::shared_ptr<const wild::Catalog> wild_;
  core::PerThread<ReadSlot> slots_;  // one per thread that has called Get()
};

class LmdbDataset : public Dataset {
 public:
  static Result<std::unique_ptr<Dataset>> Open(const std::string& address, const OpenOptions& opts) {
    std::string dir = paths::StripTrailingSlashes(address);
    if (!io::IsDir(dir) && fs::path(dir).filename() == "data.mdb") dir = io::DirName(dir);
    if (!io::IsDir(dir)) return Status::NotFound("no such LMDB directory", Location{.file = dir});
    std::unique_ptr<LmdbDataset> d(new LmdbDataset());
    SK_ASSIGN_OR_RETURN(d->env_, Env::Open(dir));
    const Env& env = *d->env_;
    DatasetInfo& info = d->info_;
    info.format = "lmdb";
    info.address = address;
    ShardInfo shard{.path = env.data_path(), .samples = env.entries(), .bytes = env.meta().file_size};
    std::string meta_path = dir + "/" + kMetaName;
    uint64_t count = env.entries();
    std::string forced;  // OpenOptions::format_options["lmdb.layout"]: a wild layout by name
    if (auto it = opts.format_options.find("lmdb.layout"); it != opts.format_options.end()) forced = it->second;
    if (!forced.empty() && forced != "shardkit" && forced != "caffe") {
      auto kind = wild::Parse(forced);
      if (!kind)
        return Status::Invalid(fmt::format("unknown LMDB layout '{}' (shardkit, caffe, image or pickle)", forced),
                               Location{.file = dir});
      d->layout_ = Layout::kWild;
      SK_RETURN_IF_ERROR(d->ScanWild(*kind));
      count = d->wild_->keys.size();
      info.extra["metadata"] = "none (layout given)";
    } else if (io::Exists(meta_path)) {
      SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(meta_path));
      json j = json::parse(text, nullptr, false);
      Location mloc{.file = meta_path};
      if (j.is_discarded() || !j.is_object()) return Status::Corrupt("shardkit.json is not a JSON object", mloc);
      try {
        std::string layout = j.value("layout", "shardkit");
        if (layout == "shardkit") d->layout_ = Layout::kShardkit;
        else if (layout == "caffe") d->layout_ = Layout::kCaffe;
        else return Status::Unsupported(fmt::format("unknown LMDB layout '{}'", layout), mloc);
        if (j.value("version", 1) > kFormatVersion)
          return Status::Unsupported(fmt::format("shardkit.json version {} is newer than this shardkit reads ({})",
                                                 j.value("version", 1), kFormatVersion), mloc);
        count = j.at("num_samples").get<uint64_t>();
        info.class_names = j.value("class_names", std::vector<std::string>{});
        info.fields = j.value("fields", std::vector<std::string>{});
        if (j.contains("data_file")) shard.checksum = j["data_file"].value("checksum", "");
        if (d->layout_ == Layout::kCaffe && j.contains("sample_checksums")) {
          auto sums = std::make_shared<std::vector<uint64_t>>();
          for (const auto& x : j["sample_checksums"]) {
            std::string v = x.get<std::string>();
            if (v.size() != 21 || v.rfind("xxh3:", 0) != 0) throw std::runtime_error("bad sample checksum '" + v + "'");
            sums->push_back(std::stoull(v.substr(5), nullptr, 16));
          }
          if (sums->size() != j.at("num_samples").get<uint64_t>())
            throw std::runtime_error("sample_checksums does not hold one checksum per sample");
          d->sums_ = std::move(sums);
        }
      } catch (const std::exception& e) {
        return Status::Corrupt(fmt::format("shardkit.json: {}", e.what()), mloc);
      }
      if (count != env.entries())
        return Status::Corrupt(fmt::format("shardkit.json lists {} samples but the LMDB in '{}' holds {} keys", count,
                                           dir, env.entries()),
                               Location{.file = env.data_path()});
      info.extra["metadata"] = kMetaName;
    } else {
      // No metadata: a Caffe-written LMDB, one written by another script (wild.h),
      // or a shardkit one whose json was lost.
      SK_RETURN_IF_ERROR(d->DetectLayout());
      if (d->layout_ == Layout::kWild) count = d->wild_->keys.size();
    }
    d->count_ = count;
    info.num_samples = count;
    info.extra["layout"] = d->layout_ == Layout::kShardkit ? "shardkit"
                           : d->layout_ == Layout::kCaffe  ? "caffe"
                                                           : std::string(wild::Name(d->wild_->kind));
    if (d->layout_ == Layout::kWild) {
      if (auto it = opts.format_options.find("lmdb.channels"); it != opts.format_options.end()) {
        if (it->second != "bgr" && it->second != "rgb" && it->second != "bgr-to-rgb")
          return Status::Invalid(fmt::format("lmdb.channels '{}': bgr, rgb or bgr-to-rgb", it->second),
                                 Location{.file = dir});
        auto cat = std::make_shared<wild::Catalog>(*d->wild_);
        cat->channels = it->second;
        d->wild_ = std::move(cat);
      }
      if (d->wild_->kind == wild::Kind::kPickle)
        info.extra["channel_order"] = d->wild_->channels == "bgr"   ? "decoded arrays: bgr (as cv2.imread writes; not converted)"
                                      : d->wild_->channels == "rgb" ? "decoded arrays: rgb (said by lmdb.channels; not converted)"
                                                                    : "decoded arrays: rgb (converted from bgr on read)";
      info.class_names = d->wild_->class_names;
      info.extra["key_order"] = d->wild_->numeric_keys ? "numeric" : "bytes";
    }
    if (d->layout_ == Layout::kShardkit) {
      info.sample_checksums = SampleChecksums::kInRecords;
      info.sample_checksums_where = "xxh3 in every record, checked on every read";
      info.extra["sample_checksums"] = info.sample_checksums_where;  // shown by `shardkit info`
    } else if (d->sums_) {
      info.sample_checksums = SampleChecksums::kList;
      info.sample_checksums_where = "xxh3 list in shardkit.json";
    }
    info.extra["locking"] = env.nolock() ? "none (MDB_NOLOCK)" : "lock.mdb";
    info.shards.push_back(shard);
    info.total_bytes = shard.bytes;
    if (d->layout_ == Layout::kCaffe) SK_RETURN_IF_ERROR(d->ScanKeys());
    if (info.fields.empty() && count > 0) {
      Sample s;
      SK_ASSIGN_OR_RETURN(auto ra, d->NewRandomAccess());
      SK_RETURN_IF_ERROR(ra->Get(0, &s));
      for (const auto& f : s.fields) info.fields.push_back(f.ext);
    }
    return std::unique_ptr<Dataset>(std::move(d));
  }

  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new LmdbReader(env_, layout_, count_, sums_, wild_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return std::shared_ptr<RandomAccess>(std::make_shared<LmdbRandomAccess>(env_, layout_, count_, keys_, sums_, wild_));
  }
  // Caffe layout: the list in shardkit.json. Our layout: each record's xxh3,
  // collected by one cursor pass that parses the records without hashing
  // payloads (the sequential reader also checks them on every read).
  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    if (layout_ == Layout::kCaffe) return sums_ ? *sums_ : std::vector<uint64_t>{};
    if (layout_ == Layout::kWild) return std::vector<uint64_t>{};
    std::vector<uint64_t> out;
    out.reserve(count_);
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    Location loc{.file = env_->data_path()};
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    Status st;
    MDB_val k, v;
    for (int op = MDB_FIRST; rc == 0; op = MDB_NEXT) {
      rc = mdb_cursor_get(cur, &k, &v, MDB_cursor_op(op));
      if (rc) break;
      if (!env_->InMap(k.mv_data, k.mv_size)) {
        st = Status::Corrupt("LMDB key lies outside the data file", loc);
        break;
      }
      Sample s;
      uint64_t sum = 0;
      st = DecodeRecord(env_.get(), env_, std::string_view(static_cast<const char*>(k.mv_data), k.mv_size), v,
                        out.size(), &s, /*check_payload=*/false, &sum);
      if (!st.ok()) break;
      out.push_back(sum);
    }
    if (cur) mdb_cursor_close(cur);
    env_->Release(txn);
    if (!st.ok()) return st;
    if (rc && rc != MDB_NOTFOUND) return MdbStatus(rc, "reading the records' checksums", loc);
    return out;
  }

 private:
  Status DetectLayout() {
    if (env_->entries() == 0) {
      layout_ = Layout::kShardkit;
      return Status::OK();
    }
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    if (rc == 0) rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    if (cur) mdb_cursor_close(cur);
    env_->Release(txn);
    if (rc) return MdbStatus(rc, "reading the first LMDB entry", Location{.file = env_->data_path()});
    if (!env_->InMap(v.mv_data, v.mv_size) || !env_->InMap(k.mv_data, k.mv_size))
      return Status::Corrupt("first LMDB entry lies outside the data file", Location{.file = env_->data_path()});
    std::string lkey(static_cast<const char*>(k.mv_data), k.mv_size);
    Sample s;
    if (DecodeRecord(env_.get(), env_, lkey, v, 0, &s).ok() && lkey == IndexKey(0)) {
      layout_ = Layout::kShardkit;
      info_.extra["metadata"] = "none (shardkit.json missing)";
      return Status::OK();
    }
    // Other people's layouts (image bytes, pickles): the first sample value, past
    // the `__keys__`/`__len__` entries that sort first.
    if (auto kind = FirstWildKind()) {
      layout_ = Layout::kWild;
      info_.extra["metadata"] = fmt::format("none (layout detected from the first value: {})", wild::Name(*kind));
      return ScanWild(*kind);
    }
    caffe::Datum d;
    if (ParseDatum(v.mv_data, v.mv_size, &d) && (d.has_data() || d.float_data_size() > 0)) {
      layout_ = Layout::kCaffe;
      info_.extra["metadata"] = "none (caffe LMDB)";
      return Status::OK();
    }
    return Status::Corrupt(
        fmt::format("LMDB in '{}' has no shardkit.json and its first value (key '{}') is neither a shardkit record, "
                    "a caffe Datum, an image file nor a pickle",
                    env_->dir(), lkey),
        Location{.file = env_->dir(), .key = lkey});
  }

  // The wild layout of the first value whose key is not a side entry, if any.
  std::optional<wild::Kind> FirstWildKind() {
    auto txn = env_->Acquire();
    if (!txn.ok()) return std::nullopt;
    MDB_cursor* cur = nullptr;
    std::optional<wild::Kind> kind;
    if (mdb_cursor_open(*txn, env_->dbi(), &cur) == 0) {
      MDB_val k, v;
      for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size) || !env_->InMap(v.mv_data, v.mv_size)) break;
        if (wild::IsSideEntry(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size))) continue;
        kind = wild::Detect(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
        break;
      }
      mdb_cursor_close(cur);
    }
    env_->Release(*txn);
    return kind;
  }

  // Wild layouts: one cursor scan for the sample keys (side entries apart; a
  // `__len__` is checked against the count), ordered by wild::MakeCatalog.
  Status ScanWild(wild::Kind kind) {
    std::vector<std::string> keys;
    std::optional<std::pair<std::string, Bytes>> len_entry;
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    Status st;
    if (rc == 0) {
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size) || !env_->InMap(v.mv_data, v.mv_size)) {
          st = Status::Corrupt(fmt::format("LMDB entry #{} lies outside the data file", keys.size()),
                               Location{.file = env_->data_path()});
          break;
        }
        std::string key(static_cast<const char*>(k.mv_data), k.mv_size);
        if (wild::IsSideEntry(key)) {
          if (key == "__len__") len_entry.emplace(key, View(env_, v.mv_data, v.mv_size));
          continue;
        }
        keys.push_back(std::move(key));
      }
      mdb_cursor_close(cur);
    }
    env_->Release(txn);
    SK_RETURN_IF_ERROR(st);
    if (rc != MDB_NOTFOUND)
      return MdbStatus(rc, fmt::format("scanning LMDB keys after {}", keys.size()), Location{.file = env_->data_path()});
    if (len_entry) SK_RETURN_IF_ERROR(wild::CheckLen(len_entry->first, len_entry->second, keys.size(), env_->data_path()));
    wild_ = std::make_shared<const wild::Catalog>(wild::MakeCatalog(kind, std::move(keys)));
    return Status::OK();
  }

  // Caffe layout: one cursor scan for the keys, so Get(i) is one mdb_get.
  Status ScanKeys() {
    auto keys = std::make_shared<std::vector<std::string>>();
    keys->reserve(size_t(count_));
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    Status st;
    if (rc == 0) {
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size)) {
          st = Status::Corrupt(fmt::format("LMDB key #{} lies outside the data file", keys->size()),
                               Location{.file = env_->data_path()});
          break;
        }
        keys->emplace_back(static_cast<const char*>(k.mv_data), k.mv_size);
      }
      mdb_cursor_close(cur);
    }
    env_->Release(txn);
    SK_RETURN_IF_ERROR(st);
    if (rc != MDB_NOTFOUND)
      return MdbStatus(rc, fmt::format("scanning LMDB keys after {}", keys->size()), Location{.file = env_->data_path()});
    if (keys->size() != count_)
      return Status::Corrupt(fmt::format("LMDB in '{}' holds {} keys but lists {} entries", env_->dir(), keys->size(), count_),
                             Location{.file = env_->data_path()});
    keys_ = std::move(keys);
    return Status::OK();
  }

  DatasetInfo info_;
  std::shared_ptr<Env> env_;
  Layout layout_ = Layout::kShardkit;
  uint64_t count_ = 0;
  std::shared_ptr<const std::vector<std::string>> keys_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;  // caffe layout, from shardkit.json
  std::shared_ptr<const wild::Catalog> wild_;          // wild layouts
};

// ----------------------------------------------------------------------------
// Writing.

// msgpack-cxx writes into this: either counting bytes or copying into place.
struct SpanBuffer {
  char* out = nullptr;  // null: count only
  size_t size = 0;
  void write(const char* p, size_t n) {
    if (out) std::memcpy(out + size, p, n);
    size += n;
  }
};

void PackRecord(SpanBuffer* buf, const Sample& s, uint64_t checksum) {
  msgpack::packer<SpanBuffer> pk(*buf);
  pk.pack_map(4);
  pk.pack_str(3).pack_str_body("key", 3);
  if (paths::IsValidUtf8(s.key)) pk.pack_str(uint32_t(s.key.size())).pack_str_body(s.key.data(), uint32_t(s.key.size()));
  else pk.pack_bin(uint32_t(s.key.size())).pack_bin_body(s.key.data(), uint32_t(s.key.size()));
  pk.pack_str(6).pack_str_body("fields", 6);
  pk.pack_map(uint32_t(s.fields.size()));
  for (const auto& f : s.fields) {
    pk.pack_str(uint32_t(f.ext.size())).pack_str_body(f.ext.data(), uint32_t(f.ext.size()));
    pk.pack_bin(uint32_t(f.data.size()));
    if (f.data.size()) pk.pack_bin_body(reinterpret_cast<const char*>(f.data.data()), uint32_t(f.data.size()));
  }
  pk.pack_str(4).pack_str_body("xxh3", 4);
  pk.pack_uint64(checksum);
  pk.pack_str(8).pack_str_body("key_xxh3", 8);
  pk.pack_uint64(paths::Hash(s.key.data(), s.key.size()));
}

class LmdbWriter : public SampleWriter {
 public:
  static Result<std::unique_ptr<SampleWriter>> Create(const std::string& address, const WriteOptions& opts) {
    std::string final_dir = paths::StripTrailingSlashes(address);
    Location loc{.file = final_dir};
    if (opts.lmdb.layout != "shardkit" && opts.lmdb.layout != "caffe")
      return Status::Invalid(fmt::format("unknown LMDB layout '{}' (shardkit or caffe)", opts.lmdb.layout), loc);
    // LMDB maps and writes its environment itself: it needs a local directory.
    // The staging directory, the journal and metadata files, the publish and
    // the fault points (ExternalIo) go through the seam.
    std::shared_ptr<FileSystem> fs = FileSystem::OrLocal(opts.filesystem);
    SK_RETURN_IF_ERROR(fs->LocalPath(final_dir).status());
    // Resumable state of an interrupted write: "<dir>.partial" with resume.json.
    const std::string stable = final_dir + ".partial";
    const bool has_journal = fs->Exists(stable + "/" + kResumeName);
    const bool resuming = opts.resume && has_journal;
    if (has_journal && !opts.resume && !opts.overwrite)
      return Status::Exists("an interrupted write left its committed samples here: pass --resume to continue it, "
                            "or --overwrite to start over",
                            Location{.file = stable});
    SK_ASSIGN_OR_RETURN(FileInfo existing, fs->Stat(final_dir));
    if (existing.type != FileType::kNotFound && !opts.overwrite) return io::OutputExists(final_dir);
    if (existing.type != FileType::kNotFound) {
      // overwrite replaces an LMDB directory (or an empty one), never anything else.
      bool replaceable = existing.type == FileType::kDirectory;
      if (replaceable && !fs->Exists(final_dir + "/data.mdb")) {
        auto entries = fs->ListDir(final_dir);
        replaceable = entries.ok() && entries->empty();
      }
      if (!replaceable)
        return Status::Exists("refusing to replace it: it is not an LMDB directory (no data.mdb)", loc);
    }
    std::unique_ptr<LmdbWriter> w(new LmdbWriter());
    w->fs_ = std::move(fs);
    w->final_ = final_dir;
    w->opts_ = opts;
    w->layout_ = opts.lmdb.layout == "caffe" ? Layout::kCaffe : Layout::kShardkit;
    w->temp_ = stable;
    w->keep_state_ = opts.resume;
    w->batch_limit_ = lmdb::g_batch_samples ? lmdb::g_batch_samples.load() : kDefaultBatchSamples;
    w->durable_bytes_ = lmdb::g_durable_bytes ? lmdb::g_durable_bytes.load() : kDurableBytes;
    w->durable_every_commit_ = lmdb::g_batch_samples != 0 && lmdb::g_durable_bytes == 0;
    Location tl{.file = w->temp_};
    SK_RETURN_IF_ERROR(w->fs_->MakeDirs(w->temp_));
    // One writer per output: an exclusive lock on the partial directory.
    w->lock_fd_ = ::open(w->temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->lock_fd_ < 0) return Status::FromErrno(errno, "cannot open the partial directory", tl);
    if (::flock(w->lock_fd_, LOCK_EX | LOCK_NB) != 0)
      return Status::Exists("another process is writing this output", tl);
    w->created_ = true;
    if (!resuming) {
      // A leftover of an earlier run (killed, or started over with --overwrite).
      auto entries = w->fs_->ListDir(w->temp_);
      if (entries.ok())
        for (const auto& e : *entries) (void)w->fs_->RemoveAll(e.path);
    }
    w->digest_ = XXH3_createState();
    XXH3_64bits_reset(w->digest_);
    if (resuming) {
      SK_RETURN_IF_ERROR(w->LoadJournal());
      SK_RETURN_IF_ERROR(w->CheckPartial());
    }
    int rc = mdb_env_create(&w->env_);
    if (rc) return MdbStatus(rc, "mdb_env_create", tl);
    w->map_size_ = lmdb::g_initial_map ? lmdb::g_initial_map.load() : kDefaultMapSize;
    rc = mdb_env_set_mapsize(w->env_, w->map_size_);
    if (rc) return MdbStatus(rc, "mdb_env_set_mapsize", tl);
    // No WRITEMAP: it would ftruncate data.mdb to the whole (1 TiB) map size.
    rc = mdb_env_open(w->env_, w->temp_.c_str(), MDB_NOSYNC | MDB_NOMETASYNC, 0644);
    if (rc) return MdbStatus(rc, "cannot create the LMDB environment", tl);
    w->max_key_ = size_t(mdb_env_get_maxkeysize(w->env_));
    if (w->layout_ == Layout::kCaffe) w->tj_ = tjInitDecompress();
    if (resuming) SK_RETURN_IF_ERROR(w->TrimToJournal());
    SK_RETURN_IF_ERROR(w->BeginTxn());
    return std::unique_ptr<SampleWriter>(std::move(w));
  }

  ~LmdbWriter() override {
    if (txn_) mdb_txn_abort(txn_);
    if (env_) mdb_env_close(env_);
    if (tj_) tjDestroy(tj_);
    if (digest_) XXH3_freeState(digest_);
    if (created_ && !finished_ && !keep_state_) (void)fs_->RemoveAll(temp_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  Status Write(const Sample& s) override {
    if (failed_) return Status::Invalid("writer already failed", Location{.file = final_});
    if (finished_) return Status::Invalid("Write() after Finish()", Location{.file = final_});
    if (skipped_ < resume_samples_) return Skip(s);
    Status st = WriteOne(s);
    if (!st.ok()) {
      // An invalid sample is refused without harming the rest; an LMDB failure ends the writer.
      if (st.code() != Code::kInvalidArgument && st.code() != Code::kUnsupported) st = Resumable(std::move(st));
    }
    return st;
  }

  Result<WriteSummary> Finish() override {
    Location loc{.file = final_};
    if (failed_) return Status::Invalid("writer failed earlier; nothing was finished", loc);
    if (finished_) return Status::Invalid("Finish() called twice", loc);
    if (skipped_ < resume_samples_) return resume::SourceEndedEarly(skipped_, resume_samples_, Location{.file = temp_});
    Result<WriteSummary> r = FinishImpl();
    if (!r.ok() && !finished_) return Resumable(std::move(r).take_status());
    return r;
  }

 private:
  Result<WriteSummary> FinishImpl() {
    Location loc{.file = final_};
    failed_ = true;  // until proven otherwise
    SK_RETURN_IF_ERROR(CommitTxn());
    // data.mdb is complete now: without MDB_WRITEMAP every commit has written
    // its pages with pwrite, and mdb_env_sync only flushes them. So its XXH3
    // (read from the page cache through a mapping) runs while the disk syncs.
    std::string data = temp_ + "/data.mdb";
    Result<uint64_t> hash = Status::Internal("not hashed");
    std::thread hasher;
    try {
      hasher = std::thread([&] { hash = HashMapped(data); });
    } catch (const std::system_error&) {
      hash = HashMapped(data);  // no thread to spare: one after the other
    }
    Status synced = fs_->ExternalIo(data, ExternalOp::kSync);
    int rc = synced.ok() ? mdb_env_sync(env_, 1) : 0;
    if (hasher.joinable()) hasher.join();
    SK_RETURN_IF_ERROR(synced);
    if (rc) return MdbStatus(rc, "mdb_env_sync", Location{.file = temp_});
    committed_ += unsynced_;
    unsynced_ = 0;
    SK_RETURN_IF_ERROR(hash.status());
    mdb_env_close(env_);
    env_ = nullptr;
    std::error_code ec;
    uint64_t data_bytes = fs::file_size(data, ec);
    ShardInfo shard{.path = final_ + "/data.mdb", .samples = count_, .bytes = data_bytes,
                    .checksum = paths::ChecksumString(*hash)};
    json j;
    j["format"] = "shardkit-lmdb";
    j["version"] = kFormatVersion;
    j["layout"] = layout_ == Layout::kShardkit ? "shardkit" : "caffe";
    j["num_samples"] = count_;
    j["class_names"] = opts_.class_names;
    j["fields"] = std::vector<std::string>(fields_.begin(), fields_.end());
    j["payload_bytes"] = payload_bytes_;
    j["data_file"] = {{"path", "data.mdb"}, {"bytes", data_bytes}, {"checksum", shard.checksum}};
    if (layout_ == Layout::kShardkit) {
      j["key"] = "%010d sample index";
      j["value"] = "msgpack map {\"key\": str|bin, \"fields\": {ext: bin}, \"xxh3\": uint64, \"key_xxh3\": uint64}";
    } else {
      j["key"] = "%08d_<key>.<image ext>";
      j["value"] = "caffe.Datum protobuf (encoded=true)";
      j["sample_checksums"] = caffe_sums_;
    }
    std::string text = j.dump(1);
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(temp_ + "/" + kMetaName, text, true, fs_));
    // Complete: the journal (when a durable point wrote one) is not part of the output.
    const std::string journal = temp_ + "/" + kResumeName;
    if (fs_->Exists(journal)) {
      SK_RETURN_IF_ERROR(fs_->Remove(journal));
      SK_RETURN_IF_ERROR(fs_->SyncDir(temp_));
    }
    // Into place (an existing output, with overwrite, is moved aside and removed).
    SK_RETURN_IF_ERROR(
        fs_->Publish(temp_, final_, PublishOptions{.replace = opts_.overwrite, .published = &finished_}).At(loc));
    failed_ = false;
    WriteSummary sum;
    sum.samples = count_;
    sum.bytes = data_bytes + text.size();
    sum.shards.push_back(shard);
    return sum;
  }

  LmdbWriter() = default;

  // A failure that ends the writer: the committed samples stay (with resume.json)
  // and the message says how to continue.
  Status Resumable(Status st) {
    failed_ = true;
    if (!journal_written_) return st;
    keep_state_ = true;
    return Status(st.code(),
                  fmt::format("{}; the {} samples committed so far are kept in '{}': run the same conversion "
                              "again with --resume to continue",
                              st.message(), committed_, temp_),
                  st.where());
  }

  json JournalOptions() const {
    json o;
    o["layout"] = layout_ == Layout::kShardkit ? "shardkit" : "caffe";
    o["class_names"] = opts_.class_names;
    return o;
  }

  // resume.json: the samples committed so far and a digest of them (XXH3 over
  // each sample's checksum and key), rewritten after every durable commit.
  Status WriteJournal() {
    json j;
    j["format"] = "shardkit-lmdb-partial";
    j["version"] = 1;
    j["options"] = JournalOptions();
    j["samples"] = committed_;
    j["digest"] = paths::ChecksumString(XXH3_64bits_digest(digest_));
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(temp_ + "/" + kResumeName, j.dump(1) + "\n", true, fs_));
    journal_written_ = true;
    return Status::OK();
  }

  Status LoadJournal() {
    std::string path = temp_ + "/" + kResumeName;
    Location where{.file = path};
    SK_ASSIGN_OR_RETURN(std::string text, fs_->ReadFile(path));
    uint64_t samples = 0, digest = 0;
    try {
      json j = json::parse(text);
      if (j.value("format", "") != "shardkit-lmdb-partial" || j.value("version", 0) != 1)
        return Status::Corrupt("cannot resume: not a shardkit LMDB journal", where);
      SK_RETURN_IF_ERROR(resume::CheckSameOptions(j["options"], JournalOptions(), where));
      samples = j.at("samples").get<uint64_t>();
      std::string d = j.at("digest").get<std::string>();
      if (d.size() != 21 || d.substr(0, 5) != "xxh3:") return Status::Corrupt("cannot resume: bad digest", where);
      digest = std::stoull(d.substr(5), nullptr, 16);
    } catch (const std::exception& e) {
      return Status::Corrupt(fmt::format("cannot resume: bad journal: {}", e.what()), where);
    }
    resume_samples_ = samples;
    resume_digest_ = digest;
    return Status::OK();
  }

  // Before the writer opens the partial environment: reads it the way a reader
  // does (meta pages, the B-tree walked through the map, every record of the
  // first resume_samples_ decoded and, in the shardkit layout, checked against
  // its own xxh3), and keeps each of those samples' checksum for Skip(). Commits
  // between durable points are not synced (MDB_NOSYNC): after a power loss the
  // environment may be damaged, and then the resume is refused instead of
  // building on it.
  Status CheckPartial() {
    std::string data = temp_ + "/data.mdb";
    if (!fs_->Exists(data)) return Status::OK();  // TrimToJournal reports the missing samples
    auto refuse = [&](const Status& why) {
      return Status::Corrupt(fmt::format("cannot resume: the committed samples in '{}' are damaged ({}); start over "
                                         "with --overwrite",
                                         temp_, why.message()),
                             why.where().file.empty() ? Location{.file = data} : why.where());
    };
    auto opened = Env::OpenNew(temp_);
    if (!opened.ok()) return refuse(opened.status());
    std::shared_ptr<Env> env = std::move(opened).value();
    if (env->entries() < resume_samples_) return Status::OK();  // TrimToJournal says so
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env->dbi(), &cur);
    Status st;
    resume_sums_.clear();
    resume_sums_.reserve(resume_samples_);
    MDB_val k, v;
    for (uint64_t i = 0; rc == 0 && st.ok() && i < resume_samples_; ++i) {
      rc = mdb_cursor_get(cur, &k, &v, i == 0 ? MDB_FIRST : MDB_NEXT);
      if (rc) break;
      if (!env->InMap(k.mv_data, k.mv_size)) {
        st = Status::Corrupt(fmt::format("LMDB key of sample {} lies outside the data file", i), Location{.file = data});
        break;
      }
      std::string_view lkey(static_cast<const char*>(k.mv_data), k.mv_size);
      Sample s;
      if (layout_ == Layout::kShardkit) {
        if (lkey != IndexKey(i)) {
          st = Status::Corrupt(fmt::format("LMDB key '{}' where '{}' was expected", lkey, IndexKey(i)),
                               Location{.file = data, .index = int64_t(i)});
          break;
        }
        uint64_t sum = 0;
        st = DecodeRecord(env.get(), env, lkey, v, i, &s, /*check_payload=*/true, &sum);
        if (st.ok()) resume_sums_.push_back(sum ? sum : s.checksum());
      } else {
        st = DecodeDatum(env.get(), env, lkey, v, i, &s);
        if (st.ok()) resume_sums_.push_back(s.checksum());
      }
    }
    if (cur) mdb_cursor_close(cur);
    env->Release(txn);
    if (!st.ok()) return refuse(st);
    if (rc) return refuse(MdbStatus(rc, "reading the committed samples", Location{.file = data}));
    return Status::OK();
  }

  // The environment may hold more than the journal counts: transactions
  // committed after the last durable point. Those entries (the last ones, keys
  // being in sample order) go, and are written again.
  Status TrimToJournal() {
    const uint64_t samples = resume_samples_, digest = resume_digest_;
    SK_RETURN_IF_ERROR(BeginTxn());
    MDB_stat st;
    int rc = mdb_stat(txn_, dbi_, &st);
    if (rc) return MdbStatus(rc, "mdb_stat", Location{.file = temp_});
    if (st.ms_entries < samples)
      return Status::Corrupt(fmt::format("cannot resume: the environment holds {} samples, the journal says {} "
                                         "were committed; start over with --overwrite",
                                         st.ms_entries, samples),
                             Location{.file = temp_ + "/data.mdb"});
    if (st.ms_entries > samples) {
      MDB_cursor* cur = nullptr;
      rc = mdb_cursor_open(txn_, dbi_, &cur);
      for (uint64_t i = samples; rc == 0 && i < st.ms_entries; ++i) {
        MDB_val k, v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
        if (rc == 0) rc = mdb_cursor_del(cur, 0);
      }
      if (cur) mdb_cursor_close(cur);
      if (rc) return MdbStatus(rc, "removing samples past the journal", Location{.file = temp_});
    }
    SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kWrite));
    rc = mdb_txn_commit(txn_);
    txn_ = nullptr;
    if (rc) return MdbStatus(rc, "committing a write transaction", Location{.file = temp_});
    resume_samples_ = samples;
    resume_digest_ = digest;
    journal_written_ = true;
    return Status::OK();
  }

  // A sample the resumed write had committed: counted into the digest (checked
  // after the last one) and into the metadata, not written again.
  Status Skip(const Sample& s) {
    uint64_t sum = s.checksum();
    if (skipped_ < resume_sums_.size() && resume_sums_[skipped_] != sum) {
      failed_ = true;
      return Status::Invalid(fmt::format("resume: the first {} samples differ from the ones the interrupted write "
                                         "committed: sample {} ('{}') has checksum {}, the committed one {}; resume "
                                         "needs the same source, in the same order, with the same options; start "
                                         "over with --overwrite",
                                         resume_samples_, skipped_, s.key, paths::ChecksumString(sum),
                                         paths::ChecksumString(resume_sums_[skipped_])),
                             Location{.file = temp_, .key = s.key, .index = int64_t(skipped_)});
    }
    paths::AddSampleToDigest(digest_, s.key, sum);
    ++skipped_;
    ++count_;
    ++committed_;
    payload_bytes_ += s.bytes();
    for (const auto& f : s.fields) fields_.insert(f.ext);
    if (layout_ == Layout::kCaffe) caffe_sums_.push_back(paths::ChecksumString(sum));
    if (skipped_ == resume_samples_ && XXH3_64bits_digest(digest_) != resume_digest_) {
      failed_ = true;
      return Status::Invalid(fmt::format("resume: the first {} samples differ from the ones the interrupted write "
                                         "committed (keys or bytes changed): resume needs the same source, in the "
                                         "same order, with the same options; start over with --overwrite",
                                         resume_samples_),
                             Location{.file = temp_, .key = s.key, .index = int64_t(skipped_ - 1)});
    }
    return Status::OK();
  }

  Status BeginTxn() {
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn_);
    if (rc) return MdbStatus(rc, "cannot begin a write transaction", Location{.file = temp_});
    rc = mdb_dbi_open(txn_, nullptr, 0, &dbi_);
    if (rc) return MdbStatus(rc, "cannot open the unnamed database", Location{.file = temp_});
    return Status::OK();
  }

  // Checks the sample and builds its LMDB key (and, for caffe, its Datum).
  Status Prepare(const Sample& s, uint64_t index, std::string* lkey, std::string* datum) {
    Location loc{.file = final_, .key = s.key, .index = int64_t(index)};
    if (s.key.empty()) return Status::Invalid("empty sample key", loc);
    if (s.key.find('\0') != std::string::npos) return Status::Invalid(fmt::format("sample key '{}' holds a NUL byte", s.key), loc);
    for (const auto& f : s.fields)
      if (f.ext.empty()) return Status::Invalid(fmt::format("sample '{}' has a field with an empty name", s.key), loc);
    if (layout_ == Layout::kShardkit) {
      *lkey = IndexKey(index);
      return Status::OK();
    }
    if (index > 99999999)
      return Status::Unsupported("the caffe layout's %08d key prefix holds at most 100000000 samples", loc);
    const Field* img = nullptr;
    for (const auto& f : s.fields) {
      if (f.ext == "cls") continue;
      if (!IsImageExt(f.ext) || img)
        return Status::Unsupported(
            fmt::format("sample '{}': the caffe layout holds one image and a label, not field '{}'", s.key, f.ext), loc);
      img = &f;
    }
    if (!img) return Status::Invalid(fmt::format("sample '{}' has no image field for the caffe layout", s.key), loc);
    // Caffe's convert_imageset keys by the listed file name as it is: "x_0.JPEG" stays upper-case.
    *lkey = fmt::format("{:08d}_{}.{}", index, s.key, img->source_ext.empty() ? img->ext : img->source_ext);
    if (lkey->size() > max_key_)
      return Status::Invalid(fmt::format("LMDB key '{}' for sample '{}' is {} bytes, over LMDB's limit of {}", *lkey,
                                         s.key, lkey->size(), max_key_),
                             loc);
    caffe::Datum d;
    ImageShape shape = PeekShape(tj_, img->data);
    if (shape.channels) d.set_channels(shape.channels);
    if (shape.height) d.set_height(shape.height);
    if (shape.width) d.set_width(shape.width);
    d.set_data(img->data.data(), img->data.size());
    if (s.find("cls")) {
      auto label = s.label();
      if (!label || *label < INT32_MIN || *label > INT32_MAX)
        return Status::Invalid(fmt::format("sample '{}': cls '{}' is not an int32 label", s.key, s.find("cls")->data.str()), loc);
      d.set_label(int32_t(*label));
    }
    d.set_encoded(true);
    if (!d.SerializeToString(datum)) return Status::Internal("Datum serialization failed", loc);
    return Status::OK();
  }

  // Puts one sample into the open transaction. Returns the raw LMDB code.
  int Put(const Sample& s, const std::string& lkey, const std::string& datum, uint64_t checksum) {
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())};
    if (layout_ == Layout::kCaffe) {
      MDB_val v{datum.size(), const_cast<char*>(datum.data())};
      return mdb_put(txn_, dbi_, &k, &v, MDB_APPEND);
    }
    SpanBuffer count;
    PackRecord(&count, s, checksum);
    MDB_val v{count.size, nullptr};
    int rc = mdb_put(txn_, dbi_, &k, &v, MDB_APPEND | MDB_RESERVE);
    if (rc) return rc;
    SpanBuffer out{static_cast<char*>(v.mv_data), 0};
    PackRecord(&out, s, checksum);
    return 0;
  }

  struct Pending {
    Sample sample;
    std::string lkey, datum;
    uint64_t checksum;
  };

  Status WriteOne(const Sample& s) {
    Pending p{s, {}, {}, s.checksum()};
    SK_RETURN_IF_ERROR(Prepare(s, count_, &p.lkey, &p.datum));
    for (;;) {
      int rc = Put(p.sample, p.lkey, p.datum, p.checksum);
      if (rc == 0) break;
      if (rc == MDB_MAP_FULL) {
        SK_RETURN_IF_ERROR(GrowAndReplay(p.sample.bytes() + p.datum.size()));
        continue;
      }
      if (rc == MDB_KEYEXIST)
        return Status::Internal(fmt::format("LMDB key '{}' out of order for MDB_APPEND", p.lkey),
                                Location{.file = final_, .key = s.key});
      return MdbStatus(rc, fmt::format("mdb_put of LMDB key '{}' (sample '{}')", p.lkey, s.key),
                       Location{.file = temp_, .key = s.key, .index = int64_t(count_)});
    }
    ++count_;
    paths::AddSampleToDigest(digest_, s.key, p.checksum);
    payload_bytes_ += s.bytes();
    batch_bytes_ += s.bytes();
    for (const auto& f : s.fields) fields_.insert(f.ext);
    if (layout_ == Layout::kCaffe) caffe_sums_.push_back(paths::ChecksumString(p.checksum));
    batch_.push_back(std::move(p));
    if (batch_.size() >= batch_limit_ || batch_bytes_ >= kBatchBytes) return Commit();
    return Status::OK();
  }

  // MDB_MAP_FULL: abort the open transaction, grow the map with no transaction
  // active, and put the batch's samples again.
  Status GrowAndReplay(size_t need) {
    mdb_txn_abort(txn_);
    txn_ = nullptr;
    for (;;) {
      size_t grow = std::max(map_size_, need * 2 + (size_t(1) << 20));
      map_size_ += grow;
      int rc = mdb_env_set_mapsize(env_, map_size_);
      if (rc) return MdbStatus(rc, fmt::format("growing the LMDB map to {} bytes", map_size_), Location{.file = temp_});
      ++grows_;
      SK_RETURN_IF_ERROR(BeginTxn());
      rc = 0;
      for (const auto& q : batch_) {
        rc = Put(q.sample, q.lkey, q.datum, q.checksum);
        if (rc) break;
      }
      if (rc == 0) return Status::OK();
      mdb_txn_abort(txn_);
      txn_ = nullptr;
      if (rc != MDB_MAP_FULL) return MdbStatus(rc, "replaying a batch after growing the map", Location{.file = temp_});
    }
  }

  // Commits the open transaction (not synced) and begins the next one. Every
  // kDurableBytes / kDurableSeconds (or every commit when a test set the batch
  // size) it also makes a durable point: what the journal counts is on disk.
  Status Commit() {
    SK_RETURN_IF_ERROR(CommitTxn());
    bool due = durable_every_commit_ || unsynced_bytes_ >= durable_bytes_ ||
               std::chrono::duration<double>(std::chrono::steady_clock::now() - last_durable_).count() >= kDurableSeconds;
    if (due) SK_RETURN_IF_ERROR(MakeDurable());
    return BeginTxn();
  }

  // Durable before the journal says so: a resume after a crash or power loss
  // finds every sample the journal counts.
  Status MakeDurable() {
    SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kSync));
    int rc = mdb_env_sync(env_, 1);
    if (rc) return MdbStatus(rc, "mdb_env_sync", Location{.file = temp_});
    committed_ += unsynced_;
    unsynced_ = 0;
    unsynced_bytes_ = 0;
    last_durable_ = std::chrono::steady_clock::now();
    return WriteJournal();
  }

  // Commits the open transaction; txn_ is null after it.
  Status CommitTxn() {
    for (;;) {
      SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kWrite));
      int rc = mdb_txn_commit(txn_);
      txn_ = nullptr;
      if (rc == 0) break;
      if (rc != MDB_MAP_FULL) return MdbStatus(rc, "committing a write transaction", Location{.file = temp_});
      // The commit itself ran out of map (free-list pages): grow and replay.
      SK_RETURN_IF_ERROR(BeginTxn());  // GrowAndReplay aborts it first
      SK_RETURN_IF_ERROR(GrowAndReplay(0));
    }
    unsynced_ += batch_.size();
    unsynced_bytes_ += batch_bytes_;
    writeback_bytes_ += batch_bytes_;
    if (writeback_bytes_ >= kWritebackBytes) {
      writeback_bytes_ = 0;
      int fd = -1;
      // A hint only: durability comes from mdb_env_sync, so its result is ignored.
      if (mdb_env_get_fd(env_, &fd) == 0 && fd >= 0) (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    batch_.clear();
    batch_bytes_ = 0;
    return Status::OK();
  }

  std::shared_ptr<FileSystem> fs_;  // opts_.filesystem or the local one
  std::string final_, temp_;
  WriteOptions opts_;
  Layout layout_ = Layout::kShardkit;
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  tjhandle tj_ = nullptr;
  size_t map_size_ = 0, max_key_ = 511, batch_limit_ = kDefaultBatchSamples;
  uint64_t count_ = 0, payload_bytes_ = 0, batch_bytes_ = 0, grows_ = 0;
  std::vector<Pending> batch_;
  std::set<std::string> fields_;
  std::vector<std::string> caffe_sums_;
  bool created_ = false, finished_ = false, failed_ = false;
  // Resumable writes.
  int lock_fd_ = -1;
  bool keep_state_ = false, journal_written_ = false;
  XXH3_state_t* digest_ = nullptr;  // of the samples written (committed or in the open batch)
  uint64_t committed_ = 0;          // samples committed and synced (what resume.json counts)
  uint64_t unsynced_ = 0, unsynced_bytes_ = 0;  // committed since the last durable point
  uint64_t writeback_bytes_ = 0;                // committed since the last writeback hint
  bool durable_every_commit_ = false;
  uint64_t durable_bytes_ = kDurableBytes;
  std::chrono::steady_clock::time_point last_durable_ = std::chrono::steady_clock::now();
  uint64_t resume_samples_ = 0, resume_digest_ = 0, skipped_ = 0;
  std::vector<uint64_t> resume_sums_;  // checksums of the committed samples, read back by CheckPartial()
};

// Whether a data file starts with an LMDB meta page: MDB_meta's mm_magic
// (0xBEEFC0DE, host order) right after the 16-byte page header of page 0.
bool HasMetaPage(const std::string& data_path) {
  int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint8_t head[20];
  ssize_t r = ::pread(fd, head, sizeof head, 0);
  ::close(fd);
  uint32_t magic = 0;
  if (r == ssize_t(sizeof head)) std::memcpy(&magic, head + 16, 4);
  return magic == 0xBEEFC0DEu;
}

int BidRead(const std::string& path) {
  std::string p = paths::StripTrailingSlashes(path);
  std::string data;
  if (io::IsDir(p)) data = p + "/data.mdb";
  else if (fs::path(p).filename() == "data.mdb") data = p;
  else return 0;
  if (!io::Exists(data)) return 0;
  return HasMetaPage(data) ? 100 : 95;  // a damaged data.mdb is still LMDB's to report on
}

int BidWrite(const std::string& path) {
  std::string p = paths::StripTrailingSlashes(path);
  return p.size() > 5 && p.ends_with(".lmdb") ? 90 : 0;
}

}  // namespace

Format LmdbFormat() {
  return Format{
      .name = "lmdb",
      .description = "LMDB environment directory (layouts: shardkit msgpack records, caffe Datum, image bytes, pickles)",
      .bid_read = BidRead,
      .bid_write = BidWrite,
      .open = [](const std::string& path, const OpenOptions& opts) { return LmdbDataset::Open(path, opts); },
      .create = [](const std::string& path, const WriteOptions& opts) { return LmdbWriter::Create(path, opts); },
      .extensions = {"mdb", "lmdb"},
  };
}

}  // namespace shardkit::formats
