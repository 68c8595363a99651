// The local shard cache (shard_cache.h).
#include "io/shard_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/paths.h"
#include "io/file.h"

namespace shardkit::io {

namespace {

constexpr std::string_view kTmp = ".tmp.";
constexpr std::string_view kLock = ".lock";

bool IsEntry(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find(kTmp) == std::string::npos && !name.ends_with(kLock);
}

std::string EntryName(const std::string& address, uint64_t size) {
  std::string base = address;
  while (!base.empty() && base.back() == '/') base.pop_back();
  auto slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  auto q = base.find_first_of("?#");
  if (q != std::string::npos) base = base.substr(0, q);
  for (char& c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  if (base.size() > 80) base = base.substr(base.size() - 80);
  return fmt::format("{:016x}-{}-{}", XXH3_64bits(address.data(), address.size()), size, base);
}

// Removes least recently used entries until `incoming` more bytes fit in max_bytes.
void Trim(const std::string& dir, uint64_t max_bytes, uint64_t incoming, const std::string& keep) {
  struct E {
    std::string path;
    uint64_t size;
    int64_t mtime_ns;
  };
  std::vector<E> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!IsEntry(name)) continue;
    struct stat st{};
    if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({it->path().string(), uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
    total += uint64_t(st.st_size);
  }
  if (total + incoming <= max_bytes) return;
  std::sort(entries.begin(), entries.end(), [](const E& a, const E& b) { return a.mtime_ns < b.mtime_ns; });
  for (const auto& e : entries) {
    if (total + incoming <= max_bytes) break;
    if (e.path == keep) continue;
    if (::unlink(e.path.c_str()) == 0) total -= e.size;
  }
}

// Into `tmp`, hashed (XXH3-64, paths::HashFile's) into *hash as it is written.
Status Download(FileSystem& fs, const std::string& address, uint64_t size, const std::string& tmp, uint64_t* hash) {
  SK_ASSIGN_OR_RETURN(auto in, fs.OpenForRead(address));
  if (in->size() != size)
    return Status::Corrupt(fmt::format("object has {} bytes, expected {} (changed since it was listed?)", in->size(), size),
                           Location{.file = address});
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) return Status::Internal("cannot make an XXH3 state");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "cannot create a cache file", Location{.file = tmp});
  constexpr size_t kChunk = 16 << 20;
  std::unique_ptr<char[]> buf(new char[std::min<uint64_t>(kChunk, std::max<uint64_t>(size, 1))]);
  Status st;
  for (uint64_t off = 0; off < size && st.ok();) {
    size_t n = size_t(std::min<uint64_t>(kChunk, size - off));
    auto r = in->ReadAt(off, n, buf.get());
    if (!r.ok()) {
      st = std::move(r).take_status();
      break;
    }
    if (*r != n) {
      st = Status::IOError(fmt::format("short read: {} of {} bytes", *r, n), Location{.file = address, .offset = int64_t(off)});
      break;
    }
    (void)XXH3_64bits_update(state.get(), buf.get(), n);
    for (size_t done = 0; done < n;) {
      ssize_t w = ::write(fd, buf.get() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        st = Status::FromErrno(errno, "cannot write the cache file", Location{.file = tmp});
        break;
      }
      done += size_t(w);
    }
    off += n;
  }
  *hash = XXH3_64bits_digest(state.get());
  if (st.ok() && ::fsync(fd) != 0) st = Status::FromErrno(errno, "cannot sync the cache file", Location{.file = tmp});
  ::close(fd);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace

Result<std::string> CachedCopy(FileSystem& fs, const std::string& address, uint64_t size, const CacheOptions& opts,
                               std::string_view checksum) {
  // (Another form of checksum is not one the copy can be checked against here.)
  const std::optional<uint64_t> want = paths::ParseChecksumString(checksum);
  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec) return Status::IOError("cannot create the cache directory: " + ec.message(), Location{.file = opts.dir});
  std::string name = EntryName(address, size);
  std::string path = opts.dir + "/" + name;
  auto hit = [&]() {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0 || uint64_t(st.st_size) != size) return false;
    (void)::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // most recently used
    return true;
  };
  if (hit()) return path;
  SK_ASSIGN_OR_RETURN(auto entry, FileLock::Lock(path + std::string(kLock)));
  if (hit()) return path;  // another process or thread fetched it while we waited
  if (opts.max_bytes) {
    SK_ASSIGN_OR_RETURN(auto evict, FileLock::Lock(opts.dir + "/.evict.lock"));
    Trim(opts.dir, opts.max_bytes, size, path);
  }
  static std::atomic<uint64_t> counter{0};
  std::string tmp = fmt::format("{}{}{}.{}", path, kTmp, ::getpid(), counter++);
  // A copy whose bytes differ from the checksum (a corrupted transfer that still had the
  // right length) is downloaded once more; a second mismatch is the object's own.
  for (int attempt = 1;; ++attempt) {
    uint64_t got = 0;
    SK_RETURN_IF_ERROR(Download(fs, address, size, tmp, &got));
    if (!want || got == *want) break;
    ::unlink(tmp.c_str());
    if (attempt == 2)
      return Status::Corrupt(fmt::format("the downloaded copy's checksum is {}, not the {} the manifest gives "
                                         "(downloaded twice)",
                                         paths::ChecksumString(got), checksum),
                             Location{.file = address});
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::FromErrno(errno, "cannot move a downloaded shard into the cache", Location{.file = path});
    ::unlink(tmp.c_str());
    return s;
  }
  return path;
}

bool IsUrl(std::string_view p) {
  auto sep = p.find("://");
  if (sep == std::string_view::npos || sep == 0) return false;
  for (size_t i = 0; i < sep; ++i)
    if (!std::isalnum(static_cast<unsigned char>(p[i])) && p[i] != '+' && p[i] != '-' && p[i] != '.') return false;
  return p.substr(0, sep) != "file";
}

Result<std::string> ReadAnyFile(const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(path));
  return fs->ReadFile(path);
}

bool AnyExists(const std::string& path) {
  auto fs = FileSystemFor(path);
  return fs.ok() && (*fs)->Exists(path);
}

Result<uint64_t> AnySize(const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(path));
  SK_ASSIGN_OR_RETURN(FileInfo st, fs->Stat(path));
  if (st.type == FileType::kNotFound) return Status::NotFound("does not exist", Location{.file = path});
  return st.size;
}

Result<uint64_t> HashAnyFile(const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(path));
  SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(path));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::string buf(std::min<uint64_t>(16 << 20, std::max<uint64_t>(f->size(), 1)), '\0');
  for (uint64_t off = 0; off < f->size();) {
    SK_ASSIGN_OR_RETURN(size_t n, f->ReadAt(off, buf.size(), buf.data()));
    if (n == 0) return Status::IOError("file ended early", Location{.file = path, .offset = int64_t(off)});
    XXH3_64bits_update(st.get(), buf.data(), n);
    off += n;
  }
  return uint64_t(XXH3_64bits_digest(st.get()));
}

uint64_t CacheBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    struct stat st{};
    if (IsEntry(name) && ::stat(it->path().c_str(), &st) == 0) total += uint64_t(st.st_size);
  }
  return total;
}

}  // namespace shardkit::io
