// formats/lmdb/reader.cc: the lmdb Dataset, its sequential reader and random access (the
// read rules: format.cc's header comment).
#include "formats/lmdb/internal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>
#include <thread>

#include <msgpack.hpp>

#include "core/per_thread.h"
#include "core/resume.h"
#include "formats/transform_record.h"

namespace shardkit::formats::lmdb {

namespace {

class LmdbDataset;

class LmdbReader : public SampleReader {
 public:
  LmdbReader(std::shared_ptr<Env> env, Layout layout, uint64_t count, std::shared_ptr<const std::vector<uint64_t>> sums,
             std::shared_ptr<const wild::Catalog> wild = nullptr)
      : env_(std::move(env)), layout_(layout), count_(count), sums_(std::move(sums)), wild_(std::move(wild)) {}
  ~LmdbReader() override {
    if (cur_) mdb_cursor_close(cur_);
    if (txn_) env_->Release(txn_);
  }

  Result<bool> Next(Sample* out) override {
    Location loc{.file = env_->data_path(), .index = int64_t(index_)};
    if (!txn_) {
      SK_ASSIGN_OR_RETURN(txn_, env_->Acquire());
      int rc = mdb_cursor_open(txn_, env_->dbi(), &cur_);
      if (rc) return MdbStatus(rc, "cannot open a cursor", loc);
    }
    if (done_) return false;
    if (layout_ == Layout::kWild) return NextWild(out);
    MDB_val k, v;
    int rc = mdb_cursor_get(cur_, &k, &v, index_ == 0 ? MDB_FIRST : MDB_NEXT);
    if (rc == MDB_NOTFOUND) {
      done_ = true;
      if (index_ != count_)
        return Status::Corrupt(fmt::format("LMDB in '{}' ended after {} of {} samples", env_->dir(), index_, count_), loc);
      return false;
    }
    if (rc) return MdbStatus(rc, fmt::format("cursor read after sample {}", index_), loc);
    if (!env_->InMap(k.mv_data, k.mv_size))
      return Status::Corrupt(fmt::format("LMDB key at index {} lies outside the data file", index_), loc);
    std::string_view lkey(static_cast<const char*>(k.mv_data), k.mv_size);
    if (index_ >= count_)
      return Status::Corrupt(fmt::format("LMDB in '{}' holds more than the {} samples its metadata lists (key '{}')",
                                         env_->dir(), count_, lkey),
                             Location{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index_)});
    if (layout_ == Layout::kShardkit) {
      std::string want = IndexKey(index_);
      if (lkey != want)
        return Status::Corrupt(fmt::format("LMDB key '{}' in '{}' where '{}' was expected (missing or extra sample)",
                                           lkey, env_->dir(), want),
                               Location{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index_)});
      SK_RETURN_IF_ERROR(DecodeRecord(env_.get(), env_, lkey, v, index_, out));
    } else {
      SK_RETURN_IF_ERROR(DecodeDatum(env_.get(), env_, lkey, v, index_, out, sums_.get()));
    }
    ++index_;
    return true;
  }

 private:
  // Wild layouts: the catalog's order (numeric keys by value), one mdb_get each.
  Result<bool> NextWild(Sample* out) {
    if (index_ >= wild_->keys.size()) {
      done_ = true;
      return false;
    }
    const std::string& lkey = wild_->keys[index_];
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())}, v;
    int rc = mdb_get(txn_, env_->dbi(), &k, &v);
    if (rc) return MdbStatus(rc, fmt::format("reading LMDB key '{}'", lkey), Location{.file = env_->dir(), .key = lkey});
    SK_RETURN_IF_ERROR(DecodeWild(env_.get(), *wild_, env_, lkey, v, index_, out, txn_));
    ++index_;
    return true;
  }

  std::shared_ptr<Env> env_;
  Layout layout_;
  uint64_t count_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;
  std::shared_ptr<const wild::Catalog> wild_;
  MDB_txn* txn_ = nullptr;
  MDB_cursor* cur_ = nullptr;
  uint64_t index_ = 0;
  bool done_ = false;
};

// Random access: one read transaction per thread, no lock on the hot path.
//
// Each thread that calls Get() on an LmdbRandomAccess gets a ReadSlot of its
// own (core::PerThread): a read transaction from the Env's pool, used by that
// thread only. The slot is the owner of the views Get() hands out, so their
// reference counts live in a per-thread control block instead of one shared by
// every thread. A slot's transaction is never reset or renewed: the views of
// earlier Get()s stay valid, from one snapshot, for as long as they are held.
// The slot gives its transaction back to the Env's pool when the
// LmdbRandomAccess and every view of the slot are gone; a slot whose thread
// exited goes to the next new thread (MDB_NOTLS lets a read transaction move
// between threads that do not use it at the same time). Cache-line aligned (see
// core/per_thread.h).
struct alignas(64) ReadSlot {
  ReadSlot(std::shared_ptr<Env> e, MDB_txn* t) : env(std::move(e)), txn(t) {}
  ~ReadSlot() { env->Release(txn); }
  std::shared_ptr<Env> env;
  MDB_txn* txn;
};

class LmdbRandomAccess : public RandomAccess {
 public:
  LmdbRandomAccess(std::shared_ptr<Env> env, Layout layout, uint64_t count,
                   std::shared_ptr<const std::vector<std::string>> keys,
                   std::shared_ptr<const std::vector<uint64_t>> sums, std::shared_ptr<const wild::Catalog> wild,
                   bool check_records)
      : env_(std::move(env)), layout_(layout), count_(count), keys_(std::move(keys)), sums_(std::move(sums)),
        wild_(std::move(wild)), check_records_(check_records) {}
  uint64_t size() const override { return count_; }

  Status Get(uint64_t index, Sample* out) const override {
    if (index >= count_)
      return Status::Invalid(fmt::format("sample index {} out of range (dataset has {})", index, count_),
                             Location{.file = env_->dir(), .index = int64_t(index)});
    char buf[24];
    std::string_view lkey;
    if (layout_ == Layout::kShardkit) {
      auto r = fmt::format_to_n(buf, sizeof buf, "{:010d}", index);
      lkey = std::string_view(buf, r.size);
    } else if (layout_ == Layout::kWild) {
      lkey = wild_->keys[index];
    } else {
      lkey = (*keys_)[index];
    }
    SK_ASSIGN_OR_RETURN(std::shared_ptr<ReadSlot> slot, ThisThreadsSlot());
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())}, v;
    int rc = mdb_get(slot->txn, env_->dbi(), &k, &v);
    if (rc) {
      Location loc{.file = env_->dir(), .key = std::string(lkey), .index = int64_t(index)};
      if (rc == MDB_NOTFOUND)
        return Status::Corrupt(fmt::format("LMDB key '{}' of sample {} is missing from '{}'", lkey, index, env_->dir()),
                               loc);
      return MdbStatus(rc, fmt::format("reading LMDB key '{}'", lkey), loc);
    }
    MDB_txn* txn = slot->txn;
    std::shared_ptr<const void> owner(std::move(slot));
    // The random-access hot path does not hash payloads (see DecodeRecord) unless asked
    // (OpenOptions::check_records: convert); verify and the sequential reader do.
    if (layout_ == Layout::kShardkit)
      return DecodeRecord(env_.get(), owner, lkey, v, index, out, /*check_payload=*/check_records_);
    if (layout_ == Layout::kWild) return DecodeWild(env_.get(), *wild_, owner, lkey, v, index, out, txn);
    return DecodeDatum(env_.get(), owner, lkey, v, index, out, nullptr);
  }

 private:
  Result<std::shared_ptr<ReadSlot>> ThisThreadsSlot() const {
    return slots_.Get([&]() -> Result<std::shared_ptr<ReadSlot>> {
      SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
      return std::make_shared<ReadSlot>(env_, txn);
    });
  }

  std::shared_ptr<Env> env_;
  Layout layout_;
  uint64_t count_;
  std::shared_ptr<const std::vector<std::string>> keys_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;
  std::shared_ptr<const wild::Catalog> wild_;
  bool check_records_ = false;
  core::PerThread<ReadSlot> slots_;  // one per thread that has called Get()
};

class LmdbDataset : public Dataset {
 public:
  static Result<std::unique_ptr<Dataset>> Open(const std::string& address, const OpenOptions& opts) {
    std::string dir = paths::StripTrailingSlashes(address);
    const bool remote = io::IsUrl(dir);
    if ((remote || !io::IsDir(dir)) && fs::path(dir).filename() == "data.mdb") dir = io::DirName(dir);
    if (!remote && !io::IsDir(dir)) return Status::NotFound("no such LMDB directory", Location{.file = dir});
    std::unique_ptr<LmdbDataset> d(new LmdbDataset());
    d->check_records_ = opts.check_records;
    // liblmdb maps a local file: a remote data.mdb is read from a local copy (io/any_file.h).
    auto copied = io::LocalDirectoryOf(dir, {"data.mdb"}, io::CacheOptions{opts.cache_dir, opts.cache_bytes});
    if (!copied.ok() && copied.status().code() == Code::kNotFound)
      return Status::NotFound("no data.mdb in the LMDB directory", Location{.file = dir + "/data.mdb"});
    SK_ASSIGN_OR_RETURN(io::LocalCopy local, std::move(copied));
    d->local_copy_ = local.keep;
    SK_ASSIGN_OR_RETURN(d->env_, Env::Open(local.path, remote ? dir : ""));
    const Env& env = *d->env_;
    DatasetInfo& info = d->info_;
    info.format = "lmdb";
    info.address = address;
    ShardInfo shard{.path = env.data_path(), .samples = env.entries(), .bytes = env.meta().file_size};
    std::string meta_path = dir + "/" + kMetaName;
    uint64_t count = env.entries();
    std::string forced;  // OpenOptions::format_options["lmdb.layout"]: a wild layout by name
    std::string pickle_channels;  // shardkit.json's "channels" of a pickle layout written by shardkit
    if (auto it = opts.format_options.find("lmdb.layout"); it != opts.format_options.end()) forced = it->second;
    if (!forced.empty() && forced != "shardkit" && forced != "caffe") {
      auto kind = wild::Parse(forced);
      if (!kind)
        return Status::Invalid(fmt::format("unknown LMDB layout '{}' (shardkit, caffe, image or pickle)", forced),
                               Location{.file = dir});
      d->layout_ = Layout::kWild;
      SK_RETURN_IF_ERROR(d->ScanWild(*kind));
      count = d->wild_->keys.size();
      info.extra["metadata"] = "none (layout given)";
    } else if (io::Exists(meta_path)) {
      SK_ASSIGN_OR_RETURN(std::string text, io::ReadFile(meta_path));
      json j = json::parse(text, nullptr, false);
      Location mloc{.file = meta_path};
      if (j.is_discarded() || !j.is_object()) return Status::Corrupt("shardkit.json is not a JSON object", mloc);
      try {
        std::string layout = j.value("layout", "shardkit");
        if (layout == "shardkit") d->layout_ = Layout::kShardkit;
        else if (layout == "caffe") d->layout_ = Layout::kCaffe;
        else if (layout == "pickle") d->layout_ = Layout::kWild;  // decoded arrays written by shardkit
        else return Status::Unsupported(fmt::format("unknown LMDB layout '{}'", layout), mloc);
        if (j.value("version", 1) > kFormatVersion)
          return Status::Unsupported(fmt::format("shardkit.json version {} is newer than this shardkit reads ({})",
                                                 j.value("version", 1), kFormatVersion), mloc);
        count = j.at("num_samples").get<uint64_t>();
        info.class_names = j.value("class_names", std::vector<std::string>{});
        pickle_channels = j.value("channels", "bgr");
        if (pickle_channels != "bgr" && pickle_channels != "rgb")
          throw std::runtime_error("channels '" + pickle_channels + "': bgr or rgb");
        info.fields = j.value("fields", std::vector<std::string>{});
        if (j.contains("data_file")) shard.checksum = j["data_file"].value("checksum", "");
        if (d->layout_ == Layout::kCaffe && j.contains("sample_checksums")) {
          auto sums = std::make_shared<std::vector<uint64_t>>();
          for (const auto& x : j["sample_checksums"]) {
            std::string v = x.get<std::string>();
            if (v.size() != 21 || v.rfind("xxh3:", 0) != 0) throw std::runtime_error("bad sample checksum '" + v + "'");
            sums->push_back(std::stoull(v.substr(5), nullptr, 16));
          }
          if (sums->size() != j.at("num_samples").get<uint64_t>())
            throw std::runtime_error("sample_checksums does not hold one checksum per sample");
          d->sums_ = std::move(sums);
        }
      } catch (const std::exception& e) {
        return Status::Corrupt(fmt::format("shardkit.json: {}", e.what()), mloc);
      }
      if (count != env.entries())
        return Status::Corrupt(fmt::format("shardkit.json lists {} samples but the LMDB in '{}' holds {} keys", count,
                                           dir, env.entries()),
                               Location{.file = env.data_path()});
      info.extra["metadata"] = kMetaName;
      if (auto t = j.find("transform"); t != j.end()) SK_RETURN_IF_ERROR(TakeTransform(*t, kMetaName, meta_path, &info));
      if (d->layout_ == Layout::kWild) {
        SK_RETURN_IF_ERROR(d->ScanWild(wild::Kind::kPickle));
        auto cat = std::make_shared<wild::Catalog>(*d->wild_);
        cat->channels = pickle_channels;
        cat->gray = false;  // shardkit.json says the order
        cat->class_names = info.class_names;
        d->wild_ = std::move(cat);
      }
    } else {
      // No metadata: a Caffe-written LMDB, one written by another script (wild.h),
      // or a shardkit one whose json was lost.
      SK_RETURN_IF_ERROR(d->DetectLayout());
      if (d->layout_ == Layout::kWild) count = d->wild_->keys.size();
    }
    d->count_ = count;
    info.num_samples = count;
    info.extra["layout"] = d->layout_ == Layout::kShardkit ? "shardkit"
                           : d->layout_ == Layout::kCaffe  ? "caffe"
                                                           : std::string(wild::Name(d->wild_->kind));
    if (d->layout_ == Layout::kWild) {
      if (auto it = opts.format_options.find("lmdb.channels"); it != opts.format_options.end()) {
        if (it->second != "bgr" && it->second != "rgb" && it->second != "bgr-to-rgb")
          return Status::Invalid(fmt::format("lmdb.channels '{}': bgr, rgb or bgr-to-rgb", it->second),
                                 Location{.file = dir});
        auto cat = std::make_shared<wild::Catalog>(*d->wild_);
        cat->channels = it->second;
        cat->gray = false;  // the option says the order of arrays that have channels
        d->wild_ = std::move(cat);
      }
      if (d->wild_->kind == wild::Kind::kPickle && !pickle_channels.empty() && d->wild_->channels == pickle_channels)
        info.extra["channel_order"] = fmt::format("decoded arrays: {} (as shardkit.json records; not converted)",
                                                  pickle_channels);
      else if (d->wild_->kind == wild::Kind::kPickle && d->wild_->gray)
        info.extra["channel_order"] = "decoded arrays: none (2-D, grayscale; an array with channels is refused)";
      else if (d->wild_->kind == wild::Kind::kPickle)
        info.extra["channel_order"] = d->wild_->channels == "bgr"   ? "decoded arrays: bgr (as cv2.imread writes; not converted)"
                                      : d->wild_->channels == "rgb" ? "decoded arrays: rgb (said by lmdb.channels; not converted)"
                                                                    : "decoded arrays: rgb (converted from bgr on read)";
      if (info.extra.count("channel_order")) info.extra["channel_option"] = "lmdb.channels";
      info.class_names = d->wild_->class_names;
      info.extra["key_order"] = d->wild_->numeric_keys ? "numeric" : "bytes";
      if (!d->wild_->label_keys.empty()) {
        // The keys' prefixes: "image-" / "label-" (CRNN), or their kin (wild::SplitLayout).
        const std::string& image_key = d->wild_->keys.front();
        const std::string& label_key = d->wild_->label_keys.front();
        auto prefix = [](const std::string& k) { return k.substr(0, k.find_last_not_of("0123456789") + 1); };
        info.extra["key_order"] = fmt::format("numeric ({}N)", prefix(image_key));
        info.extra["labels"] = fmt::format("{}N keys: text, as a txt field (split layout)", prefix(label_key));
      }
    }
    if (d->layout_ == Layout::kShardkit) {
      info.sample_checksums = SampleChecksums::kInRecords;
      info.sample_checksums_where = "xxh3 in every record, checked on every read";
      info.extra["sample_checksums"] = info.sample_checksums_where;  // shown by `shardkit info`
    } else if (d->sums_) {
      info.sample_checksums = SampleChecksums::kList;
      info.sample_checksums_where = "xxh3 list in shardkit.json";
    }
    info.extra["locking"] = env.nolock() ? "none (MDB_NOLOCK)" : "lock.mdb";
    shard.samples = count;  // samples, not keys (side entries, split labels)
    info.shards.push_back(shard);
    info.total_bytes = shard.bytes;
    if (d->layout_ == Layout::kCaffe) SK_RETURN_IF_ERROR(d->ScanKeys());
    if (info.fields.empty() && count > 0) {
      Sample s;
      SK_ASSIGN_OR_RETURN(auto ra, d->NewRandomAccess());
      SK_RETURN_IF_ERROR(ra->Get(0, &s));
      for (const auto& f : s.fields) info.fields.push_back(f.ext);
    }
    return std::unique_ptr<Dataset>(std::move(d));
  }

  const DatasetInfo& info() const override { return info_; }
  Result<std::unique_ptr<SampleReader>> NewReader() const override {
    return std::unique_ptr<SampleReader>(new LmdbReader(env_, layout_, count_, sums_, wild_));
  }
  Result<std::shared_ptr<RandomAccess>> NewRandomAccess() const override {
    return std::shared_ptr<RandomAccess>(
        std::make_shared<LmdbRandomAccess>(env_, layout_, count_, keys_, sums_, wild_, check_records_));
  }
  // Caffe layout: the list in shardkit.json. Our layout: each record's xxh3,
  // collected by one cursor pass that parses the records without hashing
  // payloads (the sequential reader also checks them on every read).
  Result<std::vector<uint64_t>> RecordedChecksums() const override {
    if (layout_ == Layout::kCaffe) return sums_ ? *sums_ : std::vector<uint64_t>{};
    if (layout_ == Layout::kWild) return std::vector<uint64_t>{};
    std::vector<uint64_t> out;
    out.reserve(count_);
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    Location loc{.file = env_->data_path()};
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    Status st;
    MDB_val k, v;
    for (int op = MDB_FIRST; rc == 0; op = MDB_NEXT) {
      rc = mdb_cursor_get(cur, &k, &v, MDB_cursor_op(op));
      if (rc) break;
      if (!env_->InMap(k.mv_data, k.mv_size)) {
        st = Status::Corrupt("LMDB key lies outside the data file", loc);
        break;
      }
      Sample s;
      uint64_t sum = 0;
      st = DecodeRecord(env_.get(), env_, std::string_view(static_cast<const char*>(k.mv_data), k.mv_size), v,
                        out.size(), &s, /*check_payload=*/false, &sum);
      if (!st.ok()) break;
      out.push_back(sum);
    }
    if (cur) mdb_cursor_close(cur);
    env_->Release(txn);
    if (!st.ok()) return st;
    if (rc && rc != MDB_NOTFOUND) return MdbStatus(rc, "reading the records' checksums", loc);
    return out;
  }

 private:
  Status DetectLayout() {
    if (env_->entries() == 0) {
      layout_ = Layout::kShardkit;
      return Status::OK();
    }
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    if (rc == 0) rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    if (cur) mdb_cursor_close(cur);
    env_->Release(txn);
    if (rc) return MdbStatus(rc, "reading the first LMDB entry", Location{.file = env_->data_path()});
    if (!env_->InMap(v.mv_data, v.mv_size) || !env_->InMap(k.mv_data, k.mv_size))
      return Status::Corrupt("first LMDB entry lies outside the data file", Location{.file = env_->data_path()});
    std::string lkey(static_cast<const char*>(k.mv_data), k.mv_size);
    Sample s;
    if (DecodeRecord(env_.get(), env_, lkey, v, 0, &s).ok() && lkey == IndexKey(0)) {
      layout_ = Layout::kShardkit;
      info_.extra["metadata"] = "none (shardkit.json missing)";
      return Status::OK();
    }
    // Other people's layouts (image bytes, pickles): the first sample value, past
    // the `__keys__`/`__len__` entries that sort first.
    if (auto kind = FirstWildKind()) {
      layout_ = Layout::kWild;
      info_.extra["metadata"] = fmt::format("none (layout detected from the first value: {})", wild::Name(*kind));
      return ScanWild(*kind);
    }
    caffe::Datum d;
    if (ParseDatum(v.mv_data, v.mv_size, &d) && (d.has_data() || d.float_data_size() > 0)) {
      layout_ = Layout::kCaffe;
      info_.extra["metadata"] = "none (caffe LMDB)";
      return Status::OK();
    }
    return Status::Corrupt(
        fmt::format("LMDB in '{}' has no shardkit.json and its first value (key '{}') is neither a shardkit record, "
                    "a caffe Datum, an image file nor a pickle",
                    env_->dir(), lkey),
        Location{.file = env_->dir(), .key = lkey});
  }

  // The wild layout of the first value whose key is not a side entry, if any.
  std::optional<wild::Kind> FirstWildKind() {
    auto txn = env_->Acquire();
    if (!txn.ok()) return std::nullopt;
    MDB_cursor* cur = nullptr;
    std::optional<wild::Kind> kind;
    if (mdb_cursor_open(*txn, env_->dbi(), &cur) == 0) {
      MDB_val k, v;
      for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size) || !env_->InMap(v.mv_data, v.mv_size)) break;
        if (wild::IsSideEntry(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size))) continue;
        kind = wild::Detect(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
        break;
      }
      mdb_cursor_close(cur);
    }
    env_->Release(*txn);
    return kind;
  }

  // Wild layouts: one cursor scan for the sample keys (side entries apart; a
  // `__len__` is checked against the count), ordered by wild::MakeCatalog.
  Status ScanWild(wild::Kind kind) {
    std::vector<std::string> keys;
    std::optional<std::pair<std::string, Bytes>> len_entry;
    bool first_gray = false;
    std::map<std::string, Bytes> counts;  // a split layout's count entries (wild::SplitLayout)
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    Status st;
    if (rc == 0) {
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size) || !env_->InMap(v.mv_data, v.mv_size)) {
          st = Status::Corrupt(fmt::format("LMDB entry #{} lies outside the data file", keys.size()),
                               Location{.file = env_->data_path()});
          break;
        }
        std::string key(static_cast<const char*>(k.mv_data), k.mv_size);
        if (wild::IsSideEntry(key)) {
          if (key == "__len__") len_entry.emplace(key, View(env_, v.mv_data, v.mv_size));
          continue;
        }
        if (key == "num-samples" || key == "num_samples") counts[key] = View(env_, v.mv_data, v.mv_size);
        if (keys.empty() && kind == wild::Kind::kPickle)
          first_gray = wild::IsGrayArray(std::string_view(static_cast<const char*>(v.mv_data), v.mv_size));
        keys.push_back(std::move(key));
      }
      mdb_cursor_close(cur);
    }
    env_->Release(txn);
    SK_RETURN_IF_ERROR(st);
    if (rc != MDB_NOTFOUND)
      return MdbStatus(rc, fmt::format("scanning LMDB keys after {}", keys.size()), Location{.file = env_->data_path()});
    std::vector<std::string> images, labels;
    bool split = false;
    if (kind == wild::Kind::kImage) {
      if (len_entry) counts[len_entry->first] = len_entry->second;  // counts images, not keys, when split
      SK_ASSIGN_OR_RETURN(split, wild::SplitLayout(keys, counts, env_->data_path(), &images, &labels));
    }
    if (len_entry && !split)
      SK_RETURN_IF_ERROR(wild::CheckLen(len_entry->first, len_entry->second, keys.size(), env_->data_path()));
    auto cat = wild::MakeCatalog(kind, split ? std::move(images) : std::move(keys));
    cat.gray = first_gray;
    if (split) cat.label_keys = std::move(labels);
    wild_ = std::make_shared<const wild::Catalog>(std::move(cat));
    return Status::OK();
  }

  // Caffe layout: one cursor scan for the keys, so Get(i) is one mdb_get.
  Status ScanKeys() {
    auto keys = std::make_shared<std::vector<std::string>>();
    keys->reserve(size_t(count_));
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env_->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env_->dbi(), &cur);
    MDB_val k, v;
    Status st;
    if (rc == 0) {
      for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (!env_->InMap(k.mv_data, k.mv_size)) {
          st = Status::Corrupt(fmt::format("LMDB key #{} lies outside the data file", keys->size()),
                               Location{.file = env_->data_path()});
          break;
        }
        keys->emplace_back(static_cast<const char*>(k.mv_data), k.mv_size);
      }
      mdb_cursor_close(cur);
    }
    env_->Release(txn);
    SK_RETURN_IF_ERROR(st);
    if (rc != MDB_NOTFOUND)
      return MdbStatus(rc, fmt::format("scanning LMDB keys after {}", keys->size()), Location{.file = env_->data_path()});
    if (keys->size() != count_)
      return Status::Corrupt(fmt::format("LMDB in '{}' holds {} keys but lists {} entries", env_->dir(), keys->size(), count_),
                             Location{.file = env_->data_path()});
    keys_ = std::move(keys);
    return Status::OK();
  }

  DatasetInfo info_;
  std::shared_ptr<Env> env_;
  std::shared_ptr<void> local_copy_;  // a remote LMDB's local copy (io::LocalCopy), while open
  bool check_records_ = false;  // OpenOptions::check_records
  Layout layout_ = Layout::kShardkit;
  uint64_t count_ = 0;
  std::shared_ptr<const std::vector<std::string>> keys_;
  std::shared_ptr<const std::vector<uint64_t>> sums_;  // caffe layout, from shardkit.json
  std::shared_ptr<const wild::Catalog> wild_;          // wild layouts
};


}  // namespace

Result<std::unique_ptr<Dataset>> OpenDataset(const std::string& address, const OpenOptions& opts) {
  return LmdbDataset::Open(address, opts);
}

}  // namespace shardkit::formats::lmdb
