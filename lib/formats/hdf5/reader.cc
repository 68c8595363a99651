// formats/hdf5/reader.cc: the hdf5 Dataset (the read rules: format.cc's header comment).
#include "formats/hdf5/internal.h"
#include "formats/hdf5/vlen_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "core/per_thread.h"
#include "formats/hdf5/arrays.h"
#include "formats/transform_record.h"

namespace shardkit::formats::hdf5 {

namespace {



struct Payload {
  std::string ext;
  uint64_t addr = 0;  // file offset of data[0]
  std::vector<uint64_t> offsets;
};

// A dataset of a third-party file read through HDF5.
struct TpField {
  std::string name;  // dataset name in the file
  std::string ext;   // "" = sniff per sample
  enum Kind { kVlenU8, kVlenStr, kFixedStr, kInt, kArray } kind = kVlenU8;
  // kVlenU8 with a `shapes` dataset beside it (variable-size decoded images stored
  // flattened as vlen uint8, h5py's advice): element i is an array of shape shapes[i]
  // ([H, W] or [H, W, C]), field "npy". Empty = plain bytes.
  std::vector<std::vector<uint64_t>> shapes;
  Hid dset;
  Hid mtype;                  // memory type for element reads
  size_t fixed_size = 0;      // kFixedStr
  std::vector<int64_t> ints;  // kInt: whole dataset in memory
  // kArray (formats/hdf5/arrays.h): a decoded image per element, field "npy".
  std::vector<uint64_t> dims;
  pickle::DType dt;
  bool nchw = false;
  // kArray read from the file's mapping, without libhdf5 and its lock (Hdf5Data::PlanDirect):
  // unfiltered storage whose element type is the one read. kChunked needs chunks of whole
  // elements ([k, dims[1..]]); a chunk's address is looked up once, under the lock.
  enum Direct { kNone, kContiguous, kChunked } direct = kNone;
  uint64_t elem_bytes = 0;
  uint64_t addr = 0;     // kContiguous: file offset of element 0
  uint64_t chunk_n = 0;  // kChunked: elements per chunk
  static constexpr uint64_t kNoChunk = ~uint64_t(0);  // not allocated (fill values): read through HDF5
  std::unique_ptr<std::atomic<uint64_t>[]> chunk_addr;  // file offset per chunk; 0 = not looked up yet
};

// State shared by a Dataset, its readers and random-access handles.
class Hdf5Data {
 public:
  ~Hdf5Data() {
    H5Lock lock;
    tp_.clear();
    file_.reset();
  }

  Status Open(const std::string& path, const OpenOptions& opts);
  Status Get(uint64_t i, Sample* out) const;

  DatasetInfo info;
  uint64_t n = 0;
  std::vector<uint64_t> checksums;  // dataset 'checksums' of our layout, else empty

 private:
  Status OpenShardkit(hid_t file, uint64_t file_size);
  Status OpenMapped(hid_t file, const std::map<std::string, std::string>& map, bool nchw);
  // The `shapes` dataset [N, 2] or [N, 3] of variable-size decoded images in `images`.
  Status ReadShapes(hid_t file, TpField* images);
  // Decoded images written by shardkit (option hdf5.arrays "native"): `keys`, the
  // root's shardkit_format_version (then a label < 0 means "none") and class_names, and
  // the `images` attribute channel_order. Lock held.
  Status ReadNativeExtras(hid_t file, bool has_keys, const OpenOptions& opts);
  // The root attribute transform of a shardkit-written file (WriteOptions::transform:
  // one string, a JSON object) into info.extra["transform"]. Lock held.
  Status ReadTransform(hid_t file);
  // OpenOptions::format_options["hdf5.channels"] = "bgr-to-rgb": channels 0 and 2 of
  // 3- and 4-channel arrays swapped on read (in the .npy copy just made).
  Status SwapChannels(const pickle::NdArray& a, Bytes* npy, const Location& at) const;
  bool swap_bgr_ = false;
  bool vlen_shapes_ = false;  // the default map found `images` + `shapes`
  bool negative_label_none_ = false;  // a label < 0 gives no cls (shardkit-written files)
  Status Corrupt(const std::string& dataset, const std::string& what) const {
    return Status::Corrupt(fmt::format("dataset '{}': {}", dataset, what), Location{.file = path_});
  }
  Result<Hid> OpenDataset(hid_t parent, const std::string& name, const std::string& full) const;
  Status CheckHeaderAt(uint64_t addr, const std::string& what, size_t sa, size_t ss) const;
  Status CheckLinkTarget(hid_t parent, const std::string& name, const std::string& full) const;
  Status CheckRootHeader();
  std::string SymbolTableProblem(uint64_t btree_rel, uint64_t heap_rel, size_t sa, size_t ss) const;
  Status ReadInts(hid_t d, const std::string& name, uint64_t expect, bool is_unsigned, void* out) const;
  Result<std::vector<std::string>> ReadStrings(hid_t obj, bool is_attr, const std::string& name) const;
  // locked: the caller holds H5Lock (always, unless lock_free_).
  Status GetTp(uint64_t i, Sample* out, bool locked = true) const;
  void PlanDirect(TpField& f) const;
  Result<pickle::NdArray> ReadDirect(const TpField& f, uint64_t i, bool locked) const;

  // A crafted file can declare far more elements than it stores (chunks left
  // unallocated read as fill values); refuse such counts before allocating.
  Status CheckCount(const std::string& dataset, uint64_t count) const {
    if (count / 64 > file_size_)
      return Corrupt(dataset, fmt::format("declares {} elements in a file of {} bytes", count, file_size_));
    return Status::OK();
  }

  // Checks the vlen descriptors of the next read (see VlenCheck). Lock held.
  VlenCheck NewVlenCheck(uint64_t first_index) const {
    return VlenCheck(map_->data(), map_->size(), userblock_, sizeof_size_, first_index);
  }
  // The error for a failed vlen read: the check's refusal, else HDF5's message.
  // index: the sample read, or -1; is_sample: the dataset's elements are samples.
  Status VlenReadError(const std::string& name, const VlenCheck& check, int64_t index, bool is_sample = true) const {
    if (check.refusal.empty()) {
      Location at{.file = path_};
      if (index >= 0) at.index = index;
      return Status::Corrupt(fmt::format("dataset '{}': cannot read: {}", name, H5Message()), at);
    }
    H5Eclear2(H5E_DEFAULT);
    Location at{.file = path_};
    if (check.refused_index >= 0 && is_sample) at.index = check.refused_index;
    return Status::Corrupt(fmt::format("dataset '{}': element {} {}: refused before reading", name,
                                       check.refused_index, check.refusal),
                           at);
  }

  std::string path_;
  uint64_t file_size_ = 0;
  uint64_t userblock_ = 0;    // HDF5 addresses are relative to its end
  size_t sizeof_size_ = 8;    // bytes of a length in the file's metadata
  size_t sizeof_addr_ = 8;    // bytes of an address in the file's metadata
  uint64_t sym_leaf_k_ = 0;      // symbol-table K values of a version 0/1 superblock (0: not known)
  uint64_t sym_internal_k_ = 0;
  bool shardkit_ = false;
  bool lock_free_ = false;  // every third-party field is in memory or read directly (PlanDirect)
  // The "keys" dataset's strings into key_blob_ / key_end_; an empty key is kCorrupt.
  Status KeepKeys(const std::vector<std::string>& keys) {
    key_end_.reserve(keys.size() + 1);
    key_end_.push_back(0);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].empty())
        return Status::Corrupt("dataset 'keys': empty key", Location{.file = path_, .index = int64_t(i)});
      key_blob_ += keys[i];
      key_end_.push_back(key_blob_.size());
    }
    return Status::OK();
  }
  // Our layout.
  std::string key_blob_;
  std::vector<uint64_t> key_end_;
  std::vector<int64_t> labels_;
  std::vector<Payload> payloads_;
  std::shared_ptr<io::MappedFile> map_;
  std::shared_ptr<void> local_copy_;  // a remote file's local copy (io::LocalCopy), while open
  std::unique_ptr<core::PerThreadViewOwner> view_owner_;  // owner of Get()'s views (core/per_thread.h)
  // Third-party layout (the HDF5 file stays open).
  Hid file_;
  std::vector<TpField> tp_;
};

herr_t RefuseElink(const char* parent_file, const char* parent_group, const char* child_file,
                   const char* child_object, unsigned*, hid_t, void*) {
  (void)parent_file, (void)parent_group, (void)child_file, (void)child_object;
  return -1;  // never traverse an external link
}

struct LinkList {
  std::vector<std::pair<std::string, H5L_type_t>> links;
};

herr_t CollectLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  static_cast<LinkList*>(data)->links.emplace_back(name, info->type);
  return 0;
}

// Lists a group's links; an external link is refused. Lock held.
Result<LinkList> ListLinks(hid_t group, const std::string& gname, const std::string& path) {
  LinkList l;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, CollectLink, &l) < 0)
    return Status::Corrupt(fmt::format("cannot list group '{}': {}", gname, H5Message()), Location{.file = path});
  for (auto& [name, type] : l.links) {
    if (type == H5L_TYPE_EXTERNAL)
      return Status::Unsupported(
          fmt::format("external link '{}{}' refused: shardkit reads only self-contained HDF5 files",
                      gname == "/" ? "/" : gname + "/", name),
          Location{.file = path});
    if (type != H5L_TYPE_HARD && type != H5L_TYPE_SOFT)
      return Status::Unsupported(fmt::format("user-defined link '{}/{}' refused", gname, name),
                                 Location{.file = path});
  }
  return l;
}

// libhdf5 1.10 allocates an object header's first chunk with the size its
// prefix declares before checking it against the file (fuzz finding: 3.5 GB
// for the root group). Every header shardkit makes libhdf5 load is checked
// here first: a version 1 or 2 prefix whose first chunk lies inside the file.
Status Hdf5Data::CheckHeaderAt(uint64_t addr, const std::string& what, size_t sa, size_t ss) const {
  const uint8_t* f = map_->data();
  uint64_t size = map_->size();
  auto bad = [&](std::string why) {
    return Status::Corrupt(fmt::format("{}: object header at {} {}", what, addr, why),
                           Location{.file = path_, .offset = int64_t(std::min<uint64_t>(addr, INT64_MAX))});
  };
  if (addr >= size || size - addr < 16) return bad("lies outside the file");
  const uint8_t* p = f + addr;
  uint64_t left = size - addr, chunk = 0, prefix = 0;
  if (p[0] == 1) {  // version 1: version, reserved, messages (2), refcount (4), chunk size (4), padding (4)
    chunk = Le(p + 8, 4);
    prefix = 16;
  } else if (std::memcmp(p, "OHDR", 4) == 0 && p[4] == 2) {
    uint8_t flags = p[5];
    prefix = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    size_t width = size_t(1) << (flags & 3);
    if (left < prefix + width) return bad("is cut off by the end of the file");
    chunk = Le(p + prefix, width);
    prefix += width + 4;  // and the checksum after the chunk
  } else {
    return bad("is not an object header");
  }
  if (chunk > left || prefix > left - chunk)
    return bad(fmt::format("declares {} bytes, past the end of the file ({} bytes)", chunk, size));
  // Continuation messages (type 0x10: address, length) name further chunks,
  // which libhdf5 also allocates by their declared length: walk them all.
  bool v1 = p[0] == 1;
  uint8_t hflags = v1 ? 0 : p[5];
  struct Chunk {
    uint64_t begin, end;  // absolute byte range of its messages
  };
  std::vector<Chunk> todo{{addr + (v1 ? 16 : prefix - 4), addr + (v1 ? 16 : prefix - 4) + chunk}};
  const size_t mh = v1 ? 8 : 4 + ((hflags & 0x04) ? 2 : 0);  // message header
  for (size_t k = 0; k < todo.size() && k < 4096; ++k) {
    for (uint64_t q = todo[k].begin; q + mh <= todo[k].end;) {
      const uint8_t* m = f + q;
      uint64_t type = v1 ? Le(m, 2) : m[0];
      uint64_t msize = v1 ? Le(m + 2, 2) : Le(m + 1, 2);
      if (msize > todo[k].end - q - mh) break;  // libhdf5 refuses the header itself
      if (type == 0x11) {  // symbol table: v1 B-tree and local heap of an old-style group
        if (size - (q + mh) < 2 * sa) return bad("has a symbol-table message cut off by the end of the file");
        std::string why = SymbolTableProblem(Le(m + mh, sa), Le(m + mh + sa, sa), sa, ss);
        if (!why.empty()) return bad(why);
      }
      // An attribute (0x0C) that is not shared: libhdf5 1.10 decodes its datatype and
      // dataspace by the sizes the message declares, without checking them against the
      // message (fuzz finding: a datatype of 65,292 bytes in a 64-byte message, read past
      // the header's buffer by H5Aexists). Its parts must fit in the message.
      const uint8_t mflags = v1 ? m[4] : m[3];
      if (type == 0x0C && !(mflags & 0x02) && msize >= 8) {
        const uint8_t* a = m + mh;
        const uint64_t version = a[0], name = Le(a + 2, 2), dt = Le(a + 4, 2), ds = Le(a + 6, 2);
        auto pad = [&](uint64_t n) { return version == 1 ? (n + 7) / 8 * 8 : n; };
        const uint64_t need = (version == 3 ? 9 : 8) + pad(name) + pad(dt) + pad(ds);
        if (version >= 1 && version <= 3 && need > msize)
          return bad(fmt::format("has an attribute message of {} bytes whose name, datatype and dataspace "
                                 "declare {} bytes",
                                 msize, need));
      }
      if (type == 0x10) {  // libhdf5 decodes address and length whatever size the message declares
        if (size - (q + mh) < sa + ss) return bad("has a continuation message cut off by the end of the file");
        uint64_t caddr = userblock_ + Le(m + mh, sa), clen = Le(m + mh + sa, ss);
        if (caddr >= size || clen > size - caddr)
          return bad(fmt::format("continues at {} with {} bytes, past the end of the file ({} bytes)", caddr, clen,
                                 size));
        if (v1) todo.push_back({caddr, caddr + clen});
        else if (clen >= 8 && std::memcmp(f + caddr, "OCHK", 4) == 0) todo.push_back({caddr + 4, caddr + clen - 4});
      }
      q += mh + msize;
    }
  }
  return Status::OK();
}

// An old-style group's symbol table (object header message 0x11): a local heap
// holding the link names, and a version 1 B-tree (type 0) whose leaves point
// to symbol nodes (SNOD) of link entries. libhdf5 1.10 follows all of it as
// the file says when it lists or searches the group, bounded by nothing but
// the file's own pointers:
// - the heap's free list (H5HL__fl_deserialize, on every load of the heap) is
//   a chain of blocks, each starting with the offset of the next (1: none) and
//   its own size; libhdf5 allocates a node per block and follows the chain
//   without a cycle check, so a block naming itself as next makes it allocate
//   until memory runs out (fuzz finding 15: 36 M nodes). The blocks of a real
//   heap are disjoint and each holds those two lengths, so a data segment of
//   D bytes holds at most D / (2 x length size) of them: a longer chain loops
//   or overlaps.
// - B-tree nodes are visited recursively by their child addresses: a child
//   must be a node of the level below, and no node (nor symbol node) may be
//   reached twice, so every walk ends.
// - symbol nodes hold at most 2 x the superblock's leaf K entries (libhdf5
//   sizes their entry array so), all inside the file, and each entry's name
//   (and a soft link's value), like each B-tree key, is a NUL-terminated
//   string inside the heap.
// Returns what is wrong, or "" (with the addresses relative to the superblock).
std::string Hdf5Data::SymbolTableProblem(uint64_t btree_rel, uint64_t heap_rel, size_t sa, size_t ss) const {
  const uint8_t* f = map_->data();
  const uint64_t size = map_->size();
  auto abs = [&](uint64_t rel) { return rel < size - userblock_ ? userblock_ + rel : UINT64_MAX; };
  uint64_t heap = abs(heap_rel), hlen = 8 + 2 * ss + sa;
  if (heap >= size || size - heap < hlen || std::memcmp(f + heap, "HEAP", 4) != 0 || f[heap + 4] != 0)
    return fmt::format("names a local heap at {} that is not one", heap_rel + userblock_);
  uint64_t dsize = Le(f + heap + 8, ss), daddr = abs(Le(f + heap + 8 + 2 * ss, sa));
  bool past = daddr >= size || dsize > size - daddr;
  if (past || (daddr < heap + hlen && heap < daddr + dsize))
    return fmt::format("names a local heap at {} whose data ({} bytes at {}) {}", heap, dsize, daddr,
                       past ? "lies past the end of the file" : "overlaps its header");
  const uint8_t* data = f + daddr;
  const uint64_t max_blocks = dsize / (2 * ss);
  uint64_t blocks = 0;
  for (uint64_t fb = Le(f + heap + 8 + ss, ss); fb != 1;) {  // 1: the end of the free list
    if (fb >= dsize || dsize - fb < 2 * ss)
      return fmt::format("names a local heap at {} whose free list has a block at offset {}, outside its {} bytes",
                         heap, fb, dsize);
    if (++blocks > max_blocks)
      return fmt::format("names a local heap at {} whose free list loops or overlaps (more than {} blocks of at "
                         "least {} bytes in its {} bytes)",
                         heap, max_blocks, 2 * ss, dsize);
    uint64_t next = Le(data + fb, ss), bsize = Le(data + fb + ss, ss);
    if (next == 0 || bsize > dsize - fb)
      return fmt::format("names a local heap at {} whose free block at offset {} is damaged (next {}, {} bytes)",
                         heap, fb, next, bsize);
    fb = next;
  }
  auto name_ok = [&](uint64_t off) { return off < dsize && std::memchr(data + off, 0, dsize - off) != nullptr; };
  // The B-tree: (absolute address, the level it must have; -1 for the root).
  std::vector<std::pair<uint64_t, int>> todo{{abs(btree_rel), -1}};
  std::set<uint64_t> seen;  // every B-tree and symbol node reached
  auto first_visit = [&](uint64_t a) { return seen.insert(a).second; };
  const uint64_t bhdr = 8 + 2 * sa, ent = 2 * sa + 24;
  while (!todo.empty()) {
    auto [a, want] = todo.back();
    todo.pop_back();
    if (a >= size || size - a < bhdr + ss || std::memcmp(f + a, "TREE", 4) != 0 || f[a + 4] != 0)
      return fmt::format("has a symbol-table B-tree node at {} that is not one", a == UINT64_MAX ? btree_rel : a);
    if (!first_visit(a)) return fmt::format("reaches the symbol-table B-tree node at {} twice", a);
    int level = f[a + 5];
    uint64_t n = Le(f + a + 6, 2);
    if (want >= 0 && level != want)
      return fmt::format("has a symbol-table B-tree node at {} of level {} below one of level {}", a, level, want + 1);
    if (sym_internal_k_ && n > 2 * sym_internal_k_)
      return fmt::format("has a symbol-table B-tree node at {} of {} entries, more than 2 x K = {}", a, n,
                         2 * sym_internal_k_);
    if ((size - a - bhdr - ss) / (sa + ss) < n)
      return fmt::format("has a symbol-table B-tree node at {} of {} entries, cut off by the end of the file", a, n);
    for (uint64_t i = 0; i <= n; ++i)  // keys: heap offsets of names, compared by libhdf5's lookups
      if (uint64_t key = Le(f + a + bhdr + i * (sa + ss), ss); !name_ok(key))
        return fmt::format("has a symbol-table B-tree node at {} whose key {} (heap offset {}) is not a string "
                           "inside the local heap ({} bytes)",
                           a, i, key, dsize);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t c = abs(Le(f + a + bhdr + ss + i * (sa + ss), sa));
      if (level > 0) {
        todo.push_back({c, level - 1});
        continue;
      }
      if (c >= size || size - c < 8 || std::memcmp(f + c, "SNOD", 4) != 0 || f[c + 4] != 1)
        return fmt::format("has a symbol node at {} that is not one", c);
      if (!first_visit(c)) return fmt::format("reaches the symbol node at {} twice", c);
      uint64_t ns = Le(f + c + 6, 2);
      if (sym_leaf_k_ && ns > 2 * sym_leaf_k_)
        return fmt::format("has a symbol node at {} of {} entries, more than 2 x K = {}", c, ns, 2 * sym_leaf_k_);
      if ((size - c - 8) / ent < ns)
        return fmt::format("has a symbol node at {} of {} entries, cut off by the end of the file", c, ns);
      for (uint64_t j = 0; j < ns; ++j) {
        const uint8_t* e = f + c + 8 + j * ent;
        uint64_t name = Le(e, sa);
        if (!name_ok(name))
          return fmt::format("has a link (entry {} of the symbol node at {}) whose name at heap offset {} is not a "
                             "string inside the local heap ({} bytes)",
                             j, c, name, dsize);
        if (Le(e + 2 * sa, 4) == 2 && !name_ok(Le(e + 2 * sa + 8, 4)))  // a soft link: its value in the heap
          return fmt::format("has a soft link (entry {} of the symbol node at {}) whose value is not a string inside "
                             "the local heap",
                             j, c);
      }
    }
  }
  return "";
}

// Checks the header a hard link points to before libhdf5 loads it. Lock held.
Status Hdf5Data::CheckLinkTarget(hid_t parent, const std::string& name, const std::string& full) const {
  H5L_info_t li;
  if (H5Lget_info(parent, name.c_str(), &li, H5P_DEFAULT) < 0)
    return Corrupt(full, "cannot open: " + H5Message());
  if (li.type != H5L_TYPE_HARD) return Status::OK();  // soft: resolved through checked groups
  return CheckHeaderAt(userblock_ + li.u.address, fmt::format("'{}'", full), sizeof_addr_, sizeof_size_);
}

// The root group's header, found through the superblock, before H5Fopen.
Status Hdf5Data::CheckRootHeader() {
  const uint8_t* f = map_->data();
  uint64_t size = map_->size();
  for (uint64_t at = 0; at < size && size - at >= 8; at = at == 0 ? 512 : at * 2) {
    if (std::memcmp(f + at, kSignature, 8) != 0) continue;
    if (size - at < 48) return Status::OK();  // libhdf5 refuses it
    const uint8_t* sb = f + at;
    uint8_t version = sb[8];
    uint64_t root = 0, eof = 0;
    size_t sa = 8, ss = 8;
    if (version <= 1) {
      sa = sb[13], ss = sb[14];
      if (sa < 2 || sa > 8 || ss < 2 || ss > 8) return Status::OK();  // libhdf5 refuses it
      uint64_t off = (version == 0 ? 24 : 28) + 4 * sa + ss;
      if (size - at < off + sa) return Status::OK();
      root = Le(sb + off, sa);
      eof = Le(sb + (version == 0 ? 24 : 28) + 2 * sa, sa);
      sym_leaf_k_ = Le(sb + 16, 2);
      sym_internal_k_ = Le(sb + 18, 2);
    } else {
      sa = sb[9], ss = sb[10];
      if (sa < 2 || sa > 8 || ss < 2 || ss > 8) return Status::OK();
      uint64_t off = 12 + 3 * sa;
      if (size - at < off + sa) return Status::OK();
      root = Le(sb + off, sa);
      eof = Le(sb + 12 + 2 * sa, sa);
    }
    // What libhdf5 would say, before anything past the end misleads the checks below.
    // The end-of-file address counts the user block too (libhdf5 writes the file's
    // size there; it compares it with the size, not the size past the user block).
    if (eof > size)
      return Status::Corrupt(fmt::format("truncated file: the superblock says {} bytes, the file has {}", eof, size),
                             Location{.file = path_});
    if (root >= size - at)
      return Status::Corrupt(fmt::format("the root group's object header at {} lies outside the file", root),
                             Location{.file = path_});
    // The user block ends where the superblock starts; addresses count from there.
    userblock_ = at;
    return CheckHeaderAt(at + root, "root group", sa, ss);
  }
  return Status::OK();  // no signature: libhdf5 refuses the file
}

Result<Hid> Hdf5Data::OpenDataset(hid_t parent, const std::string& name, const std::string& full) const {
  SK_RETURN_IF_ERROR(CheckLinkTarget(parent, name, full));
  H5O_info_t oi;
  if (H5Oget_info_by_name(parent, name.c_str(), &oi, H5P_DEFAULT) < 0)
    return Corrupt(full, "cannot open: " + H5Message());
  if (oi.type != H5O_TYPE_DATASET) return Corrupt(full, "is not a dataset");
  Hid d(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) return Corrupt(full, "cannot open: " + H5Message());
  // Raw data in external files is refused like external links.
  Hid dcpl(H5Dget_create_plist(d.get()), H5Pclose);
  if (dcpl.ok() && H5Pget_external_count(dcpl.get()) > 0)
    return Status::Unsupported(fmt::format("dataset '{}' stores its data in external files: refused", full),
                               Location{.file = path_});
  if (dcpl.ok() && H5Pget_layout(dcpl.get()) == H5D_VIRTUAL)
    return Status::Unsupported(fmt::format("dataset '{}' is a virtual dataset: refused", full),
                               Location{.file = path_});
  // A compact dataset keeps its elements in its object header; libhdf5 1.10
  // does not check that they are all there and copies from a missing buffer
  // (fuzz finding: a crash on a compact `keys` of 3 elements and 0 bytes).
  if (dcpl.ok() && H5Pget_layout(dcpl.get()) == H5D_COMPACT) {
    Hid type(H5Dget_type(d.get()), H5Tclose);
    Hid space(H5Dget_space(d.get()), H5Sclose);
    hssize_t npoints = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
    bool vlen = cls == H5T_VLEN || (cls == H5T_STRING && H5Tis_variable_str(type.get()) > 0);
    uint64_t elem = vlen ? 8 + sizeof_addr_ : (type.ok() ? H5Tget_size(type.get()) : 0);  // on-disk element size
    uint64_t have = H5Dget_storage_size(d.get());
    if (npoints < 0 || elem == 0 || uint64_t(npoints) > have / elem)
      return Corrupt(full, fmt::format("compact dataset of {} elements of {} bytes holds only {} bytes", npoints,
                                       elem, have));
  }
  return d;
}

// Rank and length of a 1-D dataset, or a Corrupt status. Lock held.
Result<uint64_t> Length1D(hid_t d, const std::string& name, const std::string& path) {
  Hid space(H5Dget_space(d), H5Sclose);
  int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank != 1)
    return Status::Corrupt(fmt::format("dataset '{}': expected 1 dimension, found {}", name, rank),
                           Location{.file = path});
  hsize_t dims[1];
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  return uint64_t(dims[0]);
}

Status Hdf5Data::ReadInts(hid_t d, const std::string& name, uint64_t expect, bool is_unsigned, void* out) const {
  Hid type(H5Dget_type(d), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    return Corrupt(name, "expected an integer type (labels, offsets and checksums are integers)");
  // libhdf5 sizes its conversion buffer by the file type: an integer type
  // declared 4 GB wide would make it allocate 4 GB.
  if (size_t sz = H5Tget_size(type.get()); sz == 0 || sz > 8)
    return Corrupt(name, fmt::format("expected integers of at most 8 bytes, found {} bytes", sz));
  if (!SaneNumberType(type.get())) return Corrupt(name, "its integer type's precision or bit offset is damaged");
  SK_ASSIGN_OR_RETURN(uint64_t len, Length1D(d, name, path_));
  if (len != expect) return Corrupt(name, fmt::format("holds {} elements, expected {}", len, expect));
  if (len > 0 && H5Dread(d, is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                         out) < 0)
    return Corrupt(name, "cannot read: " + H5Message());
  return Status::OK();
}

// Reads a 1-D string dataset or attribute (vlen or fixed). Lock held.
Result<std::vector<std::string>> Hdf5Data::ReadStrings(hid_t obj, bool is_attr, const std::string& name) const {
  Hid type(is_attr ? H5Aget_type(obj) : H5Dget_type(obj), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return Corrupt(name, "expected strings");
  Hid space(is_attr ? H5Aget_space(obj) : H5Dget_space(obj), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank > 1) return Corrupt(name, fmt::format("expected 1 dimension, found {}", rank));
  hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) return Corrupt(name, "cannot read its shape");
  SK_RETURN_IF_ERROR(CheckCount(name, uint64_t(count)));
  std::vector<std::string> out(static_cast<size_t>(count));
  if (count == 0) return out;
  if (is_attr) {  // libhdf5 1.10 copies count x element bytes from the attribute's buffer unchecked
    uint64_t elem = H5Tis_variable_str(type.get()) > 0 ? 8 + sizeof_addr_ : H5Tget_size(type.get());
    uint64_t have = H5Aget_storage_size(obj);
    if (elem == 0 || uint64_t(count) > have / elem)
      return Corrupt(name, fmt::format("holds {} bytes for {} elements of {} bytes", have, count, elem));
  }
  auto read = [&](hid_t mt, void* buf) {
    return is_attr ? H5Aread(obj, mt, buf) : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  };
  Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(type.get()));
    std::vector<char*> ptrs(size_t(count), nullptr);
    VlenCheck check = NewVlenCheck(0);
    if (read(mt.get(), ptrs.data()) < 0) {
      Status st = VlenReadError(name, check, -1, !is_attr);
      H5Dvlen_reclaim(mt.get(), space.get(), H5P_DEFAULT, ptrs.data());  // what was read before the failure
      return st;
    }
    for (size_t i = 0; i < ptrs.size(); ++i)
      if (ptrs[i]) out[i] = ptrs[i];
    H5Dvlen_reclaim(mt.get(), space.get(), H5P_DEFAULT, ptrs.data());
  } else {
    size_t sz = H5Tget_size(type.get());
    if (sz == 0 || sz > file_size_ || uint64_t(count) > 64 * file_size_ / sz)
      return Corrupt(name, fmt::format("declares {} strings of {} bytes in a file of {} bytes", count, sz, file_size_));
    H5Tset_size(mt.get(), sz);
    H5Tset_strpad(mt.get(), H5T_STR_NULLPAD);
    H5Tset_cset(mt.get(), H5Tget_cset(type.get()));
    std::string buf(sz * size_t(count), '\0');
    if (read(mt.get(), buf.data()) < 0) return Corrupt(name, "cannot read: " + H5Message());
    for (size_t i = 0; i < out.size(); ++i) {
      std::string_view s(buf.data() + i * sz, sz);
      auto z = s.find('\0');
      if (z != std::string_view::npos) s = s.substr(0, z);
      while (!s.empty() && s.back() == ' ') s.remove_suffix(1);  // H5T_STR_SPACEPAD
      out[i] = std::string(s);
    }
  }
  return out;
}

Status Hdf5Data::Open(const std::string& path, const OpenOptions& opts) {
  path_ = path;
  SK_ASSIGN_OR_RETURN(uint64_t size, io::RegularFileSize(path));
  info.format = "hdf5";
  info.address = "hdf5:" + path;
  info.total_bytes = size;
  file_size_ = size;
  // libhdf5 opens a local file: a remote one is read from a local copy (io/any_file.h),
  // named by its address in every message.
  SK_ASSIGN_OR_RETURN(io::LocalCopy copy, io::LocalCopyOf(path, io::CacheOptions{opts.cache_dir, opts.cache_bytes}));
  local_copy_ = copy.keep;
  const std::string& local = copy.path;

  // Mapped before libhdf5 reads anything: the vlen check reads heap
  // collections through it, and our layout's payloads are read from it.
  SK_ASSIGN_OR_RETURN(map_, io::MappedFile::Open(local, path));
  if (map_->size() < file_size_) file_size_ = map_->size();
  view_owner_ = std::make_unique<core::PerThreadViewOwner>(map_);

  H5Lock lock;
  SK_RETURN_IF_ERROR(InstallVlenGuard(local));
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_elink_cb(fapl.get(), RefuseElink, nullptr);
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  // Readers open files that no writer holds (writers rename into place), so
  // skip flock: it fails on some network and read-only file systems.
  H5Pset_file_locking(fapl.get(), false, true);
  SK_RETURN_IF_ERROR(CheckRootHeader());
  Hid file(H5Fopen(local.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.ok())
    return Status::Corrupt(fmt::format("cannot open as HDF5 (truncated or not HDF5?): {}", H5Message()),
                           Location{.file = path});
  {
    Hid fcpl(H5Fget_create_plist(file.get()), H5Pclose);
    hsize_t ub = 0;
    size_t sa = 8, ss = 8;
    if (!fcpl.ok() || H5Pget_userblock(fcpl.get(), &ub) < 0 || H5Pget_sizes(fcpl.get(), &sa, &ss) < 0 || ss < 2 ||
        ss > 8 || sa < 2 || sa > 8)
      return Status::Corrupt("cannot read the file's creation properties: " + H5Message(), Location{.file = path});
    userblock_ = ub;
    sizeof_size_ = ss;
    sizeof_addr_ = sa;
  }
  SK_ASSIGN_OR_RETURN(LinkList root, ListLinks(file.get(), "/", path));
  auto has = [&](const char* name) {
    for (auto& [n, t] : root.links)
      if (n == name) return true;
    return false;
  };
  Status s;
  if (opts.field_map.empty() && has("keys") && has("fields")) {
    s = OpenShardkit(file.get(), size);
    // Everything is in memory or mapped: the HDF5 file closes here.
  } else {
    std::map<std::string, std::string> map = opts.field_map;
    if (map.empty()) {
      if (has("images")) map["images"] = "";
      vlen_shapes_ = has("images") && has("shapes");
      if (has("labels")) map["labels"] = "cls";
      else if (has("targets")) map["targets"] = "cls";
      // Keras-style files (x_train/y_train, X/y, x/y) when there is no `images`.
      for (auto [x, y] : {std::pair{"x_train", "y_train"}, std::pair{"X", "y"}, std::pair{"x", "y"}, std::pair{"X", "Y"}})
        if (!map.count("images") && !map.count(x) && has(x) && has(y)) {
          map[x] = "";
          if (!map.count("labels") && !map.count("targets")) map[y] = "cls";
        }
    }
    bool any_payload = false;
    for (auto& [name, ext] : map) any_payload = any_payload || ext != "cls";
    if (!any_payload)
      return Status::Unsupported(
          "no known layout: expected 'keys' + 'fields' (shardkit) or an 'images' dataset; "
          "map other dataset names to fields with a field map (e.g. imgs=jpg,y=cls)",
          Location{.file = path});
    for (auto& [name, ext] : map)
      if (!has(name.c_str()))
        return Status::NotFound(fmt::format("dataset '{}' (mapped to field '{}') does not exist", name,
                                            ext.empty() ? "auto" : ext),
                                Location{.file = path});
    std::string order = opts.format_options.count("hdf5.order") ? opts.format_options.at("hdf5.order") : "nhwc";
    if (order != "nhwc" && order != "nchw")
      return Status::Invalid(fmt::format("hdf5.order '{}': nhwc or nchw", order), Location{.file = path});
    s = OpenMapped(file.get(), map, order == "nchw");
    if (s.ok()) s = ReadNativeExtras(file.get(), opts.field_map.empty() && has("keys"), opts);
    if (s.ok()) file_ = std::move(file);
  }
  if (!s.ok()) return s;
  info.num_samples = n;
  info.shards.push_back(ShardInfo{.path = path, .samples = n, .bytes = size, .checksum = ""});
  return Status::OK();
}

Status Hdf5Data::OpenShardkit(hid_t file, uint64_t file_size) {
  shardkit_ = true;
  info.extra["layout"] = "shardkit";
  if (H5Aexists(file, "shardkit_format_version") > 0) {
    Hid a(H5Aopen(file, "shardkit_format_version", H5P_DEFAULT), H5Aclose);
    Hid t(H5Aget_type(a.get()), H5Tclose);
    Hid sp(H5Aget_space(a.get()), H5Sclose);
    int32_t v = 0;  // one element: H5Aread writes every element the attribute holds
    if (H5Tget_class(t.get()) != H5T_INTEGER || !SaneNumberType(t.get()) || !sp.ok() ||
        H5Sget_simple_extent_npoints(sp.get()) != 1 || H5Aget_storage_size(a.get()) < H5Tget_size(t.get()) ||
        H5Aread(a.get(), H5T_NATIVE_INT32, &v) < 0)
      return Status::Corrupt("attribute 'shardkit_format_version' is not an integer", Location{.file = path_});
    if (v > kFormatVersion)
      return Status::Unsupported(
          fmt::format("written with format version {}; this shardkit reads up to {}", v, kFormatVersion),
          Location{.file = path_});
    info.extra["format_version"] = std::to_string(v);
  }
  if (H5Aexists(file, "class_names") > 0) {
    Hid a(H5Aopen(file, "class_names", H5P_DEFAULT), H5Aclose);
    SK_ASSIGN_OR_RETURN(info.class_names, ReadStrings(a.get(), true, "class_names (attribute)"));
  }
  SK_RETURN_IF_ERROR(ReadTransform(file));
  {
    SK_ASSIGN_OR_RETURN(Hid d, OpenDataset(file, "keys", "keys"));
    SK_ASSIGN_OR_RETURN(n, Length1D(d.get(), "keys", path_));
    SK_RETURN_IF_ERROR(CheckCount("keys", n));
    SK_ASSIGN_OR_RETURN(auto keys, ReadStrings(d.get(), false, "keys"));
    SK_RETURN_IF_ERROR(KeepKeys(keys));
  }
  {
    SK_ASSIGN_OR_RETURN(Hid d, OpenDataset(file, "labels", "labels"));
    labels_.resize(n);
    SK_RETURN_IF_ERROR(ReadInts(d.get(), "labels", n, false, labels_.data()));
  }
  if (H5Lexists(file, "checksums", H5P_DEFAULT) > 0) {
    SK_ASSIGN_OR_RETURN(Hid d, OpenDataset(file, "checksums", "checksums"));
    std::vector<uint64_t> sums(n);
    SK_RETURN_IF_ERROR(ReadInts(d.get(), "checksums", n, true, sums.data()));
    info.extra["checksums"] = "per-sample xxh3 in dataset 'checksums'";
    info.sample_checksums = SampleChecksums::kList;
    info.sample_checksums_where = info.extra["checksums"];
    checksums = std::move(sums);
  }
  SK_RETURN_IF_ERROR(CheckLinkTarget(file, "fields", "fields"));
  Hid fields(H5Gopen2(file, "fields", H5P_DEFAULT), H5Gclose);
  if (!fields.ok()) return Status::Corrupt("'fields' is not a group: " + H5Message(), Location{.file = path_});
  SK_ASSIGN_OR_RETURN(LinkList exts, ListLinks(fields.get(), "/fields", path_));
  bool any_label = std::any_of(labels_.begin(), labels_.end(), [](int64_t l) { return l >= 0; });
  for (auto& [ext, type] : exts.links) {
    std::string gname = "fields/" + ext;
    SK_RETURN_IF_ERROR(CheckLinkTarget(fields.get(), ext, gname));
    Hid g(H5Gopen2(fields.get(), ext.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) return Status::Corrupt(fmt::format("'{}' is not a group", gname), Location{.file = path_});
    SK_ASSIGN_OR_RETURN(LinkList inner, ListLinks(g.get(), "/" + gname, path_));
    (void)inner;
    Payload p;
    p.ext = ext;
    std::string dname = gname + "/data", oname = gname + "/offsets";
    SK_ASSIGN_OR_RETURN(Hid data, OpenDataset(g.get(), "data", dname));
    SK_ASSIGN_OR_RETURN(Hid offs, OpenDataset(g.get(), "offsets", oname));
    {
      Hid t(H5Dget_type(data.get()), H5Tclose);
      if (H5Tget_class(t.get()) != H5T_INTEGER || H5Tget_size(t.get()) != 1 || !SaneNumberType(t.get()))
        return Corrupt(dname, "expected uint8 elements");
      Hid dcpl(H5Dget_create_plist(data.get()), H5Pclose);
      if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS)
        return Corrupt(dname, "expected a contiguous (not chunked or compact) layout");
    }
    SK_ASSIGN_OR_RETURN(uint64_t size, Length1D(data.get(), dname, path_));
    p.offsets.resize(n + 1);
    SK_RETURN_IF_ERROR(ReadInts(offs.get(), oname, n + 1, true, p.offsets.data()));
    for (uint64_t i = 0; i < n; ++i)
      if (p.offsets[i + 1] < p.offsets[i])
        return Status::Corrupt(fmt::format("dataset '{}': not monotone ({} then {})", oname, p.offsets[i],
                                           p.offsets[i + 1]),
                               Location{.file = path_, .index = int64_t(i)});
    if (p.offsets[n] > size)
      return Corrupt(oname, fmt::format("ends at {} beyond the {} bytes of '{}'", p.offsets[n], size, dname));
    if (size > 0) {
      haddr_t a = H5Dget_offset(data.get());
      if (a == HADDR_UNDEF) return Corrupt(dname, "has no storage allocated in the file");
      if (a + size > file_size || a + size < a)
        return Status::Corrupt(
            fmt::format("dataset '{}': bytes [{}, {}) lie past the end of the file ({} bytes): truncated?", dname, a,
                        a + size, file_size),
            Location{.file = path_, .offset = int64_t(file_size)});
      p.addr = a;
    }
    if (ext == "cls" || p.offsets[n] > p.offsets[0]) info.fields.push_back(ext);
    payloads_.push_back(std::move(p));
  }
  if (any_label && std::find(info.fields.begin(), info.fields.end(), "cls") == info.fields.end())
    info.fields.push_back("cls");
  std::sort(info.fields.begin(), info.fields.end());
  std::sort(payloads_.begin(), payloads_.end(), [](const Payload& a, const Payload& b) { return a.ext < b.ext; });
  if (map_->size() < file_size)
    return Status::Corrupt("file shrank while opening", Location{.file = path_});
  return Status::OK();
}

Status Hdf5Data::OpenMapped(hid_t file, const std::map<std::string, std::string>& map, bool nchw) {
  info.extra["layout"] = "images-labels";
  bool first = true;
  std::vector<std::string> fields;
  for (auto& [name, ext] : map) {
    TpField f;
    f.name = name;
    f.ext = ext == "auto" ? "" : paths::Lower(ext);
    SK_ASSIGN_OR_RETURN(f.dset, OpenDataset(file, name, name));
    {
      // Decoded images: a numeric dataset of 3+ dimensions, one image per element.
      Hid space(H5Dget_space(f.dset.get()), H5Sclose);
      Hid type(H5Dget_type(f.dset.get()), H5Tclose);
      int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
      auto dt = type.ok() ? hdf5::NumpyType(type.get()) : std::nullopt;
      if (rank >= 3 && rank <= 8 && dt && f.ext != "cls") {
        std::vector<hsize_t> d(size_t(rank), 0);
        H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
        f.dims.assign(d.begin(), d.end());
        f.dt = *dt;
        f.nchw = nchw && rank == 4;
        f.kind = TpField::kArray;
        if (f.ext.empty()) f.ext = "npy";
        SK_RETURN_IF_ERROR(CheckCount(name, f.dims[0]));
        if (first) n = f.dims[0];
        else if (f.dims[0] != n)
          return Corrupt(name, fmt::format("holds {} elements but '{}' holds {}", f.dims[0], tp_.front().name, n));
        first = false;
        info.extra["layout"] = nchw && rank == 4 ? "decoded-images-nchw" : "decoded-images";
        tp_.push_back(std::move(f));
        continue;
      }
      // Keras-style labels of shape [N, 1] read as [N].
      if (rank == 2 && type.ok() && H5Tget_class(type.get()) == H5T_INTEGER) {
        hsize_t d2[2];
        H5Sget_simple_extent_dims(space.get(), d2, nullptr);
        if (d2[1] == 1) {
          f.kind = TpField::kInt;
          if (first) n = d2[0];
          else if (d2[0] != n)
            return Corrupt(name, fmt::format("holds {} elements but '{}' holds {}", d2[0], tp_.front().name, n));
          SK_RETURN_IF_ERROR(CheckCount(name, d2[0]));
          first = false;
          if (size_t sz = H5Tget_size(type.get()); sz == 0 || sz > 8)
            return Corrupt(name, fmt::format("expected integers of at most 8 bytes, found {} bytes", sz));
          if (!SaneNumberType(type.get()))
            return Corrupt(name, "its integer type's precision or bit offset is damaged");
          f.ints.resize(n);
          if (n > 0 && H5Dread(f.dset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, f.ints.data()) < 0)
            return Corrupt(name, "cannot read: " + H5Message());
          if (f.ext.empty()) f.ext = "cls";
          tp_.push_back(std::move(f));
          continue;
        }
      }
    }
    SK_ASSIGN_OR_RETURN(uint64_t len, Length1D(f.dset.get(), name, path_));
    SK_RETURN_IF_ERROR(CheckCount(name, len));
    if (first) n = len;
    else if (len != n)
      return Corrupt(name, fmt::format("holds {} elements but '{}' holds {}", len, tp_.front().name, n));
    first = false;
    Hid type(H5Dget_type(f.dset.get()), H5Tclose);
    H5T_class_t cls = H5Tget_class(type.get());
    if (cls == H5T_INTEGER) {
      f.kind = TpField::kInt;
      f.ints.resize(n);
      SK_RETURN_IF_ERROR(ReadInts(f.dset.get(), name, n, false, f.ints.data()));
      if (f.ext.empty()) f.ext = "cls";
    } else if (f.ext == "cls") {
      return Corrupt(name, "labels must be integers");
    } else if (cls == H5T_VLEN) {
      Hid base(H5Tget_super(type.get()), H5Tclose);
      if (H5Tget_class(base.get()) != H5T_INTEGER || H5Tget_size(base.get()) != 1 || !SaneNumberType(base.get()))
        return Corrupt(name, "expected variable-length uint8 elements");
      f.kind = TpField::kVlenU8;
      f.mtype = Hid(H5Tvlen_create(H5T_NATIVE_UINT8), H5Tclose);
    } else if (cls == H5T_STRING) {
      f.mtype = Hid(H5Tcopy(H5T_C_S1), H5Tclose);
      if (H5Tis_variable_str(type.get()) > 0) {
        f.kind = TpField::kVlenStr;
        H5Tset_size(f.mtype.get(), H5T_VARIABLE);
      } else {
        f.kind = TpField::kFixedStr;
        f.fixed_size = H5Tget_size(type.get());
        if (f.fixed_size == 0 || f.fixed_size > file_size_)
          return Corrupt(name, fmt::format("declares strings of {} bytes in a file of {} bytes", f.fixed_size,
                                           file_size_));
        H5Tset_size(f.mtype.get(), f.fixed_size);
        H5Tset_strpad(f.mtype.get(), H5T_STR_NULLPAD);
      }
      H5Tset_cset(f.mtype.get(), H5Tget_cset(type.get()));
    } else {
      return Corrupt(name, "expected variable-length uint8, strings or integers");
    }
    tp_.push_back(std::move(f));
  }
  if (vlen_shapes_)
    for (auto& f : tp_)
      if (f.name == "images" && f.kind == TpField::kVlenU8) SK_RETURN_IF_ERROR(ReadShapes(file, &f));
  // Payload fields before labels, so that tp_.front() names a payload in messages.
  std::stable_sort(tp_.begin(), tp_.end(),
                   [](const TpField& a, const TpField& b) { return (a.kind == TpField::kInt) < (b.kind == TpField::kInt); });
  lock_free_ = true;
  std::string direct;
  for (auto& f : tp_) {
    if (f.kind == TpField::kArray) PlanDirect(f);
    if (f.direct != TpField::kNone) direct += (direct.empty() ? "" : ",") + f.name;
    lock_free_ = lock_free_ && (f.kind == TpField::kInt || f.direct != TpField::kNone);
  }
  if (!direct.empty()) info.extra["direct_reads"] = direct;
  // Field list: what element 0 holds (sniffed extensions) plus the fixed ones.
  // GetTp expects the lock, which is held here.
  if (n > 0) {
    Sample s0;
    SK_RETURN_IF_ERROR(GetTp(0, &s0));
    for (auto& fl : s0.fields) fields.push_back(fl.ext);
  }
  for (auto& f : tp_)
    if (!f.ext.empty() && std::find(fields.begin(), fields.end(), f.ext) == fields.end()) fields.push_back(f.ext);
  std::sort(fields.begin(), fields.end());
  info.fields = fields;
  return Status::OK();
}

Status Hdf5Data::SwapChannels(const pickle::NdArray& a, Bytes* npy, const Location& at) const {
  if (!swap_bgr_ || a.shape.size() != 3 || (a.shape[2] != 3 && a.shape[2] != 4)) return Status::OK();
  if (a.fortran_order) return Status::Corrupt("hdf5.channels=bgr-to-rgb of a Fortran-order array", at);
  // ToNpy made an owned copy: swap channels 0 and 2 of every pixel in place.
  uint8_t* px = const_cast<uint8_t*>(npy->data()) + (npy->size() - a.data.size());
  const size_t sz = a.dtype.itemsize, stride = sz * size_t(a.shape[2]);
  if (sz == 1 && stride == 3) {
    for (size_t off = 0; off + 3 <= a.data.size(); off += 3) std::swap(px[off], px[off + 2]);
    return Status::OK();
  }
  uint8_t tmp[16];
  for (size_t off = 0; off + stride <= a.data.size(); off += stride) {
    std::memcpy(tmp, px + off, sz);
    std::memcpy(px + off, px + off + 2 * sz, sz);
    std::memcpy(px + off + 2 * sz, tmp, sz);
  }
  return Status::OK();
}

Status Hdf5Data::ReadNativeExtras(hid_t file, bool has_keys, const OpenOptions& opts) {
  std::string channels;  // hdf5.channels: bgr | rgb | bgr-to-rgb (default: the file's channel_order)
  if (auto it = opts.format_options.find("hdf5.channels"); it != opts.format_options.end()) {
    channels = it->second;
    if (channels != "bgr" && channels != "rgb" && channels != "bgr-to-rgb")
      return Status::Invalid(fmt::format("hdf5.channels '{}': bgr, rgb or bgr-to-rgb", channels),
                             Location{.file = path_});
  }
  if (has_keys) {
    SK_ASSIGN_OR_RETURN(Hid d, OpenDataset(file, "keys", "keys"));
    SK_ASSIGN_OR_RETURN(uint64_t len, Length1D(d.get(), "keys", path_));
    if (len != n) return Corrupt("keys", fmt::format("holds {} elements, expected {}", len, n));
    SK_ASSIGN_OR_RETURN(auto keys, ReadStrings(d.get(), false, "keys"));
    SK_RETURN_IF_ERROR(KeepKeys(keys));
  }
  if (opts.field_map.empty() && H5Aexists(file, "shardkit_format_version") > 0) {
    negative_label_none_ = true;
    if (H5Aexists(file, "class_names") > 0) {
      Hid a(H5Aopen(file, "class_names", H5P_DEFAULT), H5Aclose);
      SK_ASSIGN_OR_RETURN(info.class_names, ReadStrings(a.get(), true, "class_names (attribute)"));
    }
    SK_RETURN_IF_ERROR(ReadTransform(file));
  }
  bool any_arrays = false, file_bgr = false, file_rgb = false;
  std::string attr_of;
  for (const auto& f : tp_) {
    if (f.ext != "npy") continue;
    any_arrays = true;
    if (H5Aexists(f.dset.get(), "channel_order") <= 0) continue;
    Hid a(H5Aopen(f.dset.get(), "channel_order", H5P_DEFAULT), H5Aclose);
    SK_ASSIGN_OR_RETURN(auto v, ReadStrings(a.get(), true, "channel_order (attribute of '" + f.name + "')"));
    if (v.size() == 1 && v[0] == "bgr") file_bgr = true, attr_of = f.name;
    if (v.size() == 1 && v[0] == "rgb" && attr_of.empty()) file_rgb = true, attr_of = f.name;
  }
  if (!any_arrays) return Status::OK();
  if (channels == "bgr-to-rgb") {
    swap_bgr_ = true;
    info.extra["channel_order"] = "decoded arrays: rgb (converted from bgr on read)";
  } else if (channels == "rgb" && file_bgr) {
    info.extra["channel_order"] = "decoded arrays: rgb (said by hdf5.channels; not converted)";
  } else if (channels == "bgr") {
    info.extra["channel_order"] = "decoded arrays: bgr (said by hdf5.channels; not converted)";
  } else if (channels == "rgb") {
    info.extra["channel_order"] = "decoded arrays: rgb (said by hdf5.channels)";
  } else if (file_bgr) {
    info.extra["channel_order"] =
        fmt::format("decoded arrays: bgr (attribute channel_order of '{}'; not converted)", attr_of);
  } else if (file_rgb) {
    info.extra["channel_order"] = fmt::format("decoded arrays: rgb (attribute channel_order of '{}')", attr_of);
  }
  if (info.extra.count("channel_order")) info.extra["channel_option"] = "hdf5.channels";
  return Status::OK();
}

Status Hdf5Data::ReadTransform(hid_t file) {
  if (H5Aexists(file, "transform") <= 0) return Status::OK();
  Hid a(H5Aopen(file, "transform", H5P_DEFAULT), H5Aclose);
  SK_ASSIGN_OR_RETURN(auto v, ReadStrings(a.get(), true, "transform (attribute)"));
  if (v.size() != 1)
    return Status::Corrupt(fmt::format("attribute 'transform': holds {} strings, expected one (a JSON object)", v.size()),
                           Location{.file = path_});
  return TakeTransformText(v[0], "attribute 'transform'", path_, &info);
}

Status Hdf5Data::ReadShapes(hid_t file, TpField* images) {
  SK_ASSIGN_OR_RETURN(Hid d, OpenDataset(file, "shapes", "shapes"));
  Hid space(H5Dget_space(d.get()), H5Sclose);
  Hid type(H5Dget_type(d.get()), H5Tclose);
  hsize_t dims[2] = {0, 0};
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 2 || !type.ok() ||
      H5Tget_class(type.get()) != H5T_INTEGER || !SaneNumberType(type.get()))
    return Corrupt("shapes", "expected integers of shape [N, 2] or [N, 3] (the shape of each element of 'images')");
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  if (dims[0] != n || (dims[1] != 2 && dims[1] != 3))
    return Corrupt("shapes", fmt::format("has shape [{}, {}]; expected [{}, 2] or [{}, 3] (one shape per image)", dims[0],
                                         dims[1], n, n));
  std::vector<int64_t> v(size_t(n * dims[1]));
  if (n > 0 && H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    return Corrupt("shapes", "cannot read: " + H5Message());
  std::vector<std::vector<uint64_t>> shapes(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t elems = 1;
    for (hsize_t k = 0; k < dims[1]; ++k) {
      const int64_t x = v[size_t(i * dims[1] + k)];
      if (x <= 0 || x > (int64_t(1) << 31))
        return Status::Corrupt(fmt::format("dataset 'shapes': element {} has a dimension of {}", i, x),
                               Location{.file = path_, .index = int64_t(i)});
      elems *= uint64_t(x);
      if (elems > hdf5::kMaxElementBytes)
        return Status::Corrupt(fmt::format("dataset 'shapes': element {} is larger than {} bytes", i,
                                           hdf5::kMaxElementBytes),
                               Location{.file = path_, .index = int64_t(i)});
      shapes[i].push_back(uint64_t(x));
    }
  }
  // Encoded files stored beside their images' shapes (metadata, not a flattening) stay
  // the images-labels layout: element 0 must hold exactly its shape's bytes (an encoded
  // file of exactly H * W * C bytes does not happen in practice).
  if (n > 0) {
    Sample s0;
    SK_RETURN_IF_ERROR(GetTp(0, &s0));  // (images->shapes not set yet: the raw element)
    const Field* raw = nullptr;
    for (const auto& fl : s0.fields)
      if (fl.ext != "cls") raw = &fl;
    uint64_t want = 1;
    for (uint64_t x : shapes[0]) want *= x;
    if (!raw || raw->data.size() != want) return Status::OK();
  }
  images->shapes = std::move(shapes);
  images->ext = "npy";
  info.extra["layout"] = "decoded-images-vlen";
  return Status::OK();
}

// Decoded images are most of a file's bytes, and libhdf5 (the serial build, one lock)
// only copies them: with 16 loader threads each waiting for the others' H5Dread, a
// [N, H, W, 3] file was read at a quarter of the rate of the same images as JPEG. So
// where libhdf5 would copy the bytes unchanged (no filters, the stored type is the type
// read), element i is read from the file's mapping. Lock held.
void Hdf5Data::PlanDirect(TpField& f) const {
  const int rank = int(f.dims.size());
  const std::optional<uint64_t> elem = hdf5::ElementBytes(f.dt, f.dims);
  if (!elem || *elem == 0 || rank < 2 || rank > 8) return;
  Hid type(H5Dget_type(f.dset.get()), H5Tclose);
  Hid dcpl(H5Dget_create_plist(f.dset.get()), H5Pclose);
  if (!type.ok() || !dcpl.ok() || H5Tequal(type.get(), hdf5::MemType(f.dt)) <= 0 || H5Pget_nfilters(dcpl.get()) != 0)
    return;
  f.elem_bytes = *elem;
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    haddr_t a = H5Dget_offset(f.dset.get());  // absolute (the user block included)
    uint64_t total = 0;
    if (a == HADDR_UNDEF || __builtin_mul_overflow(f.elem_bytes, f.dims[0], &total) || a > map_->size() ||
        total > map_->size() - a)
      return;  // no storage (fill values) or truncated: HDF5 says so per element
    f.addr = a;
    f.direct = TpField::kContiguous;
    return;
  }
#if H5_VERSION_GE(1, 10, 5)
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> cd(size_t(rank), 0);
    if (H5Pget_chunk(dcpl.get(), rank, cd.data()) != rank || cd[0] == 0) return;
    for (int k = 1; k < rank; ++k)
      if (cd[size_t(k)] != f.dims[size_t(k)]) return;  // chunks cut through images: through HDF5
    uint64_t chunk_bytes = 0;
    if (__builtin_mul_overflow(cd[0], f.elem_bytes, &chunk_bytes)) return;
    const uint64_t chunks = f.dims[0] / cd[0] + (f.dims[0] % cd[0] != 0);
    // More chunks than the file could hold (mostly unallocated, or a hostile count): through
    // HDF5 (fill values), not a table of addresses larger than the file.
    if (chunks - 1 > map_->size() / chunk_bytes) return;
    f.chunk_n = cd[0];
    f.chunk_addr.reset(new std::atomic<uint64_t>[chunks]());
    f.direct = TpField::kChunked;
  }
#endif
}

// Element i of a kArray field: from the mapping where PlanDirect allowed it, else
// through HDF5 (taking the lock unless `locked`).
Result<pickle::NdArray> Hdf5Data::ReadDirect(const TpField& f, uint64_t i, bool locked) const {
  auto through_hdf5 = [&]() -> Result<pickle::NdArray> {
    std::optional<H5Lock> lock;
    if (!locked) lock.emplace();
    return hdf5::ReadElement(f.dset.get(), f.dt, f.dims, i, f.nchw, f.name, path_);
  };
  const uint8_t* base = map_->data();
  if (f.direct == TpField::kContiguous)
    return hdf5::ElementArray(Bytes(nullptr, base + f.addr + i * f.elem_bytes, size_t(f.elem_bytes)), f.dt, f.dims,
                              f.nchw);
#if H5_VERSION_GE(1, 10, 5)
  if (f.direct == TpField::kChunked) {
    const uint64_t c = i / f.chunk_n;
    uint64_t a = f.chunk_addr[c].load(std::memory_order_acquire);
    if (a == 0) {
      std::optional<H5Lock> lock;
      if (!locked) lock.emplace();
      std::vector<hsize_t> at(f.dims.size(), 0);
      at[0] = c * f.chunk_n;
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      const uint64_t want = f.chunk_n * f.elem_bytes;
      a = TpField::kNoChunk;
      if (H5Dget_chunk_info_by_coord(f.dset.get(), at.data(), &mask, &addr, &size) >= 0 && addr != HADDR_UNDEF &&
          size == want) {
        const uint64_t abs = addr + userblock_;  // chunk addresses are relative to the base address
        if (abs >= addr && abs <= map_->size() && want <= map_->size() - abs) a = abs;
      }
      H5Eclear2(H5E_DEFAULT);
      f.chunk_addr[c].store(a, std::memory_order_release);
    }
    if (a != TpField::kNoChunk)
      return hdf5::ElementArray(
          Bytes(nullptr, base + a + (i - c * f.chunk_n) * f.elem_bytes, size_t(f.elem_bytes)), f.dt, f.dims, f.nchw);
  }
#endif
  return through_hdf5();
}

// Reads element i of every mapped dataset.
Status Hdf5Data::GetTp(uint64_t i, Sample* out, bool locked) const {
  out->clear();
  if (!key_end_.empty()) out->key.assign(key_blob_, key_end_[i], key_end_[i + 1] - key_end_[i]);
  else out->key = fmt::format("{:08d}", i);
  for (const auto& f : tp_) {
    Location at{.file = path_, .index = int64_t(i)};
    if (f.kind == TpField::kInt) {
      if (negative_label_none_ && f.ext == "cls" && f.ints[i] < 0) continue;
      out->set(f.ext, Bytes::Take(std::to_string(f.ints[i])));
      continue;
    }
    if (f.kind == TpField::kArray) {
      SK_ASSIGN_OR_RETURN(pickle::NdArray a, ReadDirect(f, i, locked));
      Bytes npy = pickle::ToNpy(a);
      SK_RETURN_IF_ERROR(SwapChannels(a, &npy, at));
      out->set(f.ext, std::move(npy));
      continue;
    }
    Hid fspace(H5Dget_space(f.dset.get()), H5Sclose);
    hsize_t start[1] = {i}, count[1] = {1};
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    Hid mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
    Bytes b;
    if (f.kind == TpField::kVlenU8) {
      hvl_t v{0, nullptr};
      VlenCheck check = NewVlenCheck(i);
      if (H5Dread(f.dset.get(), f.mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, &v) < 0) {
        Status st = VlenReadError(f.name, check, int64_t(i));
        H5Dvlen_reclaim(f.mtype.get(), mspace.get(), H5P_DEFAULT, &v);
        return st;
      }
      b = Bytes::Copy(v.p, v.len);
      H5Dvlen_reclaim(f.mtype.get(), mspace.get(), H5P_DEFAULT, &v);
      if (!f.shapes.empty()) {  // a flattened decoded image and its shape
        pickle::NdArray a;
        a.dtype = pickle::DType{'u', 1, '|'};
        a.shape = f.shapes[i];
        if (a.elements() != b.size())
          return Status::Corrupt(fmt::format("dataset '{}': element holds {} bytes, its shape in 'shapes' needs {}",
                                             f.name, b.size(), a.elements()),
                                 at);
        a.data = std::move(b);
        Bytes npy = pickle::ToNpy(a);
        SK_RETURN_IF_ERROR(SwapChannels(a, &npy, at));
        out->set(f.ext, std::move(npy));
        continue;
      }
    } else if (f.kind == TpField::kVlenStr) {
      char* p = nullptr;
      VlenCheck check = NewVlenCheck(i);
      if (H5Dread(f.dset.get(), f.mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, &p) < 0) {
        Status st = VlenReadError(f.name, check, int64_t(i));
        H5Dvlen_reclaim(f.mtype.get(), mspace.get(), H5P_DEFAULT, &p);
        return st;
      }
      if (p) b = Bytes::Copy(std::string_view(p));
      H5Dvlen_reclaim(f.mtype.get(), mspace.get(), H5P_DEFAULT, &p);
    } else {
      std::string buf(f.fixed_size, '\0');
      if (H5Dread(f.dset.get(), f.mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
        return Status::Corrupt(fmt::format("dataset '{}': cannot read element: {}", f.name, H5Message()), at);
      buf.resize(std::min(buf.size(), buf.find('\0')));
      b = Bytes::Take(std::move(buf));
    }
    if (b.empty()) continue;  // an empty element: the sample lacks this field
    std::string ext = f.ext.empty() ? paths::SniffImageExt(b.data(), b.size()) : f.ext;
    out->set(ext, std::move(b));
  }
  return Status::OK();
}

Status Hdf5Data::Get(uint64_t i, Sample* out) const {
  if (i >= n)
    return Status::Invalid(fmt::format("sample index {} out of range [0, {})", i, n),
                           Location{.file = path_, .index = int64_t(i)});
  if (!shardkit_) {
    if (lock_free_) return GetTp(i, out, false);
    H5Lock lock;
    return GetTp(i, out);
  }
  out->clear();
  out->key.assign(key_blob_, key_end_[i], key_end_[i + 1] - key_end_[i]);
  const uint8_t* base = map_->data();
  std::shared_ptr<const void> owner = view_owner_->Owner();
  for (const auto& p : payloads_) {
    uint64_t b = p.offsets[i], e = p.offsets[i + 1];
    if (e > b) out->fields.push_back(Field{p.ext, Bytes(owner, base + p.addr + b, size_t(e - b))});
  }
  if (labels_[i] >= 0 && !out->find("cls")) out->set_label(labels_[i]);
  return Status::OK();
}

class Hdf5RandomAccess : public RandomAccess {
 public:
  explicit Hdf5RandomAccess(std::shared_ptr<const Hdf5Data> d) : d_(std::move(d)) {}
  uint64_t size() const override { return d_->n; }
  Status Get(uint64_t index, Sample* out) const override { return d_->Get(index, out); }

 private:
  std::shared_ptr<const Hdf5Data> d_;
};

class Hdf5Reader : public SampleReader {
 public:
  explicit Hdf5Reader(std::shared_ptr<const Hdf5Data> d) : d_(std::move(d)) {}
  Result<bool> Next(Sample* out) override {
    if (i_ >= d_->n) return false;
    SK_RETURN_IF_ERROR(d_->Get(i_, out));
    ++i_;
    return true;
  }

 private:
  std::shared_ptr<const Hdf5Data> d_;
  uint64_t i_ = 0;
};

class Hdf5Dataset : public Dataset {
 public:
  explicit Hdf5Dataset(std::shared_ptr<Hdf5Data> d) : d_(std::move(d)) {}
  const DatasetInfo& info() const override { return d_->info; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new Hdf5Reader(d_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return std::shared_ptr<RandomAccess>(new Hdf5RandomAccess(d_));
  }
  Result<std::vector<uint64_t>> RecordedChecksums() const override { return d_->checksums; }

 private:
  std::shared_ptr<Hdf5Data> d_;
};

}  // namespace

Result<std::unique_ptr<Dataset>> OpenHdf5(const std::string& path, const OpenOptions& opts) {
  auto d = std::make_shared<Hdf5Data>();
  Status st;
  try {
    st = d->Open(path, opts);
  } catch (const std::exception& e) {  // allocation failure on a hostile file: no exception crosses the API
    st = Status::Corrupt(fmt::format("cannot load the file's index: {}", e.what()), Location{.file = path});
  }
  if (!st.ok()) return st;
  return std::unique_ptr<Dataset>(new Hdf5Dataset(std::move(d)));
}

}  // namespace shardkit::formats::hdf5
