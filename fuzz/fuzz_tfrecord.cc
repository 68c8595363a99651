// libFuzzer target: the tfrecord reader. The first byte picks what the rest is:
//  even: a whole file as it is (framing, CRCs, GZIP/ZLIB detection and inflating);
//  odd:  the payload of records that are framed here with valid CRCs, so that the
//        fuzzer reaches the tf.train.Example parser and the feature mapping (the
//        rest is split at each 0xFF 0x00 pair into several records).
// Errors are fine; crashes, hangs and sanitizer reports are not.
#include <string>

#include "common.h"
#include "formats/tfrecord/frames.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string path = fuzz::Scratch() + "/f.tfrecord";
  std::string file;
  if (data[0] % 2 == 0) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    for (;;) {
      size_t cut = rest.find(std::string_view("\xff\x00", 2));
      shardkit::formats::tfrecord::AppendFrame(&file, rest.substr(0, cut));
      if (cut == std::string_view::npos) break;
      rest.remove_prefix(cut + 2);
    }
  }
  fuzz::WriteBytes(path, reinterpret_cast<const uint8_t*>(file.data()), file.size());
  auto ds = shardkit::Open("tfrecord:" + path);
  if (ds.ok()) fuzz::Drain(**ds);
  return 0;
}
