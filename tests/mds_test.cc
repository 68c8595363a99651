// The mds format: MosaicML Streaming's index.json + shard.NNNNN.mds, written and
// read byte for byte as streaming's MDSWriter/MDSReader do (facts:
// docs/formats-mds.md), hashes and sizes checked, hostile shards refused with
// the file and offset named. The independent client (a writer and reader made
// from the spec in Python) is python/tests/test_mds.py.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>

#include "io/file.h"
#include "formats/mds/mds.h"
#include "formats/registry.h"
#include "shardkit/shardkit.h"
#include "support.h"
#include "read_all.h"

using namespace shardkit;
using namespace sk_test;
using json = nlohmann::json;

namespace {

std::vector<Sample> Fixture(int n = 10) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("k/{:03d}", i);
    s.set("jpg", Bytes::Copy(MakeJpeg(16 + i, 16, uint32_t(i))));
    s.set_label(i % 3);
    s.set("json", Bytes::Copy(fmt::format("{{\"i\": {}}}", i)));
    s.set("txt", Bytes::Copy(fmt::format("caption {}", i)));
    s.set("seg.png", Bytes::Copy(MakePng(8, 8, uint32_t(i))));
    out.push_back(std::move(s));
  }
  return out;
}

WriteSummary WriteAll(const std::string& addr, const std::vector<Sample>& v, WriteOptions wo = {}) {
  auto w = Create(addr, wo);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  for (const auto& s : v) {
    Status st = (*w)->Write(s);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  auto sum = (*w)->Finish();
  INFO(sum.status().ToString());
  REQUIRE(sum.ok());
  return *sum;
}

std::vector<Sample> ReadAll(const std::string& addr) {
  auto ds = Open(addr);
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  return sk_test::ReadAllSamples(**ds);
}

void SameSamples(const std::vector<Sample>& got, const std::vector<Sample>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("sample " << i);
    CHECK(got[i].key == want[i].key);
    REQUIRE(got[i].fields.size() == want[i].fields.size());
    for (size_t k = 0; k < want[i].fields.size(); ++k) {
      CHECK(got[i].fields[k].ext == want[i].fields[k].ext);
      CHECK(got[i].fields[k].data == want[i].fields[k].data);
    }
  }
}

uint32_t U32(const std::string& s, size_t off) {
  uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}

void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }

// A shard as MDSWriter encodes it, from columns (name, encoding, fixed size or
// 0) and per-sample column values (already encoded).
struct Col {
  std::string name, enc;
  uint32_t size;
};
std::string EncodeShard(const std::vector<Col>& cols, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::string> samples;
  for (const auto& r : rows) {
    std::string head, body;
    for (size_t c = 0; c < cols.size(); ++c) {
      if (!cols[c].size) PutU32(&head, uint32_t(r[c].size()));
      body += r[c];
    }
    samples.push_back(head + body);
  }
  std::string config = R"({"column_encodings": [], "format": "mds", "version": 2})";
  std::string out;
  PutU32(&out, uint32_t(samples.size()));
  uint32_t off = uint32_t(4 + 4 * (samples.size() + 1) + config.size());
  PutU32(&out, off);
  for (const auto& s : samples) PutU32(&out, off += uint32_t(s.size()));
  out += config;
  for (const auto& s : samples) out += s;
  return out;
}

json ShardEntry(const std::vector<Col>& cols, size_t samples, const std::string& base, const std::string& raw,
                const std::string* zip = nullptr) {
  json e;
  for (const auto& c : cols) {
    e["column_names"].push_back(c.name);
    e["column_encodings"].push_back(c.enc);
    e["column_sizes"].push_back(c.size ? json(c.size) : json(nullptr));
  }
  e["compression"] = zip ? json("zstd") : json(nullptr);
  e["format"] = "mds";
  e["hashes"] = json::array({"xxh64"});
  e["samples"] = samples;
  e["size_limit"] = 1 << 26;
  e["version"] = 2;
  e["raw_data"] = {{"basename", base},
                   {"bytes", raw.size()},
                   {"hashes", {{"xxh64", fmt::format("{:016x}", XXH64(raw.data(), raw.size(), 0))}}}};
  if (zip)
    e["zip_data"] = {{"basename", base + ".zstd"},
                     {"bytes", zip->size()},
                     {"hashes", {{"xxh64", fmt::format("{:016x}", XXH64(zip->data(), zip->size(), 0))}}}};
  else
    e["zip_data"] = nullptr;
  return e;
}

std::string I64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// A dataset as a foreign MDSWriter would write it: columns x (jpeg), y (int),
// f (float32), name (str), 2 shards; optionally zstd-compressed.
std::string WriteForeign(const TempDir& t, bool zstd = false) {
  std::vector<Col> cols = {{"f", "float32", 4}, {"name", "str", 0}, {"x", "jpeg", 0}, {"y", "int", 8}};
  json index;
  index["version"] = 2;
  for (int s = 0; s < 2; ++s) {
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < 3; ++i) {
      int g = s * 3 + i;
      float f = 0.5f * float(g);
      rows.push_back({std::string(reinterpret_cast<const char*>(&f), 4), fmt::format("img{}", g),
                      MakeJpeg(10 + g, 12, uint32_t(g)), I64(g % 2 ? -7 : 1000)});
    }
    std::string raw = EncodeShard(cols, rows);
    std::string base = fmt::format("shard.{:05d}.mds", s);
    if (zstd) {
      std::string z(ZSTD_compressBound(raw.size()), '\0');
      z.resize(ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), 3));
      WriteFile(t / (base + ".zstd"), z);
      index["shards"].push_back(ShardEntry(cols, rows.size(), base, raw, &z));
    } else {
      WriteFile(t / base, raw);
      index["shards"].push_back(ShardEntry(cols, rows.size(), base, raw));
    }
  }
  WriteFile(t / "index.json", index.dump());
  return t.path();
}

json ReadJson(const std::string& p) { return json::parse(ReadFile(p)); }

}  // namespace

TEST_CASE("mds: writes index.json and shards as MDSWriter does, and reads them back byte-identical") {
  TempDir t;
  auto want = Fixture();
  WriteOptions wo;
  wo.class_names = {"a", "b", "c"};
  wo.format_options["mds.hashes"] = "xxh64,sha1,md5";
  auto sum = WriteAll("mds:" + (t / "out"), want, wo);
  CHECK(sum.samples == want.size());
  REQUIRE(sum.shards.size() == 1);

  json idx = ReadJson(t / "out/index.json");
  CHECK(idx["version"] == 2);
  REQUIRE(idx["shards"].size() == 1);
  const json& sh = idx["shards"][0];
  CHECK(sh["format"] == "mds");
  CHECK(sh["version"] == 2);
  CHECK(sh["samples"] == want.size());
  CHECK(sh["column_names"] == json({"__key__", "cls", "jpg", "json", "seg.png", "txt"}));
  CHECK(sh["column_encodings"] == json({"str", "int", "jpeg", "json", "bytes", "str"}));
  CHECK(sh["column_sizes"] == json({nullptr, 8, nullptr, nullptr, nullptr, nullptr}));
  CHECK(sh["compression"].is_null());
  CHECK(sh["zip_data"].is_null());
  CHECK(sh["hashes"] == json({"md5", "sha1", "xxh64"}));  // sorted, as streaming requires
  CHECK(sh["raw_data"]["basename"] == "shard.00000.mds");
  std::string raw = ReadFile(t / "out/shard.00000.mds");
  CHECK(sh["raw_data"]["bytes"] == raw.size());
  CHECK(sh["raw_data"]["hashes"]["xxh64"] == fmt::format("{:016x}", XXH64(raw.data(), raw.size(), 0)));
  // Known digests of the same algorithms on a fixed input (RFC 3174, RFC 1321).
  CHECK(*formats::mds::HashHex("sha1", "abc", 3) == "a9993e364706816aba3e25717850c26c9cd0d89d");
  CHECK(*formats::mds::HashHex("md5", "abc", 3) == "900150983cd24fb0d6963f7d28e17f72");
  std::string long_in(1000, 'a');
  CHECK(*formats::mds::HashHex("sha1", long_in.data(), long_in.size()) == "291e9a6c66994949b57ba5e650361e98fc36b1ba");

  // The file: count, offsets (absolute, counting the config JSON), config, samples.
  REQUIRE(U32(raw, 0) == want.size());
  uint32_t first = U32(raw, 4);
  std::string config = raw.substr(4 + 4 * (want.size() + 1), first - (4 + 4 * (want.size() + 1)));
  json cj = json::parse(config);
  CHECK(cj["column_names"] == sh["column_names"]);
  CHECK(config.find("\"column_encodings\": [") != std::string::npos);  // Python's separators
  CHECK(U32(raw, 4 + 4 * want.size()) == raw.size());
  // Sample 0: five uint32 sizes (the variable columns), then the columns in order.
  std::string s0 = raw.substr(first, U32(raw, 8) - first);
  CHECK(U32(s0, 0) == want[0].key.size());
  CHECK(s0.substr(20, want[0].key.size()) == want[0].key);
  int64_t label;
  std::memcpy(&label, s0.data() + 20 + want[0].key.size(), 8);
  CHECK(label == 0);

  SameSamples(ReadAll("mds:" + (t / "out")), want);
  auto ds = Open(t / "out");  // detected by content
  REQUIRE(ds.ok());
  CHECK((*ds)->info().format == "mds");
  CHECK((*ds)->info().class_names == wo.class_names);
  CHECK((*ds)->info().num_samples == want.size());
  CHECK(!(*ds)->info().shard_checksums_where.empty());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  Sample s;
  for (uint64_t i : {9u, 0u, 4u}) {
    REQUIRE((*ra)->Get(i, &s).ok());
    CHECK(s.key == want[i].key);
    CHECK(s.find("jpg")->data == want[i].find("jpg")->data);
  }
  CHECK((*ra)->Get(10, &s).code() == Code::kInvalidArgument);
}

TEST_CASE("mds: shard size and count limits cut shards as MDSWriter does, each shard opens alone") {
  TempDir t;
  auto want = Fixture(20);
  WriteOptions wo;
  wo.shard_size = 3000;
  auto sum = WriteAll("mds:" + (t / "a"), want, wo);
  CHECK(sum.shards.size() > 2);
  json idx = ReadJson(t / "a/index.json");
  uint64_t total = 0;
  for (size_t i = 0; i < idx["shards"].size(); ++i) {
    const json& sh = idx["shards"][i];
    CHECK(sh["size_limit"] == 3000);
    CHECK(sh["raw_data"]["basename"] == fmt::format("shard.{:05d}.mds", i));
    uint64_t bytes = sh["raw_data"]["bytes"];
    if (sh["samples"] > 1) CHECK(bytes <= 3000);
    total += sh["samples"].get<uint64_t>();
  }
  CHECK(total == want.size());
  SameSamples(ReadAll("mds:" + (t / "a")), want);
  // One shard alone (the address verify and the streamed loader use).
  auto one = ReadAll("mds:" + sum.shards[1].path);
  REQUIRE(one.size() == sum.shards[1].samples);
  CHECK(one[0].key == want[sum.shards[0].samples].key);

  WriteOptions wo2;
  wo2.samples_per_shard = 6;
  auto sum2 = WriteAll("mds:" + (t / "b"), want, wo2);
  REQUIRE(sum2.shards.size() == 4);
  CHECK(sum2.shards[3].samples == 2);

  // No size given: Streaming's own default, 64 MiB (tar shards keep 1 GiB).
  auto sum3 = WriteAll("mds:" + (t / "c"), want, WriteOptions{});
  CHECK(sum3.shards.size() == 1);
  CHECK(ReadJson(t / "c/index.json")["shards"][0]["size_limit"] == (uint64_t(1) << 26));
}

TEST_CASE("mds: zstd shards as streaming names them, read back and verified") {
  TempDir t;
  auto want = Fixture();
  WriteOptions wo;
  wo.format_options["mds.compression"] = "zstd:7";
  WriteAll("mds:" + (t / "z"), want, wo);
  json sh = ReadJson(t / "z/index.json")["shards"][0];
  CHECK(sh["compression"] == "zstd:7");
  CHECK(sh["zip_data"]["basename"] == "shard.00000.mds.zstd");
  CHECK(!std::filesystem::exists(t / "z/shard.00000.mds"));
  std::string z = ReadFile(t / "z/shard.00000.mds.zstd");
  CHECK(sh["zip_data"]["bytes"] == z.size());
  CHECK(ZSTD_getFrameContentSize(z.data(), z.size()) == sh["raw_data"]["bytes"].get<uint64_t>());
  SameSamples(ReadAll("mds:" + (t / "z")), want);
  auto rep = Verify("mds:" + (t / "z"));
  REQUIRE(rep.ok());
  CHECK(rep->ok());
  CHECK(rep->shard_checksums);
  CHECK(rep->samples == want.size());

  TempDir t2;
  WriteOptions bad;
  bad.format_options["mds.compression"] = "gz";
  CHECK(Create("mds:" + (t2 / "x"), bad).status().code() == Code::kInvalidArgument);
  bad.format_options["mds.compression"] = "";
  bad.format_options["mds.hashes"] = "sha256";
  CHECK(Create("mds:" + (t2 / "x"), bad).status().code() == Code::kInvalidArgument);
}

TEST_CASE("mds: a foreign MDSWriter layout maps to fields (image, label, carried columns)") {
  for (bool zstd : {false, true}) {
    DYNAMIC_SECTION("zstd " << zstd) {
      TempDir t;
      std::string dir = WriteForeign(t, zstd);
      CHECK(*DetectFormat(dir) == "mds");
      CHECK(*DetectFormat(dir + "/index.json") == "mds");
      auto got = ReadAll(dir);
      REQUIRE(got.size() == 6);
      for (int g = 0; g < 6; ++g) {
        INFO("sample " << g);
        CHECK(got[size_t(g)].key == fmt::format("{:08d}", g));
        CHECK(got[size_t(g)].find("jpg")->data.str() == MakeJpeg(10 + g, 12, uint32_t(g)));
        CHECK(got[size_t(g)].label() == (g % 2 ? -7 : 1000));
        CHECK(got[size_t(g)].find("name")->data.str() == fmt::format("img{}", g));
        CHECK(got[size_t(g)].find("f")->data.str() == fmt::format("{}", 0.5f * float(g)));
      }
      auto ds = Open(dir);
      REQUIRE(ds.ok());
      CHECK((*ds)->info().fields == std::vector<std::string>{"cls", "f", "jpg", "name"});
      auto rep = Verify(dir);
      REQUIRE(rep.ok());
      CHECK(rep->ok());
      CHECK(rep->shards == 2);
    }
  }
}

TEST_CASE("mds: hostile shards and index.json fail with the file and offset named") {
  TempDir t;
  std::string dir = WriteForeign(t);
  std::string shard = t / "shard.00000.mds";
  std::string good = ReadFile(shard);
  json index = ReadJson(t / "index.json");

  auto read_err = [&]() -> Status {
    auto ds = Open("mds:" + dir);
    if (!ds.ok()) return ds.status();
    auto r = (*ds)->NewReader();
    if (!r.ok()) return r.status();
    Sample s;
    for (;;) {
      auto more = (*r)->Next(&s);
      if (!more.ok()) return more.status();
      if (!*more) return Status::OK();
    }
  };

  SECTION("index.json's size disagrees with the file") {
    json bad = index;
    bad["shards"][0]["raw_data"]["bytes"] = good.size() + 4;
    WriteFile(t / "index.json", bad.dump());
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.detail() == Detail::kShardChecksum);
    CHECK(st.where().file == shard);
    auto rep = Verify("mds:" + dir);
    REQUIRE(rep.ok());
    CHECK(rep->count(FindingKind::kShardChecksum) == 1);
  }
  SECTION("a hash mismatch") {
    std::string d = good;
    d[d.size() - 1] ^= 1;  // last byte of the last sample (inside the jpeg column? no: the int column)
    WriteFile(shard, d);
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.detail() == Detail::kShardChecksum);
    CHECK(st.message().find("xxh64") != std::string::npos);
    auto rep = Verify("mds:" + dir);
    REQUIRE(rep.ok());
    CHECK(rep->count(FindingKind::kShardChecksum) == 1);
    CHECK(rep->findings[0].where.file == shard);
    CHECK(rep->count(FindingKind::kStructure) == 0);
    // Random access does not hash: the damaged value reads, with its changed bytes.
    auto ds = Open("mds:" + dir);
    auto ra = (*ds)->NewRandomAccess();
    Sample s;
    CHECK((*ra)->Get(2, &s).ok());
  }
  // Offsets damaged with the hashes made to match: the structure checks catch it.
  auto rehash = [&](const std::string& d) {
    json bad = index;
    bad["shards"][0]["raw_data"]["hashes"]["xxh64"] = fmt::format("{:016x}", XXH64(d.data(), d.size(), 0));
    WriteFile(t / "index.json", bad.dump());
    WriteFile(shard, d);
  };
  SECTION("an offset past the end") {
    std::string d = good;
    uint32_t past = uint32_t(d.size() + 100);
    std::memcpy(d.data() + 8, &past, 4);
    rehash(d);
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file == shard);
    CHECK(st.where().offset == 8);
    CHECK(st.message().find("past the end") != std::string::npos);
  }
  SECTION("non-monotonic offsets") {
    std::string d = good;
    uint32_t o1 = U32(d, 4), o2 = U32(d, 8);
    std::memcpy(d.data() + 8, &o1, 4);
    std::memcpy(d.data() + 4, &o2, 4);
    rehash(d);
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().offset == 8);
    CHECK(st.message().find("non-monotonic") != std::string::npos);
  }
  SECTION("a header count that disagrees with index.json") {
    std::string d = good;
    uint32_t n = 2;
    std::memcpy(d.data(), &n, 4);
    rehash(d);
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().offset == 0);
  }
  SECTION("a variable size running past the sample") {
    std::string d = good;
    uint32_t first = U32(d, 4);
    uint32_t huge = 1u << 30;
    std::memcpy(d.data() + first, &huge, 4);
    rehash(d);
    Status st = read_err();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().offset >= int64_t(first));
    CHECK(st.where().index == 0);
  }
  SECTION("index.json naming a file outside the directory, or not version 2") {
    json bad = index;
    bad["shards"][0]["raw_data"]["basename"] = "../x.mds";
    WriteFile(t / "index.json", bad.dump());
    CHECK(Open("mds:" + dir).status().code() == Code::kCorrupt);
    bad = index;
    bad["version"] = 3;
    WriteFile(t / "index.json", bad.dump());
    CHECK(Open("mds:" + dir).status().code() == Code::kUnsupported);
    WriteFile(t / "index.json", "{\"version\": 2, \"shards\": [");
    CHECK(Open("mds:" + dir).status().code() == Code::kCorrupt);
  }
}

TEST_CASE("mds: a zstd bomb and truncated zstd data are refused") {
  TempDir t;
  std::string dir = WriteForeign(t, true);
  std::string zpath = t / "shard.00000.mds.zstd";
  json index = ReadJson(t / "index.json");
  uint64_t raw_bytes = index["shards"][0]["raw_data"]["bytes"];
  auto install = [&](const std::string& z) {
    json bad = index;
    bad["shards"][0]["zip_data"]["bytes"] = z.size();
    bad["shards"][0]["zip_data"]["hashes"]["xxh64"] = fmt::format("{:016x}", XXH64(z.data(), z.size(), 0));
    WriteFile(t / "index.json", bad.dump());
    WriteFile(zpath, z);
  };
  auto first_error = [&]() -> Status {
    auto ds = Open("mds:" + dir);
    if (!ds.ok()) return ds.status();
    auto r = (*ds)->NewReader();
    return r.ok() ? Status::OK() : r.status();
  };
  SECTION("a frame declaring far more than raw_data.bytes") {
    std::string big(64 << 20, '\0');
    std::string z(ZSTD_compressBound(big.size()), '\0');
    z.resize(ZSTD_compress(z.data(), z.size(), big.data(), big.size(), 1));
    REQUIRE(z.size() < 64 * 1024);
    install(z);
    Status st = first_error();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file == zpath);
    CHECK(st.message().find("bomb") != std::string::npos);
  }
  SECTION("a frame without a content size that inflates past raw_data.bytes") {
    std::string big(64 << 20, 'a');
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
    std::string z(ZSTD_compressBound(big.size()), '\0');
    z.resize(ZSTD_compress2(c, z.data(), z.size(), big.data(), big.size()));
    ZSTD_freeCCtx(c);
    install(z);
    Status st = first_error();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.message().find("bomb") != std::string::npos);
    CHECK(st.where().offset >= 0);
  }
  SECTION("truncated") {
    std::string z = ReadFile(zpath);
    install(z.substr(0, z.size() / 2));
    Status st = first_error();
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file == zpath);
  }
  (void)raw_bytes;
}

TEST_CASE("mds: bids, listing and the CLI's info and verify") {
  TempDir t;
  WriteAll("mds:" + (t / "d"), Fixture(4));
  CHECK(formats::mds::BidRead(t / "d") == 100);
  CHECK(formats::mds::BidRead(t / "d/shard.00000.mds") == 100);
  CHECK(formats::mds::BidWrite(t / "x.mds") == 90);
  CHECK(formats::mds::BidWrite(t / "x") == 0);
  CHECK(*DetectFormat(t / "d") == "mds");
  auto lst = formats::mds::ListShards(t / "d", OpenOptions{});
  REQUIRE(lst.ok());
  REQUIRE(lst->shards.size() == 1);
  CHECK(lst->shards[0].address == "mds:" + (t / "d/shard.00000.mds"));
  CHECK(lst->num_samples == 4u);

  auto info = Cli("info " + Q(t / "d"));
  CHECK(info.exit_code == 0);
  CHECK(info.out.find("format:  mds") != std::string::npos);
  auto ver = Cli("verify " + Q("mds:" + (t / "d")));
  INFO(ver.out << ver.err);
  CHECK(ver.exit_code == 0);
  auto conv = Cli("convert " + Q("mds:" + (t / "d")) + " " + Q("mds:" + (t / "e")) +
                  " --mds-compression zstd --mds-hashes sha1,md5");
  INFO(conv.out << conv.err);
  CHECK(conv.exit_code == 0);
  json sh = ReadJson(t / "e/index.json")["shards"][0];
  CHECK(sh["compression"] == "zstd");
  CHECK(sh["hashes"] == json({"md5", "sha1"}));
  SameSamples(ReadAll(t / "e"), ReadAll(t / "d"));
}

TEST_CASE("mds: a key of 4096 bytes or more (held by reference like a large field) reads back whole") {
  TempDir t;
  auto want = Fixture(3);
  want[1].key = std::string(5000, 'k') + "/long";  // over the writer's hold size (4096)
  want[2].key = std::string(4096, 'x');            // exactly at it
  WriteAll("mds:" + (t / "out"), want);
  SameSamples(ReadAll("mds:" + (t / "out")), want);
}
