// Internal: reading a streamed shard, `pipe:CMD` (the standard output of a
// shell command, as WebDataset's `pipe:` URLs). It is read once, in order,
// while the command runs; nothing is mapped, so there is no random access.
// The tar rules are the mapped shards' own: the one scanner
// (formats/tar/tar.h) over a stream source.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardkit/dataset.h"

namespace shardkit::formats::wds {

// The samples of one streamed shard, in order. The command starts on the first
// Next(); destroying the reader stops it. An error is sticky; a command that
// fails after a whole archive fails after its last sample, not instead of it.
// Fields own their bytes (they stay valid after the reader goes). Memory: one
// sample plus one member.
std::unique_ptr<SampleReader> NewPipeShardReader(std::string address, int64_t shard);

}  // namespace shardkit::formats::wds
