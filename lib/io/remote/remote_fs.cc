// The remote FileSystem (remote_fs.h).
#include "io/remote/remote_fs.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <set>

#include <fmt/format.h>

#include "core/md5.h"

namespace shardkit::remote {

namespace {

bool IsS3(std::string_view a) { return a.rfind("s3://", 0) == 0; }

// An HTTP PUT's body, assembled by appends: one malloc'd block grown by realloc. glibc
// grows a large block with mremap (no copy, and the pages already written are not
// touched again), where a std::string doubling through 8, 16, 32 and 64 MiB copied every
// byte into fresh pages each time (a shard's upload spent more CPU zeroing and copying
// pages than sending them). A released block is kept for the thread's next body (the
// upload workers PUT one shard after another), so its pages are not faulted in again;
// it is freed when the thread exits (the workers exit with their conversion).
class GrowBuffer {
 public:
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() { Release(); }
  bool Append(const void* data, size_t n) {
    if (!p_ && spare_.p) {
      p_ = std::exchange(spare_.p, nullptr);
      cap_ = std::exchange(spare_.cap, 0);
    }
    if (n > cap_ - size_) {
      const size_t c = std::max(size_ + n, cap_ + cap_ / 2 + (size_t(1) << 20));
      void* q = std::realloc(p_, c);
      if (!q) return false;
      p_ = static_cast<char*>(q);
      cap_ = c;
    }
    if (n) std::memcpy(p_ + size_, data, n);
    size_ += n;
    return true;
  }
  std::string_view view() const { return {p_ ? p_ : "", size_}; }
  void Release() {
    if (p_ && cap_ >= spare_.cap) {
      std::free(spare_.p);
      spare_.p = p_;
      spare_.cap = cap_;
    } else {
      std::free(p_);
    }
    p_ = nullptr;
    size_ = cap_ = 0;
  }

 private:
  struct Spare {
    char* p = nullptr;
    size_t cap = 0;
    ~Spare() { std::free(p); }
  };
  static thread_local Spare spare_;
  char* p_ = nullptr;
  size_t size_ = 0, cap_ = 0;
};
thread_local GrowBuffer::Spare GrowBuffer::spare_;

std::string Trim(std::string s) {
  while (s.size() > 1 && s.back() == '/' && !s.ends_with("://")) s.pop_back();
  return s;
}

std::string LastComponent(const std::string& a) {
  std::string t = Trim(a);
  auto slash = t.rfind('/');
  return slash == std::string::npos ? t : t.substr(slash + 1);
}

class RemoteReadable : public ReadableFile {
 public:
  RemoteReadable(std::shared_ptr<ObjectStore> store, std::string path, uint64_t size)
      : store_(std::move(store)), path_(std::move(path)), size_(size) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  Result<size_t> ReadAt(uint64_t offset, size_t n, void* dst) const override {
    if (offset >= size_ || n == 0) return size_t(0);
    uint64_t len = std::min<uint64_t>(n, size_ - offset);
    SK_RETURN_IF_ERROR(store_->ReadRange(path_, offset, len, static_cast<char*>(dst)));
    return size_t(len);
  }

 private:
  std::shared_ptr<ObjectStore> store_;
  std::string path_;
  uint64_t size_;
};

class RemoteWritable : public WritableFile {
 public:
  static constexpr size_t kPart = 16 << 20;
  // A buffer (from the pool) for a part and an append of `size` after it: no regrowth.
  static std::string PartBuffer(size_t size) { return TakePartBuffer(kPart + std::max(size, size_t(8) << 20)); }
  RemoteWritable(std::shared_ptr<ObjectStore> store, std::string path) : store_(std::move(store)), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  Status Append(const void* data, size_t size) override {
    if (closed_) return Status::Internal("Append() after Close()", Location{.file = SafeUrl(path_)});
    if (!error_.ok()) return error_;
    // Hashed as it comes (an upload follows its file while it is written), so that the
    // one PUT at Close() does not hash the whole body first. On S3 only the first part's
    // bytes: that digest goes with the first part if the file becomes a multipart upload
    // (the later parts are hashed as they go up), so no byte is hashed twice.
    if (!upload_) md5_.Update(data, s3_ ? std::min(size, kPart - std::min(kPart, buf_.size())) : size);
    if (!s3_) {
      if (!body_.Append(data, size))
        return error_ = Status::IOError(fmt::format("out of memory for an upload body of {} bytes", size),
                                        Location{.file = SafeUrl(path_)});
      return Status::OK();
    }
    if (buf_.capacity() < kPart) buf_ = PartBuffer(size);
    buf_.append(static_cast<const char*>(data), size);
    while (buf_.size() >= kPart + (upload_ ? 0 : 1)) {  // a file of exactly one part stays one PUT
      std::string part_md5;  // known for the first part only
      if (!upload_) {
        auto s3 = store_->S3();
        if (!s3.ok()) return error_ = s3.status();
        auto o = ParseS3Address(path_);
        if (!o.ok()) return error_ = o.status();
        auto up = MultipartUpload::Begin(*s3, *o);
        if (!up.ok()) return error_ = up.status();
        upload_ = std::move(up).value();
        // The first part's Content-MD5 is md5_'s: it took exactly the first kPart bytes.
        uint8_t digest[16];
        md5_.Digest(digest);
        part_md5 = Md5Base64(digest);
      }
      // The part is the buffer itself; only what follows it is copied into a new one.
      std::string part = std::move(buf_);
      buf_ = PartBuffer(size);
      buf_.append(part, kPart);
      part.resize(kPart);
      error_ = upload_->Add(std::move(part), std::move(part_md5));  // uploads while the next parts are appended
      if (!error_.ok()) {
        upload_.reset();  // aborted already
        return error_;
      }
    }
    return Status::OK();
  }
  Status Sync() override { return Status::OK(); }
  Status Close() override {
    if (closed_) return Status::OK();
    closed_ = true;
    if (!error_.ok()) return error_;
    Status s;
    if (upload_) {
      if (!buf_.empty()) s = upload_->Add(std::move(buf_));
      if (s.ok()) s = upload_->Complete();
      upload_.reset();  // aborts when not completed
    } else {
      uint8_t digest[16];
      md5_.Digest(digest);
      s = store_->Write(path_, s3_ ? std::string_view(buf_) : body_.view(), WriteOptions{.content_md5 = Md5Base64(digest)});
    }
    GivePartBuffer(std::move(buf_));
    buf_ = std::string();
    body_.Release();
    return s;
  }

 private:
  std::shared_ptr<ObjectStore> store_;
  std::string path_;
  bool s3_ = IsS3(path_);
  std::string buf_;  // s3: bytes not yet in a part
  GrowBuffer body_;  // http: the PUT's body
  std::unique_ptr<MultipartUpload> upload_;
  md5::Md5 md5_;  // of buf_ (on S3 at most its first kPart bytes), while no part has gone up
  Status error_;
  bool closed_ = false;
};

class RemoteFileSystem : public FileSystem {
 public:
  explicit RemoteFileSystem(std::shared_ptr<ObjectStore> store) : store_(std::move(store)) {}

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(RemoteObjectInfo info, store_->Stat(path));
    return std::unique_ptr<ReadableFile>(new RemoteReadable(store_, path, info.size));
  }
  Result<std::string> ReadFile(const std::string& path) override { return store_->ReadAll(path); }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, CreateMode mode) override {
    if (mode == CreateMode::kExclusive) {
      auto st = store_->Stat(path);
      if (st.ok())
        return Status::Exists("output exists", Location{.file = SafeUrl(path)});
      if (st.status().code() != Code::kNotFound) return std::move(st).take_status();
    }
    return std::unique_ptr<WritableFile>(new RemoteWritable(store_, path));
  }

  Status Publish(const std::string& staged, const std::string& final_path, const PublishOptions& opts) override {
    if (!IsRemoteAddress(staged) || !IsRemoteAddress(final_path))
      return Status::Unsupported("publishing between a remote store and another file system",
                                 Location{.file = SafeUrl(final_path)});
    if (!opts.replace) {
      auto st = store_->Stat(final_path);
      if (st.ok()) return Status::Exists("output exists", Location{.file = SafeUrl(final_path)});
      if (st.status().code() != Code::kNotFound) return std::move(st).take_status();
    }
    SK_ASSIGN_OR_RETURN(std::string data, store_->ReadAll(staged));
    SK_RETURN_IF_ERROR(store_->Write(final_path, data));
    if (opts.published) *opts.published = true;
    return store_->Remove(staged);
  }
  Status Rename(const std::string& from, const std::string&) override {
    return Status::Unsupported("object stores cannot rename (write the final name, or Publish)",
                               Location{.file = SafeUrl(from)});
  }
  Status SyncDir(const std::string&) override { return Status::OK(); }
  Status SyncTree(const std::string&) override { return Status::OK(); }

  Result<FileInfo> Stat(const std::string& path) override {
    FileInfo fi;
    fi.path = path;
    fi.name = LastComponent(path);
    if (IsS3(path)) {
      SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(path));
      if (o.key.empty() || o.key.back() == '/') {
        fi.type = FileType::kDirectory;
        return fi;
      }
    }
    auto st = store_->Stat(path);
    if (st.ok()) {
      fi.type = FileType::kFile;
      fi.size = st->size;
      return fi;
    }
    if (st.status().code() != Code::kNotFound) return std::move(st).take_status();
    if (IsS3(path)) {
      SK_ASSIGN_OR_RETURN(auto under, store_->List(Trim(path) + "/"));
      if (!under.empty()) fi.type = FileType::kDirectory;
    }
    return fi;
  }

  Result<std::vector<FileInfo>> ListDir(const std::string& dir) override {
    std::string prefix = Trim(dir) + "/";
    SK_ASSIGN_OR_RETURN(auto objects, store_->List(prefix));
    std::map<std::string, FileInfo> entries;
    for (const auto& o : objects) {
      std::string rest = o.address.substr(prefix.size());
      auto slash = rest.find('/');
      FileInfo fi;
      fi.name = slash == std::string::npos ? rest : rest.substr(0, slash);
      if (fi.name.empty()) continue;
      fi.path = prefix + fi.name;
      fi.type = slash == std::string::npos ? FileType::kFile : FileType::kDirectory;
      fi.size = slash == std::string::npos ? o.size : 0;
      entries.emplace(fi.name, fi);
    }
    std::vector<FileInfo> out;
    for (auto& [_, fi] : entries) out.push_back(std::move(fi));
    return out;
  }
  Status MakeDirs(const std::string&) override { return Status::OK(); }
  Status Remove(const std::string& path) override { return store_->Remove(path); }
  Status RemoveAll(const std::string& path) override {
    if (IsS3(path)) {
      SK_ASSIGN_OR_RETURN(auto under, store_->List(Trim(path) + "/"));
      for (const auto& o : under) SK_RETURN_IF_ERROR(store_->Remove(o.address));
    }
    auto st = store_->Remove(path);
    if (!st.ok() && st.code() == Code::kNotFound) return Status::OK();
    return st;
  }

 private:
  std::shared_ptr<ObjectStore> store_;
};

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::shared_ptr<FileSystem> NewRemoteFileSystem(std::shared_ptr<ObjectStore> store) {
  return std::make_shared<RemoteFileSystem>(std::move(store));
}

std::shared_ptr<FileSystem> DefaultRemoteFileSystem() {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<FileSystem>>* by_settings = new std::map<std::string, std::shared_ptr<FileSystem>>;
  // The settings that choose the store (not the secret itself: a key of the map is no message, but stays clean).
  std::string key;
  for (const char* v : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE",
                        "AWS_SHARED_CREDENTIALS_FILE", "AWS_REGION", "AWS_DEFAULT_REGION"})
    key += EnvOr(v) + '\n';
  std::lock_guard lock(mu);
  auto& fs = (*by_settings)[key];
  if (!fs) fs = NewRemoteFileSystem(std::make_shared<ObjectStore>());
  return fs;
}

void RegisterRemoteFileSystems() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* scheme : {"http", "https", "s3"})
      (void)RegisterFileSystem(scheme, [](std::string_view) -> Result<std::shared_ptr<FileSystem>> {
        return DefaultRemoteFileSystem();
      });
  });
}

}  // namespace shardkit::remote
