// Internal: one entry point for remote addresses, by scheme.
//
// http://, https:// -> HttpClient; s3:// -> S3Client (settings read from the
// environment on the first s3:// address, credentials.h). This is what the
// storage seam's HTTP and S3 FileSystem implementations (issue 13/14) will wrap;
// nothing calls it yet (docs/remote.md).
//
// Thread safety: all methods may be called from any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "io/remote/http_client.h"
#include "io/remote/s3.h"
#include "shardkit/status.h"

namespace shardkit::remote {

// True for http://, https:// and s3:// addresses.
bool IsRemoteAddress(std::string_view address);

struct RemoteObjectInfo {
  std::string address;
  uint64_t size = 0;
  std::string etag;  // quotes removed; "" when the server sent none
};

struct WriteOptions {
  // Objects larger than this go to S3 as multipart uploads of part_size parts.
  uint64_t multipart_threshold = 64ull << 20;
  uint64_t part_size = 16ull << 20;  // S3: >= 5 MiB
  // The data's Content-MD5 (base64) when already known (computed while it was
  // assembled); "" = computed here. Not used by a multipart upload (each part has its own).
  std::string content_md5;
};

class ObjectStore {
 public:
  explicit ObjectStore(HttpOptions options = {});
  // With fixed S3 settings instead of the environment's (tests, tools).
  ObjectStore(S3Settings s3, HttpOptions options);

  Result<RemoteObjectInfo> Stat(const std::string& address);
  // Exactly `length` bytes at `offset` into `out`.
  Status ReadRange(const std::string& address, uint64_t offset, uint64_t length, char* out);
  Result<std::string> ReadAll(const std::string& address);
  // Replaces the object. S3: one PUT, or a multipart upload (aborted on failure)
  // above options.multipart_threshold. HTTP: one PUT.
  Status Write(const std::string& address, std::string_view data, const WriteOptions& options = {});
  Status Remove(const std::string& address);
  // Objects under an s3://bucket/prefix address, in key order (addresses are
  // s3://bucket/key). HTTP has no listing: kUnsupported.
  Result<std::vector<RemoteObjectInfo>> List(const std::string& prefix_address);

  // The S3 client (settings from the environment on first use, or the fixed ones).
  Result<S3Client*> S3();

 private:
  HttpOptions options_;
  HttpClient http_;
  std::once_flag s3_once_;
  std::unique_ptr<S3Client> s3_;
  Status s3_status_;
  std::unique_ptr<S3Settings> fixed_s3_;
};

}  // namespace shardkit::remote
