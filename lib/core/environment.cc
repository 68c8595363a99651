// The environment's defaults of the options, for front ends (dataset.h, convert.h). The
// library itself reads no environment for its options: only the CLI and the Python
// module call these.
#include <cstdlib>

#include <fmt/format.h>

#include "core/front_end.h"
#include "shardkit/convert.h"
#include "shardkit/dataset.h"

namespace shardkit {

Status OpenOptionsFromEnvironment(OpenOptions* o) {
  if (const char* d = std::getenv("SHARDKIT_CACHE_DIR"); d && *d && o->cache_dir.empty()) o->cache_dir = d;
  if (const char* b = std::getenv("SHARDKIT_CACHE_BYTES"); b && *b && o->cache_bytes == 0) {
    auto r = ParseByteSize(b);
    if (!r.ok()) return Status::Invalid(fmt::format("SHARDKIT_CACHE_BYTES '{}': {}", b, r.status().message()));
    o->cache_bytes = *r;
  }
  if (const char* e = std::getenv("SHARDKIT_INDEX_BUDGET"); e && *e) {
    if (!ParseByteSize(e).ok())
      return Status::Invalid(fmt::format("SHARDKIT_INDEX_BUDGET '{}' is not a size (the random-access index's memory "
                                         "budget, e.g. 64MiB, 1GB or a number of bytes)",
                                         e));
    o->format_options.emplace("wds.index_budget", e);  // an explicit wds.index_budget wins
  }
  return Status::OK();
}


}  // namespace shardkit
