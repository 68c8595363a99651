// libFuzzer target: the DALI index parser of the wds reader. A fixed, valid
// shard sits beside an index made of the fuzzer's bytes; the reader must either
// trust the index (only when it matches the shard) or fall back to a scan, and
// in both cases give the shard's real samples; or, when a wrong index passed the
// lazy open's spot check, fail the shard's first read as corrupt.
#include "common.h"

namespace {

const std::string& Shard() {
  static const std::string path = [] {
    std::string pat = fuzz::Scratch() + "/s-%06d.tar";
    shardkit::WriteOptions o;
    o.samples_per_shard = 100;
    o.overwrite = true;
    auto w = shardkit::Create("wds:" + pat, o);
    if (!w.ok()) abort();
    for (int i = 0; i < 5; ++i) {
      shardkit::Sample s;
      s.key = "k/" + std::to_string(i);
      s.set("bin", shardkit::Bytes::Take(std::string(size_t(100 * i + 1), char('a' + i))));
      if (i % 2) s.set_label(i);
      if (!(*w)->Write(s).ok()) abort();
    }
    if (!(*w)->Finish().ok()) abort();
    return fuzz::Scratch() + "/s-000000.tar";
  }();
  return path;
}

uint64_t Expected() {
  static const uint64_t sum = [] {
    auto ds = shardkit::Open("wds:" + Shard());
    auto ra = (*ds)->NewRandomAccess();
    uint64_t h = 0;
    shardkit::Sample s;
    for (uint64_t i = 0; i < (*ra)->size(); ++i) {
      if (!(*ra)->Get(i, &s).ok()) abort();
      h = h * 31 + s.checksum();
    }
    return h;
  }();
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& shard = Shard();
  uint64_t want = Expected();
  fuzz::WriteBytes(fuzz::Scratch() + "/s-000000.idx", data, size);
  auto ds = shardkit::Open("wds:" + shard);
  if (!ds.ok()) abort();  // the shard is valid: a bad index must not make it unreadable
  auto ra = (*ds)->NewRandomAccess();
  if (!ra.ok()) abort();
  shardkit::Sample s;
  if ((*ra)->size() != 5) {
    // A .idx that passed the open's spot check (first and last member, end of archive:
    // the lazy open trusts it, issue 15) but lists other samples: the shard's first read
    // checks every header, finds the disagreement and fails the shard, never a sample
    // returned from a wrong index nor one silently dropped.
    shardkit::Status st = (*ra)->Get(0, &s);
    if (st.ok() || st.code() != shardkit::Code::kCorrupt) abort();
    return 0;
  }
  uint64_t h = 0;
  for (uint64_t i = 0; i < (*ra)->size(); ++i) {
    if (!(*ra)->Get(i, &s).ok()) abort();
    h = h * 31 + s.checksum();
  }
  if (h != want) abort();  // an index was trusted that does not describe the shard
  return 0;
}
