// Writing MXNet RecordIO (recordio.h): one .rec + .idx + .shardkit.json per
// output file; with a printf pattern (out/train-%05d.rec) a new file starts at
// WriteOptions::shard_size bytes or samples_per_shard samples. Each file is
// written under a temporary name and published when complete (.idx and sidecar
// first, the .rec last); a writer destroyed without Finish() removes what it
// published.
#include <unistd.h>

#include <cfloat>
#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "core/paths.h"
#include "formats/recordio/recordio.h"
#include "formats/transform_record.h"
#include "shardkit/version.h"

namespace shardkit::formats::recordio {

namespace {

using json = nlohmann::json;

// A float label from labels.json (a number, or "nan"/"inf"/"-inf").
bool JsonFloat(const json& v, float* out) {
  if (v.is_number()) {
    double d = v.get<double>();
    // Beyond float's range the conversion is undefined: saturate to infinity instead.
    *out = d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : float(d);
    return true;
  }
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "nan") *out = NAN;
    else if (s == "inf") *out = INFINITY;
    else if (s == "-inf") *out = -INFINITY;
    else return false;
    return true;
  }
  return false;
}

// The header id for a key: the key's value when it is a decimal number (im2rec's
// ids come back this way), else the sample's index.
uint64_t IdFor(const std::string& key, uint64_t index) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), v);
  if (!key.empty() && ec == std::errc() && p == key.data() + key.size()) return v;
  return index;
}

class RecWriter : public SampleWriter {
 public:
  RecWriter(std::string path, bool sharded, WriteOptions opts)
      : path_(std::move(path)), sharded_(sharded), opts_(std::move(opts)) {}

  ~RecWriter() override {
    if (!finished_) {
      file_.reset();  // removes the temporary file
      for (const auto& p : committed_) (void)FileSystem::OrLocal(opts_.filesystem)->Remove(p);
    }
  }

  Status Write(const Sample& s) override {
    if (finished_) return Status::Internal("Write() after Finish()");
    if (!error_.ok()) return error_;
    Location where{.key = s.key, .index = int64_t(total_)};
    if (s.key.empty()) return Status::Invalid("sample has an empty key", where);
    ImageRecord ir;
    const Field* payload = nullptr;
    const Field* labels = nullptr;
    bool has_cls = false;
    for (const auto& f : s.fields) {
      if (f.ext == "cls") has_cls = true;
      else if (f.ext == "labels.json") labels = &f;
      else if (payload)
        return Status::Unsupported(fmt::format("sample has two payload fields ('{}' and '{}'); a RecordIO record "
                                               "holds one (besides cls and labels.json)",
                                               payload->ext, f.ext),
                                   where);
      else payload = &f;
    }
    if (!payload)
      return Status::Invalid("sample has no payload field (an image or other bytes besides cls and labels.json)",
                             where);
    if (labels) {
      json j = json::parse(labels->data.view(), nullptr, false);
      float v;
      if (!j.is_discarded() && JsonFloat(j, &v)) {
        ir.label = v;
      } else if (j.is_array() && !j.empty() && j.size() < (1u << 30)) {
        for (const auto& e : j) {
          if (!JsonFloat(e, &v))
            return Status::Invalid(fmt::format("labels.json holds '{}', not a number", e.dump()), where);
          ir.labels.push_back(v);
        }
      } else {
        return Status::Invalid("labels.json is not a number or a non-empty array of numbers", where);
      }
      if (has_cls)
        return Status::Invalid("sample has both cls and labels.json; a RecordIO header holds one of them", where);
    } else if (has_cls) {
      auto l = s.label();
      if (!l) return Status::Invalid("cls is not an integer label", where);
      if (*l > (1 << 24) || *l < -(1 << 24))
        return Status::Invalid(fmt::format("label {} cannot be stored exactly in RecordIO's float32 label "
                                           "(|label| <= 2^24)",
                                           *l),
                               where);
      ir.label = float(*l);
    }
    ir.flag = uint32_t(ir.labels.size());
    ir.id = IdFor(s.key, total_);
    std::string body = ImagePayload(ir, payload->data.view());
    std::string framed;
    SK_RETURN_IF_ERROR(AppendRecord(body, &framed).At(where));

    // What a reader makes of it: its checksum is the one verify compares.
    Sample back;
    back.key = s.key;
    SetLabelFields(ir, &back);
    const bool unlabeled = !labels && !has_cls;
    if (unlabeled) back.erase("cls");  // the header holds 0; the sidecar says there was none
    back.set(payload->ext, payload->data);
    if (back.label() != s.label() || (labels && !back.find("labels.json")))
      return Status::Internal("label does not read back the same", where);

    if (sharded_ && file_ &&
        (shard_samples_ >= (opts_.samples_per_shard ? opts_.samples_per_shard : UINT64_MAX) ||
         (shard_samples_ > 0 && file_->size() + framed.size() > opts_.shard_size)))
      SK_RETURN_IF_ERROR(Keep(FinishShard()));
    if (!file_) SK_RETURN_IF_ERROR(Keep(StartShard()));
    uint64_t offset = file_->size();
    SK_RETURN_IF_ERROR(Keep(file_->Write(framed)));
    idx_ += fmt::format("{}\t{}\n", ir.id, offset);
    keys_.push_back(s.key);
    sums_.push_back(back.checksum());
    std::string sniffed = paths::SniffImageExt(payload->data.data(), payload->data.size());
    if (sniffed != payload->ext) exts_[std::to_string(shard_samples_)] = payload->ext;
    if (unlabeled) unlabeled_.push_back(shard_samples_);
    for (const auto& f : back.fields) fields_.insert(f.ext);
    ++shard_samples_;
    ++total_;
    return Status::OK();
  }

  Result<WriteSummary> Finish() override {
    if (finished_) return Status::Internal("Finish() called twice");
    if (!error_.ok()) return error_;
    if (!file_) SK_RETURN_IF_ERROR(Keep(StartShard()));  // an empty dataset is one empty file
    SK_RETURN_IF_ERROR(Keep(FinishShard()));
    summary_.samples = total_;
    finished_ = true;
    // Temporary files of killed writes of this output: its .rec, .idx and sidecar files.
    const std::string base(paths::BaseName(path_)), idx(paths::BaseName(IdxPathFor(path_))),
        meta(paths::BaseName(MetaPathFor(path_)));
    io::RemoveDebris(io::DirName(path_), [&](std::string_view name) {
      return sharded_ ? paths::ShardNumberIn(base, name).has_value() : name == base || name == idx || name == meta;
    });
    return summary_;
  }

  Status Prepare() {
    std::string first = sharded_ ? paths::FormatShardPattern(path_, 0) : path_;
    if (!opts_.overwrite)
      for (const std::string& p : {first, IdxPathFor(first), MetaPathFor(first)}) {
        SK_ASSIGN_OR_RETURN(bool present, FileSystem::OrLocal(opts_.filesystem)->OutputPresent(p, OutputKind::kFile));
        if (present) return io::OutputExists(p);
      }
    return FileSystem::OrLocal(opts_.filesystem)->MakeDirs(io::DirName(first));
  }

 private:
  Status Keep(Status s) {
    if (!s.ok() && error_.ok()) {
      error_ = s;
      file_.reset();
    }
    return s;
  }

  Status StartShard() {
    std::string p = sharded_ ? paths::FormatShardPattern(path_, summary_.shards.size()) : path_;
    SK_ASSIGN_OR_RETURN(file_, io::AtomicFile::Create(p, opts_.overwrite, opts_.filesystem));
    idx_.clear();
    keys_.clear();
    sums_.clear();
    exts_ = json::object();
    unlabeled_.clear();
    shard_samples_ = 0;
    return Status::OK();
  }

  Status FinishShard() {
    std::string p = file_->path();
    json meta{{"format", "recordio"},
              {"version", 1},
              {"written_by", fmt::format("shardkit {}", Version())},
              {"samples", shard_samples_},
              {"class_names", opts_.class_names},
              {"fields", std::vector<std::string>(fields_.begin(), fields_.end())},
              {"keys", keys_},
              {"checksums", sums_},
              {"exts", exts_},
              {"unlabeled", unlabeled_}};
    if (fields_.count("npy") && !opts_.array_channels.empty()) meta["channel_order"] = opts_.array_channels;
    // The transform applied at conversion (WriteOptions::transform, a JSON object).
    if (!opts_.transform.empty()) {
      SK_ASSIGN_OR_RETURN(meta["transform"], TransformRecord(opts_.transform, Location{.file = MetaPathFor(p)}));
    }
    std::string text = meta.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(IdxPathFor(p), idx_, true, opts_.filesystem));
    committed_.push_back(IdxPathFor(p));
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(MetaPathFor(p), text, true, opts_.filesystem));
    committed_.push_back(MetaPathFor(p));
    uint64_t size = file_->size();
    SK_RETURN_IF_ERROR(file_->Commit());
    file_.reset();
    committed_.push_back(p);
    summary_.shards.push_back(ShardInfo{p, shard_samples_, size, "", "recordio:" + p});
    summary_.bytes += size + idx_.size() + text.size();
    return Status::OK();
  }

  std::string path_;
  bool sharded_;
  WriteOptions opts_;
  std::unique_ptr<io::AtomicFile> file_;
  std::string idx_;
  std::vector<std::string> keys_;
  std::vector<uint64_t> sums_;
  json exts_ = json::object();
  std::vector<uint64_t> unlabeled_;
  std::set<std::string> fields_;
  uint64_t shard_samples_ = 0, total_ = 0;
  WriteSummary summary_;
  std::vector<std::string> committed_;
  Status error_;
  bool finished_ = false;
};

}  // namespace

Result<std::unique_ptr<SampleWriter>> MakeWriter(const std::string& path, const WriteOptions& opts) {
  if (!paths::HasExtension(path, {".rec"}))
    return Status::Invalid(fmt::format("a RecordIO output is named FILE.rec (or a pattern such as "
                                       "out/train-%05d.rec): '{}'",
                                       path),
                           Location{.file = path});
  bool sharded = path.find('%') != std::string::npos;
  if (!sharded && opts.samples_per_shard)
    return Status::Invalid(fmt::format("samples per shard asks for several files, but '{}' names one; give a "
                                       "pattern such as out/train-%05d.rec",
                                       path),
                           Location{.file = path});
  if (sharded) {
    SK_RETURN_IF_ERROR(paths::CheckShardPattern(path).At(Location{.file = path}));
    auto slash = path.rfind('/');
    if (slash != std::string::npos && path.substr(0, slash).find('%') != std::string::npos)
      return Status::Invalid("the %d conversion of a shard pattern must be in the file name, not in a directory",
                             Location{.file = path});
    if (opts.shard_size < 64)
      return Status::Invalid(fmt::format("shard size {} bytes is too small: the least is 64 bytes", opts.shard_size));
  }
  auto w = std::make_unique<RecWriter>(path, sharded, opts);
  SK_RETURN_IF_ERROR(w->Prepare());
  return std::unique_ptr<SampleWriter>(std::move(w));
}

}  // namespace shardkit::formats::recordio
