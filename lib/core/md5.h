// Internal: MD5 (RFC 1321), OpenSSL's (libcrypto): wids shard lists' md5sum, MDS
// hashes, and Content-MD5 of every upload, where its speed bounds the upload's tail
// (issue 14: 863 MB/s against 525 MB/s for the portable code this replaced).
// Not for security. One object per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "shardkit/status.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace shardkit::md5 {

class Md5 {
 public:
  Md5();
  ~Md5();
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;
  void Update(const void* data, size_t size);
  // The 16 digest bytes; the object must not be updated afterwards.
  void Digest(uint8_t out[16]);
  // 32 lowercase hex digits; likewise.
  std::string HexDigest();

 private:
  evp_md_ctx_st* ctx_;
};

// MD5 of a whole file, streamed.
Result<std::string> HashFile(const std::string& path);

}  // namespace shardkit::md5
