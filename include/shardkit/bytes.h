// shardkit/bytes.h: an immutable byte range that keeps its storage alive.
//
// A Bytes is either owned (it holds a heap buffer) or a zero-copy view into a
// mapping (an mmap of a tar shard, LMDB's map, an HDF5 payload dataset) that it
// keeps alive through a shared owner. Either way the bytes stay valid and
// unchanged for as long as any copy of the Bytes exists; copying a Bytes copies
// a pointer, never the payload.
//
// Thread safety: immutable; any number of threads may read the same Bytes.
// Copies of one Bytes may be destroyed from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/export.h"

namespace shardkit {

class SHARDKIT_API Bytes {
 public:
  Bytes() = default;
  // A view of [data, data+size) kept alive by `owner` (may be null for static data).
  Bytes(std::shared_ptr<const void> owner, const uint8_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}

  static Bytes Copy(const void* data, size_t size);
  static Bytes Copy(std::string_view s) { return Copy(s.data(), s.size()); }
  static Bytes Take(std::string s);
  static Bytes Take(std::vector<uint8_t> v);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  std::string str() const { return std::string(view()); }
  // A sub-range sharing the same owner.
  Bytes slice(size_t offset, size_t len) const { return Bytes(owner_, data_ + offset, len); }
  // True when the storage is owned by this object alone (not a view of a mapping).
  const std::shared_ptr<const void>& owner() const { return owner_; }

  friend bool operator==(const Bytes& a, const Bytes& b) {
    return a.size_ == b.size_ && (a.size_ == 0 || std::memcmp(a.data_, b.data_, a.size_) == 0);
  }

 private:
  std::shared_ptr<const void> owner_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardkit
