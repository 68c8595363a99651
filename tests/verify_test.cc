// verify: intact datasets verify clean in every format; damage (a flipped
// payload byte, a deleted shard, a duplicate key, a corrupt JPEG) is found and
// named by key / shard; --against finds missing, extra and different samples;
// the CLI's exit codes and JSON. Also `shardkit index` (DALI and wids).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardkit/shardkit.h"
#include "shardkit/verify.h"
#include "core/pickle.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kClasses = {"cat", "dog"};

// A marker inside each sample's txt field, so that a test can find a payload's
// bytes in any container and flip one.
std::string Marker(int i) { return fmt::format("payload-marker-{:04d}-end", i); }

Sample MakeSample(int i) {
  Sample s;
  s.key = fmt::format("{}/s{:04d}", kClasses[i % 2], i);  // class folder first: folder keeps keys
  s.set("jpg", Bytes::Take(MakeJpeg(16, 16, uint32_t(i))));
  s.set("txt", Bytes::Copy(Marker(i)));
  s.set_label(i % 2);
  return s;
}

std::vector<Sample> MakeSamples(int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) out.push_back(MakeSample(i));
  return out;
}

void WriteDs(const std::string& address, const std::vector<Sample>& samples, uint64_t per_shard = 0) {
  WriteOptions opts;
  opts.class_names = kClasses;
  opts.samples_per_shard = per_shard;
  auto w = Create(address, opts);
  INFO(address << ": " << w.status().ToString());
  REQUIRE(w.ok());
  for (const auto& s : samples) {
    Status st = (*w)->Write(s);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  auto sum = (*w)->Finish();
  INFO(sum.status().ToString());
  REQUIRE(sum.ok());
}

// Changes the last byte of the first occurrence of `needle` in the file, in place.
void FlipIn(const std::string& path, const std::string& needle) {
  std::string bytes = ReadFile(path);
  size_t at = bytes.find(needle);
  INFO(path << " lacks " << needle);
  REQUIRE(at != std::string::npos);
  bytes[at + needle.size() - 1] ^= 0x20;
  FILE* f = std::fopen(path.c_str(), "r+b");
  REQUIRE(f);
  std::fseek(f, long(at + needle.size() - 1), SEEK_SET);
  std::fputc(bytes[at + needle.size() - 1], f);
  std::fclose(f);
}

VerifyReport MustVerify(const std::string& address, VerifyOptions opts = {}) {
  auto r = Verify(address, opts);
  INFO(address << ": " << r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

std::string Dump(const VerifyReport& r) {
  std::string out;
  for (const auto& f : r.findings)
    out += fmt::format("{}: {}: {}\n", FindingKindName(f.kind), f.where.ToString(), f.message);
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  return out;
}

const Finding* FindKind(const VerifyReport& r, FindingKind k) {
  for (const auto& f : r.findings)
    if (f.kind == k) return &f;
  return nullptr;
}

// One dataset per format, written by shardkit: the address to verify and the
// file that holds sample bytes (for flipping).
struct Fixture {
  std::string format, address, data_file;
};

Fixture Make(const TempDir& dir, const std::string& format, const std::vector<Sample>& samples) {
  if (format == "wds") {
    WriteDs("wds:" + dir / "w/train-%06d.tar", samples, 4);
    return {format, dir / "w/train.manifest.json", ""};
  }
  if (format == "lmdb") {
    WriteDs("lmdb:" + dir / "db", samples);
    return {format, "lmdb:" + dir / "db", dir / "db/data.mdb"};
  }
  if (format == "hdf5") {
    WriteDs("hdf5:" + dir / "d.h5", samples);
    return {format, "hdf5:" + dir / "d.h5", dir / "d.h5"};
  }
  WriteDs("folder:" + dir / "f", samples);
  return {format, "folder:" + dir / "f", ""};
}

// The file holding sample i's marker in fixture f.
std::string FileOf(const Fixture& f, const TempDir& dir, int i) {
  if (f.format == "wds") return dir / fmt::format("w/train-{:06d}.tar", i / 4);
  if (f.format == "folder") return dir / fmt::format("f/{}/s{:04d}.txt", kClasses[i % 2], i);
  return f.data_file;
}

}  // namespace

TEST_CASE("verify finding kinds have their documented names", "[verify]") {
  std::vector<std::string> names;
  for (int k = 0; k < kNumFindingKinds; ++k) names.push_back(FindingKindName(FindingKind(k)));
  CHECK(names == std::vector<std::string>{"structure", "count", "shard-checksum", "sample-checksum",
                                          "duplicate-key", "missing-shard", "empty-shard", "missing-field",
                                          "missing", "extra", "different", "decode-error", "decode-warning"});
}

TEST_CASE("verify, every format: intact verifies clean, a flipped payload byte is found by key", "[verify]") {
  for (std::string format : {"hdf5", "lmdb", "wds", "folder"}) {
    DYNAMIC_SECTION(format) {
      TempDir dir;
      auto samples = MakeSamples(10);
      Fixture f = Make(dir, format, samples);
      VerifyReport clean = MustVerify(f.address);
      INFO(Dump(clean));
      CHECK(clean.ok());
      CHECK(clean.samples == 10);
      CHECK(clean.format == format);
      if (format == "folder") {
        CHECK_FALSE(clean.sample_checksums);
        CHECK(Dump(clean).find("no recorded checksums") != std::string::npos);
      } else {
        CHECK(clean.sample_checksums);
      }

      if (format == "folder") continue;  // no checksums: --against is the check (tested below)
      // Two damaged samples: reading goes on past the first.
      FlipIn(FileOf(f, dir, 6), Marker(6));
      FlipIn(FileOf(f, dir, 8), Marker(8));
      VerifyReport bad = MustVerify(f.address);
      INFO(Dump(bad));
      CHECK_FALSE(bad.ok());
      // The lmdb reader refuses the damaged record itself; the others hand it over.
      CHECK(bad.samples == (format == "lmdb" ? 9u : 10u));
      std::vector<std::string> keys;
      std::vector<int64_t> indexes;
      for (const auto& x : bad.findings)
        if (x.kind == FindingKind::kSampleChecksum) keys.push_back(x.where.key), indexes.push_back(x.where.index);
      CHECK(keys == std::vector<std::string>{"cat/s0006", "cat/s0008"});
      CHECK(indexes == std::vector<int64_t>{6, 8});
      const Finding* s = FindKind(bad, FindingKind::kSampleChecksum);
      if (format == "wds") {
        CHECK(bad.count(FindingKind::kShardChecksum) == 2);
        const Finding* sh = FindKind(bad, FindingKind::kShardChecksum);
        REQUIRE(sh);
        CHECK(sh->where.shard == 1);
        CHECK(sh->where.file.find("train-000001.tar") != std::string::npos);
        CHECK(s->where.shard == 1);
      }
      if (format == "lmdb") CHECK(bad.count(FindingKind::kShardChecksum) == 1);
    }
  }
}

TEST_CASE("verify wds: a manifest that does not add up or does not parse is a finding", "[verify]") {
  TempDir dir;
  Fixture f = Make(dir, "wds", MakeSamples(12));  // shards 0, 1, 2
  std::string text = ReadFile(f.address);
  json j = json::parse(text);
  j["num_samples"] = 13;
  WriteFile(f.address, j.dump());
  VerifyReport r = MustVerify(f.address);
  INFO(Dump(r));
  REQUIRE(r.count(FindingKind::kCount) == 1);
  const Finding* c = FindKind(r, FindingKind::kCount);
  CHECK(c->where.file == f.address);
  CHECK(c->message == "the manifest says 13 samples but its shards add up to 12");
  CHECK(r.samples == 12);  // the shards are still read

  WriteFile(f.address, "{ not json");
  r = MustVerify(f.address);
  INFO(Dump(r));
  REQUIRE(r.count(FindingKind::kStructure) == 1);
  const Finding* u = FindKind(r, FindingKind::kStructure);
  CHECK(u->where.file == f.address);
  CHECK_THAT(u->message, Catch::StartsWith("unreadable manifest: "));
  CHECK(r.samples == 0);
  CHECK(r.shards == 0);

  // Another tool's JSON under the manifest's name is refused outright.
  WriteFile(f.address, R"({"format": "other"})");
  auto other = Verify(f.address);
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().code() == Code::kCorrupt);
  CHECK_THAT(other.status().message(), Catch::Contains("not a shardkit wds manifest"));
}

TEST_CASE("verify wds: a deleted shard in a range or a manifest is a missing shard", "[verify]") {
  TempDir dir;
  Fixture f = Make(dir, "wds", MakeSamples(12));  // shards 0, 1, 2
  REQUIRE(MustVerify(f.address).ok());
  REQUIRE(::unlink((dir / "w/train-000001.tar").c_str()) == 0);
  for (std::string address : {f.address, dir / "w/train-{000000..000002}.tar"}) {
    VerifyReport r = MustVerify(address);
    INFO(address << "\n" << Dump(r));
    CHECK_FALSE(r.ok());
    REQUIRE(r.count(FindingKind::kMissingShard) == 1);
    const Finding* m = FindKind(r, FindingKind::kMissingShard);
    CHECK(m->where.shard == 1);
    CHECK(m->where.file == dir / "w/train-000001.tar");
    CHECK(r.samples == 8);  // the other shards were still read
    CHECK(r.count(FindingKind::kStructure) == 0);
  }
}

TEST_CASE("verify wds: a damaged shard is a structure finding and the others are still read", "[verify]") {
  TempDir dir;
  Fixture f = Make(dir, "wds", MakeSamples(12));
  // Break the header checksum of shard 0's first member.
  std::string p = dir / "w/train-000000.tar";
  std::string bytes = ReadFile(p);
  bytes[148] = 'x';
  WriteFile(p, bytes);
  VerifyReport r = MustVerify(f.address);
  INFO(Dump(r));
  const Finding* s = FindKind(r, FindingKind::kStructure);
  REQUIRE(s);
  CHECK(s->where.file == p);
  CHECK(s->where.shard == 0);
  CHECK(s->where.offset >= 0);
  CHECK(r.count(FindingKind::kShardChecksum) == 1);
  // Shards 1 and 2 in full; of shard 0, the samples after the damaged header,
  // reached by random access through the shard's index.
  CHECK(r.samples == 11);
}

TEST_CASE("verify wds: a damaged tar member header is a structure finding, not a sample-checksum one", "[verify]") {
  // Issue 13: the kind of a finding is data on the status (Status::detail()),
  // never its text, and "tar header checksum mismatch" is the container's
  // structure, not a per-sample checksum.
  TempDir dir;
  Fixture f = Make(dir, "wds", MakeSamples(12));
  // One byte of the name field of sample 5's first member header (shard 1),
  // in the middle of the shard: its header checksum no longer matches.
  std::string p = dir / "w/train-000001.tar";
  std::string bytes = ReadFile(p);
  size_t at = bytes.find("dog/s0005.cls");
  REQUIRE(at != std::string::npos);
  REQUIRE(at % 512 == 0);  // a ustar name field starts its header block
  bytes[at + 4] ^= 0x01;
  WriteFile(p, bytes);

  VerifyReport r = MustVerify(f.address);
  INFO(Dump(r));
  CHECK_FALSE(r.ok());
  CHECK(r.count(FindingKind::kSampleChecksum) == 0);
  REQUIRE(r.count(FindingKind::kStructure) == 1);
  const Finding* s = FindKind(r, FindingKind::kStructure);
  CHECK(s->where.file == p);
  CHECK(s->where.shard == 1);
  CHECK(s->where.offset == int64_t(at));
  CHECK(s->message.find("tar header checksum mismatch") != std::string::npos);
  CHECK(r.count(FindingKind::kShardChecksum) == 1);  // the manifest's file checksum of shard 1
  // The summary agrees with the findings: sample checksums were recorded and
  // checked, and none of them is reported as failing.
  CHECK(r.sample_checksums);

  // The CLI's report and JSON say the same.
  auto cli = Cli("verify " + Q(f.address));
  INFO(cli.out << cli.err);
  CHECK(cli.exit_code == 1);
  CHECK(cli.out.find("structure: file '" + p + "', shard 1, offset " + std::to_string(at)) != std::string::npos);
  CHECK(cli.out.find("sample-checksum:") == std::string::npos);
  CHECK(cli.out.find("result: 2 findings: 1 structure, 1 shard-checksum") != std::string::npos);
  auto js = Cli("verify " + Q(f.address) + " --json");
  CHECK(js.exit_code == 1);
  json j = json::parse(js.out);
  CHECK(j["counts"]["structure"] == 1);
  CHECK(j["counts"]["sample-checksum"] == 0);
  CHECK(j["sample_checksums"] == true);
  REQUIRE(j["findings"].size() == 2);
  bool seen = false;
  for (const auto& x : j["findings"])
    if (x["kind"] == "structure") {
      seen = true;
      CHECK(x["offset"] == at);
      CHECK(x["shard"] == 1);
    }
  CHECK(seen);
}

TEST_CASE("verify wds: an empty shard and a duplicate key across shards", "[verify]") {
  TempDir dir;
  auto samples = MakeSamples(8);
  samples[6].key = samples[1].key;  // shard 1 repeats a key of shard 0
  WriteDs("wds:" + dir / "w/train-%06d.tar", samples, 4);
  // An empty third shard: a tar with only its end blocks.
  WriteFile(dir / "w/train-000002.tar", std::string(10240, '\0'));
  VerifyReport r = MustVerify(dir / "w/train-{000000..000002}.tar");
  INFO(Dump(r));
  REQUIRE(r.count(FindingKind::kDuplicateKey) == 1);
  const Finding* d = FindKind(r, FindingKind::kDuplicateKey);
  CHECK(d->where.key == samples[1].key);
  CHECK(d->where.shard == 1);
  CHECK(d->where.index == 6);
  CHECK(d->message.find("shard 0") != std::string::npos);
  CHECK(d->message.find("sample 1") != std::string::npos);
  REQUIRE(r.count(FindingKind::kEmptyShard) == 1);
  CHECK(FindKind(r, FindingKind::kEmptyShard)->where.shard == 2);
}

TEST_CASE("verify hdf5: duplicate keys within a file and a sample missing a field", "[verify]") {
  TempDir dir;
  auto samples = MakeSamples(6);
  samples[4].key = samples[2].key;
  samples[3].erase("txt");
  WriteDs("hdf5:" + dir / "d.h5", samples);
  VerifyReport r = MustVerify("hdf5:" + dir / "d.h5");
  INFO(Dump(r));
  REQUIRE(r.count(FindingKind::kDuplicateKey) == 1);
  CHECK(FindKind(r, FindingKind::kDuplicateKey)->where.index == 4);
  CHECK(FindKind(r, FindingKind::kDuplicateKey)->message.find("sample 2") != std::string::npos);
  REQUIRE(r.count(FindingKind::kMissingField) == 1);
  const Finding* m = FindKind(r, FindingKind::kMissingField);
  CHECK(m->where.key == samples[3].key);
  CHECK(m->message.find("'txt'") != std::string::npos);
}

TEST_CASE("verify against a source finds missing, extra and different samples by key", "[verify]") {
  for (std::string format : {"hdf5", "wds", "lmdb", "folder"}) {
    DYNAMIC_SECTION(format) {
      TempDir src_dir, dir;
      auto src = MakeSamples(10);
      WriteDs("hdf5:" + src_dir / "src.h5", src);
      auto mine = src;
      mine.erase(mine.begin() + 7);  // missing: dog/s0007
      Sample extra = MakeSample(42);  // extra: cat/s0042
      mine.push_back(extra);
      mine[2].set("txt", Bytes::Copy("other bytes"));  // different bytes: cat/s0002
      // A different label (a folder cannot hold one: its folder is its label).
      if (format != "folder") mine[5].set_label(0);
      Fixture f = Make(dir, format, mine);
      VerifyOptions o;
      o.against = "hdf5:" + src_dir / "src.h5";
      VerifyReport r = MustVerify(f.address, o);
      INFO(Dump(r));
      CHECK(r.source_samples == 10);
      REQUIRE(r.count(FindingKind::kMissing) == 1);
      CHECK(FindKind(r, FindingKind::kMissing)->where.key == "dog/s0007");
      REQUIRE(r.count(FindingKind::kExtra) == 1);
      CHECK(FindKind(r, FindingKind::kExtra)->where.key == "cat/s0042");
      REQUIRE(r.count(FindingKind::kDifferent) == (format == "folder" ? 1u : 2u));
      std::map<std::string, std::string> diff;
      for (const auto& x : r.findings)
        if (x.kind == FindingKind::kDifferent) diff[x.where.key] = x.message;
      CHECK(diff["cat/s0002"].find("field 'txt' bytes differ") != std::string::npos);
      if (format != "folder") CHECK(diff["dog/s0005"].find("label differs") != std::string::npos);

      // The same data against itself: nothing.
      VerifyOptions same;
      same.against = f.address;
      VerifyReport s = MustVerify(f.address, same);
      INFO(Dump(s));
      CHECK(s.ok());
    }
  }
}

TEST_CASE("verify: a dataset that does not exist is an error, not a report", "[verify]") {
  TempDir dir;
  auto r = Verify("hdf5:" + dir / "nope.h5");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kNotFound);
  auto r2 = Verify(dir / "nope.tar");
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.status().where().file == dir / "nope.tar");
}

TEST_CASE("verify: max_findings keeps the counts whole, progress is reported", "[verify]") {
  TempDir dir;
  Fixture f = Make(dir, "hdf5", MakeSamples(5));
  VerifyOptions o;
  o.against = "hdf5:" + dir / "d.h5";
  o.max_findings = 0;
  uint64_t calls = 0, last = 0;
  o.progress = [&](const VerifyProgress& p) {
    ++calls;
    last = p.samples;
  };
  VerifyReport r = MustVerify(f.address, o);
  CHECK(r.ok());
  CHECK(calls >= 2);  // the end of each phase
  CHECK(last == 5);

  auto samples = MakeSamples(6);
  for (auto& s : samples) s.key = "same";
  WriteDs("hdf5:" + dir / "dups.h5", samples);
  VerifyOptions lim;
  lim.max_findings = 2;
  VerifyReport d = MustVerify("hdf5:" + dir / "dups.h5", lim);
  CHECK(d.count(FindingKind::kDuplicateKey) == 5);
  CHECK(d.findings.size() == 2);
}

TEST_CASE("shardkit verify: exit codes, report and JSON", "[verify][cli]") {
  TempDir dir;
  Fixture f = Make(dir, "wds", MakeSamples(12));
  auto ok = Cli("verify " + Q(f.address));
  INFO(ok.out << ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(ok.out.find("result: intact") != std::string::npos);

  auto js = Cli("verify " + Q(f.address) + " --json");
  CHECK(js.exit_code == 0);
  json j = json::parse(js.out);
  for (const char* k : {"address", "format", "ok", "samples", "bytes", "shards", "seconds", "against",
                        "source_samples", "sample_checksums", "shard_checksums", "decode", "images_decoded", "counts",
                        "total_findings", "findings", "notes"})
    CHECK(j.contains(k));
  CHECK(j["ok"] == true);
  CHECK(j["samples"] == 12);
  CHECK(j["format"] == "wds");
  CHECK(j["counts"].size() == size_t(kNumFindingKinds));

  FlipIn(dir / "w/train-000002.tar", Marker(9));
  REQUIRE(::unlink((dir / "w/train-000001.tar").c_str()) == 0);
  auto bad = Cli("verify " + Q(f.address));
  INFO(bad.out << bad.err);
  CHECK(bad.exit_code == 1);
  CHECK(bad.out.find("missing-shard: file '" + dir / "w/train-000001.tar" + "', shard 1") != std::string::npos);
  CHECK(bad.out.find("sample-checksum: file '" + dir / "w/train-000002.tar" + "', shard 2, offset ") !=
        std::string::npos);
  CHECK(bad.out.find("sample 9, key 'dog/s0009': sample checksum is") != std::string::npos);
  CHECK(bad.out.find("result: 3 findings: 1 shard-checksum, 1 sample-checksum, 1 missing-shard") != std::string::npos);

  auto bj = Cli("verify " + Q(f.address) + " --json");
  CHECK(bj.exit_code == 1);
  json b = json::parse(bj.out);
  CHECK(b["ok"] == false);
  CHECK(b["total_findings"] == 3);
  CHECK(b["counts"]["missing-shard"] == 1);
  bool seen = false;
  for (const auto& x : b["findings"])
    if (x["kind"] == "sample-checksum") {
      seen = true;
      CHECK(x["key"] == "dog/s0009");
      CHECK(x["shard"] == 2);
      CHECK(x["index"] == 9);
      CHECK(x["file"] == dir / "w/train-000002.tar");
      REQUIRE(x["offset"].is_number());
      // The offset of the data of the sample's first member (cls, first in
      // sorted extension order), just after its 512-byte ustar header.
      std::string tar = ReadFile(dir / "w/train-000002.tar");
      size_t off = x["offset"].get<size_t>();
      CHECK(off % 512 == 0);
      CHECK(tar.substr(off, 1) == "1");
      CHECK(tar.substr(off - 512, 13) == "dog/s0009.cls");
    }
  CHECK(seen);

  CHECK(Cli("verify").exit_code == 2);
  CHECK(Cli("verify " + Q(f.address) + " --max-findings x").exit_code == 2);
  auto missing = Cli("verify " + Q(dir / "nope.manifest.json"));
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("nope.manifest.json") != std::string::npos);
}

TEST_CASE("shardkit index: DALI offsets point at each member's data, wids list parses", "[verify][index]") {
  TempDir dir;
  auto samples = MakeSamples(7);
  WriteOptions opts;
  opts.samples_per_shard = 4;
  opts.write_index = false;
  {
    auto w = Create("wds:" + dir / "w/t-%06d.tar", opts);
    REQUIRE(w.ok());
    for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
    REQUIRE((*w)->Finish().ok());
  }
  auto r = Cli("index " + Q(dir / "w/t-000000.tar") + " " + Q(dir / "w/t-000001.tar"));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  int shard_first = 0;
  for (int shard = 0; shard < 2; ++shard) {
    std::string tar = ReadFile(dir / fmt::format("w/t-{:06d}.tar", shard));
    std::string idx = ReadFile(dir / fmt::format("w/t-{:06d}.idx", shard));
    std::istringstream in(idx);
    std::string version;
    uint64_t n = 0;
    in >> version >> n;
    CHECK(version == "v1.2");
    CHECK(n == (shard == 0 ? 4u : 3u));
    std::string line;
    std::getline(in, line);
    for (uint64_t i = 0; i < n; ++i) {
      REQUIRE(std::getline(in, line));
      std::istringstream ls(line);
      const Sample& want = samples[shard_first + i];
      std::string ext, name;
      uint64_t off = 0, size = 0;
      size_t comps = 0;
      while (ls >> ext >> off >> size >> name) {
        ++comps;
        CHECK(off % 512 == 0);
        CHECK(name == want.key + "." + ext);
        const Field* field = want.find(ext);
        REQUIRE(field);
        CHECK(size == field->data.size());
        REQUIRE(off + size <= tar.size());
        CHECK(tar.substr(off, size) == field->data.str());
      }
      CHECK(comps == want.fields.size());
    }
    shard_first += int(n);
  }

  auto w = Cli("index " + Q(dir / "w/t-{000000..000001}.tar") + " --format wids --output " + Q(dir / "w/list.json"));
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  json j = json::parse(ReadFile(dir / "w/list.json"));
  CHECK(j["__kind__"] == "wids-shard-index-v1");
  CHECK(j["wids_version"] == 1);
  CHECK(j["name"] == "list");
  REQUIRE(j["shardlist"].size() == 2);
  CHECK(j["shardlist"][0]["url"] == "t-000000.tar");
  CHECK(j["shardlist"][0]["nsamples"] == 4);
  CHECK(j["shardlist"][1]["nsamples"] == 3);
  CHECK(j["shardlist"][1]["filesize"] == ReadFile(dir / "w/t-000001.tar").size());
  auto md5 = Run("md5sum " + Q(dir / "w/t-000001.tar"));
  CHECK(md5.out.substr(0, 32) == j["shardlist"][1]["md5sum"].get<std::string>());

  CHECK(Cli("index " + Q(dir / "w/t-000000.tar") + " " + Q(dir / "w/t-000001.tar") + " --output x.idx").exit_code == 2);
  CHECK(Cli("index " + Q(dir / "w/t-000000.tar") + " --format nope").exit_code == 2);
  auto missing = Cli("index " + Q(dir / "w/none.tar"));
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("none.tar") != std::string::npos);
}

TEST_CASE("verify with decoding finds a corrupt JPEG by key", "[verify][decode]") {
  TempDir dir;
  auto samples = MakeSamples(6);
  std::string jpg = samples[2].find("jpg")->data.str();
  samples[2].set("jpg", Bytes::Copy(jpg.substr(0, jpg.size() / 2)));  // truncated
  samples[4].set("jpg", Bytes::Copy("this is not a JPEG"));
  WriteDs("hdf5:" + dir / "d.h5", samples);
  // Without --decode the container is intact: the checksums were taken over these bytes.
  CHECK(MustVerify("hdf5:" + dir / "d.h5").ok());
  VerifyOptions o;
  o.decode = true;
  VerifyReport r = MustVerify("hdf5:" + dir / "d.h5", o);
  INFO(Dump(r));
  CHECK(r.images_decoded == 6);
  REQUIRE(r.count(FindingKind::kDecodeError) == 2);
  std::vector<std::string> keys;
  for (const auto& f : r.findings)
    if (f.kind == FindingKind::kDecodeError) {
      keys.push_back(f.where.key);
      CHECK(f.message.find("field 'jpg'") != std::string::npos);
    }
  CHECK(keys == std::vector<std::string>{samples[2].key, samples[4].key});

  auto cli = Cli("verify " + Q("hdf5:" + dir / "d.h5") + " --decode");
  INFO(cli.out << cli.err);
  CHECK(cli.exit_code == 1);
  CHECK(cli.out.find("decode-error: file '" + dir / "d.h5" + "', sample 2, key '" + samples[2].key + "'") !=
        std::string::npos);
  CHECK(cli.out.find("6 images decoded") != std::string::npos);
}

TEST_CASE("verify with decoding reports an image that decodes only with warnings", "[verify][decode]") {
  TempDir dir;
  auto samples = MakeSamples(3);
  // Garbage bytes between two header segments (after APP0, before the next
  // marker): libjpeg warns ("extraneous bytes before marker") and decodes.
  std::string jpg = samples[1].find("jpg")->data.str();
  REQUIRE(jpg.substr(2, 2) == "\xFF\xE0");
  size_t app0_end = 4 + ((uint8_t(jpg[4]) << 8) | uint8_t(jpg[5]));
  samples[1].set("jpg", Bytes::Copy(jpg.substr(0, app0_end) + std::string("\x12\x34\x56", 3) + jpg.substr(app0_end)));
  WriteDs("hdf5:" + dir / "d.h5", samples);
  VerifyOptions o;
  o.decode = true;
  VerifyReport r = MustVerify("hdf5:" + dir / "d.h5", o);
  INFO(Dump(r));
  CHECK(r.count(FindingKind::kDecodeError) == 0);
  REQUIRE(r.count(FindingKind::kDecodeWarning) == 1);
  CHECK(FindKind(r, FindingKind::kDecodeWarning)->where.key == samples[1].key);
}

TEST_CASE("verify with decoding parses decoded arrays and says what their channel order means", "[verify][decode][channels]") {
  TempDir dir;
  auto npy = [](std::vector<uint64_t> shape, char kind = 'u', uint32_t size = 1) {
    pickle::NdArray a;
    a.dtype = pickle::DType{kind, size, kind == 'u' && size == 1 ? '|' : '<'};
    a.shape = std::move(shape);
    a.data = Bytes::Take(std::string(size_t(a.elements()) * size, '\x5a'));
    return pickle::ToNpy(a);
  };
  std::vector<Sample> samples(4);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].key = fmt::format("a{}", i);
    samples[i].set("npy", npy({4, 5, 3}));
    samples[i].set_label(int64_t(i % 2));
  }
  samples[1].set("npy", npy({6, 2}, 'f', 4));  // a float array: data, not an image, and intact
  std::string cut = samples[2].find("npy")->data.str();
  samples[2].set("npy", Bytes::Copy(cut.substr(0, cut.size() - 7)));  // shorter than its shape needs
  // Written with no channel order (the library's writer is told none).
  WriteDs("wds:" + dir / "u/s-%06d.tar", samples);
  VerifyOptions o;
  o.decode = true;
  VerifyReport r = MustVerify(dir / "u/s.manifest.json", o);
  INFO(Dump(r));
  CHECK(r.images_decoded == 4);
  REQUIRE(r.count(FindingKind::kDecodeError) == 1);
  CHECK(FindKind(r, FindingKind::kDecodeError)->where.key == "a2");
  CHECK_THAT(FindKind(r, FindingKind::kDecodeError)->message, Catch::Contains("field 'npy'"));
  CHECK_THAT(Dump(r), Catch::Contains("2 decoded arrays with colour channels and no recorded channel order") &&
                          Catch::Contains("wds.channels=rgb"));
  // Without --decode nothing is parsed and nothing is said of arrays.
  VerifyReport plain = MustVerify(dir / "u/s.manifest.json");
  CHECK(plain.ok());
  CHECK_THAT(Dump(plain), !Catch::Contains("decoded array"));

  // Recorded as BGR: the note names the order and the option that converts it, also for a
  // shard verified through its manifest's order.
  samples.erase(samples.begin() + 1, samples.begin() + 3);
  WriteOptions bgr;
  bgr.array_channels = "bgr";
  {
    auto w = Create("wds:" + dir / "b/s-%06d.tar", bgr);
    REQUIRE(w.ok());
    for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
    REQUIRE((*w)->Finish().ok());
  }
  VerifyReport b = MustVerify(dir / "b/s.manifest.json", o);
  INFO(Dump(b));
  CHECK(b.ok());
  CHECK_THAT(Dump(b), Catch::Contains("2 decoded arrays with colour channels, decoded arrays: bgr") &&
                          Catch::Contains("wds.channels=bgr-to-rgb"));
  auto cli = Cli("verify " + Q(dir / "b/s.manifest.json") + " --decode --source-option wds.channels=bgr-to-rgb");
  INFO(cli.out << cli.err);
  CHECK(cli.exit_code == 0);
  CHECK_THAT(cli.out, Catch::Contains("decoded arrays: rgb (converted from bgr on read)"));
}

TEST_CASE("verify: shards written by GNU tar (no index, no checksums) and broken single-file datasets", "[verify]") {
  TempDir dir;
  MakeImageFolder(dir / "img", 2, 3);
  REQUIRE(Run("cd " + Q(dir / "img") + " && tar --sort=name -cf ../a.tar c0 && tar --sort=name -cf ../b.tar c1")
              .exit_code == 0);
  VerifyReport r = MustVerify(dir / "a.tar::" + dir / "b.tar");
  INFO(Dump(r));
  CHECK(r.ok());
  CHECK(r.samples == 6);
  CHECK_FALSE(r.sample_checksums);
  REQUIRE(r.notes.size() == 1);
  CHECK(r.notes[0].find("2 of 2 shards record no per-sample checksums") != std::string::npos);

  // A truncated HDF5 file and a truncated LMDB: structure findings naming the file, exit 1.
  WriteDs("hdf5:" + dir / "d.h5", MakeSamples(5));
  REQUIRE(::truncate((dir / "d.h5").c_str(), 600) == 0);
  VerifyReport h = MustVerify("hdf5:" + dir / "d.h5");
  INFO(Dump(h));
  REQUIRE(h.count(FindingKind::kStructure) == 1);
  CHECK(h.findings[0].where.file == dir / "d.h5");
  WriteDs("lmdb:" + dir / "db", MakeSamples(5));
  REQUIRE(::truncate((dir / "db/data.mdb").c_str(), 4096) == 0);
  VerifyReport l = MustVerify("lmdb:" + dir / "db");
  INFO(Dump(l));
  CHECK(l.count(FindingKind::kStructure) + l.count(FindingKind::kShardChecksum) >= 1);
  CHECK_FALSE(l.ok());
  auto cli = Cli("verify " + Q("lmdb:" + dir / "db"));
  CHECK(cli.exit_code == 1);
  CHECK(cli.out.find(dir / "db") != std::string::npos);
}

TEST_CASE("shardkit convert --no-index, then shardkit index writes what the writer would have", "[verify][index]") {
  TempDir dir;
  MakeImageFolder(dir / "img", 2, 5);
  auto a = Cli("convert " + Q(dir / "img") + " " + Q("wds:" + dir / "a/t-%06d.tar") + " --samples-per-shard 4");
  INFO(a.out << a.err);
  REQUIRE(a.exit_code == 0);
  auto b = Cli("convert " + Q(dir / "img") + " " + Q("wds:" + dir / "b/t-%06d.tar") +
               " --samples-per-shard 4 --no-index");
  INFO(b.out << b.err);
  REQUIRE(b.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(dir / "b/t-000000.idx"));
  auto idx = Cli("index " + Q(dir / "b/t-{000000..000002}.tar"));
  INFO(idx.out << idx.err);
  REQUIRE(idx.exit_code == 0);
  for (int i = 0; i < 3; ++i)
    CHECK(ReadFile(dir / fmt::format("b/t-{:06d}.idx", i)) == ReadFile(dir / fmt::format("a/t-{:06d}.idx", i)));
  auto v = Cli("verify " + Q(dir / "b/t.manifest.json") + " --against " + Q(dir / "img") + " --decode");
  INFO(v.out << v.err);
  CHECK(v.exit_code == 0);
}

TEST_CASE("verify: image fields of different types are one field, and a sample without any image is still found", "[verify]") {
  TempDir dir;
  const std::string root = dir / "mix";
  REQUIRE(MakeImageFolder(root, 2, 4) == 8);
  // One class folder mixes .jpg, .jpeg, .JPEG and .png, as real ones do.
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(fs::path(root) / "c0")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 4);
  const char* exts[] = {".jpg", ".jpeg", ".png"};  // and one .JPEG stays
  for (int i = 0; i < 3; ++i) fs::rename(files[size_t(i)], fs::path(files[size_t(i)]).replace_extension(exts[i]));
  VerifyReport r = MustVerify("folder:" + root);
  INFO(Dump(r));
  CHECK(r.total_findings() == 0);
  CHECK(r.samples == 8);
  // The same after conversion to tar shards.
  auto c = Cli(fmt::format("convert {} {}", Q("folder:" + root), Q("wds:" + dir / "o/t-%06d.tar")));
  REQUIRE(c.exit_code == 0);
  VerifyReport w = MustVerify(dir / "o/t.manifest.json");
  INFO(Dump(w));
  CHECK(w.total_findings() == 0);
  // A caption with no image in a class folder is left out by default (as torchvision
  // does); read with folder.files=all it is a sample, and a finding named as such.
  WriteFile((fs::path(root) / "c1" / "only-text.txt").string(), "a caption");
  VerifyReport d = MustVerify("folder:" + root);
  CHECK(d.samples == 8);
  CHECK(d.total_findings() == 0);
  VerifyOptions all;
  all.open.format_options["folder.files"] = "all";
  VerifyReport m = MustVerify("folder:" + root, all);
  INFO(Dump(m));
  const Finding* f = nullptr;
  for (const auto& x : m.findings)
    if (x.kind == FindingKind::kMissingField && x.where.key == "c1/only-text") f = &x;
  REQUIRE(f);
  CHECK_THAT(f->message, Catch::Contains("sample lacks an image (jpg, png, ...) (in 8 samples)"));
}

TEST_CASE("convert checks the source's recorded checksums: damaged bytes are not written under fresh ones", "[verify]") {
  for (std::string format : {"hdf5", "lmdb", "wds"}) {
    DYNAMIC_SECTION(format) {
      TempDir dir;
      Fixture f = Make(dir, format, MakeSamples(10));
      // Intact: converted, and the summary says every sample was checked (LMDB's shardkit
      // layout checks its records on read, so convert has no list to check).
      auto ok = Convert(f.address, "wds:" + dir / "ok/t-%06d.tar");
      INFO(ok.status().ToString());
      REQUIRE(ok.ok());
      CHECK(ok->source_checksums_checked == (format == "lmdb" ? 0u : 10u));
      FlipIn(FileOf(f, dir, 6), Marker(6));
      // To LMDB: refused naming the sample, and nothing published.
      auto bad = Convert(f.address, "lmdb:" + dir / "out.lmdb");
      REQUIRE_FALSE(bad.ok());
      CHECK(bad.status().code() == Code::kCorrupt);
      CHECK(bad.status().detail() == Detail::kSampleChecksum);
      CHECK(bad.status().where().key == "cat/s0006");
      CHECK_FALSE(fs::exists(dir / "out.lmdb"));
      // The command: exit 1, the key in the message.
      auto cli = Cli(fmt::format("convert {} {}", Q(f.address), Q("wds:" + dir / "cli/t-%06d.tar")));
      CHECK(cli.exit_code == 1);
      CHECK_THAT(cli.err, Catch::Contains("cat/s0006"));
      if (format == "lmdb") continue;  // its reader refuses the record itself: no way around it
      // --no-verify-source converts the data as it is; verify of the copy then says intact,
      // which is why it is not the default.
      ConvertOptions o;
      o.verify_source = false;
      auto as_is = Convert(f.address, "lmdb:" + dir / "as-is.lmdb", o);
      INFO(as_is.status().ToString());
      REQUIRE(as_is.ok());
      CHECK(as_is->source_checksums_checked == 0u);
      CHECK(MustVerify("lmdb:" + dir / "as-is.lmdb").ok());
    }
  }
}
