// Internal: the wds reader's index of a mapped shard (where each sample's
// members lie), built by a scan with the strict tar scanner (formats/tar/tar.h)
// or loaded from a DALI .idx that agrees with the shard (dali_index.cc).
//
// Thread safety: a SampleCursor is used by one thread; a ShardIndex is
// immutable once built; the functions may run at once on distinct arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/file.h"
#include "formats/tar/tar.h"
#include "formats/wds/names.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

struct FieldRef {
  std::string ext;
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
};

struct SampleRef {
  std::string key;
  uint64_t offset = 0;  // of the first member's first header block
  std::vector<FieldRef> fields;  // in shard order
};

struct ShardIndex {
  std::string path;
  uint64_t file_size = 0;
  std::vector<SampleRef> samples;
  uint64_t skipped = 0;
  std::set<std::string> exts;
};

// Groups consecutive members with the same key into samples.
class SampleCursor {
 public:
  SampleCursor(const io::MappedFile& map, int64_t shard)
      : scan_(map.data(), map.size(), map.path()), file_(map.path()), shard_(shard) {}

  Result<bool> Next(SampleRef* out) {
    if (!have_pending_) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return false;
    }
    out->key = std::move(pending_key_);
    out->offset = pending_header_;
    out->fields.clear();
    out->fields.push_back(std::move(pending_));
    have_pending_ = false;
    for (;;) {
      SK_ASSIGN_OR_RETURN(bool more, Pull());
      if (!more) return true;
      if (pending_key_ != out->key) return true;
      for (const auto& f : out->fields)
        if (f.ext == pending_.ext)
          return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", f.ext, out->key),
                                 Location{.file = file_, .shard = shard_, .offset = int64_t(pending_header_),
                                          .key = out->key});
      out->fields.push_back(std::move(pending_));
      have_pending_ = false;
    }
  }
  uint64_t skipped() const { return skipped_; }

 private:
  // Reads the next data member into pending_.
  Result<bool> Pull() {
    tar::Member m;
    for (;;) {
      auto r = scan_.Next(&m);
      if (!r.ok()) {
        Status s = std::move(r).take_status();
        s.At(Location{.shard = shard_});
        return s;
      }
      if (!*r) return false;
      std::string key, ext;
      SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, file_, shard_, &key, &ext));
      if (kind == NameKind::kSkip) {
        if (m.type == '0') ++skipped_;
        continue;
      }
      pending_key_ = std::move(key);
      pending_ = FieldRef{std::move(ext), m.data_offset, m.size};
      pending_header_ = m.header_offset;
      have_pending_ = true;
      return true;
    }
  }

  tar::Scanner scan_;
  std::string file_;
  int64_t shard_;
  bool have_pending_ = false;
  std::string pending_key_;
  FieldRef pending_;
  uint64_t pending_header_ = 0;
  uint64_t skipped_ = 0;
};

// Maps a shard; errors name the file and the shard.
Result<std::shared_ptr<io::MappedFile>> MapShard(const std::string& path, int64_t shard);
// Scans a mapped shard into its samples (the reader's strict rules).
Result<ShardIndex> ScanShard(const io::MappedFile& map, int64_t shard);
// Loads a DALI v1.2 index and checks it against the mapped shard: offsets on
// block boundaries inside the file, a valid regular-file header with the same
// size before every member, names that classify like a scan would, and the
// end-of-archive block right after the last member. Any doubt: returns an
// error and the caller scans instead.
Result<ShardIndex> LoadIdx(const std::string& idx_path, const io::MappedFile& map, int64_t shard);
// The same from the index's text, for a shard of `file_size` bytes whose bytes
// are `data`; with data == nullptr nothing of the shard is read (the member
// headers and the bytes between members are not checked: a lazy open trusts
// the index, and the reader checks each sample's headers when it reads them,
// CheckSampleHeaders).
Result<ShardIndex> ParseIdx(std::string_view text, const std::string& idx_path, const std::string& shard_path,
                            uint64_t file_size, const uint8_t* data, int64_t shard);
// Checks the tar header before each field of `ref`, whose bytes from ref.offset
// on are `bytes` (the sample's range): a regular file of the field's size and,
// with header_checksums, a valid header checksum (LoadIdx does not check that:
// a local shard whose index was checked reads as it did). kCorrupt naming the
// shard, offset and key otherwise.
Status CheckSampleHeaders(const uint8_t* bytes, uint64_t length, const SampleRef& ref, const std::string& path,
                          int64_t shard, bool header_checksums);
// Fills *out with the sample's fields as views of `map` (inline: the random-access hot path).
// `owner` keeps `map` alive (the map itself, or a per-thread owner of it).
inline void FillSample(const io::MappedFile& map, const std::shared_ptr<const void>& owner, const SampleRef& ref,
                       Sample* out) {
  out->clear();
  out->key = ref.key;
  for (const auto& f : ref.fields) out->set(f.ext, Bytes(owner, map.data() + f.offset, f.size));
}

}  // namespace shardkit::formats::wds
