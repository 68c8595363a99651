// libFuzzer target: opening and reading an HDF5 file made of arbitrary bytes
// (the hdf5 format's layout checks, field mapping and element bounds, and the
// HDF5 library underneath). The input is written to a scratch file first.
#include "common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::Scratch() + "/x.h5";
  fuzz::WriteBytes(path, data, size);
  auto ds = shardkit::Open("hdf5:" + path);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
