// The local (POSIX) FileSystem: FileSystem::Local().
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "shardkit/filesystem.h"

namespace shardkit {
namespace {

Status OpenError(int err, const std::string& path) {
  if (err == ENOENT) return Status::NotFound("no such file", Location{.file = path});
  return Status::FromErrno(err, "cannot open", Location{.file = path});
}

// The owner of a whole-file mapping handed out as Bytes.
struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) ::munmap(data, size);
  }
};

class LocalReadable : public ReadableFile {
 public:
  LocalReadable(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~LocalReadable() override { ::close(fd_); }
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }

  Result<size_t> ReadAt(uint64_t offset, size_t n, void* dst) const override {
    char* p = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, p + done, n - done, off_t(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "read failed", Location{.file = path_, .offset = int64_t(offset + done)});
      }
      if (r == 0) break;
      done += size_t(r);
    }
    return done;
  }

  Result<Bytes> Map() const override {
    auto m = std::make_shared<Mapping>();
    if (size_ == 0) return Bytes();
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "cannot mmap", Location{.file = path_});
    m->data = p;
    m->size = size_;
    const uint8_t* data = static_cast<const uint8_t*>(p);
    return Bytes(std::shared_ptr<const void>(m, data), data, size_);
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class LocalWritable : public WritableFile {
 public:
  // writeback: hand full chunks to the disk as they are written (StartWriteback).
  LocalWritable(std::string path, int fd, bool writeback)
      : path_(std::move(path)), fd_(fd), writeback_(writeback ? 0 : UINT64_MAX) {}
  ~LocalWritable() override {
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& path() const override { return path_; }

  Status Append(const void* data, size_t size) override {
    if (fd_ < 0) return Status::Internal("write to a closed file", Location{.file = path_});
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write failed", Location{.file = path_, .offset = int64_t(written_)});
      }
      p += n;
      left -= size_t(n);
      written_ += uint64_t(n);
    }
    StartWriteback();
    return Status::OK();
  }

  Status Sync() override {
    if (fd_ < 0) return Status::Internal("fsync of a closed file", Location{.file = path_});
    if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync failed", Location{.file = path_});
    return Status::OK();
  }

  Status Close() override {
    if (fd_ < 0) return Status::OK();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return Status::FromErrno(errno, "close failed", Location{.file = path_});
    return Status::OK();
  }

 private:
  // Starts the disk write of every full kWritebackChunk written since the last call,
  // without waiting for it, so that the disk works while the rest of the file is made and
  // Sync() at the end waits only for the tail: a durable output then costs about the
  // slower of making it and the disk's write, not their sum (issue 18's convert goal). An
  // error here is not lost: fsync reports it.
  void StartWriteback() {
    static constexpr uint64_t kWritebackChunk = 8ull << 20;
    if (writeback_ == UINT64_MAX || written_ - writeback_ < kWritebackChunk) return;
    const uint64_t end = written_ - written_ % kWritebackChunk;
    ::sync_file_range(fd_, off_t(writeback_), off_t(end - writeback_), SYNC_FILE_RANGE_WRITE);
    writeback_ = end;
  }

  std::string path_;
  int fd_;
  uint64_t written_ = 0;
  uint64_t writeback_ = 0;  // [0, writeback_) has been handed to the disk; UINT64_MAX: never
};

// Creates a local file for appending (NewWritableFile, and io::NewCacheOnlyFile without
// the early writeback).
Result<std::unique_ptr<WritableFile>> CreateLocal(const std::string& path, CreateMode mode, bool writeback) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  flags |= mode == CreateMode::kExclusive ? (O_EXCL | O_NOFOLLOW) : O_TRUNC;
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (errno == EEXIST && mode == CreateMode::kExclusive) return Status::Exists("file exists", Location{.file = path});
    return Status::FromErrno(errno, "cannot create output file", Location{.file = path});
  }
  return std::unique_ptr<WritableFile>(new LocalWritable(path, fd, writeback));
}

FileType TypeOf(mode_t m) {
  if (S_ISREG(m)) return FileType::kFile;
  if (S_ISDIR(m)) return FileType::kDirectory;
  return FileType::kOther;
}

std::string LastComponent(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class LocalFileSystem : public FileSystem {
 public:
  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    // O_NONBLOCK: a FIFO put where a file was must not block the open.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return OpenError(errno, path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "cannot stat", Location{.file = path});
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::IOError("cannot read: not a regular file (a directory, FIFO, socket or device)",
                             Location{.file = path});
    }
    return std::unique_ptr<ReadableFile>(new LocalReadable(path, fd, uint64_t(st.st_size)));
  }

  Result<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return OpenError(errno, path);
    std::string out;
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(size_t(st.st_size));
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd);
        return Status::FromErrno(e, "read failed", Location{.file = path, .offset = int64_t(out.size())});
      }
      if (n == 0) break;
      out.append(buf, size_t(n));
    }
    ::close(fd);
    return out;
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, CreateMode mode) override {
    return CreateLocal(path, mode, /*writeback=*/true);
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return Status::FromErrno(errno, fmt::format("cannot rename to '{}'", to), Location{.file = from});
    return Status::OK();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open directory", Location{.file = dir});
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync directory", Location{.file = dir});
    return Status::OK();
  }

  Status SyncTree(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open directory", Location{.file = dir});
    int rc = ::syncfs(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "syncfs failed", Location{.file = dir});
    return Status::OK();
  }

  Result<FileInfo> Stat(const std::string& path) override {
    FileInfo fi;
    fi.path = path;
    fi.name = LastComponent(path);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return fi;
      return Status::FromErrno(errno, "cannot stat", Location{.file = path});
    }
    if (S_ISLNK(st.st_mode)) {
      fi.symlink = true;
      struct stat target;
      fi.type = ::stat(path.c_str(), &target) == 0 ? TypeOf(target.st_mode) : FileType::kOther;
      if (fi.type == FileType::kFile) fi.size = uint64_t(target.st_size);
      if (fi.type != FileType::kOther) fi.device = uint64_t(target.st_dev), fi.inode = uint64_t(target.st_ino);
      return fi;
    }
    fi.type = TypeOf(st.st_mode);
    if (fi.type == FileType::kFile) fi.size = uint64_t(st.st_size);
    fi.device = uint64_t(st.st_dev), fi.inode = uint64_t(st.st_ino);
    return fi;
  }

  Result<std::vector<FileInfo>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
      if (errno == ENOENT) return Status::NotFound("no such directory", Location{.file = dir});
      return Status::FromErrno(errno, "cannot list directory", Location{.file = dir});
    }
    std::vector<FileInfo> out;
    int e = 0;
    for (;;) {
      errno = 0;
      struct dirent* de = ::readdir(d);
      if (!de) {
        e = errno;
        break;
      }
      if (std::strcmp(de->d_name, ".") == 0 || std::strcmp(de->d_name, "..") == 0) continue;
      auto fi = Stat(dir + "/" + de->d_name);
      if (!fi.ok() || fi->type == FileType::kNotFound) continue;  // gone meanwhile, or cannot be looked at
      out.push_back(std::move(fi).value());
      out.back().name = de->d_name;
    }
    ::closedir(d);
    if (e != 0) return Status::FromErrno(e, "cannot list directory", Location{.file = dir});
    std::sort(out.begin(), out.end(), [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
    return out;
  }

  Status MakeDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError(fmt::format("cannot create directory: {}", ec.message()), Location{.file = dir});
    return Status::OK();
  }

  Status MakeNewDir(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0777) == 0) return Status::OK();
    if (errno == EEXIST) return Status::Exists("already exists", Location{.file = dir});
    return Status::FromErrno(errno, "cannot create directory", Location{.file = dir});
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::OK();
    if (errno == EISDIR || errno == EPERM) {
      if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return Status::OK();
    }
    return Status::FromErrno(errno, "cannot remove", Location{.file = path});
  }

  Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      return Status::IOError(fmt::format("cannot remove: {}", ec.message()), Location{.file = path});
    return Status::OK();
  }

  Result<std::string> LocalPath(const std::string& path) override { return path; }
};

}  // namespace

std::shared_ptr<FileSystem> FileSystem::Local() {
  static const std::shared_ptr<FileSystem> local = std::make_shared<LocalFileSystem>();
  return local;
}

namespace io {

Result<std::unique_ptr<WritableFile>> NewCacheOnlyFile(const std::string& path) {
  return CreateLocal(path, CreateMode::kTruncate, /*writeback=*/false);
}

}  // namespace io
}  // namespace shardkit
