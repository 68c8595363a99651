// The format registry: one row per format. Adding a format = one file in
// lib/formats/, one row here, one line in lib/CMakeLists.txt.
#include "formats/registry.h"

#include <fmt/format.h>

namespace shardkit::formats {

const std::vector<Format>& All() {
  static const std::vector<Format> kFormats = {
      FolderFormat(),
      WdsFormat(),
      LmdbFormat(),
      Hdf5Format(),
  };
  return kFormats;
}

std::pair<std::string, std::string> SplitScheme(std::string_view address) {
  auto colon = address.find(':');
  if (colon != std::string_view::npos) {
    std::string_view scheme = address.substr(0, colon);
    for (const auto& f : All())
      if (scheme == f.name) return {std::string(scheme), std::string(address.substr(colon + 1))};
  }
  return {"", std::string(address)};
}

namespace {
const Format* Pick(std::string_view address, bool for_write, std::string* path, Status* err) {
  auto [scheme, rest] = SplitScheme(address);
  *path = rest;
  if (rest.empty()) {
    *err = Status::Invalid(fmt::format("empty dataset address '{}'", address));
    return nullptr;
  }
  if (!scheme.empty()) {
    for (const auto& f : All())
      if (scheme == f.name) return &f;
  }
  const Format* best = nullptr;
  int best_bid = 0;
  for (const auto& f : All()) {
    int b = for_write ? f.bid_write(rest) : f.bid_read(rest);
    if (b > best_bid) best_bid = b, best = &f;
  }
  if (!best) {
    std::string names;
    for (const auto& f : All()) names += fmt::format("{}{}:", names.empty() ? "" : ", ", f.name);
    *err = Status::Invalid(
        fmt::format("cannot tell the format of '{}'{}; prefix it with a scheme ({})", address,
                    for_write ? "" : " (does it exist?)", names),
        Location{.file = rest});
  }
  return best;
}
}  // namespace

}  // namespace shardkit::formats

namespace shardkit {

Result<std::unique_ptr<Dataset>> Open(std::string_view address, const OpenOptions& opts) {
  std::string path;
  Status err;
  const formats::Format* f = formats::Pick(address, false, &path, &err);
  if (!f) return err;
  return f->open(path, opts);
}

Result<std::unique_ptr<SampleWriter>> Create(std::string_view address, const WriteOptions& opts) {
  std::string path;
  Status err;
  const formats::Format* f = formats::Pick(address, true, &path, &err);
  if (!f) return err;
  return f->create(path, opts);
}

std::vector<std::string> FormatNames() {
  std::vector<std::string> out;
  for (const auto& f : formats::All()) out.push_back(f.name);
  return out;
}

Result<std::string> DetectFormat(std::string_view address) {
  std::string path;
  Status err;
  const formats::Format* f = formats::Pick(address, false, &path, &err);
  if (!f) return err;
  return std::string(f->name);
}

}  // namespace shardkit
