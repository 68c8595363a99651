// shardkit/verify.h: proving that a dataset is complete and intact.
//
// Verify() reads a whole dataset and reports what is wrong with it, as a list of
// findings rather than a first error: a damaged shard does not stop the check of
// the others. It checks
//  - structure: every shard / file opens and every sample reads through the
//    format's own strict reader (tar headers and padding, the LMDB environment
//    and records, the HDF5 layout); a failure is a `structure` finding with its
//    location, and reading goes on with the next shard (wds) or, where the
//    format has random access, with the next sample;
//  - counts: samples read against the metadata (the manifest's per-shard and
//    total counts, DatasetInfo::num_samples, the number of recorded checksums);
//  - checksums: every per-shard file checksum the metadata records
//    (ShardInfo::checksum) and every per-sample checksum the writer recorded
//    (Dataset::RecordedChecksums() against Sample::checksum());
//  - duplicate keys, within a shard and across shards (both places named);
//  - missing shards (a brace range or manifest naming a file that does not
//    exist) and empty shards (no samples);
//  - samples missing a field that other samples have;
//  - with `against`: the source, sample by sample by key (missing, extra,
//    different keys, labels or bytes); memory grows with the number of keys;
//  - with `decode`: every image field decoded in full (decode errors, and
//    images that decode only with warnings);
//  - with `duplicates`: samples whose image bytes repeat an earlier sample's (what
//    `convert --dedup` would drop), listed in VerifyReport::duplicate_images. Not
//    damage: they are no finding, and ok() does not change.
//
// Thread safety: Verify() is reentrant; the progress callback runs on the
// calling thread. Reading and checksums run on the calling thread; --decode
// decodes batches of images on VerifyOptions::threads threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"
#include "shardkit/export.h"

namespace shardkit {

enum class FindingKind : int {
  kStructure = 0,    // a shard / file / record the format's reader refuses
  kCount,            // samples read differ from what the metadata says
  kShardChecksum,    // a file's checksum differs from the recorded one
  kSampleChecksum,   // a sample's checksum differs from the recorded one
  kDuplicateKey,     // the same key twice (within or across shards)
  kMissingShard,     // a shard the address or manifest names does not exist
  kEmptyShard,       // a shard with no samples
  kMissingField,     // a sample lacks a field that other samples have
  kMissing,          // --against: in the source, not in the dataset
  kExtra,            // --against: in the dataset, not in the source
  kDifferent,        // --against: same key, different label / fields / bytes
  kDecodeError,      // --decode: an image that does not decode
  kDecodeWarning,    // --decode: an image that decodes only with warnings
};
constexpr int kNumFindingKinds = 13;
// "structure", "count", "shard-checksum", "sample-checksum", "duplicate-key",
// "missing-shard", "empty-shard", "missing-field", "missing", "extra",
// "different", "decode-error", "decode-warning".
SHARDKIT_API const char* FindingKindName(FindingKind k);

struct Finding {
  FindingKind kind;
  Location where;  // file, shard, offset, key, index (dataset order) as known
  std::string message;
};

struct VerifyProgress {
  const char* phase = "";          // "source" (reading --against) or "verify"
  uint64_t samples = 0;            // samples read in this phase
  uint64_t bytes = 0;              // payload bytes read in this phase
  std::optional<uint64_t> total;   // samples expected in this phase, when known
  double elapsed = 0;              // seconds since Verify() started
};

struct VerifyOptions {
  std::string against;  // address of the source dataset; empty: no comparison
  bool decode = false;  // decode every image field; parse every decoded array (npy) and note its channel order
  int threads = 0;      // decoding threads; 0: one per core
  // With `decode`: an image declaring more pixels than this (width * height) is a decode
  // finding ("image declares WxH pixels, over the limit"), refused before its pixels are
  // allocated: the decompression-bomb guard of LoaderOptions::max_pixels, same default.
  uint64_t max_pixels = 200'000'000;
  // List the samples whose image bytes equal an earlier sample's (dataset order): a
  // second read of the whole dataset, by index on `threads` threads where it has
  // random access (equal XXH3-128 hashes confirmed byte for byte), else in order with
  // the hashes alone.
  bool duplicates = false;
  // Findings kept in VerifyReport::findings (counts cover all of them); 0: all.
  uint64_t max_findings = 0;
  OpenOptions open;     // for the dataset (not the source)
  OpenOptions against_open;  // for the source (`against`)
  // Called about every 1000 samples and at the end of each phase.
  std::function<void(const VerifyProgress&)> progress;
};

struct VerifyReport {
  std::string address;  // as given
  std::string format;   // registry name
  uint64_t samples = 0;         // samples read
  uint64_t bytes = 0;           // payload bytes read
  uint64_t shards = 0;          // shards / files examined
  uint64_t source_samples = 0;  // with `against`: samples in the source
  bool sample_checksums = false;  // the dataset records per-sample checksums (and they were checked)
  bool shard_checksums = false;   // at least one per-file checksum was recorded and checked
  uint64_t images_decoded = 0;  // image fields decoded and decoded arrays parsed
  double seconds = 0;
  std::vector<Finding> findings;                 // in the order found, at most max_findings
  std::array<uint64_t, kNumFindingKinds> counts{};  // by FindingKind, all findings
  // With VerifyOptions::duplicates: (key, the earlier key whose image bytes it repeats).
  std::vector<std::pair<std::string, std::string>> duplicate_images;
  // Facts that are not findings, e.g. "no recorded checksums (folder datasets carry none)".
  std::vector<std::string> notes;

  uint64_t total_findings() const {
    uint64_t n = 0;
    for (uint64_t c : counts) n += c;
    return n;
  }
  uint64_t count(FindingKind k) const { return counts[static_cast<int>(k)]; }
  // True only when the dataset is intact: no finding of any kind.
  bool ok() const { return total_findings() == 0; }
};

// Verifies the dataset at `address`. Damage is reported as findings; the Result
// fails only when the check itself cannot run (no such dataset, a bad address,
// an unreadable --against source).
SHARDKIT_API Result<VerifyReport> Verify(std::string_view address, const VerifyOptions& opts = {});

}  // namespace shardkit
