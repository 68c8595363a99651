// shardkit/filesystem.h: the storage seam.
//
// A FileSystem is how shardkit's writers create, sync, publish and remove files,
// and how a reader may open them. It arrives through WriteOptions::filesystem and
// OpenOptions::filesystem (null = FileSystem::Local()), so a caller can put
// another store (or a test's fault-injecting wrapper) under every format without
// touching the formats.
//
// The contract is that of an object store as much as of POSIX:
//  - Reads are ranged (ReadableFile::ReadAt); a whole-file zero-copy view
//    (ReadableFile::Map) is optional and callers fall back to ReadAt.
//  - Writes are appends to a new file (WritableFile); nothing is readable under
//    a final name before Publish() puts a complete, synced output there.
//  - Publish(staged, final) is ONE call: the local implementation renames (moving
//    an existing directory aside and restoring it if the rename fails) and syncs
//    the directory; an object store completes an upload under the final key.
//    Formats never rename-then-sync-the-directory themselves.
//
// What cannot go through the seam: libraries that do their own I/O on a local
// file (LMDB's environment, libhdf5's file driver, the HDF5 writer's positioned
// payload writes). Their writers ask LocalPath() for a local file and announce
// each batch of writes and each sync through ExternalIo() before the library
// makes it, so a wrapper still sees those steps (and can fail them); the
// staging directory, the metadata files, the publish and the cleanup go through
// the seam as usual.
//
// Paths are strings in the implementation's own syntax ("/data/x.tar" locally);
// a scheme registry maps "scheme://..." addresses to implementations.
//
// Thread safety:
//  - FileSystem: every method may be called from many threads at once (the
//    local implementation holds no mutable state). Operations on the same path
//    from different threads are not ordered by the FileSystem.
//  - ReadableFile: ReadAt(), Map() and size() may be called from many threads at once.
//  - WritableFile: one thread at a time.
//
// Lifetimes: a ReadableFile or WritableFile may outlive the FileSystem that
// opened it (implementations keep what they need). Bytes returned by Map() keep
// their mapping alive on their own and stay valid after the ReadableFile is
// destroyed; they are valid only while nobody modifies the file underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/bytes.h"
#include "shardkit/export.h"
#include "shardkit/status.h"

namespace shardkit {

enum class FileType {
  kNotFound,   // nothing is there (Stat() succeeds with this type)
  kFile,
  kDirectory,
  kOther,      // a FIFO, socket, device, or a symlink Stat() could not follow
};

struct FileInfo {
  std::string path;  // as given to Stat(); for ListDir() the entry's path (dir + "/" + name)
  std::string name;  // the last path component
  FileType type = FileType::kNotFound;
  uint64_t size = 0;     // bytes, for files
  bool symlink = false;  // the path itself is a symbolic link (type is its target's)
  // What the path resolves to, on a local file system (device and inode; 0 and 0 on a store
  // without links): how a walk that follows links tells a directory it has been in before.
  uint64_t device = 0, inode = 0;
};

// A file opened for reading.
class SHARDKIT_API ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual const std::string& path() const = 0;
  // The size when the file was opened.
  virtual uint64_t size() const = 0;
  // Reads up to `n` bytes at `offset` into `dst` and returns how many were read:
  // fewer than `n` only at the end of the file. Thread-safe.
  virtual Result<size_t> ReadAt(uint64_t offset, size_t n, void* dst) const = 0;
  // The whole file as zero-copy Bytes (an mmap locally), or kUnsupported where
  // the implementation cannot map (a remote store): read with ReadAt() then.
  virtual Result<Bytes> Map() const;
};

// A new file being written. Destroying it without Close() closes it, unsynced.
class SHARDKIT_API WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual const std::string& path() const = 0;
  // Appends bytes. Unbuffered in the local implementation: callers batch.
  virtual Status Append(const void* data, size_t size) = 0;
  Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  // Makes what was appended durable (fsync locally; a no-op for a store that
  // only makes an object visible when it is complete).
  virtual Status Sync() = 0;
  // Ends the file. No Append() or Sync() after it.
  virtual Status Close() = 0;
};

// How NewWritableFile() treats a file that already exists at the path.
enum class CreateMode {
  kTruncate,   // replace it
  kExclusive,  // fail with kAlreadyExists (the local implementation also refuses a symlink)
};

// What a library with its own I/O is about to do to a local file (ExternalIo).
enum class ExternalOp {
  kWrite,  // write a batch (an LMDB commit, the HDF5 writer's payload writes)
  kSync,   // make it durable (mdb_env_sync, fsync of the HDF5 file)
};

// What a writer is about to create (FileSystem::OutputPresent): one file (a shard, an
// HDF5 file), or a directory of files (an image folder, an LMDB or MDS directory).
enum class OutputKind { kFile, kDirectory };

struct PublishOptions {
  // Replace an existing output. Without it, an existing final path fails with
  // kAlreadyExists / Detail::kOutputExists ("output exists").
  bool replace = false;
  // Set to true once the staged output is visible under the final path, even
  // when a later step (the directory sync) fails. May be null.
  bool* published = nullptr;
  // Names of files in a published directory that are local state, not output: a remote
  // file system's staging (docs/remote.md) does not upload them (an LMDB's lock.mdb).
  std::vector<std::string> local_only;
};

class SHARDKIT_API FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The process-wide local file system (POSIX). Never null; shared.
  static std::shared_ptr<FileSystem> Local();
  // `fs` itself, or Local() when it is null: what a format does with an option.
  static const std::shared_ptr<FileSystem>& OrLocal(const std::shared_ptr<FileSystem>& fs);

  // --- reading
  // kNotFound when the file does not exist; kIOError for what is not a regular file (a
  // FIFO is refused, never waited on).
  virtual Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) = 0;
  // The whole file (a convenience over OpenForRead + ReadAt).
  virtual Result<std::string> ReadFile(const std::string& path);

  // --- writing
  // Creates a file for appending. The parent directory must exist.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, CreateMode mode) = 0;
  // Creates the temporary file of an output that is to be published under `final_path`
  // (how AtomicFile stages a file). The default is NewWritableFile(temp_path, kTruncate),
  // so a wrapper that forwards NewWritableFile needs nothing more; a file system that acts
  // on an output while it is written overrides it (the upload staging follows each shard
  // to its remote address while the writer writes it).
  virtual Result<std::unique_ptr<WritableFile>> NewStagedFile(const std::string& temp_path,
                                                              const std::string& final_path);
  // Makes `staged` (a file or a directory, complete and synced) visible under
  // `final_path` in one step, replacing an existing one only with opts.replace
  // (a directory is moved aside, and moved back if the publish fails), and makes
  // the result durable. The default implementation does this with Stat, Rename,
  // SyncDir and RemoveAll, so a wrapper sees each step; an object store overrides it.
  virtual Status Publish(const std::string& staged, const std::string& final_path, const PublishOptions& opts);
  // Renames a file or directory (replacing a file or an empty directory at `to`).
  // kUnsupported where the store cannot rename (use Publish).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the entries of a directory (creations, renames, removals) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // Makes every file and directory below `dir` durable (a staged directory
  // output before Publish). Locally one syncfs(2), cheaper than a Sync per file.
  virtual Status SyncTree(const std::string& dir) = 0;

  // --- the namespace
  // Succeeds with type kNotFound when nothing is there. Does not follow a final symlink
  // for the type of a dangling link (kOther), follows it otherwise.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  bool Exists(const std::string& path);
  bool IsDir(const std::string& path);
  // Whether an output of `kind` written at `path` would replace something: what every
  // writer asks before it writes without `overwrite`. The default is Exists(path) (of any
  // kind); a file system that stages its files for another store (the upload staging of a
  // remote output) asks that store too, so that an existing remote output is refused the
  // same way as a local one. Fails when that cannot be told (the store unreachable, or it
  // denies reading).
  virtual Result<bool> OutputPresent(const std::string& path, OutputKind kind);
  // The entries of a directory (not "." and ".."), sorted by name.
  virtual Result<std::vector<FileInfo>> ListDir(const std::string& dir) = 0;
  // Creates a directory and its missing parents (mkdir -p); OK if it exists.
  virtual Status MakeDirs(const std::string& dir) = 0;
  // Creates one new directory (its parent must exist) and fails with kAlreadyExists when
  // anything is there, a symlink included: what a staging directory needs, so that no
  // other process can have put its own directory or a link in the way. The default (for file systems without directories of their own):
  // kAlreadyExists when Stat finds something, else MakeDirs; not atomic.
  virtual Status MakeNewDir(const std::string& dir);
  // Removes a file or an empty directory; OK if nothing is there.
  virtual Status Remove(const std::string& path) = 0;
  // Removes a file or a directory tree; OK if nothing is there.
  virtual Status RemoveAll(const std::string& path) = 0;

  // --- libraries with their own I/O (see the top of this file)
  // A local path for `path` that a library may open itself, or kUnsupported
  // (a remote store: the writer must stage locally). The local implementation
  // returns `path`.
  virtual Result<std::string> LocalPath(const std::string& path);
  // Announces that a library is about to write or sync the local file `path`.
  // An error is returned to the writer as if the library had failed. The local
  // implementation does nothing.
  virtual Status ExternalIo(const std::string& path, ExternalOp op);
};

// Creates a FileSystem for an address "scheme://rest" (the whole address is passed).
using FileSystemFactory = std::function<Result<std::shared_ptr<FileSystem>>(std::string_view address)>;

// Registers a scheme ("s3", "http"); "file" is built in (Local()). Fails with
// kAlreadyExists for a scheme registered before. Thread-safe.
SHARDKIT_API Status RegisterFileSystem(const std::string& scheme, FileSystemFactory factory);
// The FileSystem for an address: the registered scheme's, Local() for "file://"
// and for plain paths; kInvalidArgument naming the known schemes for another
// "scheme://". Thread-safe.
SHARDKIT_API Result<std::shared_ptr<FileSystem>> FileSystemFor(std::string_view address);

// An address as it may be shown (a log line, an error, a report): the userinfo
// ("user:password@") removed and a query holding a credential (an S3 presigned URL's
// X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token; token=, sig=, ...) replaced by
// "?<redacted>"; a local path is returned unchanged. Errors (Status) and the command's
// output are already redacted; this is for what a program shows itself. Thread-safe.
SHARDKIT_API std::string RedactAddress(std::string_view address);

}  // namespace shardkit
