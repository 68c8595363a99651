#include "io/remote/http_client.h"

#include "core/redact.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <curl/curl.h>
#include <fmt/format.h>

#include "core/md5.h"

namespace shardkit::remote {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxErrorBody = 64 * 1024;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool StartsWithNoCase(std::string_view s, std::string_view p) {
  if (s.size() < p.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(p[i]))) return false;
  return true;
}

// The text between <tag> and </tag> in an S3 error body, "" when absent.
std::string XmlField(const std::string& body, std::string_view tag) {
  std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  size_t b = body.find(open);
  if (b == std::string::npos) return "";
  b += open.size();
  size_t e = body.find(close, b);
  if (e == std::string::npos || e - b > 512) return "";
  return body.substr(b, e - b);
}

// One attempt's transfer state.
struct Transfer {
  const HttpRequest* req = nullptr;
  CURL* h = nullptr;
  size_t body_pos = 0;  // upload position
  // Response (reset on every new status line: 100 Continue, then the real one).
  std::string etag;
  int64_t content_length = -1;
  int64_t range_start = -1, range_end = -1, total = -1;
  long retry_after_s = -1;
  std::string error_body;
  std::string body;      // whole body for a non-ranged request
  uint64_t got = 0;      // bytes written to req->out
  bool overflow = false;
  bool ignored_range = false;

  void ResetResponse() {
    etag.clear();
    content_length = -1;
    range_start = range_end = total = -1;
    retry_after_s = -1;
  }
};

std::string_view TrimView(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// One header line (called per line, on every request: no allocation but the ETag's).
size_t OnHeader(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  std::string_view line(p, size * n);
  if (StartsWithNoCase(line, "HTTP/")) {
    t->ResetResponse();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string_view name = TrimView(line.substr(0, colon));
  std::string_view value = TrimView(line.substr(colon + 1));
  auto is = [&](std::string_view want) { return name.size() == want.size() && StartsWithNoCase(name, want); };
  // The value as a terminated string for strtoll and sscanf (values longer than any
  // number or range we read are cut).
  char buf[96];
  const size_t k = std::min(value.size(), sizeof buf - 1);
  std::memcpy(buf, value.data(), k);
  buf[k] = 0;
  if (is("etag")) {
    t->etag = std::string(value);
  } else if (is("content-length")) {
    t->content_length = std::strtoll(buf, nullptr, 10);
  } else if (is("retry-after")) {
    t->retry_after_s = std::strtol(buf, nullptr, 10);
  } else if (is("content-range")) {
    // "bytes START-END/TOTAL" (TOTAL may be '*')
    long long a = -1, b = -1, tot = -1;
    if (std::sscanf(buf, "bytes %lld-%lld/%lld", &a, &b, &tot) >= 2) {
      t->range_start = a;
      t->range_end = b;
      t->total = tot;
    } else if (std::sscanf(buf, "bytes */%lld", &tot) == 1) {
      t->total = tot;  // a 416's "bytes */SIZE"
    }
  }
  return size * n;
}

size_t OnWrite(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  size_t len = size * n;
  long code = 0;
  curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &code);
  if (code < 200 || code >= 300) {
    size_t keep = std::min(len, kMaxErrorBody - std::min(kMaxErrorBody, t->error_body.size()));
    t->error_body.append(p, keep);
    return len;
  }
  if (t->req->range_offset >= 0) {
    if (code != 206) {
      t->ignored_range = true;
      return 0;  // aborts the transfer
    }
    if (t->got + len > t->req->range_length) {
      t->overflow = true;
      return 0;
    }
    std::memcpy(t->req->out + t->got, p, len);
    t->got += len;
    return len;
  }
  t->body.append(p, len);
  return len;
}

size_t OnRead(char* buf, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  std::string_view body = t->req->body;
  size_t len = std::min(size * n, body.size() - t->body_pos);
  std::memcpy(buf, body.data() + t->body_pos, len);
  t->body_pos += len;
  return len;
}

int OnSeek(void* ud, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(ud);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->req->body.size())
    return CURL_SEEKFUNC_CANTSEEK;
  t->body_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

bool RetryableCurlCode(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_BAD_CONTENT_ENCODING:
      return true;
    default:
      return false;
  }
}

enum class Verdict { kOk, kRetry, kFail };

struct Outcome {
  Verdict verdict = Verdict::kFail;
  Code code = Code::kIOError;
  std::string reason;
  long retry_after_s = -1;
  Detail detail = Detail::kNone;
};

std::chrono::milliseconds Backoff(const RetryPolicy& p, int attempt, long retry_after_s) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  double cap = static_cast<double>(p.initial_backoff.count()) * std::pow(2.0, std::min(attempt - 1, 30));
  cap = std::min(cap, static_cast<double>(p.max_backoff.count()));
  // Equal jitter: half the step for sure, half at random, so that clients that
  // failed together spread out but none retries at once.
  double ms = cap / 2 + std::uniform_real_distribution<double>(0, cap / 2)(rng);
  if (retry_after_s > 0) ms = std::max(ms, std::min<double>(retry_after_s * 1000.0, p.max_backoff.count()));
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace

struct HttpClient::Pool {
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];
  std::mutex mu;
  std::vector<CURL*> free;
  std::atomic<size_t> created{0};

  static void Lock(CURL*, curl_lock_data d, curl_lock_access, void* self) {
    static_cast<Pool*>(self)->locks[d].lock();
  }
  static void Unlock(CURL*, curl_lock_data d, void* self) { static_cast<Pool*>(self)->locks[d].unlock(); }

  Pool() {
    share = curl_share_init();
    if (share) {
      curl_share_setopt(share, CURLSHOPT_LOCKFUNC, &Pool::Lock);
      curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, &Pool::Unlock);
      curl_share_setopt(share, CURLSHOPT_USERDATA, this);
      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
      curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
  }
  ~Pool() {
    for (CURL* h : free) curl_easy_cleanup(h);
    if (share) curl_share_cleanup(share);
  }
  CURL* Acquire() {
    {
      std::lock_guard<std::mutex> g(mu);
      if (!free.empty()) {
        CURL* h = free.back();
        free.pop_back();
        return h;
      }
    }
    created.fetch_add(1, std::memory_order_relaxed);
    return curl_easy_init();
  }
  void Release(CURL* h) {
    std::lock_guard<std::mutex> g(mu);
    free.push_back(h);
  }
};

std::string SafeUrl(std::string_view url) { return io::RedactAddress(url); }

std::string UriEncode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string r;
  r.reserve(s.size());
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (keep_slash && c == '/')) {
      r.push_back(static_cast<char>(c));
    } else {
      r.push_back('%');
      r.push_back(kHex[c >> 4]);
      r.push_back(kHex[c & 15]);
    }
  }
  return r;
}

std::string Md5Base64(const uint8_t raw[16]) {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (int i = 0; i < 16; i += 3) {
    uint32_t v = raw[i] << 16;
    if (i + 1 < 16) v |= raw[i + 1] << 8;
    if (i + 2 < 16) v |= raw[i + 2];
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(i + 1 < 16 ? kB64[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < 16 ? kB64[v & 63] : '=');
  }
  return out;
}

std::string ContentMd5(std::string_view data) {
  md5::Md5 m;
  m.Update(data.data(), data.size());
  uint8_t raw[16];
  m.Digest(raw);
  return Md5Base64(raw);
}

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)) {
  GlobalInit();
  pool_ = std::make_unique<Pool>();
}

HttpClient::~HttpClient() = default;

size_t HttpClient::handles_created() const { return pool_->created.load(std::memory_order_relaxed); }

Result<HttpResponse> HttpClient::Perform(const HttpRequest& req) {
  const std::string shown = req.display_url.empty() ? SafeUrl(req.url) : req.display_url;
  const bool ranged = req.range_offset >= 0;
  Location where{.file = shown};
  std::string what = fmt::format("{} {}", req.method, shown);
  if (ranged) {
    where.offset = req.range_offset;
    what += fmt::format(" (offset {}, length {})", req.range_offset, req.range_length);
    if (req.range_length == 0) return HttpResponse{.status = 206};
    if (!req.out) return Status::Internal(what + ": ranged read without a buffer", where);
  }

  const RetryPolicy& rp = options_.retry;
  const auto start = Clock::now();
  const auto deadline = start + rp.budget;
  Outcome last;
  int attempt = 0;
  CURL* h = pool_->Acquire();
  if (!h) return Status::Internal(what + ": curl_easy_init failed", where);
  struct Return {
    Pool* p;
    CURL* h;
    ~Return() { p->Release(h); }
  } give_back{pool_.get(), h};

  while (true) {
    ++attempt;
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (remaining.count() <= 0) break;

    Transfer t;
    t.req = &req;
    t.h = h;
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "shardkit");
    if (pool_->share) curl_easy_setopt(h, CURLOPT_SHARE, pool_->share);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(options_.connect_timeout, remaining).count()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, std::min(options_.request_timeout, remaining).count())));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, options_.low_speed_limit);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.low_speed_time.count()));
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnWrite);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);

    if (req.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (req.method == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, &OnRead);
      curl_easy_setopt(h, CURLOPT_READDATA, &t);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &OnSeek);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
      // Large bodies in 1 MiB reads and sends instead of 64 KiB (curl's default).
      if (req.body.size() >= (1 << 20)) curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
    } else if (req.method == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.data() ? req.body.data() : "");
    } else if (req.method != "GET") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    }
    std::string range;
    if (ranged) {
      range = fmt::format("{}-{}", req.range_offset, req.range_offset + req.range_length - 1);
      curl_easy_setopt(h, CURLOPT_RANGE, range.c_str());
    }

    struct curl_slist* headers = nullptr;
    for (const std::string& hd : req.headers) headers = curl_slist_append(headers, hd.c_str());
    std::string sigv4;
    if (req.signing) {
      // libcurl 7.88 signs the payload hash it finds in this header (it would
      // otherwise hash POSTFIELDS only, wrongly for an upload).
      headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
      if (!req.signing->session_token.empty())
        headers = curl_slist_append(headers, ("x-amz-security-token: " + req.signing->session_token).c_str());
      sigv4 = fmt::format("aws:amz:{}:s3", req.signing->region);
      curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(h, CURLOPT_USERNAME, req.signing->access_key_id.c_str());
      curl_easy_setopt(h, CURLOPT_PASSWORD, req.signing->secret_access_key.c_str());
    }
    if (headers) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    // Forget this attempt's options at once: the secret, and pointers into this
    // stack frame (error buffer, callbacks' data). Connections stay alive.
    curl_easy_reset(h);
    curl_slist_free_all(headers);

    Outcome o;
    o.retry_after_s = t.retry_after_s;
    if (cc == CURLE_WRITE_ERROR && t.ignored_range) {
      o = {Verdict::kFail, Code::kIOError, fmt::format("the server answered HTTP {} to a Range request (no range support)", status)};
    } else if (cc == CURLE_WRITE_ERROR && t.overflow) {
      o = {Verdict::kRetry, Code::kIOError, fmt::format("the body is longer than the {} bytes asked for", req.range_length)};
    } else if (cc != CURLE_OK && (status < 200 || status >= 300 || RetryableCurlCode(cc))) {
      std::string detail = errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(cc));
      if (cc == CURLE_PARTIAL_FILE || (ranged && status == 206))
        detail += fmt::format(" (received {} bytes)", ranged ? t.got : t.body.size());
      o = {RetryableCurlCode(cc) ? Verdict::kRetry : Verdict::kFail, Code::kIOError, detail};
      if (status >= 400) {
        // curl failed after an error status line: judge by the status.
        o.reason = fmt::format("HTTP {} then {}", status, detail);
      }
    } else if (cc != CURLE_OK) {
      o = {Verdict::kFail, Code::kIOError, errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(cc))};
    } else if (status >= 200 && status < 300) {
      o.verdict = Verdict::kOk;
      if (ranged) {
        if (t.total >= 0 && static_cast<uint64_t>(t.total) < req.range_offset + req.range_length) {
          o = {Verdict::kFail, Code::kInvalidArgument,
               fmt::format("the range ends past the end of the object ({} bytes)", t.total)};
        } else if (t.got != req.range_length) {
          o = {Verdict::kRetry, Code::kIOError,
               fmt::format("short body: received {} of {} bytes (Content-Length {})", t.got, req.range_length,
                           t.content_length)};
        } else if (t.range_start != req.range_offset ||
                   t.range_end != static_cast<int64_t>(req.range_offset + req.range_length - 1)) {
          o = {Verdict::kRetry, Code::kIOError,
               fmt::format("Content-Range {}-{} does not match the range asked for", t.range_start, t.range_end)};
        }
      } else if (req.method != "HEAD" && t.content_length >= 0 &&
                 static_cast<int64_t>(t.body.size()) != t.content_length) {
        o = {Verdict::kRetry, Code::kIOError,
             fmt::format("short body: received {} of Content-Length {} bytes", t.body.size(), t.content_length)};
      }
    } else {
      std::string s3code = XmlField(t.error_body, "Code");
      std::string s3msg = XmlField(t.error_body, "Message");
      std::string detail = fmt::format("HTTP {}", status);
      if (!s3code.empty()) detail += " " + s3code;
      if (!s3msg.empty()) detail += ": " + s3msg;
      if (status == 416) {
        o = {Verdict::kFail, Code::kInvalidArgument,
             t.total >= 0 ? fmt::format("the range starts past the end of the object ({} bytes)", t.total)
                          : std::string("the range starts past the end of the object (HTTP 416)")};
      } else if (status == 404) {
        o = {Verdict::kFail, Code::kNotFound, "not found (" + detail + ")"};
      } else if (status == 401 || status == 403) {
        o = {Verdict::kFail, Code::kIOError, "access denied (check AWS credentials / bucket policy) (" + detail + ")"};
        o.detail = Detail::kAccessDenied;
      } else if (status == 408 || status == 429 || status >= 500 || s3code == "SlowDown" ||
                 s3code == "RequestTimeout" || s3code == "InternalError") {
        o = {Verdict::kRetry, Code::kIOError, detail};
      } else {
        o = {Verdict::kFail, Code::kIOError, detail};
      }
      o.retry_after_s = t.retry_after_s;
    }

    if (o.verdict == Verdict::kOk) {
      HttpResponse r;
      r.status = status;
      r.body = std::move(t.body);
      r.etag = std::move(t.etag);
      r.content_length = t.content_length;
      r.total_size = t.total;
      r.attempts = attempt;
      return r;
    }
    last = std::move(o);
    if (last.verdict == Verdict::kFail || attempt >= rp.max_attempts) break;
    auto wait = Backoff(rp, attempt, last.retry_after_s);
    if (Clock::now() + wait >= deadline) break;
    std::this_thread::sleep_for(wait);
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (last.reason.empty()) last.reason = "retry budget exhausted";
  std::string msg = fmt::format("{}: {}", what, last.reason);
  if (attempt > 1) msg += fmt::format(" (after {} attempts in {:.1f} s)", attempt, secs);
  return Status(last.code, msg, where).With(last.detail);
}

Result<HttpClient::ObjectInfo> HttpClient::Head(const std::string& url) {
  HttpRequest r{.method = "HEAD", .url = url};
  SK_ASSIGN_OR_RETURN(HttpResponse resp, Perform(r));
  if (resp.content_length < 0)
    return Status::IOError(fmt::format("HEAD {}: no Content-Length in the answer", SafeUrl(url)), {.file = SafeUrl(url)});
  return ObjectInfo{static_cast<uint64_t>(resp.content_length), resp.etag};
}

Status HttpClient::ReadRange(const std::string& url, uint64_t offset, uint64_t length, char* out) {
  HttpRequest r{.url = url, .range_offset = static_cast<int64_t>(offset), .range_length = length, .out = out};
  return Perform(r).status();
}

Result<std::string> HttpClient::Get(const std::string& url) {
  HttpRequest r{.url = url};
  SK_ASSIGN_OR_RETURN(HttpResponse resp, Perform(r));
  return std::move(resp.body);
}

Status HttpClient::Put(const std::string& url, std::string_view data, std::string content_md5) {
  if (content_md5.empty()) content_md5 = ContentMd5(data);
  HttpRequest r{.method = "PUT", .url = url, .headers = {"Content-MD5: " + content_md5}, .body = data};
  return Perform(r).status();
}

Status HttpClient::Delete(const std::string& url) {
  HttpRequest r{.method = "DELETE", .url = url};
  return Perform(r).status();
}

}  // namespace shardkit::remote
