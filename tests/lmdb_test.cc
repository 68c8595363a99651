// The lmdb format: both layouts, written and read by shardkit and by real
// clients (mdb_stat, mdb_dump, Python's lmdb + msgpack, Python's protobuf),
// map growth, read-only opening, and damaged data.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <filesystem>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "io/file.h"
#include "core/paths.h"
#include "formats/lmdb/lmdb.h"
#include "formats/registry.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kPy = "/usr/bin/python3";

// Samples with a JPEG (or PNG every 5th), a label, and for the shardkit layout a json field.
std::vector<Sample> MakeSamples(int n, bool extra_fields, int size = 32) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("c{}/img_{:04d}", i % 3, i);
    if (i % 5 == 4) s.set("png", Bytes::Take(MakePng(size, size + 1, uint32_t(i))));
    else s.set("jpg", Bytes::Take(MakeJpeg(size + i % 7, size, uint32_t(i))));
    s.set_label(i % 3);
    if (extra_fields) s.set("json", Bytes::Take(fmt::format("{{\"i\": {}}}", i)));
    out.push_back(std::move(s));
  }
  return out;
}

void WriteAll(const std::string& address, const std::vector<Sample>& samples, WriteOptions opts = {}) {
  if (opts.class_names.empty()) opts.class_names = {"c0", "c1", "c2"};
  auto w = Create(address, opts);
  REQUIRE(w.ok());
  for (const auto& s : samples) {
    Status st = (*w)->Write(s);
    REQUIRE(st.ok());
  }
  auto sum = (*w)->Finish();
  REQUIRE(sum.ok());
  CHECK(sum->samples == samples.size());
}

std::vector<Sample> ReadAll(const Dataset& ds) {
  std::vector<Sample> out;
  auto r = ds.NewReader();
  REQUIRE(r.ok());
  for (;;) {
    Sample s;
    auto more = (*r)->Next(&s);
    if (!more.ok()) FAIL(more.status().ToString());
    if (!*more) break;
    out.push_back(std::move(s));
  }
  return out;
}

void CheckSame(const std::vector<Sample>& a, const std::vector<Sample>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("sample " << i << " key " << a[i].key);
    CHECK(a[i].key == b[i].key);
    REQUIRE(a[i].fields.size() == b[i].fields.size());
    for (size_t j = 0; j < a[i].fields.size(); ++j) {
      CHECK(a[i].fields[j].ext == b[i].fields[j].ext);
      CHECK(a[i].fields[j].data == b[i].fields[j].data);
    }
  }
}

// Python with the dynamic Datum class (no .proto file needed).
const char* kPyDatum = R"(
import sys
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
fdp = descriptor_pb2.FileDescriptorProto(name='datum_test.proto', package='t', syntax='proto2')
m = fdp.message_type.add(name='Datum')
F = descriptor_pb2.FieldDescriptorProto
for name, num, typ, lab in [('channels',1,F.TYPE_INT32,F.LABEL_OPTIONAL),('height',2,F.TYPE_INT32,F.LABEL_OPTIONAL),
    ('width',3,F.TYPE_INT32,F.LABEL_OPTIONAL),('data',4,F.TYPE_BYTES,F.LABEL_OPTIONAL),('label',5,F.TYPE_INT32,F.LABEL_OPTIONAL),
    ('float_data',6,F.TYPE_FLOAT,F.LABEL_REPEATED),('encoded',7,F.TYPE_BOOL,F.LABEL_OPTIONAL)]:
    m.field.add(name=name, number=num, type=typ, label=lab)
pool = descriptor_pool.DescriptorPool(); pool.Add(fdp)
desc = pool.FindMessageTypeByName('t.Datum')
try:
    Datum = message_factory.GetMessageClass(desc)
except AttributeError:
    Datum = message_factory.MessageFactory(pool).GetPrototype(desc)
)";

}  // namespace

TEST_CASE("lmdb: shardkit layout round trip, metadata, files", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(57, true);
  std::string out = t / "train.lmdb";
  WriteAll(out, samples);
  CHECK(fs::exists(out + "/data.mdb"));
  CHECK(fs::exists(out + "/lock.mdb"));
  CHECK(fs::exists(out + "/shardkit.json"));
  for (const auto& e : fs::directory_iterator(t.path()))  // no .partial left behind
    CHECK(e.path().filename().string() == "train.lmdb");

  auto fmt_name = DetectFormat(out);
  REQUIRE(fmt_name.ok());
  CHECK(*fmt_name == "lmdb");
  auto ds = Open(out);
  REQUIRE(ds.ok());
  const DatasetInfo& info = (*ds)->info();
  CHECK(info.format == "lmdb");
  CHECK(info.num_samples == 57u);
  CHECK(info.class_names == std::vector<std::string>{"c0", "c1", "c2"});
  CHECK(info.fields == std::vector<std::string>{"cls", "jpg", "json", "png"});
  CHECK(info.extra.at("layout") == "shardkit");
  REQUIRE(info.shards.size() == 1);
  CHECK(info.shards[0].path == out + "/data.mdb");
  CHECK(info.shards[0].bytes == fs::file_size(out + "/data.mdb"));
  CHECK(info.shards[0].checksum.rfind("xxh3:", 0) == 0);

  auto got = ReadAll(**ds);
  CheckSame(got, samples);
  CHECK(got[7].label() == 1);
  // Zero-copy: field bytes point into LMDB's map, not a private copy.
  CHECK(got[0].find("jpg")->data.owner() != nullptr);

  // Refused without overwrite; replaced with it.
  auto again = Create(out, {});
  CHECK(again.status().code() == Code::kAlreadyExists);
  WriteOptions ow;
  ow.overwrite = true;
  auto fewer = MakeSamples(5, false);
  WriteAll(out, fewer, ow);
  auto ds2 = Open("lmdb:" + out + "/");
  REQUIRE(ds2.ok());
  CHECK((*ds2)->info().num_samples == 5u);
  CheckSame(ReadAll(**ds2), fewer);
}

TEST_CASE("lmdb: random access equals sequential, from many threads", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(200, false, 16);
  WriteAll(t / "a.lmdb", samples);
  auto ds = Open(t / "a.lmdb");
  REQUIRE(ds.ok());
  auto seq = ReadAll(**ds);
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE((*ra)->size() == 200);
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int k = 0; k < 8; ++k)
    th.emplace_back([&, k] {
      std::mt19937 rng(k);
      for (int n = 0; n < 500; ++n) {
        uint64_t i = rng() % 200;
        Sample s;
        Status st = (*ra)->Get(i, &s);
        if (!st.ok() || s.key != seq[i].key || s.fields.size() != seq[i].fields.size() ||
            !(s.fields[1].data == seq[i].fields[1].data))
          ++bad;
      }
    });
  for (auto& x : th) x.join();
  CHECK(bad == 0);
  Sample s;
  CHECK((*ra)->Get(200, &s).code() == Code::kInvalidArgument);
  // Bytes outlive the dataset and the RandomAccess.
  REQUIRE((*ra)->Get(3, &s).ok());
  ra->reset();
  ds->reset();
  CHECK(s.find("jpg")->data == samples[3].find("jpg")->data);
}

// Random access under stress: 16 threads at once, in waves of new threads (a
// thread's read transaction goes to the next thread once it exits), two
// RandomAccess objects of one dataset, both layouts. Every thread keeps every
// sample it read; all of them must still equal the source after the threads,
// the RandomAccess objects and the dataset are gone.
TEST_CASE("lmdb: random access from 16 threads in waves: bytes equal, views outlive everything", "[lmdb]") {
  TempDir t;
  for (std::string layout : {"shardkit", "caffe"}) {
    DYNAMIC_SECTION(layout) {
      auto samples = MakeSamples(300, false, 24);
      WriteOptions o;
      o.format_options["lmdb.layout"] = layout;
      std::string dir = t / (layout + ".lmdb");
      WriteAll(dir, samples, o);
      REQUIRE(io::Exists(dir + "/lock.mdb"));  // readers use LMDB's reader table (1024 slots)
      auto ds = Open(dir);
      REQUIRE(ds.ok());
      auto ra1 = (*ds)->NewRandomAccess();
      auto ra2 = (*ds)->NewRandomAccess();
      REQUIRE(ra1.ok());
      REQUIRE(ra2.ok());
      constexpr int kThreads = 16, kWaves = 70;  // 1120 threads: more than the reader table holds
      std::vector<std::vector<std::pair<uint64_t, Sample>>> kept(kThreads);
      std::atomic<int> errors{0};
      std::string first_error;
      std::mutex mu;
      for (int wave = 0; wave < kWaves; ++wave) {
        std::vector<std::thread> th;
        for (int k = 0; k < kThreads; ++k)
          th.emplace_back([&, k, wave] {
            std::mt19937 rng(uint32_t(wave * kThreads + k));
            int reads = wave + 1 == kWaves ? 400 : 6;
            for (int n = 0; n < reads; ++n) {
              uint64_t i = rng() % samples.size();
              Sample s;
              Status st = ((n + k) % 2 ? **ra1 : **ra2).Get(i, &s);
              if (!st.ok()) {
                if (errors++ == 0) {
                  std::lock_guard<std::mutex> g(mu);
                  first_error = st.ToString();
                }
                return;
              }
              if (n % 3 == 0) kept[k].emplace_back(i, std::move(s));  // held past this Get
            }
          });
        for (auto& x : th) x.join();
      }
      INFO(first_error);
      REQUIRE(errors == 0);
      ra1->reset();
      ra2->reset();
      ds->reset();
      size_t checked = 0;
      for (const auto& per_thread : kept)
        for (const auto& [i, s] : per_thread) {
          INFO("sample " << i);
          REQUIRE(s.key == samples[i].key);
          const Field* img = samples[i].fields[0].ext == "cls" ? &samples[i].fields[1] : &samples[i].fields[0];
          REQUIRE(s.find(img->ext));
          CHECK(s.find(img->ext)->data == img->data);
          CHECK(s.label() == samples[i].label());
          ++checked;
        }
      CHECK(checked > 2000);
    }
  }
}

TEST_CASE("lmdb: the map grows from a tiny size without losing or duplicating a sample", "[lmdb]") {
  TempDir t;
  formats::lmdb::SetInitialMapSizeForTest(64 << 10);
  formats::lmdb::SetBatchSamplesForTest(37);
  auto samples = MakeSamples(300, true, 48);
  WriteAll(t / "grow.lmdb", samples);
  formats::lmdb::SetInitialMapSizeForTest(0);
  formats::lmdb::SetBatchSamplesForTest(0);
  auto ds = Open(t / "grow.lmdb");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 300u);
  CheckSame(ReadAll(**ds), samples);  // the reader also checks keys are exactly 0..N-1
  auto r = Run(fmt::format("mdb_stat {}", Q(t / "grow.lmdb")));
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("Entries: 300") != std::string::npos);
}

TEST_CASE("lmdb: mdb_stat, mdb_dump and Python lmdb+msgpack read shardkit's output", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(12, true);
  std::string out = t / "py.lmdb";
  WriteAll(out, samples);
  auto st = Run(fmt::format("mdb_stat {}", Q(out)));
  REQUIRE(st.exit_code == 0);
  CHECK(st.out.find("Entries: 12") != std::string::npos);
  auto dump = Run(fmt::format("mdb_dump -p {}", Q(out)));
  REQUIRE(dump.exit_code == 0);
  CHECK(dump.out.find(" 0000000000\n") != std::string::npos);
  CHECK(dump.out.find(" 0000000011\n") != std::string::npos);
  CHECK(dump.out.find("shardkit.json") == std::string::npos);  // metadata is not a key

  std::string script = t / "read.py";
  WriteFile(script, std::string(R"(
import lmdb, msgpack, json, sys
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
with env.begin() as txn:
    keys = [k for k, _ in txn.cursor()]
    assert keys == [b'%010d' % i for i in range(12)], keys
    rec = msgpack.unpackb(txn.get(b'0000000004'))
meta = json.load(open(sys.argv[1] + '/shardkit.json'))
assert meta['num_samples'] == 12 and meta['class_names'] == ['c0', 'c1', 'c2']
print(rec['key'], sorted(rec['fields']), rec['fields']['cls'].decode())
open(sys.argv[2], 'wb').write(rec['fields']['png'])
)"));
  auto py = Run(fmt::format("{} {} {} {}", kPy, Q(script), Q(out), Q(t / "py.png")));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  CHECK(py.out == "c1/img_0004 ['cls', 'json', 'png'] 1\n");
  CHECK(ReadFile(t / "py.png") == samples[4].find("png")->data.str());
}

TEST_CASE("lmdb: caffe layout is what convert_imageset --encoded writes", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(11, false);
  std::string out = t / "caffe.lmdb";
  WriteOptions o;
  o.format_options["lmdb.layout"] = "caffe";
  WriteAll(out, samples, o);

  auto ds = Open(out);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().extra.at("layout") == "caffe");
  CHECK((*ds)->info().class_names == std::vector<std::string>{"c0", "c1", "c2"});
  auto got = ReadAll(**ds);
  CheckSame(got, samples);
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  Sample s;
  REQUIRE((*ra)->Get(9, &s).ok());
  CHECK(s.key == samples[9].key);
  CHECK(s.find("png")->data == samples[9].find("png")->data);

  // Python protobuf, knowing only Caffe's field numbers, decodes the value.
  std::string script = t / "caffe.py";
  WriteFile(script, std::string(kPyDatum) + std::string(R"(
import lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
with env.begin() as txn:
    keys = [k.decode() for k, _ in txn.cursor()]
    d = Datum(); d.ParseFromString(txn.get(keys[2].encode()))
print(keys[0], keys[4], len(keys))
print(d.encoded, d.label, d.channels, d.height, d.width)
open(sys.argv[2], 'wb').write(d.data)
)"));
  auto py = Run(fmt::format("{} {} {} {}", kPy, Q(script), Q(out), Q(t / "d2.jpg")));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  CHECK(py.out == "00000000_c0/img_0000.jpg 00000004_c1/img_0004.png 11\nTrue 2 3 32 34\n");
  CHECK(ReadFile(t / "d2.jpg") == samples[2].find("jpg")->data.str());

  // A field the layout cannot hold is refused with the key named.
  auto w = Create(t / "bad.lmdb", o);
  REQUIRE(w.ok());
  Sample x = samples[0];
  x.set("json", Bytes::Copy("{}"));
  Status e = (*w)->Write(x);
  CHECK(e.code() == Code::kUnsupported);
  CHECK(e.message().find("c0/img_0000") != std::string::npos);
  Sample longkey = samples[0];
  longkey.key = std::string(600, 'k');
  e = (*w)->Write(longkey);
  CHECK(e.code() == Code::kInvalidArgument);
  CHECK(e.message().find("kkkkkkkk") != std::string::npos);
}

TEST_CASE("lmdb: reads LMDBs written by Caffe (encoded and raw Datums, no json)", "[lmdb]") {
  TempDir t;
  std::string out = t / "bycaffe";
  std::string jpg = MakeJpeg(20, 10, 5);
  WriteFile(t / "a.jpg", jpg);
  std::string script = t / "mk.py";
  WriteFile(script, std::string(kPyDatum) + std::string(R"(
import lmdb
env = lmdb.open(sys.argv[1], map_size=1<<24)
with env.begin(write=True) as txn:
    d = Datum(encoded=True, label=4, data=open(sys.argv[2], 'rb').read())
    txn.put(b'00000000_n01/a.JPEG', d.SerializeToString())
    r = Datum(channels=3, height=2, width=2, label=9, data=bytes(range(12)))
    txn.put(b'00000001_n02/b.png', r.SerializeToString())
    n = Datum(encoded=True, label=1, data=open(sys.argv[2], 'rb').read())
    txn.put(b'00000002_noext', n.SerializeToString())
)"));
  auto py = Run(fmt::format("{} {} {} {}", kPy, Q(script), Q(out), Q(t / "a.jpg")));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().extra.at("layout") == "caffe");
  CHECK((*ds)->info().num_samples == 3u);
  auto got = ReadAll(**ds);
  REQUIRE(got.size() == 3);
  CHECK(got[0].key == "n01/a");
  CHECK(got[0].find("jpeg")->data.str() == jpg);
  CHECK(got[0].label() == 4);
  CHECK(got[1].key == "n02/b");
  CHECK(got[1].find("raw")->data.str() == std::string("\0\1\2\3\4\5\6\7\10\11\12\13", 12));
  CHECK(got[1].find("shape")->data.str().find("\"height\":2") != std::string::npos);
  CHECK(got[1].label() == 9);
  CHECK(got[2].key == "noext");
  CHECK(got[2].find("jpg") != nullptr);  // sniffed from the bytes
}

TEST_CASE("lmdb: reading never creates lock.mdb", "[lmdb]") {
  // Tests run as root, so a read-only directory cannot be simulated; what is
  // tested is the rule the reader follows: no lock.mdb in the directory ->
  // MDB_NOLOCK (the same path a non-writable directory takes).
  TempDir t;
  auto samples = MakeSamples(6, false);
  std::string out = t / "ro.lmdb";
  WriteAll(out, samples);
  fs::remove(out + "/lock.mdb");
  ::chmod(out.c_str(), 0555);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().extra.at("locking") == "none (MDB_NOLOCK)");
  CheckSame(ReadAll(**ds), samples);
  auto ra = (*ds)->NewRandomAccess();
  Sample s;
  REQUIRE((*ra)->Get(5, &s).ok());
  CHECK_FALSE(fs::exists(out + "/lock.mdb"));
  ::chmod(out.c_str(), 0755);
}

TEST_CASE("lmdb: a value that is not a record names the key and the environment", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(6, false);
  std::string out = t / "bad.lmdb";
  WriteAll(out, samples);
  std::string script = t / "poke.py";
  WriteFile(script, std::string(R"(
import lmdb, msgpack, sys
env = lmdb.open(sys.argv[1])
with env.begin(write=True) as txn:
    txn.put(b'0000000002', b'\x93garbage')
    rec = msgpack.unpackb(txn.get(b'0000000003'))
    img = bytearray(rec['fields']['jpg']); img[40] ^= 1; rec['fields']['jpg'] = bytes(img)
    txn.put(b'0000000003', msgpack.packb(rec))
)"));
  auto py = Run(fmt::format("{} {} {}", kPy, Q(script), Q(out)));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  Sample s;
  Status e = (*ra)->Get(2, &s);
  CHECK(e.code() == Code::kCorrupt);
  CHECK(e.message().find("'0000000002'") != std::string::npos);
  CHECK(e.message().find(out) != std::string::npos);
  // A bit flip inside a payload: random access does not hash payloads (the hot
  // path, as in the other formats); sequential reads and verify do.
  CHECK((*ra)->Get(3, &s).ok());
  auto r = (*ds)->NewReader();
  REQUIRE((*r)->Next(&s).ok());
  REQUIRE((*r)->Next(&s).ok());
  auto n = (*r)->Next(&s);
  CHECK(n.status().code() == Code::kCorrupt);
  CHECK(n.status().where().key == "0000000002");
}

TEST_CASE("lmdb: truncated and bit-flipped data.mdb give errors, not crashes", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(40, false, 64);
  std::string out = t / "src.lmdb";
  WriteAll(out, samples);
  std::string data = ReadFile(out + "/data.mdb");
  REQUIRE(data.size() > 3 * 4096);

  for (size_t keep : {size_t(0), size_t(100), size_t(4096), size_t(8192 + 10), data.size() / 2, data.size() - 4096}) {
    INFO("truncated to " << keep);
    std::string dir = t / fmt::format("trunc{}", keep);
    fs::create_directories(dir);
    WriteFile(dir + "/data.mdb", data.substr(0, keep));
    auto ds = Open(dir);
    REQUIRE_FALSE(ds.ok());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK(ds.status().where().file == dir + "/data.mdb");
  }

  // Random damage: many seeds, a few bytes each. Errors are fine; crashes,
  // hangs and wrong bytes handed out silently are not.
  int opened = 0, failed = 0, intact = 0;
  const char* env_seeds = std::getenv("SK_LMDB_FLIP_SEEDS");  // longer runs by hand
  const uint32_t seeds = env_seeds ? uint32_t(std::atoi(env_seeds)) : 200;
  for (uint32_t seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(seed);
    std::string bad = data;
    int flips = 1 + int(rng() % 8);
    // Odd seeds hit the meta pages and the tree's first pages, where damage hurts LMDB most.
    size_t range = seed % 2 ? std::min<size_t>(bad.size(), 4 * 4096) : bad.size();
    for (int k = 0; k < flips; ++k) bad[rng() % range] ^= char(1u << (rng() % 8));
    std::string dir = t / fmt::format("flip{}", seed);
    fs::create_directories(dir);
    WriteFile(dir + "/data.mdb", bad);
    fs::copy_file(out + "/shardkit.json", dir + "/shardkit.json");
    auto ds = Open(dir);
    if (!ds.ok()) {
      ++failed;
      fs::remove_all(dir);
      continue;
    }
    ++opened;
    auto r = (*ds)->NewReader();
    REQUIRE(r.ok());
    size_t i = 0;
    bool ok = true;
    for (;; ++i) {
      Sample s;
      auto more = (*r)->Next(&s);
      if (!more.ok()) {
        ok = false;
        break;
      }
      if (!*more) break;
      REQUIRE(i < samples.size());
      // Whatever is handed out without error is the original sample.
      CHECK(s.key == samples[i].key);
      CHECK(s.fields.back().data == samples[i].fields.back().data);
    }
    if (ok && i == samples.size()) ++intact;
    fs::remove_all(dir);
  }
  INFO("opened " << opened << " failed " << failed << " intact " << intact);
  CHECK(opened + failed == int(seeds));
}

TEST_CASE("lmdb: bids", "[lmdb]") {
  TempDir t;
  const formats::Format* f = nullptr;
  for (const auto& x : formats::All())
    if (std::string(x.name) == "lmdb") f = &x;
  REQUIRE(f);
  CHECK(f->bid_write("out/train.lmdb") == 90);
  CHECK(f->bid_write("out/train.lmdb/") == 90);
  CHECK(f->bid_write("out/train.tar") == 0);
  WriteAll(t / "x.lmdb", MakeSamples(2, false));
  // The meta page's magic verified: 100; a data.mdb without it is still LMDB's: 95.
  CHECK(f->bid_read(t / "x.lmdb") == 100);
  CHECK(f->bid_read(t / "x.lmdb/data.mdb") == 100);
  fs::create_directories(t / "damaged");
  WriteFile(t / "damaged/data.mdb", std::string(8192, '\0'));
  CHECK(f->bid_read(t / "damaged") == 95);
  CHECK(f->bid_read(t / "damaged/data.mdb") == 95);
  CHECK(f->bid_read(t.path()) == 0);
  auto ds = Open(t / "x.lmdb/data.mdb");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 2u);
}

TEST_CASE("lmdb: caffe layout values are checked against shardkit.json's sample checksums", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(4, false);
  std::string out = t / "c.lmdb";
  WriteOptions o;
  o.format_options["lmdb.layout"] = "caffe";
  WriteAll(out, samples, o);
  std::string script = t / "poke.py";
  WriteFile(script, std::string(kPyDatum) + R"(
import lmdb
env = lmdb.open(sys.argv[1])
with env.begin(write=True) as txn:
    k = b'00000001_c1/img_0001.jpg'
    d = Datum(); d.ParseFromString(txn.get(k))
    b = bytearray(d.data); b[50] ^= 4; d.data = bytes(b)
    txn.put(k, d.SerializeToString())
)");
  auto py = Run(fmt::format("{} {} {}", kPy, Q(script), Q(out)));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  Sample s;
  CHECK((*ra)->Get(0, &s).ok());
  CHECK((*ra)->Get(1, &s).ok());  // random access does not hash payloads
  auto rd = (*ds)->NewReader();
  REQUIRE((*rd)->Next(&s).ok());
  Status e = (*rd)->Next(&s).status();
  CHECK(e.code() == Code::kCorrupt);
  CHECK(e.message().find("checksum mismatch for sample 'c1/img_0001'") != std::string::npos);
  CHECK(e.message().find("00000001_c1/img_0001.jpg") != std::string::npos);
}

TEST_CASE("lmdb: nothing appears without Finish, and a failed sync is fatal", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(30, false);
  {
    auto w = Create(t / "gone.lmdb", {});
    REQUIRE(w.ok());
    for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
    CHECK(fs::exists(t / "gone.lmdb.partial"));
  }  // destroyed without Finish()
  CHECK(fs::is_empty(t.path()));

  WriteOptions eio;
  eio.filesystem = FaultFs([](const std::string& path, std::string_view op) {
    return op == "fsync" && path.find("data.mdb") != std::string::npos ? EIO : 0;
  });
  auto w = Create(t / "eio.lmdb", eio);
  REQUIRE(w.ok());
  for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
  auto r = (*w)->Finish();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kIOError);
  CHECK_FALSE(fs::exists(t / "eio.lmdb"));
  w->reset();
  CHECK(fs::is_empty(t.path()));

  // A bad sample is refused by name; the writer goes on.
  auto w2 = Create(t / "ok.lmdb", {});
  REQUIRE(w2.ok());
  Sample empty_key = samples[0];
  empty_key.key.clear();
  CHECK((*w2)->Write(empty_key).code() == Code::kInvalidArgument);
  REQUIRE((*w2)->Write(samples[0]).ok());
  REQUIRE((*w2)->Finish().ok());
}

// Without the test knob: transactions commit every 1000 samples (or 2 MiB) without a
// sync; data.mdb is synced once, in Finish(), and its recorded checksum is the XXH3 of
// the finished file.
TEST_CASE("lmdb: commits are not synced one by one, one sync before success, the file checksum holds", "[lmdb]") {
  TempDir t;
  std::vector<Sample> samples;
  for (int i = 0; i < 2500; ++i) {
    Sample s;
    s.key = fmt::format("c{}/k{:05d}", i % 3, i);
    s.set("jpg", Bytes::Take(fmt::format("bytes of sample {} ", i) + std::string(size_t(i % 97), 'x')));
    s.set_label(i % 3);
    samples.push_back(std::move(s));
  }
  std::atomic<int> commits{0}, syncs{0}, journal_writes{0};
  WriteOptions counted;
  counted.filesystem = FaultFs([&](const std::string& path, std::string_view op) {
    if (path.ends_with("/data.mdb") && op == "write") ++commits;
    if (path.ends_with("/data.mdb") && op == "fsync") ++syncs;
    if (path.find("resume.json") != std::string::npos && DataOp(op)) ++journal_writes;
    return 0;
  });
  std::string out = t / "a.lmdb";
  auto w = Create(out, counted);
  REQUIRE(w.ok());
  for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
  auto sum = (*w)->Finish();
  REQUIRE(sum.ok());
  CHECK(commits == 3);  // 1000 + 1000 + 500
  CHECK(syncs == 1);
  CHECK(journal_writes == 0);  // no durable point before Finish() in so small a write
  auto h = paths::HashFile(out + "/data.mdb");
  REQUIRE(h.ok());
  CHECK(sum->shards.at(0).checksum == paths::ChecksumString(*h));
  auto ds = Open(out);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().shards.at(0).checksum == paths::ChecksumString(*h));
  CheckSame(ReadAll(**ds), samples);
}

// Between durable points commits are not synced and resume.json lags behind them.
// A write killed at every file operation (in a child, SIGKILL from the fault hook),
// then resumed, ends with the same samples as an uninterrupted one; some kills leave
// more samples in the environment than the journal counts, and those are redone.
TEST_CASE("lmdb: killed between durable points, --resume drops the unsynced commits and ends equal", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(40, true);
  uint64_t total = 0;
  for (const auto& s : samples) total += s.bytes();
  formats::lmdb::SetBatchSamplesForTest(4);            // 10 commits
  formats::lmdb::SetDurableBytesForTest(total / 4);    // about 3 durable points among them
  WriteAll(t / "ref.lmdb", samples);
  auto ref_ds = Open(t / "ref.lmdb");
  REQUIRE(ref_ds.ok());
  auto ref = ReadAll(**ref_ds);
  CheckSame(ref, samples);
  int killed = 0, lagging = 0;
  for (int n = 1;; ++n) {
    std::string out = t / fmt::format("k{}.lmdb", n);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int ops = 0;
      WriteOptions o;
      o.filesystem = FaultFs([&](const std::string&, std::string_view op) {
        if (DataOp(op) && ++ops == n) ::raise(SIGKILL);
        return 0;
      });
      o.class_names = {"c0", "c1", "c2"};
      auto w = Create(out, o);
      bool ok = w.ok();
      for (size_t i = 0; ok && i < samples.size(); ++i) ok = (*w)->Write(samples[i]).ok();
      ok = ok && (*w)->Finish().ok();
      ::_exit(ok ? 0 : 3);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status)) {
      REQUIRE(WEXITSTATUS(status) == 0);
      break;  // n is past the last file operation
    }
    REQUIRE(WIFSIGNALED(status));
    ++killed;
    INFO("killed at file operation " << n);
    if (io::Exists(out)) continue;  // killed after the rename: complete
    std::string partial = out + ".partial";
    if (io::Exists(partial + "/resume.json") && io::Exists(partial + "/data.mdb")) {
      auto journal = io::ReadFile(partial + "/resume.json");
      REQUIRE(journal.ok());
      auto stat = Run("mdb_stat " + Q(partial) + " | sed -n 's/^ *Entries: //p'");
      size_t at = journal->find("\"samples\":");
      REQUIRE(at != std::string::npos);
      uint64_t journal_samples = std::stoull(journal->substr(at + 10));
      if (!stat.out.empty() && std::stoull(stat.out) > journal_samples) ++lagging;
    }
    WriteOptions resume;
    resume.class_names = {"c0", "c1", "c2"};
    resume.resume = true;
    auto w = Create(out, resume);
    REQUIRE(w.ok());
    for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
    auto sum = (*w)->Finish();
    INFO(sum.status().ToString());
    REQUIRE(sum.ok());
    auto ds = Open(out);
    REQUIRE(ds.ok());
    CheckSame(ReadAll(**ds), samples);
    CHECK_FALSE(io::Exists(partial));
  }
  formats::lmdb::SetBatchSamplesForTest(0);
  formats::lmdb::SetDurableBytesForTest(0);
  CHECK(killed > 8);
  CHECK(lagging > 0);  // the case this test is for did happen
}

// Commits between durable points are not synced, so after a power loss the partial
// environment may be damaged. --resume reads back every sample the journal counts
// before it builds on them: a damaged one is refused by name, not carried into the
// output.
TEST_CASE("lmdb: --resume refuses a partial environment whose committed samples are damaged", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(24, true);
  formats::lmdb::SetBatchSamplesForTest(4);  // every commit durable: the journal counts them all
  std::string out = t / "a.lmdb";
  {
    WriteOptions o;
    o.class_names = {"c0", "c1", "c2"};
    auto faults = FaultFs();
    o.filesystem = faults;
    auto w = Create(out, o);
    REQUIRE(w.ok());
    for (int i = 0; i < 10; ++i) REQUIRE((*w)->Write(samples[size_t(i)]).ok());
    // Abandoned as if killed: an ENOSPC at the next commit keeps the state.
    faults->SetFault([](const std::string& p, std::string_view op) {
      return op == "write" && p.ends_with("/data.mdb") ? ENOSPC : 0;
    });
    Status st;
    for (int i = 10; i < 12 && st.ok(); ++i) st = (*w)->Write(samples[size_t(i)]);
    faults->SetFault(nullptr);
    REQUIRE_FALSE(st.ok());
    CHECK(st.message().find("8 samples committed") != std::string::npos);
  }
  formats::lmdb::SetBatchSamplesForTest(0);
  std::string data = out + ".partial/data.mdb";
  REQUIRE(io::Exists(data));
  // Damage sample 5's json payload ({"i": 5}) inside the partial data.mdb.
  std::string bytes = ReadFile(data);
  size_t at = bytes.find("{\"i\": 5}");
  REQUIRE(at != std::string::npos);
  bytes[at + 6] = '7';
  WriteFile(data, bytes);
  WriteOptions resume;
  resume.class_names = {"c0", "c1", "c2"};
  resume.resume = true;
  auto w = Create(out, resume);
  REQUIRE_FALSE(w.ok());
  INFO(w.status().ToString());
  CHECK(w.status().code() == Code::kCorrupt);
  CHECK(w.status().message().find("cannot resume") != std::string::npos);
  CHECK(w.status().message().find("c2/img_0005") != std::string::npos);  // the damaged sample, by key
  CHECK(w.status().message().find("--overwrite") != std::string::npos);
  CHECK_FALSE(io::Exists(out));
  // Starting over works.
  WriteOptions over;
  over.class_names = {"c0", "c1", "c2"};
  over.overwrite = true;
  WriteAll(out, samples, over);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  CheckSame(ReadAll(**ds), samples);
}

TEST_CASE("lmdb: one directory opened twice in one process shares the environment", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(5, false);
  WriteAll(t / "two.lmdb", samples);
  auto a = Open(t / "two.lmdb");
  auto b = Open("lmdb:" + (t / "two.lmdb/"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto ra = (*a)->NewRandomAccess();
  auto rb = (*b)->NewRandomAccess();
  Sample x, y;
  REQUIRE((*ra)->Get(2, &x).ok());
  REQUIRE((*rb)->Get(2, &y).ok());
  CHECK(x.find("jpg")->data.data() == y.find("jpg")->data.data());  // same map
  a->reset();
  ra->reset();
  CheckSame(ReadAll(**b), samples);
}

TEST_CASE("lmdb: overwrite replaces only an LMDB directory", "[lmdb]") {
  TempDir t;
  fs::create_directories(t / "precious.lmdb");
  WriteFile(t / "precious.lmdb/notes.txt", "keep me");
  WriteOptions ow;
  ow.overwrite = true;
  auto w = Create(t / "precious.lmdb", ow);
  CHECK(w.status().code() == Code::kAlreadyExists);
  CHECK(ReadFile(t / "precious.lmdb/notes.txt") == "keep me");
}

TEST_CASE("lmdb: a flipped payload byte is caught by the record's xxh3 on sequential reads", "[lmdb]") {
  TempDir t;
  auto samples = MakeSamples(4, false);
  std::string out = t / "flip.lmdb";
  WriteAll(out, samples);
  std::string script = t / "poke.py";
  WriteFile(script, std::string(R"(
import lmdb, msgpack, sys
env = lmdb.open(sys.argv[1])
with env.begin(write=True) as txn:
    rec = msgpack.unpackb(txn.get(b'0000000001'))
    img = bytearray(rec['fields']['jpg']); img[40] ^= 1; rec['fields']['jpg'] = bytes(img)
    txn.put(b'0000000001', msgpack.packb(rec))
)"));
  auto py = Run(fmt::format("{} {} {}", kPy, Q(script), Q(out)));
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  auto ds = Open(out);
  REQUIRE(ds.ok());
  auto rd = (*ds)->NewReader();
  Sample s;
  REQUIRE((*rd)->Next(&s).ok());
  Status e = (*rd)->Next(&s).status();
  CHECK(e.code() == Code::kCorrupt);
  CHECK(e.message().find("checksum mismatch") != std::string::npos);
  CHECK(e.message().find(samples[1].key) != std::string::npos);
}

// Caffe's convert_imageset keys each image by the file name its list gives, as
// it is: "x_0.JPEG" keeps its upper-case extension in the key (the sample's
// field is still "jpeg"), and a caffe -> caffe copy keeps it too.
TEST_CASE("lmdb: caffe layout keys keep the listed file name's extension as it is", "[lmdb]") {
  TempDir t;
  fs::create_directories(t / "in/c0");
  std::string big = MakeJpeg(12, 10, 1), small = MakeJpeg(10, 8, 2);
  WriteFile(t / "in/c0/x_0.JPEG", big);
  WriteFile(t / "in/c0/y_1.jpg", small);
  ConvertOptions o;
  o.write.format_options["lmdb.layout"] = "caffe";
  auto r = Convert("folder:" + t / "in", "lmdb:" + t / "a.lmdb", o);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  auto keys = [&](const std::string& dir) {
    auto d = Run(fmt::format("mdb_dump -p {} | sed -n 's/^ \\([0-9]*_.*\\)$/\\1/p' | grep _c0/", Q(dir)));
    return d.out;
  };
  CHECK(keys(t / "a.lmdb") == "00000000_c0/x_0.JPEG\n00000001_c0/y_1.jpg\n");
  auto ds = Open(t / "a.lmdb");
  REQUIRE(ds.ok());
  auto got = ReadAll(**ds);
  REQUIRE(got.size() == 2);
  CHECK(got[0].key == "c0/x_0");
  REQUIRE(got[0].find("jpeg"));
  CHECK(got[0].find("jpeg")->data.str() == big);
  CHECK(got[1].find("jpg")->data.str() == small);
  // caffe -> caffe: the key's spelling travels with the sample.
  REQUIRE(Convert("lmdb:" + t / "a.lmdb", "lmdb:" + t / "b.lmdb", o).ok());
  CHECK(keys(t / "b.lmdb") == "00000000_c0/x_0.JPEG\n00000001_c0/y_1.jpg\n");
}
