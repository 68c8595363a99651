// Internal: the file layer. Every byte shardkit writes goes through AtomicFile,
// so that no output ever appears under its final name before it is complete and
// synced, and so that tests can inject write and fsync failures in one place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "shardkit/status.h"

namespace shardkit::io {

// Test hook: called before every write() and fsync() the file layer makes, with
// the path and the operation ("write" or "fsync"). A non-zero return is used as
// the errno of a failure. Not thread-safe to change while writers run.
using FaultHook = std::function<int(const std::string& path, std::string_view op)>;
void SetFaultHook(FaultHook hook);

// A file written under a temporary name beside its final path (".NAME.tmp-PID")
// and renamed into place by Commit() after fsync; the directory is fsynced too.
// Destroying an uncommitted AtomicFile unlinks the temporary file.
// One thread at a time.
class AtomicFile {
 public:
  // Fails with kAlreadyExists if final_path exists and !overwrite.
  static Result<std::unique_ptr<AtomicFile>> Create(const std::string& final_path, bool overwrite);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Write(const void* data, size_t size);
  Status Write(std::string_view s) { return Write(s.data(), s.size()); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return final_; }
  const std::string& temp_path() const { return temp_; }
  // Flushes, fsyncs, renames to the final path and fsyncs the directory.
  Status Commit();
  // Removes the temporary file (also done by the destructor).
  void Abort();
  // Raw descriptor of the temporary file (for libraries that write themselves).
  int fd() const { return fd_; }

 private:
  AtomicFile() = default;
  Status Flush();
  std::string final_, temp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string buf_;
  bool committed_ = false;
};

// A read-only mmap of a whole file. Shared so that zero-copy Bytes can keep it alive.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path);
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

Result<std::string> ReadFile(const std::string& path);
// Writes a whole small file atomically (temp, fsync, rename, fsync dir).
Status WriteFileAtomic(const std::string& path, std::string_view contents, bool overwrite = true);
Status FsyncDir(const std::string& dir);
// mkdir -p.
Status MakeDirs(const std::string& dir);
// The directory part of a path ("." when none).
std::string DirName(const std::string& path);
bool Exists(const std::string& path);
bool IsDir(const std::string& path);
// Runs the fault hook; returns an IOError status if it injects one.
Status CheckFault(const std::string& path, std::string_view op);

}  // namespace shardkit::io
