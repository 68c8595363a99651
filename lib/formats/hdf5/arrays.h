// Internal: decoded-image datasets of third-party HDF5 files (h5py and Keras
// style): a numeric dataset [N, H, W, C] (or [N, H, W], or [N, C, H, W] said by
// OpenOptions::format_options["hdf5.order"] = "nchw"), chunked or contiguous,
// whose element i is one decoded image. Each element becomes an "npy" field
// (core/pickle.h's NdArray), in [H, W, C] order. Callers hold the HDF5 lock.
#pragma once

#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

#include "core/pickle.h"
#include "shardkit/status.h"

namespace shardkit::formats::hdf5 {

// The numpy dtype of an HDF5 integer or float type of at most 8 bytes, as read
// into memory (native, little-endian), or nullopt.
std::optional<pickle::DType> NumpyType(hid_t type);

// Largest element (one image) read: 256 MiB.
constexpr uint64_t kMaxElementBytes = uint64_t(1) << 28;

// The HDF5 memory type an element of `dt` is read as (native byte order).
hid_t MemType(const pickle::DType& dt);

// Bytes of one element of a dataset of `dims` (dims[0] = N), or nullopt when it
// holds more than kMaxElementBytes.
std::optional<uint64_t> ElementBytes(const pickle::DType& dt, const std::vector<uint64_t>& dims);

// The array of one element's bytes as stored ([dims[1..]]); nchw: transposed to
// [H, W, C] (a copy), else `raw` is kept as it is (a view stays a view).
pickle::NdArray ElementArray(Bytes raw, const pickle::DType& dt, const std::vector<uint64_t>& dims, bool nchw);

// Element i of `dset` (dims: the dataset's full dimensions, dims[0] = N) as an
// array of dims[1..] (nchw: a [C, H, W] element is transposed to [H, W, C]).
Result<pickle::NdArray> ReadElement(hid_t dset, const pickle::DType& dt, const std::vector<uint64_t>& dims,
                                    uint64_t i, bool nchw, const std::string& name, const std::string& path);

}  // namespace shardkit::formats::hdf5
