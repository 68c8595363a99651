// shardkit/index.h: index files that other loaders read beside tar shards.
//
//  - DALI's WebDataset reader: one index per shard (`train-000000.idx` beside
//    `train-000000.tar`), text: `v1.2 <samples>`, then one line per sample with
//    `<ext> <data offset> <size> <member name>` per member (v1.1, without names,
//    when a name holds white space). shardkit's wds writer writes it by default
//    (WriteOptions::write_index); WriteDaliIndex() makes one for any shard.
//  - wids (WebDataset's indexed reader): a JSON shard list naming each shard's
//    url, sample count, size and md5; DescribeTarShard() gives one entry.
//
// Shards are scanned with the same strict rules as the wds reader, so an index
// never describes a shard that shardkit would refuse to read.
//
// Thread safety: reentrant; distinct calls may run at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

// DALI's default index path for a shard: the path up to the first dot of the
// base name, plus ".idx" (out/train-000000.tar -> out/train-000000.idx).
SHARDKIT_API std::string DaliIndexPathFor(const std::string& tar_path);

// Scans a shard and writes its DALI index atomically to `output` (default:
// DaliIndexPathFor(tar_path)), replacing an existing one. Returns the number of
// samples indexed. A shard with no samples is refused (DALI needs at least one).
SHARDKIT_API Result<uint64_t> WriteDaliIndex(const std::string& tar_path, const std::string& output = "");

// One entry of a wids shard list.
struct TarShardSummary {
  std::string path;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  std::string md5;  // 32 lowercase hex digits of the whole file
};
// Scans a shard (counting samples as the reader groups them) and hashes it.
SHARDKIT_API Result<TarShardSummary> DescribeTarShard(const std::string& tar_path);

// wids's shard list ("wids-shard-index-v1" JSON) of `shards`, each scanned and hashed
// (DescribeTarShard). Urls are relative to the directory of `output` (or the current one
// when `output` is empty); a remote shard keeps its address without secrets. `name` is the
// list's "name" (empty: output's base name without .json/.wids, else "shardkit"). Written
// atomically at `output` (WriteIndexFile); with an empty `output` only returned in text.
struct WidsIndex {
  std::string text;  // the JSON
  uint64_t shards = 0, samples = 0;
};
SHARDKIT_API Result<WidsIndex> WriteWidsIndex(const std::vector<std::string>& shards, const std::string& output = "",
                                              const std::string& name = "");

// Expands a brace range ("train-{000000..000009}.tar") or a "::"-joined list of
// shard paths; a plain path expands to itself.
SHARDKIT_API Result<std::vector<std::string>> ExpandShardList(std::string_view pattern);

// Scans one file and writes the index its own format defines (MXNet RecordIO:
// FILE.idx, `key<TAB>offset` lines, beside FILE.rec) at `output` (empty: the
// format's default place, returned in *written). Returns the number of records.
// kUnsupported when the address's format defines none (tar shards: WriteDaliIndex).
SHARDKIT_API Result<uint64_t> WriteFormatIndex(std::string_view address, const std::string& output = "",
                                               std::string* written = nullptr);

// Writes a small index file atomically (temporary name, fsync, rename).
SHARDKIT_API Status WriteIndexFile(const std::string& path, std::string_view text);

}  // namespace shardkit
