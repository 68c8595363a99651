// libFuzzer target: the dataset descriptions that name files (issue 37's confinement),
// and the rule every answer must keep. The first byte picks what the rest is:
//   0: a tar-shard manifest (train.manifest.json) in a scratch dataset directory
//   1: a TFRecord manifest (train.tfrecord.json)
//   2: one entry, resolved against a local, an http:// and an s3:// description
// Bit 0x80 of the first byte trusts the description (--trust-manifest).
// Errors are fine. A path that an untrusted description resolves outside its own
// directory or prefix aborts (a finding), as do crashes, hangs and sanitizer reports.
#include <string>

#include "common.h"
#include "core/paths.h"
#include "formats/tfrecord/tfrecord.h"
#include "formats/wds/manifest.h"

using namespace shardkit;

namespace {

bool Inside(const std::string& path, const std::string& dir) {
  if (path.compare(0, dir.size() + 1, dir + "/") != 0) return false;
  const std::string rest = "/" + path.substr(dir.size() + 1) + "/";
  return rest.find("/../") == std::string::npos && rest.find("/./") == std::string::npos &&
         rest.find("//") == std::string::npos;
}

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "confinement broken: %s\n", what.c_str());
    abort();
  }
}

const std::string& DatasetDir() {
  static const std::string* d = [] {
    auto* s = new std::string(fuzz::Scratch() + "/ds");
    std::filesystem::create_directories(*s + "/sub");
    // A link out of the directory and one inside it: entries may name either.
    std::error_code ec;
    std::filesystem::create_symlink("/etc/hostname", *s + "/out.tar", ec);
    std::filesystem::create_symlink(*s + "/sub", *s + "/in", ec);
    return s;
  }();
  return *d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = (data[0] & 0x7f) % 3;
  const bool trust = (data[0] & 0x80) != 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string& dir = DatasetDir();
  if (mode == 0) {
    const std::string path = dir + "/train.manifest.json";
    fuzz::WriteBytes(path, data + 1, size - 1);
    std::string unreadable;
    auto m = formats::wds::ReadManifest(path, &unreadable, trust);
    if (m.ok() && !trust)
      for (const auto& s : m->shards) Expect(Inside(s.path, dir), "wds manifest -> " + s.path);
  } else if (mode == 1) {
    const std::string path = dir + "/train.tfrecord.json";
    fuzz::WriteBytes(path, data + 1, size - 1);
    OpenOptions o;
    o.trust_manifest = trust;
    auto l = formats::tfrecord::ListShards(path, o);
    if (l.ok() && !trust)
      for (const auto& s : l->shards) Expect(Inside(s.path, dir), "tfrecord manifest -> " + s.path);
  } else {
    const struct {
      std::string description, dir;
    } places[] = {{dir + "/train.manifest.json", dir},
                  {"http://127.0.0.1:8000/data/v1/train.manifest.json", "http://127.0.0.1:8000/data/v1"},
                  {"s3://bucket/pre/fix/train.manifest.json", "s3://bucket/pre/fix"}};
    for (const auto& p : places) {
      auto r = paths::Confinement(p.description, trust).Resolve(text, "shards[0].path");
      if (r.ok() && !trust) Expect(Inside(*r, p.dir), p.description + " + '" + text + "' -> " + *r);
      if (r.ok()) Expect(r->rfind("pipe:", 0) != 0, "a command: " + *r);
    }
  }
  return 0;
}
