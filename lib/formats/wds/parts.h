// Internal: a wds write split into parts (WriteOptions::part, `--part I/N`).
//
// Each part writes its shards of the global plan under their final names and, when
// it finishes, a part record beside them instead of the manifest:
//   out/train.part-00003-of-00016.json
// (the manifest's name without ".manifest.json", then ".part-I-of-N.json"; its
// journal while it runs is that name plus ".partial", and a lock file ".lock" keeps a
// second process off the same part). MergeParts() checks every record and writes the
// manifest last, byte for byte what a single-process write of the same command
// writes. docs/cluster.md has the whole procedure.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardkit/convert.h"
#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

// out/train-%06d.tar, 3, 16 -> out/train.part-00003-of-00016.json
std::string PartRecordPath(const std::string& pattern, uint64_t index, uint64_t count);
// Which of `names` (base names in the pattern's directory) are part records of
// `pattern`, or their journals (".partial") and locks (".lock").
std::vector<std::string> PartFiles(const std::string& pattern, const std::vector<std::string>& names);

// The record of a finished part: the part, the plan it followed (PartWriteOptions),
// its fields and shards, and the samples of its plan it left out (key, reason;
// formats/leave_out.h). *total_bytes: the sum of the shards' bytes.
std::string PartRecordText(const std::string& pattern, const WriteOptions& opts,
                           const std::vector<std::string>& fields, const std::vector<ShardInfo>& shards,
                           uint64_t samples, const std::vector<std::pair<std::string, std::string>>& left_out,
                           uint64_t* total_bytes);

// Whether the write that `opts` describes (a part, or the whole output) already
// finished: its record (a part) or its manifest (the whole) exists and no journal
// does. Then it is checked (same plan for a part; every shard present with its
// recorded size, its index and checksum file) and its summary returned; nullopt when
// it has not finished. Errors: it finished with a different plan (naming the first
// difference), or a file it lists is missing or has another size.
Result<std::optional<WriteSummary>> FinishedOutput(const std::string& pattern, const WriteOptions& opts);

// `shardkit merge`: checks the part records beside `pattern` and writes the manifest
// (see the file comment and shardkit/convert.h, Merge()).
Result<MergeSummary> MergeParts(const std::string& pattern, const MergeOptions& opts);

}  // namespace shardkit::formats::wds
