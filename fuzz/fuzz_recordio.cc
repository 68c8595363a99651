// libFuzzer target: MXNet RecordIO (lib/formats/recordio/). The input is split
// at its first "\n--idx--\n" (when present) into a .rec and its .idx; the
// framing reader walks the .rec from memory (every payload it vouches for lies
// in the input or its own buffer), then the pair is opened as a dataset and
// read in order and through the .idx, and `shardkit index` rescans it.
#include <cstring>
#include <string_view>

#include "common.h"
#include "formats/recordio/framing.h"
#include "shardkit/index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace rio = shardkit::formats::recordio;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view rec = in, idx;
  bool has_idx = false;
  if (auto cut = in.find("\n--idx--\n"); cut != std::string_view::npos) {
    rec = in.substr(0, cut);
    idx = in.substr(cut + 9);
    has_idx = true;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(rec.data());
  std::string scratch;
  uint64_t off = 0;
  volatile uint8_t sink = 0;
  for (int i = 0; i < 100000 && off < rec.size(); ++i) {
    rio::Record r;
    if (!rio::ReadRecord(p, rec.size(), off, "fuzz.rec", &scratch, &r).ok()) break;
    if (r.next <= off || r.next > rec.size()) abort();  // no progress, or past the end
    for (size_t k = 0; k < r.payload.size(); k += 61) sink = sink + uint8_t(r.payload[k]);
    rio::ImageRecord ir;
    (void)rio::ParseImageRecord(r.payload, shardkit::Location{}, &ir);
    // What the writer frames reads back as the same payload.
    std::string framed, again;
    if (rio::AppendRecord(r.payload, &framed).ok()) {
      rio::Record back;
      if (!rio::ReadRecord(reinterpret_cast<const uint8_t*>(framed.data()), framed.size(), 0, "x", &again, &back)
               .ok() ||
          back.payload != r.payload || back.next != framed.size())
        abort();
    }
    off = r.next;
  }
  (void)rio::ParseIdx(idx, "fuzz.idx");

  static const std::string dir = fuzz::Scratch();
  const std::string rec_path = dir + "/x.rec", idx_path = dir + "/x.idx";
  fuzz::WriteBytes(rec_path, p, rec.size());
  if (has_idx) fuzz::WriteBytes(idx_path, reinterpret_cast<const uint8_t*>(idx.data()), idx.size());
  else ::unlink(idx_path.c_str());
  if (auto ds = shardkit::Open("recordio:" + rec_path); ds.ok()) fuzz::Drain(**ds);
  if (!has_idx) (void)shardkit::WriteFormatIndex("recordio:" + rec_path);
  return 0;
}
