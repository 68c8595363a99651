#include "io/file.h"
#include "io/shard_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

namespace shardkit::io {

namespace {
constexpr size_t kBufSize = 4 << 20;
// Writes at least this large skip the buffer: a copy costs more than the extra write call.
constexpr size_t kDirectSize = 64 << 10;
}  // namespace

Status OutputExists(const std::string& path, std::string_view what) {
  return Status::Exists(std::string(what), Location{.file = path}).With(Detail::kOutputExists);
}

std::string DirName(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

bool Exists(const std::string& path) {
  if (IsUrl(path)) return AnyExists(path);
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  if (IsUrl(path)) {
    auto fs = FileSystemFor(path);
    return fs.ok() && (*fs)->IsDir(path);
  }
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {
// The PID in "...PID" or "...PID-XXXXXX" at `at` of `name`; 0 when there is none.
pid_t PidAt(std::string_view name, size_t at) {
  pid_t pid = 0;
  size_t i = at;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i - at < 9; ++i) pid = pid * 10 + (name[i] - '0');
  if (i == at || (i < name.size() && name[i] != '-')) return 0;
  return pid;
}
bool Dead(pid_t pid) { return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH; }
}  // namespace

size_t RemoveDebris(const std::string& dir, const std::function<bool(std::string_view name)>& owns) {
  size_t removed = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir.empty() ? "." : dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    std::string_view e = entry;
    bool debris = false;
    if (size_t t = e.rfind(".tmp-"); e.size() > 1 && e[0] == '.' && t != std::string_view::npos && t > 1)
      debris = owns(e.substr(1, t - 1)) && Dead(PidAt(e, t + 5));
    else if (size_t p = e.rfind(".partial-"); p != std::string_view::npos && p > 0 && e.size() - p > 16)
      debris = owns(e.substr(0, p)) && Dead(PidAt(e, p + 9));
    if (!debris) continue;
    std::error_code rm;
    if (std::filesystem::remove_all(it->path(), rm) > 0 && !rm) ++removed;
  }
  return removed;
}

size_t RemoveDebrisOf(const std::string& output) {
  const std::string base = std::filesystem::path(output).filename().string();
  return RemoveDebris(DirName(output), [&](std::string_view name) { return name == base; });
}

Status FsyncDir(const std::string& dir, const std::shared_ptr<FileSystem>& fs) {
  return FileSystem::OrLocal(fs)->SyncDir(dir);
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError(fmt::format("cannot create directory: {}", ec.message()), Location{.file = dir});
  return Status::OK();
}

Result<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& final_path, bool overwrite,
                                                      std::shared_ptr<FileSystem> fs) {
  if (!fs) fs = FileSystem::Local();
  if (!overwrite) {
    SK_ASSIGN_OR_RETURN(bool present, fs->OutputPresent(final_path, OutputKind::kFile));
    if (present) return OutputExists(final_path);
  }
  std::string dir = DirName(final_path);
  if (!fs->IsDir(dir)) SK_RETURN_IF_ERROR(fs->MakeDirs(dir));
  std::unique_ptr<AtomicFile> f(new AtomicFile());
  f->fs_ = std::move(fs);
  f->final_ = final_path;
  auto base = std::filesystem::path(final_path).filename().string();
  std::string temp = (std::filesystem::path(dir) / fmt::format(".{}.tmp-{}", base, ::getpid())).string();
  auto file = f->fs_->NewStagedFile(temp, final_path);
  if (!file.ok()) return f->AtFinal(std::move(file).take_status());
  f->file_ = std::move(file).value();
  f->temp_ = std::move(temp);
  f->buf_.reserve(kBufSize);
  return f;
}

AtomicFile::~AtomicFile() { Abort(); }

Status AtomicFile::AtFinal(Status st) const {
  st.where().file = final_;
  return st;
}

void AtomicFile::Abort() {
  file_.reset();
  if (!committed_ && !temp_.empty()) {
    (void)fs_->Remove(temp_);
    temp_.clear();
  }
}

Status AtomicFile::Flush() {
  if (buf_.empty()) return Status::OK();
  Status st = file_->Append(buf_.data(), buf_.size());
  if (!st.ok()) return AtFinal(std::move(st));
  buf_.clear();
  return Status::OK();
}

Status AtomicFile::Write(const void* data, size_t size) {
  if (!file_) return Status::Internal("write to a closed file", Location{.file = final_});
  const char* p = static_cast<const char*>(data);
  size_ += size;
  if (size >= kDirectSize) {  // an image's bytes: straight to the file, not copied again
    SK_RETURN_IF_ERROR(Flush());
    Status st = file_->Append(p, size);
    return st.ok() ? st : AtFinal(std::move(st));
  }
  if (buf_.size() + size > kBufSize) SK_RETURN_IF_ERROR(Flush());
  buf_.append(p, size);
  return Status::OK();
}

Status AtomicFile::Commit() {
  if (!file_) return Status::Internal("commit of a closed file", Location{.file = final_});
  SK_RETURN_IF_ERROR(Flush());
  Status st = file_->Sync();
  if (st.ok()) st = file_->Close();
  if (!st.ok()) return AtFinal(std::move(st));
  file_.reset();
  return fs_->Publish(temp_, final_, PublishOptions{.replace = true, .published = &committed_});
}

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) { return Open(path, path); }

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& local, const std::string& path) {
  int fd = ::open(local.c_str(), O_RDONLY | O_CLOEXEC);
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

// The local file system's ReadFile: one implementation of the read loop.
Result<std::string> ReadFile(const std::string& path) {
  if (IsUrl(path)) return ReadAnyFile(path);
  return FileSystem::Local()->ReadFile(path);
}

Status WriteFileAtomic(const std::string& path, std::string_view contents, bool overwrite,
                       const std::shared_ptr<FileSystem>& fs) {
  SK_ASSIGN_OR_RETURN(auto f, AtomicFile::Create(path, overwrite, fs));
  SK_RETURN_IF_ERROR(f->Write(contents));
  return f->Commit();
}

Status CheckWritableDir(const std::string& dir) {
  if (::access(dir.c_str(), W_OK) != 0)
    return Status::FromErrno(errno, "output directory is not writable", Location{.file = dir});
  return Status::OK();
}

namespace {

// Opens (creating) `path` and takes its flock; `wait`: block until free, else
// kAlreadyExists when another process holds it.
Result<int> LockFile(const std::string& path, bool wait) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "cannot create the lock file", Location{.file = path});
  while (::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
    int e = errno;
    if (e == EINTR) continue;
    ::close(fd);
    if (e == EWOULDBLOCK && !wait) return Status::Exists("another process holds the lock", Location{.file = path});
    return Status::FromErrno(e, "cannot lock", Location{.file = path});
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<FileLock>> FileLock::TryLock(const std::string& path) {
  SK_ASSIGN_OR_RETURN(int fd, LockFile(path, false));
  return std::unique_ptr<FileLock>(new FileLock(path, fd));
}

Result<std::unique_ptr<FileLock>> FileLock::Lock(const std::string& path) {
  SK_ASSIGN_OR_RETURN(int fd, LockFile(path, true));
  return std::unique_ptr<FileLock>(new FileLock(path, fd));
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

void FileLock::RemoveAndUnlock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace shardkit::io
