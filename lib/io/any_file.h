// Internal: how a format's reader reaches a dataset's files wherever they are: a local
// path, or an address (http(s)://, s3://) through the scheme registry (FileSystemFor).
// Formats call these instead of POSIX, so every reader works on every store.
//
// Files a reader maps whole (a RecordIO .rec, an MDS shard, an uncompressed TFRecord
// file) and files a library opens itself (LMDB's data.mdb, an HDF5 file) are local
// files; a remote one is copied to local disk first, on first use:
//  - with CacheOptions::dir: into the shared, bounded shard cache (shard_cache.h), kept
//    for the next epoch and the next process;
//  - without: into a private temporary file under $TMPDIR, removed as soon as nothing
//    holds it (a mapping keeps its pages until its last view goes).
//
// Thread safety: every function may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/file.h"
#include "io/shard_cache.h"
#include "shardkit/filesystem.h"

namespace shardkit::io {

// The FileSystem of a local path (`local`, or Local() when null) or of an address.
Result<std::shared_ptr<FileSystem>> FileSystemOf(const std::string& path,
                                                 const std::shared_ptr<FileSystem>& local = nullptr);
// What is at `path` (type kNotFound when nothing is; on s3 a key prefix is a directory).
Result<FileInfo> StatAny(const std::string& path);
// A regular file's size: kNotFound "no such file", kInvalidArgument "not a regular file".
Result<uint64_t> RegularFileSize(const std::string& path);
// The entries of a directory (an s3 key prefix), sorted by name.
Result<std::vector<FileInfo>> ListAny(const std::string& dir);
// Up to `n` bytes from the start of a regular file (fewer when it is shorter): a content
// bid's look at the first bytes. kNotFound when there is no file.
Result<std::string> ReadAnyHead(const std::string& path, size_t n);
// A whole file mapped read-only; a remote one is copied first (above). path() is `path`.
// `checksum` ("xxh3:..." or ""): a remote copy is checked against it.
Result<std::shared_ptr<MappedFile>> MapAny(const std::string& path, const CacheOptions& cache,
                                           std::string_view checksum = {});

// A local path for a library that opens a file itself: `path` when it is local, else a
// copy that stays as long as `keep` is held.
struct LocalCopy {
  std::string path;
  std::shared_ptr<void> keep;
};
Result<LocalCopy> LocalCopyOf(const std::string& path, const CacheOptions& cache, std::string_view checksum = {});
// A local directory holding the files `names` of the directory `dir`: `dir` when it is
// local, else a private directory of links to their copies (LMDB opens a directory
// holding data.mdb).
Result<LocalCopy> LocalDirectoryOf(const std::string& dir, const std::vector<std::string>& names,
                                   const CacheOptions& cache);

}  // namespace shardkit::io
