// wds naming rules (names.h).
#include "formats/wds/names.h"

#include <fmt/format.h>

#include "io/file.h"
#include "core/paths.h"

namespace shardkit::formats::wds {

// ---------------------------------------------------------------------------
// Naming rules.

std::string BaseOf(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinDir(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir + "/" + name;
}

// DALI's default index name: the archive path up to the first dot of its base
// name (a leading dot does not count), plus ".idx".
std::string IdxPathFor(const std::string& tar_path) {
  size_t base = tar_path.rfind('/');
  base = base == std::string::npos ? 0 : base + 1;
  size_t dot = tar_path.find('.', base + 1);
  return (dot == std::string::npos ? tar_path : tar_path.substr(0, dot)) + ".idx";
}

// The manifest of a write pattern: in the pattern's directory, named after the
// part of the base name before the '%' conversion ("%%" read as '%'), with
// trailing '-', '_' and '.' removed ("shards" when nothing is left), plus
// ".manifest.json". out/train-%06d.tar -> out/train.manifest.json.
std::string ManifestPathFor(const std::string& pattern) {
  std::string dir = io::DirName(pattern);
  std::string base = BaseOf(pattern);
  std::string prefix;
  for (size_t i = 0; i < base.size(); ++i) {
    if (base[i] != '%') {
      prefix += base[i];
      continue;
    }
    if (i + 1 < base.size() && base[i + 1] == '%') {
      prefix += '%';
      ++i;
      continue;
    }
    break;
  }
  while (!prefix.empty() && (prefix.back() == '-' || prefix.back() == '_' || prefix.back() == '.')) prefix.pop_back();
  if (prefix.empty()) prefix = "shards";
  std::string name = prefix + ".manifest.json";
  return pattern.find('/') == std::string::npos ? name : JoinDir(dir, name);
}

bool HasSpace(std::string_view s) {
  for (char c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return true;
  return false;
}

// ---------------------------------------------------------------------------
// Member names -> (key, extension), as the WebDataset reader splits them.

// Classifies a tar member. Fields: *key and *ext are set. Skipped (counted):
// directories, top-level names starting with "__" (WebDataset metadata) and
// names whose base name starts with '.' (hidden files). Errors: links and
// devices (their bytes are not in the shard), regular files without an
// extension, unsafe keys ("..", absolute).
Result<NameKind> Classify(const tar::Member& m, const std::string& file, int64_t shard, std::string* key,
                          std::string* ext) {
  Location where{.file = file, .shard = shard, .offset = int64_t(m.header_offset)};
  if (m.type == '5' || m.type == 'D' || m.type == 'V') return NameKind::kSkip;
  std::string_view name = m.name;
  while (name.substr(0, 2) == "./") name.remove_prefix(2);
  if (m.type != '0') {
    const char* what = m.type == '1'   ? "a hard link"
                       : m.type == '2' ? "a symbolic link"
                       : m.type == '3' ? "a character device"
                       : m.type == '4' ? "a block device"
                       : m.type == '6' ? "a FIFO"
                                       : "of an unsupported type";
    return Status::Corrupt(fmt::format("member '{}' is {} (type '{}'); a shard must hold regular files "
                                       "(create it with `tar -h` to store the files links point to)",
                                       m.name, what, m.type),
                           where);
  }
  if (name.empty()) return NameKind::kSkip;
  size_t slash = name.rfind('/');
  std::string_view base = slash == std::string_view::npos ? name : name.substr(slash + 1);
  if (slash == std::string_view::npos && base.substr(0, 2) == "__") return NameKind::kSkip;
  if (!base.empty() && base.front() == '.') return NameKind::kSkip;
  size_t dot = base.find('.');
  if (dot == std::string_view::npos || dot + 1 == base.size())
    return Status::Corrupt(fmt::format("member '{}' has no extension: WebDataset members are named KEY.EXT, "
                                       "so its field cannot be told",
                                       m.name),
                           where);
  size_t split = (slash == std::string_view::npos ? 0 : slash + 1) + dot;
  *key = std::string(name.substr(0, split));
  *ext = paths::Lower(name.substr(split + 1));
  Status safe = paths::CheckSafeKey(*key);
  if (!safe.ok()) return Status::Corrupt(fmt::format("member '{}': {}", m.name, safe.message()), where);
  return NameKind::kField;
}

Result<bool> SampleGrouper::Next(tar::Scanner& scan, Sample* out) {
  if (!have_pending_) {
    SK_ASSIGN_OR_RETURN(bool more, Pull(scan));
    if (!more) return false;
  }
  out->clear();
  out->key = std::move(pending_key_);
  out->set(pending_ext_, std::move(pending_data_));
  have_pending_ = false;
  for (;;) {
    SK_ASSIGN_OR_RETURN(bool more, Pull(scan));
    if (!more || pending_key_ != out->key) return true;
    for (const auto& f : out->fields)
      if (f.ext == pending_ext_)
        return Status::Corrupt(fmt::format("field '{}' appears twice in sample '{}'", f.ext, out->key),
                               Location{.file = file_, .shard = shard_, .offset = int64_t(pending_header_),
                                        .key = out->key});
    out->set(pending_ext_, std::move(pending_data_));
    have_pending_ = false;
  }
}

Result<bool> SampleGrouper::Pull(tar::Scanner& scan) {
  if (done_) return false;
  for (;;) {
    tar::Member m;
    auto r = scan.Next(&m);
    if (!r.ok()) return Fail(std::move(r).take_status());
    if (!*r) {
      done_ = true;
      if (at_end_) at_end_();
      return false;
    }
    std::string key, ext;
    SK_ASSIGN_OR_RETURN(NameKind kind, Classify(m, file_, shard_, &key, &ext));
    if (kind == NameKind::kSkip) continue;
    auto data = scan.TakeData();
    if (!data.ok()) return Fail(std::move(data).take_status());
    pending_key_ = std::move(key);
    pending_ext_ = std::move(ext);
    pending_header_ = m.header_offset;
    pending_data_ = std::move(data).value();
    have_pending_ = true;
    return true;
  }
}

}  // namespace shardkit::formats::wds
