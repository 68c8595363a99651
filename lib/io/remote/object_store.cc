#include "io/remote/object_store.h"

#include <fmt/format.h>

namespace shardkit::remote {
namespace {

bool IsHttp(std::string_view a) { return a.rfind("http://", 0) == 0 || a.rfind("https://", 0) == 0; }
bool IsS3(std::string_view a) { return a.rfind("s3://", 0) == 0; }

Status NotRemote(std::string_view a) {
  return Status::Invalid(fmt::format("'{}' is not a remote address (http://, https://, s3://)", SafeUrl(a)));
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

bool IsRemoteAddress(std::string_view a) { return IsHttp(a) || IsS3(a); }

ObjectStore::ObjectStore(HttpOptions options) : options_(options), http_(options) {}

ObjectStore::ObjectStore(S3Settings s3, HttpOptions options)
    : options_(options), http_(options), fixed_s3_(std::make_unique<S3Settings>(std::move(s3))) {}

Result<S3Client*> ObjectStore::S3() {
  std::call_once(s3_once_, [this] {
    if (fixed_s3_) {
      s3_ = std::make_unique<S3Client>(*fixed_s3_, options_);
      return;
    }
    auto settings = S3SettingsFromEnvironment();
    if (!settings.ok()) {
      s3_status_ = std::move(settings).take_status();
      return;
    }
    s3_ = std::make_unique<S3Client>(std::move(settings).value(), options_);
  });
  if (!s3_) return s3_status_;
  return s3_.get();
}

Result<RemoteObjectInfo> ObjectStore::Stat(const std::string& address) {
  if (IsHttp(address)) {
    SK_ASSIGN_OR_RETURN(auto info, http_.Head(address));
    return RemoteObjectInfo{SafeUrl(address), info.size, Unquote(info.etag)};
  }
  if (!IsS3(address)) return NotRemote(address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  SK_ASSIGN_OR_RETURN(auto info, s3->Head(o));
  return RemoteObjectInfo{address, info.size, info.etag};
}

Status ObjectStore::ReadRange(const std::string& address, uint64_t offset, uint64_t length, char* out) {
  if (IsHttp(address)) return http_.ReadRange(address, offset, length, out);
  if (!IsS3(address)) return NotRemote(address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  return s3->ReadRange(o, offset, length, out);
}

Result<std::string> ObjectStore::ReadAll(const std::string& address) {
  if (IsHttp(address)) return http_.Get(address);
  if (!IsS3(address)) return NotRemote(address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  return s3->Get(o);
}

Status ObjectStore::Write(const std::string& address, std::string_view data, const WriteOptions& options) {
  if (IsHttp(address)) return http_.Put(address, data, options.content_md5);
  if (!IsS3(address)) return NotRemote(address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(address));
  if (o.key.empty()) return Status::Invalid(fmt::format("'{}' names no key to write", address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  if (data.size() > options.multipart_threshold) return s3->PutMultipart(o, data, options.part_size);
  return s3->Put(o, data, options.content_md5);
}

Status ObjectStore::Remove(const std::string& address) {
  if (IsHttp(address)) return http_.Delete(address);
  if (!IsS3(address)) return NotRemote(address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  return s3->Delete(o);
}

Result<std::vector<RemoteObjectInfo>> ObjectStore::List(const std::string& prefix_address) {
  if (IsHttp(prefix_address))
    return Status::Unsupported(fmt::format("cannot list '{}': HTTP servers have no listing; use a manifest",
                                           SafeUrl(prefix_address)));
  if (!IsS3(prefix_address)) return NotRemote(prefix_address);
  SK_ASSIGN_OR_RETURN(S3Object o, ParseS3Address(prefix_address));
  SK_ASSIGN_OR_RETURN(S3Client * s3, S3());
  SK_ASSIGN_OR_RETURN(auto objects, s3->List(o.bucket, o.key));
  std::vector<RemoteObjectInfo> out;
  out.reserve(objects.size());
  for (auto& x : objects) out.push_back({"s3://" + o.bucket + "/" + x.key, x.size, x.etag});
  return out;
}

}  // namespace shardkit::remote
