// The image folder format: torchvision ImageFolder trees and unpacked WebDataset
// folders. The layouts read and written are described in docs/formats-folder.md.
//
// Reading: Open() walks the tree once and builds an immutable index (samples
// sorted by key, each with its files); Get(i) preads the sample's files into
// owned Bytes. The index is shared by the dataset, its readers and its random
// access objects, and never changes after Open(), so Get() is thread-safe.
//
// Writing: every file goes into a fresh sibling directory `<root>.partial-*`
// (no per-file fsync); Finish() writes the layout marker (with the channel order
// of decoded arrays and the transform applied at conversion), syncs the file system (syncfs), and renames the directory
// to `<root>`. Nothing is under `<root>`
// before Finish() succeeds; a writer destroyed without Finish() removes the
// partial directory.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "io/any_file.h"
#include "core/paths.h"
#include "formats/channel_order.h"
#include "formats/transform_record.h"
#include "formats/registry.h"

namespace shardkit::formats {

namespace {

// Hidden file written at the root of every folder shardkit writes; it records
// the layout so that a flat folder whose keys all have a directory part is not
// mistaken for a class folder when read back.
constexpr const char* kMarker = ".shardkit-folder.json";
constexpr int kMaxDepth = 512;

std::string Join(const std::string& root, const std::string& rel) {
  if (rel.empty()) return root;
  if (root == "/") return "/" + rel;
  return root + "/" + rel;
}

bool IsImageName(std::string_view name) {
  auto dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  return IsImageExt(paths::Lower(name.substr(dot + 1)));
}

// Parses an ASCII decimal label the way Sample::label() does.
std::optional<int64_t> ParseLabel(std::string_view v) {
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\r')) v.remove_suffix(1);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return out;
}

// ---------------------------------------------------------------- reading

// The index is compact (about 70 bytes per one-file sample plus its name, so
// about 90 MB for ImageNet's 1.28M images): file names live in one arena, a
// sample points at its directory and at a run of consecutive file records.
struct FileRec {
  uint64_t name_off = 0;  // base name in Index::names
  uint32_t name_len = 0;
  uint32_t stem_len = 0;  // the key's last component is name[0, stem_len); name[stem_len] is the split dot
  uint64_t size = 0;      // at open
};

struct Entry {  // one sample
  uint64_t first_file = 0;
  uint32_t nfiles = 0;
  uint32_t dir = 0;    // index into Index::dirs
  int32_t label = -1;  // class index, or -1 (flat)
};

struct Index {
  std::string root;
  std::shared_ptr<FileSystem> fs;  // the root's (local, or a store's)
  bool classes = false;
  bool check_images = false;  // classes layout, folder.files=images (default): image files must be images
  std::vector<std::string> class_names;
  std::vector<std::string> dirs;  // relative to root, "" for the root itself
  std::string names;
  std::vector<FileRec> files;
  std::vector<Entry> entries;  // sorted by key

  std::string_view Name(const FileRec& f) const { return std::string_view(names).substr(f.name_off, f.name_len); }
  std::string_view Stem(const FileRec& f) const { return Name(f).substr(0, f.stem_len); }
  std::string_view Suffix(const FileRec& f) const { return Name(f).substr(f.stem_len + 1); }
  std::string Key(const Entry& e) const {
    const std::string& d = dirs[e.dir];
    std::string_view stem = Stem(files[e.first_file]);
    std::string k;
    k.reserve(d.size() + 1 + stem.size());
    k += d;
    if (!d.empty()) k += '/';
    k += stem;
    return k;
  }
  std::string Path(const Entry& e, const FileRec& f) const {
    const std::string& d = dirs[e.dir];
    std::string p = root;
    if (p != "/") p += '/';
    if (!d.empty()) p += d + "/";
    p += Name(f);
    return p;
  }
};

enum class Layout { kUnknown, kFlat, kClasses };

// One directory entry after following symlinks.
struct DirItem {
  std::string name;
  bool is_dir = false;
  uint64_t size = 0;
  uint64_t device = 0, inode = 0;  // a directory's identity (FileInfo's)
};

// Walks part of a tree (the whole tree, or one class folder) into its own
// Index fragment; fragments are merged in a fixed order afterwards. The tree is
// listed through its FileSystem (local, or an s3:// prefix).
class Walker {
 public:
  Walker(std::string root, bool classes, std::shared_ptr<FileSystem> fs)
      : root_(std::move(root)), classes_(classes), fs_(std::move(fs)) {}

  // Lists a directory: non-hidden entries, symlinks followed. Anything that is
  // not a regular file or a directory, or that cannot be stat'ed, is an error.
  Status List(const std::string& rel, std::vector<DirItem>* out) {
    SK_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs_->ListDir(Join(root_, rel)));
    for (const FileInfo& fi : entries) {
      const std::string& name = fi.name;
      if (name.empty() || name[0] == '.') continue;  // hidden
      if (fi.type == FileType::kDirectory) {
        out->push_back({name, true, 0, fi.device, fi.inode});
      } else if (fi.type == FileType::kFile) {
        out->push_back({name, false, fi.size, 0, 0});
      } else {
        std::string relname = rel.empty() ? name : rel + "/" + name;
        return Status::IOError(fi.symlink ? "cannot read: dangling symlink, symlink loop or vanished file"
                                          : "cannot read: not a regular file or directory (FIFO, socket or device)",
                               Location{.file = Join(root_, relname)});
      }
    }
    return Status::OK();
  }

  // Walks the directory `rel` (whose identity is `id`, FileInfo's device and inode;
  // 0 on a store without links): groups its files into samples and recurses into
  // subdirectories. `label` is the class index or -1.
  Status Walk(const std::string& rel, std::pair<uint64_t, uint64_t> id, int32_t label, int depth) {
    if (depth > kMaxDepth)
      return Status::Invalid(fmt::format("directory tree deeper than {} levels", kMaxDepth),
                             Location{.file = Join(root_, rel)});
    if (id.second != 0) {
      for (const auto& a : ancestors_)
        if (a == id)
          return Status::Invalid("directory loop: this directory (reached through a symlink) is its own ancestor",
                                 Location{.file = Join(root_, rel)});
    }
    ancestors_.push_back(id);
    std::vector<DirItem> items;
    Status st = List(rel, &items);
    if (st.ok()) st = AddFiles(rel, items, label);
    for (size_t i = 0; st.ok() && i < items.size(); ++i) {
      const DirItem& it = items[i];
      if (!it.is_dir) continue;
      st = Walk(rel.empty() ? it.name : rel + "/" + it.name, {it.device, it.inode}, label, depth + 1);
    }
    ancestors_.pop_back();
    return st;
  }

  // Groups the files of one directory into samples. Keys of different
  // directories differ, so grouping per directory is exact.
  Status AddFiles(const std::string& rel, const std::vector<DirItem>& items, int32_t label) {
    struct Local {
      const DirItem* item;
      size_t dot;
      std::string ext;
    };
    std::vector<Local> loc;
    for (const auto& it : items) {
      if (it.is_dir) continue;
      // Split rule: classes layout at the last dot (one image file = one sample,
      // whatever dots its name holds, as torchvision does); flat layout at the
      // first dot (as WebDataset does with member names).
      size_t dot = classes_ ? it.name.rfind('.') : it.name.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == it.name.size()) {
        std::string p = Join(root_, rel.empty() ? it.name : rel + "/" + it.name);
        if (skipped_ == 0 || p < skipped_example_) skipped_example_ = p;
        ++skipped_;
        continue;
      }
      loc.push_back({&it, dot, paths::Lower(std::string_view(it.name).substr(dot + 1))});
    }
    if (images_only_ && classes_) {
      // A sample is an image file with what shares its stem (a .cls, a caption): the
      // rest are not samples, as torchvision's ImageFolder does not take them.
      std::set<std::string_view> with_image;
      for (const Local& l : loc)
        if (IsImageExt(l.ext)) with_image.insert(std::string_view(l.item->name).substr(0, l.dot));
      std::vector<Local> kept;
      for (Local& l : loc) {
        if (with_image.count(std::string_view(l.item->name).substr(0, l.dot))) {
          kept.push_back(std::move(l));
          continue;
        }
        ++non_image_;
        NoteNonImage(Join(root_, rel.empty() ? l.item->name : rel + "/" + l.item->name));
      }
      loc = std::move(kept);
    }
    if (loc.empty()) return Status::OK();
    std::sort(loc.begin(), loc.end(), [](const Local& a, const Local& b) {
      std::string_view sa = std::string_view(a.item->name).substr(0, a.dot);
      std::string_view sb = std::string_view(b.item->name).substr(0, b.dot);
      if (sa != sb) return sa < sb;
      if (a.ext != b.ext) return a.ext < b.ext;
      return a.item->name < b.item->name;
    });
    uint32_t dir = uint32_t(idx_.dirs.size());
    idx_.dirs.push_back(rel);
    for (size_t i = 0; i < loc.size(); ++i) {
      const Local& l = loc[i];
      std::string_view stem = std::string_view(l.item->name).substr(0, l.dot);
      bool same_key = i > 0 && std::string_view(loc[i - 1].item->name).substr(0, loc[i - 1].dot) == stem;
      std::string key = rel.empty() ? std::string(stem) : rel + "/" + std::string(stem);
      if (same_key && loc[i - 1].ext == l.ext) {
        std::string a = Join(root_, rel.empty() ? loc[i - 1].item->name : rel + "/" + loc[i - 1].item->name);
        std::string b = Join(root_, rel.empty() ? l.item->name : rel + "/" + l.item->name);
        return Status::Invalid(
            fmt::format("two files for field '{}' of one sample: '{}' and '{}' (extensions are matched "
                        "case-insensitively; rename or remove one)",
                        l.ext, a, b),
            Location{.file = b, .key = key});
      }
      if (!same_key) idx_.entries.push_back(Entry{idx_.files.size(), 0, dir, label});
      FileRec f;
      f.name_off = idx_.names.size();
      f.name_len = uint32_t(l.item->name.size());
      f.stem_len = uint32_t(l.dot);
      f.size = l.item->size;
      idx_.names += l.item->name;
      idx_.files.push_back(f);
      idx_.entries.back().nfiles++;
      total_bytes_ += f.size;
      fields_.insert(l.ext);
    }
    return Status::OK();
  }

  static constexpr size_t kExamples = 3;
  void NoteNonImage(std::string path) {
    non_image_examples_.push_back(std::move(path));
    std::sort(non_image_examples_.begin(), non_image_examples_.end());
    if (non_image_examples_.size() > kExamples) non_image_examples_.pop_back();
  }

  // Appends another walker's fragment (for the parallel class walk).
  void Merge(Walker&& o) {
    non_image_ += o.non_image_;
    for (auto& p : o.non_image_examples_) NoteNonImage(std::move(p));
    uint64_t name_base = idx_.names.size(), file_base = idx_.files.size();
    uint32_t dir_base = uint32_t(idx_.dirs.size());
    idx_.names += o.idx_.names;
    for (auto& f : o.idx_.files) {
      f.name_off += name_base;
      idx_.files.push_back(f);
    }
    for (auto& d : o.idx_.dirs) idx_.dirs.push_back(std::move(d));
    for (auto& e : o.idx_.entries) {
      e.first_file += file_base;
      e.dir += dir_base;
      idx_.entries.push_back(e);
    }
    total_bytes_ += o.total_bytes_;
    fields_.merge(o.fields_);
    if (o.skipped_ > 0 && (skipped_ == 0 || o.skipped_example_ < skipped_example_)) skipped_example_ = o.skipped_example_;
    skipped_ += o.skipped_;
    o.idx_ = Index();
  }

  std::string root_;
  bool classes_;
  std::shared_ptr<FileSystem> fs_;
  std::vector<std::pair<uint64_t, uint64_t>> ancestors_;
  Index idx_;
  uint64_t total_bytes_ = 0;
  std::set<std::string> fields_;
  uint64_t skipped_ = 0;
  std::string skipped_example_;
  // Classes layout, images only (folder.files=images, the default): files of a sample
  // without an image file (Thumbs.db, notes.txt) are left out and counted here.
  bool images_only_ = true;
  uint64_t non_image_ = 0;
  std::vector<std::string> non_image_examples_;  // the first few, sorted
};

// Byte-order comparison of two keys given as (dir, stem) without building them.
int CompareKeys(std::string_view da, std::string_view sa, std::string_view db, std::string_view sb) {
  std::string_view a[3] = {da, da.empty() ? "" : "/", sa};
  std::string_view b[3] = {db, db.empty() ? "" : "/", sb};
  size_t ai = 0, ao = 0, bi = 0, bo = 0;
  for (;;) {
    while (ai < 3 && ao >= a[ai].size()) ++ai, ao = 0;
    while (bi < 3 && bo >= b[bi].size()) ++bi, bo = 0;
    if (ai == 3 || bi == 3) return (ai == 3 ? 0 : 1) - (bi == 3 ? 0 : 1);
    size_t n = std::min(a[ai].size() - ao, b[bi].size() - bo);
    int c = std::memcmp(a[ai].data() + ao, b[bi].data() + bo, n);
    if (c != 0) return c;
    ao += n;
    bo += n;
  }
}

// What the marker records: the layout, the channel order of decoded arrays
// ("bgr", "rgb" or "" when it records none) and the transform applied at conversion
// (its JSON object as text, or "").
struct Marker {
  Layout layout = Layout::kUnknown;
  std::string channel_order;
  std::string transform;
  std::string path;  // empty when there is no marker
};

Result<Marker> ReadMarker(const std::string& root) {
  Marker m;
  std::string path = Join(root, kMarker);
  if (!io::Exists(path)) return m;
  m.path = path;
  SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(path));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("layout") || !j["layout"].is_string())
    return Status::Corrupt("bad layout marker: expected {\"layout\": \"flat\"} or {\"layout\": \"classes\"}",
                           Location{.file = path});
  std::string l = j["layout"].get<std::string>();
  if (l == "flat") m.layout = Layout::kFlat;
  else if (l == "classes") m.layout = Layout::kClasses;
  else return Status::Corrupt(fmt::format("bad layout marker: unknown layout '{}'", l), Location{.file = path});
  if (auto co = j.find("channel_order"); co != j.end()) {
    if (!co->is_string() || (*co != "bgr" && *co != "rgb"))
      return Status::Corrupt("bad layout marker: channel_order is not \"bgr\" or \"rgb\"", Location{.file = path});
    m.channel_order = co->get<std::string>();
  }
  if (auto t = j.find("transform"); t != j.end()) {
    if (!t->is_object())
      return Status::Corrupt("bad layout marker: transform is not a JSON object", Location{.file = path});
    m.transform = t->dump();
  }
  return m;
}

class FolderDataset : public Dataset {
 public:
  FolderDataset(std::shared_ptr<const Index> idx, DatasetInfo info) : idx_(std::move(idx)), info_(std::move(info)) {}
  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override;
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override;

 private:
  std::shared_ptr<const Index> idx_;
  DatasetInfo info_;
};

Status ReadWhole(FileSystem& fs, const std::string& path, Bytes* out) {
  auto opened = fs.OpenForRead(path);
  if (!opened.ok()) {
    // Listed when the folder was opened: gone since is an I/O error, not a missing sample.
    if (opened.status().code() == Code::kNotFound)
      return Status::IOError("cannot open: no such file (removed since the folder was opened?)", Location{.file = path});
    return std::move(opened).take_status();
  }
  const ReadableFile& f = **opened;
  size_t n = size_t(f.size());
  if (n == 0) {
    *out = Bytes();
    return Status::OK();
  }
  std::shared_ptr<uint8_t[]> buf(new uint8_t[n]);
  SK_ASSIGN_OR_RETURN(size_t got, f.ReadAt(0, n, buf.get()));
  if (got != n)
    return Status::IOError(fmt::format("file shrank while being read ({} of {} bytes)", got, n),
                           Location{.file = path, .offset = int64_t(got)});
  const uint8_t* p = buf.get();
  *out = Bytes(std::shared_ptr<const void>(buf, p), p, n);
  return Status::OK();
}

// Whether `b` starts as an image file of a kind IsImageExt names does: JPEG, PNG, GIF,
// BMP, WebP, AVIF, JPEG XL, TIFF or PNM (P1..P7). The name's extension may name another
// of them (a PNG named .JPEG is an image).
bool LooksLikeImage(const Bytes& b) {
  const auto* p = b.data();
  const size_t n = b.size();
  auto starts = [&](std::string_view m) { return n >= m.size() && std::memcmp(p, m.data(), m.size()) == 0; };
  if (starts("\xFF\xD8\xFF") || starts("\x89PNG") || starts("GIF8") || starts("BM") || starts("II*") ||
      starts(std::string_view("MM\0*", 4)))
    return true;
  if (paths::SniffImageExt(p, n) != "bin") return true;  // also WebP, AVIF, JPEG XL
  return n >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7';
}

// An image file of a class folder that is empty or holds no image: kCorrupt naming it.
Status CheckImageBytes(const Bytes& b, const std::string& path, const std::string& key, uint64_t i) {
  Location at{.file = path, .key = key, .index = int64_t(i)};
  if (b.size() == 0)
    return Status::Corrupt("empty image file (0 bytes); remove it, or read the folder with --source-option "
                           "folder.files=all to take every file as it is",
                           at);
  if (LooksLikeImage(b)) return Status::OK();
  std::string head;
  for (size_t k = 0; k < std::min<size_t>(8, b.size()); ++k) head += fmt::format("{}{:02x}", k ? " " : "", b.data()[k]);
  return Status::Corrupt(fmt::format("not an image file: its bytes start {} (no JPEG, PNG, GIF, BMP, WebP, AVIF, JPEG XL, "
                                     "TIFF or PNM signature); remove it, or read the folder with --source-option "
                                     "folder.files=all to take every file as it is",
                                     head),
                         at);
}

Status GetSample(const Index& idx, uint64_t i, Sample* out) {
  if (i >= idx.entries.size())
    return Status::Invalid(fmt::format("sample index {} out of range [0, {})", i, idx.entries.size()),
                           Location{.file = idx.root, .index = int64_t(i)});
  const Entry& e = idx.entries[i];
  out->clear();
  out->key = idx.Key(e);
  out->fields.reserve(e.nfiles + 1);
  for (uint64_t k = e.first_file; k < e.first_file + e.nfiles; ++k) {
    const FileRec& f = idx.files[k];
    std::string_view suffix = idx.Suffix(f);
    std::string ext = paths::Lower(suffix);
    if (idx.classes && ext == "cls") continue;  // implied by the folder (checked at Open)
    Bytes b;
    Status st = ReadWhole(*idx.fs, idx.Path(e, f), &b);
    if (!st.ok()) return st.At(Location{.key = out->key, .index = int64_t(i)});
    if (idx.check_images && IsImageExt(ext)) SK_RETURN_IF_ERROR(CheckImageBytes(b, idx.Path(e, f), out->key, i));
    std::string source_ext = suffix == ext ? std::string() : std::string(suffix);
    out->fields.push_back(Field{std::move(ext), std::move(b), std::move(source_ext)});  // files are sorted by ext
  }
  if (e.label >= 0) out->set_label(e.label);
  return Status::OK();
}

class FolderAccess : public RandomAccess {
 public:
  explicit FolderAccess(std::shared_ptr<const Index> idx) : idx_(std::move(idx)) {}
  uint64_t size() const override { return idx_->entries.size(); }
  Status Get(uint64_t index, Sample* out) const override { return GetSample(*idx_, index, out); }

 private:
  std::shared_ptr<const Index> idx_;
};

class FolderReader : public SampleReader {
 public:
  explicit FolderReader(std::shared_ptr<const Index> idx) : idx_(std::move(idx)) {}
  Result<bool> Next(Sample* out) override {
    if (next_ >= idx_->entries.size()) return false;
    SK_RETURN_IF_ERROR(GetSample(*idx_, next_, out));
    ++next_;
    return true;
  }

 private:
  std::shared_ptr<const Index> idx_;
  uint64_t next_ = 0;
};

Result<std::unique_ptr<SampleReader>> FolderDataset::NewReader() const {
  return std::unique_ptr<SampleReader>(new FolderReader(idx_));
}
Result<std::shared_ptr<RandomAccess>> FolderDataset::NewRandomAccess() const {
  return std::shared_ptr<RandomAccess>(new FolderAccess(idx_));
}

Result<std::unique_ptr<Dataset>> OpenFolder(const std::string& path_in, const OpenOptions& opts) {
  std::string root = paths::StripTrailingSlashes(path_in);
  SK_ASSIGN_OR_RETURN(std::shared_ptr<FileSystem> fs, io::FileSystemOf(root, opts.filesystem));
  SK_ASSIGN_OR_RETURN(FileInfo root_info, fs->Stat(root));
  if (root_info.type == FileType::kNotFound) return Status::NotFound("no such directory", Location{.file = root});
  if (root_info.type != FileType::kDirectory)
    return Status::Invalid("not a directory (an image folder must be a directory)", Location{.file = root});

  auto marker = ReadMarker(root);
  if (!marker.ok()) return std::move(marker).take_status();
  Walker w(root, false, fs);
  std::vector<DirItem> top;
  SK_RETURN_IF_ERROR(w.List("", &top));
  Layout layout = marker->layout;
  if (layout == Layout::kUnknown) {
    bool any_dir = false, any_image = false;
    for (const auto& it : top) {
      if (it.is_dir) any_dir = true;
      else if (IsImageName(it.name)) any_image = true;
    }
    layout = (any_dir && !any_image) ? Layout::kClasses : Layout::kFlat;
  }
  bool classes = layout == Layout::kClasses;
  // folder.files: "images" (the default) takes, in the classes layout, samples with an
  // image file only, and checks each image file's first bytes when read (a zero-byte or
  // non-image .jpg is an error naming it); "all" takes every file as it is (folders of
  // mixed samples). The flat layout always takes every file.
  bool images_only = true;
  if (auto it = opts.format_options.find("folder.files"); it != opts.format_options.end()) {
    if (it->second != "images" && it->second != "all")
      return Status::Invalid(fmt::format("folder.files: '{}' is not 'images' or 'all'", it->second),
                             Location{.file = root});
    images_only = it->second == "images";
  }

  std::vector<std::string> class_names;
  uint64_t ignored_root = 0;
  std::string ignored_example;
  if (classes) {
    w = Walker(root, true, fs);
    std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> dirs;
    for (const auto& it : top) {
      if (it.is_dir) {
        dirs.push_back({it.name, {it.device, it.inode}});
      } else {  // files beside class folders are not samples (torchvision ignores them)
        if (ignored_example.empty() || it.name < ignored_example) ignored_example = it.name;
        ++ignored_root;
      }
    }
    std::sort(dirs.begin(), dirs.end());
    std::vector<std::pair<uint64_t, uint64_t>> class_ids;
    for (auto& [name, id] : dirs) class_names.push_back(name), class_ids.push_back(id);
    if (class_names.size() > size_t(INT32_MAX))
      return Status::Unsupported("too many class folders", Location{.file = root});
    // One walker per class folder, in parallel (a directory walk of ImageNet is
    // 1.28M stat calls); fragments and the first error are taken in class order.
    size_t nc = class_names.size();
    std::vector<Walker> ws(nc, Walker(root, true, fs));
    for (auto& cw : ws) cw.images_only_ = images_only;
    std::vector<Status> errs(nc);
    tbb::parallel_for(tbb::blocked_range<size_t>(0, nc, 1), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t c = r.begin(); c < r.end(); ++c) {
        ws[c].ancestors_.emplace_back(root_info.device, root_info.inode);
        errs[c] = ws[c].Walk(class_names[c], class_ids[c], int32_t(c), 1);
      }
    });
    for (size_t c = 0; c < nc; ++c) SK_RETURN_IF_ERROR(errs[c]);
    for (size_t c = 0; c < nc; ++c) w.Merge(std::move(ws[c]));
  } else {
    SK_RETURN_IF_ERROR(w.Walk("", {root_info.device, root_info.inode}, -1, 0));
  }

  auto idx = std::make_shared<Index>(std::move(w.idx_));
  idx->root = root;
  idx->fs = fs;
  idx->classes = classes;
  idx->check_images = classes && images_only;
  idx->class_names = class_names;
  // Order: samples sorted by key in byte order.
  {
    const Index& x = *idx;
    std::vector<uint64_t> order(x.entries.size());
    for (uint64_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
      const Entry& ea = x.entries[a];
      const Entry& eb = x.entries[b];
      return CompareKeys(x.dirs[ea.dir], x.Stem(x.files[ea.first_file]), x.dirs[eb.dir],
                         x.Stem(x.files[eb.first_file])) < 0;
    });
    std::vector<Entry> sorted(order.size());
    for (uint64_t i = 0; i < order.size(); ++i) sorted[i] = x.entries[order[i]];
    idx->entries = std::move(sorted);
  }

  // Classes layout: a cls sidecar must agree with the folder's label.
  if (classes) {
    for (const Entry& e : idx->entries) {
      for (uint64_t k = e.first_file; k < e.first_file + e.nfiles; ++k) {
        const FileRec& f = idx->files[k];
        if (paths::Lower(idx->Suffix(f)) != "cls") continue;
        std::string path = idx->Path(e, f);
        auto text = io::ReadFile(path);
        if (!text.ok()) return std::move(text).take_status().At(Location{.key = idx->Key(e)});
        auto v = ParseLabel(*text);
        if (!v)
          return Status::Corrupt("cls file does not hold an ASCII decimal label",
                                 Location{.file = path, .key = idx->Key(e)});
        if (*v != e.label)
          return Status::Corrupt(
              fmt::format("label conflict: the class folder '{}' gives label {} but the cls file says {}",
                          idx->class_names[size_t(e.label)], e.label, *v),
              Location{.file = path, .key = idx->Key(e)});
      }
    }
    if (!idx->entries.empty()) w.fields_.insert("cls");
  }

  DatasetInfo info;
  info.format = "folder";
  info.address = path_in;
  info.num_samples = idx->entries.size();
  info.class_names = idx->class_names;
  info.fields.assign(w.fields_.begin(), w.fields_.end());
  info.total_bytes = w.total_bytes_;
  info.shards.push_back(ShardInfo{root, idx->entries.size(), info.total_bytes, ""});
  info.extra["layout"] = classes ? "classes" : "flat";
  info.sample_checksums = SampleChecksums::kNoMetadata;
  info.file_per_sample = true;
  if (w.skipped_ > 0) {
    info.extra["skipped_files"] = std::to_string(w.skipped_);
    info.extra["skipped_example"] = w.skipped_example_;
  }
  if (w.non_image_ > 0) {
    std::string ex;
    for (const auto& p : w.non_image_examples_) ex += (ex.empty() ? "" : ", ") + p;
    info.extra["non_image_files"] = std::to_string(w.non_image_);
    info.extra["non_image_examples"] = ex;
  }
  if (ignored_root > 0) {
    info.extra["ignored_root_files"] = std::to_string(ignored_root);
    info.extra["ignored_root_example"] = Join(root, ignored_example);
  }
  if (!marker->transform.empty()) info.extra["transform"] = marker->transform;  // as the marker records it
  // Decoded arrays: the order the marker records, or folder.channels.
  SK_ASSIGN_OR_RETURN(bool to_rgb, ApplyChannelOrder(marker->channel_order, marker->path.empty() ? root : marker->path,
                                                     "folder.channels", opts, &info));
  auto ds = std::make_unique<FolderDataset>(std::move(idx), info);
  if (to_rgb) return WithBgrToRgb(std::move(ds), std::move(info));
  return std::unique_ptr<Dataset>(std::move(ds));
}

// ---------------------------------------------------------------- writing

// Checks a name used as one path component (a class folder).
Status CheckComponent(std::string_view name, std::string_view what) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos)
    return Status::Invalid(fmt::format("{} '{}' is not a valid directory name", what, name));
  if (name[0] == '.')
    return Status::Invalid(fmt::format("{} '{}' starts with '.': it would be hidden and ignored when read back", what, name));
  return Status::OK();
}

// Writes below a staging directory "<root>.partial-PID-XXXXXX" beside the
// output, through the storage seam (WriteOptions::filesystem), and publishes it
// with one FileSystem::Publish at Finish().
class FolderWriter : public SampleWriter {
 public:
  static Result<std::unique_ptr<SampleWriter>> Make(const std::string& path_in, const WriteOptions& opts) {
    std::string root = paths::StripTrailingSlashes(path_in);
    if (root.empty() || root == "/" || root == "." || root == "..")
      return Status::Invalid("refusing to write an image folder over this path", Location{.file = path_in});
    for (const auto& c : opts.class_names) SK_RETURN_IF_ERROR(CheckComponent(c, "class name"));
    for (size_t i = 1; i < opts.class_names.size(); ++i)
      if (!(opts.class_names[i - 1] < opts.class_names[i]))
        return Status::Invalid(fmt::format(
            "class names must be unique and sorted in byte order for an image folder, because a folder's "
            "labels are the sorted class folder indexes ('{}' comes before '{}')",
            opts.class_names[i - 1], opts.class_names[i]));
    std::shared_ptr<FileSystem> fs = FileSystem::OrLocal(opts.filesystem);
    SK_ASSIGN_OR_RETURN(std::string partial, io::StageOutputDirectory(*fs, root, opts.overwrite));
    std::unique_ptr<FolderWriter> w(new FolderWriter());
    w->fs_ = std::move(fs);
    w->root_ = root;
    w->partial_ = partial;
    w->opts_ = opts;
    return std::unique_ptr<SampleWriter>(std::move(w));
  }

  ~FolderWriter() override {
    if (!finished_ && !partial_.empty()) (void)fs_->RemoveAll(partial_);
  }

  Status Write(const Sample& s) override {
    if (finished_) return Status::Invalid("Write() after Finish()", Location{.file = root_, .key = s.key});
    if (broken_) return Status::Invalid("the writer failed earlier; start again", Location{.file = root_, .key = s.key});
    Location at{.file = root_, .key = s.key, .index = int64_t(samples_)};
    SK_RETURN_IF_ERROR(paths::CheckSafeKey(s.key).At(at));
    std::string key = s.key;
    for (size_t start = 0;;) {
      if (key[start] == '.')
        return Status::Invalid("a key path component starts with '.': it would be hidden and ignored when read back", at);
      auto slash = key.find('/', start);
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    bool classes = !opts_.class_names.empty();
    std::string rel;
    if (classes) {
      const Field* cls = s.find("cls");
      if (!cls)
        return Status::Invalid("sample has no label (cls) but class names were given (class folders need a label)", at);
      auto label = s.label();
      if (!label) return Status::Invalid(fmt::format("cls field '{}' is not an ASCII decimal label", cls->data.view()), at);
      if (*label < 0 || uint64_t(*label) >= opts_.class_names.size())
        return Status::Invalid(fmt::format("label {} out of range for {} class names", *label, opts_.class_names.size()), at);
      const std::string& cname = opts_.class_names[size_t(*label)];
      auto slash = key.find('/');
      if (slash != std::string::npos && std::string_view(key).substr(0, slash) == cname) rel = key;
      else rel = cname + "/" + key;
    } else {
      auto last = key.rfind('/');
      size_t base = last == std::string::npos ? 0 : last + 1;
      if (key.find('.', base) != std::string::npos) {
        if (opts_.key_dots == KeyDots::kReplace) {
          std::replace(key.begin() + long(base), key.end(), '.', '_');
        } else {
          return Status::Invalid(
              "key has a dot in its last path component: a flat folder splits file names at the first dot, so it "
              "would read back as a different key (use the key-dots 'replace' option to map dots to '_')",
              at);
        }
      }
      rel = key;
    }
    // Validate every field before writing any file of this sample.
    size_t nfiles = 0;
    for (const auto& f : s.fields) {
      if (classes && f.ext == "cls") continue;
      const std::string& e = f.ext;
      if (e.empty() || e != paths::Lower(e) || e.find('/') != std::string::npos || e.find('\0') != std::string::npos ||
          e.front() == '.' || e.back() == '.' || e.find("..") != std::string::npos)
        return Status::Invalid(fmt::format("field extension '{}' cannot be a file name suffix (must be lowercase, "
                                           "non-empty, without '/' or empty dot parts)", e), at);
      if (classes && e.find('.') != std::string::npos)
        return Status::Invalid(fmt::format("field '{}' has a dot: a class folder splits file names at the last dot, "
                                           "so it would read back as another sample; write a flat folder instead", e),
                               at);
      ++nfiles;
    }
    if (nfiles == 0) return Status::Invalid("sample has no field to write as a file", at);

    // From here on a failure leaves files behind: the writer is then broken.
    Status st = WriteFiles(s, rel, classes, at);
    if (!st.ok()) broken_ = true;
    else ++samples_;
    return st;
  }

  Result<WriteSummary> Finish() override {
    if (finished_) return Status::Invalid("Finish() called twice", Location{.file = root_});
    if (broken_) return Status::Invalid("the writer failed earlier; nothing was published", Location{.file = root_});
    for (const auto& c : opts_.class_names) SK_RETURN_IF_ERROR(MakeDir(c));  // empty classes too
    nlohmann::json mj{{"layout", opts_.class_names.empty() ? "flat" : "classes"}};
    if (arrays_ && !opts_.array_channels.empty()) mj["channel_order"] = opts_.array_channels;
    if (!opts_.transform.empty()) {  // the transform applied at conversion (a JSON object)
      SK_ASSIGN_OR_RETURN(mj["transform"], TransformRecord(opts_.transform, Location{.file = root_}));
    }
    std::string marker = mj.dump() + "\n";
    SK_RETURN_IF_ERROR(WriteNew(Join(partial_, kMarker), marker, Join(partial_, kMarker)));
    SK_RETURN_IF_ERROR(fs_->SyncTree(partial_));
    // Publish: any old output moves aside, the staging directory takes its name.
    SK_RETURN_IF_ERROR(io::CheckDirectoryOutput(*fs_, root_, opts_.overwrite));
    SK_RETURN_IF_ERROR(fs_->Publish(partial_, root_, PublishOptions{.replace = true, .published = &finished_}));
    io::RemoveDebrisOf(root_);  // staging directories of killed writes ("NAME.partial-PID-XXXXXX")
    WriteSummary sum;
    sum.samples = samples_;
    sum.bytes = bytes_;
    sum.shards.push_back(ShardInfo{root_, samples_, bytes_, ""});
    return sum;
  }

 private:
  FolderWriter() = default;


  // Creates (as needed) the directory `rel` below the staging directory, one
  // component at a time, refusing symlinks and files in the way; remembers the
  // last one made.
  Status MakeDir(const std::string& rel) {
    if (rel == dir_rel_) return Status::OK();
    size_t start = 0;
    while (start < rel.size()) {
      auto slash = rel.find('/', start);
      std::string shown = Join(partial_, rel.substr(0, slash));
      SK_ASSIGN_OR_RETURN(FileInfo fi, fs_->Stat(shown));
      if (fi.symlink)
        return Status::Invalid("refusing to write through a symlinked directory inside the output",
                               Location{.file = shown});
      if (fi.type == FileType::kNotFound) {
        Status made = fs_->MakeDirs(shown);
        if (!made.ok()) return Status(made.code(), "cannot create directory: " + made.message(), Location{.file = shown});
      } else if (fi.type != FileType::kDirectory) {
        return Status::Invalid("a file is in the way of a directory (a key is also the directory of another key)",
                               Location{.file = shown});
      }
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    dir_rel_ = rel;
    return Status::OK();
  }

  // Creates the new file `path` (never replacing one) with `data`.
  Status WriteNew(const std::string& path, std::string_view data, const std::string& shown) {
    auto f = fs_->NewWritableFile(path, CreateMode::kExclusive);
    if (!f.ok()) {
      Status st = std::move(f).take_status();
      if (st.code() == Code::kAlreadyExists)
        return Status::Exists("file written twice (two samples with the same key, or keys that map to the same file)",
                              Location{.file = shown});
      st.where().file = shown;
      return st;
    }
    Status st = (*f)->Append(data);
    if (st.ok()) st = (*f)->Close();
    if (!st.ok()) st.where().file = shown;
    return st;
  }

  Status WriteFiles(const Sample& s, const std::string& rel, bool classes, const Location& at) {
    auto slash = rel.rfind('/');
    std::string dir = slash == std::string::npos ? "" : rel.substr(0, slash);
    std::string base = slash == std::string::npos ? rel : rel.substr(slash + 1);
    SK_RETURN_IF_ERROR(MakeDir(dir));
    std::string staged_dir = dir.empty() ? partial_ : Join(partial_, dir);
    for (const auto& f : s.fields) {
      if (classes && f.ext == "cls") continue;
      std::string name = base + "." + f.ext;
      std::string shown = Join(root_, dir.empty() ? name : dir + "/" + name);
      Status st = WriteNew(Join(staged_dir, name), f.data.view(), shown);
      if (!st.ok()) return st.At(at);
      bytes_ += f.data.size();
      if (f.ext == "npy") arrays_ = true;
    }
    return Status::OK();
  }

  std::shared_ptr<FileSystem> fs_;
  std::string root_, partial_;
  WriteOptions opts_;
  std::string dir_rel_ = "\n";  // no directory made yet ("" is the staging directory itself)
  uint64_t samples_ = 0, bytes_ = 0;
  bool finished_ = false, broken_ = false;
  bool arrays_ = false;  // a sample had a decoded array ("npy"): the marker records their order
};

int BidRead(const std::string& path) {
  // An address is bid on by its form (no request per bid): one ending in '/' names a folder.
  if (io::IsUrl(path)) return path.ends_with("/") ? 50 : 0;
  std::string p = paths::StripTrailingSlashes(path);
  if (!io::IsDir(p)) return 0;
  return 50;  // any directory; a format that verifies its content in one (LMDB) bids higher
}

int BidWrite(const std::string& path) {
  std::string p = paths::StripTrailingSlashes(path);
  std::string_view base = paths::BaseName(p);
  auto dot = base.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return 10;
  // A name another format claims (x.tar, x.lmdb, x.h5) is never an image folder.
  std::string ext = paths::Lower(base.substr(dot + 1));
  return ClaimedByAnother(ext, *Find("folder")) ? 0 : 10;
}

}  // namespace

Format FolderFormat() {
  return Format{
      .name = "folder",
      .description = "image folder: class subfolders (torchvision ImageFolder) or flat files key.ext",
      .bid_read = BidRead,
      .bid_write = BidWrite,
      .open = OpenFolder,
      .create = FolderWriter::Make,
      .read_options = {
          {"files", "images", {"images", "all"},
           "class folders: take image files only, refusing a .jpg that is no image (images), or every file as "
           "it is (all)"},
          ChannelsReadOption(),
      },
  };
}

}  // namespace shardkit::formats
