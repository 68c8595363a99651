// Confinement (issue 37, docs/reliability.md "Confinement"): every file a dataset
// description names resolves inside the dataset's own directory. Each rule is tried on
// each format that reads a list of files (the tar-shard manifest, the TFRecord manifest,
// MDS index.json) through the CLI: the exit status is 1, the error names the manifest,
// the entry and the rule, and no byte of the file outside (its sample keys carry a
// marker) reaches any output or message. The remote rules (HTTP, S3) are in
// remote_test.cc, beside the servers.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/paths.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kMarker = "TOPSECRETMARKER";

json ReadJson(const std::string& p) { return json::parse(ReadFile(p)); }
void WriteJson(const std::string& p, const json& j) { WriteFile(p, j.dump(1)); }

// `root`/TOPSECRETMARKERclass/TOPSECRETMARKER<i>.jpg: a folder whose every key holds the marker.
void MakeSecretFolder(const std::string& root, int n) {
  fs::create_directories(root + "/" + kMarker + "class");
  for (int i = 0; i < n; ++i)
    WriteFile(fmt::format("{}/{}class/{}{}.jpg", root, kMarker, kMarker, i), MakeJpeg(16, 16, 100 + i));
}

// Every file below `dir` whose bytes hold the marker.
std::vector<std::string> FilesWithMarker(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && ReadFile(e.path().string()).find(kMarker) != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

// The dataset at `address` (whose description is `manifest`) is refused by info, verify
// and convert with exit status 1, an error naming the manifest, `entry` and `rule`, and
// no trace of the marker anywhere.
void CheckRefused(const TempDir& t, const std::string& address, const std::string& manifest, const std::string& entry,
                  const std::string& rule, bool trustable = true) {
  int n = 0;
  for (std::string cmd : {"info", "verify", "convert"}) {
    std::string out = t / fmt::format("out{}", n++);
    std::string args = cmd + " " + Q(address);
    if (cmd == "convert") args += " " + Q(out + "/x-%06d.tar");
    RunResult r = Cli(args);
    INFO(cmd << " " << entry << "\n" << r.out << r.err);
    CHECK(r.exit_code == 1);
    const std::string all = r.out + r.err;
    CHECK(all.find(kMarker) == std::string::npos);
    CHECK(all.find("error: invalid argument") != std::string::npos);
    CHECK(all.find(fs::path(manifest).filename().string()) != std::string::npos);
    CHECK(all.find("'" + entry + "' is refused") != std::string::npos);
    CHECK(all.find(rule) != std::string::npos);
    CHECK((all.find("--trust-manifest") != std::string::npos) == trustable);
    CHECK(FilesWithMarker(out).empty());
  }
}

struct Hostile {
  std::string entry;
  std::string rule;
};

// Entries that name the outside shard `outside` (an absolute path) from `dsdir`, each
// with the words of the rule that refuses it.
std::vector<Hostile> HostileEntries(const std::string& dsdir, const std::string& outside) {
  const std::string rel = fs::relative(outside, dsdir).string();  // "../outside/..."
  std::vector<Hostile> h = {
      {outside, "an absolute path"},
      {rel, "'..' climbs out"},
      {"sub/../../" + rel.substr(3), "'..' climbs out"},
      {"./" + rel, "'..' climbs out"},
      {"file://" + outside, "another location"},
      {"http://127.0.0.1:9/" + rel, "another location"},
      {"pipe:cat " + outside, "may not name a command"},
      {"link.shard", "symbolic link"},
      {"x.bin::" + rel, "'..' climbs out"},
      {"../x-{0..0}.bin", "'..' climbs out"},
      {"x-{000000..000001}.bin", "names 2 files"},
      {"", "it is empty"},
  };
  fs::create_symlink(outside, dsdir + "/link.shard");
  return h;
}

}  // namespace

TEST_CASE("confine: the rules, entry by entry (paths::Confinement)") {
  TempDir t;
  fs::create_directories(t / "ds/sub");
  WriteFile(t / "ds/a.tar", "a");
  WriteFile(t / "outside.tar", kMarker);
  fs::create_symlink(t / "outside.tar", t / "ds/out.tar");
  fs::create_symlink(t / "ds/a.tar", t / "ds/in.tar");  // an absolute link that stays inside
  const paths::Confinement c(t / "ds/train.manifest.json", false);
  CHECK(*c.Resolve("a.tar", "shards[0].path") == t / "ds/a.tar");
  CHECK(*c.Resolve("./sub/../a.tar", "s") == t / "ds/a.tar");
  CHECK(*c.Resolve("sub//b.tar", "s") == t / "ds/sub/b.tar");  // need not exist yet
  CHECK(*c.Resolve("in.tar", "s") == t / "ds/in.tar");
  CHECK(*c.Resolve("a-{000000..000000}.tar", "s") == t / "ds/a-000000.tar");
  for (const char* bad : {"/etc/passwd", "../outside.tar", "sub/../../outside.tar", "file:///etc/passwd",
                          "FILE:/etc/passwd", "s3://bucket/x", "http://h/x", "pipe:cat /etc/passwd", "out.tar",
                          "{a.tar,../outside.tar}", "a-{0..1}.tar", "", ".", "sub/..", "a.tar::../outside.tar",
                          "a-{0..9999999}{0..9999999}{0..9999999}.tar", "a-{0..99999999999999999999}.tar"}) {
    auto r = c.Resolve(bad, "shards[3].path");
    INFO("entry '" << bad << "': " << (r.ok() ? *r : r.status().ToString()));
    REQUIRE(!r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    CHECK((r.status().detail() == Detail::kOutsideDataset));
    CHECK(r.status().where().file == t / "ds/train.manifest.json");
    CHECK(r.status().ToString().find("shards[3].path") != std::string::npos);
    CHECK(r.status().ToString().find(kMarker) == std::string::npos);
  }
  // Trusted: as written, relative to the manifest's directory or absolute; never a command.
  const paths::Confinement trusted(t / "ds/train.manifest.json", true);
  CHECK(*trusted.Resolve("../outside.tar", "s") == t / "ds/../outside.tar");
  CHECK(*trusted.Resolve(t / "outside.tar", "s") == t / "outside.tar");
  CHECK(*trusted.Resolve("out.tar", "s") == t / "ds/out.tar");
  CHECK(!trusted.Resolve("pipe:cat /etc/passwd", "s").ok());

  // Remote descriptions: the same scheme, host and port (bucket), under the prefix.
  const paths::Confinement h("http://127.0.0.1:8000/data/v1/train.manifest.json?sig=1", false);
  CHECK(*h.Resolve("train-000000.tar", "s") == "http://127.0.0.1:8000/data/v1/train-000000.tar");
  CHECK(*h.Resolve("a/../b.tar", "s") == "http://127.0.0.1:8000/data/v1/b.tar");
  for (const char* bad : {"../v2/x.tar", "/data/v1/x.tar", "http://127.0.0.1:8001/data/v1/x.tar",
                          "https://127.0.0.1:8000/data/v1/x.tar", "file:///etc/passwd", "%2e%2e/x.tar", "x.tar?a=b",
                          "x.tar#f", "..\\x.tar"})
    CHECK((h.Resolve(bad, "s").status().detail() == Detail::kOutsideDataset));
  const paths::Confinement s3("s3://bucket/pre/fix/train.manifest.json", false);
  CHECK(*s3.Resolve("t.tar", "s") == "s3://bucket/pre/fix/t.tar");
  for (const char* bad : {"s3://other/pre/fix/t.tar", "s3://bucket/pre/fix/t.tar", "../t.tar", "/pre/fix/t.tar"})
    CHECK((s3.Resolve(bad, "s").status().detail() == Detail::kOutsideDataset));
  const paths::Confinement s3t("s3://bucket/pre/fix/train.manifest.json", true);
  CHECK(*s3t.Resolve("/other/t.tar", "s") == "s3://bucket/other/t.tar");
  CHECK(*s3t.Resolve("../t.tar", "s") == "s3://bucket/pre/t.tar");
  CHECK(*s3t.Resolve("s3://other/k/./a/../t.tar", "s") == "s3://other/k/t.tar");
  CHECK((s3t.Resolve("../../../t.tar", "s").status().detail() == Detail::kOutsideDataset));
}

// Writes a secret dataset to `outside` and a good one to `inside` (patterns under t),
// then points the good manifest's one shard at the secret shard by every hostile
// entry in turn and checks each is refused (CheckRefused). Returns the manifest path,
// left holding the last hostile entry.
std::string RefuseEveryRule(TempDir& t, const std::string& outside, const std::string& outside_shard,
                            const std::string& inside, const std::string& manifest_rel) {
  MakeSecretFolder(t / "secret", 3);
  REQUIRE(Cli("convert " + Q(t / "secret") + " " + Q(t / outside)).exit_code == 0);
  MakeImageFolder(t / "src", 2, 3);
  REQUIRE(Cli("convert " + Q(t / "src") + " " + Q(t / inside)).exit_code == 0);
  const std::string manifest = t / manifest_rel;
  const json good = ReadJson(manifest);
  REQUIRE(good["shards"].size() == 1);
  for (const auto& h : HostileEntries(fs::path(manifest).parent_path().string(), t / outside_shard)) {
    json j = good;
    j["shards"][0]["path"] = h.entry;
    WriteJson(manifest, j);
    CheckRefused(t, manifest, manifest, h.entry, h.rule);
  }
  WriteJson(manifest, good);
  return manifest;
}

TEST_CASE("confine: a tar-shard manifest naming files outside its directory is refused, per rule") {
  TempDir t;
  const std::string manifest =
      RefuseEveryRule(t, "outside/s-%06d.tar", "outside/s-000000.tar", "ds/train-%06d.tar", "ds/train.manifest.json");
  const json good = ReadJson(manifest);
  // A second shard that is fine does not let a bad first one through, and the index of
  // the bad one is named.
  json two = good;
  two["shards"].push_back(good["shards"][0]);
  two["shards"][1]["path"] = "../outside/s-000000.tar";
  WriteJson(manifest, two);
  RunResult r = Cli("verify " + Q(manifest));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("shards[1].path") != std::string::npos);
}

TEST_CASE("confine: --trust-manifest (and trust_manifest) reads shards shared by sibling manifests") {
  TempDir t;
  MakeImageFolder(t / "src", 2, 4);
  REQUIRE(Cli("convert " + Q(t / "src") + " " + Q(t / "shared/train-%06d.tar") + " --samples-per-shard 3").exit_code == 0);
  // A second manifest in a sibling folder names the shared shards with "../shared/".
  json j = ReadJson(t / "shared/train.manifest.json");
  for (auto& s : j["shards"]) s["path"] = "../shared/" + s["path"].get<std::string>();
  fs::create_directories(t / "view");
  WriteJson(t / "view/train.manifest.json", j);
  const std::string view = t / "view/train.manifest.json";
  CHECK(Cli("verify " + Q(view)).exit_code == 1);
  RunResult v = Cli("verify --trust-manifest " + Q(view));
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
  RunResult c = Cli("convert --trust-manifest " + Q(view) + " " + Q("folder:" + (t / "back")));
  INFO(c.out << c.err);
  CHECK(c.exit_code == 0);
  CHECK(Cli("verify " + Q("folder:" + (t / "back"))).exit_code == 0);
  // The library: OpenOptions::trust_manifest.
  CHECK((Open(view).status().detail() == Detail::kOutsideDataset));
  OpenOptions o;
  o.trust_manifest = true;
  auto ds = Open(view, o);
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 8u);
  // Trust never runs a command.
  j["shards"][0]["path"] = "pipe:cat " + (t / "shared/train-000000.tar");
  WriteJson(view, j);
  CHECK(Cli("verify --trust-manifest " + Q(view)).exit_code == 1);
}

TEST_CASE("confine: a TFRecord manifest naming files outside its directory is refused, per rule") {
  TempDir t;
  RefuseEveryRule(t, "outside/s-%05d.tfrecord", "outside/s-00000.tfrecord", "ds/train-%05d.tfrecord",
                  "ds/train.tfrecord.json");
}

TEST_CASE("confine: an MDS index.json whose shard is a symbolic link out of the directory is refused") {
  TempDir t;
  MakeSecretFolder(t / "secret", 3);
  REQUIRE(Cli("convert " + Q(t / "secret") + " " + Q("mds:" + (t / "outside"))).exit_code == 0);
  MakeImageFolder(t / "src", 2, 3);
  REQUIRE(Cli("convert " + Q(t / "src") + " " + Q("mds:" + (t / "ds"))).exit_code == 0);
  const json good = ReadJson(t / "ds/index.json");
  const std::string shard = good["shards"][0]["raw_data"]["basename"];
  // The shard file replaced by a link to the outside dataset's shard (same name).
  fs::remove(t / ("ds/" + shard));
  fs::create_symlink(t / ("outside/" + shard), t / ("ds/" + shard));
  CheckRefused(t, "mds:" + (t / "ds"), t / "ds/index.json", shard, "symbolic link", /*trustable=*/false);
  // MDS is never trusted (Streaming's writers put every shard below index.json).
  CHECK(Cli("verify --trust-manifest " + Q("mds:" + (t / "ds"))).exit_code == 1);
  // '..' and absolute basenames: refused as not inside the dataset directory.
  fs::remove(t / ("ds/" + shard));
  for (std::string bad : {"../outside/" + shard, t / ("outside/" + shard)}) {
    json j = good;
    j["shards"][0]["raw_data"]["basename"] = bad;
    WriteJson(t / "ds/index.json", j);
    RunResult r = Cli("verify " + Q("mds:" + (t / "ds")));
    INFO(r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK((r.out + r.err).find(kMarker) == std::string::npos);
    CHECK((r.out + r.err).find("'" + bad + "' is not a relative path inside the dataset directory") != std::string::npos);
  }
}

TEST_CASE("manifests: a count that is a float or negative is refused naming the member (fuzz_manifest finding)") {
  TempDir t;
  MakeImageFolder(t / "src", 1, 2);
  REQUIRE(Cli("convert " + Q(t / "src") + " " + Q(t / "w/train-%06d.tar")).exit_code == 0);
  REQUIRE(Cli("convert " + Q(t / "src") + " " + Q(t / "f/train-%05d.tfrecord")).exit_code == 0);
  for (std::string manifest : {t / "w/train.manifest.json", t / "f/train.tfrecord.json"}) {
    const json good = ReadJson(manifest);
    for (const char* bad : {"2.0e88", "-1", "1.5"}) {
      json j = good;
      j["shards"][0]["bytes"] = json::parse(bad);
      WriteJson(manifest, j);
      RunResult r = Cli("info " + Q(manifest));
      INFO(manifest << " bytes " << bad << ": " << r.out << r.err);
      CHECK(r.exit_code == 1);
      CHECK(r.err.find("bytes is not a count") != std::string::npos);
    }
    // A "format" that is not a string (fuzz_manifest: an uncaught exception before).
    json j = good;
    j["format"] = 1;
    WriteJson(manifest, j);
    RunResult r = Cli("info " + Q(manifest));
    INFO(r.out << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("shardkit: error:") != std::string::npos);
  }
}
