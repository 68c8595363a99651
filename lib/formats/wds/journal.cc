// The wds writer's journal: "<manifest>.partial", what an interrupted write
// committed, and resuming from it (writer.h).
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "io/any_file.h"
#include "core/resume.h"
#include "core/paths.h"
#include "formats/wds/names.h"
#include "formats/wds/writer.h"

namespace shardkit::formats::wds {

using json = nlohmann::json;

// A sample the resumed write had committed: checked against the journal's
// digest of its shard, then dropped.
Status WdsWriter::Skip(const std::string& key, uint64_t sample_sum, const Location& where) {
  // Shards whose planned samples were all left out (LeaveOut) hold none to check.
  while (skip_shard_ < resumed_.size() && resumed_[skip_shard_].samples == 0) ++skip_shard_;
  if (skip_shard_ >= resumed_.size())
    return error_ = Status::Invalid(
               "resume: the interrupted write left this sample out of its committed shards (--skip-bad), but it "
               "reads now: resume needs the same source, in the same order, with the same options; start over "
               "with --overwrite",
               where);
  paths::AddSampleToDigest(digest_, key, sample_sum);
  ++total_samples_;
  ++total_slots_;
  ++skip_in_shard_;
  const Resumed& r = resumed_[skip_shard_];
  if (skip_in_shard_ < r.samples) return Status::OK();
  uint64_t got = XXH3_64bits_digest(digest_);
  XXH3_64bits_reset(digest_);
  if (got != r.digest) {
    error_ = Status::Invalid(
        fmt::format("resume: samples {}..{} differ from the ones the interrupted write put in shard {} (keys or "
                    "bytes changed): resume needs the same source, in the same order, with the same options; "
                    "start over with --overwrite",
                    total_samples_ - r.samples, total_samples_ - 1, skip_shard_),
        Location{.file = summary_.shards[skip_shard_].path, .shard = int64_t(skip_shard_), .key = where.key});
    return error_;
  }
  ++skip_shard_;
  skip_in_shard_ = 0;
  return Status::OK();
}

json WdsWriter::OptionsJson() const {
  json o;
  o["shard_size"] = opts_.shard_size;
  o["samples_per_shard"] = opts_.samples_per_shard;
  o["class_names"] = opts_.class_names;
  o["key_dots"] = opts_.key_dots == KeyDots::kReplace ? "replace" : "error";
  o["write_index"] = opts_.write_index;
  o["shard_plan"] = opts_.shard_plan;
  // The transform and the choice of samples (WriteOptions::transform): a resume with
  // other ones is refused by name. Absent when there is none, as journals before it.
  if (!opts_.transform.empty()) o["transform"] = opts_.transform;
  if (part()) {
    o["part"] = fmt::format("{}/{}", opts_.part.index, opts_.part.count);
    o["first_shard"] = opts_.part.first_shard;
    o["plan"] = opts_.part.plan;
  }
  return o;
}

// "<manifest>.partial": what is committed so far, rewritten atomically after
// every shard. Per shard: file, samples, bytes, file checksum, and a digest of
// its samples (XXH3 over each sample's checksum and key) that a resume checks
// the source against.
Status WdsWriter::WriteJournal() {
  json j;
  j["format"] = "wds-partial";
  j["version"] = 1;
  j["pattern"] = BaseOf(pattern_);
  j["options"] = OptionsJson();
  j["fields"] = std::vector<std::string>(fields_.begin(), fields_.end());
  json shards = json::array();
  for (size_t i = 0; i < summary_.shards.size(); ++i) {
    const auto& s = summary_.shards[i];
    json o;
    o["path"] = BaseOf(s.path);
    o["samples"] = s.samples;
    o["bytes"] = s.bytes;
    o["checksum"] = s.checksum;
    o["digest"] = paths::ChecksumString(resumed_[i].digest);
    if (resumed_[i].idx_sum) o["index_checksum"] = paths::ChecksumString(resumed_[i].idx_sum);
    if (resumed_[i].sums_sum) o["sums_checksum"] = paths::ChecksumString(resumed_[i].sums_sum);
    shards.push_back(std::move(o));
  }
  j["shards"] = std::move(shards);
  owns_journal_ = true;
  return io::WriteFileAtomic(journal_, j.dump(1) + "\n", true, opts_.filesystem);
}

Status WdsWriter::LoadJournal() {
  Location where{.file = journal_};
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(journal_));
  auto bad = [&](const std::string& why) {
    return Status::Corrupt(fmt::format("cannot resume: {}", why), where);
  };
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "wds-partial" || j.value("version", 0) != 1)
      return bad("not a shardkit wds journal");
    if (j.value("pattern", "") != BaseOf(pattern_))
      return bad(fmt::format("it was written for the pattern '{}', not '{}'", j.value("pattern", ""),
                             BaseOf(pattern_)));
    SK_RETURN_IF_ERROR(resume::CheckSameOptions(j["options"], OptionsJson(), where));
    for (const auto& f : j.at("fields")) fields_.insert(f.get<std::string>());
    const json& shards = j.at("shards");
    for (size_t i = 0; i < shards.size(); ++i) {
      const json& o = shards[i];
      std::string path = paths::FormatShardPattern(pattern_, ShardNumber(i));
      if (o.at("path").get<std::string>() != BaseOf(path)) return bad(fmt::format("shard {} is misnamed", i));
      ShardInfo si{path, o.at("samples").get<uint64_t>(), o.at("bytes").get<uint64_t>(),
                   o.at("checksum").get<std::string>()};
      Location at{.file = path, .shard = int64_t(ShardNumber(i))};
      auto size = io::RegularFileSize(path);
      if (!size.ok())
        return Status::Corrupt("cannot resume: a shard the journal lists as complete is missing; start over "
                               "with --overwrite",
                               at);
      if (*size != si.bytes)
        return Status::Corrupt(fmt::format("cannot resume: shard has {} bytes, the journal says {}; start over "
                                           "with --overwrite",
                                           *size, si.bytes),
                               at);
      SK_ASSIGN_OR_RETURN(uint64_t h, paths::HashFile(path));
      if (paths::ChecksumString(h) != si.checksum)
        return Status::Corrupt(fmt::format("cannot resume: shard checksum {} differs from the journal's {}; "
                                           "start over with --overwrite",
                                           paths::ChecksumString(h), si.checksum),
                               at);
      if (opts_.write_index && !io::Exists(IdxPathFor(path)))
        return Status::Corrupt("cannot resume: the shard's index is missing; start over with --overwrite",
                               Location{.file = IdxPathFor(path), .shard = int64_t(i)});
      if (!io::Exists(wds::SumsPath(path)))
        return Status::Corrupt("cannot resume: the shard's checksum file is missing; start over with --overwrite",
                               Location{.file = wds::SumsPath(path), .shard = int64_t(i)});
      // "xxh3:..." fields; 0 for a side file's field a journal from before them lacks.
      auto sum = [&](const char* field, bool required) -> Result<uint64_t> {
        if (!required && !o.contains(field)) return uint64_t{0};
        auto h = paths::ParseChecksumString(o.at(field).get<std::string>());
        if (!h) return bad(fmt::format("bad {}", field));
        return *h;
      };
      SK_ASSIGN_OR_RETURN(uint64_t d, sum("digest", true));
      SK_ASSIGN_OR_RETURN(uint64_t idx_sum, sum("index_checksum", false));
      SK_ASSIGN_OR_RETURN(uint64_t sums_sum, sum("sums_checksum", false));
      // The side files too: a remote output's staged files are not synced (upload_staging.h),
      // so after a machine crash one may be torn although the journal lists it. (An index
      // checksum is there only when the index is written: the options are the same.)
      for (auto [file, want] : {std::pair{IdxPathFor(path), idx_sum}, std::pair{wds::SumsPath(path), sums_sum}}) {
        if (!want) continue;
        SK_ASSIGN_OR_RETURN(uint64_t h, paths::HashFile(file));
        if (h != want)
          return Status::Corrupt(fmt::format("cannot resume: checksum {} differs from the journal's {}; start over "
                                             "with --overwrite",
                                             paths::ChecksumString(h), paths::ChecksumString(want)),
                                 Location{.file = file, .shard = int64_t(ShardNumber(i))});
      }
      resumed_.push_back(Resumed{si.samples, d, idx_sum, sums_sum});
      committed_.push_back(path);
      if (opts_.write_index) committed_.push_back(IdxPathFor(path));
      committed_.push_back(wds::SumsPath(path));
      committed_samples_ += si.samples;
      summary_.shards.push_back(std::move(si));
    }
  } catch (const std::exception& e) {
    return bad(fmt::format("bad journal: {}", e.what()));
  }
  resume_samples_ = committed_samples_;
  resume_slots_ = committed_samples_;
  if (!opts_.shard_plan.empty()) {
    // Under a plan the committed shards took their planned positions, some of them
    // perhaps left out (LeaveOut): a shard holds at most its plan's count, and may be
    // empty.
    if (resumed_.size() > opts_.shard_plan.size())
      return bad(fmt::format("it lists {} shards, the plan has {}", resumed_.size(), opts_.shard_plan.size()));
    resume_slots_ = 0;
    for (size_t i = 0; i < resumed_.size(); ++i) {
      if (resumed_[i].samples > opts_.shard_plan[i])
        return bad(fmt::format("shard {} holds {} samples, its plan {}", i, resumed_[i].samples, opts_.shard_plan[i]));
      resume_slots_ += opts_.shard_plan[i];
    }
    return Status::OK();
  }
  // Without a plan a shard of zero samples cannot exist.
  for (const auto& r : resumed_)
    if (r.samples == 0) return bad("a shard with no samples");
  return Status::OK();
}

// Temporary files a killed writer left for shard `from` and what follows it.
void WdsWriter::RemoveStaleTemps(size_t from) {
  // A part owns only its own shards: the one after them is the next part's.
  if (part() && from >= opts_.shard_plan.size()) return;
  const std::string shard = paths::FormatShardPattern(pattern_, ShardNumber(from));
  std::string dir = io::DirName(shard);
  std::vector<std::string> bases = {BaseOf(shard), BaseOf(journal_), BaseOf(part() ? record_ : manifest_)};
  if (opts_.write_index) bases.push_back(BaseOf(IdxPathFor(shard)));
  bases.push_back(BaseOf(wds::SumsPath(shard)));
  auto& fs = *FileSystem::OrLocal(opts_.filesystem);
  auto entries = fs.ListDir(dir);
  if (!entries.ok()) return;
  for (const FileInfo& e : *entries)
    for (const auto& b : bases)
      if (e.name.rfind("." + b + ".tmp-", 0) == 0) (void)fs.Remove(e.path);
}

}  // namespace shardkit::formats::wds
