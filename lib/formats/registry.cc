// The format registry: one row per format. Adding a format = its files in
// lib/formats/ with its sources.cmake, and one row here (docs/architecture.md).
#include "formats/registry.h"
#include "shardkit/index.h"

#include "io/any_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <cctype>
#include <filesystem>

#include "core/paths.h"

namespace shardkit::formats {

namespace {
std::deque<Format>& Table() {
  static std::deque<Format> formats = {
      FolderFormat(),
      WdsFormat(),
      LmdbFormat(),
      Hdf5Format(),
      MdsFormat(),
      RecordioFormat(),
      TfrecordFormat(),
  };
  return formats;
}
}  // namespace

const std::deque<Format>& All() { return Table(); }

Status Register(Format f) {
  if (Find(f.name)) return Status::Exists(fmt::format("a format named '{}' is registered already", f.name));
  Table().push_back(std::move(f));  // (a deque: pointers to the other rows stay valid)
  return Status::OK();
}

const Format* Find(std::string_view name) {
  for (const auto& f : All())
    if (name == f.name) return &f;
  return nullptr;
}

const Format* ShardWriter() {
  for (const auto& f : All())
    if (f.writes_shards) return &f;
  return nullptr;
}

bool ClaimedByAnother(std::string_view ext, const Format& except) {
  for (const auto& f : All()) {
    if (&f == &except || std::string_view(f.name) == except.name) continue;
    for (const auto& e : f.extensions)
      if (e == ext) return true;
  }
  return false;
}

std::pair<std::string, std::string> SplitScheme(std::string_view address) {
  auto colon = address.find(':');
  if (colon != std::string_view::npos) {
    std::string_view scheme = address.substr(0, colon);
    if (Find(scheme)) return {std::string(scheme), std::string(address.substr(colon + 1))};
  }
  return {"", std::string(address)};
}

namespace {

// "name:" where name is 2+ ASCII letters and digits starting with a letter (a
// one-letter one is a drive, "a::b" a shard list): what reads as a scheme.
std::string_view SchemeLike(std::string_view address) {
  auto colon = address.find(':');
  if (colon == std::string_view::npos || colon < 2) return {};
  if (colon + 1 < address.size() && address[colon + 1] == ':') return {};
  if (address.substr(colon).starts_with("://")) return {};  // a storage address (s3://, http://): FileSystemFor's
  if (!std::isalpha(static_cast<unsigned char>(address[0]))) return {};
  for (size_t i = 0; i < colon; ++i)
    if (!std::isalnum(static_cast<unsigned char>(address[i]))) return {};
  return address.substr(0, colon);
}

std::string KnownSchemes() {
  std::string names;
  for (const auto& f : All()) {
    names += fmt::format("{}{}:", names.empty() ? "" : ", ", f.name);
    for (const auto& p : f.prefixes) names += fmt::format(", {}:", p);
  }
  return names;
}

}  // namespace

Status CheckScheme(std::string_view address) {
  std::string_view s = SchemeLike(address);
  if (s.empty() || Find(s)) return Status::OK();
  for (const auto& f : All())
    for (const auto& p : f.prefixes)
      if (s == p) return Status::OK();
  return Status::Invalid(fmt::format("unknown scheme '{}:' in '{}'; prefix it with a scheme ({}), or write "
                                     "'./{}' for a path that holds a colon",
                                     s, address, KnownSchemes(), address),
                         Location{.file = std::string(address.substr(s.size() + 1))})
      .With(Detail::kUnknownScheme);
}

namespace {

// A directory detected as an image folder that holds datasets of other formats at its
// top (an output folder: tar shards and their manifest, TFRecords, a .rec, an .h5):
// kInvalidArgument naming the address to open instead. Only names with such a suffix
// are looked at, so an image folder of any size costs one listing of its top.
Status RefuseDatasetFolder(const std::string& dir) {
  static constexpr std::string_view kSuffixes[] = {".manifest.json", ".tfrecord.json", ".tar", ".tfrecord",
                                                   ".tfrecords", ".rec", ".h5", ".hdf5"};
  std::vector<std::string> found;  // addresses to open, the first three
  bool manifest = false;
  size_t tars = 0;
  auto entries = io::ListAny(dir);
  if (!entries.ok()) return Status::OK();  // (opening the folder says what is wrong with it)
  for (const FileInfo& entry : *entries) {
    const std::string lower = paths::Lower(entry.name);
    auto suffix = std::find_if(std::begin(kSuffixes), std::end(kSuffixes),
                               [&](std::string_view s) { return paths::EndsWith(lower, s); });
    if (suffix == std::end(kSuffixes) || entry.type != FileType::kFile) continue;
    if (*suffix == ".tar") {  // counted by name: named through their manifest, or as a range
      ++tars;
      continue;
    }
    manifest = manifest || *suffix == ".manifest.json";  // wds bids on every such name
    if (found.size() == 3) continue;
    // Only the other formats' bids say it is a dataset (and which one) rather than a file of that name.
    const std::string path = entry.path;
    const Format* best = nullptr;
    int best_bid = 0;
    for (const auto& f : All()) {
      if (std::string_view(f.name) == "folder") continue;
      int b = f.bid_read(path);
      if (b > best_bid) best_bid = b, best = &f;
    }
    if (!best) continue;
    // Manifests and HDF5 files are detected by name; the others need their scheme.
    const bool by_name = *suffix == ".manifest.json" || *suffix == ".h5" || *suffix == ".hdf5";
    found.push_back(by_name ? path : fmt::format("{}:{}", best->name, path));
  }
  if (found.empty() && tars == 0) return Status::OK();
  std::string text;
  for (const auto& a : found) text += fmt::format("{}'{}'", text.empty() ? "" : ", ", a);
  if (tars > 0 && !manifest)
    text += fmt::format("{}its {} tar shard(s) as a brace range or a '::' list", text.empty() ? "" : ", or ", tars);
  return Status::Invalid(fmt::format("'{}' holds datasets, not an image folder: open {} (or give 'folder:{}' to read "
                                     "its files as an image folder anyway)",
                                     dir, text, dir),
                         Location{.file = dir});
}

}  // namespace

Result<const Format*> Resolve(std::string_view address, bool for_write, std::string* path) {
  auto [scheme, rest] = SplitScheme(address);
  *path = rest;
  if (rest.empty()) return Status::Invalid(fmt::format("empty dataset address '{}'", address));
  if (!scheme.empty()) return Find(scheme);
  SK_RETURN_IF_ERROR(CheckScheme(address));
  const Format* best = nullptr;
  int best_bid = 0;
  for (const auto& f : All()) {
    int b = for_write ? f.bid_write(rest) : f.bid_read(rest);
    if (b > best_bid) best_bid = b, best = &f;  // a tie keeps the earlier row
  }
  if (!best && io::IsUrl(rest))
    return Status::Invalid(fmt::format("cannot tell the format of '{}': remote addresses are read as tar shards "
                                       "(x.tar, a brace range of them, or x.manifest.json); prefix another with its "
                                       "format (e.g. wds:)",
                                       address),
                           Location{.file = rest});
  if (best && !for_write && std::string_view(best->name) == "folder")
    SK_RETURN_IF_ERROR(RefuseDatasetFolder(paths::StripTrailingSlashes(std::string(rest))));
  if (!best) {
    std::string names;
    for (const auto& f : All()) names += fmt::format("{}{}:", names.empty() ? "" : ", ", f.name);
    return Status::Invalid(
        fmt::format("cannot tell the format of '{}'{}; prefix it with a scheme ({})", address,
                    for_write ? "" : " (does it exist?)", names),
        Location{.file = rest});
  }
  return best;
}

namespace {

// `given`'s keys of format f against its table (`who`: "writer" or "reader").
Status CheckOptions(const Format& f, const std::vector<OptionSpec>& table,
                    const std::map<std::string, std::string>& given, const char* who) {
  const std::string prefix = std::string(f.name) + ".";
  for (const auto& [key, value] : given) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string name = key.substr(prefix.size());
    auto spec = std::find_if(table.begin(), table.end(), [&](const OptionSpec& o) { return name == o.name; });
    if (spec == table.end()) {
      std::string known;
      for (const auto& o : table) known += fmt::format("{}{}{}", known.empty() ? "" : ", ", prefix, o.name);
      return Status::Invalid(fmt::format("unknown option '{}' of the {} {} ({})", key, f.name, who,
                                         known.empty() ? "it has none" : "known: " + known));
    }
    if (!spec->choices.empty() && std::find(spec->choices.begin(), spec->choices.end(), value) == spec->choices.end()) {
      std::string allowed;
      for (const auto& c : spec->choices) allowed += fmt::format("{}'{}'", allowed.empty() ? "" : ", ", c);
      return Status::Invalid(fmt::format("{} '{}': not one of {}", key, value, allowed));
    }
  }
  return Status::OK();
}

}  // namespace

Status CheckWriteOptions(const Format& f, const WriteOptions& opts) {
  return CheckOptions(f, f.write_options, opts.format_options, "writer");
}

Status CheckReadOptions(const Format& f, const OpenOptions& opts) {
  return CheckOptions(f, f.read_options, opts.format_options, "reader");
}

std::string WriteOption(const WriteOptions& opts, std::string_view key) {
  if (auto it = opts.format_options.find(std::string(key)); it != opts.format_options.end()) return it->second;
  const auto dot = key.find('.');
  if (const Format* f = Find(key.substr(0, dot)); f && dot != std::string_view::npos)
    for (const auto& o : f->write_options)
      if (key.substr(dot + 1) == o.name) return o.default_value;
  return "";  // (not declared: a format reads only its own table's options)
}

std::vector<std::string> WriteOptionList(const WriteOptions& opts, std::string_view key) {
  std::vector<std::string> out;
  const std::string text = WriteOption(opts, key);
  if (text == "none") return out;
  for (size_t start = 0; start <= text.size();) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

WriteOptions ApplyFormatDefaults(const Format& f, WriteOptions opts) {
  // --samples-per-shard alone cuts by count only (as `shard` does), so that a part's plan
  // of a transformed conversion can be made by count.
  if (opts.shard_size == 0)
    opts.shard_size = opts.samples_per_shard > 0 ? std::numeric_limits<uint64_t>::max() : f.default_shard_size;
  return opts;
}

}  // namespace shardkit::formats

namespace shardkit {

Result<std::unique_ptr<Dataset>> Open(std::string_view address, const OpenOptions& opts) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* f, formats::Resolve(address, false, &path));
  SK_RETURN_IF_ERROR(formats::CheckReadOptions(*f, opts));
  return f->open(path, opts);
}

Result<std::unique_ptr<SampleWriter>> Create(std::string_view address, const WriteOptions& opts) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* f, formats::Resolve(address, true, &path));
  SK_RETURN_IF_ERROR(formats::CheckWriteOptions(*f, opts));
  return f->create(path, formats::ApplyFormatDefaults(*f, opts));
}

std::vector<FormatOption> FormatOptions() {
  std::vector<FormatOption> out;
  for (const auto& f : formats::All()) {
    for (const auto& o : f.write_options)
      out.push_back(FormatOption{.format = f.name, .name = o.name, .write = true, .default_value = o.default_value,
                                 .choices = o.choices, .help = o.help});
    for (const auto& o : f.read_options)
      out.push_back(FormatOption{.format = f.name, .name = o.name, .write = false, .default_value = o.default_value,
                                 .choices = o.choices, .help = o.help});
  }
  return out;
}

std::vector<std::string> FormatNames() {
  std::vector<std::string> out;
  for (const auto& f : formats::All()) out.push_back(f.name);
  return out;
}

Result<uint64_t> WriteFormatIndex(std::string_view address, const std::string& output, std::string* written) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* f, formats::Resolve(address, false, &path));
  if (!f->write_index)
    return Status::Unsupported(fmt::format("the {} format defines no index of its own", f->name),
                               Location{.file = path});
  return f->write_index(path, output, written);
}

Result<std::string> DetectFormat(std::string_view address) {
  std::string path;
  SK_ASSIGN_OR_RETURN(const formats::Format* f, formats::Resolve(address, false, &path));
  return std::string(f->name);
}

}  // namespace shardkit
