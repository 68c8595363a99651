#include "io/remote/s3.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "io/remote/xml.h"

namespace shardkit::remote {
namespace {

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

// XML-escapes an ETag for the CompleteMultipartUpload body.
std::string XmlEscape(std::string_view s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      default: r.push_back(c);
    }
  }
  return r;
}

}  // namespace

Result<S3Object> ParseS3Address(std::string_view address) {
  if (address.rfind("s3://", 0) != 0)
    return Status::Invalid(fmt::format("'{}' is not an s3://bucket/key address", address));
  std::string_view rest = address.substr(5);
  size_t slash = rest.find('/');
  S3Object o;
  o.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) o.key = std::string(rest.substr(slash + 1));
  if (o.bucket.empty()) return Status::Invalid(fmt::format("'{}' names no bucket", address));
  return o;
}

Result<std::shared_ptr<S3Client>> S3Client::FromEnvironment(HttpOptions options) {
  SK_ASSIGN_OR_RETURN(S3Settings s, S3SettingsFromEnvironment());
  return std::make_shared<S3Client>(std::move(s), std::move(options));
}

S3Client::S3Client(S3Settings settings, HttpOptions options)
    : settings_(std::move(settings)), http_(std::move(options)) {
  signing_.region = settings_.region;
  signing_.access_key_id = settings_.credentials.access_key_id;
  signing_.secret_access_key = settings_.credentials.secret_access_key;
  signing_.session_token = settings_.credentials.session_token;
}

std::string S3Client::BucketUrl(const std::string& bucket) const {
  if (!settings_.endpoint.empty()) return settings_.endpoint + "/" + UriEncode(bucket, false);
  // Virtual-host style on AWS, except for bucket names with dots (TLS certificates
  // cover one level of subdomain only).
  if (settings_.path_style || bucket.find('.') != std::string::npos)
    return fmt::format("https://s3.{}.amazonaws.com/{}", settings_.region, UriEncode(bucket, false));
  return fmt::format("https://{}.s3.{}.amazonaws.com", bucket, settings_.region);
}

std::string S3Client::BucketRoot(const std::string& bucket) const {
  std::string u = BucketUrl(bucket);
  // Virtual-host style: the bucket is the host, its root the path "/".
  return u.find("://" + bucket + ".") != std::string::npos ? u + "/" : u;
}

std::string S3Client::Url(const S3Object& o) const { return BucketUrl(o.bucket) + "/" + UriEncode(o.key, true); }

HttpRequest S3Client::Request(const std::string& method, const S3Object& o, const std::string& query) const {
  HttpRequest r;
  r.method = method;
  // The query must be canonical already (keys sorted, "k=v" with '=' even when v
  // is empty, values UriEncoded): libcurl 7.88 signs it as it is.
  r.url = Url(o) + (query.empty() ? "" : "?" + query);
  r.display_url = o.ToString();
  if (!settings_.credentials.empty()) r.signing = &signing_;
  return r;
}

Status S3Client::Clean(Status s) const {
  if (s.ok()) return s;
  Status r(s.code(), Redact(s.message(), settings_.credentials), s.where());
  r.where().file = Redact(r.where().file, settings_.credentials);
  if (s.message().find("access denied") != std::string::npos && settings_.credentials.empty())
    r = Status(r.code(), r.message() + "; no AWS credentials were found (AWS_ACCESS_KEY_ID or ~/.aws/credentials)",
               r.where());
  return r.With(s.detail());
}

Result<S3ObjectInfo> S3Client::Head(const S3Object& o) {
  auto resp = Clean(http_.Perform(Request("HEAD", o, "")));
  if (!resp.ok()) return std::move(resp).take_status();
  if (resp->content_length < 0)
    return Status::IOError(fmt::format("HEAD {}: no Content-Length in the answer", o.ToString()), {.file = o.ToString()});
  return S3ObjectInfo{o.key, static_cast<uint64_t>(resp->content_length), Unquote(resp->etag)};
}

Status S3Client::ReadRange(const S3Object& o, uint64_t offset, uint64_t length, char* out) {
  HttpRequest r = Request("GET", o, "");
  r.range_offset = static_cast<int64_t>(offset);
  r.range_length = length;
  r.out = out;
  return Clean(http_.Perform(r).status());
}

Result<std::string> S3Client::Get(const S3Object& o) {
  auto resp = Clean(http_.Perform(Request("GET", o, "")));
  if (!resp.ok()) return std::move(resp).take_status();
  return std::move(resp->body);
}

Status S3Client::Put(const S3Object& o, std::string_view data, std::string content_md5) {
  HttpRequest r = Request("PUT", o, "");
  r.headers.push_back("Content-MD5: " + (content_md5.empty() ? ContentMd5(data) : content_md5));
  r.body = data;
  return Clean(http_.Perform(r).status());
}

Status S3Client::Delete(const S3Object& o) {
  Status s = Clean(http_.Perform(Request("DELETE", o, "")).status());
  if (s.code() == Code::kNotFound) return Status::OK();
  return s;
}

Status S3Client::CreateBucket(const std::string& bucket) {
  HttpRequest r = Request("PUT", S3Object{bucket, ""}, "");
  r.url = BucketUrl(bucket);
  r.display_url = "s3://" + bucket;
  return Clean(http_.Perform(r).status());
}

Result<std::vector<S3ObjectInfo>> S3Client::List(const std::string& bucket, const std::string& prefix, int page_size) {
  std::vector<S3ObjectInfo> out;
  std::string token;
  const std::string shown = "s3://" + bucket + "/" + prefix;
  constexpr int kMaxEmptyPages = 100;
  std::set<std::string> seen;  // continuation tokens
  int empty_pages = 0;
  for (int page = 0;; ++page) {
    const size_t before = out.size();
    std::string query;
    if (!token.empty()) query += "continuation-token=" + UriEncode(token, false) + "&";
    query += fmt::format("list-type=2&max-keys={}&prefix={}", page_size, UriEncode(prefix, false));
    HttpRequest r = Request("GET", S3Object{bucket, ""}, "");
    r.url = BucketRoot(bucket) + "?" + query;
    r.display_url = shown;
    auto resp = Clean(http_.Perform(r));
    if (!resp.ok()) return std::move(resp).take_status();
    SK_ASSIGN_OR_RETURN(auto root, ParseXml(resp->body, "LIST " + shown));
    if (root->name != "ListBucketResult")
      return Status::Corrupt(fmt::format("LIST {}: unexpected answer <{}>", shown, root->name), {.file = shown});
    for (const auto& c : root->children) {
      if (c->name != "Contents") continue;
      S3ObjectInfo info;
      info.key = c->ChildText("Key");
      info.size = std::strtoull(c->ChildText("Size").c_str(), nullptr, 10);
      info.etag = Unquote(c->ChildText("ETag"));
      out.push_back(std::move(info));
    }
    if (root->ChildText("IsTruncated") != "true") break;
    std::string next = root->ChildText("NextContinuationToken");
    if (next.empty())
      return Status::Corrupt(fmt::format("LIST {}: truncated page without a continuation token", shown),
                             {.file = shown});
    // A store that hands back a token it was given before, or truncated pages that
    // hold nothing for ever, would keep this loop asking: refused, never a hang.
    if (!seen.insert(next).second)
      return Status::Corrupt(fmt::format("LIST {}: page {} gave back a continuation token already used", shown,
                                         page + 1),
                             {.file = shown});
    empty_pages = out.size() == before ? empty_pages + 1 : 0;
    if (empty_pages > kMaxEmptyPages)
      return Status::Corrupt(fmt::format("LIST {}: {} truncated pages in a row without a key", shown, empty_pages),
                             {.file = shown});
    token = std::move(next);
  }
  std::sort(out.begin(), out.end(), [](const S3ObjectInfo& a, const S3ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Result<std::string> S3Client::CreateMultipartUpload(const S3Object& o) {
  HttpRequest r = Request("POST", o, "uploads=");
  auto resp = Clean(http_.Perform(r));
  if (!resp.ok()) return std::move(resp).take_status();
  SK_ASSIGN_OR_RETURN(auto root, ParseXml(resp->body, "create multipart upload " + o.ToString()));
  std::string id = root->ChildText("UploadId");
  if (id.empty())
    return Status::Corrupt(fmt::format("POST {}?uploads: no UploadId in the answer", o.ToString()), {.file = o.ToString()});
  return id;
}

Result<std::string> S3Client::UploadPart(const S3Object& o, const std::string& upload_id, int part_number,
                                         std::string_view data, std::string content_md5) {
  HttpRequest r = Request("PUT", o, fmt::format("partNumber={}&uploadId={}", part_number, UriEncode(upload_id, false)));
  r.display_url = fmt::format("{} (part {})", o.ToString(), part_number);
  r.headers.push_back("Content-MD5: " + (content_md5.empty() ? ContentMd5(data) : content_md5));
  r.body = data;
  auto resp = Clean(http_.Perform(r));
  if (!resp.ok()) return std::move(resp).take_status();
  if (resp->etag.empty())
    return Status::IOError(fmt::format("PUT {} part {}: no ETag in the answer", o.ToString(), part_number),
                           {.file = o.ToString()});
  return resp->etag;
}

Status S3Client::CompleteMultipartUpload(const S3Object& o, const std::string& upload_id,
                                         const std::vector<CompletedPart>& parts) {
  std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const CompletedPart& p : parts)
    body += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", p.number, XmlEscape(p.etag));
  body += "</CompleteMultipartUpload>";
  HttpRequest r = Request("POST", o, "uploadId=" + UriEncode(upload_id, false));
  r.headers.push_back("Content-Type: application/xml");
  r.body = body;
  auto resp = Clean(http_.Perform(r));
  if (!resp.ok()) return std::move(resp).take_status();
  // S3 may answer 200 and put an <Error> in the body.
  SK_ASSIGN_OR_RETURN(auto root, ParseXml(resp->body, "complete multipart upload " + o.ToString()));
  if (root->name == "Error")
    return Clean(Status::IOError(fmt::format("complete multipart upload {}: {}: {}", o.ToString(),
                                             root->ChildText("Code").substr(0, 128),
                                             root->ChildText("Message").substr(0, 512)),  // as error bodies are cut
                                 {.file = o.ToString()}));
  return Status::OK();
}

Status S3Client::AbortMultipartUpload(const S3Object& o, const std::string& upload_id) {
  Status s = Clean(http_.Perform(Request("DELETE", o, "uploadId=" + UriEncode(upload_id, false))).status());
  if (s.code() == Code::kNotFound) return Status::OK();  // already gone
  return s;
}

Result<std::vector<std::string>> S3Client::ListMultipartUploads(const std::string& bucket, const std::string& prefix) {
  const std::string shown = "s3://" + bucket + "/" + prefix;
  HttpRequest r = Request("GET", S3Object{bucket, ""}, "");
  r.url = BucketRoot(bucket) + "?prefix=" + UriEncode(prefix, false) + "&uploads=";
  r.display_url = shown;
  auto resp = Clean(http_.Perform(r));
  if (!resp.ok()) return std::move(resp).take_status();
  SK_ASSIGN_OR_RETURN(auto root, ParseXml(resp->body, "list multipart uploads " + shown));
  std::vector<std::string> ids;
  for (const auto& c : root->children)
    if (c->name == "Upload") ids.push_back(c->ChildText("UploadId"));
  return ids;
}

Status S3Client::PutMultipart(const S3Object& o, std::string_view data, uint64_t part_size) {
  if (part_size == 0) return Status::Invalid("multipart part size 0");
  SK_ASSIGN_OR_RETURN(auto up, MultipartUpload::Begin(this, o));
  for (uint64_t off = 0; off < data.size() || off == 0; off += part_size) {
    SK_RETURN_IF_ERROR(up->Add(std::string(data.substr(off, part_size))));  // ~MultipartUpload aborts
    if (data.empty()) break;
  }
  return up->Complete();
}

Result<std::unique_ptr<MultipartUpload>> MultipartUpload::Begin(S3Client* client, S3Object object) {
  SK_ASSIGN_OR_RETURN(std::string id, client->CreateMultipartUpload(object));
  return std::unique_ptr<MultipartUpload>(new MultipartUpload(client, std::move(object), std::move(id)));
}

namespace {
struct PartPool {
  std::mutex mu;
  std::vector<std::string> free;
  size_t bytes = 0;
};
PartPool& Parts() {
  static PartPool* pool = new PartPool;  // (never destroyed: uploads may run during exit)
  return *pool;
}
}  // namespace

std::string TakePartBuffer(size_t capacity) {
  std::string out;
  {
    PartPool& p = Parts();
    std::lock_guard<std::mutex> lk(p.mu);
    for (size_t i = p.free.size(); i-- > 0;) {
      if (p.free[i].capacity() < capacity) continue;
      out = std::move(p.free[i]);
      p.free.erase(p.free.begin() + std::ptrdiff_t(i));
      p.bytes -= out.capacity();
      break;
    }
  }
  out.clear();
  out.reserve(capacity);
  return out;
}

void GivePartBuffer(std::string&& buffer) {
  std::string b = std::move(buffer);
  if (b.capacity() < (size_t(1) << 20)) return;  // (small ones: not worth keeping)
  PartPool& p = Parts();
  std::lock_guard<std::mutex> lk(p.mu);
  if (p.bytes + b.capacity() > kPartPoolBytes) return;
  p.bytes += b.capacity();
  p.free.push_back(std::move(b));
}

MultipartUpload::~MultipartUpload() {
  if (!done_) (void)Abort();
}

Status MultipartUpload::Add(std::string data, std::string content_md5) {
  if (done_) return Status::Internal(fmt::format("multipart upload of {} is finished", object_.ToString()));
  while (in_flight_.size() >= kInFlight)
    if (Status s = ReapOldest(); !s.ok()) return Fail(s);
  const int number = next_++;
  in_flight_.emplace_back(number, std::async(std::launch::async, [this, number, d = std::move(data),
                                                                   md5 = std::move(content_md5)]() mutable {
                            auto etag = client_->UploadPart(object_, upload_id_, number, d, std::move(md5));
                            GivePartBuffer(std::move(d));
                            return etag;
                          }));
  return Status::OK();
}

Status MultipartUpload::ReapOldest() {
  auto [number, f] = std::move(in_flight_.front());
  in_flight_.pop_front();
  auto etag = f.get();
  if (!etag.ok()) return std::move(etag).take_status();
  parts_.push_back({number, std::move(etag).value()});
  return Status::OK();
}

Status MultipartUpload::Fail(const Status& s) {
  Status a = Abort();
  if (!a.ok()) return Status(s.code(), s.message() + "; aborting the upload failed too: " + a.message(), s.where());
  return s;
}

Status MultipartUpload::Complete() {
  if (done_) return Status::Internal(fmt::format("multipart upload of {} is finished", object_.ToString()));
  while (!in_flight_.empty())
    if (Status s = ReapOldest(); !s.ok()) return Fail(s);
  Status s = client_->CompleteMultipartUpload(object_, upload_id_, parts_);
  if (!s.ok()) return Fail(s);
  done_ = true;
  return Status::OK();
}

Status MultipartUpload::Abort() {
  for (auto& p : in_flight_) p.second.wait();  // no part may land after the abort
  in_flight_.clear();
  if (done_) return Status::OK();
  done_ = true;
  return client_->AbortMultipartUpload(object_, upload_id_);
}

}  // namespace shardkit::remote
