// The tfrecord format (lib/formats/tfrecord/, docs/formats-tfrecord.md): CRC32C,
// framing, the Example <-> sample mapping (presets, field map, carried
// features), compressed files, DALI's index, verify, and hostile input (CRC
// mismatches, lengths past the end, truncation, zip bombs, bad indexes): clear
// errors naming file and offset. The independent client (TFRecords written and
// read from the spec with Python's protobuf) is python/tests/test_tfrecord.py.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <zlib.h>

#include <filesystem>
#include <random>

#include "formats/tfrecord/crc32c.h"
#include "formats/tfrecord/example.h"
#include "formats/tfrecord/example.pb.h"
#include "formats/tfrecord/frames.h"
#include "loader_support.h"
#include "shardkit/index.h"
#include "shardkit/shardkit.h"
#include "shardkit/verify.h"
#include "support.h"
#include "read_all.h"

using namespace shardkit;
using namespace sk_test;
namespace tfr = shardkit::formats::tfrecord;
namespace pb = shardkit::tfexample;

namespace {

const std::vector<std::string> kClasses = {"cat", "dog", "eel"};

std::vector<Sample> MakeSamples(int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("{}/s{:03d}", kClasses[i % 3], i);
    s.set("jpg", Bytes::Take(MakeJpeg(16 + i, 16, uint32_t(i))));
    s.set_label(i % 3);
    s.set("txt", Bytes::Copy(fmt::format("payload-marker-{:04d}-end", i)));
    out.push_back(std::move(s));
  }
  return out;
}

WriteSummary WriteDs(const std::string& address, const std::vector<Sample>& samples, WriteOptions o = {}) {
  o.class_names = kClasses;
  auto w = Create(address, o);
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
  return *sum;
}

std::vector<Sample> ReadAll(const std::string& address, DatasetInfo* info = nullptr, OpenOptions oo = {}) {
  auto ds = Open(address, oo);
  INFO(address << ": " << ds.status().ToString());
  REQUIRE(ds.ok());
  if (info) *info = (*ds)->info();
  return sk_test::ReadAllSamples(**ds);
}

void CheckSame(const std::vector<Sample>& got, const std::vector<Sample>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("sample " << i << " key " << want[i].key);
    CHECK(got[i].key == want[i].key);
    CHECK(got[i].label() == want[i].label());
    REQUIRE(got[i].fields.size() == want[i].fields.size());
    for (size_t k = 0; k < want[i].fields.size(); ++k) {
      CHECK(got[i].fields[k].ext == want[i].fields[k].ext);
      CHECK(got[i].fields[k].data == want[i].fields[k].data);
    }
  }
}

std::string Frame(std::string_view data) {
  std::string out;
  tfr::AppendFrame(&out, data);
  return out;
}

uint64_t Le64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint8_t(s[at + i]);
  return v;
}

// A TF ImageNet-style record, built with the generated classes (TensorFlow's field numbers).
std::string ImagenetRecord(const std::string& jpeg, int64_t label, const std::string& filename) {
  pb::Example ex;
  auto& f = *ex.mutable_features()->mutable_feature();
  f["image/encoded"].mutable_bytes_list()->add_value(jpeg);
  f["image/class/label"].mutable_int64_list()->add_value(label);
  f["image/filename"].mutable_bytes_list()->add_value(filename);
  f["image/format"].mutable_bytes_list()->add_value("JPEG");
  f["image/height"].mutable_int64_list()->add_value(16);
  f["image/width"].mutable_int64_list()->add_value(20);
  f["image/class/synset"].mutable_bytes_list()->add_value("n01440764");
  f["image/object/bbox/xmin"].mutable_float_list()->add_value(0.25f);
  f["image/object/bbox/xmin"].mutable_float_list()->add_value(0.5f);
  f["caption"].mutable_bytes_list()->add_value("a fish");
  return ex.SerializeAsString();
}

std::string Deflate(const std::string& in, int bits) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 9, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, in.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

Status OpenAndRead(const std::string& address) {
  auto ds = Open(address);
  if (!ds.ok()) return ds.status();
  auto r = (*ds)->NewReader();
  if (!r.ok()) return r.status();
  Sample s;
  for (;;) {
    auto more = (*r)->Next(&s);
    if (!more.ok()) return more.status();
    if (!*more) return Status::OK();
  }
}

}  // namespace

TEST_CASE("tfrecord: CRC32C is Castagnoli's, masked as TensorFlow masks it", "[tfrecord]") {
  // The check value of CRC-32C (RFC 3720, B.4): "123456789" -> 0xE3069283.
  CHECK(tfr::Crc32c("123456789", 9) == 0xE3069283u);
  CHECK(tfr::Crc32cPortable("123456789", 9) == 0xE3069283u);
  // RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA.
  std::string zeros(32, '\0');
  CHECK(tfr::Crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(tfr::MaskCrc(0) == 0xa282ead8u);
  std::mt19937 rng(7);
  std::string buf(5000, '\0');
  for (auto& c : buf) c = char(rng());
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4999}) {
    INFO(n);
    CHECK(tfr::Crc32c(buf.data(), n) == tfr::Crc32cPortable(buf.data(), n));
    // Continuing a CRC over a split buffer gives the whole buffer's.
    CHECK(tfr::Crc32c(buf.data() + n / 2, n - n / 2, tfr::Crc32c(buf.data(), n / 2)) == tfr::Crc32c(buf.data(), n));
  }
}

TEST_CASE("tfrecord: shards written, framed by the spec, read back in order and by index", "[tfrecord]") {
  TempDir t;
  auto want = MakeSamples(12);
  WriteOptions o;
  o.samples_per_shard = 5;
  WriteSummary sum = WriteDs("tfrecord:" + (t / "out/train-%05d.tfrecord"), want, o);
  REQUIRE(sum.shards.size() == 3);
  CHECK(sum.shards[0].path == t / "out/train-00000.tfrecord");
  CHECK(sum.shards[2].samples == 2);
  CHECK(std::filesystem::exists(t / "out/train.tfrecord.json"));
  CHECK(std::filesystem::exists(t / "out/train-00000.idx"));

  // The bytes follow the spec: uint64 length, masked CRC of it, data, masked CRC of the data.
  std::string file = ReadFile(t / "out/train-00000.tfrecord");
  uint64_t len = Le64(file, 0);
  REQUIRE(file.size() > 16 + len);
  uint32_t lcrc, dcrc;
  std::memcpy(&lcrc, file.data() + 8, 4);
  std::memcpy(&dcrc, file.data() + 12 + len, 4);
  CHECK(lcrc == tfr::MaskedCrc32c(file.data(), 8));
  CHECK(dcrc == tfr::MaskedCrc32c(file.data() + 12, len));
  pb::Example ex;
  REQUIRE(ex.ParseFromArray(file.data() + 12, int(len)));
  const auto& fm = ex.features().feature();
  CHECK(fm.at("image/encoded").bytes_list().value(0) == want[0].find("jpg")->data.str());
  CHECK(fm.at("image/class/label").int64_list().value(0) == 1);  // 1-based, as TensorFlow's ImageNet scripts
  CHECK(fm.at("image/filename").bytes_list().value(0) == "cat/s000.jpg");
  CHECK(fm.at("image/format").bytes_list().value(0) == "JPEG");
  CHECK(fm.at("txt").bytes_list().value(0) == "payload-marker-0000-end");

  // The DALI index lists "offset size" of each frame.
  std::string idx = ReadFile(t / "out/train-00000.idx");
  CHECK(idx.substr(0, idx.find('\n')) == fmt::format("0 {}", 16 + len));

  DatasetInfo info;
  CheckSame(ReadAll("tfrecord:" + (t / "out/train.tfrecord.json"), &info), want);
  CHECK(info.format == "tfrecord");
  CHECK(info.class_names == kClasses);
  CHECK(info.num_samples == 12u);
  CHECK(info.extra["preset"] == "imagenet");
  CHECK(info.sample_checksums == SampleChecksums::kInRecords);
  CHECK(info.fields == std::vector<std::string>{"cls", "jpg", "txt"});
  REQUIRE(info.shards.size() == 3);
  CHECK(info.shards[1].address == "tfrecord:" + (t / "out/train-00001.tfrecord"));
  // Detected without a scheme, from a brace range, by content without the extension.
  CHECK(*DetectFormat(t / "out/train-00000.tfrecord") == "tfrecord");
  CHECK(*DetectFormat(t / "out/train.tfrecord.json") == "tfrecord");
  CheckSame(ReadAll(t / "out/train-{00000..00002}.tfrecord"), want);
  std::filesystem::copy_file(t / "out/train-00001.tfrecord", t / "plain");
  CHECK(*DetectFormat(t / "plain") == "tfrecord");

  // Random access, with the .idx and without it (scanned), is the same.
  for (bool with_idx : {true, false}) {
    if (!with_idx)
      for (int i = 0; i < 3; ++i) std::filesystem::remove(t / fmt::format("out/train-{:05d}.idx", i));
    auto ds = Open(t / "out/train.tfrecord.json");
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("index") == (with_idx ? "DALI .idx beside the files (checked)" : "scanned at open"));
    auto ra = (*ds)->NewRandomAccess();
    REQUIRE(ra.ok());
    REQUIRE((*ra)->size() == 12);
    for (uint64_t i : {11, 0, 5, 7}) {
      Sample s;
      REQUIRE((*ra)->Get(i, &s).ok());
      CHECK(s.key == want[i].key);
      CHECK(s.find("jpg")->data == want[i].find("jpg")->data);
    }
    Sample s;
    CHECK((*ra)->Get(12, &s).code() == Code::kInvalidArgument);
  }
}

TEST_CASE("tfrecord: TF ImageNet records: 1-based labels, file names, unknown features carried", "[tfrecord]") {
  TempDir t;
  std::string j0 = MakeJpeg(20, 16, 1), j1 = MakeJpeg(20, 16, 2);
  std::string file = Frame(ImagenetRecord(j0, 1, "n01440764_10026.JPEG")) +
                     Frame(ImagenetRecord(j1, 1000, "ILSVRC2012_val_00000001.JPEG"));
  WriteFile(t / "train-00000-of-00001", file);
  DatasetInfo info;
  auto got = ReadAll(t / "train-00000-of-00001", &info);
  CHECK(info.extra["preset"] == "imagenet");
  REQUIRE(got.size() == 2);
  CHECK(got[0].key == "n01440764_10026");
  CHECK(got[0].label() == 0);
  CHECK(got[1].label() == 999);
  REQUIRE(got[0].find("jpeg"));
  CHECK(got[0].find("jpeg")->data.str() == j0);
  CHECK(got[0].find("jpeg")->source_ext == "JPEG");
  REQUIRE(got[0].find("caption"));
  CHECK(got[0].find("caption")->data.str() == "a fish");
  CHECK_FALSE(got[0].find("image/format"));
  REQUIRE(got[0].find("tfexample.pb"));
  pb::Example carried;
  REQUIRE(carried.ParseFromString(got[0].find("tfexample.pb")->data.str()));
  std::vector<std::string> names;
  for (const auto& [k, v] : carried.features().feature()) names.push_back(k);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"image/class/synset", "image/height", "image/object/bbox/xmin",
                                          "image/width"});

  // Through tar shards and back: every feature survives, the image bytes are the same.
  auto c1 = Convert(t / "train-00000-of-00001", "wds:" + (t / "wds/x-%06d.tar"));
  INFO(c1.status().ToString());
  REQUIRE(c1.ok());
  auto c2 = Convert(t / "wds/x-000000.tar", "tfrecord:" + (t / "back/x-%05d.tfrecord"));
  INFO(c2.status().ToString());
  REQUIRE(c2.ok());
  std::string back = ReadFile(t / "back/x-00000.tfrecord");
  size_t pos = 0;
  for (int i = 0; i < 2; ++i) {
    uint64_t len = Le64(back, pos);
    pb::Example a, b;
    REQUIRE(b.ParseFromArray(back.data() + pos + 12, int(len)));
    REQUIRE(a.ParseFromString(ImagenetRecord(i ? j1 : j0, i ? 1000 : 1, i ? "ILSVRC2012_val_00000001.JPEG"
                                                                          : "n01440764_10026.JPEG")));
    const auto& fa = a.features().feature();
    const auto& fb = b.features().feature();
    CHECK(fa.size() == fb.size());
    for (const auto& [k, v] : fa) {
      INFO("feature " << k);
      REQUIRE(fb.count(k));
      if (k == "image/filename") {
        // Tar shards keep extensions in lower case: the key is the same, the name's
        // extension comes back as "jpeg" (docs/formats-tfrecord.md).
        std::string want = v.bytes_list().value(0);
        CHECK(fb.at(k).bytes_list().value(0) == want.substr(0, want.size() - 4) + "jpeg");
        continue;
      }
      CHECK(fb.at(k).SerializeAsString() == v.SerializeAsString());
    }
    pos += 16 + len;
  }
}

TEST_CASE("tfrecord: the TFDS preset and a field map, both ways", "[tfrecord]") {
  TempDir t;
  auto want = MakeSamples(4);
  WriteOptions o;
  o.format_options["tfrecord.preset"] = "tfds";
  WriteDs("tfrecord:" + (t / "tfds.tfrecord"), want, o);
  std::string file = ReadFile(t / "tfds.tfrecord");
  pb::Example ex;
  REQUIRE(ex.ParseFromArray(file.data() + 12, int(Le64(file, 0))));
  CHECK(ex.features().feature().at("label").int64_list().value(0) == 0);  // 0-based in TFDS
  CHECK(ex.features().feature().at("file_name").bytes_list().value(0) == "cat/s000.jpg");
  CHECK(ex.features().feature().count("image"));
  DatasetInfo info;
  CheckSame(ReadAll(t / "tfds.tfrecord", &info), want);
  CHECK(info.extra["preset"] == "tfds");

  WriteOptions m;
  m.format_options["tfrecord.field_map"] = "pixels=jpg,y=cls-1,id=__key__";
  WriteDs("tfrecord:" + (t / "mapped.tfrecord"), want, m);
  file = ReadFile(t / "mapped.tfrecord");
  REQUIRE(ex.ParseFromArray(file.data() + 12, int(Le64(file, 0))));
  CHECK(ex.features().feature().at("y").int64_list().value(0) == 1);
  CHECK(ex.features().feature().at("id").bytes_list().value(0) == "cat/s000");
  // The manifest records the map; the bare file needs it given.
  CheckSame(ReadAll(t / "mapped.tfrecord.json"), want);
  OpenOptions oo;
  oo.field_map = {{"pixels", "jpg"}, {"y", "cls-1"}, {"id", "__key__"}};
  CheckSame(ReadAll(t / "mapped.tfrecord", nullptr, oo), want);
  // Without the map the features are still all there (nothing dropped), keys from record numbers.
  auto plain = ReadAll(t / "mapped.tfrecord", &info);
  CHECK(info.extra["preset"] == "none");
  CHECK(plain[1].key == "000000001");
  CHECK(plain[1].find("pixels"));
  CHECK(plain[1].find("tfexample.pb"));  // y is an int64: carried

  WriteOptions bad;
  bad.format_options["tfrecord.field_map"] = "a=Not An Ext";
  CHECK(Create("tfrecord:" + (t / "bad.tfrecord"), bad).status().code() == Code::kInvalidArgument);
}

TEST_CASE("tfrecord: GZIP and ZLIB files are written and read", "[tfrecord]") {
  TempDir t;
  auto want = MakeSamples(6);
  for (std::string c : {"gzip", "zlib"}) {
    DYNAMIC_SECTION(c) {
      WriteOptions o;
      o.format_options["tfrecord.compression"] = c;
      std::string path = t / (c + ".tfrecord");
      WriteDs("tfrecord:" + path, want, o);
      std::string bytes = ReadFile(path);
      if (c == "gzip") CHECK((uint8_t(bytes[0]) == 0x1f && uint8_t(bytes[1]) == 0x8b));
      if (c == "zlib") CHECK(uint8_t(bytes[0]) == 0x78);
      CHECK_FALSE(std::filesystem::exists(t / (c + ".idx")));  // DALI reads uncompressed files only
      DatasetInfo info;
      CheckSame(ReadAll(path, &info), want);
      CHECK(info.extra["compression"] == c);
      // Detected by content too.
      std::filesystem::copy_file(path, t / (c + "-noext"));
      CHECK(*DetectFormat(t / (c + "-noext")) == "tfrecord");
      auto n = WriteDaliIndex(path);
      CHECK(n.status().code() == Code::kUnsupported);
    }
  }
}

TEST_CASE("tfrecord: hostile files fail with the file and offset named, never crash", "[tfrecord][hostile]") {
  TempDir t;
  std::string good = Frame(ImagenetRecord(MakeJpeg(8, 8, 1), 1, "a.JPEG"));
  std::string second = Frame(ImagenetRecord(MakeJpeg(8, 8, 2), 2, "b.JPEG"));
  auto expect = [&](const std::string& name, const std::string& bytes, Code code, const std::string& needle,
                    int64_t offset) {
    std::string path = t / name;
    WriteFile(path, bytes);
    Status st = OpenAndRead("tfrecord:" + path);
    INFO(name << ": " << st.ToString());
    CHECK(st.code() == code);
    CHECK(st.where().file == path);
    CHECK(st.message().find(needle) != std::string::npos);
    if (offset >= 0) CHECK(st.where().offset == offset);
  };
  SECTION("data CRC mismatch: typed detail, offset and key") {
    std::string bad = second;
    bad[bad.size() / 2] ^= 1;
    std::string path = t / "crc.tfrecord";
    WriteFile(path, good + bad);
    Status st = OpenAndRead("tfrecord:" + path);
    INFO(st.ToString());
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.detail() == Detail::kSampleChecksum);
    CHECK(st.where().offset == int64_t(good.size()));
    CHECK(st.where().index == 1);
    CHECK(st.where().file == path);
  }
  SECTION("length CRC mismatch") {
    std::string bad = second;
    bad[9] ^= 0x40;
    expect("lcrc.tfrecord", good + bad, Code::kCorrupt, "length CRC mismatch", int64_t(good.size()));
  }
  SECTION("length past the end (a huge length with a valid CRC)") {
    std::string h(12, '\0');
    uint64_t len = 1ull << 62;
    for (int i = 0; i < 8; ++i) h[i] = char(len >> (8 * i));
    uint32_t c = tfr::MaskedCrc32c(h.data(), 8);
    std::memcpy(h.data() + 8, &c, 4);
    expect("past.tfrecord", good + h + "abc", Code::kCorrupt, "runs past the end", int64_t(good.size()));
  }
  SECTION("truncated file") {
    expect("trunc.tfrecord", good + second.substr(0, second.size() - 3), Code::kCorrupt, "runs past the end",
           int64_t(good.size()));
    expect("trunc-header.tfrecord", good + second.substr(0, 7), Code::kCorrupt, "truncated record header",
           int64_t(good.size()));
  }
  SECTION("truncated gzip stream") {
    std::string gz = Deflate(good + second, 15 + 16);
    expect("trunc.tfrecord.gz", gz.substr(0, gz.size() - 10), Code::kCorrupt, "truncated", -1);
  }
  SECTION("gzip bomb") {
    // 64 MiB of zeros inside one record: about 64 KiB of gzip, over the 64x / 16 MiB cap.
    std::string huge = Frame(std::string(64u << 20, '\0'));
    std::string gz = Deflate(huge, 15 + 16);
    huge.clear();
    huge.shrink_to_fit();
    expect("bomb.tfrecord", gz, Code::kCorrupt, "zip bomb", -1);
  }
  SECTION("not an Example") {
    expect("junk.tfrecord", Frame(std::string("\x0a\xff\xff\xff\xff\x0f", 6)), Code::kCorrupt,
           "not a tf.train.Example", 0);
  }
  SECTION("an index that points outside the file, or at no record") {
    std::string path = t / "x.tfrecord";
    WriteFile(path, good + second);
    WriteFile(t / "x.idx", fmt::format("0 {}\n{} 999999\n", good.size(), good.size() + 1000000));
    Status st = OpenAndRead("tfrecord:" + path);
    INFO(st.ToString());
    CHECK(st.code() == Code::kCorrupt);
    CHECK(st.where().file == t / "x.idx");
    CHECK(st.message().find("index line 2") != std::string::npos);
    WriteFile(t / "x.idx", fmt::format("0 {}\n{} {}\n", good.size(), good.size() + 4, second.size()));
    CHECK(OpenAndRead("tfrecord:" + path).where().file == t / "x.idx");
    WriteFile(t / "x.idx", fmt::format("0 {}\n{} {}\n", good.size(), good.size(), second.size()));
    CHECK(OpenAndRead("tfrecord:" + path).ok());
  }
  SECTION("through the CLI: exit 1, the file and offset named, nothing written") {
    std::string bad = second;
    bad[9] ^= 0x40;
    WriteFile(t / "cli.tfrecord", good + bad);
    RunResult r = Cli(fmt::format("convert {} wds:{}", Q(t / "cli.tfrecord"), Q(t / "out/x-%06d.tar")));
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("cli.tfrecord") != std::string::npos);
    CHECK(r.err.find(fmt::format("offset {}", good.size())) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(t / "out/x-000000.tar"));
  }
  SECTION("an empty file is an empty dataset") {
    WriteFile(t / "empty.tfrecord", "");
    auto ds = Open("tfrecord:" + (t / "empty.tfrecord"));
    REQUIRE(ds.ok());
    CHECK((*ds)->info().num_samples == 0u);
  }
}

TEST_CASE("tfrecord: verify finds damaged records by key, index writes DALI's tfrecord2idx", "[tfrecord][verify]") {
  TempDir t;
  auto want = MakeSamples(8);
  WriteOptions o;
  o.samples_per_shard = 4;
  o.write_index = false;
  WriteDs("tfrecord:" + (t / "v-%05d.tfrecord"), want, o);
  auto clean = Verify(t / "v.tfrecord.json", {});
  REQUIRE(clean.ok());
  CHECK(clean->ok());
  CHECK(clean->samples == 8);
  CHECK(clean->sample_checksums);

  // `shardkit index` for a TFRecord file: "offset size" per record, as tfrecord2idx writes.
  RunResult r = Cli("index " + Q(t / "v-00000.tfrecord"));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("v-00000.idx") != std::string::npos);
  std::string idx = ReadFile(t / "v-00000.idx");
  auto ds = Open(t / "v-00000.tfrecord");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().extra.at("index") == "DALI .idx beside the files (checked)");
  CHECK(std::count(idx.begin(), idx.end(), '\n') == 4);
  CHECK(idx.rfind("0 ", 0) == 0);

  std::string path = t / "v-00001.tfrecord";
  std::string bytes = ReadFile(path);
  size_t at = bytes.find("payload-marker-0006-end");
  REQUIRE(at != std::string::npos);
  bytes[at + 5] ^= 0x20;
  WriteFile(path, bytes);
  auto bad = Verify(t / "v.tfrecord.json", {});
  REQUIRE(bad.ok());
  CHECK_FALSE(bad->ok());
  int sums = 0;
  for (const auto& f : bad->findings)
    if (f.kind == FindingKind::kSampleChecksum) {
      ++sums;
      CHECK(f.where.key == "cat/s006");
    }
  CHECK(sums == 1);
  CHECK(bad->count(FindingKind::kShardChecksum) == 1);  // the manifest's whole-file checksum

  RunResult v = Cli("verify " + Q(t / "v.tfrecord.json"));
  CHECK(v.exit_code != 0);
  RunResult info = Cli("info " + Q(t / "v.tfrecord.json"));
  INFO(info.out << info.err);
  CHECK(info.exit_code == 0);
  CHECK(info.out.find("tfrecord") != std::string::npos);
}

TEST_CASE("tfrecord: writer refuses what it cannot write and leaves nothing half-done", "[tfrecord]") {
  TempDir t;
  WriteOptions o;
  o.samples_per_shard = 2;
  CHECK(Create("tfrecord:" + (t / "one.tfrecord"), o).status().code() == Code::kInvalidArgument);
  o = {};
  o.format_options["tfrecord.compression"] = "lz4";
  CHECK(Create("tfrecord:" + (t / "one.tfrecord"), o).status().code() == Code::kInvalidArgument);
  {
    o = {};
    o.samples_per_shard = 2;
    auto w = Create("tfrecord:" + (t / "p-%03d.tfrecord"), o);
    REQUIRE(w.ok());
    for (const auto& s : MakeSamples(5)) REQUIRE((*w)->Write(s).ok());
  }  // destroyed without Finish(): what it published is removed
  CHECK(std::filesystem::is_empty(t.path()));
  // An existing output is refused without overwrite.
  WriteDs("tfrecord:" + (t / "e.tfrecord"), MakeSamples(2));
  auto again = Create("tfrecord:" + (t / "e.tfrecord"));
  CHECK(again.status().detail() == Detail::kOutputExists);
}

TEST_CASE("tfrecord: the loader reads TFRecords by index and streamed, file by file", "[tfrecord][loader]") {
  TempDir t;
  auto want = MakeSamples(10);
  WriteOptions o;
  o.samples_per_shard = 4;
  WriteDs("tfrecord:" + (t / "l-%05d.tfrecord"), want, o);
  for (bool stream : {false, true}) {
    INFO("stream " << stream);
    LoaderOptions lo;
    lo.batch_size = 3;
    lo.output_width = 16;
    lo.output_height = 16;
    lo.threads = 2;
    lo.stream = stream;
    lo.shuffle = true;
    lo.seed = 3;
    auto l = Loader::Create(t / "l.tfrecord.json", lo);
    INFO(l.status().ToString());
    REQUIRE(l.ok());
    CHECK((*l)->class_names() == kClasses);
    CHECK((*l)->streaming() == stream);
    std::map<std::string, int64_t> seen;
    for (const auto& b : Drain(**l))
      for (size_t i = 0; i < b.keys.size(); ++i) seen[b.keys[i]] = b.labels[i];
    REQUIRE(seen.size() == want.size());
    for (const auto& s : want) CHECK(seen.at(s.key) == *s.label());
  }
}

TEST_CASE("tfrecord: shard --num-shards writes even TFRecord shards", "[tfrecord]") {
  TempDir t;
  auto want = MakeSamples(10);
  WriteDs("tfrecord:" + (t / "src.tfrecord"), want);
  for (std::string dst : {"tfrecord:" + (t / "a/x-%05d.tfrecord"), t / "b/x-%05d.tfrecord"}) {
    INFO(dst);
    ShardOptions so;
    so.num_shards = 3;
    auto r = Shard(t / "src.tfrecord.json", dst, so);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->destination_format == "tfrecord");
    REQUIRE(r->shards.size() == 3);
    CHECK(r->shards[0].samples == 4);
    CHECK(r->shards[2].samples == 3);
    std::string manifest = dst.substr(dst.find(':') == std::string::npos ? 0 : dst.find(':') + 1);
    manifest = manifest.substr(0, manifest.find("/x-")) + "/x.tfrecord.json";
    DatasetInfo info;
    CheckSame(ReadAll(manifest, &info), want);
    CHECK(info.class_names == kClasses);
  }
  // Tar shard patterns still go to tar shards.
  ShardOptions so;
  so.num_shards = 2;
  auto r = Shard(t / "src.tfrecord.json", t / "c/x-%06d.tar", so);
  REQUIRE(r.ok());
  CHECK(r->destination_format == "wds");
}
