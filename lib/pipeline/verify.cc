// Verify(): read a whole dataset through its format's strict reader and report
// every problem found as a Finding (see include/shardkit/verify.h).
//
// A dataset is checked as a list of units: one per shard where the format
// lists its shards (Format::list_shards: tar shards, each opened on its own, so
// that a missing or damaged shard does not stop the others), else the whole
// dataset. For each unit: open, file
// checksums, a sequential read (falling back to random access past a damaged
// record), recorded per-sample checksums, counts. Across units: duplicate keys,
// fields missing from some samples, --against and --decode.
#include "shardkit/verify.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/cores.h"
#include "io/any_file.h"
#include "io/file.h"
#include "core/pickle.h"
#include "decode/jpeg.h"
#include "decode/transform.h"
#include "formats/channel_order.h"
#include "core/paths.h"
#include "formats/registry.h"
#include "io/shard_cache.h"
#include "pipeline/select.h"


namespace shardkit {

const char* FindingKindName(FindingKind k) {
  switch (k) {
    case FindingKind::kStructure: return "structure";
    case FindingKind::kCount: return "count";
    case FindingKind::kShardChecksum: return "shard-checksum";
    case FindingKind::kSampleChecksum: return "sample-checksum";
    case FindingKind::kDuplicateKey: return "duplicate-key";
    case FindingKind::kMissingShard: return "missing-shard";
    case FindingKind::kEmptyShard: return "empty-shard";
    case FindingKind::kMissingField: return "missing-field";
    case FindingKind::kMissing: return "missing";
    case FindingKind::kExtra: return "extra";
    case FindingKind::kDifferent: return "different";
    case FindingKind::kDecodeError: return "decode-error";
    case FindingKind::kDecodeWarning: return "decode-warning";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

// The one field name that every image field (jpg, jpeg, png, ...) counts as when
// verify compares the fields of samples (no extension has a space).
constexpr std::string_view kAnyImage = "an image";

// One thing opened and read on its own.
struct Unit {
  std::string path;     // the file (tar shard) or the dataset's path
  std::string address;  // what Open() gets
  int64_t shard = -1;   // shard index for wds, -1 for single-unit formats
  std::optional<uint64_t> expect_samples;  // from a manifest
  std::optional<uint64_t> expect_bytes;
  std::string checksum;  // from a manifest
};

// What the source (--against) holds for one key.
struct SourceEntry {
  uint64_t index = 0;
  uint64_t checksum = 0;
  std::vector<std::pair<std::string, uint64_t>> fields;  // ext, XXH3 of the bytes
  bool seen = false;
  // A dataset written with a transform: the size its image must have (the resize rule
  // applied to the upright source image); -1: no image, 0: the source's does not decode.
  int want_w = -1, want_h = -1;
  std::string image_error;  // why the source's image does not decode
  bool array = false;       // the source's image is a decoded array ("npy", written as an image)
};

std::string Plural(uint64_t n, const char* word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

class Verifier {
 public:
  Verifier(std::string_view address, const VerifyOptions& opts) : address_(address), opts_(opts) {
    start_ = Clock::now();
    rep_.address = std::string(address);
  }

  Result<VerifyReport> Run() {
    SK_ASSIGN_OR_RETURN(rep_.format, DetectFormat(address_));
    if (!opts_.against.empty()) {
      SK_RETURN_IF_ERROR(ReadTransform());
      SK_RETURN_IF_ERROR(LoadSource());
    }
    SK_RETURN_IF_ERROR(MakeUnits());
    for (size_t u = 0; u < units_.size(); ++u) CheckUnit(u);
    FlushDecodes();
    if (!fatal_.ok()) return fatal_;
    ReportArrays();
    Progress(true);
    if (shards_without_sums_)
      rep_.notes.push_back(fmt::format("{} of {} {} no per-sample checksums (the first: '{}')",
                                       shards_without_sums_, Plural(units_.size(), "shard"),
                                       shards_without_sums_ == 1 ? "records" : "record", first_without_sums_));
    if (empty_by_skip_bad_)
      rep_.notes.push_back(fmt::format("{} of {} empty: --skip-bad left out every sample the shard plan gave {} "
                                       "(not findings)",
                                       empty_by_skip_bad_, Plural(units_.size(), "shard"),
                                       empty_by_skip_bad_ == 1 ? "it" : "them"));
    CheckFields();
    if (!opts_.against.empty()) ReportMissing();
    rep_.seconds = Elapsed();
    return std::move(rep_);
  }

 private:
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void Add(FindingKind kind, Location where, std::string message) {
    ++rep_.counts[static_cast<int>(kind)];
    if (opts_.max_findings == 0 || rep_.findings.size() < opts_.max_findings)
      rep_.findings.push_back(Finding{kind, std::move(where), std::move(message)});
  }

  void Progress(bool final) {
    if (!opts_.progress) return;
    if (!final && (phase_samples_ % 1000) != 0) return;
    VerifyProgress p;
    p.phase = phase_;
    p.samples = phase_samples_;
    p.bytes = phase_bytes_;
    p.total = phase_total_;
    p.elapsed = Elapsed();
    opts_.progress(p);
  }

  // ---- the source (--against)

  // The transform the dataset's metadata records (DatasetInfo::extra["transform"],
  // WriteOptions::transform): image bytes then differ from the source's by design, and
  // Compare() checks the image's size under the resize rule instead.
  Status ReadTransform() {
    auto ds = Open(address_, opts_.open);
    if (!ds.ok()) return Status::OK();  // MakeUnits() reports it
    const auto& extra = (*ds)->info().extra;
    auto it = extra.find("transform");
    if (it == extra.end()) return Status::OK();
    std::string resize, select;
    bool encoded = false;
    try {
      auto j = nlohmann::json::parse(it->second);
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      resize = j.value("resize", std::string());
      encoded = j.contains("encode");
      select = j.value("select", std::string());
      select_seed_ = j.value("seed", uint64_t(0));
      dedup_ = j.value("dedup", false);
      skip_bad_ = j.value("skip_bad", false);
    } catch (const std::exception& e) {
      return Status::Corrupt(fmt::format("the dataset's transform record does not parse: {}", e.what()),
                             Location{.file = address_});
    }
    if (!select.empty() || dedup_) {
      auto spec = pipeline::ParseSelect(select);
      if (!spec.ok())
        return Status::Corrupt(fmt::format("the dataset's transform record: {}", spec.status().message()),
                               Location{.file = address_});
      select_ = *spec;
      select_text_ = select;
    }
    if (!encoded) return Status::OK();
    decode::ResizeRule rule;
    if (!resize.empty()) {
      auto r = decode::ParseResize(resize);
      if (!r.ok())
        return Status::Corrupt(fmt::format("the dataset's transform record: {}", r.status().message()),
                               Location{.file = address_});
      rule = *r;
    }
    transform_ = rule;
    NoteOnce(fmt::format("the dataset records a transform ({}): images compared by their size under the resize "
                         "rule, not their bytes",
                         it->second));
    return Status::OK();
  }

  // The dataset's transform record says --skip-bad: a shard whose planned samples were
  // all left out is empty by design (formats/leave_out.h). Read once, when a shard
  // the manifest records as empty is met.
  bool SkipBadRecorded() {
    if (!skip_bad_known_) {
      skip_bad_known_ = true;
      if (auto ds = Open(address_, opts_.open); ds.ok()) {
        auto it = (*ds)->info().extra.find("transform");
        if (it != (*ds)->info().extra.end()) {
          auto j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
          if (j.is_object() && j.value("skip_bad", false)) skip_bad_ = true;
        }
      }
    }
    return skip_bad_;
  }

  // The keys --skip-bad left out, from the list beside the dataset (skipped.json in a
  // shard pattern's directory, else DATASET.skipped.json); false when it cannot be read.
  bool ReadSkippedList(std::set<std::string>* keys, std::string* where) {
    auto path = pipeline::SidecarPath(address_, "skipped.json", /*output=*/false);
    if (!path.ok()) return false;
    *where = *path;
    auto fs = io::FileSystemOf(*where, opts_.open.filesystem);
    if (!fs.ok()) return false;
    auto text = (*fs)->ReadFile(*where);
    if (!text.ok()) return false;
    try {
      auto j = nlohmann::json::parse(*text);
      for (const auto& e : j.at("skipped")) keys->insert(e.at("key").get<std::string>());
    } catch (const std::exception&) {
      return false;
    }
    return true;
  }

  // The source image's size after the transform's resize rule (SourceEntry::want_w/_h).
  void ExpectImage(const Sample& s, SourceEntry* e) {
    const Field* img = s.image();
    int w = 0, h = 0;
    Status st;
    if (img) {
      st = decode::UprightImageSize(img->data.data(), img->data.size(), decode::Limits{}, &w, &h);
    } else if ((img = s.find("npy"))) {  // a decoded array: its shape (decode/transform.h)
      e->array = true;
      auto a = decode::ParseNpyImage(img->data);
      if (a.ok()) w = a->width, h = a->height;
      else st = std::move(a).take_status();
    } else {
      return;
    }
    if (!st.ok()) {
      e->want_w = e->want_h = 0;
      e->image_error = st.message();
      return;
    }
    decode::ResizedSize(*transform_, w, h, &e->want_w, &e->want_h);
  }

  // Compare() of a sample of a transformed dataset: the label and the other fields by
  // their bytes, the image by its size.
  void CompareTransformed(const Sample& s, SourceEntry& e, const Location& at) {
    std::vector<std::string> why;
    for (const auto& [ext, h] : e.fields) {
      if (IsImageExt(ext) || (e.array && ext == "npy")) continue;
      const Field* f = s.find(ext);
      if (!f) why.push_back(fmt::format("field '{}' missing", ext));
      else if (paths::Hash(f->data.data(), f->data.size()) != h)
        why.push_back(ext == "cls" ? fmt::format("label differs (here '{}')", f->data.str())
                                   : fmt::format("field '{}' bytes differ ({} bytes here)", ext, f->data.size()));
    }
    for (const auto& f : s.fields) {
      if (IsImageExt(f.ext)) continue;
      bool in_src = std::any_of(e.fields.begin(), e.fields.end(), [&](const auto& p) { return p.first == f.ext; });
      if (!in_src) why.push_back(fmt::format("field '{}' not in the source", f.ext));
    }
    const Field* img = s.image();
    if (e.want_w < 0 && img) why.push_back(fmt::format("image '{}' not in the source", img->ext));
    if (e.want_w >= 0 && !img) why.push_back("image missing");
    if (e.want_w == 0 && img) why.push_back(fmt::format("the source's image does not decode ({})", e.image_error));
    if (e.want_w > 0 && img) {
      int w = 0, h = 0;
      Status st = decode::UprightImageSize(img->data.data(), img->data.size(), decode::Limits{}, &w, &h);
      if (!st.ok())
        why.push_back(fmt::format("image '{}' does not decode: {}", img->ext, st.message()));
      else if (w != e.want_w || h != e.want_h)
        why.push_back(fmt::format("image is {}x{}, the resize rule gives {}x{} for the source's", w, h, e.want_w,
                                  e.want_h));
    }
    if (why.empty()) return;
    std::string msg = fmt::format("differs from source sample {}: ", e.index);
    for (size_t i = 0; i < why.size(); ++i) msg += (i ? "; " : "") + why[i];
    Add(FindingKind::kDifferent, at, std::move(msg));
  }

  Status LoadSource() {
    auto src = Open(opts_.against, opts_.against_open);
    if (!src.ok()) {
      Status s = std::move(src).take_status();
      return Status(s.code(), "--against source: " + s.message(), s.where());
    }
    source_classes_ = (*src)->info().class_names;
    if (select_) {
      // The dataset was written from a choice of the source's samples: choose alike.
      pipeline::SelectReport chosen;
      const int threads = opts_.threads > 0 ? opts_.threads : std::max(1, core::UsableCores());
      auto narrowed = pipeline::SelectSamples(std::shared_ptr<const Dataset>(std::move(*src)), *select_, dedup_,
                                              select_seed_, threads, &chosen);
      if (!narrowed.ok()) {
        Status s = std::move(narrowed).take_status();
        return Status(s.code(), "--against source: " + s.message(), s.where());
      }
      src = std::move(narrowed);
      NoteOnce(fmt::format("the dataset records a choice of samples ({}{}): compared with the source's {} of {} "
                           "samples chosen alike (source indices count the chosen ones)",
                           select_text_.empty() ? "" : "select " + select_text_,
                           dedup_ ? (select_text_.empty() ? "dedup" : ", dedup") : "", chosen.kept,
                           chosen.source_samples));
    }
    phase_ = "source";
    phase_total_ = (*src)->info().num_samples;
    SK_ASSIGN_OR_RETURN(auto reader, (*src)->NewReader());
    Sample s;
    uint64_t i = 0;
    for (;;) {
      auto more = reader->Next(&s);
      if (!more.ok()) {
        Status st = std::move(more).take_status();
        return Status(st.code(), "--against source: " + st.message(), st.where());
      }
      if (!*more) break;
      SourceEntry e;
      e.index = i;
      e.checksum = s.checksum();
      for (const auto& f : s.fields) e.fields.emplace_back(f.ext, paths::Hash(f.data.data(), f.data.size()));
      if (transform_) ExpectImage(s, &e);
      auto [it, fresh] = source_.try_emplace(s.key, std::move(e));
      if (!fresh) ++source_dups_;
      ++i;
      ++phase_samples_;
      phase_bytes_ += s.bytes();
      Progress(false);
    }
    Progress(true);
    rep_.source_samples = i;
    if (source_dups_)
      rep_.notes.push_back(fmt::format("the source holds {} (compared with their first occurrence)",
                                       Plural(source_dups_, "duplicate key")));
    phase_ = "verify";
    phase_samples_ = phase_bytes_ = 0;
    phase_total_.reset();
    return Status::OK();
  }

  // ---- what to read

  // A format that lists its shards (Format::list_shards) is checked shard by
  // shard, each opened on its own; any other dataset is one unit.
  Status MakeUnits() {
    std::string path;
    SK_ASSIGN_OR_RETURN(format_, formats::Resolve(address_, false, &path));
    if (!format_->list_shards) {
      Unit u;
      u.path = path;
      u.address = std::string(address_);
      units_.push_back(std::move(u));
      return Status::OK();
    }
    SK_ASSIGN_OR_RETURN(formats::ShardListing list, format_->list_shards(path, opts_.open));
    manifest_ = list.metadata;
    listed_order_ = list.channel_order;
    if (!list.unreadable.empty()) {
      // The manifest is the metadata: without it nothing else can be checked.
      Add(FindingKind::kStructure, Location{.file = list.metadata.empty() ? path : list.metadata},
          fmt::format("unreadable manifest: {}", list.unreadable));
      return Status::OK();
    }
    manifest_samples_ = list.num_samples;
    if (!list.metadata.empty()) classes_ = std::move(list.class_names);
    uint64_t sum = 0;
    for (auto& sh : list.shards) {
      Unit u;
      u.path = std::move(sh.path);
      u.address = std::move(sh.address);
      u.shard = int64_t(units_.size());
      u.expect_samples = sh.samples;
      u.expect_bytes = sh.bytes;
      u.checksum = std::move(sh.checksum);
      sum += sh.samples.value_or(0);
      units_.push_back(std::move(u));
    }
    if (manifest_samples_ && sum != *manifest_samples_)
      Add(FindingKind::kCount, Location{.file = path},
          fmt::format("the manifest says {} samples but its shards add up to {}", *manifest_samples_, sum));
    return Status::OK();
  }

  // ---- one unit

  static bool IsChecksumError(const Status& s) {
    return s.detail() == Detail::kSampleChecksum;
  }

  void AddStatus(const Status& s, const Location& at) {
    Status st = s;
    // A shard verified alone is shard 0 of its own dataset: name it by its place in the whole.
    if (at.shard >= 0) st.where().shard = at.shard;
    st.At(at);
    Add(IsChecksumError(st)                            ? FindingKind::kSampleChecksum
        : st.detail() == Detail::kShardChecksum ? FindingKind::kShardChecksum
                                                : FindingKind::kStructure,
        st.where(),
        fmt::format("{}: {}", CodeName(st.code()), st.message()));
  }

  void CheckFileChecksum(const std::string& file, int64_t shard, const std::string& recorded,
                         std::optional<uint64_t> bytes) {
    Location at{.file = file, .shard = shard};
    if (bytes) {  // (a remote shard's size too: docs/remote.md)
      auto size = io::AnySize(file);
      if (size.ok() && *size != *bytes) {
        Add(FindingKind::kShardChecksum, at, fmt::format("file has {} bytes but the metadata records {}", *size, *bytes));
        return;
      }
    }
    if (recorded.empty()) return;
    rep_.shard_checksums = true;
    auto h = io::IsUrl(file) ? io::HashAnyFile(file) : paths::HashFile(file);
    if (!h.ok()) {
      AddStatus(h.status(), at);
      return;
    }
    std::string got = paths::ChecksumString(*h);
    if (got != recorded)
      Add(FindingKind::kShardChecksum, at, fmt::format("file checksum is {} but the metadata records {}", got, recorded));
  }

  void CheckUnit(size_t ui) {
    const Unit& u = units_[ui];
    Location at{.file = u.path, .shard = u.shard};
    ++rep_.shards;
    if (u.shard >= 0 && !io::Exists(u.path)) {
      Add(FindingKind::kMissingShard, at,
          manifest_.empty() ? "shard named by the address does not exist"
                            : fmt::format("shard listed in the manifest '{}' does not exist", manifest_));
      if (u.expect_samples) first_index_ += *u.expect_samples;
      return;
    }
    if (u.shard >= 0) CheckFileChecksum(u.path, u.shard, u.checksum, u.expect_bytes);

    uint64_t structure_before = rep_.count(FindingKind::kStructure);
    auto opened = Open(u.address, opts_.open);
    if (!opened.ok()) {
      Code c = opened.status().code();
      if (u.shard < 0 && (c == Code::kNotFound || c == Code::kInvalidArgument)) {
        fatal_ = opened.status();
        return;
      }
      AddStatus(opened.status(), at);
      if (u.expect_samples) first_index_ += *u.expect_samples;
      return;
    }
    const Dataset& ds = **opened;
    const DatasetInfo& info = ds.info();
    NoteOrder(info);
    if (units_.size() == 1 && u.shard < 0) classes_ = info.class_names;
    if (u.shard < 0)
      for (const auto& sh : info.shards) CheckFileChecksum(sh.path, -1, sh.checksum, std::nullopt);

    if (!info.shard_checksums_where.empty()) {
      // The format's reader checks them (Detail::kShardChecksum on a mismatch).
      rep_.shard_checksums = true;
      NoteOnce("shard checksums: " + info.shard_checksums_where);
    }
    std::vector<uint64_t> sums;
    auto rs = ds.RecordedChecksums();
    if (!rs.ok()) AddStatus(rs.status(), at);
    else sums = std::move(rs).value();
    if (sums.empty() && info.sample_checksums == SampleChecksums::kInRecords) {
      // The format keeps each checksum with its record and its reader checks
      // it: a mismatch comes back from Next() as a kCorrupt status with Detail::kSampleChecksum.
      rep_.sample_checksums = true;
      NoteOnce("per-sample checksums: " + info.sample_checksums_where);
    } else if (sums.empty()) {
      if (info.sample_checksums == SampleChecksums::kNoMetadata)
        NoteOnce("no recorded checksums: an image folder carries no metadata; checked structure and keys only");
      else
      if (u.shard >= 0) {
        // (A shard the manifest records as empty has no sample to record one for.)
        if (u.expect_samples != 0 && shards_without_sums_++ == 0) first_without_sums_ = u.path;
      } else {
        NoteOnce("the dataset records no per-sample checksums");
      }
    } else {
      rep_.sample_checksums = true;
    }
    if (!phase_total_ && units_.size() == 1) phase_total_ = info.num_samples;
    if (!phase_total_ && manifest_samples_) phase_total_ = manifest_samples_;

    uint64_t read = 0;
    auto reader = ds.NewReader();
    if (!reader.ok()) {
      AddStatus(reader.status(), at);
      return;
    }
    Sample s;
    for (;;) {
      auto more = (*reader)->Next(&s);
      if (!more.ok()) {
        AddStatus(more.status(), Location{.file = u.path, .shard = u.shard, .index = int64_t(first_index_ + read)});
        // Past a damaged record: go on by index where the format can.
        auto ra = ds.NewRandomAccess();
        if (ra.ok() && (*ra)->size() > read) {
          uint64_t n = (*ra)->size();
          ++read;  // the damaged one
          for (; read < n; ++read) {
            Status g = (*ra)->Get(read, &s);
            if (!g.ok()) {
              AddStatus(g, Location{.file = u.path, .shard = u.shard, .index = int64_t(first_index_ + read)});
              continue;
            }
            Process(ui, read, s, sums);
          }
        } else if (!ra.ok() || (*ra)->size() <= read) {
          NoteOnce(fmt::format("reading of '{}' stopped at the damage (no random access past it)", u.path));
        }
        break;
      }
      if (!*more) break;
      Process(ui, read, s, sums);
      ++read;
    }

    if (read == 0 && rep_.count(FindingKind::kStructure) == structure_before) {
      if (u.expect_samples == 0 && SkipBadRecorded())
        ++empty_by_skip_bad_;
      else
        Add(FindingKind::kEmptyShard, at, "holds no samples");
    }
    if (u.expect_samples && read != *u.expect_samples)
      Add(FindingKind::kCount, at,
          fmt::format("{} read but the manifest records {}", Plural(read, "sample"), *u.expect_samples));
    if (u.shard < 0 && info.num_samples && read != *info.num_samples)
      Add(FindingKind::kCount, at,
          fmt::format("{} read but the metadata records {}", Plural(read, "sample"), *info.num_samples));
    if (!sums.empty() && sums.size() != read)
      Add(FindingKind::kCount, at,
          fmt::format("{} recorded for {} read", Plural(sums.size(), "per-sample checksum"), read));
    // Dataset order follows the metadata where it has one: the samples of a
    // missing shard keep their places.
    FlushDecodes();
    first_index_ += u.expect_samples ? std::max(read, *u.expect_samples) : read;
    extents_.reset();
  }

  // A shard's sample: the byte offset where it starts (Format::locate_samples:
  // one scan of the shard, made at the first finding that needs it).
  Location WithOffset(size_t ui, uint64_t local, Location at) {
    const Unit& u = units_[ui];
    if (u.shard < 0 || !format_->locate_samples) return at;
    if (!extents_) {
      auto m = format_->locate_samples(u.path, u.shard);
      extents_ = m.ok() ? std::move(m).value() : std::vector<formats::SampleExtent>{};
    }
    if (local < extents_->size() && (*extents_)[local].key == at.key) at.offset = int64_t((*extents_)[local].offset);
    return at;
  }

  void NoteOnce(std::string note) {
    if (std::find(rep_.notes.begin(), rep_.notes.end(), note) == rep_.notes.end()) rep_.notes.push_back(std::move(note));
  }

  // ---- one sample

  void Process(size_t ui, uint64_t local, const Sample& s, const std::vector<uint64_t>& sums) {
    const Unit& u = units_[ui];
    uint64_t gi = first_index_ + local;
    Location at{.file = u.path, .shard = u.shard, .key = s.key, .index = int64_t(gi)};
    ++rep_.samples;
    rep_.bytes += s.bytes();
    ++phase_samples_;
    phase_bytes_ += s.bytes();

    uint64_t sum = s.checksum();
    if (local < sums.size() && sums[local] != sum)
      Add(FindingKind::kSampleChecksum, WithOffset(ui, local, at),
          fmt::format("sample checksum is {} but the writer recorded {}", paths::ChecksumString(sum),
                      paths::ChecksumString(sums[local])));

    // Duplicate keys.
    auto [it, fresh] = keys_.try_emplace(s.key, KeyPlace{uint32_t(ui), gi});
    if (!fresh) {
      const Unit& first = units_[it->second.unit];
      Add(FindingKind::kDuplicateKey, at,
          first.shard >= 0 && it->second.unit != ui
              ? fmt::format("key also at sample {} in shard {} ('{}')", it->second.index, first.shard, first.path)
              : fmt::format("key also at sample {}{}", it->second.index,
                            first.shard >= 0 ? " of the same shard" : ""));
    }

    // Field sets, for fields missing from some samples. Image fields of any type
    // (.jpg beside .jpeg, .JPEG, .png in one class folder) count as one field: every
    // reader takes whichever image a sample has.
    std::vector<std::string> exts;
    exts.reserve(s.fields.size());
    for (const auto& f : s.fields) exts.push_back(IsImageExt(f.ext) ? std::string(kAnyImage) : f.ext);
    std::sort(exts.begin(), exts.end());
    exts.erase(std::unique(exts.begin(), exts.end()), exts.end());
    auto [sit, snew] = set_ids_.try_emplace(exts, uint32_t(sets_.size()));
    if (snew) sets_.push_back(exts);
    sample_set_.push_back(sit->second);
    sample_key_.push_back(&it->first);
    sample_unit_.push_back(uint32_t(ui));
    sample_index_.push_back(gi);
    for (const auto& e : exts) ++field_counts_[e];

    if (!opts_.against.empty()) Compare(s, sum, at);
    if (opts_.decode) DecodeImages(s, at);
    Progress(false);
  }

  void Compare(const Sample& s, uint64_t sum, const Location& at) {
    auto it = source_.find(s.key);
    if (it == source_.end()) {
      Add(FindingKind::kExtra, at, "key is not in the source");
      return;
    }
    SourceEntry& e = it->second;
    if (e.seen) return;  // a duplicate key here; reported as such
    e.seen = true;
    if (transform_) return CompareTransformed(s, e, at);
    if (e.checksum == sum) return;
    std::vector<std::string> why;
    std::string src_label, label;
    for (const auto& [ext, h] : e.fields) {
      const Field* f = s.find(ext);
      if (!f) {
        why.push_back(fmt::format("field '{}' missing", ext));
        continue;
      }
      if (paths::Hash(f->data.data(), f->data.size()) != h)
        why.push_back(ext == "cls" ? fmt::format("label differs (here '{}')", f->data.str())
                                   : fmt::format("field '{}' bytes differ ({} bytes here)", ext, f->data.size()));
    }
    for (const auto& f : s.fields) {
      bool in_src = std::any_of(e.fields.begin(), e.fields.end(), [&](const auto& p) { return p.first == f.ext; });
      if (!in_src) why.push_back(fmt::format("field '{}' not in the source", f.ext));
    }
    if (why.empty()) why.push_back("checksum differs");
    std::string msg = fmt::format("differs from source sample {}: ", e.index);
    for (size_t i = 0; i < why.size(); ++i) msg += (i ? "; " : "") + why[i];
    Add(FindingKind::kDifferent, at, std::move(msg));
  }

  // Images are decoded in batches by a few threads, each with its own decoder;
  // findings are added in sample order.
  struct DecodeJob {
    Location at;
    std::string ext;
    Bytes data;
    Status status;
    uint64_t warnings = 0;
    bool colour = false;  // a decoded array with colour channels
  };

  void DecodeImages(const Sample& s, const Location& at) {
    for (const auto& f : s.fields)
      if (IsImageExt(f.ext) || f.ext == "npy") jobs_.push_back(DecodeJob{at, f.ext, f.data, Status::OK(), 0});
    if (jobs_.size() >= 256 * Threads()) FlushDecodes();
  }

  // A decoded array ("npy"): a .npy that parses (header, dtype, and as many bytes as
  // its shape needs). Arrays of other dtypes and shapes are data too (features,
  // masks): only uint8 H x W x 3|4 ones have a channel order.
  static Status CheckArray(DecodeJob* j) {
    auto a = pickle::ParseNpy(j->data);
    if (!a.ok()) return a.status();
    j->colour = a->dtype.kind == 'u' && a->dtype.itemsize == 1 && pickle::HasColorChannels(*a);
    return Status::OK();
  }

  // The channel order of decoded arrays, as the first unit opened says it (a shard
  // opened alone takes the order its manifest records).
  void NoteOrder(const DatasetInfo& info) {
    if (order_known_) return;
    order_known_ = true;
    order_ = formats::ArrayOrderOf(info);
    option_ = formats::ChannelOption(info);
    if (auto it = info.extra.find("channel_order"); it != info.extra.end()) order_words_ = it->second;
    if (order_ == formats::ArrayOrder::kUnknown && !listed_order_.empty()) {
      order_ = listed_order_ == "bgr" ? formats::ArrayOrder::kBgr : formats::ArrayOrder::kRgb;
      order_words_ = fmt::format("decoded arrays: {} (as '{}' records; not converted)", listed_order_, manifest_);
    }
  }

  // With --decode: what the arrays' channel order means to their consumers (a note:
  // the data is intact either way).
  void ReportArrays() {
    if (!colour_arrays_) return;
    const std::string n = Plural(colour_arrays_, "decoded array");
    if (order_ == formats::ArrayOrder::kUnknown)
      NoteOnce(fmt::format("{} with colour channels and no recorded channel order: the loader, --encode and HDF5 or "
                           "LMDB outputs refuse them until it is said (--source-option {}=rgb, or {}=bgr-to-rgb)",
                           n, option_, option_));
    else if (order_ == formats::ArrayOrder::kBgr)
      NoteOnce(fmt::format("{} with colour channels, {}: the loader and --encode take RGB and refuse them until "
                           "converted on read (--source-option {}=bgr-to-rgb)",
                           n, order_words_, option_));
    else
      NoteOnce(fmt::format("{} with colour channels, {}", n, order_words_));
  }

  size_t Threads() const {
    if (opts_.threads > 0) return size_t(opts_.threads);
    return size_t(core::UsableCores());
  }

  void FlushDecodes() {
    if (jobs_.empty()) return;
    if (!arena_) {  // the decoding threads: a TBB arena, kept for the run
      const size_t n = Threads();
      if (n + 1 > size_t(tbb::info::default_concurrency()))
        allow_threads_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, n + 1);
      arena_ = std::make_unique<tbb::task_arena>(int(n));
    }
    auto decode_one = [&](DecodeJob& j) {
      if (j.ext == "npy") {
        j.status = CheckArray(&j);
        return;
      }
      decode::ImageDecoder& d = decoders_.local();
      uint64_t before = d.tolerated_warnings();
      decode::Region region;
      j.status = d.Decode(
          j.data.data(), j.data.size(),
          [](const decode::ImageInfo& im) { return decode::CropBox{0, 0, double(im.width), double(im.height)}; },
          0, 0, &region, nullptr);
      j.warnings = d.tolerated_warnings() - before;
    };
    arena_->execute([&] {
      tbb::parallel_for(size_t(0), jobs_.size(), size_t(1), [&](size_t i) { decode_one(jobs_[i]); });
    });
    for (auto& j : jobs_) {
      ++rep_.images_decoded;
      colour_arrays_ += j.colour;
      if (!j.status.ok())
        Add(FindingKind::kDecodeError, std::move(j.at),
            fmt::format("field '{}' does not decode: {}", j.ext, j.status.message()));
      else if (j.warnings)
        Add(FindingKind::kDecodeWarning, std::move(j.at),
            fmt::format("field '{}' decodes only with {}", j.ext, Plural(j.warnings, "warning")));
    }
    jobs_.clear();
  }
  std::vector<DecodeJob> jobs_;
  std::unique_ptr<tbb::global_control> allow_threads_;
  std::unique_ptr<tbb::task_arena> arena_;
  // One per decoding thread, with VerifyOptions::max_pixels.
  tbb::enumerable_thread_specific<decode::ImageDecoder> decoders_{[this] {
    decode::Limits l;
    l.max_pixels = opts_.max_pixels;
    return decode::ImageDecoder(l);
  }};

  // ---- across the dataset

  void CheckFields() {
    if (sets_.size() <= 1) return;
    std::set<std::string> all;
    for (const auto& [ext, n] : field_counts_) all.insert(ext);
    std::vector<std::string> missing_of(sets_.size());
    std::vector<bool> lacks(sets_.size(), false);
    for (size_t i = 0; i < sets_.size(); ++i) {
      std::string m;
      for (const auto& ext : all)
        if (!std::binary_search(sets_[i].begin(), sets_[i].end(), ext))
          m += fmt::format("{}{} (in {} sample{})", m.empty() ? "" : ", ",
                           ext == kAnyImage ? "an image (jpg, png, ...)" : "field '" + ext + "'", field_counts_[ext],
                           field_counts_[ext] == 1 ? "" : "s");
      lacks[i] = !m.empty();
      missing_of[i] = std::move(m);
    }
    for (size_t g = 0; g < sample_set_.size(); ++g) {
      uint32_t id = sample_set_[g];
      if (!lacks[id]) continue;
      const Unit& u = units_[sample_unit_[g]];
      Add(FindingKind::kMissingField,
          Location{.file = u.path, .shard = u.shard, .key = *sample_key_[g], .index = int64_t(sample_index_[g])},
          "sample lacks " + missing_of[id]);
    }
  }

  void ReportMissing() {
    std::vector<std::pair<uint64_t, const std::string*>> missing;
    for (const auto& [key, e] : source_)
      if (!e.seen) missing.emplace_back(e.index, &key);
    std::sort(missing.begin(), missing.end());
    std::set<std::string> skipped;
    std::string skipped_list;
    if (skip_bad_ && !missing.empty()) {
      if (ReadSkippedList(&skipped, &skipped_list)) {
        uint64_t listed = 0;
        for (const auto& [index, key] : missing) listed += skipped.count(*key);
        NoteOnce(fmt::format("{} of the source's samples are left out by --skip-bad as {} lists them (not findings)",
                             listed, skipped_list));
      } else {
        NoteOnce(fmt::format("the dataset records --skip-bad but its list {} cannot be read: every sample it lacks "
                             "is a finding",
                             skipped_list));
      }
    }
    for (const auto& [index, key] : missing) {
      if (skipped.count(*key)) continue;
      Add(FindingKind::kMissing, Location{.key = *key},
          fmt::format("source sample {} ('{}') is not in the dataset", index, opts_.against));
    }
    if (!source_classes_.empty() && !classes_.empty() && source_classes_ != classes_)
      Add(FindingKind::kDifferent, Location{.file = manifest_.empty() ? units_.empty() ? "" : units_[0].path : manifest_},
          fmt::format("class names differ from the source's ({} here, {} there)", classes_.size(),
                      source_classes_.size()));
  }

  struct KeyPlace {
    uint32_t unit;
    uint64_t index;
  };

  std::string address_;
  const VerifyOptions& opts_;
  VerifyReport rep_;
  Clock::time_point start_;
  std::vector<Unit> units_;
  std::string manifest_;
  std::string listed_order_;  // ShardListing::channel_order
  std::optional<uint64_t> manifest_samples_;
  // The channel order of decoded arrays (NoteOrder) and the colour arrays checked.
  bool order_known_ = false;
  formats::ArrayOrder order_ = formats::ArrayOrder::kUnknown;
  std::string order_words_, option_;
  uint64_t colour_arrays_ = 0;
  std::vector<std::string> classes_, source_classes_;
  uint64_t first_index_ = 0;
  Status fatal_;
  uint64_t shards_without_sums_ = 0;
  std::string first_without_sums_;

  const char* phase_ = "verify";
  uint64_t phase_samples_ = 0, phase_bytes_ = 0;
  std::optional<uint64_t> phase_total_;

  std::unordered_map<std::string, KeyPlace> keys_;
  std::map<std::vector<std::string>, uint32_t> set_ids_;
  std::vector<std::vector<std::string>> sets_;
  std::vector<uint32_t> sample_set_;
  std::vector<const std::string*> sample_key_;
  std::vector<uint32_t> sample_unit_;
  std::vector<uint64_t> sample_index_;
  const formats::Format* format_ = nullptr;
  std::optional<std::vector<formats::SampleExtent>> extents_;  // of the shard being read, on demand
  std::map<std::string, uint64_t> field_counts_;

  std::unordered_map<std::string, SourceEntry> source_;
  std::optional<decode::ResizeRule> transform_;  // ReadTransform(): the dataset records a transform
  // ReadTransform(): the record's choice of samples (select, dedup) and --skip-bad.
  std::optional<pipeline::SelectSpec> select_;
  std::string select_text_;
  uint64_t select_seed_ = 0;
  bool dedup_ = false, skip_bad_ = false;
  bool skip_bad_known_ = false;   // SkipBadRecorded() has looked (ReadTransform() sets skip_bad_ too)
  uint64_t empty_by_skip_bad_ = 0;  // shards recorded empty under --skip-bad: not findings
  uint64_t source_dups_ = 0;
};

}  // namespace

Result<VerifyReport> Verify(std::string_view address, const VerifyOptions& opts) {
  Verifier v(address, opts);
  SK_ASSIGN_OR_RETURN(VerifyReport report, v.Run());
  if (opts.duplicates) {
    const auto t0 = std::chrono::steady_clock::now();
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Open(address, opts.open));
    const int threads = opts.threads > 0 ? opts.threads : std::max(1, core::UsableCores());
    SK_ASSIGN_OR_RETURN(report.duplicate_images, pipeline::FindDuplicates(*ds, threads));
    report.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return report;
}

}  // namespace shardkit
