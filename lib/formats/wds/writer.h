// Internal: the wds writer: pax (restricted) tar through libarchive, one shard
// per printf index of the pattern, reproducible bytes, a DALI .idx and a
// per-sample checksum sidecar per shard (index.h), a JSON manifest beside them
// (manifest.h), and a journal that makes an interrupted write resumable
// (journal.cc). The layout is documented in docs/formats-wds.md.
//
// Thread safety: a writer is used by one thread.
#pragma once

#include <archive.h>
#include <functional>
#include <xxhash.h>

#include <memory>
#include <utility>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/file.h"
#include "formats/leave_out.h"
#include "formats/wds/index.h"
#include "shardkit/dataset.h"

namespace shardkit::formats::wds {

using IdxEntry = wds::IndexMember;

class WdsWriter : public SampleWriter, public LeavesOut {
 public:
  WdsWriter(std::string pattern, WriteOptions opts);
  ~WdsWriter() override;
  static Result<std::unique_ptr<SampleWriter>> Make(const std::string& pattern, const WriteOptions& opts);
  Status Write(const Sample& in) override;
  Result<WriteSummary> Finish() override;
  // Under a shard plan only (formats/leave_out.h).
  Status LeaveOut(std::string_view key, std::string_view reason) override;

  // The sample counts of the shards that a write with `opts` (shard_size and
  // samples_per_shard; no shard_plan) cuts `n` samples into, computed from the
  // samples' keys and field sizes only (`get(i, &s)` gives the i-th sample in write
  // order): the exact bytes libarchive writes for each sample's headers and padded
  // data, with Write()'s cut rule. A part of a split conversion uses it so that its
  // shard boundaries are those of a single-process write, for any number of parts.
  static Result<std::vector<uint64_t>> PlanBySize(const WriteOptions& opts, uint64_t n,
                                                  const std::function<Status(uint64_t, Sample*)>& get,
                                                  int threads);

 private:
  // Makes a failure sticky and removes the unfinished shard's temporary file at
  // once. The committed shards and the journal stay: the resumable state, and the
  // message says how to continue.
  Status Keep(Status s);

  // A sample the resumed write had committed: checked against the journal's
  // digest of its shard, then dropped.
  Status Skip(const std::string& key, uint64_t sample_sum, const Location& where);
  nlohmann::json OptionsJson() const;

  // "<manifest>.partial": what is committed so far, rewritten atomically after
  // every shard. Per shard: file, samples, bytes, file checksum, and a digest of
  // its samples (XXH3 over each sample's checksum and key) that a resume checks
  // the source against.
  Status WriteJournal();
  Status LoadJournal();

  // Temporary files a killed writer left for shard `from` and what follows it.
  void RemoveStaleTemps(size_t from);
  uint64_t ShardBytes() const;
  // Positions of the plan (or samples) the current shard takes.
  uint64_t MaxSlots() const;
  // Global number of the i-th shard this writer writes (a part starts at first_shard).
  size_t ShardNumber(size_t i) const { return size_t(opts_.part.first_shard) + i; }
  bool part() const { return opts_.part.count > 0; }
  Status ArchiveError(const char* what, const std::string& name);
  static la_ssize_t WriteCb(struct archive*, void* self, const void* buf, size_t n);
  Status StartShard();
  void AbortShard();
  Status FinishShard();
  std::string pattern_;
  WriteOptions opts_;
  std::string manifest_;
  std::string record_;  // a part's record (parts.h); empty when not a part
  std::unique_ptr<io::FileLock> lock_;  // a part's lock: one process per part
  struct archive* ar_ = nullptr;
  std::unique_ptr<io::AtomicFile> file_;
  XXH3_state_t* hash_ = nullptr;
  bool discard_ = false;
  Status io_error_;  // the file layer's error behind a libarchive failure
  Status error_;     // sticky: the first failure ends the writer
  uint64_t shard_samples_ = 0, total_samples_ = 0;
  // Positions of the shard plan used, written or left out (LeaveOut): in the current
  // shard, in all; and how many were left out. Without a plan they equal the samples.
  uint64_t shard_slots_ = 0, total_slots_ = 0;
  // The samples left out (key, reason): a part's record lists them.
  std::vector<std::pair<std::string, std::string>> left_out_;
  std::string prev_key_;
  std::vector<IdxEntry> idx_;       // members of the current shard
  std::vector<size_t> idx_lines_;   // end of each sample in idx_
  bool idx_names_ok_ = true;
  std::vector<uint64_t> sums_;      // per-sample checksums of the current shard
  std::set<std::string> fields_;
  WriteSummary summary_;
  std::vector<std::string> committed_;  // files under their final names, removed if never finished
  bool finished_ = false;
  // Resumable writes.
  struct Resumed {
    uint64_t samples = 0;
    uint64_t digest = 0;  // of the shard's samples (paths::AddSampleToDigest)
    // XXH3 of the shard's .idx and .xxh3 files (0: no .idx; an older journal without
    // them): a resume checks them, since a remote output's staged files are not synced.
    uint64_t idx_sum = 0, sums_sum = 0;
  };
  std::string journal_;
  bool keep_state_ = false;             // leave committed shards + journal when destroyed unfinished
  bool owns_journal_ = false;           // this writer wrote the journal (a refused Create leaves it)
  XXH3_state_t* digest_ = nullptr;      // of the current shard's samples
  std::vector<Resumed> resumed_;        // per committed shard
  uint64_t committed_samples_ = 0;
  uint64_t resume_samples_ = 0;         // samples to check and drop before writing
  uint64_t resume_slots_ = 0;           // the positions they take (with left-out ones, under a plan)
  size_t skip_shard_ = 0;
  uint64_t skip_in_shard_ = 0;
};

}  // namespace shardkit::formats::wds
