// The wds writer (writer.h); its journal and resume are in journal.cc.
#include "formats/wds/writer.h"

#include <locale.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include <fmt/format.h>

#include "core/resume.h"
#include "shardkit/convert.h"
#include "core/paths.h"
#include "formats/tar/tar.h"
#include "formats/wds/manifest.h"
#include "formats/wds/names.h"
#include "formats/wds/parts.h"

namespace shardkit::formats::wds {

namespace {

// Makes libarchive's name conversion independent of the process locale: names
// are taken as UTF-8, and bytes that are not UTF-8 are stored as they are
// (libarchive then marks the entry "hdrcharset=BINARY").
class Utf8Locale {
 public:
  Utf8Locale() {
    static locale_t loc = [] {
      locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
      return l ? l : newlocale(LC_CTYPE_MASK, "C", locale_t(0));
    }();
    old_ = loc ? uselocale(loc) : locale_t(0);
  }
  ~Utf8Locale() {
    if (old_) uselocale(old_);
  }

 private:
  locale_t old_;
};

// The key as written: with KeyDots::kReplace, '.' in the last component -> '_'.
std::string WrittenKey(const std::string& key, KeyDots dots) {
  std::string k = key;
  size_t base = k.rfind('/');
  base = base == std::string::npos ? 0 : base + 1;
  if (dots == KeyDots::kReplace)
    for (size_t i = base; i < k.size(); ++i)
      if (k[i] == '.') k[i] = '_';
  return k;
}

// Upper bound of the bytes a sample adds to a shard (headers, pax records,
// padding): what Write() tests against the shard size before writing it.
uint64_t NeedBytes(const std::string& key, const std::vector<const Field*>& fields) {
  uint64_t need = 0;
  for (const Field* f : fields) {
    size_t name_len = key.size() + 1 + f->ext.size();
    need += tar::kBlock + (f->data.size() + tar::kBlock - 1) / tar::kBlock * tar::kBlock;
    need += tar::kBlock + (2 * name_len + 64 + tar::kBlock - 1) / tar::kBlock * tar::kBlock;  // pax header
  }
  return need;
}

}  // namespace

WdsWriter::WdsWriter(std::string pattern, WriteOptions opts)
    : pattern_(std::move(pattern)),
      opts_(std::move(opts)),
      manifest_(ManifestPathFor(pattern_)),
      record_(opts_.part.count > 0 ? PartRecordPath(pattern_, opts_.part.index, opts_.part.count) : ""),
      journal_(record_.empty() ? manifest_ + ".partial" : record_ + ".partial"),
      keep_state_(opts_.resume) {
  digest_ = XXH3_createState();
  XXH3_64bits_reset(digest_);
}

WdsWriter::~WdsWriter() {
  if (!finished_) {
    AbortShard();
    if (!keep_state_ && StopRequested() == 0) {  // a stopped write stays resumable
      auto& fs = *FileSystem::OrLocal(opts_.filesystem);
      for (const auto& p : committed_) (void)fs.Remove(p);
      if (owns_journal_) (void)fs.Remove(journal_);
    }
  }
  if (hash_) XXH3_freeState(hash_);
  if (digest_) XXH3_freeState(digest_);
}

Result<std::unique_ptr<SampleWriter>> WdsWriter::Make(const std::string& pattern, const WriteOptions& opts) {
  SK_RETURN_IF_ERROR(paths::CheckShardPattern(pattern));
  auto slash = pattern.rfind('/');
  if (slash != std::string::npos && pattern.substr(0, slash).find('%') != std::string::npos)
    return Status::Invalid(fmt::format("bad shard pattern '{}': the %d conversion must be in the file name, "
                                       "not in a directory",
                                       pattern));
  std::string first = paths::FormatShardPattern(pattern, 0);
  if (opts.write_index && IdxPathFor(first) == IdxPathFor(paths::FormatShardPattern(pattern, 1)))
    return Status::Invalid(fmt::format("shard pattern '{}': DALI index names (base name up to its first dot, "
                                       "plus .idx) would be the same for every shard; put the %d before any "
                                       "dot in the file name or turn index writing off",
                                       pattern));
  if (opts.shard_size < 2 * tar::kBlock)
    return Status::Invalid(fmt::format("shard size {} bytes is too small: a tar shard needs at least {} bytes (its "
                                       "end-of-archive blocks); give --shard-size 1KiB or more",
                                       opts.shard_size, 2 * tar::kBlock));
  auto w = std::make_unique<WdsWriter>(pattern, opts);
  if (w->part()) first = paths::FormatShardPattern(pattern, w->ShardNumber(0));
  bool resuming = opts.resume && io::Exists(w->journal_);
  if (!opts.overwrite && !resuming) {
    if (io::Exists(w->journal_))
      return Status::Exists("an interrupted write left its journal here: pass --resume to continue it, or "
                            "--overwrite to start over",
                            Location{.file = w->journal_});
    std::vector<std::string> outputs;
    // A part with no shards (more parts than shards) writes only its record; the
    // shard after it belongs to the next part.
    if (!w->part() || !opts.shard_plan.empty()) outputs.push_back(first);
    outputs.push_back(w->manifest_);
    if (w->part()) outputs.push_back(w->record_);
    for (const std::string& p : outputs) {
      SK_ASSIGN_OR_RETURN(bool present, FileSystem::OrLocal(opts.filesystem)->OutputPresent(p, OutputKind::kFile));
      if (present) return io::OutputExists(p);
    }
  }
  std::string dir = io::DirName(first);
  auto& fs = *FileSystem::OrLocal(opts.filesystem);
  SK_RETURN_IF_ERROR(fs.MakeDirs(dir));
  SK_RETURN_IF_ERROR(io::CheckWritableDir(dir));
  if (w->part()) {
    // One process per part: a second one given the same part fails at once instead
    // of racing the first over the same files.
    std::string lock = w->record_ + ".lock";
    auto locked = io::FileLock::TryLock(lock);
    if (!locked.ok() && locked.status().code() == Code::kAlreadyExists)
      return Status::Exists(fmt::format("part {}/{} is being written by another process right now (it holds the "
                                        "lock); two processes were given the same part",
                                        opts.part.index, opts.part.count),
                            Location{.file = lock});
    if (!locked.ok()) return std::move(locked).take_status();
    w->lock_ = std::move(locked).value();
    // A merged manifest from an earlier run would describe shards this part replaces.
    if (opts.overwrite) {
      Status removed = fs.Remove(w->manifest_);
      if (!removed.ok()) return Status(removed.code(), "cannot remove the old manifest: " + removed.message(),
                                       Location{.file = w->manifest_});
    }
  }
  w->RemoveStaleTemps(0);
  if (resuming) {
    SK_RETURN_IF_ERROR(w->LoadJournal());
    w->RemoveStaleTemps(w->summary_.shards.size());
  } else {
    // The journal exists from the start, so that a write killed before its
    // first shard is committed can be resumed (from nothing) too.
    SK_RETURN_IF_ERROR(w->WriteJournal());
  }
  return std::unique_ptr<SampleWriter>(std::move(w));
}

Status WdsWriter::Write(const Sample& in) {
  if (finished_) return Status::Internal("Write() after Finish()");
  if (!error_.ok()) return error_;
  std::string key = in.key;
  Location where{.key = in.key, .index = int64_t(total_samples_)};
  SK_RETURN_IF_ERROR(paths::CheckSafeKey(key).At(where));
  size_t base = key.rfind('/');
  base = base == std::string::npos ? 0 : base + 1;
  if (key.find('.', base) != std::string::npos) {
    if (opts_.key_dots != KeyDots::kReplace)
      return Status::Invalid(fmt::format("key '{}' has a dot in its last path component, which a WebDataset "
                                         "reader would take as the start of the extension; pass "
                                         "--key-dots=replace to write such keys with '_' in place of '.'",
                                         in.key),
                             where);
    for (size_t i = base; i < key.size(); ++i)
      if (key[i] == '.') key[i] = '_';
  }
  if (in.fields.empty())
    return Status::Invalid("sample has no fields: it cannot be stored in a tar shard", where);
  std::vector<const Field*> fields;
  for (const auto& f : in.fields) {
    if (f.ext.empty() || f.ext.front() == '.' || f.ext.find('/') != std::string::npos ||
        f.ext.find('\0') != std::string::npos || paths::Lower(f.ext) != f.ext)
      return Status::Invalid(fmt::format("bad field extension '{}' (expected lowercase, no '/', no leading dot)",
                                         f.ext),
                             where);
    fields.push_back(&f);
  }
  std::sort(fields.begin(), fields.end(), [](const Field* a, const Field* b) { return a->ext < b->ext; });
  for (size_t i = 1; i < fields.size(); ++i)
    if (fields[i]->ext == fields[i - 1]->ext)
      return Status::Invalid(fmt::format("field '{}' appears twice", fields[i]->ext), where);
  if (shard_samples_ > 0 && key == prev_key_)
    return Status::Invalid("same key as the previous sample: the two would merge into one on read", where);
  const uint64_t sample_sum = in.checksum();
  if (total_slots_ < resume_slots_) return Skip(key, sample_sum, where);

  // Upper bound of the bytes this sample adds (headers, pax records, padding).
  const uint64_t need = NeedBytes(key, fields);
  if (ar_ && (shard_slots_ >= MaxSlots() ||
              (opts_.shard_plan.empty() && ShardBytes() + need + 2 * tar::kBlock > opts_.shard_size))) {
    SK_RETURN_IF_ERROR(Keep(FinishShard()));
  }
  if (!ar_) SK_RETURN_IF_ERROR(Keep(StartShard()));

  Utf8Locale utf8;
  for (const Field* f : fields) {
    std::string name = key + "." + f->ext;
    struct archive_entry* e = archive_entry_new();
    archive_entry_copy_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0444);
    archive_entry_set_size(e, int64_t(f->data.size()));
    archive_entry_set_mtime(e, 0, 0);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    int r = archive_write_header(ar_, e);
    archive_entry_free(e);
    if (r < ARCHIVE_WARN) return Keep(ArchiveError("cannot write tar header", name));
    uint64_t off = ShardBytes();
    const uint8_t* p = f->data.data();
    size_t left = f->data.size();
    while (left > 0) {
      la_ssize_t n = archive_write_data(ar_, p, left);
      if (n <= 0) return Keep(ArchiveError("cannot write member data", name));
      p += n;
      left -= size_t(n);
    }
    if (archive_write_finish_entry(ar_) < ARCHIVE_WARN) return Keep(ArchiveError("cannot finish member", name));
    if (HasSpace(name)) idx_names_ok_ = false;
    idx_.push_back(IdxEntry{f->ext, std::move(name), off, f->data.size()});
    fields_.insert(f->ext);
  }
  idx_lines_.push_back(idx_.size());
  paths::AddSampleToDigest(digest_, key, sample_sum);
  sums_.push_back(sample_sum);
  prev_key_ = key;
  ++shard_samples_;
  ++total_samples_;
  ++shard_slots_;
  ++total_slots_;
  return Status::OK();
}

uint64_t WdsWriter::MaxSlots() const {
  if (!opts_.shard_plan.empty()) return opts_.shard_plan[std::min(summary_.shards.size(), opts_.shard_plan.size() - 1)];
  return opts_.samples_per_shard ? opts_.samples_per_shard : UINT64_MAX;
}

Status WdsWriter::LeaveOut(std::string_view key, std::string_view reason) {
  if (finished_) return Status::Internal("LeaveOut() after Finish()");
  if (!error_.ok()) return error_;
  if (opts_.shard_plan.empty()) return Status::Internal("LeaveOut() without a shard plan");
  left_out_.emplace_back(key, reason);
  if (total_slots_ < resume_slots_) {  // a position of a shard the resumed write had committed
    ++total_slots_;
    return Status::OK();
  }
  if (ar_ && shard_slots_ >= MaxSlots()) SK_RETURN_IF_ERROR(Keep(FinishShard()));
  if (!ar_) SK_RETURN_IF_ERROR(Keep(StartShard()));  // a shard may end up empty: its number stays the plan's
  ++shard_slots_;
  ++total_slots_;
  return Status::OK();
}

Result<WriteSummary> WdsWriter::Finish() {
  if (finished_) return Status::Internal("Finish() called twice");
  if (!error_.ok()) return error_;
  if (total_slots_ < resume_slots_)
    return resume::SourceEndedEarly(total_slots_, resume_slots_, Location{.file = journal_});
  if (ar_) SK_RETURN_IF_ERROR(Keep(FinishShard()));
  uint64_t total = 0;
  if (part()) {
    // A part writes its record; Merge() writes the manifest from all of them.
    std::string record = PartRecordText(pattern_, opts_, std::vector<std::string>(fields_.begin(), fields_.end()),
                                        summary_.shards, total_samples_, left_out_, &total);
    SK_RETURN_IF_ERROR(Keep(io::WriteFileAtomic(record_, record, true, opts_.filesystem)));
  } else {
    std::string manifest = ManifestText(pattern_, total_samples_, opts_.class_names,
                                        std::vector<std::string>(fields_.begin(), fields_.end()), summary_.shards,
                                        opts_.write_index, &total, opts_.array_channels, opts_.transform);
    SK_RETURN_IF_ERROR(Keep(io::WriteFileAtomic(manifest_, manifest, true, opts_.filesystem)));
  }
  // Complete: the journal goes (a crash before this leaves a journal that lists
  // every shard, and a resume then only rewrites the manifest).
  if (FileSystem::OrLocal(opts_.filesystem)->Remove(journal_).ok())
    (void)io::FsyncDir(io::DirName(journal_), opts_.filesystem);
  if (!part()) {
    // Temporary files that killed writes of this output left beside any of its shards
    // (a part leaves the others' alone: they may be live on another host).
    const std::string pattern_base(paths::BaseName(pattern_)), manifest_base(paths::BaseName(manifest_)),
        journal_base(paths::BaseName(journal_));
    io::RemoveDebris(io::DirName(manifest_), [&](std::string_view name) {
      return name == manifest_base || name == journal_base || paths::ShardNumberIn(pattern_base, name).has_value();
    });
  }
  if (lock_) lock_->RemoveAndUnlock();
  summary_.samples = total_samples_;
  summary_.bytes = total;
  finished_ = true;
  return summary_;
}

// Makes a failure sticky and removes the unfinished shard's temporary file at
// once. The committed shards and the journal stay: the resumable state, and the
// message says how to continue.
Status WdsWriter::Keep(Status s) {
  if (!s.ok()) {
    if (error_.ok()) {
      keep_state_ = true;
      s = Status(s.code(),
                 fmt::format("{}; the {} complete shard(s) ({} samples) and the journal '{}' are kept: run the "
                             "same conversion again with --resume to continue from shard {}",
                             s.message(), summary_.shards.size(), committed_samples_, journal_,
                             summary_.shards.size()),
                 s.where());
      error_ = s;
    }
    AbortShard();
  }
  return s;
}

uint64_t WdsWriter::ShardBytes() const { return ar_ ? uint64_t(archive_filter_bytes(ar_, 0)) : 0; }

Status WdsWriter::ArchiveError(const char* what, const std::string& name) {
  if (!io_error_.ok()) return io_error_;
  return Status::IOError(fmt::format("{} for '{}': {}", what, name, archive_error_string(ar_)),
                         Location{.file = file_ ? file_->path() : "", .shard = int64_t(ShardNumber(summary_.shards.size()))});
}

la_ssize_t WdsWriter::WriteCb(struct archive*, void* self, const void* buf, size_t n) {
  auto* w = static_cast<WdsWriter*>(self);
  if (w->discard_) return la_ssize_t(n);
  Status s = w->file_->Write(buf, n);
  if (!s.ok()) {
    w->io_error_ = s;
    return -1;
  }
  XXH3_64bits_update(w->hash_, buf, n);
  return la_ssize_t(n);
}

Status WdsWriter::StartShard() {
  std::string path = paths::FormatShardPattern(pattern_, ShardNumber(summary_.shards.size()));
  // Resuming: a shard past the journal may exist (committed just before a
  // crash, before the journal was rewritten); it is written again, identically.
  SK_ASSIGN_OR_RETURN(file_, io::AtomicFile::Create(path, opts_.overwrite || opts_.resume, opts_.filesystem));
  if (!hash_) hash_ = XXH3_createState();
  XXH3_64bits_reset(hash_);
  Utf8Locale utf8;
  ar_ = archive_write_new();
  discard_ = false;
  io_error_ = Status::OK();
  if (archive_write_set_format_pax_restricted(ar_) != ARCHIVE_OK ||
      archive_write_set_bytes_per_block(ar_, 0) != ARCHIVE_OK ||
      archive_write_open2(ar_, this, nullptr, &WdsWriter::WriteCb, nullptr, nullptr) != ARCHIVE_OK) {
    Status s = Status::Internal(fmt::format("libarchive setup failed: {}", archive_error_string(ar_)),
                                Location{.file = path});
    AbortShard();
    return s;
  }
  shard_samples_ = 0;
  shard_slots_ = 0;
  idx_.clear();
  idx_lines_.clear();
  idx_names_ok_ = true;
  sums_.clear();
  return Status::OK();
}

void WdsWriter::AbortShard() {
  if (ar_) {
    discard_ = true;
    archive_write_free(ar_);
    ar_ = nullptr;
  }
  file_.reset();  // unlinks the temporary file
}

Status WdsWriter::FinishShard() {
  {
    Utf8Locale utf8;
    int r = archive_write_close(ar_);
    if (r != ARCHIVE_OK) return ArchiveError("cannot finish shard", "end of archive");
    archive_write_free(ar_);
    ar_ = nullptr;
  }
  std::string path = file_->path();
  uint64_t size = file_->size();
  SK_RETURN_IF_ERROR(file_->Commit());
  file_.reset();
  committed_.push_back(path);
  Resumed done{shard_samples_, XXH3_64bits_digest(digest_)};
  if (opts_.write_index) {
    // DALI's v1.2 index; v1.1 (no names) when a name holds white space,
    // which would break its space-separated lines.
    std::string text = wds::DaliIndexText(idx_, idx_lines_);
    std::string idx_path = IdxPathFor(path);
    SK_RETURN_IF_ERROR(io::WriteFileAtomic(idx_path, text, true, opts_.filesystem));
    committed_.push_back(idx_path);
    done.idx_sum = XXH3_64bits(text.data(), text.size());
  }
  // Per-sample checksums, for verify (index.h has the layout).
  std::string sums_path = wds::SumsPath(path);
  std::string sums_text = wds::SumsText(sums_);
  SK_RETURN_IF_ERROR(io::WriteFileAtomic(sums_path, sums_text, true, opts_.filesystem));
  committed_.push_back(sums_path);
  done.sums_sum = XXH3_64bits(sums_text.data(), sums_text.size());
  summary_.shards.push_back(
      ShardInfo{path, shard_samples_, size, paths::ChecksumString(XXH3_64bits_digest(hash_))});
  resumed_.push_back(done);
  XXH3_64bits_reset(digest_);
  committed_samples_ += shard_samples_;
  shard_samples_ = 0;
  return WriteJournal();
}

}  // namespace shardkit::formats::wds

namespace shardkit::formats::wds {

namespace {

// Counts what libarchive writes for a sample's members when no data is given
// (archive_write_finish_entry pads the missing data with zeros): the exact bytes the
// writer adds for that sample, for the same names and sizes.
class SizeProbe {
 public:
  SizeProbe() {
    Utf8Locale utf8;
    ar_ = archive_write_new();
    ok_ = archive_write_set_format_pax_restricted(ar_) == ARCHIVE_OK &&
          archive_write_set_bytes_per_block(ar_, 0) == ARCHIVE_OK &&
          archive_write_open2(ar_, this, nullptr, &SizeProbe::Cb, nullptr, nullptr) == ARCHIVE_OK;
  }
  ~SizeProbe() {
    if (ar_) {
      archive_write_free(ar_);
    }
  }
  // Bytes of the sample as written, or an error naming the member.
  Result<uint64_t> Bytes(const std::string& key, const std::vector<const Field*>& fields) {
    if (!ok_) return Status::Internal(fmt::format("libarchive setup failed: {}", archive_error_string(ar_)));
    Utf8Locale utf8;
    const uint64_t before = bytes_;
    for (const Field* f : fields) {
      std::string name = key + "." + f->ext;
      struct archive_entry* e = archive_entry_new();
      archive_entry_copy_pathname(e, name.c_str());
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0444);
      archive_entry_set_size(e, int64_t(f->data.size()));
      archive_entry_set_mtime(e, 0, 0);
      archive_entry_set_uid(e, 0);
      archive_entry_set_gid(e, 0);
      int r = archive_write_header(ar_, e);
      archive_entry_free(e);
      if (r < ARCHIVE_WARN || archive_write_finish_entry(ar_) < ARCHIVE_WARN)
        return Status::Invalid(fmt::format("cannot size tar member '{}': {}", name, archive_error_string(ar_)));
    }
    return bytes_ - before;
  }

 private:
  static la_ssize_t Cb(struct archive*, void* self, const void*, size_t n) {
    static_cast<SizeProbe*>(self)->bytes_ += n;
    return la_ssize_t(n);
  }
  struct archive* ar_ = nullptr;
  bool ok_ = false;
  uint64_t bytes_ = 0;
};

}  // namespace

Result<std::vector<uint64_t>> WdsWriter::PlanBySize(const WriteOptions& opts, uint64_t n,
                                                    const std::function<Status(uint64_t, Sample*)>& get,
                                                    int threads) {
  struct Cost {
    uint64_t need = 0, bytes = 0;
  };
  const uint64_t max_samples = opts.samples_per_shard ? opts.samples_per_shard : UINT64_MAX;
  std::vector<uint64_t> plan;
  uint64_t shard_bytes = 0, shard_samples = 0;
  bool open = false;
  // Windows of samples: their costs in parallel, then Write()'s cut rule in order.
  constexpr uint64_t kWindow = 4096;
  std::vector<Cost> costs;
  const int nthreads = std::max(1, threads);
  for (uint64_t begin = 0; begin < n; begin += kWindow) {
    const uint64_t count = std::min(kWindow, n - begin);
    costs.assign(count, Cost{});
    std::vector<Status> errors(size_t(nthreads), Status::OK());
    std::atomic<uint64_t> next{0};
    auto work = [&](int t) {
      SizeProbe probe;
      Sample s;
      for (uint64_t j; (j = next.fetch_add(1)) < count;) {
        Status st = get(begin + j, &s);
        if (!st.ok()) {
          if (errors[size_t(t)].ok()) errors[size_t(t)] = st;
          next = count;
          return;
        }
        std::string key = WrittenKey(s.key, opts.key_dots);
        std::vector<const Field*> fields;
        for (const auto& f : s.fields) fields.push_back(&f);
        std::sort(fields.begin(), fields.end(), [](const Field* a, const Field* b) { return a->ext < b->ext; });
        auto b = probe.Bytes(key, fields);
        if (!b.ok()) {
          Status e = std::move(b).take_status();
          e.At(Location{.key = s.key, .index = int64_t(begin + j)});
          if (errors[size_t(t)].ok()) errors[size_t(t)] = e;
          next = count;
          return;
        }
        costs[j] = Cost{NeedBytes(key, fields), *b};
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nthreads && uint64_t(t) < count; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (!e.ok()) return e;
    for (const Cost& c : costs) {
      if (open && (shard_samples >= max_samples || shard_bytes + c.need + 2 * tar::kBlock > opts.shard_size)) {
        plan.push_back(shard_samples);
        open = false;
      }
      if (!open) {
        open = true;
        shard_bytes = 0;
        shard_samples = 0;
      }
      shard_bytes += c.bytes;
      ++shard_samples;
    }
  }
  if (open) plan.push_back(shard_samples);
  return plan;
}

}  // namespace shardkit::formats::wds
