// Internal: MXNet RecordIO on disk (dmlc-core's include/dmlc/recordio.h, mxnet's
// recordio.py), as pure functions over bytes: the record framing, the im2rec
// image header (IRHeader) and the text .idx. The reader, the writer, the fuzz
// target and the tests use these; nothing here touches a file.
//
// A record: uint32 magic 0xced7230a, uint32 lrecord = (cflag << 29) | length,
// `length` bytes, zero padding to a multiple of 4 (all little-endian). A payload
// that holds the magic word at a 4-byte aligned position is cut there: the magic
// is dropped and the parts are written as cflag 1 (first), 2 (middle), 3 (last);
// cflag 0 is a whole record. A reader joins the parts, putting the magic back
// between them.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::formats::recordio {

constexpr uint32_t kMagic = 0xced7230a;
constexpr uint32_t kMaxPart = (1u << 29) - 1;  // the largest length one part can hold
constexpr size_t kIRHeaderSize = 24;           // <IfQQ: flag, label, id, id2

inline uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline uint64_t Load64(const uint8_t* p) { return uint64_t(Load32(p)) | uint64_t(Load32(p + 4)) << 32; }

// One logical record found at `offset`: its payload (a view into the file when
// it is one part, else joined in `scratch`), and where the next record starts.
struct Record {
  std::string_view payload;
  bool joined = false;  // payload lives in the scratch buffer (continuation parts)
  uint64_t parts = 1;
  uint64_t next = 0;
};

// Reads the logical record that starts at `offset` of [data, data+size).
// Errors are kCorrupt with Detail::kRecordFraming, located at `file` and the
// offending offset: a bad magic, a length past the end, a truncated header, a
// continuation that never ends or runs out of order, a cflag above 3.
Status ReadRecord(const uint8_t* data, uint64_t size, uint64_t offset, const std::string& file,
                  std::string* scratch, Record* out);

// The framed bytes of one payload, split at aligned magic words as dmlc-core's
// RecordIOWriter does. kInvalidArgument for a part over 2^29 - 1 bytes.
Status AppendRecord(std::string_view payload, std::string* out);

// The im2rec image header and what follows it.
struct ImageRecord {
  uint32_t flag = 0;
  float label = 0;
  uint64_t id = 0, id2 = 0;
  std::vector<float> labels;  // the `flag` extra labels when flag > 0
  std::string_view image;     // the rest of the payload
};
// kCorrupt (Detail::kRecordFraming) when the payload is shorter than the header
// or than the `flag` labels it announces; `where` locates the record.
Status ParseImageRecord(std::string_view payload, const Location& where, ImageRecord* out);
// The payload bytes of an ImageRecord (flag is labels.size() when labels is
// non-empty; mxnet's recordio.pack does the same).
std::string ImagePayload(const ImageRecord& r, std::string_view image);

// One line of a text .idx.
struct IdxEntry {
  std::string key;
  uint64_t offset = 0;
};
// Parses `key<TAB>offset` lines (a trailing '\r' and empty last line allowed;
// mxnet writes "%s\t%d\n"). kCorrupt naming `file` and the line on a bad line.
Result<std::vector<IdxEntry>> ParseIdx(std::string_view text, const std::string& file);

}  // namespace shardkit::formats::recordio
