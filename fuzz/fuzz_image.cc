// libFuzzer target: WebP, AVIF and JPEG XL through the image decoder (lib/decode/codecs.h):
// the codec chosen by the magic bytes, the declared size checked against small Limits
// before any pixel allocation, the whole image decoded to RGB; AVIF's box walk for the
// declared size (AvifDeclaredSize) on every input. The seeds (fuzz/corpus/image) are
// 16x16 images made by cwebp, avifenc and cjxl.
#include "common.h"
#include "decode/codecs.h"
#include "decode/jpeg.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardkit::decode::ImageDecoder* dec = [] {
    shardkit::decode::Limits l;
    l.max_side = 4096;
    l.max_pixels = 4'000'000;
    return new shardkit::decode::ImageDecoder(l);
  }();
  uint32_t w = 0, h = 0;
  (void)shardkit::decode::AvifDeclaredSize(data, size, &w, &h);
  shardkit::decode::Region region;
  shardkit::decode::ImageInfo info;
  shardkit::Status st = dec->DecodeAll(data, size, &region, &info);
  if (st.ok()) {
    if (!region.pixels || region.width <= 0 || region.height <= 0) abort();
    if (uint64_t(region.width) * uint64_t(region.height) > 4'000'000) abort();
    volatile uint8_t sink = 0;
    for (int y = 0; y < region.height; y += 5)
      sink = sink + region.pixels[size_t(y) * region.stride + size_t(region.width - 1) * 3];
  }
  return 0;
}
