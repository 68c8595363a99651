// The page cache of local files (page_cache.h).
#include "io/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>

#include "io/shard_cache.h"

namespace shardkit::io {

std::vector<std::string> LocalFilesUnder(const std::string& path) {
  std::vector<std::string> out;
  if (IsUrl(path)) return out;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
         it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec)) out.push_back(it->path().string());
    }
  } else if (std::filesystem::is_regular_file(path, ec)) {
    out.push_back(path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

double DropFromPageCache(const std::vector<std::string>& files) {
  uint64_t total = 0, kept = 0;
  long page = sysconf(_SC_PAGESIZE);
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      size_t pages = size_t((st.st_size + page - 1) / page);
      void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        std::vector<unsigned char> vec(pages);
        if (::mincore(m, size_t(st.st_size), vec.data()) == 0) {
          for (unsigned char v : vec) kept += (v & 1) ? uint64_t(page) : 0;
        }
        ::munmap(m, size_t(st.st_size));
      }
      total += uint64_t(pages) * uint64_t(page);
    }
    ::close(fd);
  }
  return total ? double(kept) / double(total) : 0.0;
}

void ReadThrough(const std::vector<std::string>& files) {
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }
}

}  // namespace shardkit::io
