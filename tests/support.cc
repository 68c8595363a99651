#include "support.h"

#include <png.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "shardkit/convert.h"

namespace fs = std::filesystem;

namespace sk_test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sktest-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Make everything writable again first (tests make read-only files and dirs).
  for (auto it = fs::recursive_directory_iterator(path_, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  }
  fs::remove_all(path_, ec);
}

std::vector<uint8_t> Pattern(int w, int h, int ch, uint32_t seed) {
  std::vector<uint8_t> px(size_t(w) * h * ch);
  uint32_t s = seed * 2654435761u + 12345;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < ch; ++c) {
        s = s * 1664525u + 1013904223u;
        int v = ((x * (c + 1) * 3 + y * (3 - c) * 2 + int(seed) * 17) & 255) + int((s >> 28) & 7);
        px[(size_t(y) * w + x) * ch + c] = uint8_t(v > 255 ? 255 : v);
      }
  return px;
}

std::string MakeJpeg(int w, int h, uint32_t seed, JpegKind kind, int quality) {
  tjhandle tj = tjInitCompress();
  int pf = TJPF_RGB, ch = 3, samp = TJSAMP_420, flags = 0;
  switch (kind) {
    case JpegKind::kBaseline420: break;
    case JpegKind::kBaseline444: samp = TJSAMP_444; break;
    case JpegKind::kGray: pf = TJPF_GRAY; ch = 1; samp = TJSAMP_GRAY; break;
    case JpegKind::kProgressive: flags |= TJFLAG_PROGRESSIVE; break;
    case JpegKind::kCmyk: pf = TJPF_CMYK; ch = 4; samp = TJSAMP_444; break;
  }
  auto px = Pattern(w, h, ch, seed);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj, px.data(), w, 0, h, pf, &out, &size, samp, quality, flags) != 0) {
    std::string e = tjGetErrorStr2(tj);
    tjDestroy(tj);
    throw std::runtime_error("tjCompress2: " + e);
  }
  std::string r(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return r;
}

std::string MakePng(int w, int h, uint32_t seed) {
  auto px = Pattern(w, h, 3, seed);
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = unsigned(w);
  img.height = unsigned(h);
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr))
    throw std::runtime_error("png size");
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr))
    throw std::runtime_error("png write");
  out.resize(size);
  return out;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> MakeMixtureParts(const TempDir& dir, const std::vector<std::pair<int, int>>& sizes) {
  const std::vector<std::pair<std::string, std::string>> parts = {
      {"a", "wds:" + dir / "a.wds/t-%06d.tar"}, {"b", "lmdb:" + dir / "b.lmdb"}, {"c", "mds:" + dir / "c.mds"}};
  std::vector<std::string> out;
  for (size_t i = 0; i < parts.size() && i < sizes.size(); ++i) {
    const auto& [name, address] = parts[i];
    const int want = sizes[i].first * sizes[i].second;
    if (MakeImageFolder(dir / name, sizes[i].first, sizes[i].second, uint32_t(i + 1)) != want)
      throw std::runtime_error("MakeMixtureParts: image folder " + name);
    auto r = shardkit::Convert(dir / name, address);
    if (!r.ok()) throw std::runtime_error("MakeMixtureParts: " + r.status().ToString());
    out.push_back(i == 0 ? dir / "a.wds/t.manifest.json" : address);
  }
  return out;
}

int MakeImageFolder(const std::string& root, int classes, int per_class, uint32_t seed) {
  int n = 0;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class; ++i, ++n)
      WriteFile(fmt::format("{}/c{}/img{}.JPEG", root, c, n),
                MakeJpeg(32 + (n % 5) * 8, 24 + (n % 3) * 8, seed * 1000 + uint32_t(n)));
  return n;
}

std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

RunResult Run(const std::string& cmdline) {
  TempDir tmp;
  std::string outp = tmp / "out", errp = tmp / "err";
  std::string full = fmt::format("( {} ) >{} 2>{} </dev/null", cmdline, Q(outp), Q(errp));
  int rc = std::system(full.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  r.out = ReadFile(outp);
  r.err = ReadFile(errp);
  return r;
}

RunResult Cli(const std::string& args) { return Run(fmt::format("{} {}", Q(SHARDKIT_CLI), args)); }

}  // namespace sk_test
