// Internal: the JSON manifest beside a wds write (out/train.manifest.json,
// named by ManifestPathFor in names.h): format, version, pattern, sample count,
// class names, fields, and per shard its file, samples, bytes, checksum, DALI
// index and checksum sidecar. docs/formats-wds.md has the layout.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

// A manifest (out/train.manifest.json) as written by the wds writer.
struct Manifest {
  uint64_t num_samples = 0;
  std::vector<std::string> class_names;
  std::vector<ShardInfo> shards;  // paths joined to the manifest's directory
  std::vector<std::string> fields;
  std::string fields_error;  // "fields" is malformed: why (the rest is still read)
  std::string channel_order;  // of the decoded arrays (.npy): "bgr", "rgb", or "" (not recorded)
  std::string transform;      // "transform", as JSON text ("" not recorded): WriteOptions::transform
};

// Reads a manifest. Errors: the file cannot be read; kCorrupt when it is JSON
// whose "format" is not "wds". When it is malformed (not JSON, a member missing
// or of the wrong type) *unreadable says why and the result is empty. Each shard
// path is held to paths::Confinement (kInvalidArgument, Detail::kOutsideDataset,
// when one points outside the manifest's location and !trust).
Result<Manifest> ReadManifest(const std::string& path, std::string* unreadable, bool trust = false);

// The manifest's text for a finished write of `pattern`.
// channel_order: of the decoded arrays, recorded when "npy" is among the fields and
// it is known ("bgr" or "rgb", from WriteOptions::array_channels).
std::string ManifestText(const std::string& pattern, uint64_t num_samples, const std::vector<std::string>& class_names,
                         const std::vector<std::string>& fields, const std::vector<ShardInfo>& shards,
                         bool write_index, uint64_t* total_bytes, const std::string& channel_order = "",
                         const std::string& transform = "");

}  // namespace shardkit::formats::wds
