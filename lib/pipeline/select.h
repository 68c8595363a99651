// pipeline/select.h (internal): choosing which samples a conversion writes
// (`convert --select ... --dedup`, ConvertOptions::select / dedup).
//
// SelectSamples() wraps a source Dataset in one that holds only the chosen samples, in
// source order, with random access by its own indices: everything downstream (the
// shuffle, the shard plan, --part, --resume, the source's recorded checksums) sees a
// smaller dataset and needs no change. The choice is a pure function of the source and
// the options (the seed included), never of threads or of which part asks, so every
// part of a split conversion computes the same one.
//
// Steps, in this order:
//   1. --select: classes=a,b (class names, or label numbers), keys-from=FILE (one key per
//      line; keys the source lacks are counted, not an error), or fraction=F (0 < F <= 1:
//      exactly round(F * n) samples, at least 1, the first positions of a permutation of
//      the source seeded by `seed`).
//   2. --dedup: among the samples step 1 kept, a sample whose image field holds the same
//      bytes as an earlier one's (source order) is dropped. Hashes (XXH3-128) find
//      candidates; equal hashes are confirmed by comparing the bytes. A sample without
//      an image field is never a duplicate.
// Both need random access (kUnsupported, naming the source, without it); both read
// every sample once before the first is written (the whole source, in a part too). A
// conversion in one process and in source order runs step 2 in its own read instead
// (Deduplicator, convert.cc's Narrow()).
//
// Threading: SelectSamples reads with `threads` threads and returns when done; the
// wrapped dataset is as thread-safe as the source (Get() from many threads at once).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::pipeline {

struct SelectSpec {
  enum class Kind { kAll, kClasses, kKeys, kFraction };
  Kind kind = Kind::kAll;
  std::vector<std::string> classes;  // kClasses
  std::string keys_file;             // kKeys
  double fraction = 1;               // kFraction
};

// "classes=a,b", "keys-from=FILE", "fraction=F"; "" selects all. kInvalidArgument
// naming the text otherwise.
Result<SelectSpec> ParseSelect(std::string_view text);

struct SelectReport {
  uint64_t source_samples = 0;
  uint64_t selected = 0;            // after step 1
  uint64_t kept = 0;                // after step 2
  uint64_t keys_listed = 0;         // keys-from: distinct keys in the file
  uint64_t keys_not_found = 0;      // keys-from: listed keys the source lacks
  // --dedup: (dropped key, the earlier key whose image bytes it repeats), source order.
  std::vector<std::pair<std::string, std::string>> duplicates;
};

// XXH3-128 of a sample's image bytes: what --dedup compares first.
struct ImageHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const ImageHash& o) const { return lo == o.lo && hi == o.hi; }
};

// The --dedup rule, given the samples in source order: Repeats() says whether a sample's
// image bytes repeat an earlier one's. Equal hashes are confirmed by comparing the bytes,
// both samples read again from `ra` (a collision keeps the sample). SelectSamples' pass
// before the write and a conversion's own read (one pass, convert.cc) both use it, so
// they drop the same samples.
// Threading: Hash() from any thread; Repeats() from one thread, in source order.
class Deduplicator {
 public:
  explicit Deduplicator(std::shared_ptr<const RandomAccess> ra);
  ~Deduplicator();
  // The hash of s's image field; nullopt when it has none (never a duplicate).
  static std::optional<ImageHash> Hash(const Sample& s);
  // Sample `index` of `ra` with `key` and image hash `h`: true when it repeats an earlier
  // one, then listed in duplicates() as (key, the earlier one's key).
  Result<bool> Repeats(uint64_t index, const std::string& key, const std::optional<ImageHash>& h);
  std::vector<std::pair<std::string, std::string>>& duplicates() { return dups_; }

 private:
  struct Table;
  std::shared_ptr<const RandomAccess> ra_;
  std::unique_ptr<Table> first_;  // hash -> the first index with it
  std::vector<std::pair<std::string, std::string>> dups_;
};

// The chosen samples of `src` (which the result keeps alive). `seed` is fraction's.
Result<std::unique_ptr<Dataset>> SelectSamples(std::shared_ptr<const Dataset> src, const SelectSpec& spec,
                                               bool dedup, uint64_t seed, int threads, SelectReport* report);

// The duplicates of a whole dataset (verify --duplicates): what --dedup would drop. A
// dataset without random access is read once in order and XXH3-128 equality decides
// (the bytes are not read twice to compare).
Result<std::vector<std::pair<std::string, std::string>>> FindDuplicates(const Dataset& src, int threads);

// Where a list beside a dataset goes (duplicates.json, skipped.json): in the directory
// of a format that writes shards (`output`: only when `address` is a shard pattern), else
// beside it as "<address>.<name>". `output`: `address` names a destination (a shard
// pattern), not a dataset to read (a manifest).
Result<std::string> SidecarPath(std::string_view address, std::string_view name, bool output);

// duplicates.json's text: {"source": ..., "kept": N, "dropped": [{"key": k, "duplicate_of": o}, ...]}.
std::string DuplicatesJson(std::string_view source, const SelectReport& report);

// skipped.json's text (--skip-bad): {"source": ADDRESS, "count": N, "skipped": [{"key":
// KEY, "reason": TEXT}, ...]} in write order. A conversion in one process and the merge
// of its parts write the same bytes.
std::string SkippedJson(std::string_view source, const std::vector<std::pair<std::string, std::string>>& skipped);

// Writes `text` as the list `name` beside the output `dst` (SidecarPath), through the
// destination's file system (`local_fs` for a local one): whole, then renamed.
Result<std::string> WriteSidecar(std::string_view dst, std::string_view name, const std::string& text,
                                 const std::shared_ptr<FileSystem>& local_fs);

}  // namespace shardkit::pipeline
