// Hostile and broken input, end to end through the shardkit command: every case
// exits 1 (never a crash, a signal or a hang: each run is under `timeout 60`),
// names the culprit (file, member, key) on stderr, and writes nothing outside
// its output (and leaves no output behind). Library-level tests of the same
// inputs live beside each format (wds_test, lmdb_test, hdf5_test, folder_test,
// decode_test); this file covers what they do not: the CLI path, and the image
// decoder cases decode_test leaves out (zero bytes, 12-bit, PNG under a .JPEG
// name, thousands of progressive scans).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <set>

#include "decode/jpeg.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using sk_test::Q;
using sk_test::RunResult;
using sk_test::TempDir;
namespace fs = std::filesystem;

namespace {

const char* kPy = "/usr/bin/python3";

// Every path under root (files, links, directories), relative.
std::set<std::string> Listing(const std::string& root) {
  std::set<std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it)
    out.insert(fs::relative(it->path(), root).string());
  return out;
}

// Runs the CLI under `timeout 60` from inside `cwd`, with LANG=C.
RunResult Cli(const std::string& cwd, const std::string& args) {
  return sk_test::Run(fmt::format("cd {} && LANG=C LC_ALL=C timeout 60 {} {}", Q(cwd), Q(SHARDKIT_CLI), args));
}

void RunPy(const std::string& code) {
  TempDir t;
  sk_test::WriteFile(t / "x.py", code);
  RunResult r = sk_test::Run(fmt::format("{} {}", kPy, Q(t / "x.py")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// `shardkit convert IN OUT` fails as it should: exit 1, no crash, no hang, the
// message names every needle, and the tree under `root` is as before (an empty
// output directory aside).
void ExpectRefused(const std::string& root, const std::string& in, const std::string& out,
                   const std::vector<std::string>& needles) {
  auto before = Listing(root);
  RunResult r = Cli(root, fmt::format("convert {} {}", Q(in), Q(out)));
  INFO("convert " << in << " -> " << out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 1);  // 124: timeout; > 128: a signal
  CHECK_THAT(r.err, Catch::StartsWith("shardkit: error: "));
  for (const auto& n : needles) CHECK_THAT(r.err, Catch::Contains(n));
  auto after = Listing(root);
  for (const auto& p : after)
    if (!before.count(p)) {
      INFO("left behind: " << p);
      CHECK((fs::is_directory(root + "/" + p) && fs::is_empty(root + "/" + p)));
    }
  // `info` on the same input: an answer or an error, never a crash or a hang.
  RunResult i = Cli(root, fmt::format("info {}", Q(in)));
  INFO("info stderr: " << i.err);
  CHECK((i.exit_code == 0 || i.exit_code == 1));
}

// A Python snippet that writes tar members with full control of the headers.
const char* kTarPrelude = R"(
import io, sys, tarfile
def member(name, data=b"", type=tarfile.REGTYPE, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.size = len(data) if type == tarfile.REGTYPE else 0
    ti.type = type
    ti.linkname = linkname
    ti.mtime = 0
    return ti, (io.BytesIO(data) if type == tarfile.REGTYPE else None)
def write(path, members, fmt=tarfile.USTAR_FORMAT):
    with tarfile.open(path, "w", format=fmt) as t:
        for ti, f in members:
            t.addfile(ti, f)
)";

}  // namespace

TEST_CASE("hostile tar shards through the CLI: exit 1 naming shard and member, nothing written", "[hostile]") {
  TempDir t;
  std::string good = t / "good.tar";
  RunPy(std::string(kTarPrelude) + fmt::format(R"(
write("{0}", [member("a.txt", b"A" * 700), member("a.cls", b"1"), member("b.txt", b"B" * 10), member("b.cls", b"0")])
data = open("{0}", "rb").read()
# tarfile pads to 10240 bytes with zeros; the last member's data ends here:
end = (len(data.rstrip(b"\0")) + 511) // 512 * 512
open("{1}/truncated.tar", "wb").write(data[:1000])
open("{1}/no-end.tar", "wb").write(data[:end])
open("{1}/trailing.tar", "wb").write(data[:end + 1024] + b"garbage!" + b"\0" * 504)
write("{1}/dotdot.tar", [member("../evil.txt", b"x")])
write("{1}/absolute.tar", [member("/etc/evil.txt", b"x")])
write("{1}/symlink.tar", [member("a.txt", b"x"), member("b.txt", type=tarfile.SYMTYPE, linkname="/etc/passwd")])
write("{1}/hardlink.tar", [member("a.txt", b"x"), member("b.txt", type=tarfile.LNKTYPE, linkname="a.txt")])
write("{1}/twice.tar", [member("a.txt", b"x"), member("a.txt", b"y")])
write("{1}/noext.tar", [member("README", b"x")])
# A header declaring a member of 9 GiB (GNU base-256 size) in a 2 KiB file.
ti, _ = member("big.bin", b"")
h = bytearray(ti.tobuf(tarfile.GNU_FORMAT))
size = 9 << 30
h[124:136] = bytes([0x80]) + size.to_bytes(11, "big")
h[148:156] = b" " * 8
h[148:156] = ("%06o\0 " % sum(h)).encode()
open("{1}/huge.tar", "wb").write(bytes(h) + b"\0" * 1536)
)",
                                                          good, t.path()));
  struct Case {
    std::string file;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {"truncated.tar", {"truncated.tar"}},
      {"no-end.tar", {"no-end.tar", "end-of-archive"}},
      {"trailing.tar", {"trailing.tar", "trailing garbage"}},
      {"dotdot.tar", {"dotdot.tar", "../evil.txt"}},
      {"absolute.tar", {"absolute.tar", "/etc/evil.txt"}},
      {"symlink.tar", {"symlink.tar", "'b.txt'", "symbolic link"}},
      {"hardlink.tar", {"hardlink.tar", "'b.txt'", "hard link"}},
      {"twice.tar", {"twice.tar", "'txt' appears twice", "'a'"}},
      {"noext.tar", {"noext.tar", "'README'", "no extension"}},
      {"huge.tar", {"huge.tar"}},
  };
  for (const auto& c : cases) {
    SECTION(c.file) {
      fs::create_directories(t / "run");
      fs::copy_file(t / c.file, t / ("run/" + c.file));
      ExpectRefused(t / "run", c.file, "wds:out/y-%06d.tar", c.needles);
      ExpectRefused(t / "run", c.file, "folder:out-folder", c.needles);
    }
  }
  SECTION("random byte damage (1% of bytes, 40 seeds): exit 0 or 1, never a crash or a hang") {
    std::string bytes = sk_test::ReadFile(good);
    uint32_t x = 12345;
    for (int seed = 0; seed < 40; ++seed) {
      std::string bad = bytes;
      for (size_t i = 0; i < bad.size() / 100; ++i) {
        x = x * 1664525u + 1013904223u;
        bad[(x >> 8) % bad.size()] = char(x >> 24);
      }
      std::string dir = t / fmt::format("r{}", seed);
      fs::create_directories(dir);
      sk_test::WriteFile(dir + "/in.tar", bad);
      RunResult r = Cli(dir, "convert in.tar wds:out/y-%06d.tar");
      INFO("seed " << seed << ": " << r.err);
      CHECK((r.exit_code == 0 || r.exit_code == 1));
      if (r.exit_code == 1) CHECK_THAT(r.err, Catch::Contains("in.tar"));
    }
  }
}

TEST_CASE("tar member names over 100 bytes and non-ASCII names are kept exactly under LANG=C", "[hostile]") {
  TempDir t;
  const std::string long_key = std::string(80, 'd') + "/" + std::string(90, 'k');
  const std::string utf8_key = "caf\xc3\xa9/\xe5\x9b\xbe\xe7\x89\x87";
  RunPy(std::string(kTarPrelude) + fmt::format(R"(
write("{0}/names.tar", [member("{1}.txt", b"L"), member("{2}.txt", b"U")], fmt=tarfile.PAX_FORMAT)
)",
                                                          t.path(), long_key, "caf\\u00e9/\\u56fe\\u7247"));
  RunResult r = Cli(t.path(), "convert names.tar wds:out/y-%06d.tar");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto ds = Open(t / "out/y.manifest.json");
  REQUIRE(ds.ok());
  auto rd = (*ds)->NewReader();
  REQUIRE(rd.ok());
  std::vector<std::string> keys;
  Sample s;
  while (*(*rd)->Next(&s)) keys.push_back(s.key);
  CHECK(keys == std::vector<std::string>{long_key, utf8_key});
}

TEST_CASE("hostile LMDB through the CLI: bit-flipped and truncated data.mdb, a value that is not a record", "[hostile]") {
  TempDir t;
  std::vector<Sample> samples;
  for (int i = 0; i < 40; ++i) {
    Sample s;
    s.key = fmt::format("c/{:03d}", i);
    s.set("jpg", Bytes::Take(sk_test::MakeJpeg(32, 24, uint32_t(i))));
    s.set_label(i % 2);
    samples.push_back(std::move(s));
  }
  {
    auto w = Create("lmdb:" + (t / "good.lmdb"));
    REQUIRE(w.ok());
    for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
    REQUIRE((*w)->Finish().ok());
  }
  std::string data = sk_test::ReadFile(t / "good.lmdb/data.mdb");
  REQUIRE(data.size() > 3 * 4096);
  auto variant = [&](const std::string& name, const std::string& bytes) {
    fs::create_directories(t / ("run/" + name));
    fs::copy_file(t / "good.lmdb/shardkit.json", t / ("run/" + name + "/shardkit.json"));
    sk_test::WriteFile(t / ("run/" + name + "/data.mdb"), bytes);
  };
  SECTION("truncated data.mdb") {
    variant("trunc.lmdb", data.substr(0, data.size() / 2));
    ExpectRefused(t / "run", "trunc.lmdb", "wds:out/y-%06d.tar", {"trunc.lmdb"});
  }
  SECTION("bit flips in every page after the meta pages") {
    // One bit per run, in a page header, a node header or a value: every
    // outcome must be an error naming the environment, never a crash.
    int refused = 0;
    for (size_t off = 2 * 4096 + 11; off < data.size(); off += 1531) {
      std::string bad = data;
      bad[off] ^= 0x10;
      std::string name = fmt::format("flip{}.lmdb", off);
      variant(name, bad);
      auto before = Listing(t / "run");
      RunResult r = Cli(t / "run", fmt::format("convert {} wds:out{}/y-%06d.tar", name, off));
      INFO("bit flip at " << off << ": " << r.err);
      CHECK((r.exit_code == 0 || r.exit_code == 1));
      if (r.exit_code == 1) {
        ++refused;
        CHECK_THAT(r.err, Catch::Contains(name));
      }
    }
    CHECK(refused > 0);
  }
  SECTION("a value that is not a record") {
    fs::create_directories(t / "run");
    fs::copy(t / "good.lmdb", t / "run/junk.lmdb");
    RunPy(fmt::format(R"(
import lmdb
env = lmdb.open("{0}/run/junk.lmdb", map_size=1 << 26)
with env.begin(write=True) as t:
    t.put(b"0000000007", b"\x93not a msgpack map")
)",
                      t.path()));
    ExpectRefused(t / "run", "junk.lmdb", "wds:out/y-%06d.tar", {"junk.lmdb", "0000000007", "not a shardkit record"});
  }
}

TEST_CASE("hostile HDF5 through the CLI: truncated file, external link", "[hostile]") {
  TempDir t;
  fs::create_directories(t / "run");
  RunPy(fmt::format(R"(
import h5py, numpy as np
with h5py.File("{0}/run/good.h5", "w") as f:
    f.create_dataset("images", data=np.zeros((20, 16, 16, 3), dtype=np.uint8))
    f.create_dataset("labels", data=np.arange(20, dtype=np.int64))
data = open("{0}/run/good.h5", "rb").read()
open("{0}/run/trunc.h5", "wb").write(data[: len(data) // 2])
with h5py.File("{0}/other.h5", "w") as f:
    f.create_dataset("images", data=np.zeros((2, 4, 4, 3), dtype=np.uint8))
with h5py.File("{0}/run/extlink.h5", "w") as f:
    f["images"] = h5py.ExternalLink("{0}/other.h5", "images")
    f.create_dataset("labels", data=np.arange(2, dtype=np.int64))
)",
                    t.path()));
  SECTION("truncated") { ExpectRefused(t / "run", "trunc.h5", "wds:out/y-%06d.tar", {"trunc.h5"}); }
  SECTION("external link") {
    ExpectRefused(t / "run", "extlink.h5", "wds:out/y-%06d.tar", {"extlink.h5", "external link"});
  }
}

TEST_CASE("hostile image folders through the CLI", "[hostile]") {
  TempDir t;
  std::string root = t / "run";
  SECTION("a.JPG beside a.jpg names both") {
    fs::create_directories(root + "/in/c");
    sk_test::WriteFile(root + "/in/c/a.jpg", sk_test::MakeJpeg(8, 8, 1));
    sk_test::WriteFile(root + "/in/c/a.JPG", sk_test::MakeJpeg(8, 8, 2));
    ExpectRefused(root, "folder:in", "wds:out/y-%06d.tar", {"a.jpg", "a.JPG"});
  }
  SECTION("a dangling symlink and a FIFO are errors naming the file, in bounded time") {
    fs::create_directories(root + "/in/c");
    sk_test::WriteFile(root + "/in/c/ok.jpg", "1");
    fs::create_symlink(root + "/nowhere.jpg", root + "/in/c/dangling.jpg");
    ExpectRefused(root, "folder:in", "wds:out/y-%06d.tar", {"dangling.jpg"});
    fs::remove(root + "/in/c/dangling.jpg");
    REQUIRE(::mkfifo((root + "/in/c/pipe.jpg").c_str(), 0644) == 0);
    auto t0 = std::chrono::steady_clock::now();
    ExpectRefused(root, "folder:in", "wds:out/y-%06d.tar", {"pipe.jpg"});
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  }
  SECTION("a symlink loop does not hang") {
    fs::create_directories(root + "/in/c");
    sk_test::WriteFile(root + "/in/c/ok.jpg", "1");
    fs::create_directory_symlink("..", root + "/in/c/loop");
    RunResult r = Cli(root, "convert folder:in wds:out/y-%06d.tar");
    INFO(r.err);
    CHECK((r.exit_code == 0 || r.exit_code == 1));
    if (r.exit_code == 1) CHECK_THAT(r.err, Catch::Contains("loop"));
  }
  SECTION("non-UTF-8 file names round-trip byte-exact through tar shards") {
    const std::string name = "na\xefve-\xff.jpg";  // Latin-1 bytes: not UTF-8
    fs::create_directories(root + "/in/c");
    std::string jpg = sk_test::MakeJpeg(8, 8, 3);
    sk_test::WriteFile(root + "/in/c/" + name, jpg);
    RunResult r = Cli(root, "convert folder:in wds:out/y-%06d.tar");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    r = Cli(root, "convert out/y.manifest.json folder:back");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(sk_test::ReadFile(root + "/back/c/" + name) == jpg);
  }
}

namespace {

Status Decode(const std::string& bytes, decode::Limits lim = {}) {
  decode::ImageDecoder dec(lim);
  decode::Region r;
  return dec.Decode(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
      [](const decode::ImageInfo& i) { return decode::CropBox{0, 0, double(i.width), double(i.height)}; }, 0, 0,
      &r);
}

}  // namespace

TEST_CASE("hostile images for the decoder: zero bytes, 12-bit, PNG named .JPEG, thousands of scans", "[hostile]") {
  std::string jpg = sk_test::MakeJpeg(64, 48, 5);
  SECTION("zero-byte file") {
    Status st = Decode("");
    CHECK(st.code() == Code::kCorrupt);
    CHECK_FALSE(st.message().empty());
  }
  SECTION("12-bit JPEG (SOF precision 12): refused with the reason, not exit()") {
    // turbojpeg cannot encode 12-bit; the SOF0 precision byte is set to 12 instead.
    std::string b = jpg;
    size_t sof = b.find("\xFF\xC0", 2);
    REQUIRE(sof != std::string::npos);
    b[sof + 4] = 12;
    Status st = Decode(b);
    INFO(st.ToString());
    CHECK(st.code() == Code::kCorrupt);
    CHECK_THAT(st.message(), Catch::Contains("precision 12"));
  }
  SECTION("a PNG under a .JPEG name decodes by its magic bytes; a text file named .jpg is refused") {
    CHECK(Decode(sk_test::MakePng(20, 10, 1)).ok());
    Status st = Decode("this is not an image\n");
    CHECK(st.code() == Code::kCorrupt);
    CHECK_THAT(st.message(), Catch::Contains("not a JPEG, PNG, WebP, AVIF or JPEG XL"));
  }
  SECTION("thousands of progressive scans: refused in bounded time") {
    std::string prog = sk_test::MakeJpeg(64, 64, 1, sk_test::JpegKind::kProgressive);
    // Repeat the last scan (SOS marker to EOI) 5000 times.
    size_t sos = prog.rfind("\xFF\xDA");
    size_t eoi = prog.rfind("\xFF\xD9");
    REQUIRE(sos != std::string::npos);
    REQUIRE(eoi > sos);
    std::string scan = prog.substr(sos, eoi - sos);
    std::string many = prog.substr(0, eoi);
    for (int i = 0; i < 5000; ++i) many += scan;
    many += "\xFF\xD9";
    auto t0 = std::chrono::steady_clock::now();
    Status st = Decode(many);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(st.ToString());
    CHECK(st.code() == Code::kCorrupt);
    // Either the scan limit or libjpeg's progression check (a warning the decoder
    // takes as an error) stops it.
    CHECK_THAT(st.message(), Catch::Contains("scans") || Catch::Contains("progression"));
    CHECK(secs < 5.0);
  }
  SECTION("PNG named .JPEG is an image; a zero-byte .jpg fails convert, or passes byte-exact with folder.files=all") {
    TempDir t;
    std::string png = sk_test::MakePng(20, 10, 2);
    fs::create_directories(t / "run/in/c");
    sk_test::WriteFile(t / "run/in/c/p.JPEG", png);
    sk_test::WriteFile(t / "run/in/c/z.jpg", "");
    RunResult bad = Cli(t / "run", "convert folder:in wds:bad/y-%06d.tar");
    CHECK(bad.exit_code == 1);
    CHECK_THAT(bad.err, Catch::Contains("z.jpg") && Catch::Contains("empty image file"));
    CHECK_FALSE(fs::exists(t / "run/bad/y.manifest.json"));
    RunResult r = Cli(t / "run", "convert folder:in wds:out/y-%06d.tar --source-option folder.files=all");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    auto ds = Open(t / "run/out/y.manifest.json");
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    Sample s;
    REQUIRE(*(*rd)->Next(&s));
    CHECK(s.key == "c/p");
    REQUIRE(s.find("jpeg"));
    CHECK(s.find("jpeg")->data.str() == png);
    REQUIRE(*(*rd)->Next(&s));
    CHECK(s.key == "c/z");
    REQUIRE(s.find("jpg"));
    CHECK(s.find("jpg")->data.size() == 0);
  }
}

TEST_CASE("a DALI index whose member name the headers cannot confirm is not trusted (fuzz finding)", "[hostile]") {
  // fuzz_dali_index: an index naming "k/1.cl\xfa" for the member "k/1.cls" was
  // trusted (non-ASCII names were not compared with the header), so the sample's
  // field came back as "cl\xfa". Such an index must be ignored and the shard scanned.
  TempDir t;
  {
    auto w = Create("wds:" + (t / "s-%06d.tar"));
    REQUIRE(w.ok());
    for (int i = 0; i < 3; ++i) {
      Sample s;
      s.key = fmt::format("k/{}", i);
      s.set("bin", Bytes::Take(std::string(size_t(100 * i + 1), 'x')));
      s.set_label(i);
      REQUIRE((*w)->Write(s).ok());
    }
    REQUIRE((*w)->Finish().ok());
  }
  std::string idx = sk_test::ReadFile(t / "s-000000.idx");
  size_t at = idx.find("k/1.cls");
  REQUIRE(at != std::string::npos);
  idx.replace(at, 7, "k/1.cl\xfa");
  sk_test::WriteFile(t / "s-000000.idx", idx);
  auto ds = Open("wds:" + (t / "s-000000.tar"));
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE((*ra)->size() == 3);
  Sample s;
  REQUIRE((*ra)->Get(1, &s).ok());
  CHECK(s.key == "k/1");
  CHECK(s.find("cls"));
  CHECK(s.label() == 1);
}
