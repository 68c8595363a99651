// Internal: HTTP(S) requests on libcurl, with timeouts, retries and SigV4 signing.
//
// Every request has a connect timeout, a low-speed abort (fewer than
// low_speed_limit bytes/s for low_speed_time) and a total timeout, so no call
// hangs. A request that fails transiently (connection error, timeout, reset, 5xx,
// 429, 503 SlowDown, a body shorter or longer than asked or than Content-Length)
// is retried with exponential backoff and full jitter until max_attempts or the
// retry budget (wall time of all attempts and sleeps) runs out; the last attempt's
// timeout is cut to what is left of the budget. Then the call fails naming the
// URL (without userinfo or a presigned query), the byte offset and length for a
// ranged read, and what went wrong. 404 -> kNotFound; 401/403 -> kIOError "access
// denied (check AWS credentials / bucket policy)"; a range past the end of the
// object (416, or a Content-Range total too small) -> kInvalidArgument naming the
// object's size; other 4xx -> kIOError; none of these is retried.
//
// Signing: when HttpRequest::signing is set, libcurl signs the request with AWS
// Signature V4 (CURLOPT_AWS_SIGV4); the payload is declared UNSIGNED-PAYLOAD (and
// a PUT body carries Content-MD5, which the store checks). No message ever holds
// the secret key or the session token (see credentials.h, Redact).
//
// Connections: the client keeps a pool of curl easy handles; a request borrows
// one and returns it, and a handle keeps its connections alive, so concurrent
// ranged reads from N threads use about N connections, not one per request. DNS
// and TLS sessions are shared between the handles.
//
// Thread safety: all methods of HttpClient may be called from any number of
// threads at once. An HttpRequest and its buffers belong to the calling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::remote {

struct RetryPolicy {
  int max_attempts = 8;                    // first try included
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::milliseconds budget{120000};  // all attempts and sleeps of one call
};

struct HttpOptions {
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds request_timeout{300000};  // one attempt, whole transfer
  long low_speed_limit = 1024;                         // bytes per second ...
  std::chrono::seconds low_speed_time{30};             // ... for this long aborts an attempt
  RetryPolicy retry;
  // No verbose/trace switch on purpose: curl's trace prints request headers, and
  // x-amz-security-token is a secret.
};

// SigV4 signing for one request.
struct AwsSigning {
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // sent as x-amz-security-token when set
};

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;             // as sent (already percent-encoded)
  std::string display_url;     // for messages; SafeUrl(url) when empty
  std::vector<std::string> headers;  // "Name: value"
  // PUT/POST body; must stay valid during the call.
  std::string_view body;
  // A GET of [range_offset, range_offset + range_length) into `out` (range_length
  // bytes); range_offset < 0: no Range, the body goes to HttpResponse::body.
  int64_t range_offset = -1;
  uint64_t range_length = 0;
  char* out = nullptr;
  const AwsSigning* signing = nullptr;
};

struct HttpResponse {
  long status = 0;
  std::string body;        // whole body (not for ranged reads)
  std::string etag;        // ETag header, quotes kept
  int64_t content_length = -1;
  int64_t total_size = -1;  // from Content-Range "bytes a-b/TOTAL", else -1
  int attempts = 0;
};

// The URL with userinfo removed and a presigned or credential-bearing query replaced by "?<redacted>".
std::string SafeUrl(std::string_view url);

// Percent-encodes like AWS's UriEncode: unreserved characters (A-Z a-z 0-9 - _ . ~)
// stay, '/' stays when keep_slash, every other byte becomes %XX (uppercase).
std::string UriEncode(std::string_view s, bool keep_slash);

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const HttpOptions& options() const { return options_; }

  // One request, retried as the header describes. A 2xx (206 for a ranged GET)
  // returns the response; anything else a Status whose Location names the URL
  // (and offset for a ranged GET).
  Result<HttpResponse> Perform(const HttpRequest& request);

  // Conveniences for plain http(s) URLs (no signing).
  struct ObjectInfo {
    uint64_t size = 0;
    std::string etag;
  };
  Result<ObjectInfo> Head(const std::string& url);
  Status ReadRange(const std::string& url, uint64_t offset, uint64_t length, char* out);
  Result<std::string> Get(const std::string& url);
  // content_md5: the body's Content-MD5 (base64) when known; "" = computed here.
  Status Put(const std::string& url, std::string_view data, std::string content_md5 = "");
  Status Delete(const std::string& url);

  // Easy handles made so far (connection reuse tests: ~threads, not ~requests).
  size_t handles_created() const;

 private:
  struct Pool;
  HttpOptions options_;
  std::unique_ptr<Pool> pool_;
};

// Content-MD5 header value of `data` (base64 of the raw digest).
std::string ContentMd5(std::string_view data);
// Content-MD5's form (base64) of a 16-byte digest.
std::string Md5Base64(const uint8_t digest[16]);

}  // namespace shardkit::remote
