// MXNet RecordIO (lib/formats/recordio/): the framing against bytes laid out by
// hand from dmlc-core's rules, reading files shardkit did not write (no sidecar,
// with and without .idx), the field mapping of float and multi-labels, shards,
// `shardkit index`, verify, and hostile files (bad magic, length past the end, a
// continuation that never ends, an .idx pointing outside the file or not at a
// record): errors naming file and offset, with typed details.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>

#include "formats/recordio/framing.h"
#include "formats/registry.h"
#include "shardkit/shardkit.h"
#include "support.h"
#include "read_all.h"

using namespace shardkit;
using namespace sk_test;
namespace rio = shardkit::formats::recordio;

namespace {

// A tiny encoder written from the spec, independent of framing.cc.
std::string U32(uint32_t v) { return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; }
std::string U64(uint64_t v) { return U32(uint32_t(v)) + U32(uint32_t(v >> 32)); }
std::string F32(float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  return U32(v);
}
const std::string kMagicBytes = U32(0xced7230a);
std::string Part(uint32_t cflag, const std::string& body) {
  std::string out = kMagicBytes + U32(cflag << 29 | uint32_t(body.size())) + body;
  out.append((4 - body.size() % 4) % 4, '\0');
  return out;
}
std::string Header(uint32_t flag, float label, uint64_t id, uint64_t id2 = 0) {
  return U32(flag) + F32(label) + U64(id) + U64(id2);
}

std::vector<Sample> ReadAllOf(const std::string& addr) {
  auto ds = Open(addr);
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  return sk_test::ReadAllSamples(**ds);
}

Status FirstError(const std::string& addr) {
  auto ds = Open(addr);
  if (!ds.ok()) return ds.status();
  auto r = (*ds)->NewReader();
  if (!r.ok()) return r.status();
  Sample s;
  for (;;) {
    auto more = (*r)->Next(&s);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  auto ra = (*ds)->NewRandomAccess();
  if (!ra.ok()) return ra.status();
  for (uint64_t i = 0; i < (*ra)->size(); ++i) SK_RETURN_IF_ERROR((*ra)->Get(i, &s));
  return Status::OK();
}

}  // namespace

TEST_CASE("recordio framing: split at aligned magic words exactly as dmlc-core's writer", "[recordio]") {
  const std::string m = kMagicBytes;
  struct Case {
    std::string payload, framed;
  };
  std::vector<Case> cases = {
      {"", Part(0, "")},
      {"abc", Part(0, "abc")},
      {"abcd" + m + "xy", Part(1, "abcd") + Part(3, "xy")},
      {m, Part(1, "") + Part(3, "")},
      {m + m, Part(1, "") + Part(2, "") + Part(3, "")},
      {"1234" + m + "5678" + m + "9", Part(1, "1234") + Part(2, "5678") + Part(3, "9")},
      {"ab" + m + "cd", Part(0, "ab" + m + "cd")},  // not aligned: stays whole
  };
  for (const auto& c : cases) {
    std::string framed;
    REQUIRE(rio::AppendRecord(c.payload, &framed).ok());
    CHECK(framed == c.framed);
    std::string scratch;
    rio::Record r;
    REQUIRE(rio::ReadRecord(reinterpret_cast<const uint8_t*>(c.framed.data()), c.framed.size(), 0, "t", &scratch, &r)
                .ok());
    CHECK(std::string(r.payload) == c.payload);
    CHECK(r.next == c.framed.size());
  }
}

TEST_CASE("recordio: a file written by another tool (no sidecar) reads with its .idx and without", "[recordio]") {
  TempDir t;
  std::string a = MakeJpeg(20, 16, 1), b = MakePng(8, 8, 2), c = MakeJpeg(24, 8, 3);
  // c holds the magic word at an aligned offset of its payload: a continuation record.
  const size_t at = 36, header = rio::kIRHeaderSize + 2 * 4;  // record 2 has two extra labels
  c.replace(at - header, 4, kMagicBytes);
  std::vector<std::string> payloads = {
      Header(0, 3.0f, 0) + a,
      Header(0, 2.5f, 1) + b,
      Header(2, 0.0f, 2) + F32(1.0f) + F32(-0.25f) + c,
  };
  std::string file, idx;
  for (size_t i = 0; i < payloads.size(); ++i) {
    idx += fmt::format("{}\t{}\n", i, file.size());
    const std::string& p = payloads[i];
    size_t cut = p.find(kMagicBytes);
    if (i == 2) {
      REQUIRE(cut == at);
      file += Part(1, p.substr(0, cut)) + Part(3, p.substr(cut + 4));
    } else {
      file += Part(0, p);
    }
  }
  WriteFile(t / "x.rec", file);
  for (bool with_idx : {false, true}) {
    if (with_idx) WriteFile(t / "x.idx", idx);
    auto got = ReadAllOf(t / "x.rec");  // detected by content
    REQUIRE(got.size() == 3);
    CHECK(got[0].key == "0");
    CHECK(got[0].label() == 3);
    CHECK(got[0].find("jpg")->data.str() == a);
    CHECK(got[1].find("png")->data.str() == b);
    CHECK(!got[1].label());
    CHECK(got[1].find("labels.json")->data.str() == "2.5");
    CHECK(got[2].find("jpg")->data.str() == c);
    CHECK(got[2].find("labels.json")->data.str() == "[1, -0.25]");
    auto ds = Open("recordio:" + t / "x.rec");
    REQUIRE(ds.ok());
    CHECK((*ds)->info().format == "recordio");
    auto ra = (*ds)->NewRandomAccess();
    if (!with_idx) {
      CHECK(ra.status().code() == Code::kUnsupported);
      CHECK(ra.status().message().find("shardkit index") != std::string::npos);
      CHECK(!(*ds)->info().num_samples);
      // `shardkit index` makes the .idx: the same as the one written above.
      std::string written;
      auto n = WriteFormatIndex(t / "x.rec", "", &written);
      REQUIRE(n.ok());
      CHECK(*n == 3);
      CHECK(written == t / "x.idx");
      CHECK(ReadFile(t / "x.idx") == idx);
      std::filesystem::remove(t / "x.idx");
    } else {
      REQUIRE(ra.ok());
      REQUIRE((*ra)->size() == 3);
      CHECK((*ds)->info().num_samples == 3u);
      for (size_t i = 0; i < 3; ++i) {
        Sample s;
        REQUIRE((*ra)->Get(i, &s).ok());
        CHECK(s.key == got[i].key);
        CHECK(s.fields.size() == got[i].fields.size());
        for (size_t k = 0; k < s.fields.size(); ++k) CHECK(s.fields[k].data == got[i].fields[k].data);
      }
    }
  }
}

TEST_CASE("recordio: write and read back keys, labels, float and multi-labels, extensions", "[recordio]") {
  TempDir t;
  std::vector<Sample> in(5);
  for (int i = 0; i < 5; ++i) in[i].key = fmt::format("n01/img_{}.v2", i);  // dots are fine here
  in[0].set("jpg", Bytes::Copy(MakeJpeg(16, 16, 7)));
  in[0].set_label(2);
  in[1].set("jpeg", Bytes::Copy(MakeJpeg(16, 16, 8)));  // not the sniffed "jpg": kept in the sidecar
  in[1].set("labels.json", Bytes::Copy("0.1"));
  in[2].set("png", Bytes::Copy(MakePng(4, 4, 9)));
  in[2].set("labels.json", Bytes::Copy("[3, 1.5, \"nan\"]"));
  std::string magic_payload = "abcd" + kMagicBytes + kMagicBytes + "tail";
  in[3].set("bin", Bytes::Copy(magic_payload));
  in[3].set_label(-7);
  in[4].set("jpg", Bytes::Copy(MakeJpeg(8, 8, 10)));  // no label
  WriteOptions wo;
  wo.class_names = {"a", "b", "c"};
  auto w = Create(t / "out.rec", wo);
  REQUIRE(w.ok());
  for (const auto& s : in) {
    Status st = (*w)->Write(s);
    INFO(s.key << ": " << st.ToString());
    REQUIRE(st.ok());
  }
  auto sum = (*w)->Finish();
  REQUIRE(sum.ok());
  CHECK(std::filesystem::exists(t / "out.idx"));
  auto got = ReadAllOf("recordio:" + t / "out.rec");
  REQUIRE(got.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    INFO(i);
    CHECK(got[i].key == in[i].key);
    REQUIRE(got[i].fields.size() == in[i].fields.size());
    for (size_t k = 0; k < in[i].fields.size(); ++k) {
      CHECK(got[i].fields[k].ext == in[i].fields[k].ext);
      if (in[i].fields[k].ext != "labels.json") CHECK(got[i].fields[k].data == in[i].fields[k].data);
    }
  }
  CHECK(got[1].find("labels.json")->data.str() == "0.1");
  CHECK(got[2].find("labels.json")->data.str() == "[3, 1.5, \"nan\"]");
  CHECK(got[3].label() == -7);
  // The .idx is MXNet's: id<TAB>offset, the id the record's header holds.
  std::string idx = ReadFile(t / "out.idx");
  CHECK(idx.rfind("0\t0\n1\t", 0) == 0);
  auto ds = Open(t / "out.rec");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().class_names == wo.class_names);
  CHECK((*ds)->info().sample_checksums == SampleChecksums::kList);
  auto rep = Verify(t / "out.rec");
  REQUIRE(rep.ok());
  std::string found;
  for (const auto& f : rep->findings) found += std::string(FindingKindName(f.kind)) + ": " + f.message + "\n";
  INFO(found);
  // The samples differ in their fields on purpose (cls, labels.json, none): only that.
  CHECK(rep->total_findings() == rep->count(FindingKind::kMissingField));
  CHECK(rep->count(FindingKind::kStructure) == 0);
  CHECK(rep->sample_checksums);
  CHECK(rep->samples == 5);

  // Refused, with the key named: two payloads; a label that float32 cannot hold.
  auto w2 = Create("recordio:" + t / "bad.rec");
  REQUIRE(w2.ok());
  Sample two;
  two.key = "two";
  two.set("jpg", Bytes::Copy("x"));
  two.set("txt", Bytes::Copy("y"));
  Status st = (*w2)->Write(two);
  CHECK(st.code() == Code::kUnsupported);
  CHECK(st.where().key == "two");
  Sample big;
  big.key = "big";
  big.set("jpg", Bytes::Copy("x"));
  big.set_label(int64_t(1) << 30);
  CHECK((*w2)->Write(big).code() == Code::kInvalidArgument);
  // An existing output is refused unless overwrite.
  auto w3 = Create(t / "out.rec");
  CHECK(w3.status().detail() == Detail::kOutputExists);
}

TEST_CASE("recordio: shards from a printf pattern, read back through a brace range", "[recordio]") {
  TempDir t;
  WriteOptions wo;
  wo.samples_per_shard = 4;
  wo.class_names = {"x", "y"};
  auto w = Create(t / "train-%03d.rec", wo);
  REQUIRE(w.ok());
  for (int i = 0; i < 10; ++i) {
    Sample s;
    s.key = fmt::format("k{:02d}", i);
    s.set("jpg", Bytes::Copy(MakeJpeg(8, 8, uint32_t(i))));
    s.set_label(i % 2);
    REQUIRE((*w)->Write(s).ok());
  }
  auto sum = (*w)->Finish();
  REQUIRE(sum.ok());
  REQUIRE(sum->shards.size() == 3);
  CHECK(sum->shards[2].samples == 2);
  auto got = ReadAllOf("recordio:" + t / "train-{000..002}.rec");
  REQUIRE(got.size() == 10);
  CHECK(got[9].key == "k09");
  auto ds = Open(t / "train-{000..002}.rec");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().format == "recordio");
  CHECK((*ds)->info().num_samples == 10u);
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  Sample s;
  REQUIRE((*ra)->Get(7, &s).ok());
  CHECK(s.key == "k07");
  CHECK(s.label() == 1);
}

TEST_CASE("recordio hostile files: errors name file and offset, with typed details", "[recordio][hostile]") {
  TempDir t;
  std::string img = MakeJpeg(8, 8, 1);
  std::string r0 = Part(0, Header(0, 1, 0) + img);
  std::string r1 = Part(0, Header(0, 2, 1) + img);
  struct Case {
    const char* name;
    std::string rec, idx;  // idx empty: none
    Detail detail;
    int64_t offset;
  };
  std::string bad_magic = r0 + r1;
  bad_magic[r0.size()] ^= 0x55;
  std::string past_end = r0 + kMagicBytes + U32(1000) + "abcd";
  std::string never_ends = r0 + Part(1, "abcd") + Part(2, "efgh");
  std::string restart = r0 + Part(1, "abcd") + Part(0, "efgh");
  std::string orphan = r0 + Part(3, "abcd");
  std::string good = r0 + r1;
  std::vector<Case> cases = {
      {"bad magic", bad_magic, "", Detail::kRecordFraming, int64_t(r0.size())},
      {"length past the end", past_end, "", Detail::kRecordFraming, int64_t(r0.size())},
      {"continuation never ends", never_ends, "", Detail::kRecordFraming, int64_t(never_ends.size())},
      {"continuation restarted", restart, "", Detail::kRecordFraming, int64_t(r0.size() + 12)},
      {"last part without a first", orphan, "", Detail::kRecordFraming, int64_t(r0.size())},
      {"idx outside the file", good, fmt::format("0\t0\n1\t{}\n", good.size() + 100), Detail::kIndexEntry,
       int64_t(good.size() + 100)},
      {"idx not at a record start", good, fmt::format("0\t0\n1\t{}\n", r0.size() + 8), Detail::kIndexEntry,
       int64_t(r0.size() + 8)},
      {"idx misaligned", good, "0\t0\n1\t6\n", Detail::kIndexEntry, 6},
      {"idx misses a record", good, "0\t0\n", Detail::kIndexEntry, int64_t(r0.size())},
      {"short header", Header(0, 1, 0).substr(0, 4) + "", "", Detail::kRecordFraming, 0},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      std::string dir = t / c.name;
      std::filesystem::create_directories(dir);
      WriteFile(dir + "/x.rec", c.rec);
      if (!c.idx.empty()) WriteFile(dir + "/x.idx", c.idx);
      Status st = FirstError("recordio:" + dir + "/x.rec");
      INFO(st.ToString());
      CHECK(st.code() == Code::kCorrupt);
      CHECK(st.detail() == c.detail);
      CHECK(st.where().file == dir + "/x.rec");
      CHECK(st.where().offset == c.offset);
      // Verify reports it as a structure finding and does not fail itself.
      auto rep = Verify("recordio:" + dir + "/x.rec");
      REQUIRE(rep.ok());
      CHECK(rep->count(FindingKind::kStructure) >= 1);
      // The CLI: exit 1, the file named.
      auto run = Cli("verify " + Q("recordio:" + dir + "/x.rec"));
      CHECK(run.exit_code == 1);
    }
  }
}

TEST_CASE("recordio through the CLI: index, info, verify, convert to tar and back, bench", "[recordio]") {
  TempDir t;
  std::string file, idx;
  for (int i = 0; i < 6; ++i) {
    idx += fmt::format("{}\t{}\n", i, file.size());
    file += Part(0, Header(0, float(i % 3), uint64_t(i)) + MakeJpeg(12, 12, uint32_t(i)));
  }
  WriteFile(t / "im2rec.rec", file);
  auto r = Cli("index " + Q(t / "im2rec.rec"));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find(t / "im2rec.idx") != std::string::npos);
  CHECK(ReadFile(t / "im2rec.idx") == idx);
  r = Cli("info " + Q(t / "im2rec.rec"));
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("recordio") != std::string::npos);
  r = Cli("verify " + Q(t / "im2rec.rec"));
  CHECK(r.exit_code == 0);
  r = Cli("convert " + Q(t / "im2rec.rec") + " " + Q("wds:" + t / "w-%06d.tar"));
  REQUIRE(r.exit_code == 0);
  r = Cli("convert " + Q("wds:" + t / "w-000000.tar") + " " + Q(t / "back.rec"));
  REQUIRE(r.exit_code == 0);
  // Same records, byte for byte: the keys were the ids, so the ids come back.
  CHECK(ReadFile(t / "back.rec") == file);
  CHECK(ReadFile(t / "back.idx") == idx);
  r = Cli("bench --samples 50 " + Q(t / "back.rec"));
  CHECK(r.exit_code == 0);
}

TEST_CASE("recordio: float and multi-labels survive a trip through every other format", "[recordio]") {
  TempDir t;
  std::vector<Sample> in(3);
  in[0].key = "a/0";
  in[0].set("jpg", Bytes::Copy(MakeJpeg(8, 8, 1)));
  in[0].set_label(4);
  in[1].key = "a/1";
  in[1].set("jpg", Bytes::Copy(MakeJpeg(8, 8, 2)));
  in[1].set("labels.json", Bytes::Copy("0.333"));
  in[2].key = "a/2";
  in[2].set("png", Bytes::Copy(MakePng(4, 4, 3)));
  in[2].set("labels.json", Bytes::Copy("[1, -2.5, 1e+20]"));
  auto w = Create(t / "src.rec");
  REQUIRE(w.ok());
  for (const auto& s : in) REQUIRE((*w)->Write(s).ok());
  REQUIRE((*w)->Finish().ok());
  const std::string want = ReadFile(t / "src.rec");
  for (const auto& f : formats::All()) {
    std::string name = f.name;
    if (name == "recordio") continue;
    DYNAMIC_SECTION(name) {
      std::string mid = name == "wds" ? name + ":" + t / (name + "/m-%06d.tar") : name + ":" + t / (name + "/m");
      if (name == "lmdb") mid += ".lmdb";
      if (name == "hdf5") mid += ".h5";
      auto c = Convert("recordio:" + t / "src.rec", mid);
      INFO(c.status().ToString());
      REQUIRE(c.ok());
      std::string back_src = name == "wds" ? "wds:" + c->shards[0].path : mid;
      auto b = Convert(back_src, "recordio:" + t / (name + "-back.rec"));
      INFO(b.status().ToString());
      REQUIRE(b.ok());
      // The same records, byte for byte (header labels, flags, images).
      CHECK(ReadFile(t / (name + "-back.rec")) == want);
      auto got = ReadAllOf(t / (name + "-back.rec"));
      REQUIRE(got.size() == 3);
      CHECK(got[2].find("labels.json")->data.str() == "[1, -2.5, 1e+20]");
      CHECK(got[2].key == "a/2");
    }
  }
}
