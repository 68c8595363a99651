// Tests of the wds format: WebDataset tar shards written by shardkit and by
// other tools (GNU tar, bsdtar, Python's tarfile).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "io/file.h"
#include "core/paths.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"

using namespace shardkit;
using sk_test::FaultFs;
using sk_test::Q;
using sk_test::Run;
using sk_test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kLongDir(60, 'd');  // with a long base name, member names pass 100 bytes
const std::string kLongKey = kLongDir + "/" + std::string(70, 'k');
const std::string kUtf8Key = "caf\xc3\xa9/\xe5\x9b\xbe\xe7\x89\x87_1";  // "café/图片_1"
const std::string kBinaryKey = "latin1/na\xefve";  // not UTF-8: must come back byte-exact

Sample MakeSample(const std::string& key, int label, uint32_t seed, bool with_json = false) {
  Sample s;
  s.key = key;
  s.set("jpg", Bytes::Take(sk_test::MakeJpeg(16 + int(seed % 7), 12, seed)));
  s.set_label(label);
  if (with_json) s.set("json", Bytes::Take(fmt::format("{{\"seed\": {}}}", seed)));
  return s;
}

std::vector<Sample> MakeSamples(int n, bool odd_names = false) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) out.push_back(MakeSample(fmt::format("c{}/img{:04d}", i % 3, i), i % 3, uint32_t(i + 1), i % 2));
  if (odd_names) {
    out.push_back(MakeSample(kLongKey, 1, 1000, true));
    out.push_back(MakeSample(kUtf8Key, 2, 1001));
    out.push_back(MakeSample(kBinaryKey, 0, 1002));
  }
  return out;
}

WriteSummary WriteAll(const std::string& address, const std::vector<Sample>& samples, WriteOptions opts = {}) {
  auto w = Create(address, opts);
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

Result<std::vector<Sample>> ReadAll(const std::string& address) {
  SK_ASSIGN_OR_RETURN(auto ds, Open(address));
  SK_ASSIGN_OR_RETURN(auto reader, ds->NewReader());
  std::vector<Sample> out;
  for (;;) {
    Sample s;
    SK_ASSIGN_OR_RETURN(bool more, reader->Next(&s));
    if (!more) break;
    out.push_back(std::move(s));
  }
  return out;
}

void CheckSame(const std::vector<Sample>& got, const std::vector<Sample>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("sample " << i << " key " << want[i].key);
    CHECK(got[i].key == want[i].key);
    REQUIRE(got[i].fields.size() == want[i].fields.size());
    for (size_t j = 0; j < got[i].fields.size(); ++j) {
      CHECK(got[i].fields[j].ext == want[i].fields[j].ext);
      CHECK(got[i].fields[j].data == want[i].fields[j].data);
    }
  }
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes every field of the samples as KEY.EXT files below dir.
void Unpack(const std::vector<Sample>& samples, const std::string& dir) {
  for (const auto& s : samples)
    for (const auto& f : s.fields) {
      std::string p = dir + "/" + s.key + "." + f.ext;
      fs::create_directories(fs::path(p).parent_path());
      sk_test::WriteFile(p, f.data.str());
    }
}

// GNU tar 1.34 does not know the POSIX pax keyword "hdrcharset" (present on the
// member whose name is not UTF-8) and says so on stderr; it still uses the raw name.
std::string WithoutHdrcharsetNotes(const std::string& err) {
  std::istringstream in(err);
  std::string line, out;
  while (std::getline(in, line))
    if (line.find("Ignoring unknown extended header keyword 'hdrcharset'") == std::string::npos) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("wds: write/read round trip keeps keys, labels, class names and bytes", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(20, true);
  WriteOptions opts;
  opts.class_names = {"cat", "dog", "eel"};
  opts.samples_per_shard = 8;
  auto sum = WriteAll("wds:" + t / "out/train-%06d.tar", samples, opts);
  CHECK(sum.samples == 23);
  REQUIRE(sum.shards.size() == 3);
  CHECK(Files(t / "out") == std::vector<std::string>{"train-000000.idx", "train-000000.tar", "train-000000.tar.xxh3",
                                                     "train-000001.idx", "train-000001.tar", "train-000001.tar.xxh3",
                                                     "train-000002.idx", "train-000002.tar", "train-000002.tar.xxh3",
                                                     "train.manifest.json"});

  // The manifest is an address (detected without a scheme), and so is a brace range.
  for (std::string addr : {t / "out/train.manifest.json", t / "out/train-{000000..000002}.tar",
                           t / "out/train-000000.tar::" + t / "out/train-000001.tar::" + t / "out/train-000002.tar"}) {
    INFO(addr);
    REQUIRE(DetectFormat(addr).ok());
    CHECK(*DetectFormat(addr) == "wds");
    auto got = ReadAll(addr);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CheckSame(*got, samples);
    for (size_t i = 0; i < samples.size(); ++i) CHECK((*got)[i].label() == samples[i].label());
  }

  auto ds = Open(t / "out/train.manifest.json");
  REQUIRE(ds.ok());
  const DatasetInfo& info = (*ds)->info();
  CHECK(info.format == "wds");
  CHECK(info.num_samples == 23u);
  CHECK(info.class_names == opts.class_names);
  CHECK(info.fields == std::vector<std::string>{"cls", "jpg", "json"});
  REQUIRE(info.shards.size() == 3);
  uint64_t total = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto& s = info.shards[i];
    CHECK(s.samples == (i < 2 ? 8u : 7u));
    CHECK(s.bytes == fs::file_size(s.path));
    CHECK(s.checksum == paths::ChecksumString(*paths::HashFile(s.path)));
    CHECK(s.checksum == sum.shards[i].checksum);
    total += s.bytes;
  }
  CHECK(info.total_bytes == total);

  // A brace range without manifest: counts and fields from the shards themselves.
  auto ds2 = Open(t / "out/train-{000000..000002}.tar");
  REQUIRE(ds2.ok());
  CHECK((*ds2)->info().num_samples == 23u);
  CHECK((*ds2)->info().fields == std::vector<std::string>{"cls", "jpg", "json"});
}

TEST_CASE("wds: two writes of the same input give identical bytes", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(12, true);
  WriteOptions opts;
  opts.samples_per_shard = 5;
  opts.class_names = {"a", "b", "c"};
  // The process locale must not change the bytes (libarchive converts names by locale).
  REQUIRE(setlocale(LC_ALL, "C.UTF-8") != nullptr);
  WriteAll(t / "a/s-%03d.tar", samples, opts);
  setlocale(LC_ALL, "C");
  WriteAll(t / "b/s-%03d.tar", samples, opts);
  auto files = Files(t / "a");
  CHECK(files.size() == 10);  // 3 shards, 3 indexes, 3 checksum files, the manifest
  CHECK(files == Files(t / "b"));
  for (const auto& f : files) {
    INFO(f);
    CHECK(sk_test::ReadFile(t / "a/" + f) == sk_test::ReadFile(t / "b/" + f));
  }
  // Also under another locale in another process: the shard bytes do not depend on LANG.
  auto r = Run(fmt::format("cd {} && LANG=C LC_ALL=C tar tf s-002.tar", Q(t / "a")));
  CHECK(r.exit_code == 0);
}

TEST_CASE("wds: shards split by sample count and by size", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(10);
  WriteOptions by_count;
  by_count.samples_per_shard = 3;
  auto s1 = WriteAll(t / "n/x-%d.tar", samples, by_count);
  REQUIRE(s1.shards.size() == 4);
  CHECK(s1.shards[0].samples == 3);
  CHECK(s1.shards[3].samples == 1);
  CHECK(s1.shards[3].path == t / "n/x-3.tar");

  WriteOptions by_size;
  by_size.shard_size = 6 * 1024;
  auto s2 = WriteAll(t / "s/x-%06d.tar", samples, by_size);
  CHECK(s2.shards.size() > 2);
  uint64_t n = 0;
  for (const auto& s : s2.shards) {
    INFO(s.path);
    CHECK(s.bytes <= by_size.shard_size);
    CHECK(s.bytes == fs::file_size(s.path));
    CHECK(s.samples >= 1);
    n += s.samples;
  }
  CHECK(n == 10);
  auto got = ReadAll(t / "s/x.manifest.json");
  REQUIRE(got.ok());
  CheckSame(*got, samples);
}

TEST_CASE("wds: GNU tar and bsdtar list and extract the shards byte-exact", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(9, true);
  WriteOptions opts;
  opts.samples_per_shard = 4;
  auto sum = WriteAll(t / "out/d-%06d.tar", samples, opts);
  Unpack(samples, t / "src");
  for (std::string tool : {"tar", "bsdtar"}) {
    INFO(tool);
    std::string dst = t / ("x-" + tool);
    fs::create_directories(dst);
    std::string listed;
    for (const auto& s : sum.shards) {
      auto l = Run(fmt::format("LC_ALL=C.UTF-8 {} tf {}", tool, Q(s.path)));
      CHECK(l.exit_code == 0);
      CHECK(WithoutHdrcharsetNotes(l.err).empty());
      listed += l.out;
      auto x = Run(fmt::format("LC_ALL=C.UTF-8 {} -xf {} -C {}", tool, Q(s.path), Q(dst)));
      CHECK(x.exit_code == 0);
      INFO(x.err);
      CHECK(WithoutHdrcharsetNotes(x.err).empty());
    }
    CHECK(listed.find(kLongKey + ".jpg\n") != std::string::npos);
    CHECK(listed.find("c0/img0000.cls\nc0/img0000.jpg\n") != std::string::npos);  // sorted extensions
    auto d = Run(fmt::format("diff -r {} {}", Q(t / "src"), Q(dst)));
    CHECK(d.exit_code == 0);
    CHECK(d.out.empty());
  }
  // Members are read-only regular files owned by 0:0 with mtime 0 and no user names.
  auto v = Run(fmt::format("tar --numeric-owner -tvf {}", Q(sum.shards[0].path)));
  CHECK(v.out.find("-r--r--r-- 0/0") != std::string::npos);
  CHECK(v.out.find("1970-01-01") != std::string::npos);
}

TEST_CASE("wds: shards made by GNU tar and Python tarfile read correctly", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(6, true);
  Unpack(samples, t / "src");
  // Members in sample order, sorted by extension within a sample.
  std::string list;
  for (const auto& s : samples)
    for (const auto& f : s.fields) list += s.key + "." + f.ext + "\n";
  sk_test::WriteFile(t / "list.txt", list);

  for (std::string fmt_name : {"gnu", "pax", "ustar"}) {
    INFO("GNU tar --format=" << fmt_name);
    std::string out = t / ("gnu-" + fmt_name + ".tar");
    auto r = Run(fmt::format("cd {} && tar --format={} -cf {} -T {}", Q(t / "src"), fmt_name, Q(out), Q(t / "list.txt")));
    if (fmt_name == "ustar") {
      // ustar cannot hold the 131-byte name without a '/' split that fits: GNU tar refuses it.
      continue;
    }
    REQUIRE(r.exit_code == 0);
    auto got = ReadAll(out);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CheckSame(*got, samples);
  }

  // A directory tarred whole ("tar cf x.tar ." gives ./ names and directory members).
  {
    std::vector<Sample> flat = {MakeSample("a", 0, 5), MakeSample("b", 1, 6, true)};
    Unpack(flat, t / "flat");
    auto r = Run(fmt::format("cd {} && tar --sort=name -cf ../flat.tar .", Q(t / "flat")));
    REQUIRE(r.exit_code == 0);
    auto got = ReadAll(t / "flat.tar");
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CheckSame(*got, flat);
  }

  // bsdtar (libarchive's restricted pax by default), under a UTF-8 locale.
  {
    std::string out = t / "bsdtar.tar";
    auto r = Run(fmt::format("cd {} && LC_ALL=C.UTF-8 bsdtar -cf {} -T {}", Q(t / "src"), Q(out), Q(t / "list.txt")));
    REQUIRE(r.exit_code == 0);
    auto got = ReadAll(out);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CheckSame(*got, samples);
  }

  // Python's tarfile, as the WebDataset TarWriter uses it (PAX by default, and GNU).
  for (std::string py_fmt : {"PAX_FORMAT", "GNU_FORMAT"}) {
    INFO("tarfile " << py_fmt);
    std::string out = t / ("py-" + py_fmt + ".tar");
    std::string script = fmt::format(R"(
import io, sys, tarfile
src, out, lst = sys.argv[1], sys.argv[2], sys.argv[3]
names = [l for l in open(lst, 'rb').read().split(b'\n') if l]
with tarfile.open(out, 'w', format=tarfile.{}, encoding='utf-8', errors='surrogateescape') as tf:
    for n in names:
        data = open(src.encode() + b'/' + n, 'rb').read()
        ti = tarfile.TarInfo(n.decode('utf-8', 'surrogateescape'))
        ti.size = len(data); ti.mode = 0o444; ti.mtime = 1700000000; ti.uname = 'bigdata'; ti.gname = 'bigdata'
        tf.addfile(ti, io.BytesIO(data))
)",
                                     py_fmt);
    sk_test::WriteFile(t / "w.py", script);
    auto r = Run(fmt::format("/usr/bin/python3 {} {} {} {}", Q(t / "w.py"), Q(t / "src"), Q(out), Q(t / "list.txt")));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    auto got = ReadAll(out);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CheckSame(*got, samples);
  }
}

TEST_CASE("wds: the DALI index holds the real member offsets", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(7, true);
  WriteOptions opts;
  opts.samples_per_shard = 5;
  auto sum = WriteAll(t / "o/v-%06d.tar", samples, opts);
  size_t next = 0;
  for (const auto& s : sum.shards) {
    std::string idx_path = s.path.substr(0, s.path.size() - 4) + ".idx";
    std::string tar = sk_test::ReadFile(s.path);
    std::istringstream in(sk_test::ReadFile(idx_path));
    std::string version;
    uint64_t n = 0;
    in >> version >> n;
    CHECK(version == "v1.2");
    CHECK(n == s.samples);
    std::string line;
    std::getline(in, line);
    for (uint64_t i = 0; i < n; ++i) {
      REQUIRE(std::getline(in, line));
      const Sample& want = samples[next++];
      std::istringstream ls(line);
      std::string ext, name;
      uint64_t off, size;
      size_t k = 0;
      while (ls >> ext >> off >> size >> name) {
        REQUIRE(k < want.fields.size());
        CHECK(ext == want.fields[k].ext);
        CHECK(name == want.key + "." + ext);
        CHECK(off % 512 == 0);
        REQUIRE(off + size <= tar.size());
        CHECK(tar.substr(off, size) == want.fields[k].data.str());
        ++k;
      }
      CHECK(k == want.fields.size());
    }
  }
  CHECK(next == samples.size());

  // An index that leaves out the first sample (consistent otherwise) is not
  // trusted: every byte before an indexed member must be accounted for, else
  // samples would silently go missing (found by fuzz_dali_index). The shard is
  // scanned instead and all samples come back.
  std::string idx0 = t / "o/v-000000.idx";
  std::string text = sk_test::ReadFile(idx0);
  size_t l1 = text.find('\n'), l2 = text.find('\n', l1 + 1);
  sk_test::WriteFile(idx0, fmt::format("v1.2 {}\n", sum.shards[0].samples - 1) + text.substr(l2 + 1));
  auto ds = Open(t / "o/v.manifest.json");
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  CHECK((*ra)->size() == samples.size());
  Sample first;
  REQUIRE((*ra)->Get(0, &first).ok());
  CHECK(first.key == samples[0].key);
}

TEST_CASE("wds: random access equals the sequential read, from many threads", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(30, true);
  WriteOptions opts;
  opts.samples_per_shard = 7;
  WriteAll(t / "r/r-%06d.tar", samples, opts);
  for (bool with_idx : {true, false}) {
    INFO("with idx " << with_idx);
    if (!with_idx)
      for (const auto& f : Files(t / "r"))
        if (f.size() > 4 && f.substr(f.size() - 4) == ".idx") fs::remove(t / "r/" + f);
    for (std::string addr : {t / "r/r.manifest.json", t / "r/r-{000000..000004}.tar"}) {
      auto ds = Open(addr);
      REQUIRE(ds.ok());
      auto seq = ReadAll(addr);
      REQUIRE(seq.ok());
      auto ra = (*ds)->NewRandomAccess();
      INFO(ra.status().ToString());
      REQUIRE(ra.ok());
      REQUIRE((*ra)->size() == seq->size());
      std::vector<Sample> got(seq->size());
      std::vector<std::thread> threads;
      std::atomic<int> failures{0};
      for (int th = 0; th < 4; ++th)
        threads.emplace_back([&, th] {
          for (size_t i = size_t(th); i < got.size(); i += 4)
            if (!(*ra)->Get(i, &got[i]).ok()) ++failures;
        });
      for (auto& th : threads) th.join();
      CHECK(failures == 0);
      CheckSame(got, *seq);
      CheckSame(got, samples);
      Sample s;
      CHECK((*ra)->Get(got.size(), &s).code() == Code::kInvalidArgument);
    }
  }
}

TEST_CASE("wds: writer errors name the culprit", "[wds]") {
  TempDir t;
  SECTION("bad pattern") {
    auto w = Create("wds:" + t / "out/train.tar");
    REQUIRE_FALSE(w.ok());
    CHECK(w.status().code() == Code::kInvalidArgument);
    CHECK(w.status().message().find("%06d") != std::string::npos);
    CHECK_FALSE(Create("wds:" + t / "out/t-%d-%d.tar").ok());
    CHECK_FALSE(Create("wds:" + t / "out-%d/t.tar").ok());
    // Every shard would share one DALI index name.
    auto same_idx = Create("wds:" + t / "out/t.v2-%d.tar");
    REQUIRE_FALSE(same_idx.ok());
    CHECK(same_idx.status().message().find(".idx") != std::string::npos);
  }
  SECTION("key with a dot, and --key-dots=replace") {
    auto w = Create(t / "k/x-%06d.tar");
    REQUIRE(w.ok());
    Status s = (*w)->Write(MakeSample("dir.v1/img.001", 0, 3));
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(s.message().find("dir.v1/img.001") != std::string::npos);
    CHECK(s.message().find("--key-dots=replace") != std::string::npos);
    CHECK(s.where().key == "dir.v1/img.001");
    WriteOptions opts;
    opts.key_dots = KeyDots::kReplace;
    opts.overwrite = true;
    WriteAll(t / "k/x-%06d.tar", {MakeSample("dir.v1/img.001", 0, 3)}, opts);
    auto got = ReadAll(t / "k/x.manifest.json");
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    CHECK((*got)[0].key == "dir.v1/img_001");
  }
  SECTION("unsafe keys") {
    for (std::string key : {"../escape", "/abs/x", "a//b", "a/./b"}) {
      INFO(key);
      auto w = Create(t / "u/x-%06d.tar", WriteOptions{.overwrite = true});
      REQUIRE(w.ok());
      Status s = (*w)->Write(MakeSample(key, 0, 3));
      CHECK(s.code() == Code::kInvalidArgument);
      CHECK(s.where().key == key);
    }
  }
  SECTION("existing output without overwrite") {
    WriteAll(t / "e/x-%06d.tar", MakeSamples(2));
    auto w = Create(t / "e/x-%06d.tar");
    REQUIRE_FALSE(w.ok());
    CHECK(w.status().code() == Code::kAlreadyExists);
  }
  SECTION("unwritable output leaves no partial file") {
    sk_test::WriteFile(t / "file", "x");
    auto w = Create(t / "file/sub/x-%06d.tar");
    CHECK_FALSE(w.ok());
    if (::geteuid() != 0) {
      fs::create_directories(t / "ro");
      fs::permissions(t / "ro", fs::perms::owner_read | fs::perms::owner_exec);
      auto w2 = Create(t / "ro/x-%06d.tar");
      CHECK_FALSE(w2.ok());
      CHECK(w2.status().message().find("not writable") != std::string::npos);
      fs::permissions(t / "ro", fs::perms::owner_all);
    }
    // A write failure (disk full) in the middle of the second shard: the error
    // names the shard and says how to resume; the first shard and the journal
    // stay (the resumable state, tests/resume_test.cc), nothing else does.
    fs::create_directories(t / "full");
    int writes = 0;
    auto faults = FaultFs([&](const std::string& path, std::string_view op) {
      return (op == "write" && path.find("x-000001.tar") != std::string::npos && ++writes >= 1) ? ENOSPC : 0;
    });
    {
      WriteOptions opts;
      opts.samples_per_shard = 2;
      opts.filesystem = faults;
      auto w3 = Create(t / "full/x-%06d.tar", opts);
      REQUIRE(w3.ok());
      Status st;
      for (const auto& s : MakeSamples(6)) {
        st = (*w3)->Write(s);
        if (!st.ok()) break;
      }
      if (st.ok()) st = (*w3)->Finish().status();
      CHECK(st.code() == Code::kIOError);
      CHECK(st.where().file.find("x-000001.tar") != std::string::npos);
      CHECK(st.message().find("--resume") != std::string::npos);
    }
    CHECK(Files(t / "full") == std::vector<std::string>{"x-000000.idx", "x-000000.tar", "x-000000.tar.xxh3", "x.manifest.json.partial"});
  }
  SECTION("destroying a writer without Finish removes its shards") {
    {
      auto w = Create(t / "d/x-%06d.tar", WriteOptions{.samples_per_shard = 1});
      REQUIRE(w.ok());
      for (const auto& s : MakeSamples(3)) REQUIRE((*w)->Write(s).ok());
      CHECK(Files(t / "d").size() >= 4);
    }
    CHECK(Files(t / "d").empty());
  }
}

TEST_CASE("wds: damaged and hostile shards give Corrupt errors with file and offset", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(4);
  auto sum = WriteAll(t / "g/x-%06d.tar", samples, WriteOptions{.write_index = false});
  std::string good = sk_test::ReadFile(sum.shards[0].path);

  auto expect_corrupt = [&](const std::string& name, const std::string& bytes, int64_t offset,
                            const std::string& words) {
    std::string p = t / name;
    sk_test::WriteFile(p, bytes);
    auto r = ReadAll(p);
    INFO(name);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == Code::kCorrupt);
    CHECK(r.status().where().file == p);
    if (offset >= 0) CHECK(r.status().where().offset == offset);
    CHECK(r.status().message().find(words) != std::string::npos);
    // Random access reports the same.
    auto ds = Open(p);
    CHECK_FALSE(ds.ok());
  };

  SECTION("truncated in the middle of a member") {
    // The second member's data starts at 1536 (header 1024..1536); cut inside it.
    expect_corrupt("trunc.tar", good.substr(0, 1600), 1024, "remain");
  }
  SECTION("missing end blocks") { expect_corrupt("noend.tar", good.substr(0, good.size() - 1024), -1, "end-of-archive"); }
  SECTION("trailing garbage") {
    expect_corrupt("trail.tar", good + std::string(512, '\0') + "garbage", int64_t(good.size() + 512), "trailing");
  }
  SECTION("not a tar") { expect_corrupt("junk.tar", std::string(2048, 'j'), 0, "checksum"); }
  SECTION("empty file") { expect_corrupt("empty.tar", "", 0, "empty"); }
  SECTION("member declaring 16 GiB in a short file") {
    std::string s = good;
    // Rewrite the first header's size field in base-256 and fix its checksum.
    std::string size(12, '\0');
    size[0] = char(0x80);
    size[7] = 0x04;  // 0x04 << 32 = 16 GiB
    s.replace(124, 12, size);
    s.replace(148, 8, "        ");
    unsigned sum2 = 0;
    for (int i = 0; i < 512; ++i) sum2 += uint8_t(s[i]);
    s.replace(148, 8, fmt::format("{:06o}", sum2) + std::string("\0 ", 2));
    expect_corrupt("huge.tar", s, 0, "17179869184");
  }
  SECTION("every truncation point is an error, never a short read") {
    for (size_t cut = 0; cut + 512 < good.size(); cut += 37) {
      sk_test::WriteFile(t / "cut.tar", good.substr(0, cut));
      auto r = ReadAll(t / "cut.tar");
      INFO("cut at " << cut);
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == Code::kCorrupt);
      CHECK(r.status().where().file == t / "cut.tar");
      CHECK(r.status().where().offset >= 0);
      CHECK(r.status().where().offset <= int64_t(cut));
    }
  }
  SECTION("random damage never crashes") {
    for (uint32_t seed = 1; seed <= 200; ++seed) {
      std::string s = good;
      uint32_t x = seed * 2654435761u;
      for (size_t k = 0; k < s.size() / 100 + 1; ++k) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        s[x % s.size()] = char(x >> 24);
      }
      sk_test::WriteFile(t / "rnd.tar", s);
      auto r = ReadAll(t / "rnd.tar");
      if (!r.ok()) CHECK((r.status().code() == Code::kCorrupt || r.status().code() == Code::kUnsupported));
    }
  }
}

TEST_CASE("wds: reader rules for duplicate fields, extensions, links and metadata", "[wds]") {
  TempDir t;
  auto make = [&](const std::string& name, const std::string& py_members) {
    std::string script = R"(
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as tf:
    def add(name, data=b'x', type=tarfile.REGTYPE, link=''):
        ti = tarfile.TarInfo(name); ti.size = len(data) if type == tarfile.REGTYPE else 0
        ti.type = type; ti.linkname = link
        tf.addfile(ti, io.BytesIO(data) if type == tarfile.REGTYPE else None)
)" + py_members;
    sk_test::WriteFile(t / "mk.py", script);
    auto r = Run(fmt::format("/usr/bin/python3 {} {}", Q(t / "mk.py"), Q(t / name)));
    REQUIRE(r.exit_code == 0);
    return t / name;
  };
  SECTION("the same extension twice in one sample") {
    std::string p = make("dup.tar", "    add('a.jpg'); add('a.cls', b'1'); add('a.JPG', b'y')\n");
    auto r = ReadAll(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kCorrupt);
    CHECK(r.status().where().file == p);
    CHECK(r.status().where().key == "a");
    CHECK(r.status().where().shard == 0);
    CHECK(r.status().where().offset == 2048);
    CHECK(r.status().message().find("'jpg'") != std::string::npos);
  }
  SECTION("a member without extension is an error, not silently dropped") {
    std::string p = make("noext.tar", "    add('a.jpg'); add('README')\n");
    auto r = ReadAll(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("'README'") != std::string::npos);
    CHECK(r.status().message().find("no extension") != std::string::npos);
    CHECK(r.status().where().offset == 1024);
  }
  SECTION("links are refused") {
    std::string p = make("link.tar", "    add('a.jpg'); add('b.jpg', type=tarfile.SYMTYPE, link='a.jpg')\n");
    auto r = ReadAll(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("symbolic link") != std::string::npos);
    CHECK(r.status().message().find("'b.jpg'") != std::string::npos);
  }
  SECTION("names that escape are refused") {
    std::string p = make("esc.tar", "    add('../../etc/x.jpg')\n");
    auto r = ReadAll(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("../../etc/x.jpg") != std::string::npos);
  }
  SECTION("metadata, hidden files and directories are skipped and counted") {
    std::string p = make("meta.tar",
                         "    add('__meta__.json'); add('d', type=tarfile.DIRTYPE); add('d/a.jpg', b'A');"
                         " add('d/a.CLS', b'3'); add('d/.hidden.txt'); add('./b.seg.png', b'P')\n");
    auto r = ReadAll(p);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    REQUIRE(r->size() == 2);
    CHECK((*r)[0].key == "d/a");
    CHECK((*r)[0].find("cls")->data.str() == "3");
    CHECK((*r)[0].label() == 3);
    CHECK((*r)[1].key == "b");
    CHECK((*r)[1].find("seg.png")->data.str() == "P");
    auto ds = Open(p);
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("skipped_members") == "2");
    CHECK((*ds)->info().num_samples == 2u);
  }
}

TEST_CASE("wds: an index that does not match its shard is not trusted", "[wds]") {
  TempDir t;
  auto samples = MakeSamples(6);
  samples.push_back(MakeSample("with space/img 1", 1, 77));
  WriteOptions opts;
  opts.samples_per_shard = 4;
  auto sum = WriteAll(t / "i/x-%06d.tar", samples, opts);
  REQUIRE(sum.shards.size() == 2);
  // White space in a name: DALI's v1.1 (no names) for that shard.
  CHECK(sk_test::ReadFile(t / "i/x-000001.idx").substr(0, 7) == "v1.1 3\n");
  CHECK(sk_test::ReadFile(t / "i/x-000000.idx").substr(0, 7) == "v1.2 4\n");
  // Shard 0 gets a wrong index: offsets and names of another shard.
  sk_test::WriteFile(t / "i/x-000000.idx", "v1.2 2\ncls 512 1 c0/img0000.cls jpg 1536 30 c0/img0000.jpg\n"
                                            "cls 3072 1 c1/img0001.cls\n");
  for (std::string addr : {t / "i/x-{000000..000001}.tar", t / "i/x.manifest.json"}) {
    auto ds = Open(addr);
    REQUIRE(ds.ok());
    auto ra = (*ds)->NewRandomAccess();
    REQUIRE(ra.ok());
    std::vector<Sample> got((*ra)->size());
    for (size_t i = 0; i < got.size(); ++i) REQUIRE((*ra)->Get(i, &got[i]).ok());
    CheckSame(got, samples);
  }
  // A shard truncated after it was indexed is refused, not mapped past its end.
  auto ds = Open(t / "i/x.manifest.json");
  REQUIRE(ds.ok());
  fs::resize_file(t / "i/x-000001.tar", 1024);
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE_FALSE(ra.ok());
  CHECK(ra.status().where().file == t / "i/x-000001.tar");
}
