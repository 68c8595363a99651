// Internal: MosaicML Streaming MDS (index.json version 2 + shard.NNNNN.mds
// files, as streaming's MDSWriter writes them). The layout and the mapping of
// columns to shardkit fields are in docs/formats-mds.md.
//
//  index.cc   index.json: parse and check, column -> field mapping, bids, listing
//  shard.cc   one shard file: size and hash checks, zstd, header and offsets
//  reader.cc  the Dataset (directory or one shard), sequential and random reads
//  writer.cc  the SampleWriter (staged directory, one Publish)
//  hash.cc    the hash algorithms streaming names (xxh*, md5, sha1)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::mds {

inline constexpr const char* kIndexName = "index.json";
inline constexpr const char* kSidecarName = "shardkit.json";  // class names (not read by streaming)
// Shard offsets are uint32: no shard may reach 4 GiB.
inline constexpr uint64_t kMaxShardBytes = 0xFFFFFFFFull;

// How a column's encoded bytes become a field's bytes.
enum class Conv {
  kRaw,    // as stored (bytes, str, json, jpeg, png, pkl, pil, str_int, ndarray, ...)
  kInt,    // little-endian integer of `width` bytes -> ASCII decimal
  kUInt,
  kFloat,  // IEEE float of `width` bytes (2, 4, 8) -> shortest round-trip text
  kPil,    // streaming's "pil" (uint32 width, height, mode length, mode, raw pixels) -> PNG file
};

enum class Role { kField, kKey };

struct Column {
  std::string name;
  std::string encoding;
  std::optional<uint32_t> size;  // fixed size, or variable (a uint32 per sample)
  Role role = Role::kField;
  std::string ext;               // the field it maps to (Role::kField)
  Conv conv = Conv::kRaw;
  int width = 0;                 // kInt/kUInt/kFloat: bytes
};

struct FileRef {
  std::string basename;
  uint64_t bytes = 0;
  std::map<std::string, std::string> hashes;  // algorithm -> hex digest
};

// One entry of index.json's "shards".
struct ShardMeta {
  int64_t index = 0;        // position in index.json
  uint64_t samples = 0;
  uint64_t first = 0;       // global index of its first sample
  std::vector<Column> columns;  // in stored order
  std::string compression;  // "" or as written ("zstd", "zstd:7")
  FileRef raw;
  std::optional<FileRef> zip;
  std::string path;         // the file on disk: zip's when compressed, else raw's
  uint64_t file_bytes() const { return zip ? zip->bytes : raw.bytes; }
};

struct Index {
  std::string dir;          // the directory holding index.json
  std::string index_path;
  std::vector<ShardMeta> shards;
  uint64_t num_samples = 0;
  std::vector<std::string> class_names;  // from shardkit.json, if any
  std::string channel_order;             // of decoded arrays, from shardkit.json: "bgr", "rgb" or ""
  std::string transform;                 // from shardkit.json: the transform's JSON object as text, or ""
  std::vector<std::string> fields;       // union over shards, sorted
};

// Maps streaming's columns onto shardkit fields (the documented rules:
// `__key__` (or a str `key`) is the key; image columns become jpg/png;
// an integer label/y/target column becomes cls; every other column is carried
// under its own name). Fails on an unknown encoding or two columns that map to
// one field.
Status MapColumns(std::vector<Column>* cols, const Location& at);
// The fixed size of an encoding (nullopt: variable); false when unknown.
bool EncodingSize(std::string_view encoding, std::optional<uint32_t>* size);

// Parses index.json text (`dir` holds it). Checks the structure (version 2,
// format "mds", counts, names, encodings), not the shard files.
Result<Index> ParseIndex(std::string_view text, const std::string& dir, const std::string& index_path);
// Reads and parses DIR/index.json and DIR/shardkit.json through `fs`.
Result<Index> ReadIndex(const std::string& dir, const std::shared_ptr<FileSystem>& fs);

// Where an address points: the directory, and the one shard when it names a
// shard file (DIR/shard.00003.mds[.zstd]) or -1.
struct Target {
  std::string dir;
  std::string shard_file;  // the basename path as given, or empty
};
Target Resolve(const std::string& path);

// ---- one shard file (shard.cc)

// A shard's uncompressed bytes, validated: the header's count matches the
// index, the offsets are within the file, monotonic, and start past the
// config; the samples are views into `data`.
struct ShardData {
  std::shared_ptr<const void> owner;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint32_t n = 0;
  // offsets[i] (n + 1 of them) as read, little-endian.
  uint32_t offset(uint64_t i) const;
};

struct LoadOptions {
  bool check_hashes = false;        // compare the index's hashes of the stored and raw bytes
  uint64_t max_raw = kMaxShardBytes;  // refuse a larger uncompressed size (the fuzz target lowers it)
};

// Loads one shard: the stored file's size against the index, hashes (when
// asked), zstd decompression bounded by the index's raw size, header checks.
// Errors are kCorrupt naming the file and byte offset; a size or hash
// mismatch carries Detail::kShardChecksum.
Result<std::shared_ptr<const ShardData>> LoadShard(const ShardMeta& m, const std::shared_ptr<FileSystem>& fs,
                                                   const LoadOptions& opts);
// Header checks of uncompressed shard bytes against its index entry.
Status CheckHeader(const ShardData& d, const ShardMeta& m);
// Decodes sample i (local) of a loaded shard into *out (key, fields).
Status DecodeSample(const ShardData& d, const ShardMeta& m, uint64_t i, Sample* out);

// zstd: decompress a whole buffer, refusing output beyond `limit` bytes.
Result<std::string> Unzstd(const uint8_t* p, size_t n, uint64_t limit, const Location& at);
Result<std::string> Zstd(std::string_view raw, int level);
// "zstd" or "zstd:N": the level (3 by default); false when not zstd.
bool ParseZstd(std::string_view compression, int* level);

// streaming's "pil" encoding as a PNG file (modes L, LA, RGB, RGBA; others kUnsupported).
Result<std::string> PilToPng(const uint8_t* p, size_t n, const Location& at);

// ---- hashes (hash.cc), as streaming's get_hash() hexdigest()s them

// Whether shardkit computes this algorithm.
bool KnownHash(std::string_view algo);
// The lowercase hex digest; kUnsupported for an unknown algorithm.
Result<std::string> HashHex(std::string_view algo, const void* data, size_t size);
// The same over pieces. One thread at a time; Hex() once, at the end.
class Hasher {
 public:
  explicit Hasher(std::string_view algo);
  ~Hasher();
  void Update(const void* data, size_t size);
  Result<std::string> Hex();

 private:
  struct State;
  std::unique_ptr<State> st_;
};

// ---- the format's hooks (reader.cc, writer.cc, index.cc)
int BidRead(const std::string& path);
int BidWrite(const std::string& path);
Result<std::unique_ptr<Dataset>> OpenMds(const std::string& path, const OpenOptions& opts);
Result<std::unique_ptr<SampleWriter>> CreateMds(const std::string& path, const WriteOptions& opts);
Result<ShardListing> ListShards(const std::string& path, const OpenOptions& opts);
Result<std::vector<SampleExtent>> LocateSamples(const std::string& shard_path, int64_t shard);

}  // namespace shardkit::formats::mds
