// The toy format (toy.h).
#include "toy_format/toy.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/paths.h"
#include "io/any_file.h"

namespace sk_test {

namespace {

using namespace shardkit;
using json = nlohmann::json;

std::string Hex(std::string_view b) {
  std::string out;
  for (unsigned char c : b) out += fmt::format("{:02x}", c);
  return out;
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

class ToyAccess : public RandomAccess {
 public:
  explicit ToyAccess(std::shared_ptr<const std::vector<Sample>> s) : s_(std::move(s)) {}
  uint64_t size() const override { return s_->size(); }
  Status Get(uint64_t i, Sample* out) const override {
    if (i >= s_->size()) return Status::Invalid("index out of range");
    *out = (*s_)[i];
    return Status::OK();
  }

 private:
  std::shared_ptr<const std::vector<Sample>> s_;
};

class ToyReader : public SampleReader {
 public:
  explicit ToyReader(std::shared_ptr<const std::vector<Sample>> s) : s_(std::move(s)) {}
  Result<bool> Next(Sample* out) override {
    if (next_ >= s_->size()) return false;
    *out = (*s_)[next_++];
    return true;
  }

 private:
  std::shared_ptr<const std::vector<Sample>> s_;
  size_t next_ = 0;
};

class ToyDataset : public Dataset {
 public:
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new ToyReader(samples_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return std::shared_ptr<RandomAccess>(new ToyAccess(samples_));
  }
  DatasetInfo info_;
  std::shared_ptr<std::vector<Sample>> samples_ = std::make_shared<std::vector<Sample>>();
};

Result<std::unique_ptr<Dataset>> Open(const std::string& path, const OpenOptions&) {
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));  // any store, through the seam
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return Status::Corrupt("not a toy file", Location{.file = path});
  auto d = std::make_unique<ToyDataset>();
  std::set<std::string> fields;
  for (const auto& e : j) {
    Sample s;
    s.key = e.at("key").get<std::string>();
    for (auto& [ext, hex] : e.at("fields").items()) {
      s.set(ext, Bytes::Take(Unhex(hex.get<std::string>())));
      fields.insert(ext);
    }
    d->samples_->push_back(std::move(s));
  }
  d->info_.format = "toy";
  d->info_.address = "toy:" + path;
  d->info_.num_samples = d->samples_->size();
  d->info_.fields.assign(fields.begin(), fields.end());
  d->info_.shards.push_back(ShardInfo{path, d->samples_->size(), uint64_t(text.size()), ""});
  return std::unique_ptr<Dataset>(std::move(d));
}

class ToyWriter : public SampleWriter {
 public:
  ToyWriter(std::string path, WriteOptions opts) : path_(std::move(path)), opts_(std::move(opts)) {}
  Status Write(const Sample& s) override {
    std::string key = s.key;
    if (formats::WriteOption(opts_, "toy.case") == "upper")
      std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    json f = json::object();
    for (const auto& field : s.fields) f[field.ext] = Hex(field.data.view());
    out_.push_back({{"key", key}, {"fields", f}});
    return Status::OK();
  }
  Result<WriteSummary> Finish() override {
    const std::string text = out_.dump();
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(path_, text, opts_.overwrite, opts_.filesystem));
    return WriteSummary{out_.size(), text.size(), {ShardInfo{path_, out_.size(), text.size(), ""}}};
  }

 private:
  std::string path_;
  WriteOptions opts_;
  json out_ = json::array();
};

int Bid(const std::string& path) { return paths::HasExtension(path, {".toy"}) ? 90 : 0; }

}  // namespace

formats::Format ToyFormat() {
  return formats::Format{
      .name = "toy",
      .description = "a test's toy format: one JSON file of samples",
      .bid_read = Bid,
      .bid_write = Bid,
      .open = Open,
      .create = [](const std::string& path, const WriteOptions& opts) -> Result<std::unique_ptr<SampleWriter>> {
        return std::unique_ptr<SampleWriter>(new ToyWriter(path, opts));
      },
      .extensions = {"toy"},
      .write_options = {{"case", "keep", {"keep", "upper"}, "the keys as given ('keep') or upper-cased"}},
  };
}

}  // namespace sk_test
