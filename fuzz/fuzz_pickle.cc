// libFuzzer target: the strict pickle subset reader (lib/core/pickle.*) and the
// .npy parser. Any input must give a value or a Status: no crash, no leak, no
// hang; a value's arrays must hold exactly their shape's bytes, and an array
// written back as .npy must parse to the same array.
#include <cstring>

#include "core/pickle.h"

using namespace shardkit;

namespace {

void Check(const pickle::Value& v) {
  using K = pickle::Value::Kind;
  if (v.kind == K::kArray) {
    const auto& a = v.array;
    uint64_t n = a.dtype.itemsize;
    for (uint64_t d : a.shape) n *= d;
    if (n != a.data.size()) abort();
    Bytes npy = pickle::ToNpy(a);
    auto back = pickle::ParseNpy(npy);
    if (!back.ok() || back->shape != a.shape || !(back->data == a.data) || back->dtype.descr() != a.dtype.descr()) abort();
  }
  for (const auto& x : v.items) Check(x);
  for (const auto& [k, x] : v.dict) {
    Check(k);
    Check(x);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exact-size buffer so that ASan sees any read past the end.
  Bytes in = Bytes::Copy(data, size);
  auto v = pickle::ParsePickle(in);
  if (v.ok()) Check(*v);
  auto npy = pickle::ParseNpy(in);
  if (npy.ok() && npy->data.size() > size) abort();
  return 0;
}
