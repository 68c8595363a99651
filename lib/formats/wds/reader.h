// Internal: opening wds shards for reading: x.tar, x-{000..009}.tar,
// a.tar::b.tar, x.manifest.json, `pipe:CMD` (streamed, in order only).
// Fields of mapped shards are zero-copy views of their mappings.
#pragma once

#include <memory>
#include <string>

#include "shardkit/dataset.h"

namespace shardkit::formats::wds {

Result<std::unique_ptr<Dataset>> OpenWds(const std::string& path, const OpenOptions& opts);

}  // namespace shardkit::formats::wds
