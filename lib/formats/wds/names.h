// Internal: the wds format's naming rules: file names beside a shard (DALI
// index, manifest), `pipe:` addresses, and how a tar member's name splits into
// a sample key and a field extension, as the WebDataset reader splits it.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "formats/tar/tar.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::formats::wds {

// The part of a path after its last '/'.
std::string BaseOf(const std::string& path);
// dir + "/" + name ("." and "" mean the current directory).
std::string JoinDir(const std::string& dir, const std::string& name);
// DALI's default index name: the archive path up to the first dot of its base
// name (a leading dot does not count), plus ".idx".
std::string IdxPathFor(const std::string& tar_path);
// The manifest of a write pattern: out/train-%06d.tar -> out/train.manifest.json.
std::string ManifestPathFor(const std::string& pattern);
// True when s holds white space (DALI's v1.2 index cannot hold such a name).
bool HasSpace(std::string_view s);

// Streamed shards: `pipe:CMD`, a shard that is the standard output of a shell
// command (as WebDataset's `pipe:` URLs).
constexpr std::string_view kPipe = "pipe:";
inline bool IsPipe(std::string_view path) { return path.substr(0, kPipe.size()) == kPipe; }

enum class NameKind { kField, kSkip };

// Classifies a tar member. Fields: *key and *ext are set. Skipped (counted):
// directories, top-level names starting with "__" (WebDataset metadata) and
// names whose base name starts with '.' (hidden files). Errors: links and
// devices (their bytes are not in the shard), regular files without an
// extension, unsafe keys ("..", absolute).
Result<NameKind> Classify(const tar::Member& m, const std::string& file, int64_t shard, std::string* key,
                          std::string* ext);

// The streamed readers' grouping (piped and ranged shards; a mapped shard is grouped
// by its index): consecutive data members with one key make one sample, classified
// as above; a field twice in one sample is kCorrupt naming the key and the member's
// header offset. Each field's bytes are the scanner's TakeData() (views where it can).
class SampleGrouper {
 public:
  // `fail` turns a failure of the scanner (not of the names) into the reader's error
  // (the piped reader: the command's exit status first); `at_end` runs once, when the
  // archive has ended. Either may be empty.
  SampleGrouper(std::string file, int64_t shard, std::function<Status(Status)> fail = {},
                std::function<void()> at_end = {})
      : file_(std::move(file)), shard_(shard), fail_(std::move(fail)), at_end_(std::move(at_end)) {}
  // The next sample from `scan` (the same scanner on every call) into *out; false at the end.
  Result<bool> Next(tar::Scanner& scan, Sample* out);

 private:
  Result<bool> Pull(tar::Scanner& scan);  // the next data member into pending_*; false at the end
  Status Fail(Status s) { return fail_ ? fail_(std::move(s)) : s; }

  std::string file_;
  int64_t shard_;
  std::function<Status(Status)> fail_;
  std::function<void()> at_end_;
  bool done_ = false;
  bool have_pending_ = false;
  std::string pending_key_, pending_ext_;
  Bytes pending_data_;
  uint64_t pending_header_ = 0;
};

}  // namespace shardkit::formats::wds
