// pipeline/select.cc: SelectSamples and FindDuplicates (select.h).
#include "pipeline/select.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/paths.h"
#include "formats/registry.h"
#include "io/any_file.h"
#include "io/file.h"
#include "pipeline/plan.h"
#include "shardkit/convert.h"

namespace shardkit::pipeline {

namespace {

std::vector<std::string> SplitComma(std::string_view s) {
  std::vector<std::string> out;
  while (true) {
    const size_t c = s.find(',');
    out.emplace_back(s.substr(0, c));
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  return out;
}

// Runs fn(j) for j in [0, count) on `threads` threads; the error of the lowest j wins,
// so the message does not depend on the threads' timing. Stops at a stop request.
Status ForEach(size_t count, int threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex m;
  size_t err_at = SIZE_MAX;
  Status err;
  auto work = [&] {
    for (size_t j; !failed.load(std::memory_order_relaxed) && (j = next.fetch_add(1)) < count;) {
      Status st = StopRequested() ? Status::Cancelled("stopped while choosing the samples to write") : fn(j);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(m);
        if (j < err_at) {
          err_at = j;
          err = std::move(st);
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && size_t(t) < count; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return err;
}

Status Read(const RandomAccess& ra, uint64_t idx, Sample* s) {
  Status st = ra.Get(idx, s);
  if (!st.ok()) st.At(Location{.index = int64_t(idx)});
  return st;
}

struct ImageHashHasher {
  size_t operator()(const ImageHash& h) const { return size_t(h.lo); }
};

// The chosen samples: source indices, ascending.
class SelectedDataset : public Dataset {
 public:
  SelectedDataset(std::shared_ptr<const Dataset> src, std::shared_ptr<RandomAccess> ra,
                  std::shared_ptr<const std::vector<uint64_t>> idx)
      : src_(std::move(src)), ra_(std::move(ra)), idx_(std::move(idx)), info_(src_->info()) {
    info_.num_samples = idx_->size();
  }
  const DatasetInfo& info() const override { return info_; }

  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    struct Reader : SampleReader {
      std::shared_ptr<RandomAccess> ra;
      std::shared_ptr<const std::vector<uint64_t>> idx;
      size_t pos = 0;
      Result<bool> Next(Sample* out) override {
        if (pos >= idx->size()) return false;
        SK_RETURN_IF_ERROR(Read(*ra, (*idx)[pos], out));
        ++pos;
        return true;
      }
    };
    auto r = std::make_unique<Reader>();
    r->ra = ra_;
    r->idx = idx_;
    return std::unique_ptr<SampleReader>(std::move(r));
  }

  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    struct Access : RandomAccess {
      std::shared_ptr<RandomAccess> ra;
      std::shared_ptr<const std::vector<uint64_t>> idx;
      uint64_t size() const override { return idx->size(); }
      Status Get(uint64_t i, Sample* out) const override {
        if (i >= idx->size()) return Status::Invalid(fmt::format("sample {} of {}", i, idx->size()));
        return ra->Get((*idx)[i], out);
      }
      void Prefetch(const uint64_t* indices, size_t n) const override {
        std::vector<uint64_t> mapped;
        mapped.reserve(n);
        for (size_t k = 0; k < n; ++k)
          if (indices[k] < idx->size()) mapped.push_back((*idx)[indices[k]]);
        ra->Prefetch(mapped.data(), mapped.size());
      }
    };
    auto a = std::make_shared<Access>();
    a->ra = ra_;
    a->idx = idx_;
    return std::shared_ptr<RandomAccess>(std::move(a));
  }

  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    SK_ASSIGN_OR_RETURN(std::vector<uint64_t> all, src_->RecordedChecksums());
    if (all.size() != ra_->size()) return std::vector<uint64_t>{};
    std::vector<uint64_t> out;
    out.reserve(idx_->size());
    for (uint64_t i : *idx_) out.push_back(all[i]);
    return out;
  }

 private:
  std::shared_ptr<const Dataset> src_;
  std::shared_ptr<RandomAccess> ra_;
  std::shared_ptr<const std::vector<uint64_t>> idx_;
  DatasetInfo info_;
};

// Step 1: the source indices the selection keeps, ascending.
Result<std::vector<uint64_t>> Choose(const Dataset& src, const RandomAccess& ra, const SelectSpec& spec,
                                     uint64_t seed, int threads, SelectReport* report) {
  const uint64_t n = ra.size();
  std::vector<uint64_t> sel;
  switch (spec.kind) {
    case SelectSpec::Kind::kAll:
      sel.resize(n);
      for (uint64_t i = 0; i < n; ++i) sel[i] = i;
      return sel;
    case SelectSpec::Kind::kFraction: {
      if (n == 0) return sel;
      const uint64_t k = std::clamp<uint64_t>(uint64_t(std::llround(spec.fraction * double(n))), 1, n);
      const Bijection order(n, seed, Mix64(0x53656c656374ull /* "Select" */));
      std::vector<bool> keep(n);
      for (uint64_t i = 0; i < k; ++i) keep[order(i)] = true;
      sel.reserve(k);
      for (uint64_t i = 0; i < n; ++i)
        if (keep[i]) sel.push_back(i);
      return sel;
    }
    case SelectSpec::Kind::kClasses: {
      const auto& names = src.info().class_names;
      std::set<int64_t> labels;
      for (const auto& c : spec.classes) {
        auto it = std::find(names.begin(), names.end(), c);
        int64_t v = 0;
        auto [p, ec] = std::from_chars(c.data(), c.data() + c.size(), v);
        if (it != names.end()) {
          labels.insert(int64_t(it - names.begin()));
        } else if (ec == std::errc() && p == c.data() + c.size() && v >= 0) {
          labels.insert(v);
        } else {
          std::string known;
          for (size_t i = 0; i < names.size() && i < 10; ++i) known += (i ? ", " : "") + names[i];
          if (names.size() > 10) known += fmt::format(", ... ({} in all)", names.size());
          return Status::Invalid(fmt::format("--select classes: '{}' is neither a class name of the source nor a label "
                                             "number (the source's classes: {})",
                                             c, known.empty() ? "none named" : known),
                                 Location{.file = src.info().address});
        }
      }
      std::vector<char> keep(n);
      SK_RETURN_IF_ERROR(ForEach(n, threads, [&](size_t i) {
        Sample s;
        SK_RETURN_IF_ERROR(Read(ra, i, &s));
        auto l = s.label();
        keep[i] = l && labels.count(*l);
        return Status::OK();
      }));
      for (uint64_t i = 0; i < n; ++i)
        if (keep[i]) sel.push_back(i);
      return sel;
    }
    case SelectSpec::Kind::kKeys: {
      std::ifstream in(spec.keys_file);
      if (!in) return Status::NotFound(fmt::format("--select keys-from: cannot read '{}'", spec.keys_file),
                                       Location{.file = spec.keys_file});
      std::set<std::string> listed;
      for (std::string line; std::getline(in, line);) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
        size_t b = line.find_first_not_of(" \t");
        if (b == std::string::npos) continue;
        listed.insert(line.substr(b));
      }
      if (in.bad()) return Status::IOError(fmt::format("--select keys-from: reading '{}' failed", spec.keys_file),
                                           Location{.file = spec.keys_file});
      if (listed.empty())
        return Status::Invalid(fmt::format("--select keys-from: '{}' lists no keys", spec.keys_file),
                               Location{.file = spec.keys_file});
      std::vector<const std::string*> found(n, nullptr);
      SK_RETURN_IF_ERROR(ForEach(n, threads, [&](size_t i) {
        Sample s;
        SK_RETURN_IF_ERROR(Read(ra, i, &s));
        if (auto it = listed.find(s.key); it != listed.end()) found[i] = &*it;
        return Status::OK();
      }));
      std::set<const std::string*> seen;
      for (uint64_t i = 0; i < n; ++i)
        if (found[i]) {
          sel.push_back(i);
          seen.insert(found[i]);
        }
      report->keys_listed = listed.size();
      report->keys_not_found = listed.size() - seen.size();
      return sel;
    }
  }
  return sel;
}

// Step 2: drops, from `sel`, samples whose image bytes repeat an earlier one's.
Status Dedup(const std::shared_ptr<RandomAccess>& ra, std::vector<uint64_t>* sel, int threads, SelectReport* report) {
  const size_t m = sel->size();
  std::vector<std::optional<ImageHash>> hash(m);
  std::vector<std::string> keys(m);
  SK_RETURN_IF_ERROR(ForEach(m, threads, [&](size_t j) {
    Sample s;
    SK_RETURN_IF_ERROR(Read(*ra, (*sel)[j], &s));
    keys[j] = s.key;
    hash[j] = Deduplicator::Hash(s);
    return Status::OK();
  }));
  Deduplicator dedup(ra);
  std::vector<uint64_t> kept;
  kept.reserve(m);
  for (size_t j = 0; j < m; ++j) {
    SK_ASSIGN_OR_RETURN(bool repeats, dedup.Repeats((*sel)[j], keys[j], hash[j]));
    if (!repeats) kept.push_back((*sel)[j]);
  }
  *sel = std::move(kept);
  report->duplicates = std::move(dedup.duplicates());
  return Status::OK();
}

}  // namespace

struct Deduplicator::Table : std::unordered_map<ImageHash, uint64_t, ImageHashHasher> {};

Deduplicator::Deduplicator(std::shared_ptr<const RandomAccess> ra) : ra_(std::move(ra)), first_(new Table) {}
Deduplicator::~Deduplicator() = default;

std::optional<ImageHash> Deduplicator::Hash(const Sample& s) {
  const Field* f = s.image();
  if (!f) return std::nullopt;
  const XXH128_hash_t h = XXH3_128bits(f->data.data(), f->data.size());
  return ImageHash{h.low64, h.high64};
}

Result<bool> Deduplicator::Repeats(uint64_t index, const std::string& key, const std::optional<ImageHash>& h) {
  if (!h) return false;
  auto [it, fresh] = first_->emplace(*h, index);
  if (fresh) return false;
  // Equal hashes: equal bytes? (A collision keeps the sample.)
  Sample a, b;
  SK_RETURN_IF_ERROR(Read(*ra_, it->second, &a));
  SK_RETURN_IF_ERROR(Read(*ra_, index, &b));
  const Field *fa = a.image(), *fb = b.image();
  if (!fa || !fb || fa->data.view() != fb->data.view()) return false;
  dups_.emplace_back(key, a.key);
  return true;
}

Result<SelectSpec> ParseSelect(std::string_view text) {
  SelectSpec spec;
  if (text.empty()) return spec;
  const size_t eq = text.find('=');
  const std::string_view what = text.substr(0, eq), value = eq == std::string_view::npos ? "" : text.substr(eq + 1);
  auto bad = [&](std::string_view why) {
    return Status::Invalid(fmt::format("--select {}: {} (expected classes=A,B, keys-from=FILE or fraction=F with "
                                       "0 < F <= 1)",
                                       text, why));
  };
  if (eq == std::string_view::npos) return bad("no '='");
  if (what == "classes") {
    spec.kind = SelectSpec::Kind::kClasses;
    spec.classes = SplitComma(value);
    for (const auto& c : spec.classes)
      if (c.empty()) return bad("an empty class name");
  } else if (what == "keys-from") {
    if (value.empty()) return bad("no file named");
    spec.kind = SelectSpec::Kind::kKeys;
    spec.keys_file = std::string(value);
  } else if (what == "fraction") {
    spec.kind = SelectSpec::Kind::kFraction;
    double f = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), f);
    if (ec != std::errc() || p != value.data() + value.size() || !(f > 0 && f <= 1))
      return bad(fmt::format("'{}' is not a fraction in (0, 1]", value));
    spec.fraction = f;
  } else {
    return bad(fmt::format("unknown selection '{}'", what));
  }
  return spec;
}

Result<std::unique_ptr<Dataset>> SelectSamples(std::shared_ptr<const Dataset> src, const SelectSpec& spec,
                                               bool dedup, uint64_t seed, int threads, SelectReport* report) {
  *report = SelectReport{};
  auto ra_r = src->NewRandomAccess();
  if (!ra_r.ok())
    return Status::Unsupported(fmt::format("{} reads every sample of the source by index before writing, which the {} "
                                           "dataset '{}' does not offer ({}); convert it to a format with random "
                                           "access first",
                                           spec.kind != SelectSpec::Kind::kAll ? "--select" : "--dedup",
                                           src->info().format, src->info().address, ra_r.status().message()),
                               Location{.file = src->info().address});
  std::shared_ptr<RandomAccess> ra = std::move(ra_r).value();
  threads = std::max(1, threads);
  report->source_samples = ra->size();
  SK_ASSIGN_OR_RETURN(std::vector<uint64_t> sel, Choose(*src, *ra, spec, seed, threads, report));
  report->selected = sel.size();
  if (dedup) SK_RETURN_IF_ERROR(Dedup(ra, &sel, threads, report));
  report->kept = sel.size();
  auto idx = std::make_shared<const std::vector<uint64_t>>(std::move(sel));
  return std::unique_ptr<Dataset>(std::make_unique<SelectedDataset>(std::move(src), std::move(ra), std::move(idx)));
}

Result<std::vector<std::pair<std::string, std::string>>> FindDuplicates(const Dataset& src, int threads) {
  auto ra_r = src.NewRandomAccess();
  std::vector<uint64_t> sel;
  SelectReport report;
  if (ra_r.ok()) {
    std::shared_ptr<RandomAccess> ra = std::move(ra_r).value();
    sel.resize(ra->size());
    for (uint64_t i = 0; i < sel.size(); ++i) sel[i] = i;
    SK_RETURN_IF_ERROR(Dedup(ra, &sel, std::max(1, threads), &report));
    return std::move(report.duplicates);
  }
  // A source read in order: hashes only (no second read to compare bytes), XXH3-128.
  SK_ASSIGN_OR_RETURN(std::unique_ptr<SampleReader> r, src.NewReader());
  std::unordered_map<ImageHash, std::string, ImageHashHasher> first;
  Sample s;
  for (uint64_t i = 0;; ++i) {
    auto more = r->Next(&s);
    if (!more.ok()) {
      Status st = std::move(more).take_status();
      st.At(Location{.index = int64_t(i)});
      return st;
    }
    if (!*more) break;
    const std::optional<ImageHash> h = Deduplicator::Hash(s);
    if (!h) continue;
    auto [it, fresh] = first.emplace(*h, s.key);
    if (!fresh) report.duplicates.emplace_back(s.key, it->second);
  }
  return std::move(report.duplicates);
}

Result<std::string> SidecarPath(std::string_view address, std::string_view name, bool output) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* fmt, formats::Resolve(address, output, &path));
  if (fmt->writes_shards && (!output || paths::CheckShardPattern(path).ok()))
    return io::DirName(path) + "/" + std::string(name);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path + "." + std::string(name);
}

std::string DuplicatesJson(std::string_view source, const SelectReport& report) {
  nlohmann::json j;
  j["source"] = std::string(source);
  j["source_samples"] = report.source_samples;
  j["kept"] = report.kept;
  nlohmann::json dropped = nlohmann::json::array();
  for (const auto& [k, o] : report.duplicates) dropped.push_back({{"key", k}, {"duplicate_of", o}});
  j["dropped"] = std::move(dropped);
  return j.dump(1) + "\n";
}

std::string SkippedJson(std::string_view source, const std::vector<std::pair<std::string, std::string>>& skipped) {
  nlohmann::ordered_json j;
  j["source"] = std::string(source);
  j["count"] = skipped.size();
  j["skipped"] = nlohmann::ordered_json::array();
  for (const auto& [key, why] : skipped) j["skipped"].push_back({{"key", key}, {"reason", why}});
  return j.dump(2) + "\n";
}

Result<std::string> WriteSidecar(std::string_view dst, std::string_view name, const std::string& text,
                                 const std::shared_ptr<FileSystem>& local_fs) {
  SK_ASSIGN_OR_RETURN(std::string path, SidecarPath(dst, name, /*output=*/true));
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, io::FileSystemOf(path, local_fs));
  SK_ASSIGN_OR_RETURN(auto file, io::AtomicFile::Create(path, /*overwrite=*/true, fs));
  SK_RETURN_IF_ERROR(file->Write(text));
  SK_RETURN_IF_ERROR(file->Commit());
  return path;
}

}  // namespace shardkit::pipeline
