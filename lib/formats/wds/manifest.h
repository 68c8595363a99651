// Internal: the JSON manifest beside a wds write (out/train.manifest.json,
// named by ManifestPathFor in names.h): format, version, pattern, sample count,
// class names, fields, and per shard its file, samples, bytes, checksum, DALI
// index and checksum sidecar. docs/formats-wds.md has the layout.
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

// Parses the manifest at `path` (its text `text`) into *info: format,
// address, sample count, class names, fields and shards (paths joined to the
// manifest's directory unless absolute). Does not look at the shards.
Status ParseManifest(const std::string& path, const std::string& text, DatasetInfo* info);

// The manifest's text for a finished write of `pattern`.
std::string ManifestText(const std::string& pattern, uint64_t num_samples, const std::vector<std::string>& class_names,
                         const std::vector<std::string>& fields, const std::vector<ShardInfo>& shards,
                         bool write_index, uint64_t* total_bytes);

}  // namespace shardkit::formats::wds
