// Internal: the file layer over the storage seam (shardkit/filesystem.h).
// Writers create files through AtomicFile (or, for directory outputs, stage a
// directory and FileSystem::Publish it), so that no output ever appears under
// its final name before it is complete and synced. Tests inject failures by
// passing a wrapping FileSystem (tests/fault_fs.h), not through a global hook.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "shardkit/filesystem.h"
#include "shardkit/status.h"

namespace shardkit::io {

// kAlreadyExists with Detail::kOutputExists: what every writer says about an
// existing output it may not replace. The CLI and Python add how to replace it.
Status OutputExists(const std::string& path, std::string_view what = "output exists");

// Refuses an existing directory output (anything but an empty directory) unless
// `overwrite`; writers check again just before they publish.
Status CheckDirectoryOutput(FileSystem& fs, const std::string& root, bool overwrite);

// A directory output's staging directory: refuses an existing `root` (anything but an
// empty directory) unless `overwrite`, makes root's parent, then creates and returns a
// fresh "<root>.partial-<pid>-XXXXXX" beside it, for FileSystem::Publish at the end.
Result<std::string> StageOutputDirectory(FileSystem& fs, const std::string& root, bool overwrite);

// A file written under a temporary name beside its final path (".NAME.tmp-PID")
// through a FileSystem (null = local), buffered, and published by Commit()
// after Sync (FileSystem::Publish: rename and directory sync locally).
// Destroying an uncommitted AtomicFile removes the temporary file.
// One thread at a time.
class AtomicFile {
 public:
  // Fails with kAlreadyExists (Detail::kOutputExists) if final_path exists and !overwrite.
  static Result<std::unique_ptr<AtomicFile>> Create(const std::string& final_path, bool overwrite,
                                                    std::shared_ptr<FileSystem> fs = nullptr);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Write(const void* data, size_t size);
  Status Write(std::string_view s) { return Write(s.data(), s.size()); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return final_; }
  const std::string& temp_path() const { return temp_; }
  // Flushes, syncs, and publishes to the final path (rename, directory sync).
  Status Commit();
  // Removes the temporary file (also done by the destructor).
  void Abort();

 private:
  AtomicFile() = default;
  Status Flush();
  // An error of the temporary file, reported at the final path.
  Status AtFinal(Status st) const;
  std::shared_ptr<FileSystem> fs_;
  std::unique_ptr<WritableFile> file_;
  std::string final_, temp_;
  uint64_t size_ = 0;
  std::string buf_;
  bool committed_ = false;
};

// A read-only mmap of a whole file. Shared so that zero-copy Bytes can keep it alive.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path);
  // Maps the local file `local` and names it `shown` (a remote file's address, of which
  // `local` is a copy) in path() and in errors.
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& local, const std::string& shown);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// The whole file at a local path or an address (http(s)://, s3://: through FileSystemFor).
Result<std::string> ReadFile(const std::string& path);
// Writes a whole small file atomically (temp, sync, publish) through `fs` (null = local).
Status WriteFileAtomic(const std::string& path, std::string_view contents, bool overwrite = true,
                       const std::shared_ptr<FileSystem>& fs = nullptr);
// A new local file (truncated) whose pages are left to the page cache: unlike the local
// FileSystem's files it does not hand each written chunk to the disk at once (a staged
// copy of a remote output, uploaded and removed, often before the disk needs to see it).
// Defined in io/local_fs.cc.
Result<std::unique_ptr<WritableFile>> NewCacheOnlyFile(const std::string& path);
// Syncs a directory's entries through `fs` (null = local).
Status FsyncDir(const std::string& dir, const std::shared_ptr<FileSystem>& fs = nullptr);
// mkdir -p.
Status MakeDirs(const std::string& dir);
// The directory part of a path ("." when none).
std::string DirName(const std::string& path);
// Whether something is at a local path (a dangling symlink too) or an address; whether it
// is a directory (on s3, a key prefix).
bool Exists(const std::string& path);
bool IsDir(const std::string& path);
// A local directory that this process may create files in; else an error naming it
// ("output directory is not writable"): the early, clear refusal a writer gives.
Status CheckWritableDir(const std::string& dir);

// An exclusive lock (flock) on a local lock file, held until Unlock() or destruction:
// how one process claims an output part. One thread at a time.
class FileLock {
 public:
  // Creates the file if needed and locks it without waiting: kAlreadyExists when another
  // process holds it.
  static Result<std::unique_ptr<FileLock>> TryLock(const std::string& path);
  // The same, waiting for another holder to release it (the shard cache's entries).
  static Result<std::unique_ptr<FileLock>> Lock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  // Removes the lock file, then releases the lock.
  void RemoveAndUnlock();

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// What killed writers of an output left in the local directory `dir`: temporary files
// ".NAME.tmp-PID" (AtomicFile, HDF5) and staging directories "NAME.partial-PID-XXXXXX"
// (directory outputs) whose NAME `owns` accepts and whose PID is no live process of
// this host (never this process's own). Removes them and returns how many it removed.
size_t RemoveDebris(const std::string& dir, const std::function<bool(std::string_view name)>& owns);
// RemoveDebris for an output of one name (an .h5 file, an MDS or folder directory):
// what killed writes of `output` left beside it.
size_t RemoveDebrisOf(const std::string& output);

}  // namespace shardkit::io
