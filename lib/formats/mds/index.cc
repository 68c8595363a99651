// MDS index.json: parsing and checks, the column -> field mapping, bids and
// the shard listing verify uses.
#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/any_file.h"
#include "core/json_count.h"
#include "core/paths.h"
#include "formats/mds/mds.h"

namespace shardkit::formats::mds {

namespace {

using json = nlohmann::json;

struct Fixed {
  const char* name;
  uint32_t size;
  Conv conv;
};
// streaming's fixed-size scalar encodings (mds/encodings.py).
constexpr Fixed kFixed[] = {
    {"int", 8, Conv::kInt},      {"int8", 1, Conv::kInt},     {"int16", 2, Conv::kInt},
    {"int32", 4, Conv::kInt},    {"int64", 8, Conv::kInt},    {"uint8", 1, Conv::kUInt},
    {"uint16", 2, Conv::kUInt},  {"uint32", 4, Conv::kUInt},  {"uint64", 8, Conv::kUInt},
    {"float16", 2, Conv::kFloat}, {"float32", 4, Conv::kFloat}, {"float64", 8, Conv::kFloat},
};
// Variable-size encodings (carried as stored). `ndarray:dtype:shape` may be
// fixed: its size comes from column_sizes.
constexpr const char* kVariable[] = {"bytes", "str", "json", "jpeg", "png", "pil", "pkl", "str_int",
                                     "str_float", "str_decimal", "jpeg_array", "jpegarray",
                                     "list[pil]", "list[jpeg]", "list[png]"};

const Fixed* FindFixed(std::string_view e) {
  for (const auto& f : kFixed)
    if (e == f.name) return &f;
  return nullptr;
}

bool IsIntegerEncoding(std::string_view e) {
  const Fixed* f = FindFixed(e);
  return (f && f->conv != Conv::kFloat) || e == "str_int";
}

bool IsLabelName(std::string_view n) {
  return n == "label" || n == "labels" || n == "y" || n == "target" || n == "targets" || n == "class";
}

std::string ExtOf(std::string_view name) {
  std::string e = paths::Lower(name);
  for (char& c : e)
    if (c == '/' || c == '\0' || c == ' ' || c == '\t' || c == '\n') c = '_';
  return e;
}

Status Bad(const std::string& file, std::string msg) { return Status::Corrupt(std::move(msg), Location{.file = file}); }

bool SafeBasename(const std::string& b) {
  if (b.empty() || b.front() == '/' || b.find('\0') != std::string::npos || b.find('\\') != std::string::npos)
    return false;
  size_t start = 0;
  for (;;) {
    size_t slash = b.find('/', start);
    std::string_view part = std::string_view(b).substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool AsU64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = uint64_t(j.get<int64_t>());
    return true;
  }
  return false;
}

Result<FileRef> ParseFileRef(const json& j, const std::string& file, const std::string& what) {
  if (!j.is_object()) return Bad(file, fmt::format("{} is not an object", what));
  FileRef r;
  auto b = j.find("basename");
  if (b == j.end() || !b->is_string()) return Bad(file, fmt::format("{}.basename is missing or not a string", what));
  r.basename = b->get<std::string>();
  if (!SafeBasename(r.basename))
    return Bad(file, fmt::format("{}.basename '{}' is not a relative path inside the dataset directory", what, r.basename));
  auto n = j.find("bytes");
  if (n == j.end() || !AsU64(*n, &r.bytes)) return Bad(file, fmt::format("{}.bytes is missing or not a count", what));
  auto h = j.find("hashes");
  if (h != j.end() && !h->is_null()) {
    if (!h->is_object()) return Bad(file, fmt::format("{}.hashes is not an object", what));
    for (auto it = h->begin(); it != h->end(); ++it) {
      if (!it->is_string()) return Bad(file, fmt::format("{}.hashes.{} is not a string", what, it.key()));
      r.hashes[it.key()] = paths::Lower(it->get<std::string>());
    }
  }
  return r;
}

Result<ShardMeta> ParseShard(const json& s, int64_t i, const std::string& dir, const std::string& file,
                             const paths::Confinement& inside) {
  std::string w = fmt::format("shards[{}]", i);
  if (!s.is_object()) return Bad(file, w + " is not an object");
  auto fmt_it = s.find("format");
  if (fmt_it == s.end() || !fmt_it->is_string()) return Bad(file, w + ".format is missing");
  if (*fmt_it != "mds")
    return Status::Unsupported(fmt::format("{} has format '{}'; shardkit reads MDS shards only", w, fmt_it->get<std::string>()),
                               Location{.file = file, .shard = i});
  auto v = s.find("version");
  if (v != s.end() && !(v->is_number_integer() && v->get<int64_t>() == 2))
    return Bad(file, w + ".version is not 2");
  ShardMeta m;
  m.index = i;
  auto names = s.find("column_names"), encs = s.find("column_encodings"), sizes = s.find("column_sizes");
  if (names == s.end() || !names->is_array() || encs == s.end() || !encs->is_array() || sizes == s.end() ||
      !sizes->is_array())
    return Bad(file, w + ": column_names, column_encodings and column_sizes must be arrays");
  if (names->size() != encs->size() || names->size() != sizes->size())
    return Bad(file, fmt::format("{}: {} column names, {} encodings and {} sizes", w, names->size(), encs->size(),
                                 sizes->size()));
  std::set<std::string> seen;
  for (size_t c = 0; c < names->size(); ++c) {
    const json &n = (*names)[c], &e = (*encs)[c], &z = (*sizes)[c];
    if (!n.is_string() || !e.is_string()) return Bad(file, fmt::format("{}: column {} has a non-string name or encoding", w, c));
    Column col;
    col.name = n.get<std::string>();
    col.encoding = e.get<std::string>();
    if (!seen.insert(col.name).second) return Bad(file, fmt::format("{}: column '{}' appears twice", w, col.name));
    if (!z.is_null()) {
      uint64_t v64 = 0;
      if (!AsU64(z, &v64) || v64 > kMaxShardBytes) return Bad(file, fmt::format("{}: column '{}' has a bad size", w, col.name));
      col.size = uint32_t(v64);
    }
    std::optional<uint32_t> want;
    if (EncodingSize(col.encoding, &want) && want != col.size)
      return Bad(file, fmt::format("{}: column '{}' ({}) has size {} but that encoding's size is {}", w, col.name,
                                   col.encoding, col.size ? std::to_string(*col.size) : "null",
                                   want ? std::to_string(*want) : "null (variable)"));
    m.columns.push_back(std::move(col));
  }
  SK_RETURN_IF_ERROR(MapColumns(&m.columns, Location{.file = file, .shard = i}));
  auto smp = s.find("samples");
  if (smp == s.end() || !AsU64(*smp, &m.samples) || m.samples >= kMaxShardBytes / 4)
    return Bad(file, w + ".samples is missing or not a count");
  auto comp = s.find("compression");
  if (comp != s.end() && !comp->is_null()) {
    if (!comp->is_string()) return Bad(file, w + ".compression is not a string");
    m.compression = comp->get<std::string>();
  }
  auto raw = s.find("raw_data");
  if (raw == s.end()) return Bad(file, w + ".raw_data is missing");
  SK_ASSIGN_OR_RETURN(m.raw, ParseFileRef(*raw, file, w + ".raw_data"));
  auto zip = s.find("zip_data");
  if (zip != s.end() && !zip->is_null()) {
    SK_ASSIGN_OR_RETURN(m.zip, ParseFileRef(*zip, file, w + ".zip_data"));
  }
  if (!m.compression.empty() && !m.zip) return Bad(file, w + " is compressed but has no zip_data");
  if (m.compression.empty() && m.zip) return Bad(file, w + " has zip_data but no compression");
  if (m.raw.bytes > kMaxShardBytes)
    return Bad(file, fmt::format("{}.raw_data.bytes is {}: an MDS shard is under 4 GiB (its offsets are uint32)", w, m.raw.bytes));
  // The basenames are relative paths without '..' (ParseFileRef); a symbolic link may
  // still lead out of the dataset directory (`inside`, built once by ParseIndex).
  const FileRef& data = m.zip ? *m.zip : m.raw;
  auto resolved = inside.Resolve(data.basename, w + (m.zip ? ".zip_data.basename" : ".raw_data.basename"));
  if (!resolved.ok()) return resolved.status();
  m.path = dir + "/" + data.basename;
  return m;
}

}  // namespace

bool EncodingSize(std::string_view encoding, std::optional<uint32_t>* size) {
  if (const Fixed* f = FindFixed(encoding)) {
    *size = f->size;
    return true;
  }
  for (const char* v : kVariable)
    if (encoding == v) {
      size->reset();
      return true;
    }
  return false;  // ndarray[:...] and encodings unknown here: column_sizes decides
}

Status MapColumns(std::vector<Column>* cols, const Location& at) {
  bool has_cls = false, has_key = false;
  for (const auto& c : *cols) {
    if (ExtOf(c.name) == "cls") has_cls = true;
    if (c.name == "__key__") has_key = true;
  }
  bool label_done = has_cls;
  std::map<std::string, std::string> taken;  // ext -> column name
  std::vector<Column*> images;
  for (auto& c : *cols) {
    if (const Fixed* f = FindFixed(c.encoding)) {
      c.conv = f->conv;
      c.width = int(f->size);
    }
    if (c.name == "__key__" || (!has_key && c.name == "key" && c.encoding == "str")) {
      if (c.conv == Conv::kFloat) return Status::Unsupported(fmt::format("key column '{}' is a float", c.name), at);
      c.role = Role::kKey;
      has_key = true;
      continue;
    }
    std::string ext = ExtOf(c.name);
    if (ext.empty()) return Status::Corrupt("a column has an empty name", at);
    if (!label_done && IsLabelName(ext) && IsIntegerEncoding(c.encoding)) {
      ext = "cls";
      label_done = true;
    } else if (c.encoding == "pil") {
      c.conv = Conv::kPil;  // a PNG file is made of it
      if (ext != "png") {
        images.push_back(&c);
        continue;
      }
    } else if ((c.encoding == "jpeg" || c.encoding == "png") && !IsImageExt(ext)) {
      images.push_back(&c);
      continue;
    }
    auto [it, fresh] = taken.emplace(ext, c.name);
    if (!fresh)
      return Status::Unsupported(
          fmt::format("columns '{}' and '{}' both map to the field '{}'", it->second, c.name, ext), at);
    c.ext = std::move(ext);
  }
  for (Column* c : images) {
    std::string e = c->encoding == "jpeg" ? "jpg" : "png";  // png, pil
    std::string ext = taken.count(e) ? ExtOf(c->name) + "." + e : e;
    auto [it, fresh] = taken.emplace(ext, c->name);
    if (!fresh)
      return Status::Unsupported(
          fmt::format("columns '{}' and '{}' both map to the field '{}'", it->second, c->name, ext), at);
    c->ext = std::move(ext);
  }
  return Status::OK();
}

Result<Index> ParseIndex(std::string_view text, const std::string& dir, const std::string& index_path) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Bad(index_path, "index.json is not a JSON object");
  auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != 2)
    return Status::Unsupported("index.json is not MDS index version 2", Location{.file = index_path});
  auto shards = j.find("shards");
  if (shards == j.end() || !shards->is_array()) return Bad(index_path, "index.json has no 'shards' array");
  Index idx;
  idx.dir = dir;
  idx.index_path = index_path;
  std::set<std::string> fields, files;
  // Every shard's file resolves inside the dataset (MDS is never trusted: Streaming's
  // own writers put every shard below index.json).
  const paths::Confinement inside(index_path, false, /*offer_trust=*/false);
  for (size_t i = 0; i < shards->size(); ++i) {
    SK_ASSIGN_OR_RETURN(ShardMeta m, ParseShard((*shards)[i], int64_t(i), dir, index_path, inside));
    if (!files.insert(m.path).second)
      return Bad(index_path, fmt::format("shards[{}] names the file '{}' of an earlier shard", i, m.path));
    m.first = idx.num_samples;
    idx.num_samples += m.samples;
    for (const auto& c : m.columns)
      if (c.role == Role::kField) fields.insert(c.ext);
    idx.shards.push_back(std::move(m));
  }
  idx.fields.assign(fields.begin(), fields.end());
  return idx;
}

Result<Index> ReadIndex(const std::string& dir, const std::shared_ptr<FileSystem>& fs) {
  std::string path = dir + "/" + kIndexName;
  auto text = fs->ReadFile(path);
  if (!text.ok()) {
    Status st = std::move(text).take_status();
    if (st.code() == Code::kNotFound)
      return Status::NotFound("no index.json: not an MDS dataset directory", Location{.file = path});
    return st;
  }
  SK_ASSIGN_OR_RETURN(Index idx, ParseIndex(*text, dir, path));
  std::string side = dir + "/" + kSidecarName;
  if (fs->Exists(side)) {
    SK_ASSIGN_OR_RETURN(std::string t, fs->ReadFile(side));
    json j = json::parse(t, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Bad(side, "shardkit.json is not a JSON object");
    auto c = j.find("class_names");
    if (c != j.end()) {
      if (!c->is_array()) return Bad(side, "shardkit.json: class_names is not an array");
      for (const auto& n : *c) {
        if (!n.is_string()) return Bad(side, "shardkit.json: a class name is not a string");
        idx.class_names.push_back(n.get<std::string>());
      }
    }
    auto co = j.find("channel_order");
    if (co != j.end()) {
      if (!co->is_string() || (*co != "bgr" && *co != "rgb"))
        return Bad(side, "shardkit.json: channel_order is not \"bgr\" or \"rgb\"");
      idx.channel_order = co->get<std::string>();
    }
    auto tr = j.find("transform");
    if (tr != j.end()) {
      if (!tr->is_object()) return Bad(side, "shardkit.json: transform is not a JSON object");
      idx.transform = tr->dump();
    }
  }
  return idx;
}

Target Resolve(const std::string& path_in) {
  std::string p = paths::StripTrailingSlashes(path_in);
  // An address names a directory by what it is not (a store may have no directories).
  if (io::IsUrl(p) && paths::BaseName(p) != kIndexName && std::string(paths::BaseName(p)).find(".mds") == std::string::npos)
    return Target{p, ""};
  if (io::IsDir(p)) return Target{p, ""};
  if (paths::BaseName(p) == kIndexName) return Target{io::DirName(p), ""};
  // A shard file (its name holds ".mds"): the nearest directory above it
  // holding index.json (a merged index names shards in subdirectories).
  if (std::string(paths::BaseName(p)).find(".mds") == std::string::npos) return Target{};
  std::string dir = io::DirName(p);
  for (int up = 0; up < 8; ++up) {
    if (io::Exists(dir + "/" + kIndexName)) {
      std::string rel = p.substr(dir.size() + 1);
      if (dir == "." && p.rfind("./", 0) != 0) rel = p;
      return Target{dir, rel};
    }
    std::string parent = io::DirName(dir);
    if (parent == dir) break;
    dir = parent;
  }
  return Target{io::DirName(p), std::string(paths::BaseName(p))};
}

int BidRead(const std::string& path) {
  // An address is bid on by its name (no request per bid): its index.json or a shard; a
  // directory address takes the mds: prefix.
  if (io::IsUrl(path)) {
    std::string base(paths::BaseName(paths::StripTrailingSlashes(path)));
    return base == kIndexName || (base.find(".mds") != std::string::npos && base.find('{') == std::string::npos) ? 90 : 0;
  }
  Target t = Resolve(path);
  if (t.dir.empty()) return 0;
  std::string ip = t.dir + "/" + kIndexName;
  if (!io::Exists(ip)) return 0;
  auto text = io::ReadFile(ip);
  if (!text.ok()) return 0;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  auto v = j.find("version");
  auto s = j.find("shards");
  if (v == j.end() || !v->is_number_integer() || *v != 2 || s == j.end() || !s->is_array()) return 0;
  if (s->empty()) return t.shard_file.empty() ? 90 : 0;
  const json& first = (*s)[0];
  if (!json_count::MemberIs(first, "format", "mds")) return 0;
  return 100;
}

int BidWrite(const std::string& path) {
  std::string base = paths::Lower(paths::BaseName(paths::StripTrailingSlashes(path)));
  return paths::EndsWith(base, ".mds") && base.size() > 4 ? 90 : 0;
}

// opts: unused; an index.json's shards are always confined (ParseShard).
Result<ShardListing> ListShards(const std::string& path, const OpenOptions& /*opts*/) {
  Target t = Resolve(path);
  if (t.dir.empty()) return Status::NotFound("not an MDS directory, index.json or shard file", Location{.file = path});
  ShardListing out;
  out.metadata = t.dir + "/" + kIndexName;
  SK_ASSIGN_OR_RETURN(auto fs, io::FileSystemOf(t.dir));
  auto idx = ReadIndex(t.dir, fs);
  if (!idx.ok()) {
    // A shard outside the directory is refused, not reported as damage.
    if (idx.status().code() == Code::kNotFound || idx.status().detail() == Detail::kOutsideDataset) return idx.status();
    out.unreadable = idx.status().message();
    return out;
  }
  out.num_samples = t.shard_file.empty() ? std::optional<uint64_t>(idx->num_samples) : std::nullopt;
  out.class_names = idx->class_names;
  out.channel_order = idx->channel_order;
  for (const auto& m : idx->shards) {
    if (!t.shard_file.empty() && m.path != t.dir + "/" + t.shard_file) continue;
    // Sizes and hashes are the format's own checks (Detail::kShardChecksum),
    // made when the shard is opened and read: not listed here a second time.
    out.shards.push_back(ShardListing::Shard{m.path, "mds:" + m.path, m.samples, std::nullopt, ""});
  }
  if (!t.shard_file.empty() && out.shards.empty())
    return Status::NotFound(fmt::format("index.json lists no shard '{}'", t.shard_file),
                            Location{.file = out.metadata});
  if (!t.shard_file.empty()) out.num_samples = out.shards[0].samples;
  return out;
}

}  // namespace shardkit::formats::mds
