// The format registry: content-scored detection (the highest bid wins, a tie
// goes to the earlier row), unknown schemes, and the typed answers the pipeline
// asks of a format (shards, checksum kinds, claimed extensions).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/registry.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using sk_test::TempDir;
namespace fs = std::filesystem;

namespace {

Sample Make(std::string key, std::vector<std::pair<std::string, std::string>> fields) {
  Sample s;
  s.key = std::move(key);
  for (auto& [e, b] : fields) s.set(e, Bytes::Copy(b));
  return s;
}

// Writes two samples to `address` and finishes.
void WriteTwo(const std::string& address, const WriteOptions& o = {}) {
  auto w = Create(address, o);
  INFO(address << ": " << w.status().ToString());
  REQUIRE(w.ok());
  REQUIRE((*w)->Write(Make("a", {{"txt", "one"}, {"cls", "0"}})).ok());
  REQUIRE((*w)->Write(Make("b", {{"txt", "two"}, {"cls", "1"}})).ok());
  auto f = (*w)->Finish();
  INFO(f.status().ToString());
  REQUIRE(f.ok());
}

int Bid(const char* format, const std::string& path) {
  const formats::Format* f = formats::Find(format);
  REQUIRE(f != nullptr);
  return f->bid_read(path);
}

// Runs in a fresh current directory and goes back on destruction.
class InDir {
 public:
  explicit InDir(const std::string& dir) : old_(fs::current_path()) { fs::current_path(dir); }
  ~InDir() { fs::current_path(old_); }

 private:
  fs::path old_;
};

}  // namespace

TEST_CASE("registry: an unknown scheme is an error listing the known ones, not a relative path") {
  TempDir t;
  InDir here(t.path());
  sk_test::MakeImageFolder(t / "images", 2, 2);
  for (std::string dst : {"parquet:/data/x-%05d.parquet", "wsd:out/x-%06d.tar", "s3:bucket/x"}) {
    INFO(dst);
    ConvertOptions o;
    auto r = Convert(t / "images", dst, o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
    std::string scheme = dst.substr(0, dst.find(':') + 1);
    CHECK_THAT(r.status().message(), Catch::Contains("unknown scheme '" + scheme + "'"));
    for (const auto& name : FormatNames()) CHECK_THAT(r.status().message(), Catch::Contains(name + ":"));
    CHECK_THAT(r.status().message(), Catch::Contains("pipe:"));
    CHECK_THAT(r.status().message(), Catch::Contains("'./" + dst + "'"));
    CHECK_FALSE(fs::exists(scheme));  // no directory named "parquet:" appeared
    CHECK_FALSE(fs::exists(t / scheme));
    // So does Shard(), which otherwise puts the wds scheme in front.
    auto sh = Shard(t / "images", dst, ShardOptions{});
    REQUIRE_FALSE(sh.ok());
    CHECK(sh.status().code() == Code::kInvalidArgument);
    CHECK_THAT(sh.status().message(), Catch::Contains("unknown scheme '" + scheme + "'"));
    CHECK_FALSE(fs::exists(scheme));
    // Reading names the same problem.
    auto d = DetectFormat(dst);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == Code::kInvalidArgument);
    CHECK(Open(dst).status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("registry: a path with a colon still works when written as a path") {
  TempDir t;
  InDir here(t.path());
  // ./odd:name and an absolute path holding a colon are paths.
  WriteTwo("./odd:name");
  CHECK(fs::is_directory(t / "odd:name"));
  auto d = DetectFormat("./odd:name");
  REQUIRE(d.ok());
  CHECK(*d == "folder");
  WriteTwo(t / "abs:dir");
  auto ds = Open(t / "abs:dir");
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 2u);
  // A one-letter prefix (a drive) and a "::" shard list are not schemes.
  WriteTwo("wds:" + t / "s-%06d.tar");
  fs::copy_file(t / "s-000000.tar", t / "c:x.tar");
  d = DetectFormat("c:x.tar");
  REQUIRE(d.ok());
  CHECK(*d == "wds");
  fs::copy_file(t / "s-000000.tar", t / "ab.tar");
  d = DetectFormat("ab.tar::c:x.tar");
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  CHECK(*d == "wds");
  // pipe: is the wds format's, not an unknown scheme.
  d = DetectFormat("pipe:cat " + t / "s-000000.tar");
  REQUIRE(d.ok());
  CHECK(*d == "wds");
  auto p = Open("pipe:cat " + t / "s-000000.tar");
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  auto r = (*p)->NewReader();
  REQUIRE(r.ok());
  Sample s;
  REQUIRE(*(*r)->Next(&s));
  CHECK(s.key == "a");
}

TEST_CASE("registry: bids score content first, the highest bid wins") {
  TempDir t;
  WriteTwo("wds:" + t / "s-%06d.tar");
  WriteTwo("lmdb:" + t / "db.lmdb");
  WriteTwo("hdf5:" + t / "f.h5");
  WriteTwo("folder:" + t / "dir");

  // Verified content bids 100; a name alone bids less.
  CHECK(Bid("wds", t / "s-000000.tar") == 100);
  CHECK(Bid("wds", t / "s.manifest.json") == 100);
  CHECK(Bid("lmdb", t / "db.lmdb") == 100);
  CHECK(Bid("hdf5", t / "f.h5") == 100);
  CHECK(Bid("folder", t / "dir") == 50);
  sk_test::WriteFile(t / "empty.tar", "");
  CHECK(Bid("wds", t / "empty.tar") == 90);
  sk_test::WriteFile(t / "nosig.h5", std::string(64, 'x'));
  CHECK(Bid("hdf5", t / "nosig.h5") == 90);
  fs::create_directories(t / "fake");
  sk_test::WriteFile(t / "fake/data.mdb", std::string(4096, '\0'));
  CHECK(Bid("lmdb", t / "fake") == 95);
  sk_test::WriteFile(t / "other.manifest.json", R"({"format": "something-else"})");
  CHECK(Bid("wds", t / "other.manifest.json") == 90);

  // A damaged first tar header: still a shard (to report on), by its name.
  std::string tar = sk_test::ReadFile(t / "s-000000.tar");
  std::string bad = tar;
  bad[148] ^= 0x01;  // the header checksum field
  sk_test::WriteFile(t / "bad.tar", bad);
  CHECK(Bid("wds", t / "bad.tar") == 90);

  // Content beats the name: a tar named .bin or .h5 is read as wds, an HDF5
  // file named .tar as hdf5.
  fs::copy_file(t / "s-000000.tar", t / "shard.bin");
  fs::copy_file(t / "s-000000.tar", t / "shard.h5");
  fs::copy_file(t / "f.h5", t / "really-hdf5.tar");
  auto d = DetectFormat(t / "shard.bin");
  REQUIRE(d.ok());
  CHECK(*d == "wds");
  auto ds = Open(t / "shard.bin");
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 2u);
  d = DetectFormat(t / "shard.h5");
  REQUIRE(d.ok());
  CHECK(*d == "wds");
  d = DetectFormat(t / "really-hdf5.tar");
  REQUIRE(d.ok());
  CHECK(*d == "hdf5");
  // A directory holding data.mdb is LMDB even when its data file is damaged.
  d = DetectFormat(t / "fake");
  REQUIRE(d.ok());
  CHECK(*d == "lmdb");
}

TEST_CASE("registry: the folder writer leaves names other formats claim alone") {
  TempDir t;
  for (const char* name : {"x.idx", "x.json", "x.mdb", "x.he5", "x.tgz"}) {
    INFO(name);
    auto w = Create(t / name);
    REQUIRE_FALSE(w.ok());
    CHECK(w.status().code() == Code::kInvalidArgument);
    CHECK_THAT(w.status().message(), Catch::Contains("cannot tell the format"));
  }
  // Every extension is claimed by exactly the formats that list it.
  for (const auto& f : formats::All())
    for (const auto& e : f.extensions) {
      CHECK(e.find('.') == std::string::npos);
      CHECK(formats::ClaimedByAnother(e, *formats::Find("folder")));
    }
  CHECK_FALSE(formats::ClaimedByAnother("jpg", *formats::Find("folder")));
}

TEST_CASE("registry: typed answers: shards, checksum kinds, file per sample") {
  TempDir t;
  WriteOptions o;
  o.samples_per_shard = 1;
  WriteTwo("wds:" + t / "s-%06d.tar", o);
  WriteTwo("lmdb:" + t / "db.lmdb");
  {
    WriteOptions caffe;
    caffe.format_options["lmdb.layout"] = "caffe";
    auto w = Create("lmdb:" + t / "caffe.lmdb", caffe);
    REQUIRE(w.ok());
    REQUIRE((*w)->Write(Make("a", {{"jpg", sk_test::MakeJpeg(8, 8, 1)}, {"cls", "0"}})).ok());
    REQUIRE((*w)->Finish().ok());
  }
  WriteTwo("hdf5:" + t / "f.h5");
  WriteTwo("folder:" + t / "dir");

  auto wds = Open(t / "s.manifest.json");
  REQUIRE(wds.ok());
  const DatasetInfo& wi = (*wds)->info();
  REQUIRE(wi.shards.size() == 2);
  for (const auto& sh : wi.shards) {
    CHECK(sh.address == "wds:" + sh.path);
    auto one = Open(sh.address);
    REQUIRE(one.ok());
    CHECK((*one)->info().num_samples == 1u);
  }
  CHECK_FALSE(wi.file_per_sample);
  CHECK(wi.sample_checksums == SampleChecksums::kList);

  const formats::Format* wf = formats::Find(wi.format);
  REQUIRE(wf->list_shards);
  CHECK(wf->writes_shards);
  CHECK(formats::ShardWriter() == wf);
  auto list = wf->list_shards(t / "s.manifest.json", OpenOptions{});
  REQUIRE(list.ok());
  CHECK(list->metadata == t / "s.manifest.json");
  CHECK(list->num_samples == 2u);
  REQUIRE(list->shards.size() == 2);
  CHECK(list->shards[1].path == t / "s-000001.tar");
  CHECK(list->shards[1].samples == 1u);
  CHECK(list->shards[1].checksum == wi.shards[1].checksum);
  auto brace = wf->list_shards(t / "s-{000000..000001}.tar", OpenOptions{});
  REQUIRE(brace.ok());
  CHECK(brace->metadata.empty());
  CHECK(brace->shards.size() == 2);
  CHECK_FALSE(brace->shards[0].samples);
  CHECK(wf->list_shards(t / "none.tar", OpenOptions{}).status().code() == Code::kNotFound);
  sk_test::WriteFile(t / "junk.manifest.json", "{not json");
  auto junk = wf->list_shards(t / "junk.manifest.json", OpenOptions{});
  REQUIRE(junk.ok());
  CHECK_FALSE(junk->unreadable.empty());
  auto where = wf->locate_samples(t / "s-000001.tar", 1);
  REQUIRE(where.ok());
  REQUIRE(where->size() == 1);
  CHECK((*where)[0].key == "b");
  CHECK((*where)[0].offset % 512 == 0);
  // The first field in name order is "cls", whose bytes are "1".
  CHECK(sk_test::ReadFile(t / "s-000001.tar").substr((*where)[0].offset, 1) == "1");

  auto lm = Open(t / "db.lmdb");
  REQUIRE(lm.ok());
  CHECK((*lm)->info().sample_checksums == SampleChecksums::kInRecords);
  CHECK_FALSE((*lm)->info().sample_checksums_where.empty());
  CHECK((*lm)->info().shards[0].address.empty());
  auto cf = Open(t / "caffe.lmdb");
  REQUIRE(cf.ok());
  CHECK((*cf)->info().sample_checksums == SampleChecksums::kList);
  auto h5 = Open(t / "f.h5");
  REQUIRE(h5.ok());
  CHECK((*h5)->info().sample_checksums == SampleChecksums::kList);
  auto dir = Open(t / "dir");
  REQUIRE(dir.ok());
  CHECK((*dir)->info().sample_checksums == SampleChecksums::kNoMetadata);
  CHECK((*dir)->info().file_per_sample);
  CHECK_FALSE(formats::Find((*dir)->info().format)->list_shards);
}

TEST_CASE("registry: recordio bids on its magic first, then on the .rec name") {
  TempDir t;
  WriteTwo(t / "a.rec");
  CHECK(Bid("recordio", t / "a.rec") == 100);
  // A renamed .rec is still found by its first record header.
  fs::copy_file(t / "a.rec", t / "renamed.bin");
  CHECK(Bid("recordio", t / "renamed.bin") == 100);
  CHECK(*DetectFormat(t / "renamed.bin") == "recordio");
  // A damaged first header: the name still says so (and open reports the damage).
  sk_test::WriteFile(t / "bad.rec", std::string(16, 'x'));
  CHECK(Bid("recordio", t / "bad.rec") == 90);
  CHECK(Bid("recordio", t / "renamed-not.tar") == 0);
  for (const auto& f : formats::All())
    if (std::string(f.name) != "recordio") CHECK(f.bid_read(t / "a.rec") < 90);
  CHECK(Bid("recordio", t / "x-{0..1}.rec") == 90);
  CHECK(formats::Find("recordio")->bid_write(t / "out-%05d.rec") == 90);
  CHECK(formats::ClaimedByAnother("rec", *formats::Find("folder")));
}
