// Internal: the tfrecord format's pieces that its registry row (format.cc) wires
// together: the dataset (dataset.cc), the writer (writer.cc) and the manifest
// shardkit writes beside its shards. The layout is docs/formats-tfrecord.md.
#pragma once

#include <memory>
#include <string>

#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::tfrecord {

// The manifest beside written shards: out/train-%05d.tfrecord -> out/train.tfrecord.json.
constexpr std::string_view kManifestSuffix = ".tfrecord.json";
std::string ManifestPathFor(const std::string& pattern);

// Format::open: one file, a brace range, a "::" list, or a manifest.
Result<std::unique_ptr<Dataset>> OpenTfrecord(const std::string& path, const OpenOptions& opts);
// Format::create: a printf pattern (shards) or one file.
Result<std::unique_ptr<SampleWriter>> CreateTfrecord(const std::string& path, const WriteOptions& opts);
// Format::list_shards.
Result<ShardListing> ListShards(const std::string& path, const OpenOptions& opts);

}  // namespace shardkit::formats::tfrecord
