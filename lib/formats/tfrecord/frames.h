// Internal: TFRecord framing (TensorFlow's "TFRecords format details"):
//   uint64 length (little-endian), uint32 masked_crc32c(length bytes),
//   length bytes of data, uint32 masked_crc32c(data).
// A file may be GZIP or ZLIB compressed as a whole; it is then inflated into
// memory (with a cap against zip bombs) and framed like an uncompressed one, and
// offsets in messages are offsets in the inflated stream.
//
// Thread safety: FileData is immutable once loaded; any thread may read it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/shard_cache.h"
#include "shardkit/status.h"

namespace shardkit::formats::tfrecord {

constexpr uint64_t kHeaderBytes = 12;  // length + its CRC
constexpr uint64_t kFrameOverhead = 16;  // header + the data's CRC

enum class Compression { kNone, kGzip, kZlib };
const char* CompressionName(Compression c);  // "none", "gzip", "zlib"

// The bytes of one TFRecord file: a read-only mapping, or the inflated stream of
// a compressed file (owned).
struct FileData {
  std::string path;
  Compression compression = Compression::kNone;
  std::shared_ptr<const void> owner;  // keeps `data` alive; the owner of zero-copy views
  const uint8_t* data = nullptr;
  uint64_t size = 0;        // of the (inflated) stream
  uint64_t disk_bytes = 0;  // of the file
};

// One record: where its header starts and how long its data is (data at offset + 12).
struct Frame {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The most an inflated file may hold: max(kInflateFloor, kInflateRatio x the
// compressed size). Beyond it, loading fails (a zip bomb, or a file to store
// uncompressed).
constexpr uint64_t kInflateFloor = 16ull << 20;
constexpr uint64_t kInflateRatio = 64;

// Which compression the first bytes say: a valid uncompressed record header
// first, then the gzip magic, then a zlib header. kNone also for unknown bytes.
Compression DetectCompression(const uint8_t* p, size_t n);

// Maps or inflates a file. Errors name the file and, for a damaged compressed
// stream, the compressed offset.
Result<FileData> LoadFile(const std::string& path, const io::CacheOptions& cache = {});

// 100 when the file's first record header (after inflating, when compressed)
// has a valid length CRC, 0 when the file is readable but not, -1 when it cannot
// be read.
int ContentBid(const std::string& path);

// Reads the header at `offset`: checks its length CRC and that the record fits
// in the stream. Errors name file and offset.
Result<Frame> ReadHeader(const FileData& f, uint64_t offset);
// Walks every header from the start (the index built at open).
Result<std::vector<Frame>> ScanFrames(const FileData& f);
// Checks a record's data CRC; kCorrupt with Detail::kSampleChecksum on a mismatch.
Status CheckData(const FileData& f, const Frame& fr, int64_t index = -1);

// DALI's tfrecord2idx index: one "offset size" line per record (size = the whole
// frame, 16 + length).
std::string DaliIndexText(const std::vector<Frame>& frames);
// Where shardkit writes and looks for that index: the path without a
// ".tfrecord"/".tfrecords" extension, plus ".idx" (train-00000.tfrecord ->
// train-00000.idx; imagenet2012-train.tfrecord-00000-of-01024 -> ...-01024.idx).
std::string IdxPathFor(const std::string& path);
// The frames an index lists, each checked against the file (length CRC, size =
// 16 + length, inside the file). Errors name the index file and its line.
Result<std::vector<Frame>> FramesFromIdx(const FileData& f, const std::string& idx_path, std::string_view text);

// Appends one framed record to `out`.
void AppendFrame(std::string* out, std::string_view data);

}  // namespace shardkit::formats::tfrecord
