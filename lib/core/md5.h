// Internal: MD5 (RFC 1321), for wids shard lists, which name each shard's md5sum.
// Not for security. One object per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "shardkit/status.h"

namespace shardkit::md5 {

class Md5 {
 public:
  Md5();
  void Update(const void* data, size_t size);
  // 32 lowercase hex digits; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[4];
  uint64_t length_ = 0;  // bytes
  uint8_t buf_[64];
  size_t used_ = 0;
};

// MD5 of a whole file, streamed.
Result<std::string> HashFile(const std::string& path);

}  // namespace shardkit::md5
