// verify: intact datasets verify clean in every format; damage (a flipped
// payload byte, a deleted shard, a duplicate key, a corrupt JPEG) is found and
// named by key / shard; --against finds missing, extra and different samples;
// the CLI's exit codes and JSON. Also `shardkit index` (DALI and wids).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardkit/shardkit.h"
#include "shardkit/verify.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kClasses = {"cat", "dog"};

// A marker inside each sample's txt field, so that a test can find a payload's
// bytes in any container and flip one.
std::string Marker(int i) { return fmt::format("payload-marker-{:04d}-end", i); }

Sample MakeSample(int i) {
  Sample s;
  s.key = fmt::format("c{}/s{:04d}", i % 2, i);
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

TEST_CASE("finding kinds have their documented names", "[verify]") {
  std::vector<std::string> names;
  for (int k = 0; k < kNumFindingKinds; ++k) names.push_back(FindingKindName(FindingKind(k)));
  CHECK(names == std::vector<std::string>{"structure", "count", "shard-checksum", "sample-checksum",
                                          "duplicate-key", "missing-shard", "empty-shard", "missing-field",
                                          "missing", "extra", "different", "decode-error", "decode-warning"});
}

TEST_CASE("every format: intact verifies clean, a flipped payload byte is found by key", "[verify]") {
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
      FlipIn(FileOf(f, dir, 6), Marker(6));
      VerifyReport bad = MustVerify(f.address);
      INFO(Dump(bad));
      CHECK_FALSE(bad.ok());
      const Finding* s = FindKind(bad, FindingKind::kSampleChecksum);
      REQUIRE(s);
      CHECK(s->where.key == "c0/s0006");
      CHECK(s->where.index == 6);
      CHECK(bad.count(FindingKind::kSampleChecksum) == 1);
      if (format == "wds") {
        const Finding* sh = FindKind(bad, FindingKind::kShardChecksum);
        REQUIRE(sh);
        CHECK(sh->where.shard == 1);
        CHECK(sh->where.file.find("train-000001.tar") != std::string::npos);
        CHECK(s->where.shard == 1);
      }
    }
  }
}
