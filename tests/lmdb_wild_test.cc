// LMDB layouts written by other people's scripts (formats/lmdb/wild.*): fixtures
// made at test time with py-lmdb, numpy, PIL and pickle (tests/lmdb_wild_make.py),
// read, converted to every format and back, checked byte for byte; forced
// layouts, __len__ checks and hostile pickles inside an LMDB.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/md5.h"
#include "core/pickle.h"
#include "formats/lmdb/wild.h"
#include "shardkit/loader.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPy = "/usr/bin/python3";

std::string Md5Of(const Bytes& b) {
  md5::Md5 m;
  m.Update(b.data(), b.size());
  return m.HexDigest();
}

struct Fixtures {
  TempDir dir;
  json expected;
  explicit Fixtures(int n = 12, int proto = 0) {
    auto r = Run(fmt::format("{} {}/tests/lmdb_wild_make.py {} {}{}", kPy, SHARDKIT_SOURCE_DIR, Q(dir.path()), n,
                             proto ? fmt::format(" {}", proto) : ""));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    expected = json::parse(ReadFile(dir / "expected.json"));
  }
};

// Checks the first tar shard under `shard_dir` with Python: `exp` is expected.json's
// `fixture`, `m` maps member names to bytes, `before` runs once, `each` (lines indented
// by four spaces) runs for every expected sample `e` and asserts. Passes when the
// script ends well and checked `samples` samples.
void CheckShardInPython(const Fixtures& fx, const std::string& fixture, const std::string& shard_dir,
                        const std::string& before, const std::string& each, int samples) {
  std::string py = fmt::format(
      "import tarfile, io, json, hashlib, numpy as np\n"
      "from PIL import Image\n"
      "exp = json.load(open('{0}/expected.json'))['{1}']\n"
      "t = tarfile.open('{2}/s-000000.tar')\n"
      "m = {{x.name: t.extractfile(x).read() for x in t.getmembers()}}\n"
      "{3}"
      "for e in exp:\n"
      "{4}"
      "print(len(exp))\n",
      fx.dir.path(), fixture, shard_dir, before, each);
  WriteFile(fx.dir / "check.py", py);
  auto c = Run(fmt::format("{} {}", kPy, Q(fx.dir / "check.py")));
  INFO(py << c.err);
  CHECK(c.exit_code == 0);
  CHECK(c.out == fmt::format("{}\n", samples));
}

std::vector<Sample> ReadAll(const Dataset& ds) {
  std::vector<Sample> out;
  auto r = ds.NewReader();
  REQUIRE(r.ok());
  for (;;) {
    Sample s;
    auto more = (*r)->Next(&s);
    if (!more.ok()) FAIL(more.status().ToString());
    if (!*more) break;
    out.push_back(std::move(s));
  }
  return out;
}

// The samples match what the script put in (keys in dataset order, field, label, bytes).
void CheckAgainst(const std::vector<Sample>& got, const json& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& w = want[i];
    INFO("sample " << i << " key " << got[i].key);
    CHECK(got[i].key == w["key"].get<std::string>());
    std::string ext = w["ext"];
    const Field* f = nullptr;
    for (const auto& x : got[i].fields)
      if (x.ext == ext) f = &x;
    REQUIRE(f);
    if (ext == "npy") {
      auto a = pickle::ParseNpy(f->data);
      REQUIRE(a.ok());
      CHECK(Md5Of(a->data) == w["md5"].get<std::string>());
      CHECK(a->shape == w["shape"].get<std::vector<uint64_t>>());
      CHECK(a->dtype.descr() == "|u1");
    } else {
      CHECK(Md5Of(f->data) == w["md5"].get<std::string>());
    }
    if (w["label"].is_null()) CHECK(!got[i].label());
    else CHECK(got[i].label() == std::optional<int64_t>(w["label"].get<int64_t>()));
  }
}

void CheckSame(const std::vector<Sample>& a, const std::vector<Sample>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("sample " << i << " key " << a[i].key);
    CHECK(a[i].key == b[i].key);
    REQUIRE(a[i].fields.size() == b[i].fields.size());
    for (size_t j = 0; j < a[i].fields.size(); ++j) {
      CHECK(a[i].fields[j].ext == b[i].fields[j].ext);
      CHECK(a[i].fields[j].data == b[i].fields[j].data);
    }
  }
}

const char* kLayouts[][2] = {
    {"image_paths", "image"}, {"image_index", "image"}, {"pickle_array", "pickle"}, {"pickle_bytes", "pickle"}};

}  // namespace

TEST_CASE("lmdb wild: every layout is detected and read as the script wrote it", "[lmdb][wild]") {
  for (int proto : {2, 3, 4, 5}) {
    Fixtures fx(12, proto);
    for (auto [name, layout] : kLayouts) {
      INFO(name << " protocol " << proto);
      auto ds = Open(std::string("lmdb:") + (fx.dir / (std::string(name) + ".lmdb")));
      REQUIRE(ds.ok());
      CHECK((*ds)->info().extra.at("layout") == layout);
      CHECK((*ds)->info().num_samples == 12);
      auto samples = ReadAll(**ds);
      CheckAgainst(samples, fx.expected[name]);
      // Random access gives the same samples, in the same (numeric) order.
      auto ra = (*ds)->NewRandomAccess();
      REQUIRE(ra.ok());
      for (uint64_t i = 0; i < samples.size(); ++i) {
        Sample s;
        REQUIRE((*ra)->Get(i, &s).ok());
        CheckSame({s}, {samples[i]});
      }
      if (std::string(name) == "image_paths")
        CHECK((*ds)->info().class_names == std::vector<std::string>{"cat", "dog", "eel"});
      if (std::string(name) != "image_paths") CHECK((*ds)->info().extra.at("key_order") == "numeric");
    }
  }
}

TEST_CASE("lmdb wild: convert each layout to every format and back, identical", "[lmdb][wild][convert]") {
  Fixtures fx;
  for (auto [name, layout] : kLayouts) {
    std::string src = std::string("lmdb:") + (fx.dir / (std::string(name) + ".lmdb"));
    auto ds = Open(src);
    REQUIRE(ds.ok());
    auto orig = ReadAll(**ds);
    for (std::string dst : {std::string("wds:") + fx.dir / (std::string(name) + "_out/s-%06d.tar"),
                            std::string("lmdb:") + fx.dir / (std::string(name) + "_out.lmdb"),
                            std::string("hdf5:") + fx.dir / (std::string(name) + "_out.h5")}) {
      INFO(name << " -> " << dst);
      auto sum = Convert(src, dst);
      if (!sum.ok()) FAIL(sum.status().ToString());
      CHECK(sum->samples == orig.size());
      std::string back_addr = dst;
      // The manifest: it records the channel order of decoded arrays (a shard alone does not).
      if (dst.starts_with("wds:")) back_addr = fx.dir / (std::string(name) + "_out/s.manifest.json");
      auto back = Open(back_addr);
      if (!back.ok()) FAIL(back.status().ToString());
      auto again = ReadAll(**back);
      CheckSame(again, orig);
      CheckAgainst(again, fx.expected[name]);
      // and back into LMDB (shardkit layout), still the same samples
      std::string round = "lmdb:" + fx.dir / (std::string(name) + "_" + dst.substr(0, 4) + "_round.lmdb");
      auto sum2 = Convert(back_addr, round);
      if (!sum2.ok()) FAIL(sum2.status().ToString());
      auto rb = Open(round);
      REQUIRE(rb.ok());
      CheckSame(ReadAll(**rb), orig);
    }
  }
}

TEST_CASE("lmdb wild: decoded arrays reach tar shards as .npy that numpy loads, BGR as written", "[lmdb][wild][npy]") {
  Fixtures fx;
  std::string out = fx.dir / "arr/s-%06d.tar";
  auto r = Cli(fmt::format("convert {} {}", Q("lmdb:" + fx.dir / "pickle_array.lmdb"), Q("wds:" + out)));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CheckShardInPython(fx, "pickle_array", fx.dir / "arr", "",
                     "    a = np.load(io.BytesIO(m[e['key'] + '.npy']))\n"
                     "    assert a.dtype == np.uint8 and list(a.shape) == e['shape'], e\n"
                     "    assert hashlib.md5(a.tobytes()).hexdigest() == e['md5'], e\n"
                     "    assert hashlib.md5(a[:, :, ::-1].tobytes()).hexdigest() == e['rgb_md5'], e\n"
                     "    assert int(m[e['key'] + '.cls']) == e['label']\n",
                     12);
}

TEST_CASE("lmdb wild: forced layouts, __len__ and hostile values", "[lmdb][wild][hostile]") {
  Fixtures fx(5);
  OpenOptions o;
  o.format_options["lmdb.layout"] = "pickle";
  auto wrong = Open("lmdb:" + fx.dir / "image_index.lmdb", o);
  if (wrong.ok()) {  // detection is lazy per value: the read names the key
    auto r = (*wrong)->NewReader();
    REQUIRE(r.ok());
    Sample s;
    auto st = (*r)->Next(&s);
    REQUIRE(!st.ok());
    CHECK_THAT(st.status().message(), Catch::Contains("LMDB key '0'"));
  }
  o.format_options["lmdb.layout"] = "image";
  auto forced = Open("lmdb:" + fx.dir / "image_index.lmdb", o);
  REQUIRE(forced.ok());
  CHECK((*forced)->info().num_samples == 5);
  // Colour order: said (bgr by default), converted only when asked.
  {
    auto bgr = Open("lmdb:" + fx.dir / "pickle_array.lmdb");
    REQUIRE(bgr.ok());
    CHECK_THAT((*bgr)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: bgr"));
    OpenOptions c;
    c.format_options["lmdb.channels"] = "bgr-to-rgb";
    auto rgb = Open("lmdb:" + fx.dir / "pickle_array.lmdb", c);
    REQUIRE(rgb.ok());
    auto samples = ReadAll(**rgb);
    REQUIRE(samples.size() == 5);
    for (size_t i = 0; i < samples.size(); ++i) {
      auto a = pickle::ParseNpy(samples[i].find("npy")->data);
      REQUIRE(a.ok());
      CHECK(Md5Of(a->data) == fx.expected["pickle_array"][i]["rgb_md5"].get<std::string>());
    }
    c.format_options["lmdb.channels"] = "grb";
    CHECK(!Open("lmdb:" + fx.dir / "pickle_array.lmdb", c).ok());
  }
  o.format_options["lmdb.layout"] = "parquet";
  auto unknown = Open("lmdb:" + fx.dir / "image_index.lmdb", o);
  REQUIRE(!unknown.ok());
  CHECK_THAT(unknown.status().message(), Catch::Contains("unknown LMDB layout 'parquet'"));

  // A __len__ that disagrees, a hostile pickle, and a non-image value.
  std::string py = fmt::format(
      "import lmdb, pickle, os\n"
      "class Evil:\n"
      "    def __reduce__(self): return (os.system, ('touch {0}/PWNED',))\n"
      "def mk(name, items):\n"
      "    env = lmdb.open('{0}/' + name, map_size=1 << 26)\n"
      "    with env.begin(write=True) as t:\n"
      "        for k, v in items: t.put(k, v)\n"
      "    env.close()\n"
      "mk('badlen.lmdb', [(b'0', pickle.dumps((b'\\xff\\xd8\\xff\\xe0xx', 1))), (b'__len__', pickle.dumps(7))])\n"
      "mk('evil.lmdb', [(b'0', pickle.dumps((b'\\xff\\xd8\\xff\\xe0xx', 1))), (b'1', pickle.dumps((Evil(), 1)))])\n"
      "mk('junk.lmdb', [(b'0', b'\\xff\\xd8\\xff\\xe0xx'), (b'1', b'hello')])\n",
      fx.dir.path());
  WriteFile(fx.dir / "mk.py", py);
  auto r = Run(fmt::format("{} {}", kPy, Q(fx.dir / "mk.py")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto badlen = Open("lmdb:" + fx.dir / "badlen.lmdb");
  REQUIRE(!badlen.ok());
  CHECK_THAT(badlen.status().message(), Catch::Contains("'__len__'") && Catch::Contains("says 7 samples, the LMDB holds 1"));
  for (auto [name, msg] : {std::pair{"evil.lmdb", "global 'posix.system' is refused"},
                           std::pair{"junk.lmdb", "value is not an image file"}}) {
    INFO(name);
    auto ds = Open("lmdb:" + fx.dir / name);
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    REQUIRE(rd.ok());
    Sample s;
    REQUIRE((*rd)->Next(&s).ok());
    auto st = (*rd)->Next(&s);
    REQUIRE(!st.ok());
    CHECK_THAT(st.status().message(), Catch::Contains("LMDB key '1'") && Catch::Contains(msg));
    // verify reports it too, with a non-zero exit
    auto v = Cli("verify " + Q("lmdb:" + fx.dir / name));
    CHECK(v.exit_code != 0);
  }
  CHECK(!fs::exists(fx.dir / "PWNED"));
}

TEST_CASE("image-text pairs stay one sample through every format", "[wild][pairs]") {
  TempDir dir;
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) {
    std::string stem = fmt::format("c{}/x{}", i % 2, i);
    fs::create_directories(dir / fmt::format("src/c{}", i % 2));
    WriteFile(dir / ("src/" + stem + ".jpg"), MakeJpeg(16, 12, uint32_t(i)));
    WriteFile(dir / ("src/" + stem + ".txt"), fmt::format("a photo number {}", i));
    if (i % 2) WriteFile(dir / ("src/" + stem + ".json"), fmt::format("{{\"i\": {}}}", i));
  }
  auto src = Open(dir / "src");
  REQUIRE(src.ok());
  auto orig = ReadAll(**src);
  REQUIRE(orig.size() == 6);
  for (const auto& s : orig) {
    INFO(s.key);
    CHECK(s.find("jpg"));
    CHECK(s.find("txt"));
  }
  std::vector<std::string> dsts = {"wds:" + dir / "o/s-%06d.tar", "lmdb:" + dir / "o.lmdb", "hdf5:" + dir / "o.h5",
                                   "folder:" + dir / "o_folder"};
  for (const auto& dst : dsts) {
    INFO(dst);
    auto sum = Convert(dir / "src", dst);
    if (!sum.ok()) FAIL(sum.status().ToString());
    std::string back = dst.starts_with("wds:") ? "wds:" + dir / "o/s-000000.tar" : dst;
    auto b = Open(back);
    if (!b.ok()) FAIL(b.status().ToString());
    auto again = ReadAll(**b);
    CheckSame(again, orig);
    // and from there to every other format: still one sample with its text
    for (const auto& dst2 : dsts) {
      if (dst2 == dst) continue;
      std::string d2 = dst2 + (dst2.starts_with("wds:") ? "" : "_2");
      if (dst2.starts_with("wds:")) d2 = "wds:" + dir / ("o2_" + dst.substr(0, 4) + "/s-%06d.tar");
      auto s2 = Convert(back, d2);
      if (!s2.ok()) FAIL(s2.status().ToString());
      std::string b2 = d2.starts_with("wds:") ? "wds:" + dir / ("o2_" + dst.substr(0, 4) + "/s-000000.tar") : d2;
      auto r2 = Open(b2);
      if (!r2.ok()) FAIL(r2.status().ToString());
      CheckSame(ReadAll(**r2), orig);
      if (!d2.starts_with("wds:")) fs::remove_all(d2.substr(d2.find(':') + 1));
    }
  }
}

TEST_CASE("lmdb wild: --encode png|jpeg:Q writes decoded arrays as images, BGR only when converted", "[lmdb][wild][encode]") {
  Fixtures fx(6);
  std::string src = Q("lmdb:" + fx.dir / "pickle_array.lmdb");
  // BGR arrays are not silently written into RGB image files.
  auto refused = Cli(fmt::format("convert {} {} --encode png", src, Q("wds:" + fx.dir / "bad/s-%06d.tar")));
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.err, Catch::Contains("BGR") && Catch::Contains("lmdb.channels=bgr-to-rgb"));
  auto badq = Cli(fmt::format("convert {} {} --encode jpeg:101 --source-option lmdb.channels=rgb", src,
                              Q("wds:" + fx.dir / "bad/s-%06d.tar")));
  CHECK(badq.exit_code != 0);
  CHECK_THAT(badq.err, Catch::Contains("jpeg:101") && Catch::Contains("Q in 1..100"));
  for (std::string enc : {"png", "jpeg:95"}) {
    INFO(enc);
    std::string out = fx.dir / ("enc_" + enc.substr(0, 3));
    auto r = Cli(fmt::format("convert {} {} --encode {} --source-option lmdb.channels=bgr-to-rgb", src,
                             Q("wds:" + out + "/s-%06d.tar"), enc));
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    std::string ext = enc == "png" ? "png" : "jpg";
    CheckShardInPython(
        fx, "pickle_array", out, "assert not any(k.endswith('.npy') for k in m), m.keys()\n",
        fmt::format("    a = np.asarray(Image.open(io.BytesIO(m[e['key'] + '.{0}'])).convert('RGB'))\n"
                    "    assert list(a.shape) == e['shape'], e\n"
                    "    if '{0}' == 'png': assert hashlib.md5(a.tobytes()).hexdigest() == e['rgb_md5'], e\n"
                    "    assert int(m[e['key'] + '.cls']) == e['label']\n",
                    ext),
        6);
  }
}

TEST_CASE("lmdb wild: BGR arrays keep their channel order through every format, and every consumer honours it", "[lmdb][wild][channels]") {
  Fixtures fx(5);
  const std::string src = "lmdb:" + fx.dir / "pickle_array.lmdb";
  const json& exp = fx.expected["pickle_array"];
  // Into tar shards: the manifest records the order (whole, and written in two parts).
  auto c = Cli(fmt::format("convert {} {}", Q(src), Q("wds:" + fx.dir / "t/s-%06d.tar")));
  INFO(c.out << c.err);
  REQUIRE(c.exit_code == 0);
  const std::string manifest = fx.dir / "t/s.manifest.json";
  CHECK(json::parse(ReadFile(manifest))["channel_order"] == "bgr");
  for (int i = 0; i < 2; ++i)
    REQUIRE(Cli(fmt::format("convert {} {} --samples-per-shard 2 --part {}/2", Q(src), Q("wds:" + fx.dir / "p/s-%06d.tar"), i))
                .exit_code == 0);
  REQUIRE(Cli("merge " + Q("wds:" + fx.dir / "p/s-%06d.tar")).exit_code == 0);
  CHECK(json::parse(ReadFile(fx.dir / "p/s.manifest.json"))["channel_order"] == "bgr");
  auto info = Cli("info " + Q(manifest));
  CHECK_THAT(info.out, Catch::Contains("channel_order: decoded arrays: bgr (as the manifest records"));
  // --encode refuses, naming the option that converts them.
  auto enc = Cli(fmt::format("convert {} {} --encode png", Q(manifest), Q("wds:" + fx.dir / "bad/s-%06d.tar")));
  CHECK(enc.exit_code == 1);
  CHECK_THAT(enc.err, Catch::Contains("BGR") && Catch::Contains("wds.channels=bgr-to-rgb"));
  // HDF5 output records it.
  REQUIRE(Cli(fmt::format("convert {} {}", Q(manifest), Q("hdf5:" + fx.dir / "t.h5"))).exit_code == 0);
  auto h5 = Open("hdf5:" + fx.dir / "t.h5");
  REQUIRE(h5.ok());
  CHECK_THAT((*h5)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: bgr"));
  // MDS records it in its shardkit.json (Streaming ignores that file).
  REQUIRE(Cli(fmt::format("convert {} {}", Q(manifest), Q("mds:" + fx.dir / "m"))).exit_code == 0);
  CHECK(json::parse(ReadFile(fx.dir / "m/shardkit.json"))["channel_order"] == "bgr");
  auto mds = Open("mds:" + fx.dir / "m");
  REQUIRE(mds.ok());
  CHECK_THAT((*mds)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: bgr (as shardkit.json records"));
  auto mds_rgb = Open("mds:" + fx.dir / "m", OpenOptions{.format_options = {{"mds.channels", "bgr-to-rgb"}}});
  REQUIRE(mds_rgb.ok());
  {
    auto got = ReadAll(**mds_rgb);
    REQUIRE(got.size() == exp.size());
    for (size_t i = 0; i < got.size(); ++i) {
      auto a = pickle::ParseNpy(got[i].find("npy")->data);
      REQUIRE(a.ok());
      CHECK(Md5Of(a->data) == exp[i]["rgb_md5"].get<std::string>());
    }
  }
  // The other writers record it too, and their readers give it back and convert it on read.
  struct Recorded {
    std::string dst, open, record, option;
  };
  for (const Recorded& r : {Recorded{"folder:" + fx.dir / "f", "folder:" + fx.dir / "f", fx.dir / "f/.shardkit-folder.json",
                                     "folder.channels"},
                            Recorded{"tfrecord:" + fx.dir / "tf/s-%05d.tfrecord", fx.dir / "tf/s.tfrecord.json",
                                     fx.dir / "tf/s.tfrecord.json", "tfrecord.channels"},
                            Recorded{"recordio:" + fx.dir / "rec/s-%05d.rec", "recordio:" + fx.dir / "rec/s-00000.rec",
                                     fx.dir / "rec/s-00000.shardkit.json", "recordio.channels"}}) {
    INFO(r.dst);
    auto c2 = Cli(fmt::format("convert {} {}", Q(manifest), Q(r.dst)));
    INFO(c2.out << c2.err);
    REQUIRE(c2.exit_code == 0);
    CHECK(json::parse(ReadFile(r.record))["channel_order"] == "bgr");
    auto back = Open(r.open);
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    CHECK_THAT((*back)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: bgr (as"));
    auto again = Cli(fmt::format("convert {} {} --encode png", Q(r.open), Q("wds:" + fx.dir / "again/s-%06d.tar")));
    CHECK(again.exit_code == 1);
    CHECK_THAT(again.err, Catch::Contains("BGR") && Catch::Contains(r.option + "=bgr-to-rgb"));
    auto rgb2 = Open(r.open, OpenOptions{.format_options = {{r.option, "bgr-to-rgb"}}});
    REQUIRE(rgb2.ok());
    auto got = ReadAll(**rgb2);
    REQUIRE(got.size() == exp.size());
    std::set<std::string> want, have;
    for (size_t i = 0; i < got.size(); ++i) {
      auto a = pickle::ParseNpy(got[i].find("npy")->data);
      REQUIRE(a.ok());
      have.insert(Md5Of(a->data));
      want.insert(exp[i]["rgb_md5"].get<std::string>());
    }
    CHECK(have == want);
  }
  // A recorded order that is neither bgr nor rgb is refused, naming the file.
  {
    json marker = json::parse(ReadFile(fx.dir / "f/.shardkit-folder.json"));
    marker["channel_order"] = "grb";
    WriteFile(fx.dir / "f/.shardkit-folder.json", marker.dump());
    auto bad_marker = Cli("info " + Q("folder:" + fx.dir / "f"));
    CHECK(bad_marker.exit_code == 1);
    CHECK_THAT(bad_marker.err, Catch::Contains(".shardkit-folder.json") && Catch::Contains("channel_order"));
  }
  // The loader refuses them too.
  LoaderOptions lo;
  lo.batch_size = 2;
  lo.threads = 1;
  lo.output_height = lo.output_width = 8;
  auto refused = Loader::Create(manifest, lo);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().ToString(), Catch::Contains("wds.channels=bgr-to-rgb"));
  // Converted on read: RGB arrays, by sequential and random access, and RGB PNGs.
  OpenOptions o;
  o.format_options["wds.channels"] = "bgr-to-rgb";
  auto rgb = Open(manifest, o);
  REQUIRE(rgb.ok());
  CHECK_THAT((*rgb)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: rgb (converted"));
  auto samples = ReadAll(**rgb);
  auto ra = (*rgb)->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE(samples.size() == exp.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    auto a = pickle::ParseNpy(samples[i].find("npy")->data);
    REQUIRE(a.ok());
    CHECK(Md5Of(a->data) == exp[i]["rgb_md5"].get<std::string>());
    Sample s;
    REQUIRE((*ra)->Get(i, &s).ok());
    CHECK(s.find("npy")->data == samples[i].find("npy")->data);
  }
  auto png = Cli(fmt::format("convert {} {} --encode png --source-option wds.channels=bgr-to-rgb", Q(manifest),
                             Q("wds:" + fx.dir / "png/s-%06d.tar")));
  INFO(png.out << png.err);
  REQUIRE(png.exit_code == 0);
  CheckShardInPython(fx, "pickle_array", fx.dir / "png", "",
                     "    a = np.asarray(Image.open(io.BytesIO(m[e['key'] + '.png'])).convert('RGB'))\n"
                     "    assert hashlib.md5(a.tobytes()).hexdigest() == e['rgb_md5'], e\n",
                     5);
  // Saying the order of shards read without their manifest; a bad value; a bad record.
  o.format_options["wds.channels"] = "bgr";
  auto said = Open(fx.dir / "t/s-000000.tar", o);
  REQUIRE(said.ok());
  CHECK_THAT((*said)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: bgr (said by wds.channels"));
  o.format_options["wds.channels"] = "grb";
  CHECK(Open(manifest, o).status().code() == Code::kInvalidArgument);
  json bad = json::parse(ReadFile(manifest));
  bad["channel_order"] = "grb";
  WriteFile(manifest, bad.dump());
  CHECK(Cli("info " + Q(manifest)).exit_code == 1);
}

// A split-layout LMDB's samples against expected.json: keys, image bytes, label text.
void CheckSplitSamples(const std::vector<Sample>& got, const json& exp) {
  REQUIRE(got.size() == exp.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(i);
    CHECK(got[i].key == exp[i]["key"].get<std::string>());
    const Field* img = got[i].find(exp[i]["ext"].get<std::string>());
    REQUIRE(img);
    CHECK(Md5Of(img->data) == exp[i]["md5"].get<std::string>());
    const Field* txt = got[i].find("txt");
    REQUIRE(txt);
    CHECK(txt->data.str() == exp[i]["txt"].get<std::string>());
  }
}

// The same by sequential reading and by random access (backwards).
void CheckSplitDataset(const Dataset& ds, const json& exp) {
  CheckSplitSamples(ReadAll(ds), exp);
  auto ra = ds.NewRandomAccess();
  REQUIRE(ra.ok());
  std::vector<Sample> byindex(exp.size());
  for (size_t i = exp.size(); i-- > 0;) REQUIRE((*ra)->Get(i, &byindex[i]).ok());
  CheckSplitSamples(byindex, exp);
}

TEST_CASE("lmdb wild: CRNN's split image-/label-/num-samples layout reads as samples with a txt label", "[lmdb][wild]") {
  Fixtures fx(7);
  const std::string dir = fx.dir / "split_crnn.lmdb";
  const json& exp = fx.expected["split_crnn"];
  auto ds = Open("lmdb:" + dir);
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 7u);  // not 15 keys
  CheckSplitDataset(**ds, exp);
  auto info = Cli("info " + Q("lmdb:" + dir));
  INFO(info.out << info.err);
  CHECK(info.exit_code == 0);
  CHECK_THAT(info.out, Catch::Contains("samples: 7") && Catch::Contains("label-N keys"));
  auto v = Cli("verify " + Q("lmdb:" + dir));
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
  // To tar shards: the image and its text label, as a CRNN pipeline reads them.
  auto c = Cli(fmt::format("convert {} {}", Q("lmdb:" + dir), Q("wds:" + fx.dir / "crnn/s-%06d.tar")));
  INFO(c.out << c.err);
  REQUIRE(c.exit_code == 0);
  auto back = Open(fx.dir / "crnn/s.manifest.json");
  REQUIRE(back.ok());
  CheckSplitSamples(ReadAll(**back), exp);

  // A label without its image, an image without its label, a wrong count: errors naming the key.
  std::string py = fmt::format(
      "import lmdb, sys\n"
      "env = lmdb.open(sys.argv[1], map_size=1 << 26)\n"
      "with env.begin(write=True) as t:\n"
      "    if sys.argv[2] == 'nolabel': t.delete(b'label-000000003')\n"
      "    if sys.argv[2] == 'count': t.put(b'num-samples', b'9')\n"
      "    if sys.argv[2] == 'stray': t.put(b'other-1', b'x')\n");
  WriteFile(fx.dir / "damage.py", py);
  for (auto [how, want] : std::vector<std::pair<std::string, std::string>>{
           {"nolabel", "'image-000000003' in"}, {"count", "'num-samples'"}, {"stray", "'other-1'"}}) {
    INFO(how);
    fs::remove_all(fx.dir / "d.lmdb");
    fs::copy(dir, fx.dir / "d.lmdb");
    REQUIRE(Run(fmt::format("{} {} {} {}", kPy, Q(fx.dir / "damage.py"), Q(fx.dir / "d.lmdb"), how)).exit_code == 0);
    auto r = Cli("info " + Q("lmdb:" + fx.dir / "d.lmdb"));
    INFO(r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains(want));
  }
}

TEST_CASE("lmdb wild: the split layout's kin (N / label_N, image_N / label_N / __len__) read as samples", "[lmdb][wild]") {
  Fixtures fx(11);
  for (std::string name : {"split_idx", "split_under"}) {
    INFO(name);
    const std::string dir = fx.dir / (name + ".lmdb");
    const json& exp = fx.expected[name];
    auto ds = Open("lmdb:" + dir);
    INFO(ds.status().ToString());
    REQUIRE(ds.ok());
    CHECK((*ds)->info().num_samples == 11u);  // not 22 (or 23) keys
    CheckSplitDataset(**ds, exp);              // "10" after "9": numeric order
    auto info = Cli("info " + Q("lmdb:" + dir));
    INFO(info.out << info.err);
    CHECK(info.exit_code == 0);
    CHECK_THAT(info.out, Catch::Contains("samples: 11") && Catch::Contains("label_N keys"));
    auto c = Cli(fmt::format("convert {} {}", Q("lmdb:" + dir), Q("wds:" + fx.dir / (name + "/s-%06d.tar"))));
    INFO(c.out << c.err);
    REQUIRE(c.exit_code == 0);
    auto back = Open(fx.dir / (name + "/s.manifest.json"));
    REQUIRE(back.ok());
    CheckSplitSamples(ReadAll(**back), exp);
  }
  // An image without its label, a wrong __len__: errors naming the keys.
  std::string py =
      "import lmdb, pickle, sys\n"
      "env = lmdb.open(sys.argv[1], map_size=1 << 26)\n"
      "with env.begin(write=True) as t:\n"
      "    if sys.argv[2] == 'nolabel': t.delete(b'label_3')\n"
      "    if sys.argv[2] == 'len': t.put(b'__len__', pickle.dumps(12))\n";
  WriteFile(fx.dir / "damage.py", py);
  for (auto [name, how, want] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"split_idx", "nolabel", "LMDB key '3' in"},
           {"split_under", "nolabel", "LMDB key 'image_3' in"},
           {"split_under", "len", "LMDB key '__len__' in"}}) {
    INFO(name << " " << how);
    fs::remove_all(fx.dir / "d.lmdb");
    fs::copy(fx.dir / (name + ".lmdb"), fx.dir / "d.lmdb");
    REQUIRE(Run(fmt::format("{} {} {} {}", kPy, Q(fx.dir / "damage.py"), Q(fx.dir / "d.lmdb"), how)).exit_code == 0);
    auto r = Cli("info " + Q("lmdb:" + fx.dir / "d.lmdb"));
    INFO(r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains(want));
    if (how == "nolabel") CHECK_THAT(r.err, Catch::Contains("has no 'label_3'"));
  }
}

TEST_CASE("lmdb wild: 2-D (grayscale) arrays have no channel order and convert with --encode png", "[lmdb][wild][encode]") {
  Fixtures fx(5);
  std::string src = Q("lmdb:" + fx.dir / "pickle_gray.lmdb");
  auto info = Cli("info " + src);
  INFO(info.out << info.err);
  REQUIRE(info.exit_code == 0);
  CHECK_THAT(info.out, Catch::Contains("channel_order: decoded arrays: none (2-D, grayscale"));
  std::string out = fx.dir / "gray_png";
  auto r = Cli(fmt::format("convert {} {} --encode png", src, Q("wds:" + out + "/s-%06d.tar")));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CheckShardInPython(fx, "pickle_gray", out, "",
                     "    im = Image.open(io.BytesIO(m[e['key'] + '.png']))\n"
                     "    assert im.mode == 'L', im.mode\n"
                     "    a = np.asarray(im)\n"
                     "    assert list(a.shape) == e['shape'] and hashlib.md5(a.tobytes()).hexdigest() == e['md5'], e\n"
                     "    assert int(m[e['key'] + '.cls']) == e['label']\n",
                     5);
  // A 3-channel array after a 2-D first one: its order is unknown, so it is refused
  // naming the key, not guessed; saying the order lets it through.
  std::string mixed = Q("lmdb:" + fx.dir / "pickle_mixed.lmdb");
  auto m = Cli(fmt::format("convert {} {} --encode png", mixed, Q("wds:" + fx.dir / "mixed/s-%06d.tar")));
  INFO(m.out << m.err);
  CHECK(m.exit_code == 1);
  CHECK_THAT(m.err, Catch::Contains("LMDB key '1'") && Catch::Contains("channel order is unknown") &&
                        Catch::Contains("lmdb.channels=bgr"));
  auto ok = Cli(fmt::format("convert {} {} --encode png --source-option lmdb.channels=bgr-to-rgb", mixed,
                            Q("wds:" + fx.dir / "mixed2/s-%06d.tar")));
  INFO(ok.out << ok.err);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("lmdb wild: the pickle layout writer's values read back through the subset reader", "[lmdb][wild][pickle]") {
  struct Case {
    pickle::DType dt;
    std::vector<uint64_t> shape;
    bool fortran;
    std::optional<int64_t> label;
  };
  const Case cases[] = {
      {{'u', 1, '|'}, {3, 4, 3}, false, 7},
      {{'u', 1, '|'}, {300, 2}, false, std::nullopt},  // > 255 elements: BINBYTES, not SHORT_BINBYTES
      {{'f', 4, '<'}, {2, 3}, true, -5},
      {{'i', 2, '>'}, {70000}, false, 70000},
      {{'b', 1, '|'}, {1, 1, 1}, false, int64_t(1) << 40},
  };
  for (const auto& c : cases) {
    INFO(c.dt.descr() << " fortran " << c.fortran);
    pickle::NdArray a;
    a.dtype = c.dt;
    a.shape = c.shape;
    a.fortran_order = c.fortran;
    std::string data(size_t(a.elements() * c.dt.itemsize), '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = char(c.dt.kind == 'b' ? i % 2 : i * 37 + 11);
    a.data = Bytes::Copy(data);
    std::string value = formats::lmdb::wild::PickleArray(a, c.label);
    auto v = pickle::ParsePickle(Bytes::Copy(value));
    if (!v.ok()) FAIL(v.status().ToString());
    REQUIRE(v->kind == pickle::Value::Kind::kTuple);
    REQUIRE(v->items.size() == 2);
    const auto& got = v->items[0];
    REQUIRE(got.kind == pickle::Value::Kind::kArray);
    CHECK(got.array.dtype.descr() == c.dt.descr());
    CHECK(got.array.shape == c.shape);
    CHECK(got.array.fortran_order == c.fortran);
    CHECK(got.array.data.str() == data);
    if (c.label) {
      REQUIRE(v->items[1].is_int());
      CHECK(v->items[1].i == *c.label);
    } else {
      CHECK(v->items[1].kind == pickle::Value::Kind::kNone);
    }
  }
}
