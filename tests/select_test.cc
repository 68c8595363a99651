// Choosing samples at conversion (pipeline/select.h): --select classes / keys-from /
// fraction and --dedup through Convert() and Shard() and the command, read back with
// Open(); parts against one process byte for byte; verify --duplicates.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "shardkit/convert.h"
#include "shardkit/dataset.h"
#include "support.h"

using namespace sk_test;
namespace fs = std::filesystem;

namespace {

// The output's samples, in order: key -> image bytes.
std::vector<std::pair<std::string, std::string>> ReadBack(const std::string& address) {
  auto d = shardkit::Open(address);
  REQUIRE(d.ok());
  auto r = (*d)->NewReader();
  REQUIRE(r.ok());
  std::vector<std::pair<std::string, std::string>> out;
  shardkit::Sample s;
  for (;;) {
    auto more = (*r)->Next(&s);
    REQUIRE(more.ok());
    if (!*more) break;
    const shardkit::Field* f = s.image();
    out.emplace_back(s.key, f ? std::string(f->data.view()) : std::string());
  }
  return out;
}

std::vector<std::string> Keys(const std::vector<std::pair<std::string, std::string>>& v) {
  std::vector<std::string> k;
  for (auto& [key, bytes] : v) k.push_back(key);
  return k;
}

// A folder of 2 classes x 6 images, then copies: c1/dupA repeats c0/img1's bytes,
// c1/dupB and c0/zdup repeat c0/img3's (two duplicates of one original).
std::string FolderWithDuplicates(const TempDir& t) {
  const std::string root = t / "src";
  MakeImageFolder(root, 2, 6, 7);
  std::vector<std::string> c0;
  for (auto& e : fs::directory_iterator(root + "/c0")) c0.push_back(e.path().filename().string());
  std::sort(c0.begin(), c0.end());
  REQUIRE(c0.size() == 6);
  fs::copy_file(root + "/c0/" + c0[1], root + "/c1/dupA.JPEG");
  fs::copy_file(root + "/c0/" + c0[3], root + "/c1/dupB.JPEG");
  fs::copy_file(root + "/c0/" + c0[3], root + "/c0/zdup.JPEG");
  return root;
}

}  // namespace

TEST_CASE("select: --dedup drops repeated image bytes in source order and lists them in duplicates.json", "[select]") {
  TempDir t;
  const std::string src = FolderWithDuplicates(t);
  const auto all = ReadBack(src);
  REQUIRE(all.size() == 15);
  shardkit::ConvertOptions o;
  o.dedup = true;
  auto r = shardkit::Convert(src, "wds:" + t / "out/t-%03d.tar", o);
  REQUIRE(r.ok());
  CHECK(r->samples == 12);
  CHECK(r->source_samples == 15);
  CHECK(r->duplicates == 3);
  CHECK(r->duplicates_file == t / "out/duplicates.json");
  // What is left: the source minus each sample whose bytes an earlier one had.
  std::vector<std::string> expect;
  std::map<std::string, std::string> first;  // bytes -> key
  std::vector<std::pair<std::string, std::string>> dropped;
  for (auto& [k, b] : all) {
    auto [it, fresh] = first.emplace(b, k);
    if (fresh) expect.push_back(k);
    else dropped.emplace_back(k, it->second);
  }
  CHECK(Keys(ReadBack(t / "out/t.manifest.json")) == expect);
  auto j = nlohmann::json::parse(ReadFile(t / "out/duplicates.json"));
  REQUIRE(j["dropped"].size() == dropped.size());
  for (size_t i = 0; i < dropped.size(); ++i) {
    CHECK(j["dropped"][i]["key"] == dropped[i].first);
    CHECK(j["dropped"][i]["duplicate_of"] == dropped[i].second);
  }
  CHECK(j["kept"] == 12);
  // Dedup's choice is the same in any output format, beside it as OUTPUT.duplicates.json.
  REQUIRE(shardkit::Convert(src, "lmdb:" + t / "o.lmdb", o).ok());
  CHECK(Keys(ReadBack(t / "o.lmdb")) == expect);
  CHECK(fs::exists(t / "o.lmdb.duplicates.json"));
  // verify --duplicates lists the same pairs in the source and none in the output, and
  // passes both: duplicates are not damage.
  auto v = Cli("verify " + Q(src) + " --duplicates --json");
  INFO(v.err);
  CHECK(v.exit_code == 0);
  auto jv = nlohmann::json::parse(v.out);
  REQUIRE(jv["duplicate_images"].size() == dropped.size());
  for (size_t i = 0; i < dropped.size(); ++i) {
    CHECK(jv["duplicate_images"][i]["key"] == dropped[i].first);
    CHECK(jv["duplicate_images"][i]["duplicate_of"] == dropped[i].second);
  }
  auto vo = Cli("verify " + Q(t / "out/t.manifest.json") + " --duplicates");
  CHECK(vo.exit_code == 0);
  CHECK_THAT(vo.out, Catch::Contains("duplicates: 0 samples"));
}

TEST_CASE("select: classes, keys-from and fraction choose in source order, fraction exactly and by seed", "[select]") {
  TempDir t;
  const std::string src = t / "src";
  MakeImageFolder(src, 3, 10, 3);
  const auto all = Keys(ReadBack(src));
  REQUIRE(all.size() == 30);
  auto keys_of = [&](const std::string& select, uint64_t seed, const std::string& name) {
    shardkit::ConvertOptions o;
    o.select = select;
    o.seed = seed;
    auto r = shardkit::Convert(src, "wds:" + t / (name + "/x-%02d.tar"), o);
    INFO(select << ": " << (r.ok() ? "" : r.status().ToString()));
    REQUIRE(r.ok());
    CHECK(r->source_samples == 30);
    return Keys(ReadBack(t / (name + "/x.manifest.json")));
  };
  SECTION("classes by name and by label number") {
    auto k = keys_of("classes=c0,2", 0, "cls");
    std::vector<std::string> want;
    for (auto& key : all)
      if (key.rfind("c0/", 0) == 0 || key.rfind("c2/", 0) == 0) want.push_back(key);
    CHECK(k == want);
    shardkit::ConvertOptions o;
    o.select = "classes=bird";
    auto bad = shardkit::Convert(src, "wds:" + t / "bad/x-%02d.tar", o);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("'bird'") && Catch::Contains("c0, c1, c2"));
    CHECK_FALSE(fs::exists(t / "bad/x.manifest.json"));
  }
  SECTION("keys-from counts the keys the source lacks") {
    WriteFile(t / "keys.txt", all[7] + "\n  " + all[2] + "  \r\n\nnot/there\n" + all[7] + "\n");
    shardkit::ConvertOptions o;
    o.select = "keys-from=" + t / "keys.txt";
    auto r = shardkit::Convert(src, "wds:" + t / "k/x-%02d.tar", o);
    REQUIRE(r.ok());
    CHECK(Keys(ReadBack(t / "k/x.manifest.json")) == std::vector<std::string>{all[2], all[7]});
    REQUIRE(r->notes.size() == 1);
    CHECK_THAT(r->notes[0], Catch::Contains("1 of the 3 keys"));
  }
  SECTION("fraction: exactly round(F * n), a subset in source order, the same for the same seed") {
    auto a = keys_of("fraction=0.3", 5, "a"), b = keys_of("fraction=0.3", 5, "b"), c = keys_of("fraction=0.3", 6, "c");
    CHECK(a.size() == 9);
    CHECK(a == b);
    CHECK(a != c);
    CHECK(std::is_sorted(a.begin(), a.end(), [&](const std::string& x, const std::string& y) {
      return std::find(all.begin(), all.end(), x) < std::find(all.begin(), all.end(), y);
    }));
    CHECK(keys_of("fraction=1", 5, "d") == all);
  }
  SECTION("--shuffle writes a permutation of the selection") {
    shardkit::ConvertOptions o;
    o.select = "fraction=0.5";
    o.seed = 9;
    o.shuffle = true;
    REQUIRE(shardkit::Convert(src, "wds:" + t / "s/x-%02d.tar", o).ok());
    auto shuffled = Keys(ReadBack(t / "s/x.manifest.json"));
    auto plain = keys_of("fraction=0.5", 9, "p");
    CHECK(shuffled != plain);
    std::sort(shuffled.begin(), shuffled.end());
    std::sort(plain.begin(), plain.end());
    CHECK(shuffled == plain);
  }
}

TEST_CASE("select: parts of a conversion with --select and --dedup equal one process byte for byte", "[select]") {
  TempDir t;
  const std::string src = FolderWithDuplicates(t);
  // Shuffled, both choose before the write. In source order one process drops the
  // duplicates in its own read (one pass; --threads 1 reads in order, 2 by index) and
  // the parts before it: the same samples either way.
  for (std::string order : {"--shuffle", "--threads 1", "--threads 2"}) {
    INFO(order);
    const std::string flags = "--select fraction=0.8 --seed 4 --dedup --samples-per-shard 3 " + order;
    const std::string dir = t / ("x" + std::to_string(order.size()) + order.substr(order.size() - 1));
    auto one = Cli(fmt::format("shard {} {} {}", Q(src), Q(dir + "/one/t-%03d.tar"), flags));
    INFO(one.err);
    REQUIRE(one.exit_code == 0);
    for (int i = 0; i < 3; ++i) {
      auto p = Cli(fmt::format("shard {} {} {} --part {}/3", Q(src), Q(dir + "/parts/t-%03d.tar"), flags, i));
      INFO(p.err);
      REQUIRE(p.exit_code == 0);
    }
    auto m = Cli("merge " + Q(dir + "/parts/t-%03d.tar"));
    INFO(m.err);
    REQUIRE(m.exit_code == 0);
    std::set<std::string> names;
    for (auto& e : fs::directory_iterator(dir + "/one")) names.insert(e.path().filename().string());
    CHECK(names.count("duplicates.json") == 1);
    CHECK(nlohmann::json::parse(ReadFile(dir + "/one/duplicates.json"))["dropped"].size() > 0);
    for (const auto& name : names) {
      INFO(name);
      REQUIRE(fs::exists(dir + "/parts/" + name));
      CHECK(ReadFile(dir + "/one/" + name) == ReadFile(dir + "/parts/" + name));
    }
  }
  // Parts with another selection are refused by merge (the plan records it).
  TempDir u;
  for (int i = 0; i < 2; ++i)
    REQUIRE(Cli(fmt::format("shard {} {} --samples-per-shard 3 --part {}/2 {}", Q(src), Q(u / "x/t-%03d.tar"), i,
                            i == 0 ? "--dedup" : ""))
                .exit_code == 0);
  auto bad = Cli("merge " + Q(u / "x/t-%03d.tar"));
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("not run with the same flags"));
}

TEST_CASE("select: the command refuses a malformed --select and --seed without a use", "[select]") {
  TempDir t;
  MakeImageFolder(t / "src", 1, 2, 1);
  for (const char* bad : {"bogus", "fraction=0", "fraction=1.5", "fraction=x", "classes=", "classes=a,,b", "keys-from=",
                          "colour=red"}) {
    auto r = Cli(fmt::format("convert {} {} --select {}", Q(t / "src"), Q(t / "o/x-%02d.tar"), Q(bad)));
    INFO(bad << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("--select"));
  }
  auto seed = Cli(fmt::format("convert {} {} --seed 3", Q(t / "src"), Q(t / "o/x-%02d.tar")));
  CHECK(seed.exit_code == 2);
  CHECK_THAT(seed.err, Catch::Contains("--seed requires --shuffle"));
  auto missing = Cli(fmt::format("convert {} {} --select keys-from={}", Q(t / "src"), Q(t / "o/x-%02d.tar"),
                                 Q(t / "nope.txt")));
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.err, Catch::Contains("nope.txt"));
  CHECK_FALSE(fs::exists(t / "o/x.manifest.json"));
}

TEST_CASE("select: verify --against chooses from the source as the record says, and reads skipped.json", "[select][verify]") {
  TempDir t;
  const std::string src = FolderWithDuplicates(t);
  auto conv = Cli(fmt::format("convert {} {} --select fraction=0.7 --seed 2 --dedup", Q(src),
                              Q("wds:" + t / "a/t-%03d.tar")));
  INFO(conv.err);
  REQUIRE(conv.exit_code == 0);
  auto v = Cli(fmt::format("verify {} --against {}", Q(t / "a/t.manifest.json"), Q(src)));
  INFO(v.out);
  CHECK(v.exit_code == 0);
  CHECK_THAT(v.out, Catch::Contains("chosen alike") && Catch::Contains("result: intact"));
  // The same output against the whole source, when the record is not there to say so,
  // misses samples: take it out of the manifest.
  auto m = nlohmann::json::parse(ReadFile(t / "a/t.manifest.json"));
  REQUIRE(m.contains("transform"));
  CHECK(m["transform"]["select"] == "fraction=0.7");
  CHECK(m["transform"]["dedup"] == true);
  m.erase("transform");
  WriteFile(t / "a/t.manifest.json", m.dump());
  auto bare = Cli(fmt::format("verify {} --against {}", Q(t / "a/t.manifest.json"), Q(src)));
  CHECK(bare.exit_code != 0);
  CHECK_THAT(bare.out, Catch::Contains("missing"));
  // --skip-bad: the samples it left out are listed, not findings; with the list gone,
  // they are.
  WriteFile(src + "/c1/broken.JPEG", std::string("\xFF\xD8\xFF\xE0 not a jpeg", 16));
  auto sk = Cli(fmt::format("convert {} {} --resize short:8 --skip-bad", Q(src), Q("wds:" + t / "b/t-%03d.tar")));
  INFO(sk.err);
  REQUIRE(sk.exit_code == 0);
  REQUIRE(fs::exists(t / "b/skipped.json"));
  auto vs = Cli(fmt::format("verify {} --against {}", Q(t / "b/t.manifest.json"), Q(src)));
  INFO(vs.out);
  CHECK(vs.exit_code == 0);
  CHECK_THAT(vs.out, Catch::Contains("left out by --skip-bad"));
  fs::remove(t / "b/skipped.json");
  auto gone = Cli(fmt::format("verify {} --against {}", Q(t / "b/t.manifest.json"), Q(src)));
  CHECK(gone.exit_code != 0);
  CHECK_THAT(gone.out, Catch::Contains("cannot be read") && Catch::Contains("c1/broken"));
}
