// Internal: a small, strict tar member scanner over bytes in memory (an mmap of
// a shard). It reads ustar, GNU (long names 'L', base-256 sizes) and pax
// ('x' path/size records, 'g' ignored) headers, checks every header checksum and
// every size against the bytes that exist, and never allocates by a size read
// from the file. Errors are kCorrupt / kUnsupported with the file and the byte
// offset of the offending header.
//
// Thread safety: a Scanner is used by one thread; the bytes must stay mapped and
// unchanged while it runs.
#pragma once

#include <cstdint>
#include <string>

#include "shardkit/status.h"

namespace shardkit::tar {

constexpr uint64_t kBlock = 512;

struct Member {
  std::string name;            // full name: pax path > GNU long name > ustar prefix/name
  char type = '0';             // normalised: '0' regular ('\0', '7' map here), '5' directory, else as stored
  uint64_t header_offset = 0;  // offset of the first block of this member (its pax / long-name records)
  uint64_t data_offset = 0;    // offset of the member's data (a multiple of 512)
  uint64_t size = 0;           // data size in bytes
};

class Scanner {
 public:
  Scanner(const uint8_t* data, uint64_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}
  // Fills *m with the next member and returns true; false at a well-formed end
  // of archive (one or two zero blocks, then only zero bytes).
  Result<bool> Next(Member* m);
  const std::string& path() const { return path_; }

 private:
  Status Bad(uint64_t offset, std::string msg) const {
    return Status::Corrupt(std::move(msg), Location{.file = path_, .offset = int64_t(offset)});
  }
  Status CheckEnd(uint64_t zero_at);
  const uint8_t* data_;
  uint64_t size_;
  std::string path_;
  uint64_t pos_ = 0;
  bool done_ = false;
};

// Parses a numeric header field (octal text, or GNU base-256 when the high bit
// of the first byte is set). False when malformed or out of range.
bool ParseNumber(const uint8_t* field, size_t len, uint64_t* out);

}  // namespace shardkit::tar
