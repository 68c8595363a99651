// formats/hdf5/h5.cc: the lock around the HDF5 library and its error messages (internal.h).
#include "formats/hdf5/internal.h"

namespace shardkit::formats::hdf5 {

namespace {

herr_t InnermostError(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && e && e->desc) *out = e->desc;
  return 0;
}

}  // namespace

std::mutex& H5Mutex() {
  static std::mutex m;
  return m;
}

std::string H5Message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, InnermostError, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 library error" : "HDF5: " + msg;
}

}  // namespace shardkit::formats::hdf5
