// libFuzzer target: the strict tar member scanner (lib/formats/tar/tar.h) over
// arbitrary bytes, then the same bytes as a one-shard WebDataset (member
// classification, sample grouping, random access).
#include "common.h"
#include "formats/tar/tar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardkit::tar::Scanner scan(data, size, "fuzz.tar");
  shardkit::tar::Member m;
  for (int i = 0; i < 100000; ++i) {
    auto r = scan.Next(&m);
    if (!r.ok() || !*r) break;
    if (m.data_offset > size || m.size > size - m.data_offset) abort();  // a member outside the bytes
  }
  static const std::string path = fuzz::Scratch() + "/x-000000.tar";
  fuzz::WriteBytes(path, data, size);
  auto ds = shardkit::Open("wds:" + path);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
