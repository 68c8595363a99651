// Internal: the wds format's answers to the format contract (formats/registry.h):
// its manifest, read once for open and for verify; its content bid; its shard
// listing and sample locations (the manifest reader is manifest.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::wds {

// Format::bid_read: 100 for a manifest naming the format or a file whose first
// block is a tar header (magic and checksum); 90 for a name that says so
// (.tar, .manifest.json, a brace range or list of .tar, `pipe:CMD`).
int BidRead(const std::string& path);

// Format::list_shards and Format::locate_samples.
Result<ShardListing> ListShards(const std::string& path, const OpenOptions& opts);
Result<std::vector<SampleExtent>> LocateSamples(const std::string& shard_path, int64_t shard);

}  // namespace shardkit::formats::wds
