// formats/hdf5/internal.h (internal to lib/formats/hdf5/): what the hdf5 format's files
// share: the one lock around the (serial) HDF5 library, HDF5 errors as Status, handles.
// The layout and the read and write rules: format.cc's header comment and
// docs/formats-hdf5.md.
//
//   h5.cc          the library lock and error messages
//   vlen_guard.*   variable-length elements bounded before libhdf5 allocates for them
//   reader.cc      the Dataset (our layout through an mmap; third-party files through HDF5)
//   writer.cc      the writer
//   format.cc      content bids and the registry row
//
// Thread safety: every H5* call runs under H5Lock (Debian's HDF5 is the serial build).
#pragma once

#include <hdf5.h>

#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "io/any_file.h"
#include "core/paths.h"
#include "formats/registry.h"
#include "shardkit/dataset.h"
#include "shardkit/status.h"

namespace shardkit::formats::hdf5 {

inline constexpr int kFormatVersion = 1;
inline constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};

// The one lock around the HDF5 library.
std::mutex& H5Mutex();

// Holds the library lock. Also turns HDF5's own error printing off (once).
class H5Lock {
 public:
  H5Lock() : g_(H5Mutex()) {
    static bool silenced = false;
    if (!silenced) {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      silenced = true;
    }
  }

 private:
  std::lock_guard<std::mutex> g_;
};

// The innermost message of HDF5's error stack (clears the stack). Lock held.
std::string H5Message();

// A number type libhdf5 converts without reading past it: an integer of 1 to 8 bytes or
// a float of 4 or 8, whose precision, bit offset and (float) sign, exponent and mantissa
// fields lie inside its bytes. libhdf5 sizes its conversion buffer by the file type and
// trusts those fields when it shifts bits: a damaged file's type would make it allocate
// gigabytes or read out of bounds. Lock held.
bool SaneNumberType(hid_t type);

// An HDF5 handle closed on destruction. Only create and destroy under H5Lock.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now and reports a failure (for files, where close writes metadata).
  herr_t close() {
    herr_t rc = id_ >= 0 && close_ ? close_(id_) : 0;
    id_ = -1;
    return rc;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// The registry row's hooks (reader.cc, writer.cc).
Result<std::unique_ptr<Dataset>> OpenHdf5(const std::string& path, const OpenOptions& opts);
Result<std::unique_ptr<SampleWriter>> CreateHdf5(const std::string& path, const WriteOptions& opts);

}  // namespace shardkit::formats::hdf5
