#include "core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

namespace shardkit::io {

namespace {
FaultHook& Hook() {
  static FaultHook h;
  return h;
}
constexpr size_t kBufSize = 4 << 20;
}  // namespace

void SetFaultHook(FaultHook hook) { Hook() = std::move(hook); }

Status CheckFault(const std::string& path, std::string_view op) {
  if (!Hook()) return Status::OK();
  int err = Hook()(path, op);
  if (err == 0) return Status::OK();
  return Status::FromErrno(err, fmt::format("{} failed", op), Location{.file = path});
}

std::string DirName(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status FsyncDir(const std::string& dir) {
  SK_RETURN_IF_ERROR(CheckFault(dir, "fsync"));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open directory", Location{.file = dir});
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::FromErrno(err, "fsync directory", Location{.file = dir});
  return Status::OK();
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError(fmt::format("cannot create directory: {}", ec.message()), Location{.file = dir});
  return Status::OK();
}

Result<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& final_path, bool overwrite) {
  if (!overwrite && Exists(final_path))
    return Status::Exists("output exists (pass --overwrite to replace it)", Location{.file = final_path});
  std::string dir = DirName(final_path);
  if (!IsDir(dir)) SK_RETURN_IF_ERROR(MakeDirs(dir));
  std::unique_ptr<AtomicFile> f(new AtomicFile());
  f->final_ = final_path;
  auto base = std::filesystem::path(final_path).filename().string();
  f->temp_ = (std::filesystem::path(dir) / fmt::format(".{}.tmp-{}", base, ::getpid())).string();
  f->fd_ = ::open(f->temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd_ < 0) return Status::FromErrno(errno, "cannot create output file", Location{.file = final_path});
  f->buf_.reserve(kBufSize);
  return f;
}

AtomicFile::~AtomicFile() { Abort(); }

void AtomicFile::Abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temp_.empty()) {
    ::unlink(temp_.c_str());
    temp_.clear();
  }
}

Status AtomicFile::Flush() {
  if (buf_.empty()) return Status::OK();
  SK_RETURN_IF_ERROR(CheckFault(final_, "write"));
  const char* p = buf_.data();
  size_t left = buf_.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write failed", Location{.file = final_, .offset = int64_t(size_ - left)});
    }
    p += n;
    left -= size_t(n);
  }
  buf_.clear();
  return Status::OK();
}

Status AtomicFile::Write(const void* data, size_t size) {
  if (fd_ < 0) return Status::Internal("write to a closed file", Location{.file = final_});
  const char* p = static_cast<const char*>(data);
  size_ += size;
  if (buf_.size() + size > kBufSize) {
    SK_RETURN_IF_ERROR(Flush());
    if (size >= kBufSize) {
      buf_.assign(p, size);  // large payloads go straight through
      return Flush();
    }
  }
  buf_.append(p, size);
  return Status::OK();
}

Status AtomicFile::Commit() {
  SK_RETURN_IF_ERROR(Flush());
  SK_RETURN_IF_ERROR(CheckFault(final_, "fsync"));
  if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync failed", Location{.file = final_});
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Status::FromErrno(errno, "close failed", Location{.file = final_});
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    return Status::FromErrno(errno, "rename into place failed", Location{.file = final_});
  committed_ = true;
  return FsyncDir(DirName(final_));
}

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::NotFound("no such file", Location{.file = path})
                                     : Status::FromErrno(errno, "cannot open", Location{.file = path});
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "cannot stat", Location{.file = path});
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = uint64_t(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "cannot mmap", Location{.file = path});
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::NotFound("no such file", Location{.file = path})
                                     : Status::FromErrno(errno, "cannot open", Location{.file = path});
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

Status WriteFileAtomic(const std::string& path, std::string_view contents, bool overwrite) {
  SK_ASSIGN_OR_RETURN(auto f, AtomicFile::Create(path, overwrite));
  SK_RETURN_IF_ERROR(f->Write(contents));
  return f->Commit();
}

}  // namespace shardkit::io
