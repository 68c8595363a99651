// Writing TFRecord files: each sample one framed tf.train.Example (example.h),
// shards cut by the generic options (WriteOptions::shard_size, samples_per_shard,
// and the shard plan of WriteOptions::shard_plan), optionally GZIP/ZLIB
// compressed; a DALI .idx beside each uncompressed shard (WriteOptions::
// write_index) and a manifest (x.tfrecord.json: shards, counts, checksums, class
// names, the mapping, the channel order of decoded arrays) written last. Shards
// are published as they fill; a writer destroyed without Finish() removes them
// (TFRecord writes are not resumable: WriteOptions::resume starts over).
#include <xxhash.h>
#include <zlib.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "core/paths.h"
#include "formats/leave_out.h"
#include "formats/registry.h"
#include "formats/tfrecord/example.h"
#include "formats/tfrecord/frames.h"
#include "formats/tfrecord/tfrecord.h"
#include "formats/transform_record.h"

namespace shardkit::formats::tfrecord {

namespace {

class TfWriter : public SampleWriter, public LeavesOut {
 public:
  TfWriter(std::string pattern, WriteOptions opts, Mapping m, Compression c, bool sharded)
      : pattern_(std::move(pattern)), opts_(std::move(opts)), mapping_(std::move(m)), compression_(c),
        sharded_(sharded), fs_(FileSystem::OrLocal(opts_.filesystem)), manifest_(ManifestPathFor(pattern_)) {
    hash_ = XXH3_createState();
  }
  ~TfWriter() override {
    AbortShard();
    if (!finished_)
      for (const auto& p : committed_) (void)fs_->Remove(p);
    XXH3_freeState(hash_);
  }

  Status Write(const Sample& s) override {
    SK_RETURN_IF_ERROR(error_);
    if (s.key.empty()) return Status::Invalid("sample with an empty key", Location{.index = int64_t(total_)});
    auto rec = SampleToRecord(mapping_, s);
    if (!rec.ok()) return Keep(std::move(rec).take_status().At(Location{.index = int64_t(total_)}));
    uint64_t frame = kFrameOverhead + rec->size();
    if (file_ && CutBefore(frame)) SK_RETURN_IF_ERROR(Keep(FinishShard()));
    if (!file_) SK_RETURN_IF_ERROR(Keep(StartShard()));
    buf_.clear();
    AppendFrame(&buf_, *rec);
    SK_RETURN_IF_ERROR(Keep(Emit(buf_.data(), buf_.size(), Z_NO_FLUSH)));
    frames_.push_back(Frame{raw_bytes_, rec->size()});
    raw_bytes_ += frame;
    ++shard_samples_;
    ++shard_slots_;
    ++total_;
    if (!arrays_ && s.find("npy")) arrays_ = true;
    return Status::OK();
  }

  // Under a shard plan (formats/leave_out.h): a position of the plan without a sample.
  Status LeaveOut(std::string_view, std::string_view) override {
    SK_RETURN_IF_ERROR(error_);
    if (!sharded_ || opts_.shard_plan.empty()) return Status::Internal("LeaveOut() without a shard plan");
    if (file_ && CutBefore(0)) SK_RETURN_IF_ERROR(Keep(FinishShard()));
    if (!file_) SK_RETURN_IF_ERROR(Keep(StartShard()));  // a shard may end up empty: its number stays the plan's
    ++shard_slots_;
    return Status::OK();
  }

  Result<WriteSummary> Finish() override {
    SK_RETURN_IF_ERROR(error_);
    if (finished_) return Status::Invalid("Finish() called twice");
    if (!file_ && summary_.shards.empty()) SK_RETURN_IF_ERROR(Keep(StartShard()));  // an empty dataset: one empty file
    if (file_) SK_RETURN_IF_ERROR(Keep(FinishShard()));
    nlohmann::json j;
    j["format"] = "tfrecord";
    j["version"] = 1;
    j["preset"] = mapping_.preset;
    if (!mapping_.field_map.empty()) j["field_map"] = mapping_.field_map;
    j["compression"] = CompressionName(compression_);
    j["num_samples"] = total_;
    j["class_names"] = opts_.class_names;
    if (arrays_ && !opts_.array_channels.empty()) j["channel_order"] = opts_.array_channels;
    // The transform applied at conversion (WriteOptions::transform, a JSON object).
    if (!opts_.transform.empty()) {
      auto record = TransformRecord(opts_.transform, Location{.file = manifest_});
      if (!record.ok()) return Keep(record.status());
      j["transform"] = std::move(record).value();
    }
    j["shards"] = nlohmann::json::array();
    std::string dir = io::DirName(manifest_);
    for (const auto& si : summary_.shards) {
      std::string rel = si.path;
      if (rel.compare(0, dir.size() + 1, dir + "/") == 0) rel = rel.substr(dir.size() + 1);
      j["shards"].push_back({{"path", rel}, {"samples", si.samples}, {"bytes", si.bytes}, {"checksum", si.checksum}});
    }
    std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    SK_RETURN_IF_ERROR(Keep(io::WriteFileAtomic(manifest_, text, opts_.overwrite, opts_.filesystem)));
    // Temporary files of killed writes of this output: its shards, their .idx, its manifest.
    const std::string pattern_base(paths::BaseName(pattern_)), manifest_base(paths::BaseName(manifest_));
    const std::string idx_base(paths::BaseName(IdxPathFor(pattern_)));
    io::RemoveDebris(dir, [&](std::string_view name) {
      if (name == manifest_base) return true;
      return sharded_ ? paths::ShardNumberIn(pattern_base, name).has_value()
                      : name == pattern_base || name == idx_base;
    });
    summary_.samples = total_;
    summary_.bytes += text.size();
    finished_ = true;
    return summary_;
  }

 private:
  Status Keep(Status st) {
    if (!st.ok() && error_.ok()) {
      error_ = st;
      AbortShard();
    }
    return st;
  }

  bool CutBefore(uint64_t frame) const {
    if (!sharded_) return false;
    const auto& plan = opts_.shard_plan;
    if (!plan.empty()) return shard_slots_ >= plan[std::min(summary_.shards.size(), plan.size() - 1)];
    if (opts_.samples_per_shard > 0 && shard_samples_ >= opts_.samples_per_shard) return true;
    return shard_samples_ > 0 && raw_bytes_ + frame > opts_.shard_size;
  }

  std::string ShardPath() const {
    return sharded_ ? paths::FormatShardPattern(pattern_, summary_.shards.size()) : pattern_;
  }

  Status StartShard() {
    std::string path = ShardPath();
    SK_ASSIGN_OR_RETURN(file_, io::AtomicFile::Create(path, opts_.overwrite, opts_.filesystem));
    XXH3_64bits_reset(hash_);
    frames_.clear();
    raw_bytes_ = 0;
    shard_samples_ = 0;
    shard_slots_ = 0;
    if (compression_ != Compression::kNone) {
      zs_ = z_stream{};
      int bits = compression_ == Compression::kGzip ? 15 + 16 : 15;
      if (deflateInit2(&zs_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return Status::Internal("zlib: deflateInit2 failed", Location{.file = path});
      z_live_ = true;
    }
    return Status::OK();
  }

  Status Put(const void* p, size_t n) {
    XXH3_64bits_update(hash_, p, n);
    return file_->Write(p, n);
  }

  // Writes bytes of the raw stream (through deflate when compressing).
  Status Emit(const void* p, size_t n, int flush) {
    if (compression_ == Compression::kNone) return Put(p, n);
    if (n > (1u << 30)) {  // zlib counts in 32 bits: feed a huge record in parts
      auto* b = static_cast<const uint8_t*>(p);
      for (size_t at = 0; at < n; at += 1u << 30)
        SK_RETURN_IF_ERROR(Emit(b + at, std::min<size_t>(1u << 30, n - at), at + (1u << 30) >= n ? flush : Z_NO_FLUSH));
      return Status::OK();
    }
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<void*>(p));
    zs_.avail_in = uInt(n);
    uint8_t out[1 << 16];
    for (;;) {
      zs_.next_out = out;
      zs_.avail_out = sizeof out;
      int rc = deflate(&zs_, flush);
      if (rc == Z_STREAM_ERROR) return Status::Internal("zlib: deflate failed", Location{.file = file_->path()});
      size_t have = sizeof out - zs_.avail_out;
      if (have) SK_RETURN_IF_ERROR(Put(out, have));
      if (flush == Z_FINISH ? rc == Z_STREAM_END : (zs_.avail_in == 0 && zs_.avail_out != 0)) break;
    }
    return Status::OK();
  }

  Status FinishShard() {
    if (compression_ != Compression::kNone) {
      SK_RETURN_IF_ERROR(Emit(nullptr, 0, Z_FINISH));
      deflateEnd(&zs_);
      z_live_ = false;
    }
    std::string path = file_->path();
    uint64_t size = file_->size();
    SK_RETURN_IF_ERROR(file_->Commit());
    file_.reset();
    committed_.push_back(path);
    summary_.shards.push_back(
        ShardInfo{path, shard_samples_, size, paths::ChecksumString(XXH3_64bits_digest(hash_)), "tfrecord:" + path});
    summary_.bytes += size;
    if (compression_ == Compression::kNone && opts_.write_index && !frames_.empty()) {
      std::string idx = IdxPathFor(path);
      SK_RETURN_IF_ERROR(io::WriteFileAtomic(idx, DaliIndexText(frames_), opts_.overwrite, opts_.filesystem));
      committed_.push_back(idx);
    }
    return Status::OK();
  }

  void AbortShard() {
    if (z_live_) deflateEnd(&zs_), z_live_ = false;
    if (file_) file_->Abort(), file_.reset();
  }

  std::string pattern_;
  WriteOptions opts_;
  Mapping mapping_;
  Compression compression_;
  bool sharded_;
  std::shared_ptr<FileSystem> fs_;
  std::string manifest_;
  std::unique_ptr<io::AtomicFile> file_;
  XXH3_state_t* hash_ = nullptr;
  z_stream zs_{};
  bool z_live_ = false;
  std::string buf_;
  std::vector<Frame> frames_;  // of the current shard, in the raw stream
  uint64_t raw_bytes_ = 0, shard_samples_ = 0, total_ = 0;
  uint64_t shard_slots_ = 0;  // positions of the plan the current shard used, written or left out
  WriteSummary summary_;
  std::vector<std::string> committed_;
  Status error_;
  bool finished_ = false;
  bool arrays_ = false;  // a sample had a decoded array ("npy"): the manifest records their order
};

bool HasConversion(const std::string& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] == '%') {
      if (i + 1 < p.size() && p[i + 1] == '%') {
        ++i;
        continue;
      }
      return true;
    }
  return false;
}

}  // namespace

Result<std::unique_ptr<SampleWriter>> CreateTfrecord(const std::string& path, const WriteOptions& opts) {
  // tfrecord.field_map: "feature=field,..." (instead of the preset).
  const std::string text = WriteOption(opts, "tfrecord.field_map");
  SK_ASSIGN_OR_RETURN(auto field_map,
                      paths::ParsePairs(text == "none" ? "" : text, "option tfrecord.field_map", "FEATURE=FIELD"));
  Mapping m;
  if (!field_map.empty()) {
    SK_ASSIGN_OR_RETURN(m, FieldMapMapping(field_map));
  } else {
    SK_ASSIGN_OR_RETURN(m, PresetMapping(WriteOption(opts, "tfrecord.preset")));
  }
  const std::string compression = WriteOption(opts, "tfrecord.compression");
  Compression c = compression == "gzip" ? Compression::kGzip
                  : compression == "zlib" ? Compression::kZlib
                                          : Compression::kNone;  // (choices checked by the registry)
  bool sharded = HasConversion(path);
  if (sharded) {
    SK_RETURN_IF_ERROR(paths::CheckShardPattern(path));
  } else if (opts.samples_per_shard > 0 || opts.shard_plan.size() > 1) {
    return Status::Invalid("TFRecord output is one file; give a printf pattern such as out/train-%05d.tfrecord to "
                           "cut shards",
                           Location{.file = path});
  }
  std::string manifest = ManifestPathFor(path);
  const auto& fs = FileSystem::OrLocal(opts.filesystem);
  if (!opts.overwrite)
    for (const std::string& p : {manifest, sharded ? paths::FormatShardPattern(path, 0) : path}) {
      SK_ASSIGN_OR_RETURN(bool present, fs->OutputPresent(p, OutputKind::kFile));
      if (present) return io::OutputExists(p);
    }
  if (fs->IsDir(path)) return Status::Invalid("output is a directory", Location{.file = path});
  std::string dir = io::DirName(path);
  if (!fs->IsDir(dir)) SK_RETURN_IF_ERROR(fs->MakeDirs(dir));
  return std::unique_ptr<SampleWriter>(new TfWriter(path, opts, std::move(m), c, sharded));
}

}  // namespace shardkit::formats::tfrecord
