// formats/hdf5/vlen_guard.h (internal): variable-length elements bounded before libhdf5
// allocates for them.
//
// On disk a vlen element (string or sequence) is a descriptor: uint32 length
// (in base elements), the address of a global heap collection, uint32 object
// index. libhdf5 1.10 converts one (H5T__conv_vlen) by trusting the length:
// it allocates and zeroes length x base-size bytes, then copies the heap
// object, whatever its real size, into that buffer (H5HG_read). So a 10 KB
// file declaring a 3.5 GB string makes it allocate 3.5 GB, and an object
// larger than its declared length would overrun the buffer. No public call
// exposes the descriptors before that happens (H5Dvlen_get_buf_size and a
// custom H5Pset_vlen_mem_manager allocator both run after the conversion has
// allocated), so shardkit registers its own soft conversion function for
// vlen -> vlen. While a VlenCheck is active, it checks each descriptor of the
// batch against the mapped file (length x base size within the file and
// within what is left of the read's budget; the heap collection inside the
// file, with the object present and exactly that size), then hands the batch
// to the library's own function, found with H5Tfind before registering.
// Without an active VlenCheck (writes) it only forwards. Lock held throughout.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/hdf5/internal.h"

namespace shardkit::formats::hdf5 {

struct VlenCheck;
// The check of the read in progress (nullptr: none). Lock held.
VlenCheck*& ActiveVlenCheck();
// Reads an unsigned little-endian integer of n (<= 8) bytes.
uint64_t Le(const uint8_t* p, size_t n);

struct VlenCheck {
  const uint8_t* file = nullptr;  // the whole file, mapped
  uint64_t size = 0;
  uint64_t base = 0;              // HDF5 addresses are relative to the user block's end
  size_t sizeof_size = 8;
  uint64_t budget = 0;            // bytes the whole read may still produce
  uint64_t next_index = 0;        // dataset index of the next element checked
  std::string what;               // "a variable-length string" / "... sequence"
  std::string refusal;            // set when an element is refused
  int64_t refused_index = -1;
  // Parsed heap collections: address -> object sizes by index (~0: absent).
  std::map<uint64_t, std::vector<uint64_t>> heaps;

  VlenCheck(const uint8_t* f, uint64_t n, uint64_t b, size_t ss, uint64_t first_index)
      : file(f), size(n), base(b), sizeof_size(ss), budget(n), next_index(first_index) {
    ActiveVlenCheck() = this;
  }
  ~VlenCheck() { ActiveVlenCheck() = nullptr; }
  VlenCheck(const VlenCheck&) = delete;
  VlenCheck& operator=(const VlenCheck&) = delete;

  // The object sizes of the collection at addr (absolute), or nullptr with
  // refusal set.
  const std::vector<uint64_t>* Heap(uint64_t addr) {
    auto it = heaps.find(addr);
    if (it != heaps.end()) return &it->second;
    const size_t hdr = 8 + sizeof_size;  // "GCOL", version, 3 reserved, collection size
    if (addr > size || size - addr < hdr) {
      refusal = fmt::format("points to a heap collection at {}, outside the file", addr);
      return nullptr;
    }
    const uint8_t* p = file + addr;
    if (std::memcmp(p, "GCOL", 4) != 0 || p[4] != 1) {
      refusal = fmt::format("points to {}, where there is no global heap collection", addr);
      return nullptr;
    }
    uint64_t csize = Le(p + 8, sizeof_size);
    if (csize < hdr || csize > size - addr) {
      refusal = fmt::format("points to a heap collection at {} of {} bytes, past the end of the file", addr, csize);
      return nullptr;
    }
    // libhdf5 parses the whole collection when it loads it (whichever object
    // is wanted), stepping over each record by its declared size: a
    // free-space record of 0 bytes makes it loop forever, one that runs past
    // the collection makes it read past its buffer. The walk below is the
    // same; a collection it does not find clean is refused as a whole.
    std::vector<uint64_t> objs;
    const uint64_t ohdr = 8 + sizeof_size;  // index, refcount, reserved, object size
    uint64_t off = hdr;
    while (off < csize && csize - off >= ohdr) {  // a shorter tail is free space
      uint64_t idx = Le(p + off, 2);
      uint64_t osize = Le(p + off + 8, sizeof_size);
      uint64_t room = csize - off;
      if (idx == 0) {  // free space; its size counts its header
        if (osize < ohdr || osize > room) {
          refusal = fmt::format("points to a damaged heap collection at {} (free space of {} bytes at {})", addr, osize,
                                addr + off);
          return nullptr;
        }
        off += osize;
        continue;
      }
      if (osize > room - ohdr) {
        refusal = fmt::format("points to a damaged heap collection at {} (object {} of {} bytes at {} runs past its end)",
                              addr, idx, osize, addr + off);
        return nullptr;
      }
      if (objs.size() <= idx) objs.resize(idx + 1, ~uint64_t(0));
      objs[idx] = osize;
      off += ohdr + ((osize + 7) & ~uint64_t(7));
    }
    return &heaps.emplace(addr, std::move(objs)).first->second;
  }

  // Checks n on-disk descriptors of elem bytes each; false with refusal set.
  bool Check(const uint8_t* buf, size_t n, size_t stride, size_t elem, size_t base_size) {
    if (elem < 10 || elem > 16) {
      refusal = fmt::format("unexpected descriptor size {}", elem);
      return false;
    }
    size_t sizeof_addr = elem - 8;
    for (size_t i = 0; i < n; ++i, ++next_index) {
      const uint8_t* d = buf + i * stride;
      uint64_t len = Le(d, 4);
      uint64_t bytes = len * base_size;
      uint64_t addr = Le(d + 4, sizeof_addr);
      uint64_t idx = Le(d + 4 + sizeof_addr, 4);
      // Address 0 is a null element: libhdf5 reads nothing. Any other address
      // is read, even for length 0 (fuzz finding: a hang in a damaged heap).
      if (len == 0 && addr == 0) continue;
      refused_index = int64_t(next_index);
      if (bytes > size) {
        refusal = fmt::format("declares {} of {} bytes in a file of {} bytes", what, bytes, size);
        return false;
      }
      if (bytes > budget) {
        refusal = fmt::format("declares {} of {} bytes, more than the file holds with the elements before it "
                              "({} bytes)",
                              what, bytes, size);
        return false;
      }
      if (addr == 0 || addr > size - base) {
        refusal = fmt::format("declares {} of {} bytes at heap address {}, outside the file", what, bytes, addr);
        return false;
      }
      const std::vector<uint64_t>* objs = Heap(base + addr);
      if (!objs) return false;
      if (idx >= objs->size() || (*objs)[idx] == ~uint64_t(0)) {
        refusal = fmt::format("points to heap object {} at {}, which does not exist", idx, base + addr);
        return false;
      }
      if ((*objs)[idx] != bytes) {
        refusal = fmt::format("declares {} of {} bytes but its heap object holds {}", what, bytes, (*objs)[idx]);
        return false;
      }
      budget -= bytes;
    }
    refused_index = -1;
    return true;
  }
};

// Registers the guarded conversion once. Lock held.
Status InstallVlenGuard(const std::string& path);

}  // namespace shardkit::formats::hdf5
