// formats/lmdb/env.cc: LMDB return codes, the meta-page check, whole-file hashing and image
// header facts (internal.h).
#include "formats/lmdb/internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>
#include <thread>

#include <msgpack.hpp>

#include "core/per_thread.h"
#include "core/resume.h"

namespace shardkit::formats::lmdb {

std::atomic<size_t> g_initial_map{0};
std::atomic<size_t> g_batch_samples{0};
std::atomic<size_t> g_durable_bytes{0};
void SetInitialMapSizeForTest(size_t bytes) { g_initial_map = bytes; }
void SetBatchSamplesForTest(size_t n) { g_batch_samples = n; }
void SetDurableBytesForTest(size_t bytes) { g_durable_bytes = bytes; }

Location SampleLoc(Location loc, const std::string& sample_key) {
  loc.key = sample_key;
  return loc;
}

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


}  // namespace shardkit::formats::lmdb
