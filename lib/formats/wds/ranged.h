// Internal: reading a shard through the storage seam without mapping it (a
// remote object): a tar::Source over ReadableFile::ReadAt that fetches the
// bytes in large sequential ranges, and a sequential sample reader over it
// (the "streamed mode" of a remote shard that has no index, and the in-order
// reader of any remote shard). The tar rules are the mapped shards' own (the
// one scanner, formats/tar/tar.h).
//
// Thread safety: one thread per source and per reader.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "formats/tar/source.h"
#include "shardkit/dataset.h"
#include "shardkit/filesystem.h"

namespace shardkit::formats::wds {

// Fetches `chunk` bytes at a time (more when a member asks for more); Take()
// hands out views of a fetched range (never written again) or a range of its own.
class RangedSource final : public tar::Source {
 public:
  RangedSource(std::shared_ptr<ReadableFile> file, size_t chunk = 8 << 20) : file_(std::move(file)), chunk_(chunk) {}
  Result<std::span<const uint8_t>> Ahead(size_t min) override;
  Result<uint64_t> Consume(uint64_t n) override;
  Result<Bytes> Take(uint64_t n) override;
  uint64_t position() const override { return pos_; }
  int64_t size() const override { return int64_t(file_->size()); }

 private:
  Status Fetch(size_t min);
  std::shared_ptr<ReadableFile> file_;
  size_t chunk_;
  uint64_t pos_ = 0;
  std::shared_ptr<std::string> buf_;  // the bytes at [buf_start_, buf_start_ + buf_->size())
  uint64_t buf_start_ = 0;
};

// The samples of one shard read in order through `file` (opened on the first Next()
// when null: `path` through FileSystemFor). Fields own their bytes.
std::unique_ptr<SampleReader> NewRangedShardReader(std::string path, int64_t shard);

}  // namespace shardkit::formats::wds
