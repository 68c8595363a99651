// Test-only storage seams: a forwarding FileSystemWrapper (LevelDB's EnvWrapper)
// and FaultInjectingFileSystem, which asks a fault function before each operation
// and fails it with the errno the function returns (0 = let it run). Writers get
// it through WriteOptions::filesystem, so a fault reaches exactly the writer under
// test and nothing else in the process.
//
// Operation names passed to the fault function, with the path they act on:
//   "write"  WritableFile::Append, and ExternalIo(kWrite): an LMDB commit, the HDF5
//            writer's payload writes (the nearest seam point before libraries that
//            write themselves)
//   "fsync"  WritableFile::Sync, SyncDir, SyncTree, and ExternalIo(kSync):
//            mdb_env_sync, fsync of the HDF5 file
//   "create" NewWritableFile   "close" WritableFile::Close   "open" OpenForRead
//   "rename" Rename (also inside Publish)   "remove" Remove, RemoveAll
//   "mkdir"  MakeDirs   "stat" Stat   "list" ListDir
// Publish is not forwarded: the base class's Publish runs on the wrapper, so its
// Stat, Rename, SyncDir and RemoveAll steps each pass the fault function.
// The fault function may be called from several threads at once.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "shardkit/filesystem.h"

namespace sk_test {

using shardkit::ExternalOp;
using shardkit::FileInfo;
using shardkit::FileSystem;
using shardkit::ReadableFile;
using shardkit::Result;
using shardkit::Status;
using shardkit::WritableFile;

// Forwards every operation to `base` (the local file system by default).
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(std::shared_ptr<FileSystem> base = FileSystem::Local()) : base_(std::move(base)) {}
  FileSystem& base() { return *base_; }

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& p) override { return base_->OpenForRead(p); }
  Result<std::string> ReadFile(const std::string& p) override { return base_->ReadFile(p); }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p, shardkit::CreateMode m) override {
    return base_->NewWritableFile(p, m);
  }
  Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  Status SyncDir(const std::string& d) override { return base_->SyncDir(d); }
  Status SyncTree(const std::string& d) override { return base_->SyncTree(d); }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<std::vector<FileInfo>> ListDir(const std::string& d) override { return base_->ListDir(d); }
  Status MakeDirs(const std::string& d) override { return base_->MakeDirs(d); }
  Status MakeNewDir(const std::string& d) override { return base_->MakeNewDir(d); }
  Status Remove(const std::string& p) override { return base_->Remove(p); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Result<std::string> LocalPath(const std::string& p) override { return base_->LocalPath(p); }
  Status ExternalIo(const std::string& p, ExternalOp op) override { return base_->ExternalIo(p, op); }

 private:
  std::shared_ptr<FileSystem> base_;
};

class FaultInjectingFileSystem : public FileSystemWrapper,
                                 public std::enable_shared_from_this<FaultInjectingFileSystem> {
 public:
  // Returns the errno to fail (path, op) with, or 0.
  using FaultFn = std::function<int(const std::string& path, std::string_view op)>;

  explicit FaultInjectingFileSystem(FaultFn fn = {}) { SetFault(std::move(fn)); }
  // Replaces the fault function (null: no faults); safe while writers run.
  void SetFault(FaultFn fn) {
    std::lock_guard lock(mu_);
    fn_ = std::make_shared<const FaultFn>(std::move(fn));
  }

  // The injected failure for (path, op), or OK.
  Status Check(const std::string& path, std::string_view op) {
    std::shared_ptr<const FaultFn> fn;
    {
      std::lock_guard lock(mu_);
      fn = fn_;
    }
    int err = fn && *fn ? (*fn)(path, op) : 0;
    if (err == 0) return Status::OK();
    return Status::FromErrno(err, fmt::format("{} failed", op), shardkit::Location{.file = path});
  }

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& p) override {
    SK_RETURN_IF_ERROR(Check(p, "open"));
    return FileSystemWrapper::OpenForRead(p);
  }
  Result<std::string> ReadFile(const std::string& p) override {
    SK_RETURN_IF_ERROR(Check(p, "open"));
    return FileSystemWrapper::ReadFile(p);
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p, shardkit::CreateMode m) override {
    SK_RETURN_IF_ERROR(Check(p, "create"));
    SK_ASSIGN_OR_RETURN(auto f, FileSystemWrapper::NewWritableFile(p, m));
    return std::unique_ptr<WritableFile>(new File(weak_from_this(), std::move(f)));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    SK_RETURN_IF_ERROR(Check(from, "rename"));
    return FileSystemWrapper::Rename(from, to);
  }
  Status SyncDir(const std::string& d) override {
    SK_RETURN_IF_ERROR(Check(d, "fsync"));
    return FileSystemWrapper::SyncDir(d);
  }
  Status SyncTree(const std::string& d) override {
    SK_RETURN_IF_ERROR(Check(d, "fsync"));
    return FileSystemWrapper::SyncTree(d);
  }
  Result<FileInfo> Stat(const std::string& p) override {
    SK_RETURN_IF_ERROR(Check(p, "stat"));
    return FileSystemWrapper::Stat(p);
  }
  Result<std::vector<FileInfo>> ListDir(const std::string& d) override {
    SK_RETURN_IF_ERROR(Check(d, "list"));
    return FileSystemWrapper::ListDir(d);
  }
  Status MakeDirs(const std::string& d) override {
    SK_RETURN_IF_ERROR(Check(d, "mkdir"));
    return FileSystemWrapper::MakeDirs(d);
  }
  Status MakeNewDir(const std::string& d) override {
    SK_RETURN_IF_ERROR(Check(d, "mkdir"));
    return FileSystemWrapper::MakeNewDir(d);
  }
  Status Remove(const std::string& p) override {
    SK_RETURN_IF_ERROR(Check(p, "remove"));
    return FileSystemWrapper::Remove(p);
  }
  Status RemoveAll(const std::string& p) override {
    SK_RETURN_IF_ERROR(Check(p, "remove"));
    return FileSystemWrapper::RemoveAll(p);
  }
  Status ExternalIo(const std::string& p, ExternalOp op) override {
    SK_RETURN_IF_ERROR(Check(p, op == ExternalOp::kWrite ? "write" : "fsync"));
    return FileSystemWrapper::ExternalIo(p, op);
  }

 private:
  class File : public WritableFile {
   public:
    File(std::weak_ptr<FaultInjectingFileSystem> fs, std::unique_ptr<WritableFile> f)
        : fs_(std::move(fs)), f_(std::move(f)) {}
    const std::string& path() const override { return f_->path(); }
    Status Append(const void* data, size_t size) override {
      SK_RETURN_IF_ERROR(Check("write"));
      return f_->Append(data, size);
    }
    Status Sync() override {
      SK_RETURN_IF_ERROR(Check("fsync"));
      return f_->Sync();
    }
    Status Close() override {
      SK_RETURN_IF_ERROR(Check("close"));
      return f_->Close();
    }

   private:
    // A file may outlive its file system (filesystem.h): no faults then.
    Status Check(std::string_view op) {
      auto fs = fs_.lock();
      return fs ? fs->Check(f_->path(), op) : Status::OK();
    }
    std::weak_ptr<FaultInjectingFileSystem> fs_;
    std::unique_ptr<WritableFile> f_;
  };

  std::mutex mu_;
  std::shared_ptr<const FaultFn> fn_;
};

// A fault-injecting file system with `fn` armed.
inline std::shared_ptr<FaultInjectingFileSystem> FaultFs(FaultInjectingFileSystem::FaultFn fn = {}) {
  auto fs = std::make_shared<FaultInjectingFileSystem>();
  fs->SetFault(std::move(fn));
  return fs;
}

// True for the operations the old file-layer hook saw (a write or an fsync):
// tests that count operations count these, so that they cover the same points.
inline bool DataOp(std::string_view op) { return op == "write" || op == "fsync"; }

}  // namespace sk_test
