// Internal: leaving a planned sample out of a shard plan (convert --skip-bad with
// --part, --num-shards or --samples-per-shard).
//
// Under WriteOptions::shard_plan the plan counts positions of the write order: shard i
// takes the next shard_plan[i] of them. A writer that implements LeavesOut lets the
// copy loop use a position without writing a sample there (an image that did not
// decode): its shard holds one sample fewer, and every later sample stays in the shard
// the plan gave it. The output then depends only on the source and the options, never
// on how many parts wrote it; a shard whose planned samples were all left out is
// written empty, so that shard numbers stay those of the plan. A part's record (wds)
// lists the samples it left out, and merge checks samples + left out against the plan.
//
// Threading: called on the writer's one thread, between its Write() calls.
#pragma once

#include <string_view>

#include "shardkit/status.h"

namespace shardkit::formats {

class LeavesOut {
 public:
  virtual ~LeavesOut() = default;
  // Uses the next position of the shard plan without writing a sample: the one with
  // `key`, left out for `reason`.
  virtual Status LeaveOut(std::string_view key, std::string_view reason) = 0;
};

}  // namespace shardkit::formats
