// libFuzzer target: the mds format's parsers on arbitrary bytes, in memory.
// The first byte picks what the rest is:
//   0: an uncompressed shard (header, offsets, samples) read with a column set
//      the second byte picks (fixed and variable sizes, key, int, float, pil columns)
//   1: a zstd shard, decompressed under a 1 MiB limit, then read as in 0
//   2: index.json text (structure checks and the column -> field mapping)
#include <cstring>

#include "common.h"
#include "formats/mds/mds.h"

using namespace shardkit;
using namespace shardkit::formats::mds;

namespace {

void ReadShard(const uint8_t* p, size_t n, uint8_t pick) {
  ShardMeta m;
  m.path = "fuzz.mds";
  std::vector<Column> cols = {{"__key__", "str"}, {"cls", "int", 8}, {"jpg", "jpeg"}, {"h", "float16", 2},
                              {"u", "uint16", 2}, {"t", "bytes"}, {"x", "pil"}};
  for (size_t i = 0; i < cols.size(); ++i)
    if (pick & (1u << i)) m.columns.push_back(cols[i]);
  if (!MapColumns(&m.columns, Location{}).ok()) return;
  if (n < 4) return;
  uint32_t count;
  std::memcpy(&count, p, 4);
  m.samples = count;
  m.raw.bytes = n;
  ShardData d;
  d.data = p;
  d.size = n;
  d.n = count;
  if (!CheckHeader(d, m).ok()) return;
  Sample s;
  for (uint64_t i = 0; i < m.samples; ++i) (void)DecodeSample(d, m, i, &s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  uint8_t mode = data[0] % 3, pick = data[1];
  const uint8_t* p = data + 2;
  size_t n = size - 2;
  if (mode == 0) {
    ReadShard(p, n, pick);
  } else if (mode == 1) {
    auto raw = Unzstd(p, n, 1 << 20, Location{.file = "fuzz.mds.zstd"});
    if (raw.ok()) ReadShard(reinterpret_cast<const uint8_t*>(raw->data()), raw->size(), pick);
  } else {
    auto idx = ParseIndex(std::string_view(reinterpret_cast<const char*>(p), n), "/nonexistent", "index.json");
    (void)idx;
  }
  return 0;
}
