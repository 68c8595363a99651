// Shared test fixtures: temporary directories, generated images, running the CLI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sk_test {

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

enum class JpegKind { kBaseline420, kBaseline444, kGray, kProgressive, kCmyk };

// w x h pixels of `ch` channels (interleaved): ramps of each channel's own slope with a
// little noise, deterministic from `seed` (the pixels of MakeJpeg and MakePng).
std::vector<uint8_t> Pattern(int w, int h, int ch, uint32_t seed);
// A JPEG of w x h pixels with a deterministic pattern from `seed`, made with turbojpeg.
std::string MakeJpeg(int w, int h, uint32_t seed, JpegKind kind = JpegKind::kBaseline420, int quality = 90);
// A PNG (RGB) of w x h pixels, made with libpng.
std::string MakePng(int w, int h, uint32_t seed);

void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);

// An ImageFolder-style tree: `classes` subfolders (c0, c1, ...), `per_class`
// JPEGs each named img<N>.JPEG. Returns the number of images.
int MakeImageFolder(const std::string& root, int classes, int per_class, uint32_t seed = 1);

// Three datasets of three formats for a mixture: image folders of classes x per_class
// images (`sizes`, seeds 1, 2, 3) converted to tar shards (a.wds/t-%06d.tar), LMDB (b.lmdb)
// and MDS (c.mds) under `dir`. Their addresses, in that order; throws on a failure.
std::vector<std::string> MakeMixtureParts(const TempDir& dir, const std::vector<std::pair<int, int>>& sizes);

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs a shell command line, capturing stdout and stderr.
RunResult Run(const std::string& cmdline);
// Runs the shardkit CLI with the given (shell-quoted) arguments.
RunResult Cli(const std::string& args);
// Shell-quotes one argument.
std::string Q(const std::string& s);

// FNV-1a over n bytes (continuing from h): a cheap fingerprint of pixels in tests.
inline uint64_t Fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace sk_test
