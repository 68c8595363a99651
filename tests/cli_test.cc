// The shardkit command: exit codes, error messages, --help, --json, and (once
// the formats exist) real conversions through the binary.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "shardkit/shardkit.h"
#include "support.h"

using namespace sk_test;
namespace fs = std::filesystem;

namespace {

// True when `format` has a writer in this build (formats land one by one).
bool Ready(const std::string& format) {
  TempDir t;
  std::string addr = format == "wds" ? format + ":" + (t / "probe-%06d.tar") : format + ":" + (t / "probe");
  if (format == "hdf5") addr += ".h5";
  auto w = shardkit::Create(addr);
  if (!w.ok() && w.status().code() == shardkit::Code::kUnsupported) {
    WARN("skipped: the " << format << " format is not available yet: " << w.status().ToString());
    return false;
  }
  return true;
}

// Relative path (lowercased) -> contents, of the regular files under root.
std::map<std::string, std::string> Tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), root).string();
    std::transform(rel.begin(), rel.end(), rel.begin(), ::tolower);
    out[rel] = ReadFile(e.path().string());
  }
  return out;
}

void ExpectUsage(const RunResult& r, const std::string& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::StartsWith("shardkit: error: "));
  CHECK_THAT(r.err, Catch::Contains(needle));
  CHECK(r.out.empty());
}

void ExpectError(const RunResult& r, const std::string& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::StartsWith("shardkit: error: "));
  CHECK_THAT(r.err, Catch::Contains(needle));
  CHECK(r.out.empty());
}

}  // namespace

TEST_CASE("cli: usage errors exit 2 with a message naming the problem") {
  ExpectUsage(Cli(""), "subcommand is required");
  ExpectUsage(Cli("frobnicate"), "frobnicate");
  ExpectUsage(Cli("convert onlyone"), "DST is required");
  ExpectUsage(Cli("convert a b --no-such-flag"), "--no-such-flag");
  ExpectUsage(Cli("convert a b --seed 3"), "--seed requires --shuffle");
  ExpectUsage(Cli("convert a b --threads 2000"), "--threads");
  ExpectUsage(Cli("convert a b --key-dots maybe"), "maybe");
  ExpectUsage(Cli("convert a b --lmdb-layout leveldb"), "leveldb");
  ExpectUsage(Cli("shard a b --num-shards 2 --samples-per-shard 3"), "--num-shards excludes --samples-per-shard");
  ExpectUsage(Cli("shard a b --num-shards 0"), "--num-shards");
  ExpectUsage(Cli("info"), "DATASET is required");
}

TEST_CASE("cli: a bad size string is a usage error naming the flag and the string") {
  for (const char* cmd : {"convert", "shard"}) {
    for (const char* bad : {"12XB", "lots", "1.2.3GB", "0"}) {
      auto r = Cli(fmt::format("{} a wds:b-%06d.tar --shard-size {}", cmd, Q(bad)));
      ExpectUsage(r, "--shard-size");
      CHECK_THAT(r.err, Catch::Contains(std::string("'") + bad + "'"));
    }
  }
}

TEST_CASE("cli: a missing input or an unknown format exits 1 naming the address") {
  TempDir t;
  ExpectError(Cli(fmt::format("convert {} wds:{}", Q(t / "missing"), Q(t / "o-%06d.tar"))), t / "missing");
  ExpectError(Cli(fmt::format("info {}", Q(t / "missing"))), t / "missing");
  auto r = Cli(fmt::format("convert nosuchformat:{} wds:{}", Q(t / "x"), Q(t / "o-%06d.tar")));
  ExpectUsage(r, "nosuchformat:");
  CHECK_THAT(r.err, Catch::Contains("prefix it with a scheme"));
  ExpectError(Cli(fmt::format("shard {} lmdb:{}", Q(t / "x"), Q(t / "o"))), "use `shardkit convert`");
}

TEST_CASE("cli: an unknown scheme exits 2 listing the known ones and writes nothing") {
  TempDir t;
  MakeImageFolder(t / "images", 2, 2);
  for (std::string dst : {"parquet:/data/x-%05d.parquet", "wsd:out/x-%06d.tar"}) {
    auto r = Run(fmt::format("cd {} && {} convert images {}", Q(t.path()), Q(SHARDKIT_CLI), Q(dst)));
    ExpectUsage(r, "unknown scheme '" + dst.substr(0, dst.find(':') + 1) + "'");
    for (const auto& name : shardkit::FormatNames()) CHECK_THAT(r.err, Catch::Contains(name + ":"));
    CHECK_FALSE(fs::exists(t / dst.substr(0, dst.find(':') + 1)));
  }
  // A path that really holds a colon, written as a path, is converted.
  auto ok = Run(fmt::format("cd {} && {} convert images ./odd:name", Q(t.path()), Q(SHARDKIT_CLI)));
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(fs::is_directory(t / "odd:name/c1"));
}

TEST_CASE("cli: --help of every command explains every flag with an example") {
  const std::map<std::string, std::vector<std::string>> flags = {
      {"convert", {"SRC", "DST", "--shard-size", "--samples-per-shard", "--shuffle", "--seed", "--threads",
                   "--key-dots", "--lmdb-layout", "--overwrite", "--json"}},
      {"shard", {"SRC", "DST", "--num-shards", "--samples-per-shard", "--shard-size", "--shuffle", "--seed",
                 "--threads", "--key-dots", "--overwrite", "--json"}},
      {"info", {"DATASET", "--count", "--json"}},
  };
  for (const auto& [cmd, names] : flags) {
    auto r = Cli(cmd + " --help");
    INFO(r.out);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("Examples:"));
    CHECK_THAT(r.out, Catch::Contains("shardkit " + cmd + " "));
    CHECK_THAT(r.out, Catch::Contains("Exit status"));
    for (const auto& n : names) CHECK_THAT(r.out, Catch::Contains(n));
  }
  auto top = Cli("--help");
  CHECK(top.exit_code == 0);
  for (const char* cmd : {"convert", "shard", "info"}) CHECK_THAT(top.out, Catch::Contains(cmd));
  auto v = Cli("--version");
  CHECK(v.exit_code == 0);
  CHECK_THAT(v.out, Catch::Contains(shardkit::Version()));
}

TEST_CASE("cli: progress stays off stderr when it is not a terminal") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 2, 3);
  auto r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "o-%06d.tar")));
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK_THAT(r.out, Catch::Contains("6 samples"));
}

TEST_CASE("cli: bad pattern and unwritable output exit 1 naming the path") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 2, 2);
  // A wds output needs exactly one integer conversion.
  auto r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "out-%s.tar")));
  ExpectError(r, "out-%s.tar");
  r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "out-%d-%d.tar")));
  ExpectError(r, "out-%d-%d.tar");
  // A parent that is a regular file cannot be written (even by root).
  WriteFile(t / "afile", "x");
  r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "afile/out-%06d.tar")));
  ExpectError(r, "afile");
  r = Cli(fmt::format("convert {} folder:{}", Q(t / "in"), Q(t / "afile/sub")));
  ExpectError(r, "afile");
  // An existing output without --overwrite.
  REQUIRE(Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "o-%06d.tar"))).exit_code == 0);
  r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "o-%06d.tar")));
  ExpectError(r, "o-000000.tar");
  CHECK(Cli(fmt::format("convert {} wds:{} --overwrite", Q(t / "in"), Q(t / "o-%06d.tar"))).exit_code == 0);
}

TEST_CASE("cli: --json summaries parse and hold the documented keys") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  int n = MakeImageFolder(t / "in", 3, 4);
  auto r = Cli(fmt::format("convert {} wds:{} --samples-per-shard 5 --json", Q(t / "in"), Q(t / "o-%06d.tar")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"command", "source", "destination", "source_format", "destination_format", "samples",
                        "bytes", "payload_bytes", "seconds", "mb_per_s", "shards"})
    CHECK(j.contains(k));
  CHECK(j["command"] == "convert");
  CHECK(j["samples"] == n);
  CHECK(j["source_format"] == "folder");
  CHECK(j["destination_format"] == "wds");
  REQUIRE(j["shards"].size() == 3);  // 5 + 5 + 2
  uint64_t bytes = 0;
  for (auto& sh : j["shards"]) {
    for (const char* k : {"path", "samples", "bytes", "checksum"}) CHECK(sh.contains(k));
    CHECK(fs::file_size(sh["path"].get<std::string>()) == sh["bytes"].get<uint64_t>());
    bytes += sh["bytes"].get<uint64_t>();
  }
  CHECK(j["shards"][0]["samples"] == 5);
  CHECK(j["shards"][2]["samples"] == 2);
  CHECK(j["bytes"].get<uint64_t>() >= bytes);

  auto info = Cli(fmt::format("info {} --json", Q(t / "in")));
  REQUIRE(info.exit_code == 0);
  auto ji = nlohmann::json::parse(info.out);
  for (const char* k : {"address", "format", "samples", "classes", "fields", "shards", "bytes", "extra"})
    CHECK(ji.contains(k));
  CHECK(ji["format"] == "folder");
  CHECK(ji["classes"] == nlohmann::json({"c0", "c1", "c2"}));
  auto text = Cli(fmt::format("info {}", Q(t / "in")));
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("format:  folder"));
  CHECK_THAT(text.out, Catch::Contains("classes: 3 (c0, c1, c2)"));
  // info says what it checked: it reads metadata, not records.
  CHECK_THAT(text.out, Catch::Contains("checked: metadata only; run `shardkit verify` to check the data"));
  CHECK(ji["checked"] == "metadata");
}

TEST_CASE("cli: folder -> shards -> folder is byte-identical") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 3, 5);
  WriteFile(t / "in/c1/gray.jpg", MakeJpeg(40, 30, 9, JpegKind::kGray));
  WriteFile(t / "in/c2/prog.jpg", MakeJpeg(40, 30, 10, JpegKind::kProgressive));
  WriteFile(t / "in/c0/pic.png", MakePng(20, 10, 11));
  auto a = Cli(fmt::format("convert {} wds:{} --samples-per-shard 4", Q(t / "in"), Q(t / "s/t-%06d.tar")));
  INFO(a.err);
  REQUIRE(a.exit_code == 0);
  auto b = Cli(fmt::format("convert {} folder:{}", Q(fmt::format("wds:{}/s/t-{{000000..000004}}.tar", t.path())),
                           Q(t / "back")));
  INFO(b.err);
  REQUIRE(b.exit_code == 0);
  auto src = Tree(t / "in"), back = Tree(t / "back");
  for (const auto& [rel, bytes] : src) {
    INFO(rel);
    REQUIRE(back.count(rel) == 1);
    CHECK(back[rel] == bytes);
  }
  // The manifest is a dataset address too.
  auto c = Cli(fmt::format("info {} --json", Q(t / "s/t-000000.tar")));
  CHECK(c.exit_code == 0);
}

TEST_CASE("cli: shard --num-shards 3 on 10 samples gives 4, 3, 3") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 2, 5);
  auto r = Cli(fmt::format("shard {} {} --num-shards 3 --json", Q(t / "in"), Q(t / "o-%06d.tar")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["shards"].size() == 3);
  std::vector<uint64_t> counts;
  for (auto& sh : j["shards"]) counts.push_back(sh["samples"].get<uint64_t>());
  CHECK(counts == std::vector<uint64_t>{4, 3, 3});
  // Every shard reads back with its count.
  for (int i = 0; i < 3; ++i) {
    auto ds = shardkit::Open("wds:" + (t / fmt::format("o-{:06d}.tar", i)));
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    REQUIRE(rd.ok());
    shardkit::Sample s;
    uint64_t n = 0;
    while (*(*rd)->Next(&s)) ++n;
    CHECK(n == counts[i]);
  }
  ExpectError(Cli(fmt::format("shard {} {} --num-shards 11", Q(t / "in"), Q(t / "p-%06d.tar"))), "--num-shards 11");
}

TEST_CASE("cli: --shuffle --seed is deterministic, thread-independent and a permutation") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 3, 10);
  auto conv = [&](const std::string& name, const std::string& extra) {
    auto r = Cli(fmt::format("convert {} wds:{} {}", Q(t / "in"), Q(t / (name + "-%06d.tar")), extra));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return ReadFile(t / (name + "-000000.tar"));
  };
  auto a = conv("a", "--shuffle --seed 5"), b = conv("b", "--shuffle --seed 5 --threads 4"),
       c = conv("c", "--shuffle --seed 6"), plain = conv("p", "");
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != plain);
  auto keys = [&](const std::string& addr) {
    std::vector<std::string> k;
    auto ds = shardkit::Open(addr);
    REQUIRE(ds.ok());
    auto rd = (*ds)->NewReader();
    REQUIRE(rd.ok());
    shardkit::Sample s;
    while (*(*rd)->Next(&s)) k.push_back(s.key);
    return k;
  };
  auto ka = keys("wds:" + (t / "a-000000.tar")), kp = keys("folder:" + (t / "in"));
  REQUIRE(ka.size() == 30);
  CHECK(ka != kp);
  auto perm = shardkit::ShufflePermutation(30, 5);
  for (size_t i = 0; i < 30; ++i) CHECK(ka[i] == kp[perm[i]]);
}

TEST_CASE("cli: a key with a dot is refused naming the key and --key-dots, replace maps it") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  MakeImageFolder(t / "in", 1, 2);
  WriteFile(t / "in/c0/v1.2.jpg", MakeJpeg(16, 16, 3));
  auto r = Cli(fmt::format("convert {} wds:{}", Q(t / "in"), Q(t / "o-%06d.tar")));
  ExpectError(r, "c0/v1.2");
  CHECK_THAT(r.err, Catch::Contains("--key-dots"));
  CHECK(!fs::exists(t / "o-000000.tar"));
  r = Cli(fmt::format("convert {} wds:{} --key-dots replace --json", Q(t / "in"), Q(t / "o-%06d.tar")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["samples"] == 3);
}

TEST_CASE("cli: a key that would escape the output folder is refused, nothing written outside") {
  if (!Ready("folder") || !Ready("wds")) return;
  TempDir t;
  auto mk = Run(fmt::format(
      "/usr/bin/python3 -c \"import tarfile,io,sys\n"
      "t=tarfile.open(sys.argv[1],'w')\n"
      "for n,d in [('ok/a.jpg',b'AAAA'),('../evil.jpg',b'EVIL')]:\n"
      "  i=tarfile.TarInfo(n); i.size=len(d); t.addfile(i,io.BytesIO(d))\n"
      "t.close()\" {}",
      Q(t / "bad.tar")));
  REQUIRE(mk.exit_code == 0);
  auto r = Cli(fmt::format("convert wds:{} folder:{}", Q(t / "bad.tar"), Q(t / "sub/out")));
  ExpectError(r, "evil");
  CHECK(!fs::exists(t / "sub/evil.jpg"));
  CHECK(!fs::exists(t / "sub/out"));
}

namespace {
// The base names of the files directly in `dir`.
std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}
}  // namespace

TEST_CASE("cli: --overwrite of a shard pattern removes the earlier write's extra shards and nothing else") {
  TempDir t;
  MakeImageFolder(t / "in", 2, 5);  // 10 samples
  struct Case {
    std::string pattern, manifest;
    std::vector<std::string> kept;  // after the second write, besides the manifest
  };
  for (const Case& c : {Case{"wds:" + (t / "w/t-%06d.tar"), "t.manifest.json", {"t-000000.tar", "t-000000.idx", "t-000000.tar.xxh3"}},
                        Case{"tfrecord:" + (t / "f/t-%05d.tfrecord"), "t.tfrecord.json", {"t-00000.tfrecord", "t-00000.idx"}},
                        Case{"recordio:" + (t / "r/t-%05d.rec"), "", {"t-00000.rec", "t-00000.idx", "t-00000.shardkit.json"}}}) {
    INFO(c.pattern);
    const std::string dir = fs::path(c.pattern.substr(c.pattern.find(':') + 1)).parent_path().string();
    auto first = Cli(fmt::format("convert {} {} --samples-per-shard 3", Q(t / "in"), Q(c.pattern)));
    INFO(first.out << first.err);
    REQUIRE(first.exit_code == 0);
    REQUIRE(Names(dir).size() > c.kept.size() + 3);  // 4 shards and the files beside them
    // Files of other names stay, even ones that look like a shard's.
    WriteFile(dir + "/notes.txt", "mine");
    WriteFile(dir + "/t-000003.txt", "mine too");
    auto second = Cli(fmt::format("convert {} {} --samples-per-shard 100 --overwrite", Q(t / "in"), Q(c.pattern)));
    INFO(second.out << second.err);
    REQUIRE(second.exit_code == 0);
    std::set<std::string> want(c.kept.begin(), c.kept.end());
    want.insert({"notes.txt", "t-000003.txt"});
    if (!c.manifest.empty()) want.insert(c.manifest);
    CHECK(Names(dir) == want);
  }
  // Part records of an earlier split write go too; a glob of the pattern finds one write.
  for (int i = 0; i < 2; ++i)
    REQUIRE(Cli(fmt::format("convert {} {} --samples-per-shard 2 --part {}/2", Q(t / "in"), Q("wds:" + (t / "p/t-%06d.tar")), i))
                .exit_code == 0);
  REQUIRE(Cli(fmt::format("convert {} {} --overwrite", Q(t / "in"), Q("wds:" + (t / "p/t-%06d.tar")))).exit_code == 0);
  CHECK(Names(t / "p") == std::set<std::string>{"t-000000.tar", "t-000000.idx", "t-000000.tar.xxh3", "t.manifest.json"});
  auto v = Cli("verify " + Q("wds:" + (t / "p/t-{000000..000009}.tar")));
  CHECK(v.exit_code != 0);  // the old shards are gone, so the range names missing files
  auto one = Cli("info " + Q(t / "p/t-000000.tar"));
  CHECK_THAT(one.out, Catch::Contains("samples: 10"));
}

TEST_CASE("cli: an empty source is an error unless --allow-empty") {
  TempDir t;
  fs::create_directories(t / "empty/a");
  auto r = Cli(fmt::format("convert {} {}", Q(t / "empty"), Q("wds:" + (t / "o/x-%06d.tar"))));
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("holds no samples") && Catch::Contains("--allow-empty"));
  CHECK_FALSE(fs::exists(t / "o/x.manifest.json"));
  auto ok = Cli(fmt::format("convert {} {} --allow-empty", Q(t / "empty"), Q("wds:" + (t / "o/x-%06d.tar"))));
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(fs::exists(t / "o/x.manifest.json"));
}

TEST_CASE("cli: class folders take image files only, report the rest, name bad images, folder.files=all keeps all") {
  TempDir t;
  MakeImageFolder(t / "in", 2, 3);  // 6 samples in class folders
  const std::string cls = fs::path(*fs::directory_iterator(t / "in")).string();
  WriteFile(cls + "/Thumbs.db", "not an image");
  WriteFile(cls + "/notes.txt", "words");
  // The default: torchvision's ImageFolder's choice, reported.
  auto r = Cli(fmt::format("convert {} {} --json", Q(t / "in"), Q(t / "o.lmdb")));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["samples"] == 6);
  REQUIRE(j["notes"].size() == 1);
  CHECK_THAT(j["notes"][0].get<std::string>(), Catch::Contains("left out 2 file(s)") && Catch::Contains("Thumbs.db") &&
                                                   Catch::Contains("folder.files=all"));
  // folder.files=all keeps them as samples (folders of mixed samples).
  auto all = Cli(fmt::format("convert {} {} --json --source-option folder.files=all", Q(t / "in"), Q(t / "all.lmdb")));
  INFO(all.err);
  REQUIRE(all.exit_code == 0);
  CHECK(nlohmann::json::parse(all.out)["samples"] == 8);
  // A zero-byte .jpg and a text file named .jpg fail the conversion, naming the file.
  for (const char* bad : {"", "hello, not a JPEG"}) {
    WriteFile(cls + "/zz.jpg", bad);
    auto b = Cli(fmt::format("convert {} {} --overwrite", Q(t / "in"), Q(t / "b.lmdb")));
    INFO(b.err);
    CHECK(b.exit_code == 1);
    CHECK_THAT(b.err, Catch::Contains("zz.jpg") &&
                          Catch::Contains(std::string(bad).empty() ? "empty image file" : "not an image file") &&
                          Catch::Contains("folder.files=all"));
    CHECK_FALSE(fs::exists(t / "b.lmdb"));
  }
}

TEST_CASE("cli: a folder holding shards is refused with the address to open, usage errors exit 2") {
  TempDir t;
  MakeImageFolder(t / "in", 2, 3);
  REQUIRE(Cli(fmt::format("convert {} {}", Q(t / "in"), Q("wds:" + (t / "out/train-%06d.tar")))).exit_code == 0);
  for (const char* cmd : {"info", "bench"}) {
    auto r = Cli(fmt::format("{} {}", cmd, Q(t / "out")));
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("holds datasets, not an image folder") &&
                          Catch::Contains((t / "out/train.manifest.json")));
  }
  // Messages and exit codes of bad values.
  auto zero = Cli(fmt::format("shard {} {} --num-shards 0", Q(t / "in"), Q(t / "s/x-%06d.tar")));
  CHECK(zero.exit_code == 2);
  CHECK_THAT(zero.err, Catch::Contains("must be at least 1, got 0"));
  auto spp = Cli(fmt::format("convert {} {} --samples-per-shard 0", Q(t / "in"), Q(t / "s/x-%06d.tar")));
  CHECK(spp.exit_code == 2);
  CHECK_THAT(spp.err, Catch::Contains("must be at least 1"));
  auto tiny = Cli(fmt::format("convert {} {} --shard-size 1", Q(t / "in"), Q("wds:" + (t / "s/x-%06d.tar"))));
  CHECK(tiny.exit_code == 1);
  CHECK_THAT(tiny.err, Catch::Contains("at least 1024 bytes"));
  auto scheme = Cli(fmt::format("convert {} wsd:{}", Q(t / "in"), Q(t / "s")));
  CHECK(scheme.exit_code == 2);
  CHECK_THAT(scheme.err, Catch::Contains("unknown scheme 'wsd:'"));
  auto threads = Cli(fmt::format("convert {} {} --threads 0 --json", Q(t / "in"), Q(t / "t.lmdb")));
  INFO(threads.err);
  CHECK(threads.exit_code == 0);
  CHECK(nlohmann::json::parse(threads.out)["samples"] == 6);
}

TEST_CASE("convert's per-format flags are made from the formats' option tables", "[cli]") {
  RunResult help = Cli("convert --help");
  REQUIRE(help.exit_code == 0);
  for (const shardkit::FormatOption& o : shardkit::FormatOptions()) {
    if (!o.write) continue;  // the readers' are --source-option KEY=VALUE
    std::string flag = "--" + o.format + "-" + o.name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    INFO(flag);
    CHECK_THAT(help.out, Catch::Contains(flag));
  }
  // A flag reaches the writer; a value outside the table's choices is a usage error.
  TempDir t;
  MakeImageFolder(t / "src", 2, 2, 3);
  RunResult ok = Cli("convert " + Q(t / "src") + " " + Q("lmdb:" + (t / "c.lmdb")) + " --lmdb-layout caffe");
  INFO(ok.err);
  REQUIRE(ok.exit_code == 0);
  RunResult info = Cli("info " + Q(t / "c.lmdb"));
  CHECK_THAT(info.out, Catch::Contains("caffe"));
  RunResult bad = Cli("convert " + Q(t / "src") + " " + Q("lmdb:" + (t / "d.lmdb")) + " --lmdb-layout nope");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("--lmdb-layout"));

  // The readers' tables: --source-option's help lists them, Open() checks a format's own
  // keys (unknown name, value outside the choices) and leaves other formats' keys alone.
  size_t readers = 0;
  for (const shardkit::FormatOption& o : shardkit::FormatOptions()) {
    if (o.write) continue;
    ++readers;
    INFO(o.key());
    CHECK_THAT(help.out, Catch::Contains(o.key() + "="));
  }
  CHECK(readers >= 10);
  CHECK_THAT(help.out, Catch::Contains("wds.channels=bgr|rgb|bgr-to-rgb"));
  shardkit::OpenOptions unknown;
  unknown.format_options["folder.nope"] = "1";
  auto u = shardkit::Open("folder:" + (t / "src"), unknown);
  REQUIRE_FALSE(u.ok());
  CHECK_THAT(u.status().message(), Catch::Contains("unknown option 'folder.nope' of the folder reader") &&
                                       Catch::Contains("folder.files") && Catch::Contains("folder.channels"));
  shardkit::OpenOptions outside;
  outside.format_options["folder.files"] = "some";
  auto o2 = shardkit::Open("folder:" + (t / "src"), outside);
  REQUIRE_FALSE(o2.ok());
  CHECK_THAT(o2.status().message(), Catch::Contains("folder.files 'some': not one of 'images', 'all'"));
  shardkit::OpenOptions other;
  other.format_options["hdf5.order"] = "nchw";  // another format's key: not this reader's business
  CHECK(shardkit::Open("folder:" + (t / "src"), other).ok());
  RunResult src_bad = Cli("verify " + Q(t / "src") + " --source-option folder.nope=1");
  CHECK(src_bad.exit_code == 1);
  CHECK_THAT(src_bad.err, Catch::Contains("folder.nope"));
}
