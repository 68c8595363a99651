// libFuzzer target: the image decoder (lib/decode/jpeg.h): JPEG header parsing
// (SOF precision, dimensions, components, progressive scans) and a cropped,
// DCT-scaled decode; PNG through libpng when the magic says so. A third of the inputs
// also go through convert's transform (decode/transform.h: the EXIF scan, the YCbCr
// plane route or the RGB one, the resize, the JPEG encode). Limits are lowered so that
// the fuzzer's 2 GB memory limit tests the refusals.
#include <algorithm>

#include "common.h"
#include "decode/jpeg.h"
#include "decode/transform.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardkit::decode::ImageDecoder* dec = [] {
    shardkit::decode::Limits l;
    l.max_side = 8192;
    l.max_pixels = 16'000'000;
    l.max_scans = 200;
    l.max_memory = 256ull << 20;
    return new shardkit::decode::ImageDecoder(l);
  }();
  (void)shardkit::decode::Sniff(data, size);
  shardkit::decode::Region region;
  shardkit::decode::ImageInfo info;
  auto choose = [](const shardkit::decode::ImageInfo& i) {
    shardkit::decode::CropBox b;
    b.x = i.width / 4.0;
    b.y = i.height / 4.0;
    b.w = i.width / 2.0;
    b.h = i.height / 2.0;
    return b;
  };
  shardkit::Status st = dec->Decode(data, size, choose, size % 2 ? 16 : 0, size % 2 ? 16 : 0, &region, &info);
  if (st.ok()) {
    if (!region.pixels || region.width <= 0 || region.height <= 0) abort();
    volatile uint8_t sink = 0;
    for (int y = 0; y < region.height; y += 7)
      sink = sink + region.pixels[size_t(y) * region.stride + size_t(region.width - 1) * 3];
  }
  if (size % 3 == 0) {
    static const shardkit::decode::TransformSpec* spec = [] {
      auto t = shardkit::decode::ParseTransform("short:24", "jpeg:80", 16'000'000);
      if (!t.ok() || !*t) abort();
      auto* s = new shardkit::decode::TransformSpec(**t);
      s->limits.max_side = 8192;
      s->limits.max_scans = 200;
      s->limits.max_memory = 256ull << 20;
      return s;
    }();
    int w = 0, h = 0;
    auto out = shardkit::decode::TransformImage(data, size, *spec, &w, &h);
    if (out.ok() && (out->size() == 0 || w <= 0 || h <= 0 || std::min(w, h) > 24)) abort();
  }
  return 0;
}
