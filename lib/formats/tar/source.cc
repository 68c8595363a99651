#include "formats/tar/source.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace shardkit::tar {

namespace {
// A read asks for at least this much room, and a buffer grows by at most the
// larger of this and what it holds: memory follows the bytes that arrived.
constexpr size_t kMinRead = 64 << 10;
constexpr size_t kMaxStep = 1 << 20;
}  // namespace

Status FdSource::Fill(size_t min) {
  while (buffered() < min && !eof_) {
    const size_t have = buffered();
    if (have == 0 && !handed_out_) begin_ = end_ = 0;
    if (!buf_ || handed_out_ || end_ == cap_) {
      // Room for at least one more read: move the unconsumed bytes to the front
      // of this buffer when it is ours and large enough, else to a new one.
      const size_t room = std::clamp(min - have, kMinRead, std::max(have, kMaxStep));
      if (buf_ && !handed_out_ && have + room <= cap_) {
        std::memmove(buf_.get(), buf_.get() + begin_, have);
      } else {
        size_t cap = have + room;
        std::shared_ptr<uint8_t[]> nb(new uint8_t[cap]);
        if (have) std::memcpy(nb.get(), buf_.get() + begin_, have);
        buf_ = std::move(nb);
        cap_ = cap;
        handed_out_ = false;
      }
      begin_ = 0;
      end_ = have;
    }
    ssize_t r = ::read(fd_, buf_.get() + end_, cap_ - end_);
    if (r < 0) {
      if (errno == EINTR) continue;
      Location at = where_;
      at.offset = int64_t(bytes_read());
      return Status::FromErrno(errno, fmt::format("cannot read {}", what_), at);
    }
    if (r == 0) eof_ = true;
    end_ += size_t(r);
  }
  return Status::OK();
}

Result<std::span<const uint8_t>> FdSource::Ahead(size_t min) {
  SK_RETURN_IF_ERROR(Fill(min));
  if (!buf_) return std::span<const uint8_t>();
  return std::span<const uint8_t>(buf_.get() + begin_, buffered());
}

Result<uint64_t> FdSource::Consume(uint64_t n) {
  uint64_t done = 0;
  while (done < n) {
    if (buffered() == 0) {
      SK_RETURN_IF_ERROR(Fill(1));
      if (buffered() == 0) break;
    }
    size_t k = size_t(std::min<uint64_t>(buffered(), n - done));
    begin_ += k;
    pos_ += k;
    done += k;
  }
  return done;
}

Result<Bytes> FdSource::Take(uint64_t n) {
  if (n == 0) return Bytes();
  SK_RETURN_IF_ERROR(Fill(size_t(n)));
  size_t k = size_t(std::min<uint64_t>(buffered(), n));
  if (k == 0) return Bytes();
  Bytes b(std::shared_ptr<const void>(buf_, buf_.get()), buf_.get() + begin_, k);
  handed_out_ = true;
  begin_ += k;
  pos_ += k;
  return b;
}

}  // namespace shardkit::tar
