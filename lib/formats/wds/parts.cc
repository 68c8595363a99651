// A wds write split into parts: records, the finished check, merge (parts.h).
#include "formats/wds/parts.h"


#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "core/cores.h"
#include "io/any_file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "formats/wds/index.h"
#include "formats/wds/manifest.h"
#include "formats/wds/names.h"
#include "io/shard_cache.h"
#include "shardkit/filesystem.h"

namespace shardkit::formats::wds {

using json = nlohmann::json;

namespace {

constexpr std::string_view kManifestSuffix = ".manifest.json";

// out/train-%06d.tar -> "out/train" (the manifest's path without its suffix).
std::string RecordStem(const std::string& pattern) {
  std::string m = ManifestPathFor(pattern);
  return m.substr(0, m.size() - kManifestSuffix.size());
}

json ParsePlan(const std::string& plan) {
  if (plan.empty()) return json::object();
  return json::parse(plan);
}

// The first member in which two plans differ, in words; empty when equal.
std::string PlanDifference(const json& a, const json& b, const std::string& a_name, const std::string& b_name) {
  std::set<std::string> keys;
  for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
  for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
  for (const auto& k : keys) {
    std::string va = a.contains(k) ? a[k].dump() : "(absent)";
    std::string vb = b.contains(k) ? b[k].dump() : "(absent)";
    if (va != vb) return fmt::format("{} is {} in {} but {} in {}", k, va, a_name, vb, b_name);
  }
  return "";
}

struct Record {
  std::string path;
  uint64_t index = 0, count = 0, first_shard = 0, total_shards = 0, total_samples = 0, samples = 0;
  bool write_index = true;
  std::string pattern;
  json plan;
  bool same_plan = false;  // merge: equal to part 0's (and `plan` dropped to save memory)
  std::vector<std::string> class_names, fields;
  std::string channel_order;      // of decoded arrays, as the writer was told ("" unknown)
  std::string transform;          // WriteOptions::transform ("" none)
  std::vector<ShardInfo> shards;  // paths joined to the record's directory
  std::vector<std::pair<std::string, std::string>> skipped;  // left out of the plan (key, reason)
};

// The file system of a pattern's outputs: the local one, or a remote store's
// (s3://, http(s)://: the parts uploaded their shards and records there).
Result<std::shared_ptr<FileSystem>> OutputFs(const std::string& pattern) {
  if (!io::IsUrl(pattern)) return FileSystem::Local();
  return FileSystemFor(pattern);
}

Result<Record> ReadRecord(const std::string& path, FileSystem& fs) {
  SK_ASSIGN_OR_RETURN(std::string text, io::IsUrl(path) ? fs.ReadFile(path) : io::ReadFile(path));
  Record r;
  r.path = path;
  const std::string dir = io::DirName(path);
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "wds-part" || j.value("version", 0) != 1)
      return Status::Corrupt("not a shardkit wds part record", Location{.file = path});
    r.index = json_count::Get(j.at("part"), "part");
    r.count = json_count::Get(j.at("parts"), "parts");
    r.first_shard = json_count::Get(j.at("first_shard"), "first_shard");
    r.total_shards = json_count::Get(j.at("total_shards"), "total_shards");
    r.total_samples = json_count::Get(j.at("total_samples"), "total_samples");
    r.samples = json_count::Get(j.at("num_samples"), "num_samples");
    r.write_index = j.at("write_index").get<bool>();
    r.pattern = j.at("pattern").get<std::string>();
    r.plan = j.at("plan");
    r.class_names = j.at("class_names").get<std::vector<std::string>>();
    r.fields = j.at("fields").get<std::vector<std::string>>();
    r.channel_order = j.value("channel_order", std::string());
    if (j.contains("transform")) r.transform = j["transform"].dump();
    for (const auto& s : j.at("shards")) {
      ShardInfo si;
      si.path = JoinDir(dir, s.at("path").get<std::string>());
      si.samples = json_count::Get(s.at("samples"), "samples");
      si.bytes = json_count::Get(s.at("bytes"), "bytes");
      si.checksum = s.at("checksum").get<std::string>();
      r.shards.push_back(std::move(si));
    }
    if (j.contains("skipped"))
      for (const auto& s : j.at("skipped")) r.skipped.emplace_back(s.at("key").get<std::string>(), s.at("reason").get<std::string>());
  } catch (const std::exception& e) {
    return Status::Corrupt(fmt::format("unreadable part record: {}", e.what()), Location{.file = path});
  }
  return r;
}

// The objects of a remote output directory by address: their sizes (one listing
// instead of three HEAD requests per shard).
using Listing = std::map<std::string, uint64_t>;

// The whole-file checksum of a remote object, read in 16 MiB ranges.
Result<uint64_t> HashRemote(FileSystem& fs, const std::string& path) {
  SK_ASSIGN_OR_RETURN(auto f, fs.OpenForRead(path));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::string buf(size_t(std::min<uint64_t>(16 << 20, std::max<uint64_t>(f->size(), 1))), '\0');
  for (uint64_t off = 0; off < f->size();) {
    auto n = f->ReadAt(off, buf.size(), buf.data());
    if (!n.ok() || *n == 0) {
      XXH3_freeState(st);
      if (!n.ok()) return n.status();
      return Status::IOError("the object ended early", Location{.file = path, .offset = int64_t(off)});
    }
    XXH3_64bits_update(st, buf.data(), *n);
    off += *n;
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// Every shard present with its recorded size, its index (when written) and its
// checksum file; with `hash`, its whole-file checksum too. Local files by stat(2);
// remote ones from `listing` (the output directory's objects) when given.
Status CheckShards(const std::vector<ShardInfo>& shards, uint64_t first, bool write_index, bool hash,
                   const std::string& listed_in, FileSystem* remote = nullptr, const Listing* listing = nullptr) {
  auto exists = [&](const std::string& p) {
    if (!remote) return io::Exists(p);
    return listing ? listing->count(p) > 0 : remote->Exists(p);
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardInfo& s = shards[i];
    Location at{.file = s.path, .shard = int64_t(first + i)};
    std::optional<uint64_t> size;
    if (remote && listing) {
      if (auto it = listing->find(s.path); it != listing->end()) size = it->second;
    } else {
      SK_ASSIGN_OR_RETURN(FileInfo fi, remote ? remote->Stat(s.path) : io::StatAny(s.path));
      if (fi.type == FileType::kFile) size = fi.size;
    }
    if (!size) return Status::NotFound(fmt::format("a shard that '{}' lists is missing", listed_in), at);
    if (*size != s.bytes)
      return Status::Corrupt(fmt::format("shard has {} bytes, '{}' records {}: it was changed or damaged after "
                                         "it was written; rerun its part with --overwrite",
                                         *size, listed_in, s.bytes),
                             at);
    if (write_index && !exists(IdxPathFor(s.path)))
      return Status::NotFound("the shard's DALI index is missing", Location{.file = IdxPathFor(s.path), .shard = at.shard});
    if (!exists(SumsPath(s.path)))
      return Status::NotFound("the shard's checksum file is missing", Location{.file = SumsPath(s.path), .shard = at.shard});
    if (hash) {
      SK_ASSIGN_OR_RETURN(uint64_t h, remote ? HashRemote(*remote, s.path) : paths::HashFile(s.path));
      if (paths::ChecksumString(h) != s.checksum)
        return Status::Corrupt(fmt::format("shard checksum {} differs from the {} that '{}' records: the shard was "
                                           "damaged after it was written; rerun its part with --overwrite",
                                           paths::ChecksumString(h), s.checksum, listed_in),
                               at);
    }
  }
  return Status::OK();
}

}  // namespace

std::string PartRecordPath(const std::string& pattern, uint64_t index, uint64_t count) {
  return fmt::format("{}.part-{:05d}-of-{:05d}.json", RecordStem(pattern), index, count);
}

std::vector<std::string> PartFiles(const std::string& pattern, const std::vector<std::string>& names) {
  const std::string stem(paths::BaseName(RecordStem(pattern)));
  const std::string prefix = stem + ".part-";
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (!n.starts_with(prefix)) continue;
    std::string_view rest = std::string_view(n).substr(prefix.size());
    for (std::string_view end : {".partial", ".lock"})
      if (rest.ends_with(end)) rest.remove_suffix(end.size());
    // NNNNN-of-NNNNN.json
    if (rest.size() > 5 && rest.ends_with(".json") && rest.find("-of-") != std::string_view::npos) out.push_back(n);
  }
  return out;
}

std::string PartRecordText(const std::string& pattern, const WriteOptions& opts,
                           const std::vector<std::string>& fields, const std::vector<ShardInfo>& shards,
                           uint64_t samples, const std::vector<std::pair<std::string, std::string>>& left_out,
                           uint64_t* total_bytes) {
  json j;
  j["format"] = "wds-part";
  j["version"] = 1;
  j["pattern"] = BaseOf(pattern);
  j["part"] = opts.part.index;
  j["parts"] = opts.part.count;
  j["first_shard"] = opts.part.first_shard;
  j["total_shards"] = opts.part.total_shards;
  j["total_samples"] = opts.part.total_samples;
  j["num_samples"] = samples;
  j["write_index"] = opts.write_index;
  j["plan"] = ParsePlan(opts.part.plan);
  j["class_names"] = opts.class_names;
  j["fields"] = fields;
  if (!opts.array_channels.empty()) j["channel_order"] = opts.array_channels;
  if (!opts.transform.empty()) j["transform"] = json::parse(opts.transform);
  uint64_t total = 0;
  json list = json::array();
  for (const auto& s : shards) {
    list.push_back(json{{"path", BaseOf(s.path)}, {"samples", s.samples}, {"bytes", s.bytes}, {"checksum", s.checksum}});
    total += s.bytes;
  }
  j["shards"] = std::move(list);
  if (!left_out.empty()) {  // absent when none, as in records from before --skip-bad went with --part
    json skipped = json::array();
    for (const auto& [key, why] : left_out) skipped.push_back(json{{"key", key}, {"reason", why}});
    j["skipped"] = std::move(skipped);
  }
  *total_bytes = total;
  return j.dump(1) + "\n";
}

Result<std::optional<WriteSummary>> FinishedOutput(const std::string& pattern, const WriteOptions& opts) {
  const bool part = opts.part.count > 0;
  const std::string done = part ? PartRecordPath(pattern, opts.part.index, opts.part.count) : ManifestPathFor(pattern);
  // A remote output (the staging directory had nothing to resume): the uploaded
  // record or manifest, and the objects it lists. Journals are never uploaded.
  const bool remote = io::IsUrl(pattern);
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, OutputFs(pattern));
  FileSystem* remote_fs = remote ? fs.get() : nullptr;
  if (remote ? !fs->Exists(done) : !io::Exists(done) || io::Exists(done + ".partial"))
    return std::optional<WriteSummary>();
  WriteSummary sum;
  if (part) {
    SK_ASSIGN_OR_RETURN(Record r, ReadRecord(done, *fs));
    json want;
    try {
      want = ParsePlan(opts.part.plan);
    } catch (const std::exception& e) {
      return Status::Internal(fmt::format("bad part plan: {}", e.what()));
    }
    std::string diff = PlanDifference(r.plan, want, "the finished part", "this command");
    if (!diff.empty())
      return Status::Invalid(fmt::format("part {}/{} already finished with another plan ({}); run the same command "
                                         "as the other parts, or start over with --overwrite",
                                         opts.part.index, opts.part.count, diff),
                             Location{.file = done});
    if (r.first_shard != opts.part.first_shard || r.pattern != BaseOf(pattern))
      return Status::Invalid("the finished part record names other shards than this command would write; start over "
                             "with --overwrite",
                             Location{.file = done});
    SK_RETURN_IF_ERROR(CheckShards(r.shards, r.first_shard, r.write_index, false, done, remote_fs));
    sum.samples = r.samples;
    sum.shards = std::move(r.shards);
  } else {
    std::string unreadable;
    SK_ASSIGN_OR_RETURN(Manifest m, ReadManifest(done, &unreadable));
    if (!unreadable.empty())
      return Status::Corrupt(fmt::format("the manifest is unreadable ({}); start over with --overwrite", unreadable),
                             Location{.file = done});
    for (size_t i = 0; i < m.shards.size(); ++i)
      if (BaseOf(m.shards[i].path) != BaseOf(paths::FormatShardPattern(pattern, i)))
        return Status::Invalid(fmt::format("the manifest lists '{}' as shard {}, which this command would name '{}'; "
                                           "start over with --overwrite",
                                           BaseOf(m.shards[i].path), i, BaseOf(paths::FormatShardPattern(pattern, i))),
                               Location{.file = done});
    SK_RETURN_IF_ERROR(CheckShards(m.shards, 0, opts.write_index, false, done, remote_fs));
    sum.samples = m.num_samples;
    sum.shards = std::move(m.shards);
  }
  for (auto& s : sum.shards) {
    sum.bytes += s.bytes;
    s.address.clear();
  }
  return std::optional<WriteSummary>(std::move(sum));
}

Result<MergeSummary> MergeParts(const std::string& pattern, const MergeOptions& opts) {
  SK_RETURN_IF_ERROR(paths::CheckShardPattern(pattern));
  const std::string manifest = ManifestPathFor(pattern);
  const std::string stem = BaseOf(RecordStem(pattern)) + ".part-";
  const std::string dir = io::DirName(manifest);
  // The records beside the pattern, by split (N) and part.
  std::map<uint64_t, std::map<uint64_t, std::string>> found;
  std::set<std::string> journals;
  // A remote output (s3://): the parts uploaded their shards and records there; one
  // listing of the directory gives the records and every object's size.
  const bool remote = io::IsUrl(pattern);
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, OutputFs(pattern));
  Listing listing;
  std::vector<std::string> names;
  if (remote) {
    auto entries = fs->ListDir(dir);
    if (!entries.ok())
      return Status(entries.status().code(),
                    fmt::format("cannot list the part records beside '{}': {}{}", pattern, entries.status().message(),
                                entries.status().code() == Code::kUnsupported
                                    ? " (merge of a remote output needs a store that lists objects: s3://)"
                                    : ""),
                    Location{.file = dir});
    for (const FileInfo& e : *entries) {
      if (e.type != FileType::kFile) continue;
      names.push_back(e.name);
      listing[JoinDir(dir, e.name)] = e.size;
    }
  } else {
    if (!io::IsDir(dir))
      return Status::NotFound(fmt::format("no part records beside '{}': the directory does not exist; run the parts "
                                          "first (convert or shard with --part I/N)",
                                          pattern),
                              Location{.file = dir});
    SK_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, io::ListAny(dir));
    for (const FileInfo& e : entries) names.push_back(e.name);
  }
  const bool manifest_exists = remote ? listing.count(manifest) > 0 : io::Exists(manifest);
  for (const std::string& name : names) {
    if (name.rfind(stem, 0) != 0) continue;
    unsigned long long i = 0, n = 0;
    char tail[16] = {0};
    int got = std::sscanf(name.c_str() + stem.size(), "%llu-of-%llu%15s", &i, &n, tail);
    if (got != 3) continue;
    if (std::string(tail) == ".json")
      found[n][i] = JoinDir(dir, name);
    else if (std::string(tail) == ".json.partial")
      journals.insert(JoinDir(dir, name.substr(0, name.size() - 8)));
  }
  if (found.empty())
    return Status::NotFound(fmt::format("no part records ('{}*.json') beside '{}': run the parts first (convert or "
                                        "shard with --part I/N){}",
                                        stem, pattern,
                                        manifest_exists ? "; the manifest exists: a single-process write "
                                                               "needs no merge"
                                                             : ""),
                            Location{.file = dir});
  if (found.size() > 1) {
    std::string splits;
    for (const auto& [n, recs] : found)
      splits += fmt::format("{}N={} ({} record(s), e.g. '{}')", splits.empty() ? "" : ", ", n, recs.size(),
                            recs.begin()->second);
    return Status::Invalid(fmt::format("part records of different splits are here: {}; remove the records of the "
                                       "stale run (and rerun the parts of the one you want)",
                                       splits),
                           Location{.file = dir});
  }
  const uint64_t count = found.begin()->first;
  const auto& records = found.begin()->second;
  std::string missing;
  uint64_t nmissing = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (records.count(i)) continue;
    if (++nmissing <= 8) {
      std::string rec = PartRecordPath(pattern, i, count);
      missing += fmt::format("{}part {}/{} ({})", missing.empty() ? "" : ", ", i, count,
                             journals.count(rec) ? "interrupted: rerun it with --resume" : "never ran or never finished");
    }
  }
  for (const auto& [i, path] : records)
    if (i >= count)
      return Status::Invalid(fmt::format("part record {} of {} is out of range", i, count), Location{.file = path});
  if (nmissing > 0)
    return Status::Invalid(fmt::format("{} of {} parts have not finished: {}{}; no manifest written", nmissing, count,
                                       missing, nmissing > 8 ? ", ..." : ""),
                           Location{.file = dir});
  MergeSummary out;
  std::vector<std::pair<std::string, std::string>> skipped;  // left out by the parts, in part order
  out.destination = pattern;
  out.parts = count;
  out.metadata = manifest;
  std::vector<ShardInfo> shards;
  std::set<std::string> fields;
  Record first;
  // Read the records and check their shards' files in parallel (100,000 parts: I/O and
  // parsing dominate); the checks across parts then run in part order.
  std::vector<std::pair<uint64_t, std::string>> list(records.begin(), records.end());
  std::vector<Result<Record>> read(list.size(), Status::Internal("unread"));
  json ref_plan;  // part 0's: the others' equal plans are dropped as they are read
  if (auto r0 = ReadRecord(list[0].second, *fs); r0.ok()) ref_plan = r0->plan;
  {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next.fetch_add(1)) < list.size();) {
        auto r = ReadRecord(list[k].second, *fs);
        if (r.ok()) {
          Status st = CheckShards(r->shards, r->first_shard, r->write_index, opts.checksums, list[k].second,
                                  remote ? fs.get() : nullptr, remote ? &listing : nullptr);
          if (!st.ok()) {
            r = std::move(st);
          } else if (k > 0 && r->plan == ref_plan) {
            r->same_plan = true;
            r->plan = json();
          }
        }
        read[k] = std::move(r);
      }
    };
    const size_t threads = std::min<size_t>(list.size(), size_t(std::max(1, core::UsableCores())) * 2);
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  }
  for (size_t k = 0; k < list.size(); ++k) {
    const uint64_t i = list[k].first;
    const std::string& path = list[k].second;
    if (!read[k].ok()) return read[k].status();
    Record r = std::move(read[k]).value();
    if (r.index != i || r.count != count)
      return Status::Corrupt(fmt::format("the record says it is part {}/{}", r.index, r.count), Location{.file = path});
    if (i == 0) {
      if (r.pattern != BaseOf(pattern))
        return Status::Invalid(fmt::format("the parts wrote the pattern '{}', not '{}'", r.pattern, BaseOf(pattern)),
                               Location{.file = path});
    } else {
      std::string diff = r.same_plan || first.plan == r.plan ? std::string()
                                              : PlanDifference(first.plan, r.plan, fmt::format("part 0/{}", count),
                                                               fmt::format("part {}/{}", i, count));
      if (diff.empty() && (r.pattern != first.pattern || r.write_index != first.write_index ||
                           r.class_names != first.class_names || r.channel_order != first.channel_order ||
                           r.transform != first.transform ||
                           r.total_shards != first.total_shards ||
                           r.total_samples != first.total_samples))
        diff = fmt::format("pattern, index writing, class names, channel order or totals differ between part 0/{} and part {}/{}",
                           count, i, count);
      if (!diff.empty())
        return Status::Invalid(fmt::format("the parts were not run with the same flags and source: {}; rerun the odd "
                                           "part(s) with the same command (--overwrite)",
                                           diff),
                               Location{.file = path});
    }
    if (r.first_shard != shards.size())
      return Status::Invalid(
          fmt::format("part {}/{} starts at shard {}, but the parts before it end at shard {}: {}", i, count,
                      r.first_shard, shards.size(),
                      r.first_shard > shards.size() ? "shards are missing" : "shards are written twice"),
          Location{.file = path});
    uint64_t part_samples = 0;
    for (size_t k = 0; k < r.shards.size(); ++k) {
      std::string want = BaseOf(paths::FormatShardPattern(pattern, r.first_shard + k));
      if (BaseOf(r.shards[k].path) != want)
        return Status::Corrupt(fmt::format("shard {} is recorded as '{}', expected '{}'", r.first_shard + k,
                                           BaseOf(r.shards[k].path), want),
                               Location{.file = path});
      part_samples += r.shards[k].samples;
    }
    if (part_samples != r.samples)
      return Status::Corrupt(fmt::format("the record's shards hold {} samples, it says {}", part_samples, r.samples),
                             Location{.file = path});
    fields.insert(r.fields.begin(), r.fields.end());
    for (auto& s : r.shards) shards.push_back(std::move(s));
    out.samples += r.samples;
    for (auto& k : r.skipped) skipped.push_back(std::move(k));
    if (i == 0) {
      r.shards.clear();
      first = std::move(r);
    }
  }
  if (shards.size() != first.total_shards || out.samples + skipped.size() != first.total_samples)
    return Status::Invalid(fmt::format("the parts hold {} shards and {} samples{}; the plan has {} and {}",
                                       shards.size(), out.samples,
                                       skipped.empty() ? "" : fmt::format(" and left out {}", skipped.size()),
                                       first.total_shards, first.total_samples),
                           Location{.file = dir});
  // convert --skip-bad (the transform record says so): the list, for skipped.json.
  if (!first.transform.empty() && json::parse(first.transform).value("skip_bad", false)) {
    out.skipped = std::move(skipped);
    out.source = first.plan.value("source", std::string());
  }
  std::string text = ManifestText(pattern, out.samples, first.class_names,
                                  std::vector<std::string>(fields.begin(), fields.end()), shards, first.write_index,
                                  &out.bytes, first.channel_order, first.transform);
  out.shards = shards.size();
  if (manifest_exists) {
    auto old = remote ? fs->ReadFile(manifest) : io::ReadFile(manifest);
    if (old.ok() && *old == text) {
      out.unchanged = true;
      return out;
    }
  }
  if (remote) {
    // One object, written whole (a PUT; multipart above 16 MiB, completed at Close):
    // a reader sees the manifest complete or not at all, and only after every check.
    const std::shared_ptr<FileSystem>& wfs = opts.filesystem ? opts.filesystem : fs;
    SK_ASSIGN_OR_RETURN(auto w, wfs->NewWritableFile(manifest, CreateMode::kTruncate));
    SK_RETURN_IF_ERROR(w->Append(text));
    SK_RETURN_IF_ERROR(w->Close());
    return out;
  }
  SK_RETURN_IF_ERROR(io::WriteFileAtomic(manifest, text, true, opts.filesystem));
  return out;
}

}  // namespace shardkit::formats::wds
