// Internal: the one strict tar member scanner, for mapped and streamed shards
// alike. It pulls bytes from a read-ahead Source (formats/tar/source.h: an mmap
// of a shard, a pipe from a command), so every source gets the same rules: ustar,
// GNU (long names 'L', base-256 sizes) and pax ('x' path/size records, 'g'
// ignored) headers; every header checksum checked; every size checked against
// the bytes that exist (when the source's size is known up front, without
// reading the data); one or two zero blocks, then only zero bytes, end the
// archive. It never allocates by a size read from the file. Errors are
// kCorrupt / kUnsupported with the file and the byte offset of the offending
// header; a source's read errors pass through as they are.
//
// Thread safety: a Scanner and its source are used by one thread; bytes in
// memory must stay mapped and unchanged while it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "formats/tar/source.h"
#include "shardkit/bytes.h"
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
  // Reads from `source` (not owned; it must outlive the scanner), whose
  // position 0 is the start of the archive. `path` names it in errors.
  Scanner(Source* source, std::string path) : src_(source), path_(std::move(path)) {}
  // Over bytes in memory (a MemorySource of its own).
  Scanner(const uint8_t* data, uint64_t size, std::string path)
      : own_(std::make_unique<MemorySource>(data, size)), src_(own_.get()), path_(std::move(path)) {}
  // Fills *m with the next member and returns true; false at a well-formed end
  // of archive (one or two zero blocks, then only zero bytes). The member's
  // data is then next in the source; the next call skips it unless TakeData()
  // took it.
  Result<bool> Next(Member* m);
  // The data of the member the last Next() returned (once, before the next
  // Next()): a view of the mapping for memory, bytes of their own for a stream.
  // Its presence was checked by Next().
  Result<Bytes> TakeData();
  const std::string& path() const { return path_; }

 private:
  Status Bad(uint64_t offset, std::string msg) const {
    return Status::Corrupt(std::move(msg), Location{.file = path_, .offset = int64_t(offset)});
  }
  Status CheckEnd(uint64_t zero_at);
  Status Skip(uint64_t n);
  std::unique_ptr<MemorySource> own_;
  Source* src_;
  std::string path_;
  uint64_t data_left_ = 0;  // of the last member: data not yet taken
  uint64_t pad_left_ = 0;   // then its padding
  bool done_ = false;
};

// Parses a numeric header field (octal text, or GNU base-256 when the high bit
// of the first byte is set). False when malformed or out of range.
bool ParseNumber(const uint8_t* field, size_t len, uint64_t* out);

// A 512-byte header block's checksum, by the scanner's rule: the stored field
// against the sum of the block's bytes with the field counted as spaces (signed
// sums accepted, as old tars wrote them). *stored and *computed (unsigned sum)
// are filled when not null. False also when the field itself is malformed.
bool HeaderChecksumOk(const uint8_t* block, uint64_t* stored = nullptr, uint64_t* computed = nullptr);

}  // namespace shardkit::tar
