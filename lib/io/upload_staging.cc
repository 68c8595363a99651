// Remote outputs through a local staging directory (upload_staging.h).
#include "io/upload_staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "io/file.h"
#include "io/shard_cache.h"

namespace shardkit::io {

namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file that says the files before it are complete, so it is uploaded last: a
// manifest ("*.manifest.json") or a part's record ("*.part-00003-of-00016.json",
// formats/wds/parts.h), which `shardkit merge` trusts to list uploaded shards.
bool UploadedLast(const std::string& path) {
  if (EndsWith(path, ".manifest.json")) return true;
  auto part = path.rfind(".part-");
  if (part == std::string::npos || !EndsWith(path, ".json")) return false;
  unsigned long long i = 0, n = 0;
  char tail[8] = {0};
  return std::sscanf(path.c_str() + part, ".part-%llu-of-%llu%7s", &i, &n, tail) == 3 && std::string(tail) == ".json";
}

// Local-only state of a writer: journals ("*.partial"), a part's lock ("*.lock") and
// everything in a writer's working directory ("<out>.partial/...": an LMDB's, uploaded
// as the output's files once published under the output's name).
bool StaysLocal(const std::string& path) {
  return EndsWith(path, ".partial") || EndsWith(path, ".lock") || path.find(".partial/") != std::string::npos;
}

// A staged file followed while the writer writes it (issue 14: the conversion's tail is
// the last shard's upload). An upload worker reads the bytes back as they are appended
// (from the page cache) and appends them to the remote file, so on S3 every part but the
// last is uploaded before the shard is complete, and over HTTP the body is assembled;
// the remote file is closed (multipart complete, or the one PUT) only once the writer
// has published the staged file, so a remote object is still whole or absent. A staged
// file removed unpublished (the writer failed) drops the remote file: a multipart
// upload is aborted, a PUT never sent.
struct Follow {
  enum State { kWriting, kPublished, kAborted };
  std::mutex mu;
  std::condition_variable cv;
  uint64_t written = 0;  // bytes the writer has appended to the staged file
  State state = kWriting;
  std::string temp, final_path;  // the staged file's temporary and final local paths
  int fd = -1;                   // the temporary file, opened before any rename
  ~Follow() {
    if (fd >= 0) ::close(fd);
  }
  void Set(State s) {
    {
      std::lock_guard lock(mu);
      if (state == kWriting) state = s;
    }
    cv.notify_all();
  }
};

// A staged file's handle: not synced. The staged copy of a remote output is a cache, and
// the store's acknowledgement of the upload is what makes it durable (issue 14: the fsyncs
// held the conversion back as much as to a local output). A machine crash may tear it; the
// journal's checksums make a resume refuse it (formats/wds/journal.cc).
class UnsyncedWritable : public WritableFile {
 public:
  explicit UnsyncedWritable(std::unique_ptr<WritableFile> base) : base_(std::move(base)) {}
  const std::string& path() const override { return base_->path(); }
  Status Append(const void* data, size_t size) override { return base_->Append(data, size); }
  Status Sync() override { return Status::OK(); }
  Status Close() override { return base_->Close(); }

 private:
  std::unique_ptr<WritableFile> base_;
};

// The writer's handle on a followed staged file: every append is announced to the follower.
class FollowedWritable : public UnsyncedWritable {
 public:
  FollowedWritable(std::unique_ptr<WritableFile> base, std::shared_ptr<Follow> f)
      : UnsyncedWritable(std::move(base)), f_(std::move(f)) {}
  Status Append(const void* data, size_t size) override {
    SK_RETURN_IF_ERROR(UnsyncedWritable::Append(data, size));
    {
      std::lock_guard lock(f_->mu);
      f_->written += size;
    }
    f_->cv.notify_all();
    return Status::OK();
  }

 private:
  std::shared_ptr<Follow> f_;
};

}  // namespace

class UploadingFileSystem : public FileSystem {
 public:
  // Files uploaded at once (each a multipart upload of its own on s3): half the cores, 4 to
  // 16. A worker follows a file from its creation (or uploads one published whole); a writer
  // writes one shard at a time, so one worker follows it while the others finish the
  // uploads of the shards before it.
  static int Workers() { return std::clamp(int(std::thread::hardware_concurrency()) / 2, 4, 16); }
  UploadingFileSystem(std::shared_ptr<FileSystem> base, std::string local_root, std::string remote_root)
      : base_(std::move(base)), local_root_(std::move(local_root)), remote_root_(std::move(remote_root)) {
    for (int i = 0, n = Workers(); i < n; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~UploadingFileSystem() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      queue_.clear();  // a failed write: no more uploads (Finish() drains a good one first)
      for (auto& [temp, f] : follows_) f->Set(Follow::kAborted);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  const std::string& local_root() const { return local_root_; }
  bool Staged(const std::string& p) const { return p.compare(0, local_root_.size(), local_root_) == 0; }
  std::string RemoteOf(const std::string& local) const {
    if (!Staged(local)) return local;
    return remote_root_ + local.substr(local_root_.size());
  }

  // After every upload: removes the remote objects under each directory output
  // published with PublishOptions::replace that the new output does not hold (an
  // earlier output's extra shards or files). A store that cannot list keeps them.
  Status PruneReplaced() {
    std::map<std::string, std::set<std::string>> replaced;
    {
      std::lock_guard lock(mu_);
      replaced.swap(replaced_);
    }
    for (const auto& [dir, files] : replaced) {
      std::set<std::string> keep;
      for (const auto& f : files) keep.insert(RemoteOf(f));
      const std::string remote = RemoteOf(dir);
      SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(remote));
      std::vector<std::string> pending{remote}, extra;
      while (!pending.empty()) {
        std::string d = std::move(pending.back());
        pending.pop_back();
        auto listed = fs->ListDir(d);
        if (!listed.ok()) {
          if (listed.status().code() == Code::kUnsupported || listed.status().code() == Code::kNotFound) break;
          return listed.status();
        }
        for (const auto& fi : *listed) {
          if (fi.type == FileType::kDirectory) pending.push_back(fi.path);
          else if (!keep.count(fi.path)) extra.push_back(fi.path);
        }
      }
      for (const auto& p : extra) {
        Status st = fs->Remove(p);
        if (!st.ok() && st.code() != Code::kNotFound)
          return Status(st.code(),
                        "the new output is uploaded, but a file of the output it replaced could not be removed: " +
                            st.message(),
                        Location{.file = p});
      }
    }
    return Status::OK();
  }

  // Waits for every upload but those of files still being written (unpublished: nothing
  // published can depend on them, and waiting for them could wait forever); the first error.
  Status Drain() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return Settled(); });
    return error_;
  }

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& p) override { return base_->OpenForRead(p); }
  Result<std::string> ReadFile(const std::string& p) override { return base_->ReadFile(p); }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p, CreateMode m) override {
    return base_->NewWritableFile(p, m);
  }
  // An output's temporary file (AtomicFile): followed to its remote address from now on.
  Result<std::unique_ptr<WritableFile>> NewStagedFile(const std::string& p, const std::string& final_path) override {
    if (!Staged(final_path) || StaysLocal(final_path)) return base_->NewStagedFile(p, final_path);  // (journals, locks)
    // Locally, a file the disk is not asked to write as it grows: only the upload needs it.
    SK_ASSIGN_OR_RETURN(auto file, base_ == FileSystem::Local() ? NewCacheOnlyFile(p) : base_->NewStagedFile(p, final_path));
    if (UploadedLast(final_path)) return std::unique_ptr<WritableFile>(new UnsyncedWritable(std::move(file)));
    auto f = std::make_shared<Follow>();
    f->temp = p;
    f->final_path = final_path;
    f->fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return std::unique_ptr<WritableFile>(new UnsyncedWritable(std::move(file)));  // uploaded whole once published
    {
      std::lock_guard lock(mu_);
      follows_[p] = f;
      queue_.push_back(Job{final_path, f});
    }
    cv_.notify_all();
    return std::unique_ptr<WritableFile>(new FollowedWritable(std::move(file), std::move(f)));
  }
  Status Publish(const std::string& staged, const std::string& final_path, const PublishOptions& opts) override {
    {
      std::lock_guard lock(mu_);
      if (!error_.ok()) return error_;  // an upload failed: stop the writer
    }
    std::shared_ptr<Follow> followed;
    {
      std::lock_guard lock(mu_);
      if (auto it = follows_.find(staged); it != follows_.end()) {
        followed = it->second;
        follows_.erase(it);
      }
    }
    // A followed file's rename is not synced either: its publish runs on this file system,
    // whose SyncDir skips the staging directory; anything else (a journal) publishes as usual.
    Status published = followed ? FileSystem::Publish(staged, final_path, opts) : base_->Publish(staged, final_path, opts);
    if (followed) {
      // Its follower completes the upload; a failed publish drops it. (Published under
      // another name than its temporary one said: dropped, and uploaded whole below.)
      const bool same = followed->final_path == final_path;
      followed->Set(published.ok() && same ? Follow::kPublished : Follow::kAborted);
      if (!published.ok() || same) return published;
    }
    SK_RETURN_IF_ERROR(published);
    if (!Staged(final_path) || StaysLocal(final_path)) return Status::OK();
    std::vector<std::string> files;
    if (base_->IsDir(final_path)) {
      std::error_code ec;
      for (auto it = std::filesystem::recursive_directory_iterator(final_path, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file() && std::find(opts.local_only.begin(), opts.local_only.end(),
                                               it->path().filename().string()) == opts.local_only.end())
          files.push_back(it->path().string());
      if (ec) return Status::IOError("cannot list a staged output: " + ec.message(), Location{.file = final_path});
      if (opts.replace) {
        // What an earlier output under this remote directory holds beyond the new one goes
        // once the new one is up (PruneReplaced).
        std::lock_guard lock(mu_);
        replaced_[final_path] = std::set<std::string>(files.begin(), files.end());
      }
    } else {
      files.push_back(final_path);
    }
    if (UploadedLast(final_path)) {
      // Last: after every shard, and only when all of them are there.
      SK_RETURN_IF_ERROR(Drain());
      SK_RETURN_IF_ERROR(UploadLeftovers(final_path));
      for (const auto& f : files) SK_RETURN_IF_ERROR(Upload(f));
      return Status::OK();
    }
    {
      std::lock_guard lock(mu_);
      for (auto& f : files) queue_.push_back(Job{std::move(f), nullptr});
    }
    cv_.notify_all();
    return Status::OK();
  }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  // The staging directory is not made durable (see UnsyncedWritable); the publishes
  // of journals and locks, which go to the base file system, sync their directory there.
  Status SyncDir(const std::string& d) override { return Staged(d) ? Status::OK() : base_->SyncDir(d); }
  Status SyncTree(const std::string& d) override { return Staged(d) ? Status::OK() : base_->SyncTree(d); }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  // Staged here, or already at its remote address (an earlier conversion's output): a
  // writer without `overwrite` refuses either. The store is asked only for what is not
  // staged: a file by one HEAD, a directory as the remote file system's Stat sees one
  // (on S3 a HEAD, then a LIST of the name as a prefix).
  Result<bool> OutputPresent(const std::string& p, OutputKind kind) override {
    SK_ASSIGN_OR_RETURN(bool here, base_->OutputPresent(p, kind));
    if (here || !Staged(p) || StaysLocal(p)) return here;
    const std::string remote = RemoteOf(p);
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(remote));
    Status failed;
    if (kind == OutputKind::kFile) {
      auto opened = fs->OpenForRead(remote);  // a HEAD, nothing read
      if (opened.ok()) return true;
      if (opened.status().code() == Code::kNotFound) return false;
      failed = opened.status();
    } else {
      auto st = fs->Stat(remote);
      if (st.ok()) return st->type != FileType::kNotFound;
      failed = st.status();
    }
    // A 401/403: the credentials were refused (an unknown key, a wrong secret) or they may
    // not read the destination (S3 answers 403, not 404, for a missing key to a caller who
    // may not list the bucket). Either way the upload needs them too: no --overwrite advice.
    if (failed.detail() == Detail::kAccessDenied)
      return Status(failed.code(),
                    "the store refused the credentials or permissions for the check whether the output is "
                    "already there (" + failed.message() +
                        "): check the access key and secret (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                        "AWS_PROFILE) and that they may read and write the destination (credentials that may "
                        "write but not read: --overwrite skips this check)",
                    failed.where())
          .At(Location{.file = remote})
          .With(Detail::kAccessDenied);
    return Status(failed.code(),
                  "cannot tell whether the output is already there (" + failed.message() +
                      "); the check needs read access to the destination: pass --overwrite to write without it",
                  failed.where())
        .At(Location{.file = remote});
  }
  Result<std::vector<FileInfo>> ListDir(const std::string& d) override { return base_->ListDir(d); }
  Status MakeDirs(const std::string& d) override { return base_->MakeDirs(d); }
  Status MakeNewDir(const std::string& d) override { return base_->MakeNewDir(d); }
  Status Remove(const std::string& p) override {
    {
      std::lock_guard lock(mu_);
      if (auto it = follows_.find(p); it != follows_.end()) {
        it->second->Set(Follow::kAborted);  // removed unpublished: its remote file is dropped
        follows_.erase(it);
      }
    }
    return base_->Remove(p);
  }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Result<std::string> LocalPath(const std::string& p) override { return base_->LocalPath(p); }
  Status ExternalIo(const std::string& p, ExternalOp op) override { return base_->ExternalIo(p, op); }

 private:
  bool Unpublished(const Follow* f) const {
    auto it = follows_.find(f->temp);
    return it != follows_.end() && it->second.get() == f;
  }
  // Lock held: no work left but the following of unpublished files.
  bool Settled() const {
    for (const Job& j : queue_)
      if (!j.follow || !Unpublished(j.follow.get())) return false;
    int running = busy_;
    for (const Follow* f : running_)
      if (Unpublished(f)) --running;
    return running == 0;
  }

  Status Upload(const std::string& local) {
    SK_ASSIGN_OR_RETURN(auto f, Published(local));
    Status s = FollowUpload(*f);
    std::lock_guard lock(mu_);
    if (s.ok()) uploaded_.push_back(local);
    return s;
  }

  // A file uploaded whole (published as it is: LMDB, HDF5, a directory's files, the
  // manifest): followed as one already published, through the same FollowUpload.
  static Result<std::shared_ptr<Follow>> Published(const std::string& local) {
    auto f = std::make_shared<Follow>();
    f->temp = f->final_path = local;
    f->fd = ::open(local.c_str(), O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) return Status::FromErrno(errno, "cannot open a staged file to upload", Location{.file = local});
    struct stat st;
    if (::fstat(f->fd, &st) != 0) return Status::FromErrno(errno, "cannot stat a staged file to upload", Location{.file = local});
    f->written = uint64_t(st.st_size);
    f->state = Follow::kPublished;
    return f;
  }

  // Staged files an interrupted earlier run committed but may not have uploaded.
  Status UploadLeftovers(const std::string& manifest) {
    std::vector<std::string> done;
    {
      std::lock_guard lock(mu_);
      done = uploaded_;
    }
    std::sort(done.begin(), done.end());
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(local_root_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      std::string p = it->path().string();
      std::string name = it->path().filename().string();
      if (p == manifest || StaysLocal(p) || name.find(".tmp") != std::string::npos || name[0] == '.') continue;
      if (std::binary_search(done.begin(), done.end(), p)) continue;
      auto fs = FileSystemFor(RemoteOf(p));
      if (!fs.ok()) return fs.status();
      auto st = (*fs)->Stat(RemoteOf(p));
      if (st.ok() && st->type == FileType::kFile && st->size == it->file_size()) continue;
      SK_RETURN_IF_ERROR(Upload(p));
    }
    return Status::OK();
  }

  // Appends the followed file's bytes to its remote file as the writer appends them (all
  // at once for a file published whole); closes it once published. Returns OK without
  // uploading when it was dropped.
  Status FollowUpload(Follow& f) {
    const std::string remote = RemoteOf(f.final_path);
    SK_ASSIGN_OR_RETURN(auto fs, FileSystemFor(remote));
    SK_ASSIGN_OR_RETURN(auto out, fs->NewWritableFile(remote, CreateMode::kTruncate));
    constexpr uint64_t kBlock = 8 << 20;
    std::string buf;
    uint64_t off = 0;
    for (;;) {
      uint64_t end;
      Follow::State state;
      {
        std::unique_lock lock(f.mu);
        // Whole blocks while the writer writes (S3 parts fill from them), the rest at the end.
        f.cv.wait(lock, [&] { return f.state != Follow::kWriting || f.written >= off + kBlock; });
        end = f.written;
        state = f.state;
      }
      if (state == Follow::kAborted) return Status::OK();  // ~out: a multipart upload aborts
      while (off < end) {
        const size_t n = size_t(std::min(kBlock, end - off));
        buf.resize(n);
        ssize_t got = ::pread(f.fd, buf.data(), n, off_t(off));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
          return got < 0 ? Status::FromErrno(errno, "cannot read the staged file back", Location{.file = f.temp, .offset = int64_t(off)})
                         : Status::IOError("staged file ended early", Location{.file = f.temp, .offset = int64_t(off)});
        SK_RETURN_IF_ERROR(out->Append(buf.data(), size_t(got)));
        off += uint64_t(got);
      }
      if (state == Follow::kPublished) return out->Close();
    }
  }

  void Work() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      Job job = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      if (job.follow) running_.push_back(job.follow.get());
      bool skip = !error_.ok();
      lock.unlock();
      Status s;
      bool uploaded = false;
      if (job.follow) {
        if (skip) job.follow->Set(Follow::kAborted);
        s = FollowUpload(*job.follow);
        std::lock_guard fl(job.follow->mu);
        uploaded = s.ok() && job.follow->state == Follow::kPublished;
      } else if (!skip) {
        s = Upload(job.file);  // (records the file in uploaded_ itself)
      }
      lock.lock();
      if (!s.ok() && error_.ok()) error_ = s;
      if (uploaded) uploaded_.push_back(job.file);
      --busy_;
      if (job.follow) running_.erase(std::find(running_.begin(), running_.end(), job.follow.get()));
      idle_cv_.notify_all();
    }
  }

  std::shared_ptr<FileSystem> base_;
  std::string local_root_, remote_root_;
  std::map<std::string, std::set<std::string>> replaced_;  // directory outputs published to replace (mu_)
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Job {
    std::string file;               // the final local path
    std::shared_ptr<Follow> follow;  // set: followed while written (FollowUpload)
  };
  std::deque<Job> queue_;
  std::map<std::string, std::shared_ptr<Follow>> follows_;  // by temporary path, until published or removed
  std::vector<std::string> uploaded_;
  int busy_ = 0;  // uploads in progress
  std::vector<const Follow*> running_;  // the followed files among them
  bool stop_ = false;
  Status error_;
  std::vector<std::thread> workers_;
};

Status StagedOutput::Finish() {
  if (!uploader) return Status::OK();
  SK_RETURN_IF_ERROR(uploader->Drain());
  SK_RETURN_IF_ERROR(uploader->PruneReplaced());
  std::error_code ec;
  std::filesystem::remove_all(uploader->local_root(), ec);
  return Status::OK();
}

void StagedOutput::RemoveIfEmpty() const {
  if (uploader) (void)::rmdir(uploader->local_root().c_str());
}

std::string StagedOutput::RemoteOf(const std::string& local_path) const {
  return uploader ? uploader->RemoteOf(local_path) : local_path;
}

bool IsRemoteOutput(std::string_view address) {
  auto sep = address.find("://");
  if (sep == std::string_view::npos) return false;
  size_t start = sep;
  while (start > 0 && std::isalnum(static_cast<unsigned char>(address[start - 1]))) --start;
  return start < sep && address.substr(start, sep - start) != "file" && (start == 0 || address[start - 1] == ':');
}

Result<StagedOutput> StageRemoteOutput(std::string_view address, const std::shared_ptr<FileSystem>& base,
                                       std::string_view staging_dir, std::string_view tag) {
  auto sep = address.find("://");
  if (sep == std::string_view::npos) return Status::Invalid("not a remote address", Location{.file = std::string(address)});
  size_t start = sep;
  while (start > 0 && (std::isalnum(static_cast<unsigned char>(address[start - 1])) || address[start - 1] == '+' ||
                       address[start - 1] == '-' || address[start - 1] == '.'))
    --start;
  std::string prefix(address.substr(0, start));
  std::string remote(address.substr(start));
  // Fails now, with the known schemes, for a scheme no file system serves.
  SK_RETURN_IF_ERROR(FileSystemFor(remote).status());
  auto slash = remote.rfind('/');
  if (slash == std::string::npos || slash < sep - start + 3)
    return Status::Invalid("a remote output needs a path below the bucket or host (e.g. s3://bucket/out/train-%06d.tar)",
                           Location{.file = remote});
  std::string remote_root = remote.substr(0, slash);
  const std::string_view dir = staging_dir.empty() ? std::string_view("/tmp") : staging_dir;
  std::string local_root =
      fmt::format("{}/shardkit-upload-{:016x}{}", dir, XXH3_64bits(remote_root.data(), remote_root.size()), tag);
  std::error_code ec;
  const bool fresh = !std::filesystem::exists(local_root, ec) || std::filesystem::is_empty(local_root, ec);
  std::filesystem::create_directories(local_root, ec);
  if (ec) return Status::IOError("cannot create the upload staging directory: " + ec.message(), Location{.file = local_root});
  StagedOutput out;
  out.remote = std::string(address);
  out.fresh = fresh;
  out.uploader = std::make_shared<UploadingFileSystem>(FileSystem::OrLocal(base), local_root, remote_root);
  out.fs = out.uploader;
  out.address = prefix + local_root + remote.substr(slash);
  return out;
}

}  // namespace shardkit::io
