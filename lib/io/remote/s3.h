// Internal: an S3 client (AWS and S3-compatible stores) on HttpClient.
//
// Addresses are s3://BUCKET/KEY. Settings (credentials, region, endpoint,
// addressing style) come from credentials.h. Requests are signed with SigV4 by
// libcurl. Every failure names the object as s3://BUCKET/KEY (plus the byte
// offset and length of a ranged read); no message holds the secret key or the
// session token. Timeouts and retries: http_client.h.
//
// Multipart uploads: MultipartUpload aborts its upload when it is destroyed
// without a successful Complete(), and PutMultipart aborts on any failure, so a
// failed upload leaves no parts behind (when the store is reachable to abort;
// a lifecycle rule is still advisable on a real bucket).
//
// Thread safety: an S3Client may be used from any number of threads at once. A
// MultipartUpload is used from one thread at a time (its parts upload on threads
// of their own).
#pragma once

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/remote/credentials.h"
#include "io/remote/http_client.h"
#include "shardkit/status.h"

namespace shardkit::remote {

struct S3Object {
  std::string bucket;
  std::string key;  // may be empty (a bucket, or a prefix "")
  std::string ToString() const { return "s3://" + bucket + "/" + key; }
};

// "s3://bucket/key" -> {bucket, key}. kInvalidArgument for another scheme or an empty bucket.
Result<S3Object> ParseS3Address(std::string_view address);

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // quotes removed
};

struct CompletedPart {
  int number = 0;    // 1..10000
  std::string etag;  // as UploadPart returned it (quotes kept)
};

class S3Client {
 public:
  // Settings from the environment (credentials.h).
  static Result<std::shared_ptr<S3Client>> FromEnvironment(HttpOptions options = {});
  S3Client(S3Settings settings, HttpOptions options = {});

  const S3Settings& settings() const { return settings_; }
  HttpClient& http() { return http_; }

  // The request URL of an object (key percent-encoded, no credentials).
  std::string Url(const S3Object& o) const;

  Result<S3ObjectInfo> Head(const S3Object& o);
  // Exactly `length` bytes at `offset` into `out`.
  Status ReadRange(const S3Object& o, uint64_t offset, uint64_t length, char* out);
  Result<std::string> Get(const S3Object& o);
  // content_md5: as HttpClient::Put's.
  Status Put(const S3Object& o, std::string_view data, std::string content_md5 = "");
  // Deleting a missing key succeeds (as S3 does).
  Status Delete(const S3Object& o);
  // Every object of `bucket` whose key starts with `prefix`, in key order, across
  // continuation pages of at most `page_size` keys.
  Result<std::vector<S3ObjectInfo>> List(const std::string& bucket, const std::string& prefix, int page_size = 1000);
  // For tests and tools: creates a bucket (path-style stores; us-east-1 semantics).
  Status CreateBucket(const std::string& bucket);

  // Multipart upload, the raw steps.
  Result<std::string> CreateMultipartUpload(const S3Object& o);  // -> upload id
  // content_md5: the part's Content-MD5 (base64) when known; "" = computed here.
  Result<std::string> UploadPart(const S3Object& o, const std::string& upload_id, int part_number,
                                 std::string_view data, std::string content_md5 = "");  // -> ETag
  Status CompleteMultipartUpload(const S3Object& o, const std::string& upload_id,
                                 const std::vector<CompletedPart>& parts);
  Status AbortMultipartUpload(const S3Object& o, const std::string& upload_id);
  // The upload ids in progress under `prefix` (to check that none is left behind).
  Result<std::vector<std::string>> ListMultipartUploads(const std::string& bucket, const std::string& prefix);

  // `data` as one object in parts of `part_size` bytes (>= 5 MiB except the last,
  // as S3 requires); aborts the upload on any failure.
  Status PutMultipart(const S3Object& o, std::string_view data, uint64_t part_size);

 private:
  friend class MultipartUpload;
  HttpRequest Request(const std::string& method, const S3Object& o, const std::string& query) const;
  std::string BucketUrl(const std::string& bucket) const;   // no trailing '/'
  std::string BucketRoot(const std::string& bucket) const;  // for bucket-level requests
  Status Clean(Status s) const;  // redacts secrets from a message
  template <class T>
  Result<T> Clean(Result<T> r) const {
    if (r.ok()) return r;
    return Clean(std::move(r).take_status());
  }

  S3Settings settings_;
  AwsSigning signing_;
  HttpClient http_;
};

// Part buffers, reused: a multipart upload's part, once sent, goes back to a pool of
// at most kPartPoolBytes, and a writer takes its next part's buffer from there, so that
// the pages of a 16 MiB buffer are not faulted in (and zeroed by the kernel) for every
// part (a fifth of the client's CPU in a conversion to s3://). Thread-safe.
inline constexpr size_t kPartPoolBytes = size_t(128) << 20;
// An empty string with at least `capacity` bytes reserved.
std::string TakePartBuffer(size_t capacity);
// Back to the pool (dropped when the pool is full).
void GivePartBuffer(std::string&& buffer);

// One multipart upload: Begin, Add parts in order, Complete. Destroying it
// before a successful Complete aborts the upload.
//
// Parts upload concurrently, kInFlight at once, each on a thread of its own: a
// shard's last parts are the tail of a conversion to s3:// (the writer is done,
// the upload is not), and one connection to a real store carries far less than
// the disk writes. Aborting waits for the parts in flight first, so none lands
// after the abort.
class MultipartUpload {
 public:
  static constexpr size_t kInFlight = 4;
  static Result<std::unique_ptr<MultipartUpload>> Begin(S3Client* client, S3Object object);
  ~MultipartUpload();
  MultipartUpload(const MultipartUpload&) = delete;
  MultipartUpload& operator=(const MultipartUpload&) = delete;

  // Starts uploading the next part (numbered from 1); with kInFlight parts running,
  // waits for the oldest first. Returns the first failure of any part so far, after
  // aborting the upload. content_md5: as S3Client::UploadPart's.
  Status Add(std::string data, std::string content_md5 = "");
  // Waits for every part, then completes the upload (or aborts it on a failure).
  Status Complete();
  Status Abort();
  const std::string& upload_id() const { return upload_id_; }

 private:
  MultipartUpload(S3Client* c, S3Object o, std::string id) : client_(c), object_(std::move(o)), upload_id_(std::move(id)) {}
  Status ReapOldest();          // the oldest part in flight: its ETag kept, or its failure
  Status Fail(const Status& s);  // waits for the rest, aborts, returns s (with the abort's failure)
  S3Client* client_;
  S3Object object_;
  std::string upload_id_;
  std::vector<CompletedPart> parts_;
  std::deque<std::pair<int, std::future<Result<std::string>>>> in_flight_;
  int next_ = 1;
  bool done_ = false;  // completed or aborted
};

}  // namespace shardkit::remote
