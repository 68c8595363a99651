// MD5 through OpenSSL's EVP interface (core/md5.h).
#include "core/md5.h"

#include <fcntl.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <cerrno>
#include <new>
#include <vector>

namespace shardkit::md5 {

Md5::Md5() : ctx_(EVP_MD_CTX_new()) {
  // Fails only without memory (or without MD5 in a FIPS-only build): as a failed allocation.
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_md5(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::bad_alloc();
  }
}

Md5::~Md5() { EVP_MD_CTX_free(ctx_); }

void Md5::Update(const void* data, size_t size) {
  if (size) EVP_DigestUpdate(ctx_, data, size);
}

void Md5::Digest(uint8_t out[16]) {
  unsigned int n = 16;
  EVP_DigestFinal_ex(ctx_, out, &n);
}

std::string Md5::HexDigest() {
  uint8_t d[16];
  Digest(d);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint8_t byte : d) {
    out += hex[byte >> 4];
    out += hex[byte & 15];
  }
  return out;
}

Result<std::string> HashFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "cannot open", Location{.file = path});
  Md5 h;
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "cannot read", Location{.file = path});
    }
    if (n == 0) break;
    h.Update(buf.data(), size_t(n));
  }
  ::close(fd);
  return h.HexDigest();
}

}  // namespace shardkit::md5
