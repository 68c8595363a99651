#include "formats/channel_order.h"

#include <fmt/format.h>

#include "core/pickle.h"

namespace shardkit::formats {

Result<bool> ApplyChannelOrder(const std::string& recorded, const std::string& where, const std::string& option,
                               const OpenOptions& opts, DatasetInfo* info) {
  std::string said;
  if (auto it = opts.format_options.find(option); it != opts.format_options.end()) {
    said = it->second;
    if (said != "bgr" && said != "rgb" && said != "bgr-to-rgb")
      return Status::Invalid(fmt::format("{} '{}': bgr, rgb or bgr-to-rgb", option, said), Location{.file = where});
  }
  bool convert = false;
  std::string words;
  if (said == "bgr-to-rgb") {
    words = "decoded arrays: rgb (converted from bgr on read)";
    convert = true;
  } else if (!said.empty()) {
    words = fmt::format("decoded arrays: {} (said by {}; not converted)", said, option);
  } else if (!recorded.empty()) {
    words = fmt::format("decoded arrays: {} (as {} records; not converted)", recorded, where);
  }
  if (!words.empty()) {
    info->extra["channel_order"] = words;
    info->extra["channel_option"] = option;
  }
  return convert;
}

namespace {

Status Convert(Sample* s) {
  for (auto& f : s->fields) {
    if (f.ext != "npy") continue;
    auto rgb = pickle::NpyBgrToRgb(f.data);
    if (!rgb.ok())
      return Status(rgb.status().code(), fmt::format("field 'npy' of sample '{}': {}", s->key, rgb.status().message()),
                    Location{.key = s->key});
    f.data = std::move(*rgb);
  }
  return Status::OK();
}

class SwapReader : public SampleReader {
 public:
  explicit SwapReader(std::unique_ptr<SampleReader> r) : r_(std::move(r)) {}
  Result<bool> Next(Sample* out) override {
    SK_ASSIGN_OR_RETURN(bool more, r_->Next(out));
    if (more) SK_RETURN_IF_ERROR(Convert(out));
    return more;
  }

 private:
  std::unique_ptr<SampleReader> r_;
};

class SwapRandomAccess : public RandomAccess {
 public:
  explicit SwapRandomAccess(std::shared_ptr<RandomAccess> r) : r_(std::move(r)) {}
  uint64_t size() const override { return r_->size(); }
  Status Get(uint64_t index, Sample* out) const override {
    SK_RETURN_IF_ERROR(r_->Get(index, out));
    return Convert(out);
  }
  void Prefetch(const uint64_t* indices, size_t n) const override { r_->Prefetch(indices, n); }

 private:
  std::shared_ptr<RandomAccess> r_;
};

class SwapDataset : public Dataset {
 public:
  SwapDataset(std::unique_ptr<Dataset> ds, DatasetInfo info) : ds_(std::move(ds)), info_(std::move(info)) {
    // Sample checksums are of the stored (BGR) bytes, not of the converted ones.
    info_.sample_checksums = SampleChecksums::kNone;
    info_.sample_checksums_where.clear();
  }
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    SK_ASSIGN_OR_RETURN(auto r, ds_->NewReader());
    return std::unique_ptr<SampleReader>(new SwapReader(std::move(r)));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    SK_ASSIGN_OR_RETURN(auto r, ds_->NewRandomAccess());
    return std::shared_ptr<RandomAccess>(new SwapRandomAccess(std::move(r)));
  }
  // The recorded checksums are of the stored (BGR) bytes; the converted ones differ.
  Result<std::vector<uint64_t>> RecordedChecksums() const override { return std::vector<uint64_t>{}; }

 private:
  std::unique_ptr<Dataset> ds_;
  DatasetInfo info_;
};

}  // namespace

std::unique_ptr<Dataset> WithBgrToRgb(std::unique_ptr<Dataset> ds, DatasetInfo info) {
  return std::make_unique<SwapDataset>(std::move(ds), std::move(info));
}

OptionSpec ChannelsReadOption() {
  return OptionSpec{"channels", "", {"bgr", "rgb", "bgr-to-rgb"},
                    "the channel order of decoded arrays (npy): say it (bgr, rgb) or convert BGR to RGB on read "
                    "(bgr-to-rgb); default: as the dataset records it"};
}

ArrayOrder ArrayOrderOf(const DatasetInfo& info) {
  auto it = info.extra.find("channel_order");
  if (it == info.extra.end()) return ArrayOrder::kUnknown;
  // The readers' words: "decoded arrays: <order> (why ...)".
  const std::string& w = it->second;
  if (w.starts_with("decoded arrays: rgb")) return ArrayOrder::kRgb;
  if (w.starts_with("decoded arrays: bgr")) return ArrayOrder::kBgr;
  if (w.starts_with("decoded arrays: none")) return ArrayOrder::kNone;
  return ArrayOrder::kUnknown;
}

std::string ChannelOption(const DatasetInfo& info) {
  if (auto it = info.extra.find("channel_option"); it != info.extra.end()) return it->second;
  return info.format + ".channels";
}

std::string UnknownOrderMessage(const DatasetInfo& info, const std::string& use) {
  const std::string opt = ChannelOption(info);
  return fmt::format(
      "{}: the source's decoded arrays have colour channels and it records no channel order (RGB or BGR); "
      "say it when opening the source: --source-option {}=rgb, or {}=bgr-to-rgb for OpenCV (BGR) arrays "
      "(Python: source_options={{\"{}\": \"rgb\"}})",
      use, opt, opt, opt);
}

Status RefuseColourArrays(const Sample& s, const std::string& message) {
  const Field* f = s.find("npy");
  if (!f) return Status::OK();
  auto a = pickle::ParseNpy(f->data);
  if (!a.ok() || !pickle::HasColorChannels(*a)) return Status::OK();  // the consumer reports a bad array itself
  return Status::Invalid(message, Location{.key = s.key});
}

}  // namespace shardkit::formats
