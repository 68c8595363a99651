// Reading a dataset's files on any store (any_file.h).
#include "io/any_file.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include <fmt/format.h>

namespace shardkit::io {

namespace {

// A fresh private directory under $TMPDIR for copies made without a cache; removed
// (with what is in it) when the last holder lets go.
Result<std::shared_ptr<std::string>> PrivateDir() {
  std::error_code ec;
  std::string tmpl = (std::filesystem::temp_directory_path(ec) / "shardkit-copy-XXXXXX").string();
  if (ec) tmpl = "/tmp/shardkit-copy-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    return Status::FromErrno(errno, "cannot create a directory for a local copy of a remote file",
                             Location{.file = tmpl});
  return std::shared_ptr<std::string>(new std::string(tmpl), [](std::string* dir) {
    std::error_code e;
    std::filesystem::remove_all(*dir, e);
    delete dir;
  });
}

}  // namespace

Result<std::shared_ptr<FileSystem>> FileSystemOf(const std::string& path, const std::shared_ptr<FileSystem>& local) {
  if (IsUrl(path)) return FileSystemFor(path);
  return FileSystem::OrLocal(local);
}

Result<FileInfo> StatAny(const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemOf(path));
  return fs->Stat(path);
}

Result<uint64_t> RegularFileSize(const std::string& path) {
  SK_ASSIGN_OR_RETURN(FileInfo st, StatAny(path));
  if (st.type == FileType::kNotFound) return Status::NotFound("no such file", Location{.file = path});
  if (st.type != FileType::kFile) return Status::Invalid("not a regular file", Location{.file = path});
  return st.size;
}

Result<std::vector<FileInfo>> ListAny(const std::string& dir) {
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemOf(dir));
  return fs->ListDir(dir);
}

Result<std::string> ReadAnyHead(const std::string& path, size_t n) {
  // (OpenForRead says kNotFound, and refuses what is not a regular file: no Stat first.)
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemOf(path));
  SK_ASSIGN_OR_RETURN(auto f, fs->OpenForRead(path));
  std::string out(size_t(std::min<uint64_t>(n, f->size())), '\0');
  SK_ASSIGN_OR_RETURN(size_t got, f->ReadAt(0, out.size(), out.data()));
  out.resize(got);
  return out;
}

Result<LocalCopy> LocalCopyOf(const std::string& path, const CacheOptions& cache, std::string_view checksum) {
  if (!IsUrl(path)) return LocalCopy{path, nullptr};
  SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(path));
  SK_ASSIGN_OR_RETURN(uint64_t size, RegularFileSize(path));
  if (!cache.dir.empty()) {
    SK_ASSIGN_OR_RETURN(std::string copy, CachedCopy(*fs, path, size, cache, checksum));
    return LocalCopy{copy, nullptr};
  }
  // A cache of one entry in a private directory: the same download, checks and names.
  SK_ASSIGN_OR_RETURN(auto dir, PrivateDir());
  SK_ASSIGN_OR_RETURN(std::string copy, CachedCopy(*fs, path, size, CacheOptions{.dir = *dir}, checksum));
  return LocalCopy{copy, dir};
}

Result<LocalCopy> LocalDirectoryOf(const std::string& dir, const std::vector<std::string>& names,
                                   const CacheOptions& cache) {
  if (!IsUrl(dir)) return LocalCopy{dir, nullptr};
  SK_ASSIGN_OR_RETURN(auto local, PrivateDir());
  auto keeps = std::make_shared<std::vector<std::shared_ptr<void>>>();
  for (const auto& name : names) {
    SK_ASSIGN_OR_RETURN(LocalCopy copy, LocalCopyOf(dir + "/" + name, cache));
    std::string link = *local + "/" + name;
    if (::symlink(copy.path.c_str(), link.c_str()) != 0)
      return Status::FromErrno(errno, "cannot link a local copy of a remote file", Location{.file = link});
    keeps->push_back(copy.keep);
  }
  keeps->push_back(local);
  return LocalCopy{*local, keeps};
}

Result<std::shared_ptr<MappedFile>> MapAny(const std::string& path, const CacheOptions& cache,
                                           std::string_view checksum) {
  if (!IsUrl(path)) return MappedFile::Open(path);
  SK_ASSIGN_OR_RETURN(LocalCopy copy, LocalCopyOf(path, cache, checksum));
  // The mapping keeps the pages of a private copy whose directory goes with `copy`.
  return MappedFile::Open(copy.path, path);
}

}  // namespace shardkit::io
