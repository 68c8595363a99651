// libFuzzer target: an LMDB environment whose data.mdb is arbitrary bytes (a
// bit-flipped, truncated or crafted file). shardkit checks the meta pages and
// walks the B-tree itself before LMDB reads it; nothing may crash.
#include "common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = fuzz::Scratch() + "/env.lmdb";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::WriteBytes(dir + "/data.mdb", data, size);
  ::unlink((dir + "/lock.mdb").c_str());
  auto ds = shardkit::Open("lmdb:" + dir);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
