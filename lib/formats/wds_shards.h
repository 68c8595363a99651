// Internal: the wds format's answers to the format contract (formats/registry.h):
// its manifest, read once for open and for verify; its content bid; its shard
// listing and sample locations. Implemented in formats/wds_shards.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::wds {

// A manifest (out/train.manifest.json) as written by the wds writer.
struct Manifest {
  uint64_t num_samples = 0;
  std::vector<std::string> class_names;
  std::vector<ShardInfo> shards;  // paths joined to the manifest's directory
  std::vector<std::string> fields;
  std::string fields_error;  // "fields" is malformed: why (the rest is still read)
};

// Reads a manifest. Errors: the file cannot be read; kCorrupt when it is JSON
// whose "format" is not "wds". When it is malformed (not JSON, a member missing
// or of the wrong type) *unreadable says why and the result is empty.
Result<Manifest> ReadManifest(const std::string& path, std::string* unreadable);

// Format::bid_read: 100 for a manifest naming the format or a file whose first
// block is a tar header (magic and checksum); 90 for a name that says so
// (.tar, .manifest.json, a brace range or list of .tar, `pipe:CMD`).
int BidRead(const std::string& path);

// Format::list_shards and Format::locate_samples.
Result<ShardListing> ListShards(const std::string& path);
Result<std::vector<SampleExtent>> LocateSamples(const std::string& shard_path, int64_t shard);

}  // namespace shardkit::formats::wds
