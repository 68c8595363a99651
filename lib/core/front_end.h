// Internal: helpers of the front ends (the `shardkit` command and the Python module), not
// of the library's API: parsing a byte size a user typed, the copy threads a conversion
// takes unless told, the staging directory the environment names. Compiled into the
// library (tools/ and tests/ link it through shardkit_internal) and into the Python module
// (python/CMakeLists.txt), which links only the public API.
//
// Thread safety: every function may be called from many threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shardkit/status.h"

namespace shardkit {

// Parses a byte size: a non-negative number with an optional unit, decimal
// (B, KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB), case-insensitive; e.g.
// "1GiB", "500MB", "1000000", "1.5GB". kInvalidArgument names the string.
Result<uint64_t> ParseByteSize(std::string_view s);

// The `threads` that `shardkit convert` and `shardkit shard` use unless told, and
// shardkit.convert() and shard() in Python: the cores this process may run on (its CPU
// affinity mask, not the machine's size), at least 2 (reading overlaps
// writing), at most 8. (ConvertOptions::threads and ShardOptions::threads stay 1.)
int DefaultCopyThreads();

// SHARDKIT_STAGING_DIR, else TMPDIR, else "": ConvertOptions::staging_dir as the CLI and
// Python default it (front ends call it; the library never does).
std::string StagingDirFromEnvironment();

}  // namespace shardkit
