// Decoded-image datasets of third-party HDF5 files (see arrays.h).
#include "formats/hdf5/arrays.h"

#include <cstring>

#include <fmt/format.h>

namespace shardkit::formats::hdf5 {

bool SaneNumberType(hid_t type) {
  if (type < 0) return false;
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type), precision = H5Tget_precision(type);
  const int offset = H5Tget_offset(type);
  if (cls == H5T_INTEGER) {
    if (size < 1 || size > 8) return false;
  } else if (cls == H5T_FLOAT) {
    if (size != 4 && size != 8) return false;
  } else {
    return false;
  }
  const size_t bits = size * 8;
  if (precision < 1 || offset < 0 || size_t(offset) + precision > bits) return false;
  if (cls == H5T_FLOAT) {
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
    if (spos >= precision || esize == 0 || msize == 0 || epos + esize > precision || mpos + msize > precision)
      return false;
  }
  return true;
}

std::optional<pickle::DType> NumpyType(hid_t type) {
  if (!SaneNumberType(type)) return std::nullopt;
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  pickle::DType dt;
  dt.itemsize = uint32_t(size);
  dt.order = size == 1 ? '|' : '<';
  if (cls == H5T_INTEGER) {
    if (size != 1 && size != 2 && size != 4 && size != 8) return std::nullopt;
    dt.kind = H5Tget_sign(type) == H5T_SGN_2 ? 'i' : 'u';
  } else if (cls == H5T_FLOAT) {
    if (size != 4 && size != 8) return std::nullopt;
    dt.kind = 'f';
  } else {
    return std::nullopt;
  }
  return dt;
}

hid_t MemType(const pickle::DType& dt) {
  switch (dt.kind) {
    case 'f': return dt.itemsize == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
    case 'i':
      return dt.itemsize == 1 ? H5T_NATIVE_INT8 : dt.itemsize == 2 ? H5T_NATIVE_INT16 : dt.itemsize == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64;
    default:
      return dt.itemsize == 1 ? H5T_NATIVE_UINT8 : dt.itemsize == 2 ? H5T_NATIVE_UINT16 : dt.itemsize == 4 ? H5T_NATIVE_UINT32 : H5T_NATIVE_UINT64;
  }
}

std::optional<uint64_t> ElementBytes(const pickle::DType& dt, const std::vector<uint64_t>& dims) {
  uint64_t bytes = dt.itemsize;
  for (size_t k = 1; k < dims.size(); ++k)
    if (__builtin_mul_overflow(bytes, dims[k], &bytes) || bytes > kMaxElementBytes) return std::nullopt;
  return bytes;
}

pickle::NdArray ElementArray(Bytes raw, const pickle::DType& dt, const std::vector<uint64_t>& dims, bool nchw) {
  pickle::NdArray a;
  a.dtype = dt;
  a.shape.assign(dims.begin() + 1, dims.end());
  if (nchw && a.shape.size() == 3) {
    // [C, H, W] -> [H, W, C]
    uint64_t c = a.shape[0], h = a.shape[1], w = a.shape[2], s = dt.itemsize;
    std::vector<uint8_t> t(raw.size());
    const uint8_t* src = raw.data();
    for (uint64_t ci = 0; ci < c; ++ci)
      for (uint64_t p = 0; p < h * w; ++p) std::memcpy(&t[(p * c + ci) * s], &src[(ci * h * w + p) * s], size_t(s));
    a.shape = {h, w, c};
    a.data = Bytes::Take(std::move(t));
    return a;
  }
  a.data = std::move(raw);
  return a;
}

Result<pickle::NdArray> ReadElement(hid_t dset, const pickle::DType& dt, const std::vector<uint64_t>& dims, uint64_t i,
                                    bool nchw, const std::string& name, const std::string& path) {
  Location at{.file = path, .index = int64_t(i)};
  if (dims.size() < 2 || dims.size() > 8 || i >= dims[0])
    return Status::Internal(fmt::format("dataset '{}': bad element read", name), at);
  const std::optional<uint64_t> bytes = ElementBytes(dt, dims);
  if (!bytes)
    return Status::Unsupported(fmt::format("dataset '{}': an element of more than {} bytes", name, kMaxElementBytes), at);
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = i;
  count[0] = 1;
  hid_t fspace = H5Dget_space(dset);
  if (fspace < 0) return Status::Corrupt(fmt::format("dataset '{}': no dataspace", name), at);
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  hid_t mspace = H5Screate_simple(int(count.size()), count.data(), nullptr);
  std::vector<uint8_t> buf(static_cast<size_t>(*bytes));
  herr_t rc = H5Dread(dset, MemType(dt), mspace, fspace, H5P_DEFAULT, buf.data());
  H5Sclose(mspace);
  H5Sclose(fspace);
  if (rc < 0) return Status::Corrupt(fmt::format("dataset '{}': cannot read element {}", name, i), at);
  return ElementArray(Bytes::Take(std::move(buf)), dt, dims, nchw);
}

}  // namespace shardkit::formats::hdf5
