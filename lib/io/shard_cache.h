// Internal: a local cache of whole remote files (shards), so that a second
// epoch reads local disk (--cache-dir / cache_dir=).
//
// Layout: DIR/<xxh3 of the address>-<size>-<base name>, one file per shard.
// A miss downloads through the FileSystem's ReadAt into DIR/<name>.tmp.<pid>.<n>
// and renames it into place (atomic: a reader sees a whole file or none). Each
// entry has a lock file (<name>.lock, flock): of several processes (or threads)
// missing the same shard, one downloads and the others wait and then use its
// copy. A hit touches the file's mtime; before a download the cache is trimmed
// to max_bytes (0 = unbounded) by removing the least recently used entries,
// under DIR/.evict.lock. An entry removed while another process has it mapped
// stays readable to that process (unlink keeps the inode).
//
// Thread safety: any number of threads and processes at once.
#pragma once

#include <cstdint>
#include <string>

#include "shardkit/filesystem.h"

namespace shardkit::io {

struct CacheOptions {
  std::string dir;         // empty = no cache
  uint64_t max_bytes = 0;  // 0 = unbounded
};

// The local path of a cached copy of `address` (whose size is `size`), read
// through `fs` on a miss. Errors name the address (a read) or the cache file.
// `checksum`: the file's "xxh3:<16 hex digits>" when known (a manifest's; else ""): a download
// is hashed as it is written and kept only when it matches; a mismatch is downloaded
// once more, then kCorrupt naming the address and both checksums (a copy that does not
// match never enters the cache, where every later epoch would read it).
Result<std::string> CachedCopy(FileSystem& fs, const std::string& address, uint64_t size, const CacheOptions& opts,
                               std::string_view checksum = {});

// True for a "scheme://..." address other than file:// (a store FileSystemFor
// picks by its scheme: http, https, s3).
bool IsUrl(std::string_view path);
// The whole file at a local path or an address, through FileSystemFor.
// kNotFound when there is none.
Result<std::string> ReadAnyFile(const std::string& path);
// Whether something is there (a file or, on s3, a prefix), through FileSystemFor.
bool AnyExists(const std::string& path);

// Size (kNotFound when missing) and XXH3-64 of a whole file at a local path or an
// address (paths::HashFile's hash), read through FileSystemFor in 16 MiB ranges.
Result<uint64_t> AnySize(const std::string& path);
Result<uint64_t> HashAnyFile(const std::string& path);

// Bytes held by the cache's entries (tests, reports).
uint64_t CacheBytes(const std::string& dir);

}  // namespace shardkit::io
