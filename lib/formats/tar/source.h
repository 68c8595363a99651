// Internal: the byte sources the tar scanner (formats/tar/tar.h) reads from,
// in the shape of libarchive's read-ahead (__archive_read_ahead /
// __archive_read_consume): the scanner asks for "at least N bytes at the
// current position, not consumed", then consumes them. The same tar rules then
// apply to every kind of source:
//  - MemorySource: bytes in memory (an mmap of a shard). Ahead() and Take()
//    are views of those bytes: zero-copy, nothing is read or allocated.
//  - FdSource: a stream (a pipe from a command): buffered read(2)s. Memory
//    follows the bytes that arrived, never a size the data declared.
// A ranged reader (an HTTP object read with Range requests) fits the same
// interface: size() known up front (so a scanner checks sizes without reading
// data), Ahead() fetches a range, Consume() skips without fetching.
//
// Thread safety: a source is used by one thread. Positions are byte offsets
// from where the source started.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shardkit/bytes.h"
#include "shardkit/status.h"

namespace shardkit::tar {

class Source {
 public:
  virtual ~Source() = default;
  // The bytes at the current position, not consumed: at least `min` of them,
  // or all that is left when the data ends first (possibly none). Valid until
  // the next call of any method of this source. Asking for more than is
  // buffered reads more (a stream) or fetches it (a ranged reader).
  virtual Result<std::span<const uint8_t>> Ahead(size_t min) = 0;
  // Moves the position n bytes on (n may be larger than what Ahead() returned:
  // a skip). Returns how many bytes were passed: fewer than n only at the end.
  virtual Result<uint64_t> Consume(uint64_t n) = 0;
  // Consumes n bytes and returns them as Bytes that stay valid after the source
  // moves on (and after it is destroyed): a view of the mapping when the bytes
  // are in memory, else a buffer of their own. Fewer than n only at the end.
  virtual Result<Bytes> Take(uint64_t n) = 0;
  // Bytes consumed so far.
  virtual uint64_t position() const = 0;
  // The total size when known up front (memory, a ranged object); -1 for a stream.
  virtual int64_t size() const { return -1; }
};

// Bytes in memory. `owner` (may be null) keeps them alive for the Bytes that
// Take() returns.
class MemorySource final : public Source {
 public:
  MemorySource(const uint8_t* data, uint64_t size, std::shared_ptr<const void> owner = nullptr)
      : data_(data), size_(size), owner_(std::move(owner)) {}
  Result<std::span<const uint8_t>> Ahead(size_t) override {
    return std::span<const uint8_t>(data_ + pos_, size_t(size_ - pos_));
  }
  Result<uint64_t> Consume(uint64_t n) override {
    uint64_t k = std::min(n, size_ - pos_);
    pos_ += k;
    return k;
  }
  Result<Bytes> Take(uint64_t n) override {
    uint64_t k = std::min(n, size_ - pos_);
    Bytes b(owner_, data_ + pos_, size_t(k));
    pos_ += k;
    return b;
  }
  uint64_t position() const override { return pos_; }
  int64_t size() const override { return int64_t(size_); }

 private:
  const uint8_t* data_;
  uint64_t size_;
  std::shared_ptr<const void> owner_;
  uint64_t pos_ = 0;
};

// A readable file descriptor (a pipe), read in order. The descriptor stays the
// caller's (it is not closed here). `what` names the stream in read errors
// ("the output of command 'x'"); `where` is their location (the offset is
// filled in).
class FdSource final : public Source {
 public:
  FdSource(int fd, std::string what, Location where) : fd_(fd), what_(std::move(what)), where_(std::move(where)) {}
  Result<std::span<const uint8_t>> Ahead(size_t min) override;
  Result<uint64_t> Consume(uint64_t n) override;
  Result<Bytes> Take(uint64_t n) override;
  uint64_t position() const override { return pos_; }
  // True once read(2) has reported the end of the stream.
  bool ended() const { return eof_; }
  // Bytes read from the descriptor so far (consumed or buffered).
  uint64_t bytes_read() const { return pos_ + buffered(); }

 private:
  // Reads until `min` bytes are buffered or the stream ends.
  Status Fill(size_t min);
  size_t buffered() const { return end_ - begin_; }

  int fd_;
  std::string what_;
  Location where_;
  // buf_[begin_, end_) are read and not consumed; cap_ is its size. A buffer
  // that Take() handed out is never written again: the next read starts a new one.
  std::shared_ptr<uint8_t[]> buf_;
  size_t cap_ = 0, begin_ = 0, end_ = 0;
  bool handed_out_ = false;
  uint64_t pos_ = 0;
  bool eof_ = false;
};

}  // namespace shardkit::tar
