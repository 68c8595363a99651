// Internal: the page cache of local files, for benchmarks that measure cold and warm
// reads (shardkit bench --cold / the warm-up pass).
//
// Thread safety: every function may be called from many threads at once.
#pragma once

#include <string>
#include <vector>

namespace shardkit::io {

// The regular files at a local path: the file itself, or every regular file below a
// directory (recursively), sorted. None for an address or a path that is not there.
std::vector<std::string> LocalFilesUnder(const std::string& path);
// posix_fadvise(DONTNEED) over every file; returns the share of their bytes still
// resident afterwards (mincore), 0..1. Files that cannot be opened are skipped.
double DropFromPageCache(const std::vector<std::string>& files);
// Reads every file once, start to end, so that its pages are cached.
void ReadThrough(const std::vector<std::string>& files);

}  // namespace shardkit::io
