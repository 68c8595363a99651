// formats/lmdb/writer.cc: the lmdb writer (the write rules: format.cc's header comment).
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
#include "shardkit/convert.h"
#include "formats/array_sample.h"
#include "formats/transform_record.h"

namespace shardkit::formats::lmdb {

namespace {

// msgpack-cxx writes into this: either counting bytes or copying into place.
struct SpanBuffer {
  char* out = nullptr;  // null: count only
  size_t size = 0;
  void write(const char* p, size_t n) {
    if (out) std::memcpy(out + size, p, n);
    size += n;
  }
};

void PackRecord(SpanBuffer* buf, const Sample& s, uint64_t checksum) {
  msgpack::packer<SpanBuffer> pk(*buf);
  pk.pack_map(4);
  pk.pack_str(3).pack_str_body("key", 3);
  if (paths::IsValidUtf8(s.key)) pk.pack_str(uint32_t(s.key.size())).pack_str_body(s.key.data(), uint32_t(s.key.size()));
  else pk.pack_bin(uint32_t(s.key.size())).pack_bin_body(s.key.data(), uint32_t(s.key.size()));
  pk.pack_str(6).pack_str_body("fields", 6);
  pk.pack_map(uint32_t(s.fields.size()));
  for (const auto& f : s.fields) {
    pk.pack_str(uint32_t(f.ext.size())).pack_str_body(f.ext.data(), uint32_t(f.ext.size()));
    pk.pack_bin(uint32_t(f.data.size()));
    if (f.data.size()) pk.pack_bin_body(reinterpret_cast<const char*>(f.data.data()), uint32_t(f.data.size()));
  }
  pk.pack_str(4).pack_str_body("xxh3", 4);
  pk.pack_uint64(checksum);
  pk.pack_str(8).pack_str_body("key_xxh3", 8);
  pk.pack_uint64(paths::Hash(s.key.data(), s.key.size()));
}

class LmdbWriter : public SampleWriter {
 public:
  static Result<std::unique_ptr<SampleWriter>> Create(const std::string& address, const WriteOptions& opts) {
    std::string final_dir = paths::StripTrailingSlashes(address);
    Location loc{.file = final_dir};
    // (lmdb.layout and lmdb.arrays are checked against their choices by the registry.)
    // LMDB maps and writes its environment itself: it needs a local directory.
    // The staging directory, the journal and metadata files, the publish and
    // the fault points (ExternalIo) go through the seam.
    std::shared_ptr<FileSystem> fs = FileSystem::OrLocal(opts.filesystem);
    SK_RETURN_IF_ERROR(fs->LocalPath(final_dir).status());
    // Resumable state of an interrupted write: "<dir>.partial" with resume.json.
    const std::string stable = final_dir + ".partial";
    const bool has_journal = fs->Exists(stable + "/" + kResumeName);
    const bool resuming = opts.resume && has_journal;
    if (has_journal && !opts.resume && !opts.overwrite)
      return Status::Exists("an interrupted write left its committed samples here: pass --resume to continue it, "
                            "or --overwrite to start over",
                            Location{.file = stable});
    SK_ASSIGN_OR_RETURN(FileInfo existing, fs->Stat(final_dir));
    if (!opts.overwrite) {
      SK_ASSIGN_OR_RETURN(bool present, fs->OutputPresent(final_dir, OutputKind::kDirectory));
      if (present) return io::OutputExists(final_dir);
    }
    if (existing.type != FileType::kNotFound) {
      // overwrite replaces an LMDB directory (or an empty one), never anything else.
      bool replaceable = existing.type == FileType::kDirectory;
      if (replaceable && !fs->Exists(final_dir + "/data.mdb")) {
        auto entries = fs->ListDir(final_dir);
        replaceable = entries.ok() && entries->empty();
      }
      if (!replaceable)
        return Status::Exists("refusing to replace it: it is not an LMDB directory (no data.mdb)", loc);
    }
    std::unique_ptr<LmdbWriter> w(new LmdbWriter());
    w->fs_ = std::move(fs);
    w->final_ = final_dir;
    w->opts_ = opts;
    w->layout_ = WriteOption(opts, "lmdb.layout") == "caffe" ? Layout::kCaffe : Layout::kShardkit;
    w->pickle_arrays_ = WriteOption(opts, "lmdb.arrays") == "pickle";
    w->temp_ = stable;
    w->keep_state_ = opts.resume;
    w->batch_limit_ = g_batch_samples ? g_batch_samples.load() : kDefaultBatchSamples;
    w->durable_bytes_ = g_durable_bytes ? g_durable_bytes.load() : kDurableBytes;
    w->durable_every_commit_ = g_batch_samples != 0 && g_durable_bytes == 0;
    Location tl{.file = w->temp_};
    SK_RETURN_IF_ERROR(w->fs_->MakeDirs(w->temp_));
    // One writer per output: an exclusive lock on the partial directory.
    w->lock_fd_ = ::open(w->temp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->lock_fd_ < 0) return Status::FromErrno(errno, "cannot open the partial directory", tl);
    if (::flock(w->lock_fd_, LOCK_EX | LOCK_NB) != 0)
      return Status::Exists("another process is writing this output", tl);
    w->created_ = true;
    if (!resuming) {
      // A leftover of an earlier run (killed, or started over with --overwrite).
      auto entries = w->fs_->ListDir(w->temp_);
      if (entries.ok())
        for (const auto& e : *entries) (void)w->fs_->RemoveAll(e.path);
    }
    w->digest_ = XXH3_createState();
    XXH3_64bits_reset(w->digest_);
    if (resuming) {
      SK_RETURN_IF_ERROR(w->LoadJournal());
      SK_RETURN_IF_ERROR(w->CheckPartial());
    }
    int rc = mdb_env_create(&w->env_);
    if (rc) return MdbStatus(rc, "mdb_env_create", tl);
    w->map_size_ = g_initial_map ? g_initial_map.load() : kDefaultMapSize;
    rc = mdb_env_set_mapsize(w->env_, w->map_size_);
    if (rc) return MdbStatus(rc, "mdb_env_set_mapsize", tl);
    // No WRITEMAP: it would ftruncate data.mdb to the whole (1 TiB) map size.
    rc = mdb_env_open(w->env_, w->temp_.c_str(), MDB_NOSYNC | MDB_NOMETASYNC, 0644);
    if (rc) return MdbStatus(rc, "cannot create the LMDB environment", tl);
    w->max_key_ = size_t(mdb_env_get_maxkeysize(w->env_));
    if (w->layout_ == Layout::kCaffe) w->tj_ = tjInitDecompress();
    if (resuming) SK_RETURN_IF_ERROR(w->TrimToJournal());
    SK_RETURN_IF_ERROR(w->BeginTxn());
    return std::unique_ptr<SampleWriter>(std::move(w));
  }

  ~LmdbWriter() override {
    if (txn_) mdb_txn_abort(txn_);
    if (env_) mdb_env_close(env_);
    if (tj_) tjDestroy(tj_);
    if (digest_) XXH3_freeState(digest_);
    // A write stopped by a signal (RequestStop) stays resumable, as one killed outright.
    if (created_ && !finished_ && !keep_state_ && StopRequested() == 0) (void)fs_->RemoveAll(temp_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  Status Write(const Sample& s) override {
    if (failed_) return Status::Invalid("writer already failed", Location{.file = final_});
    if (finished_) return Status::Invalid("Write() after Finish()", Location{.file = final_});
    if (skipped_ < resume_samples_) return Skip(s);
    Status st = WriteOne(s);
    if (!st.ok()) {
      // An invalid sample is refused without harming the rest; an LMDB failure ends the writer.
      if (st.code() != Code::kInvalidArgument && st.code() != Code::kUnsupported) st = Resumable(std::move(st));
    }
    return st;
  }

  Result<WriteSummary> Finish() override {
    Location loc{.file = final_};
    if (failed_) return Status::Invalid("writer failed earlier; nothing was finished", loc);
    if (finished_) return Status::Invalid("Finish() called twice", loc);
    if (skipped_ < resume_samples_) return resume::SourceEndedEarly(skipped_, resume_samples_, Location{.file = temp_});
    Result<WriteSummary> r = FinishImpl();
    if (!r.ok() && !finished_) return Resumable(std::move(r).take_status());
    return r;
  }

 private:
  Result<WriteSummary> FinishImpl() {
    Location loc{.file = final_};
    failed_ = true;  // until proven otherwise
    SK_RETURN_IF_ERROR(CommitTxn());
    // data.mdb is complete now: without MDB_WRITEMAP every commit has written
    // its pages with pwrite, and mdb_env_sync only flushes them. So its XXH3
    // (read from the page cache through a mapping) runs while the disk syncs.
    std::string data = temp_ + "/data.mdb";
    Result<uint64_t> hash = Status::Internal("not hashed");
    std::thread hasher;
    try {
      hasher = std::thread([&] { hash = HashMapped(data); });
    } catch (const std::system_error&) {
      hash = HashMapped(data);  // no thread to spare: one after the other
    }
    Status synced = fs_->ExternalIo(data, ExternalOp::kSync);
    int rc = synced.ok() ? mdb_env_sync(env_, 1) : 0;
    if (hasher.joinable()) hasher.join();
    SK_RETURN_IF_ERROR(synced);
    if (rc) return MdbStatus(rc, "mdb_env_sync", Location{.file = temp_});
    committed_ += unsynced_;
    unsynced_ = 0;
    SK_RETURN_IF_ERROR(hash.status());
    mdb_env_close(env_);
    env_ = nullptr;
    std::error_code ec;
    uint64_t data_bytes = fs::file_size(data, ec);
    ShardInfo shard{.path = final_ + "/data.mdb", .samples = count_, .bytes = data_bytes,
                    .checksum = paths::ChecksumString(*hash)};
    json j;
    j["format"] = "shardkit-lmdb";
    j["version"] = kFormatVersion;
    j["layout"] = pickle_ ? "pickle" : layout_ == Layout::kShardkit ? "shardkit" : "caffe";
    j["num_samples"] = count_;
    j["class_names"] = opts_.class_names;
    j["fields"] = std::vector<std::string>(fields_.begin(), fields_.end());
    j["payload_bytes"] = payload_bytes_;
    j["data_file"] = {{"path", "data.mdb"}, {"bytes", data_bytes}, {"checksum", shard.checksum}};
    // The transform applied at conversion (WriteOptions::transform, a JSON object).
    if (!opts_.transform.empty()) {
      SK_ASSIGN_OR_RETURN(j["transform"], TransformRecord(opts_.transform, loc));
    }
    if (pickle_) {
      j["key"] = "f\"{idx}\" sample index (decimal, no padding; read in numeric order)";
      j["value"] = "pickle.dumps((numpy.ndarray, label int or None), protocol=4)";
      j["channels"] = opts_.array_channels == "bgr" ? "bgr" : "rgb";
    } else if (layout_ == Layout::kShardkit) {
      j["key"] = "%010d sample index";
      j["value"] = "msgpack map {\"key\": str|bin, \"fields\": {ext: bin}, \"xxh3\": uint64, \"key_xxh3\": uint64}";
    } else {
      j["key"] = "%08d_<key>.<image ext>";
      j["value"] = "caffe.Datum protobuf (encoded=true)";
      j["sample_checksums"] = caffe_sums_;
    }
    std::string text = j.dump(1);
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(temp_ + "/" + kMetaName, text, true, fs_));
    // Complete: the journal (when a durable point wrote one) is not part of the output.
    const std::string journal = temp_ + "/" + kResumeName;
    if (fs_->Exists(journal)) {
      SK_RETURN_IF_ERROR(fs_->Remove(journal));
      SK_RETURN_IF_ERROR(fs_->SyncDir(temp_));
    }
    // Into place (an existing output, with overwrite, is moved aside and removed).
    SK_RETURN_IF_ERROR(
        fs_->Publish(temp_, final_,
                     PublishOptions{.replace = opts_.overwrite, .published = &finished_, .local_only = {"lock.mdb"}})
            .At(loc));
    failed_ = false;
    WriteSummary sum;
    sum.samples = count_;
    sum.bytes = data_bytes + text.size();
    sum.shards.push_back(shard);
    return sum;
  }

  LmdbWriter() = default;

  // A failure that ends the writer: the committed samples stay (with resume.json)
  // and the message says how to continue.
  Status Resumable(Status st) {
    failed_ = true;
    if (!journal_written_) return st;
    keep_state_ = true;
    return Status(st.code(),
                  fmt::format("{}; the {} samples committed so far are kept in '{}': run the same conversion "
                              "again with --resume to continue",
                              st.message(), committed_, temp_),
                  st.where());
  }

  json JournalOptions() const {
    json o;
    o["layout"] = layout_ == Layout::kShardkit ? "shardkit" : "caffe";
    o["class_names"] = opts_.class_names;
    // The transform and the choice of samples (WriteOptions::transform): a resume with
    // other ones is refused by name. Absent when there is none, as journals before it.
    if (!opts_.transform.empty()) o["transform"] = opts_.transform;
    return o;
  }

  // resume.json: the samples committed so far and a digest of them (XXH3 over
  // each sample's checksum and key), rewritten after every durable commit.
  Status WriteJournal() {
    json j;
    j["format"] = "shardkit-lmdb-partial";
    j["version"] = 1;
    j["options"] = JournalOptions();
    j["samples"] = committed_;
    j["digest"] = paths::ChecksumString(XXH3_64bits_digest(digest_));
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(temp_ + "/" + kResumeName, j.dump(1) + "\n", true, fs_));
    journal_written_ = true;
    return Status::OK();
  }

  Status LoadJournal() {
    std::string path = temp_ + "/" + kResumeName;
    Location where{.file = path};
    SK_ASSIGN_OR_RETURN(std::string text, fs_->ReadFile(path));
    uint64_t samples = 0, digest = 0;
    try {
      json j = json::parse(text);
      if (j.value("format", "") != "shardkit-lmdb-partial" || j.value("version", 0) != 1)
        return Status::Corrupt("cannot resume: not a shardkit LMDB journal", where);
      SK_RETURN_IF_ERROR(resume::CheckSameOptions(j["options"], JournalOptions(), where));
      samples = j.at("samples").get<uint64_t>();
      auto d = paths::ParseChecksumString(j.at("digest").get<std::string>());
      if (!d) return Status::Corrupt("cannot resume: bad digest", where);
      digest = *d;
    } catch (const std::exception& e) {
      return Status::Corrupt(fmt::format("cannot resume: bad journal: {}", e.what()), where);
    }
    resume_samples_ = samples;
    resume_digest_ = digest;
    return Status::OK();
  }

  // Before the writer opens the partial environment: reads it the way a reader
  // does (meta pages, the B-tree walked through the map, every record of the
  // first resume_samples_ decoded and, in the shardkit layout, checked against
  // its own xxh3), and keeps each of those samples' checksum for Skip(). Commits
  // between durable points are not synced (MDB_NOSYNC): after a power loss the
  // environment may be damaged, and then the resume is refused instead of
  // building on it.
  Status CheckPartial() {
    std::string data = temp_ + "/data.mdb";
    if (!fs_->Exists(data)) return Status::OK();  // TrimToJournal reports the missing samples
    auto refuse = [&](const Status& why) {
      return Status::Corrupt(fmt::format("cannot resume: the committed samples in '{}' are damaged ({}); start over "
                                         "with --overwrite",
                                         temp_, why.message()),
                             why.where().file.empty() ? Location{.file = data} : why.where());
    };
    auto opened = Env::OpenNew(temp_);
    if (!opened.ok()) return refuse(opened.status());
    std::shared_ptr<Env> env = std::move(opened).value();
    if (env->entries() < resume_samples_) return Status::OK();  // TrimToJournal says so
    SK_ASSIGN_OR_RETURN(MDB_txn * txn, env->Acquire());
    MDB_cursor* cur = nullptr;
    int rc = mdb_cursor_open(txn, env->dbi(), &cur);
    Status st;
    resume_sums_.clear();
    resume_sums_.reserve(resume_samples_);
    MDB_val k, v;
    for (uint64_t i = 0; rc == 0 && st.ok() && i < resume_samples_; ++i) {
      rc = mdb_cursor_get(cur, &k, &v, i == 0 ? MDB_FIRST : MDB_NEXT);
      if (rc) break;
      if (!env->InMap(k.mv_data, k.mv_size)) {
        st = Status::Corrupt(fmt::format("LMDB key of sample {} lies outside the data file", i), Location{.file = data});
        break;
      }
      std::string_view lkey(static_cast<const char*>(k.mv_data), k.mv_size);
      Sample s;
      if (layout_ == Layout::kShardkit) {
        if (lkey != IndexKey(i)) {
          st = Status::Corrupt(fmt::format("LMDB key '{}' where '{}' was expected", lkey, IndexKey(i)),
                               Location{.file = data, .index = int64_t(i)});
          break;
        }
        uint64_t sum = 0;
        st = DecodeRecord(env.get(), env, lkey, v, i, &s, /*check_payload=*/true, &sum);
        if (st.ok()) resume_sums_.push_back(sum ? sum : s.checksum());
      } else {
        st = DecodeDatum(env.get(), env, lkey, v, i, &s);
        if (st.ok()) resume_sums_.push_back(s.checksum());
      }
    }
    if (cur) mdb_cursor_close(cur);
    env->Release(txn);
    if (!st.ok()) return refuse(st);
    if (rc) return refuse(MdbStatus(rc, "reading the committed samples", Location{.file = data}));
    return Status::OK();
  }

  // The environment may hold more than the journal counts: transactions
  // committed after the last durable point. Those entries (the last ones, keys
  // being in sample order) go, and are written again.
  Status TrimToJournal() {
    const uint64_t samples = resume_samples_, digest = resume_digest_;
    SK_RETURN_IF_ERROR(BeginTxn());
    MDB_stat st;
    int rc = mdb_stat(txn_, dbi_, &st);
    if (rc) return MdbStatus(rc, "mdb_stat", Location{.file = temp_});
    if (st.ms_entries < samples)
      return Status::Corrupt(fmt::format("cannot resume: the environment holds {} samples, the journal says {} "
                                         "were committed; start over with --overwrite",
                                         st.ms_entries, samples),
                             Location{.file = temp_ + "/data.mdb"});
    if (st.ms_entries > samples) {
      MDB_cursor* cur = nullptr;
      rc = mdb_cursor_open(txn_, dbi_, &cur);
      for (uint64_t i = samples; rc == 0 && i < st.ms_entries; ++i) {
        MDB_val k, v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
        if (rc == 0) rc = mdb_cursor_del(cur, 0);
      }
      if (cur) mdb_cursor_close(cur);
      if (rc) return MdbStatus(rc, "removing samples past the journal", Location{.file = temp_});
    }
    SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kWrite));
    rc = mdb_txn_commit(txn_);
    txn_ = nullptr;
    if (rc) return MdbStatus(rc, "committing a write transaction", Location{.file = temp_});
    resume_samples_ = samples;
    resume_digest_ = digest;
    journal_written_ = true;
    return Status::OK();
  }

  // A sample the resumed write had committed: counted into the digest (checked
  // after the last one) and into the metadata, not written again.
  Status Skip(const Sample& s) {
    uint64_t sum = s.checksum();
    if (skipped_ < resume_sums_.size() && resume_sums_[skipped_] != sum) {
      failed_ = true;
      return Status::Invalid(fmt::format("resume: the first {} samples differ from the ones the interrupted write "
                                         "committed: sample {} ('{}') has checksum {}, the committed one {}; resume "
                                         "needs the same source, in the same order, with the same options; start "
                                         "over with --overwrite",
                                         resume_samples_, skipped_, s.key, paths::ChecksumString(sum),
                                         paths::ChecksumString(resume_sums_[skipped_])),
                             Location{.file = temp_, .key = s.key, .index = int64_t(skipped_)});
    }
    paths::AddSampleToDigest(digest_, s.key, sum);
    ++skipped_;
    ++count_;
    ++committed_;
    payload_bytes_ += s.bytes();
    for (const auto& f : s.fields) fields_.insert(f.ext);
    if (layout_ == Layout::kCaffe) caffe_sums_.push_back(paths::ChecksumString(sum));
    if (skipped_ == resume_samples_ && XXH3_64bits_digest(digest_) != resume_digest_) {
      failed_ = true;
      return Status::Invalid(fmt::format("resume: the first {} samples differ from the ones the interrupted write "
                                         "committed (keys or bytes changed): resume needs the same source, in the "
                                         "same order, with the same options; start over with --overwrite",
                                         resume_samples_),
                             Location{.file = temp_, .key = s.key, .index = int64_t(skipped_ - 1)});
    }
    return Status::OK();
  }

  Status BeginTxn() {
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn_);
    if (rc) return MdbStatus(rc, "cannot begin a write transaction", Location{.file = temp_});
    rc = mdb_dbi_open(txn_, nullptr, 0, &dbi_);
    if (rc) return MdbStatus(rc, "cannot open the unnamed database", Location{.file = temp_});
    return Status::OK();
  }

  // Checks the sample and builds its LMDB key (and, for caffe, its Datum).
  Status Prepare(const Sample& s, uint64_t index, std::string* lkey, std::string* datum) {
    Location loc{.file = final_, .key = s.key, .index = int64_t(index)};
    if (s.key.empty()) return Status::Invalid("empty sample key", loc);
    if (s.key.find('\0') != std::string::npos) return Status::Invalid(fmt::format("sample key '{}' holds a NUL byte", s.key), loc);
    for (const auto& f : s.fields)
      if (f.ext.empty()) return Status::Invalid(fmt::format("sample '{}' has a field with an empty name", s.key), loc);
    if (pickle_) return PreparePickle(s, index, lkey, datum);
    if (layout_ == Layout::kShardkit) {
      *lkey = IndexKey(index);
      return Status::OK();
    }
    if (index > 99999999)
      return Status::Unsupported("the caffe layout's %08d key prefix holds at most 100000000 samples", loc);
    const Field* img = nullptr;
    for (const auto& f : s.fields) {
      if (f.ext == "cls") continue;
      if (!IsImageExt(f.ext) || img)
        return Status::Unsupported(
            fmt::format("sample '{}': the caffe layout holds one image and a label, not field '{}'", s.key, f.ext), loc);
      img = &f;
    }
    if (!img) return Status::Invalid(fmt::format("sample '{}' has no image field for the caffe layout", s.key), loc);
    // Caffe's convert_imageset keys by the listed file name as it is: "x_0.JPEG" stays upper-case.
    *lkey = fmt::format("{:08d}_{}.{}", index, s.key, img->source_ext.empty() ? img->ext : img->source_ext);
    if (lkey->size() > max_key_)
      return Status::Invalid(fmt::format("LMDB key '{}' for sample '{}' is {} bytes, over LMDB's limit of {}", *lkey,
                                         s.key, lkey->size(), max_key_),
                             loc);
    caffe::Datum d;
    ImageShape shape = PeekShape(tj_, img->data);
    if (shape.channels) d.set_channels(shape.channels);
    if (shape.height) d.set_height(shape.height);
    if (shape.width) d.set_width(shape.width);
    d.set_data(img->data.data(), img->data.size());
    if (s.find("cls")) {
      auto label = s.label();
      if (!label || *label < INT32_MIN || *label > INT32_MAX)
        return Status::Invalid(fmt::format("sample '{}': cls '{}' is not an int32 label", s.key, s.find("cls")->data.str()), loc);
      d.set_label(int32_t(*label));
    }
    d.set_encoded(true);
    if (!d.SerializeToString(datum)) return Status::Internal("Datum serialization failed", loc);
    return Status::OK();
  }

  // The layout "pickle" (option lmdb.arrays): chosen at the first sample when it
  // holds a decoded array ("npy") and the layout is shardkit's. Key f"{idx}", value
  // pickle.dumps((ndarray, label)) (wild::PickleArray); the array as it is (no colour
  // conversion: shardkit.json's "channels" says what the source said).
  Status PreparePickle(const Sample& s, uint64_t index, std::string* lkey, std::string* value) {
    Location loc{.file = final_, .key = s.key, .index = int64_t(index)};
    SK_ASSIGN_OR_RETURN(ArraySample a, formats::ParseArraySample(s, loc, "the LMDB pickle layout",
                                                                 "--lmdb-arrays record keeps any sample"));
    *lkey = std::to_string(index);
    *value = wild::PickleArray(a.arr, a.label);
    return Status::OK();
  }

  // Puts one sample into the open transaction. Returns the raw LMDB code.
  int Put(const Sample& s, const std::string& lkey, const std::string& datum, uint64_t checksum) {
    MDB_val k{lkey.size(), const_cast<char*>(lkey.data())};
    if (pickle_) {  // keys f"{idx}" do not sort as bytes ("10" < "2"): no MDB_APPEND
      MDB_val v{datum.size(), const_cast<char*>(datum.data())};
      return mdb_put(txn_, dbi_, &k, &v, 0);
    }
    if (layout_ == Layout::kCaffe) {
      MDB_val v{datum.size(), const_cast<char*>(datum.data())};
      return mdb_put(txn_, dbi_, &k, &v, MDB_APPEND);
    }
    SpanBuffer count;
    PackRecord(&count, s, checksum);
    MDB_val v{count.size, nullptr};
    int rc = mdb_put(txn_, dbi_, &k, &v, MDB_APPEND | MDB_RESERVE);
    if (rc) return rc;
    SpanBuffer out{static_cast<char*>(v.mv_data), 0};
    PackRecord(&out, s, checksum);
    return 0;
  }

  struct Pending {
    Sample sample;
    std::string lkey, datum;
    uint64_t checksum;
  };

  Status WriteOne(const Sample& s) {
    // Only when the first sample fits the layout ((array, label)): any other keeps the
    // shardkit records, which hold everything.
    if (count_ == 0 && layout_ == Layout::kShardkit && pickle_arrays_ && s.find("npy") &&
        [&] {
          std::string k, v;
          return PreparePickle(s, 0, &k, &v).ok();
        }()) {
      if (opts_.resume) {
        keep_state_ = false;  // nothing was committed: leave no partial directory behind
        failed_ = true;
        return Status::Unsupported(
            "--resume: the LMDB pickle layout (decoded arrays as pickle.dumps((array, label))) keeps no journal; "
            "write shardkit records (--lmdb-arrays record) to resume, or drop --resume",
            Location{.file = final_, .key = s.key});
      }
      pickle_ = true;
    }
    Pending p{s, {}, {}, s.checksum()};
    SK_RETURN_IF_ERROR(Prepare(s, count_, &p.lkey, &p.datum));
    for (;;) {
      int rc = Put(p.sample, p.lkey, p.datum, p.checksum);
      if (rc == 0) break;
      if (rc == MDB_MAP_FULL) {
        SK_RETURN_IF_ERROR(GrowAndReplay(p.sample.bytes() + p.datum.size()));
        continue;
      }
      if (rc == MDB_KEYEXIST)
        return Status::Internal(fmt::format("LMDB key '{}' out of order for MDB_APPEND", p.lkey),
                                Location{.file = final_, .key = s.key});
      return MdbStatus(rc, fmt::format("mdb_put of LMDB key '{}' (sample '{}')", p.lkey, s.key),
                       Location{.file = temp_, .key = s.key, .index = int64_t(count_)});
    }
    ++count_;
    paths::AddSampleToDigest(digest_, s.key, p.checksum);
    payload_bytes_ += s.bytes();
    batch_bytes_ += s.bytes();
    for (const auto& f : s.fields) fields_.insert(f.ext);
    if (layout_ == Layout::kCaffe) caffe_sums_.push_back(paths::ChecksumString(p.checksum));
    if (pickle_) p.sample = Sample{};  // the value holds the array: no second copy kept for a replay
    batch_.push_back(std::move(p));
    if (batch_.size() >= batch_limit_ || batch_bytes_ >= kBatchBytes) return Commit();
    return Status::OK();
  }

  // MDB_MAP_FULL: abort the open transaction, grow the map with no transaction
  // active, and put the batch's samples again.
  Status GrowAndReplay(size_t need) {
    mdb_txn_abort(txn_);
    txn_ = nullptr;
    for (;;) {
      size_t grow = std::max(map_size_, need * 2 + (size_t(1) << 20));
      map_size_ += grow;
      int rc = mdb_env_set_mapsize(env_, map_size_);
      if (rc) return MdbStatus(rc, fmt::format("growing the LMDB map to {} bytes", map_size_), Location{.file = temp_});
      ++grows_;
      SK_RETURN_IF_ERROR(BeginTxn());
      rc = 0;
      for (const auto& q : batch_) {
        rc = Put(q.sample, q.lkey, q.datum, q.checksum);
        if (rc) break;
      }
      if (rc == 0) return Status::OK();
      mdb_txn_abort(txn_);
      txn_ = nullptr;
      if (rc != MDB_MAP_FULL) return MdbStatus(rc, "replaying a batch after growing the map", Location{.file = temp_});
    }
  }

  // Commits the open transaction (not synced) and begins the next one. Every
  // kDurableBytes / kDurableSeconds (or every commit when a test set the batch
  // size) it also makes a durable point: what the journal counts is on disk.
  Status Commit() {
    SK_RETURN_IF_ERROR(CommitTxn());
    bool due = durable_every_commit_ || unsynced_bytes_ >= durable_bytes_ ||
               std::chrono::duration<double>(std::chrono::steady_clock::now() - last_durable_).count() >= kDurableSeconds;
    if (due) SK_RETURN_IF_ERROR(MakeDurable());
    return BeginTxn();
  }

  // Durable before the journal says so: a resume after a crash or power loss
  // finds every sample the journal counts.
  Status MakeDurable() {
    SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kSync));
    int rc = mdb_env_sync(env_, 1);
    if (rc) return MdbStatus(rc, "mdb_env_sync", Location{.file = temp_});
    committed_ += unsynced_;
    unsynced_ = 0;
    unsynced_bytes_ = 0;
    last_durable_ = std::chrono::steady_clock::now();
    if (pickle_) return Status::OK();  // no journal: the pickle layout cannot be resumed (WriteOne)
    return WriteJournal();
  }

  // Commits the open transaction; txn_ is null after it.
  Status CommitTxn() {
    for (;;) {
      SK_RETURN_IF_ERROR(fs_->ExternalIo(temp_ + "/data.mdb", ExternalOp::kWrite));
      int rc = mdb_txn_commit(txn_);
      txn_ = nullptr;
      if (rc == 0) break;
      if (rc != MDB_MAP_FULL) return MdbStatus(rc, "committing a write transaction", Location{.file = temp_});
      // The commit itself ran out of map (free-list pages): grow and replay.
      SK_RETURN_IF_ERROR(BeginTxn());  // GrowAndReplay aborts it first
      SK_RETURN_IF_ERROR(GrowAndReplay(0));
    }
    unsynced_ += batch_.size();
    unsynced_bytes_ += batch_bytes_;
    writeback_bytes_ += batch_bytes_;
    if (writeback_bytes_ >= kWritebackBytes) {
      writeback_bytes_ = 0;
      int fd = -1;
      // A hint only: durability comes from mdb_env_sync, so its result is ignored.
      if (mdb_env_get_fd(env_, &fd) == 0 && fd >= 0) (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    batch_.clear();
    batch_bytes_ = 0;
    return Status::OK();
  }

  std::shared_ptr<FileSystem> fs_;  // opts_.filesystem or the local one
  std::string final_, temp_;
  WriteOptions opts_;
  Layout layout_ = Layout::kShardkit;
  bool pickle_arrays_ = true;  // option lmdb.arrays "pickle"
  bool pickle_ = false;  // layout "pickle" (decoded arrays), decided at the first sample
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  tjhandle tj_ = nullptr;
  size_t map_size_ = 0, max_key_ = 511, batch_limit_ = kDefaultBatchSamples;
  uint64_t count_ = 0, payload_bytes_ = 0, batch_bytes_ = 0, grows_ = 0;
  std::vector<Pending> batch_;
  std::set<std::string> fields_;
  std::vector<std::string> caffe_sums_;
  bool created_ = false, finished_ = false, failed_ = false;
  // Resumable writes.
  int lock_fd_ = -1;
  bool keep_state_ = false, journal_written_ = false;
  XXH3_state_t* digest_ = nullptr;  // of the samples written (committed or in the open batch)
  uint64_t committed_ = 0;          // samples committed and synced (what resume.json counts)
  uint64_t unsynced_ = 0, unsynced_bytes_ = 0;  // committed since the last durable point
  uint64_t writeback_bytes_ = 0;                // committed since the last writeback hint
  bool durable_every_commit_ = false;
  uint64_t durable_bytes_ = kDurableBytes;
  std::chrono::steady_clock::time_point last_durable_ = std::chrono::steady_clock::now();
  uint64_t resume_samples_ = 0, resume_digest_ = 0, skipped_ = 0;
  std::vector<uint64_t> resume_sums_;  // checksums of the committed samples, read back by CheckPartial()
};


}  // namespace

Result<std::unique_ptr<SampleWriter>> CreateWriter(const std::string& address, const WriteOptions& opts) {
  return LmdbWriter::Create(address, opts);
}

}  // namespace shardkit::formats::lmdb
