// Writing MDS as streaming's MDSWriter does: columns sorted by name, a shard
// cut before the sample that would take it past the size limit (counting the
// header and 4 bytes per sample, as MDSWriter does), shard.NNNNN.mds files
// (+ ".zstd" when compressed), index.json with sorted keys. Everything is
// staged in "<dir>.partial-PID-XXXXXX" (each file fsynced, then the directory)
// and published with one FileSystem::Publish at Finish().
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "core/paths.h"
#include "formats/mds/mds.h"
#include "formats/transform_record.h"

namespace shardkit::formats::mds {

namespace {

using json = nlohmann::ordered_json;

// Python's json.dumps(obj, sort_keys=True) text: ", " and ": " separators,
// non-ASCII escaped as \uXXXX (objects here are built with sorted keys).
void PyDump(const json& j, std::string* out) {
  switch (j.type()) {
    case json::value_t::object: {
      std::vector<std::string> keys;
      for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
      std::sort(keys.begin(), keys.end());
      *out += '{';
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i) *out += ", ";
        PyDump(json(keys[i]), out);
        *out += ": ";
        PyDump(j.at(keys[i]), out);
      }
      *out += '}';
      return;
    }
    case json::value_t::array:
      *out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) *out += ", ";
        PyDump(j[i], out);
      }
      *out += ']';
      return;
    case json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      *out += '"';
      for (size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        uint32_t cp = c;
        size_t len = 1;
        if (c >= 0x80) {  // valid UTF-8 (checked by the caller)
          len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
          cp = c & (0x3F >> (len - 1));
          for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        }
        i += len;
        if (cp == '"') *out += "\\\"";
        else if (cp == '\\') *out += "\\\\";
        else if (cp == '\n') *out += "\\n";
        else if (cp == '\r') *out += "\\r";
        else if (cp == '\t') *out += "\\t";
        else if (cp == '\b') *out += "\\b";
        else if (cp == '\f') *out += "\\f";
        else if (cp < 0x20 || (cp >= 0x7F && cp < 0x10000)) *out += fmt::format("\\u{:04x}", cp);
        else if (cp >= 0x10000) {
          uint32_t v = cp - 0x10000;
          *out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else *out += char(cp);
      }
      *out += '"';
      return;
    }
    default:
      *out += j.dump();  // null, booleans, integers
  }
}

std::string PyDumps(const json& j) {
  std::string s;
  PyDump(j, &s);
  return s;
}

struct Col {
  std::string name, encoding;
  bool operator==(const Col&) const = default;
};

void PutU32(std::string* s, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  s->append(b, 4);
}

class MdsWriter : public SampleWriter {
 public:
  static Result<std::unique_ptr<SampleWriter>> Make(const std::string& path_in, const WriteOptions& opts) {
    std::string root = paths::StripTrailingSlashes(path_in);
    if (root.empty() || root == "/" || root == "." || root == "..")
      return Status::Invalid("refusing to write an MDS directory over this path", Location{.file = path_in});
    const std::string compression = WriteOption(opts, "mds.compression");
    const std::vector<std::string> hashes = WriteOptionList(opts, "mds.hashes");
    int level = 0;
    if (!compression.empty() && !ParseZstd(compression, &level))
      return Status::Invalid(fmt::format("MDS compression '{}': shardkit writes 'zstd' or 'zstd:LEVEL' (1..22)",
                                         compression),
                             Location{.file = root});
    for (const auto& h : hashes)
      if (!KnownHash(h))
        return Status::Invalid(fmt::format("MDS hash '{}' is not one shardkit computes (md5, sha1, xxh32, xxh64, "
                                           "xxh3_64, xxh3_128, xxh128)", h),
                               Location{.file = root});
    std::shared_ptr<FileSystem> fs = FileSystem::OrLocal(opts.filesystem);
    SK_ASSIGN_OR_RETURN(std::string partial, io::StageOutputDirectory(*fs, root, opts.overwrite));
    std::unique_ptr<MdsWriter> w(new MdsWriter());
    w->fs_ = std::move(fs);
    w->root_ = root;
    w->partial_ = partial;
    w->opts_ = opts;
    w->level_ = level;
    w->hashes_ = hashes;
    w->compression_ = compression;
    std::sort(w->hashes_.begin(), w->hashes_.end());  // streaming requires them sorted
    w->hashes_.erase(std::unique(w->hashes_.begin(), w->hashes_.end()), w->hashes_.end());
    // Offsets are uint32: a shard stays under 4 GiB whatever the size option says.
    w->limit_ = std::min<uint64_t>(opts.shard_size ? opts.shard_size : kMaxShardBytes, kMaxShardBytes);
    return std::unique_ptr<SampleWriter>(std::move(w));
  }

  ~MdsWriter() override {
    if (!finished_ && !partial_.empty()) (void)fs_->RemoveAll(partial_);
  }

  Status Write(const Sample& s) override {
    if (finished_) return Status::Invalid("Write() after Finish()", Location{.file = root_, .key = s.key});
    if (!failed_.ok()) return failed_;
    Status st = DoWrite(s);
    if (!st.ok() && st.code() != Code::kInvalidArgument) failed_ = st;
    return st;
  }

  Result<WriteSummary> Finish() override {
    if (finished_) return Status::Invalid("Finish() called twice", Location{.file = root_});
    if (!failed_.ok()) return failed_;
    auto r = DoFinish();
    if (!r.ok()) failed_ = r.status();
    return r;
  }

 private:
  MdsWriter() = default;

  // A run of the shard's data: `held` (a field's bytes, by reference) when not empty,
  // else small_[off, off + len).
  struct Piece {
    Bytes held;
    uint64_t off = 0, len = 0;
  };
  static constexpr size_t kHoldSize = 4096;


  // The column for a field, by its extension and (for cls, json, txt) its bytes.
  static std::string EncodingOf(const Field& f) {
    const std::string& e = f.ext;
    std::string_view v = f.data.view();
    if (e == "jpg" || e == "jpeg") return "jpeg";
    if (e == "png") return "png";
    if (e == "cls") {
      // Only a canonical int64 decimal is stored as streaming's "int" (it reads
      // back byte-identical); anything else stays bytes.
      if (v.empty() || v.size() > 20) return "bytes";
      size_t i = v[0] == '-' ? 1 : 0;
      if (i == v.size()) return "bytes";
      for (size_t k = i; k < v.size(); ++k)
        if (v[k] < '0' || v[k] > '9') return "bytes";
      errno = 0;
      std::string t(v);
      long long x = std::strtoll(t.c_str(), nullptr, 10);
      return errno == 0 && std::to_string(x) == t ? "int" : "bytes";
    }
    if (e == "txt") return paths::IsValidUtf8(v) ? "str" : "bytes";
    if (e == "json")
      return paths::IsValidUtf8(v) && nlohmann::json::accept(v.begin(), v.end()) ? "json" : "bytes";
    return "bytes";
  }

  Status DoWrite(const Sample& s) {
    Location at{.file = root_, .key = s.key, .index = int64_t(samples_)};
    if (s.key.empty()) return Status::Invalid("empty sample key", at);
    std::vector<Col> cols;
    std::vector<const Bytes*> vals;
    Bytes key = Bytes::Copy(s.key);
    cols.push_back(Col{"__key__", paths::IsValidUtf8(s.key) ? "str" : "bytes"});
    vals.push_back(&key);
    for (const auto& f : s.fields) {
      if (f.ext == "__key__") return Status::Invalid("a field named '__key__' clashes with the MDS key column", at);
      if (!paths::IsValidUtf8(f.ext)) return Status::Invalid("field extension is not UTF-8", at);
      cols.push_back(Col{f.ext, EncodingOf(f)});
      vals.push_back(&f.data);
    }
    // MDSWriter sorts its columns by name (Python's str order = UTF-8 byte order).
    std::vector<size_t> order(cols.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cols[a].name < cols[b].name; });
    std::vector<Col> sorted;
    for (size_t i : order) sorted.push_back(cols[i]);

    // The sample's size: a uint32 per variable column, then the data.
    uint64_t size = 0;
    for (size_t i : order) {
      if (cols[i].encoding == "int") {
        size += 8;
      } else {
        if (vals[i]->size() > kMaxShardBytes) return Status::Invalid("field over 4 GiB does not fit an MDS shard", at);
        size += 4 + vals[i]->size();
      }
    }
    // A new shard when the columns change (each shard has its own in index.json)
    // or the size or count limit is reached.
    if (shard_samples_ > 0) {
      bool cut = sorted != cols_ || shard_size_ + size + 4 > limit_ ||
                 (opts_.samples_per_shard && shard_samples_ >= opts_.samples_per_shard);
      if (cut) SK_RETURN_IF_ERROR(Flush());
    }
    if (shard_samples_ == 0) {
      cols_ = sorted;
      config_ = PyDumps(Config());
      shard_size_ = 4 + 4 + config_.size();
    }
    if (shard_size_ + size + 4 > kMaxShardBytes)
      return Status::Invalid(fmt::format("sample of {} bytes does not fit an MDS shard (under 4 GiB)", size), at);
    for (size_t i : order)
      if (cols[i].encoding != "int") {
        char b[4];
        const uint32_t n = uint32_t(vals[i]->size());
        std::memcpy(b, &n, 4);
        AddSmall(b, 4);
      }
    for (size_t i : order) {
      if (cols[i].encoding == "int") {
        int64_t x = std::strtoll(vals[i]->str().c_str(), nullptr, 10);
        char b[8];
        std::memcpy(b, &x, 8);
        AddSmall(b, 8);
      } else if (vals[i]->size() >= kHoldSize) {  // the key too: its Copy owns its bytes, the piece shares them
        pieces_.push_back(Piece{*vals[i], 0, vals[i]->size()});
      } else {
        AddSmall(vals[i]->data(), vals[i]->size());
      }
    }
    sizes_.push_back(uint32_t(size));
    shard_size_ += size + 4;
    ++shard_samples_;
    ++samples_;
    return Status::OK();
  }

  json Config() const {
    json c = json::object();
    json names = json::array(), encs = json::array(), sizes = json::array();
    for (const auto& col : cols_) {
      names.push_back(col.name);
      encs.push_back(col.encoding);
      sizes.push_back(col.encoding == "int" ? json(8) : json(nullptr));
    }
    c["column_encodings"] = encs;
    c["column_names"] = names;
    c["column_sizes"] = sizes;
    c["compression"] = compression_.empty() ? json(nullptr) : json(compression_);
    c["format"] = "mds";
    c["hashes"] = hashes_;
    c["size_limit"] = limit_ < kMaxShardBytes ? json(limit_) : json(nullptr);
    c["version"] = 2;
    return c;
  }

  // Appends bytes that are copied into the shard's small-bytes buffer (sizes, ints, keys,
  // small fields); larger fields are held by reference (Piece::held), not copied.
  void AddSmall(const void* p, size_t n) {
    if (n == 0) return;
    if (pieces_.empty() || !pieces_.back().held.empty() || pieces_.back().off + pieces_.back().len != small_.size())
      pieces_.push_back(Piece{{}, small_.size(), 0});
    small_.append(static_cast<const char*>(p), n);
    pieces_.back().len += n;
  }
  std::string_view PieceView(const Piece& p) const {
    return p.held.empty() ? std::string_view(small_).substr(p.off, p.len) : p.held.view();
  }

  // {basename, bytes, hashes} of the bytes `head` then `pieces` (the file as written).
  json FileInfoJson(const std::string& base, std::string_view head, const std::vector<Piece>& pieces = {}) const {
    uint64_t bytes = head.size();
    for (const auto& p : pieces) bytes += p.len;
    json h = json::object();
    for (const auto& algo : hashes_) {
      Hasher hs(algo);
      hs.Update(head.data(), head.size());
      for (const auto& p : pieces) {
        auto v = PieceView(p);
        hs.Update(v.data(), v.size());
      }
      auto hex = hs.Hex();
      h[algo] = hex.ok() ? *hex : "";
    }
    json o = json::object();
    o["basename"] = base;
    o["bytes"] = bytes;
    o["hashes"] = h;
    return o;
  }

  Status Flush() {
    if (shard_samples_ == 0) return Status::OK();
    // The header (count, offsets, config); the samples stay where they are.
    std::string head;
    head.reserve(4 + 4 * (shard_samples_ + 1) + config_.size());
    PutU32(&head, uint32_t(shard_samples_));
    uint64_t off = 4 + 4 * (shard_samples_ + 1) + config_.size();
    PutU32(&head, uint32_t(off));
    for (uint32_t s : sizes_) {
      off += s;
      PutU32(&head, uint32_t(off));
    }
    head += config_;
    std::string base = fmt::format("shard.{:05d}.mds", shards_.size());
    json entry = Config();
    entry["raw_data"] = FileInfoJson(base, head, pieces_);
    entry["samples"] = shard_samples_;
    std::string stored_name = base;
    std::string zipped;
    bool zip = !compression_.empty();
    uint64_t raw_bytes = head.size();
    for (const auto& p : pieces_) raw_bytes += p.len;
    if (zip) {
      std::string raw;
      raw.reserve(raw_bytes);
      raw += head;
      for (const auto& p : pieces_) raw += PieceView(p);
      SK_ASSIGN_OR_RETURN(zipped, Zstd(raw, level_));
      stored_name = base + ".zstd";
      entry["zip_data"] = FileInfoJson(stored_name, zipped);
    } else {
      entry["zip_data"] = nullptr;
    }
    std::string staged = partial_ + "/" + stored_name;
    std::string final_path = root_ + "/" + stored_name;
    uint64_t stored_bytes = zip ? zipped.size() : raw_bytes;
    if (zip) SK_RETURN_IF_ERROR(WriteNew(staged, zipped, {}, final_path));
    else SK_RETURN_IF_ERROR(WriteNew(staged, head, pieces_, final_path));
    ShardInfo si;
    si.path = final_path;
    si.samples = shard_samples_;
    si.bytes = stored_bytes;
    si.address = "mds:" + final_path;
    auto x = entry["zip_data"].is_null() ? entry["raw_data"]["hashes"] : entry["zip_data"]["hashes"];
    if (x.contains("xxh3_64")) si.checksum = "xxh3:" + x["xxh3_64"].get<std::string>();
    bytes_ += stored_bytes;
    done_.push_back(std::move(si));
    shards_.push_back(std::move(entry));
    small_.clear();
    pieces_.clear();
    sizes_.clear();
    shard_samples_ = 0;
    return Status::OK();
  }

  // Creates `path` with the bytes `head` then `pieces`, synced. Pieces held by reference
  // are written straight from the source's buffers; runs of small ones are one write.
  Status WriteNew(const std::string& path, std::string_view head, const std::vector<Piece>& pieces,
                  const std::string& shown) {
    auto f = fs_->NewWritableFile(path, CreateMode::kExclusive);
    if (!f.ok()) return std::move(f).take_status().At(Location{.file = shown});
    Status st = (*f)->Append(head);
    for (size_t i = 0; st.ok() && i < pieces.size(); ++i) st = (*f)->Append(PieceView(pieces[i]));
    // Each file synced on its own: syncfs (SyncTree) would also flush every other
    // writer's dirty pages on the same file system.
    if (st.ok()) st = (*f)->Sync();
    if (st.ok()) st = (*f)->Close();
    if (!st.ok()) st.where().file = shown;
    return st;
  }

  Result<WriteSummary> DoFinish() {
    SK_RETURN_IF_ERROR(Flush());
    json index = json::object();
    json shards = json::array();
    for (auto& s : shards_) shards.push_back(s);
    index["shards"] = shards;
    index["version"] = 2;
    for (const auto& c : opts_.class_names)
      if (!paths::IsValidUtf8(c)) return Status::Invalid("a class name is not UTF-8", Location{.file = root_});
    std::string text = PyDumps(index);
    SK_RETURN_IF_ERROR(WriteNew(partial_ + "/" + kIndexName, text, {}, root_ + "/" + kIndexName));
    json side = json::object();
    // The channel order of decoded arrays, as the source said it (Streaming ignores this file).
    if (!opts_.array_channels.empty()) side["channel_order"] = opts_.array_channels;
    side["class_names"] = opts_.class_names;
    side["format"] = "mds";
    side["samples"] = samples_;
    // The transform applied at conversion (WriteOptions::transform, a JSON object).
    if (!opts_.transform.empty()) {
      SK_ASSIGN_OR_RETURN(side["transform"], TransformRecord(opts_.transform, Location{.file = root_}));
    }
    side["version"] = 1;
    std::string side_text = PyDumps(side) + "\n";
    SK_RETURN_IF_ERROR(WriteNew(partial_ + "/" + kSidecarName, side_text, {}, root_ + "/" + kSidecarName));
    SK_RETURN_IF_ERROR(fs_->SyncDir(partial_));
    SK_RETURN_IF_ERROR(io::CheckDirectoryOutput(*fs_, root_, opts_.overwrite));
    SK_RETURN_IF_ERROR(fs_->Publish(partial_, root_, PublishOptions{.replace = true, .published = &finished_}));
    finished_ = true;
    io::RemoveDebrisOf(root_);  // staging directories of killed writes ("NAME.partial-PID-XXXXXX")
    WriteSummary sum;
    sum.samples = samples_;
    sum.bytes = bytes_ + text.size() + side_text.size();
    sum.shards = std::move(done_);
    return sum;
  }

  std::shared_ptr<FileSystem> fs_;
  std::string root_, partial_;
  WriteOptions opts_;
  int level_ = 0;
  std::vector<std::string> hashes_;
  std::string compression_;  // option mds.compression ("" = none)
  uint64_t limit_ = kMaxShardBytes;
  // The shard being built.
  std::vector<Col> cols_;
  std::string config_;
  std::string small_;           // the bytes of small pieces
  std::vector<Piece> pieces_;   // the shard's data after its header, in order
  std::vector<uint32_t> sizes_;
  uint64_t shard_size_ = 0, shard_samples_ = 0;
  // Done.
  std::vector<json> shards_;
  std::vector<ShardInfo> done_;
  uint64_t samples_ = 0, bytes_ = 0;
  bool finished_ = false;
  Status failed_;
};

}  // namespace

Result<std::unique_ptr<SampleWriter>> CreateMds(const std::string& path, const WriteOptions& opts) {
  return MdsWriter::Make(path, opts);
}

}  // namespace shardkit::formats::mds
