// Internal: the wds format's shard index and sidecar files, shared by the
// writer (writer.cc), `shardkit index` (index_command.cc), verify through the format
// contract (shards.cc: Format::locate_samples). Implemented in dali_index.cc,
// shard_index.cc and sums.cc.
//
// Files beside a shard `dir/train-000000.tar`:
//  - dir/train-000000.idx        DALI's index (v1.2; v1.1 when a member name
//                                holds white space): one line per sample,
//                                `<ext> <data offset> <size> [<name>]` per member.
//  - dir/train-000000.tar.xxh3   per-sample checksums (Sample::checksum()), in
//                                shard order: a first line
//                                `shardkit-sample-xxh3 v1 <n>`, then n lines of
//                                16 lowercase hex digits. About 17 bytes a sample
//                                (22 MB for 1.3M samples, spread over the shards),
//                                read per shard, so verify never holds more than
//                                one shard's list.
//
// Thread safety: plain functions; distinct calls may run at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::formats::wds {

struct IndexMember {
  std::string ext;   // field extension (lowercased, as the reader sees it)
  std::string name;  // the member's own name in the tar
  uint64_t offset = 0;  // of the member's data (a multiple of 512)
  uint64_t size = 0;
};

// A shard's members grouped per sample: sample i is
// members[sample_ends[i-1] .. sample_ends[i]) (from 0 for i == 0).
struct ShardMembers {
  std::vector<IndexMember> members;
  std::vector<size_t> sample_ends;
  std::vector<std::string> keys;  // one per sample
  uint64_t file_size = 0;
};

// DALI's default index name: the archive path up to the first dot of its base
// name (a leading dot does not count), plus ".idx".
std::string DaliIndexPath(const std::string& tar_path);
// The text of a DALI index for these members.
std::string DaliIndexText(const std::vector<IndexMember>& members, const std::vector<size_t>& sample_ends);
// Scans a shard with the reader's strict rules (same samples, same errors).
Result<ShardMembers> ScanShardMembers(const std::string& tar_path, int64_t shard = -1);

// The per-sample checksum sidecar of a shard: tar_path + ".xxh3".
std::string SumsPath(const std::string& tar_path);
std::string SumsText(const std::vector<uint64_t>& sums);
// Reads a sidecar; kNotFound when there is none, kCorrupt when malformed.
Result<std::vector<uint64_t>> ReadSums(const std::string& sums_path);

}  // namespace shardkit::formats::wds
