// The hdf5 format: round trip, random access from many threads, real clients
// (h5dump, h5py) on what shardkit writes, third-party layouts, bad input.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "io/file.h"
#include "shardkit/shardkit.h"
#include "fault_fs.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;

namespace {

const char* kPy = "/usr/bin/python3";

// n samples: a JPEG each, a label on most, a `txt` field on some, one key
// with non-ASCII text.
std::vector<Sample> MakeSamples(int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    s.key = fmt::format("c{}/img_{:04d}", i % 3, i);
    if (i == 1) s.key = "c1/ünïcode_0001";
    s.set("jpg", Bytes::Take(MakeJpeg(8 + i % 7, 8 + i % 5, uint32_t(i))));
    if (i % 7 != 3) s.set_label(i % 3);
    if (i % 5 == 0) s.set("txt", Bytes::Copy(fmt::format("caption {}", i)));
    out.push_back(std::move(s));
  }
  return out;
}

const std::vector<std::string> kClasses = {"cat", "dog", "émeu"};

void WriteH5(const std::string& path, const std::vector<Sample>& samples, WriteOptions opts = {}) {
  if (opts.class_names.empty()) opts.class_names = kClasses;
  auto w = Create("hdf5:" + path, opts);
  REQUIRE(w.ok());
  for (const auto& s : samples) REQUIRE((*w)->Write(s).ok());
  auto sum = (*w)->Finish();
  REQUIRE(sum.ok());
  CHECK(sum->samples == samples.size());
}

void CheckSame(const Sample& got, const Sample& want) {
  CHECK(got.key == want.key);
  REQUIRE(got.fields.size() == want.fields.size());
  for (size_t k = 0; k < got.fields.size(); ++k) {
    CHECK(got.fields[k].ext == want.fields[k].ext);
    CHECK(got.fields[k].data == want.fields[k].data);
  }
}

RunResult Py(const TempDir& dir, const std::string& script, const std::string& args = "") {
  WriteFile(dir / "script.py", script);
  return Run(fmt::format("{} {} {}", kPy, Q(dir / "script.py"), args));
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("hdf5 round trip keeps keys, labels, class names and bytes", "[hdf5]") {
  TempDir dir;
  auto samples = MakeSamples(40);
  std::string path = dir / "out.h5";
  WriteH5(path, samples);
  CHECK(Listing(dir.path()) == std::vector<std::string>{"out.h5"});  // no spill or temp file left

  CHECK(DetectFormat(path).ok());
  CHECK(*DetectFormat(path) == "hdf5");
  auto ds = Open(path);
  REQUIRE(ds.ok());
  const DatasetInfo& info = (*ds)->info();
  CHECK(info.format == "hdf5");
  CHECK(info.num_samples == 40u);
  CHECK(info.class_names == kClasses);
  CHECK(info.fields == std::vector<std::string>{"cls", "jpg", "txt"});
  CHECK(info.extra.at("layout") == "shardkit");
  REQUIRE(info.shards.size() == 1);
  CHECK(info.shards[0].path == path);

  auto r = (*ds)->NewReader();
  REQUIRE(r.ok());
  Sample s;
  size_t i = 0;
  for (;;) {
    auto more = (*r)->Next(&s);
    REQUIRE(more.ok());
    if (!*more) break;
    REQUIRE(i < samples.size());
    CheckSame(s, samples[i]);
    ++i;
  }
  CHECK(i == samples.size());
  // Sample 3 has no label: no cls field comes back.
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE((*ra)->Get(3, &s).ok());
  CHECK(s.find("cls") == nullptr);
  // Payloads are zero-copy views of one mapping.
  Sample a, b;
  REQUIRE((*ra)->Get(0, &a).ok());
  REQUIRE((*ra)->Get(1, &b).ok());
  CHECK(a.find("jpg")->data.owner() == b.find("jpg")->data.owner());
  CHECK(b.find("jpg")->data.data() == a.find("jpg")->data.data() + a.find("jpg")->data.size());
  CHECK_FALSE((*ra)->Get(40, &s).ok());
}

TEST_CASE("hdf5 non-canonical cls and empty datasets round trip", "[hdf5]") {
  TempDir dir;
  std::vector<Sample> samples(3);
  samples[0].key = "a";
  samples[0].set("cls", Bytes::Copy("7\n"));  // kept byte-exact in fields/cls
  samples[1].key = "b";
  samples[1].set("cls", Bytes::Copy("-2"));
  samples[2].key = "c";
  samples[2].set("cls", Bytes::Copy("5"));
  WriteH5(dir / "x.h5", samples);
  auto ds = Open(dir / "x.h5");
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  for (size_t i = 0; i < 3; ++i) {
    Sample s;
    REQUIRE((*ra)->Get(i, &s).ok());
    CheckSame(s, samples[i]);
  }
  // Zero samples.
  WriteH5(dir / "empty.h5", {});
  auto e = Open(dir / "empty.h5");
  REQUIRE(e.ok());
  CHECK((*e)->info().num_samples == 0u);
}

TEST_CASE("hdf5 random access from many threads equals sequential reading", "[hdf5]") {
  TempDir dir;
  auto samples = MakeSamples(300);
  WriteH5(dir / "t.h5", samples);
  auto ds = Open(dir / "t.h5");
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  std::shared_ptr<RandomAccess> acc = *ra;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      Sample s;
      for (int k = 0; k < 3000; ++k) {
        uint64_t i = uint64_t((k * 7919 + t * 104729) % 300);
        if (!acc->Get(i, &s).ok() || s.key != samples[i].key || s.fields.size() != samples[i].fields.size()) {
          ++bad;
          continue;
        }
        for (size_t f = 0; f < s.fields.size(); ++f)
          if (!(s.fields[f].data == samples[i].fields[f].data)) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  // Bytes outlive the dataset and its accessor.
  Sample keep;
  REQUIRE(acc->Get(5, &keep).ok());
  acc.reset();
  ra = Result<std::shared_ptr<RandomAccess>>(Status::Cancelled("dropped"));
  ds = Result<std::unique_ptr<Dataset>>(Status::Cancelled("dropped"));
  CHECK(keep.find("jpg")->data == samples[5].find("jpg")->data);
}

TEST_CASE("hdf5 h5dump lists the layout", "[hdf5]") {
  TempDir dir;
  WriteH5(dir / "d.h5", MakeSamples(10));
  auto r = Run(fmt::format("h5dump -H -p {}", Q(dir / "d.h5")));
  REQUIRE(r.exit_code == 0);
  for (const char* want : {"DATASET \"keys\"", "DATASET \"labels\"", "DATASET \"checksums\"", "GROUP \"fields\"",
                           "GROUP \"jpg\"", "GROUP \"txt\"", "DATASET \"data\"", "DATASET \"offsets\"",
                           "ATTRIBUTE \"class_names\"", "ATTRIBUTE \"shardkit_format_version\"", "CONTIGUOUS",
                           "H5T_STD_U8LE", "H5T_STD_I64LE", "H5T_STD_U64LE"})
    CHECK(r.out.find(want) != std::string::npos);
  CHECK(r.out.find("CHUNKED") == std::string::npos);
}

TEST_CASE("hdf5 h5py reads what shardkit writes", "[hdf5]") {
  TempDir dir;
  auto samples = MakeSamples(25);
  WriteH5(dir / "p.h5", samples);
  for (size_t i = 0; i < samples.size(); ++i) WriteFile(dir / fmt::format("src{}.jpg", i), samples[i].find("jpg")->data.str());
  auto r = Py(dir, R"(
import sys, h5py
d = sys.argv[1]
with h5py.File(d + '/p.h5', 'r') as f:
    data, offs = f['fields/jpg/data'], f['fields/jpg/offsets'][:]
    assert data.id.get_offset() is not None
    assert len(offs) == len(f['keys']) + 1
    for i in range(len(f['keys'])):
        src = open(d + '/src%d.jpg' % i, 'rb').read()
        assert data[offs[i]:offs[i + 1]].tobytes() == src, i
    print('labels', ' '.join(str(x) for x in f['labels'][:6]))
    print('classes', '|'.join(f.attrs['class_names']))
    print('key1', f['keys'][1].decode('utf-8'))
    t, to = f['fields/txt/data'], f['fields/txt/offsets'][:]
    print('txt0', t[to[0]:to[1]].tobytes().decode(), 'txt1', to[2] - to[1])
    print('version', f.attrs['shardkit_format_version'])
)",
              Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("labels 0 1 2 -1 1 2") != std::string::npos);
  CHECK(r.out.find("classes cat|dog|émeu") != std::string::npos);
  CHECK(r.out.find("key1 c1/ünïcode_0001") != std::string::npos);
  CHECK(r.out.find("txt0 caption 0 txt1 0") != std::string::npos);
  CHECK(r.out.find("version 1") != std::string::npos);
}

TEST_CASE("hdf5 payloads written in place: large fields, a field sample 0 lacks, h5py and h5dump read them",
          "[hdf5]") {
  // Sample 0 holds only a small `txt`, so `txt` is the field written straight
  // into the output; `bin` (first seen in sample 1, ~1.2 MB in all) goes
  // through a spill file; `npy` is large from sample 0 on but is not the
  // first sample's largest. Payloads are random bytes, so a misplaced range shows.
  TempDir dir;
  std::vector<Sample> samples;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto rnd = [&](size_t n) {
    std::string b(n, '\0');
    for (auto& c : b) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      c = char(state >> 56);
    }
    return b;
  };
  for (int i = 0; i < 300; ++i) {
    Sample s;
    s.key = fmt::format("k/{:05d}", i);
    s.set("txt", Bytes::Take(rnd(i == 0 ? 3 : 700 + i)));
    if (i > 0) s.set("bin", Bytes::Take(rnd(4000 + 7 * i)));
    if (i % 2 == 0) s.set("npy", Bytes::Take(rnd(i == 0 ? 1 : 2 + i)));
    s.set_label(i % 4);
    samples.push_back(std::move(s));
  }
  WriteH5(dir / "big.h5", samples);
  auto ds = Open(dir / "big.h5");
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  for (uint64_t i = 0; i < samples.size(); ++i) {
    Sample got;
    REQUIRE((*ra)->Get(i, &got).ok());
    CheckSame(got, samples[i]);
  }
  for (size_t i = 0; i < samples.size(); ++i)
    for (const char* ext : {"txt", "bin", "npy"})
      if (const Field* f = samples[i].find(ext)) WriteFile(dir / fmt::format("{}{}", ext, i), f->data.str());
  auto r = Py(dir, R"(
import sys, os, h5py
d = sys.argv[1]
with h5py.File(d + '/big.h5', 'r') as f:
    for ext in ('txt', 'bin', 'npy'):
        data, offs = f['fields/%s/data' % ext], f['fields/%s/offsets' % ext][:]
        for i in range(len(f['keys'])):
            p = d + '/%s%d' % (ext, i)
            want = open(p, 'rb').read() if os.path.exists(p) else b''
            assert data[offs[i]:offs[i + 1]].tobytes() == want, (ext, i)
    print('txt at', f['fields/txt/data'].id.get_offset())
)",
         Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("txt at 65536") != std::string::npos);  // where the writer put the bytes: nothing was moved
  auto dump = Run(fmt::format("h5dump -d /fields/bin/data -s 0 -c 4 {}", Q(dir / "big.h5")));
  CHECK(dump.exit_code == 0);
  CHECK(Listing(dir.path()).size() == 1 + 300 + 299 + 150 + 1);  // big.h5, the sources, script.py: no temporary
}

TEST_CASE("hdf5 reads the images/labels layout written by h5py, and field maps", "[hdf5]") {
  TempDir dir;
  std::vector<std::string> imgs;
  for (int i = 0; i < 6; ++i) {
    imgs.push_back(i % 2 ? MakePng(5, 4, uint32_t(i)) : MakeJpeg(9, 7, uint32_t(i)));
    WriteFile(dir / fmt::format("i{}.bin", i), imgs.back());
  }
  auto r = Py(dir, R"(
import sys, h5py, numpy as np
d = sys.argv[1]
imgs = [np.frombuffer(open(d + '/i%d.bin' % i, 'rb').read(), dtype=np.uint8) for i in range(6)]
for name, iname, lname in (('tp.h5', 'images', 'labels'), ('tg.h5', 'images', 'targets'), ('mapped.h5', 'imgs', 'y')):
    with h5py.File(d + '/' + name, 'w') as f:
        ds = f.create_dataset(iname, (6,), dtype=h5py.vlen_dtype(np.uint8))
        for i, a in enumerate(imgs): ds[i] = a
        f[lname] = np.array([4, 3, 2, 1, 0, 9], dtype=np.int32)
)",
              Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* name : {"tp.h5", "tg.h5"}) {
    auto ds = Open(dir / name);
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("layout") == "images-labels");
    CHECK((*ds)->info().num_samples == 6u);
    auto ra = (*ds)->NewRandomAccess();
    REQUIRE(ra.ok());
    for (uint64_t i = 0; i < 6; ++i) {
      Sample s;
      REQUIRE((*ra)->Get(i, &s).ok());
      CHECK(s.key == fmt::format("{:08d}", i));
      const Field* img = s.find(i % 2 ? "png" : "jpg");
      REQUIRE(img != nullptr);
      CHECK(img->data.str() == imgs[i]);
      CHECK(s.label() == std::vector<int64_t>{4, 3, 2, 1, 0, 9}[i]);
    }
  }
  // Reads through HDF5 serialise under shardkit's mutex but are correct from many threads.
  {
    auto ds = Open(dir / "tp.h5");
    REQUIRE(ds.ok());
    auto ra = (*ds)->NewRandomAccess();
    REQUIRE(ra.ok());
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        Sample s;
        for (int k = 0; k < 200; ++k) {
          uint64_t i = uint64_t((k + t) % 6);
          if (!(*ra)->Get(i, &s).ok() || !s.image() || s.image()->data.str() != imgs[i]) ++bad;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(bad == 0);
  }
  // Other names: refused without a map, read with one.
  auto plain = Open(dir / "mapped.h5");
  REQUIRE_FALSE(plain.ok());
  CHECK(plain.status().message().find("field map") != std::string::npos);
  OpenOptions o;
  o.field_map = {{"imgs", "jpg"}, {"y", "cls"}};
  auto ds = Open(dir / "mapped.h5", o);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().fields == std::vector<std::string>{"cls", "jpg"});
  auto rd = (*ds)->NewReader();
  REQUIRE(rd.ok());
  Sample s;
  uint64_t i = 0;
  while (*(*rd)->Next(&s)) {
    CHECK(s.find("jpg")->data.str() == imgs[i]);  // the map fixes the extension
    CHECK(s.label() == std::vector<int64_t>{4, 3, 2, 1, 0, 9}[i]);
    ++i;
  }
  CHECK(i == 6);
  o.field_map = {{"imgs", "auto"}, {"y", "label"}};  // sniffed extension, labels under another name
  ds = Open(dir / "mapped.h5", o);
  REQUIRE(ds.ok());
  CHECK((*ds)->info().fields == std::vector<std::string>{"jpg", "label"});
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  REQUIRE((*ra)->Get(1, &s).ok());
  REQUIRE(s.find("png") != nullptr);
  CHECK(s.find("png")->data.str() == imgs[1]);
  CHECK(s.find("label")->data.str() == "3");
  o.field_map = {{"nope", "jpg"}};
  auto missing = Open(dir / "mapped.h5", o);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("'nope'") != std::string::npos);
}

#if defined(__SANITIZE_ADDRESS__)  // GCC
#define SK_TEST_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define SK_TEST_ASAN 1
#endif
#endif

// `shardkit info FILE` under a 1 GiB address-space limit (not with ASan, whose shadow
// memory needs more): the result, its wall time in seconds and the child's peak RSS
// in KiB (the largest child so far: each test case runs in its own process).
struct Bounded {
  sk_test::RunResult r;
  double secs;
  long maxrss_kib;
};
Bounded InfoBounded(const std::string& file) {
#ifdef SK_TEST_ASAN
  const char* limit = "";
#else
  const char* limit = "ulimit -v 1048576 && ";
#endif
  auto t0 = std::chrono::steady_clock::now();
  auto r = Run(fmt::format("{}exec {} info {}", limit, Q(SHARDKIT_CLI), Q(file)));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru {};
  getrusage(RUSAGE_CHILDREN, &ru);
  return {std::move(r), secs, ru.ru_maxrss};
}

TEST_CASE("hdf5 hostile files (fuzz findings) are refused before libhdf5 allocates or reads for them", "[hdf5]") {
  // The fuzz finding (now a seed in fuzz/corpus/hdf5/): 10 KB whose `keys`
  // declares a 3.5 GB string. libhdf5 alone allocates and zeroes 3.5 GB
  // before failing; shardkit must refuse it quickly, naming the file and the
  // dataset, under a 1 GiB address-space limit (not with ASan, whose shadow
  // memory needs more) and with a peak RSS far below the 3.5 GB.
  std::string known = std::string(SHARDKIT_SOURCE_DIR) + "/fuzz/corpus/hdf5/regression-vlen-string-3.5GB.h5";
  auto [r, secs, maxrss_kib] = InfoBounded(known);
  CHECK(maxrss_kib < 512 * 1024);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("regression-vlen-string-3.5GB.h5") != std::string::npos);
  CHECK(r.err.find("dataset 'keys': element 0 declares a variable-length string of 3556638720 bytes") !=
        std::string::npos);
  CHECK(r.err.find("refused before reading") != std::string::npos);
  CHECK(secs < 10);
  // The later findings, each a seed in fuzz/corpus/hdf5/: `info` exits with 1 and says
  // what is wrong. Those on which libhdf5 hung run under `timeout`, the others under the
  // 1 GiB address-space limit.
  struct Seed {
    const char* file;
    const char* message;
    bool hung;
  };
  for (const Seed& c : {
           // An `images` element whose heap collection holds a free-space record of 0
           // bytes, on which libhdf5's parser loops forever.
           Seed{"regression-heap-free-space-0.h5",
                "dataset 'images': element 0 points to a damaged heap collection at 2080 (free space of 0 bytes at "
                "2400)",
                true},
           // An integer `labels` type declared 4 GB wide, for which libhdf5 would allocate
           // a 4 GB conversion buffer.
           Seed{"regression-int-type-4GB.h5",
                "dataset 'labels': expected integers of at most 8 bytes, found 4294836232 bytes", false},
           // A `keys` string type whose base (character) type the file declares far wider
           // than 1 byte; libhdf5 sizes by length x base size.
           Seed{"regression-vlen-string-wide-base.h5",
                "dataset 'keys': element 0 declares a variable-length string of 2466250755 bytes in a file of "
                "10913 bytes: refused before reading",
                false},
           // A 4-byte integer `shardkit_format_version` declaring a precision of 64800
           // bits; libhdf5's integer conversion read past the 4 bytes (SIGSEGV).
           Seed{"regression-int-precision-64800-bits.h5",
                "attribute 'shardkit_format_version' is not an integer", false},
           // A compact `keys` of 3 elements whose object header holds no data; libhdf5
           // 1.10 copied from the missing buffer (SIGSEGV).
           Seed{"regression-compact-keys-no-data.h5",
                "dataset 'keys': compact dataset of 3 elements of 16 bytes holds only 0 bytes", false},
           // The root group's object header continues in a chunk of 3.5 GB far past the
           // end of the file; libhdf5 allocated it before checking.
           Seed{"regression-ohdr-continuation-3.5GB.h5",
                "root group: object header at 96 continues at 7133701809754866464 with 3489690476 bytes, past the "
                "end of the file",
                false},
           // A root-group attribute message of 64 bytes whose datatype declares 65,292
           // bytes; libhdf5's H5Aexists decoded past the header's buffer (SIGSEGV).
           Seed{"regression-attribute-datatype-65292-bytes.h5",
                "root group: object header at 96 has an attribute message of 64 bytes whose name, datatype and "
                "dataspace declare 65336 bytes",
                false},
           // A `class_names` attribute whose stored data is shorter than its elements;
           // libhdf5's H5Aread copied past it.
           Seed{"regression-attr-short-buffer.h5",
                "'class_names (attribute)': holds 30 bytes for 2 elements of 16 bytes", false},
           // An `images` element of length 0 that still names a (damaged) heap
           // collection: libhdf5 reads it anyway, and hung.
           Seed{"regression-heap-empty-element.h5",
                "dataset 'images': element 0 points to a damaged heap collection at 2080", true},
           // A continuation message declaring 0 bytes, whose address and length libhdf5
           // decodes from the bytes after it all the same (4 GB).
           Seed{"regression-ohdr-short-continuation.h5",
                "'images': object header at 1400 continues at 4194304 with 4295491589 bytes", false},
           // An old-style root group whose symbol-table message names no local heap;
           // libhdf5 1.10 crashed (SIGSEGV) listing it.
           Seed{"regression-local-heap-segv.h5",
                "root group: object header at 96 names a local heap at 18446744073709551615 that is not one", true},
       }) {
    INFO(c.file);
    const std::string path = std::string(SHARDKIT_SOURCE_DIR) + "/fuzz/corpus/hdf5/" + c.file;
    r = c.hung ? Run(fmt::format("timeout 20 {} info {}", Q(SHARDKIT_CLI), Q(path))) : InfoBounded(path).r;
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(c.message) != std::string::npos);
  }

  // Crafted copies of a good file: descriptors patched in place (h5py finds
  // the contiguous datasets' addresses; the attribute's descriptors are found
  // by the heap address and length they hold).
  TempDir dir;
  auto samples = MakeSamples(5);
  WriteOptions wo;
  wo.class_names = {"cat", std::string(4660, 'x')};  // 4660 = 0x1234: easy to find
  WriteH5(dir / "good.h5", samples, wo);
  std::vector<std::string> imgs;
  for (int i = 0; i < 3; ++i) imgs.push_back(MakeJpeg(9, 7, uint32_t(i)));
  for (int i = 0; i < 3; ++i) WriteFile(dir / fmt::format("i{}.bin", i), imgs[i]);
  r = Py(dir, R"(
import sys, struct, shutil, h5py, numpy as np
d = sys.argv[1]
def patch(name, off, data):
    with open(d + '/' + name, 'r+b') as f:
        f.seek(off); f.write(data)
with h5py.File(d + '/good.h5', 'r') as f:
    keys = f['keys'].id.get_offset()
raw = open(d + '/good.h5', 'rb').read()
gcols = [i for i in range(len(raw)) if raw.startswith(b'GCOL', i)]
attr = [i for g in gcols for i in [raw.find(struct.pack('<IQ', 4660, g))] if i >= 0]
assert len(attr) == 1, attr
for name in ('huge-key.h5', 'short-key.h5', 'huge-class.h5', 'no-object.h5'):
    shutil.copy(d + '/good.h5', d + '/' + name)
patch('huge-key.h5', keys + 16 * 3, struct.pack('<I', 0xD4000000))   # key 3: 3.5 GB
patch('short-key.h5', keys + 16 * 2, struct.pack('<I', 1))           # key 2: shorter than its object
patch('huge-class.h5', attr[0], struct.pack('<I', 0xF0000000))       # class 1: 4 GB
patch('no-object.h5', keys + 16 + 4 + 8, struct.pack('<I', 999))     # key 1: object 999
imgs = [np.frombuffer(open(d + '/i%d.bin' % i, 'rb').read(), dtype=np.uint8) for i in range(3)]
with h5py.File(d + '/compact.h5', 'w') as f:  # a good file with compact datasets
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE); dcpl.set_layout(h5py.h5d.COMPACT)
    sp = h5py.h5s.create_simple((3,))
    h5py.h5d.create(f.id, b'images', h5py.h5t.vlen_create(h5py.h5t.NATIVE_UINT8), sp, dcpl=dcpl)
    h5py.h5d.create(f.id, b'labels', h5py.h5t.STD_I32LE, sp, dcpl=dcpl)
    for i, a in enumerate(imgs): f['images'][i] = a
    f['labels'][:] = [0, 1, 2]
with h5py.File(d + '/tp.h5', 'w') as f:
    ds = f.create_dataset('images', (3,), dtype=h5py.vlen_dtype(np.uint8))
    for i, a in enumerate(imgs): ds[i] = a
    f['labels'] = np.array([0, 1, 2], dtype=np.int32)
    off = ds.id.get_offset()
patch('tp.h5', off + 16 * 2, struct.pack('<I', 0xFFFFFFF0))          # image 2: 4 GB
)",
         Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);

  REQUIRE(Open(dir / "good.h5").ok());
  CHECK((*Open(dir / "good.h5"))->info().class_names == wo.class_names);
  struct Case {
    const char* file;
    const char* message;
    int64_t index;
  };
  for (const Case& c : {
           Case{"huge-key.h5", "dataset 'keys': element 3 declares a variable-length string of 3556769792 bytes", 3},
           Case{"short-key.h5", "dataset 'keys': element 2 declares a variable-length string of 1 bytes but its "
                                "heap object holds 11",
                2},
           Case{"no-object.h5", "dataset 'keys': element 1 points to heap object 999", 1},
           Case{"huge-class.h5", "'class_names (attribute)': element 1 declares a variable-length string of "
                                 "4026531840 bytes",
                -1},
       }) {
    INFO(c.file);
    auto ds = Open(dir / c.file);
    REQUIRE_FALSE(ds.ok());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK(ds.status().where().file == dir / c.file);
    CHECK(ds.status().where().index == c.index);
    CHECK(ds.status().message().find(c.message) != std::string::npos);
    CHECK(ds.status().message().find("refused before reading") != std::string::npos);
  }
  {
    auto c = Open(dir / "compact.h5");
    REQUIRE(c.ok());
    auto cra = (*c)->NewRandomAccess();
    REQUIRE(cra.ok());
    Sample cs;
    REQUIRE((*cra)->Get(2, &cs).ok());
    CHECK(cs.find("jpg")->data.str() == imgs[2]);
    CHECK(cs.label() == 2);
  }
  // Third-party layout: elements are read one by one, so the good ones still read.
  auto ds = Open(dir / "tp.h5");
  REQUIRE(ds.ok());
  auto ra = (*ds)->NewRandomAccess();
  REQUIRE(ra.ok());
  Sample s;
  for (uint64_t i = 0; i < 2; ++i) {
    REQUIRE((*ra)->Get(i, &s).ok());
    CHECK(s.find("jpg")->data.str() == imgs[i]);
  }
  Status st = (*ra)->Get(2, &s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == Code::kCorrupt);
  CHECK(st.where().index == 2);
  CHECK(st.message().find("dataset 'images': element 2 declares a variable-length sequence of 4294967280 bytes") !=
        std::string::npos);
  REQUIRE((*ra)->Get(0, &s).ok());  // and the handle still works
  CHECK(s.find("jpg")->data.str() == imgs[0]);
}

TEST_CASE("hdf5 old-style group structures are checked before libhdf5 follows them", "[hdf5]") {
  // Fuzz finding 15 (now a seed): 10.9 KB whose group `/fields` has a local
  // heap with a free list whose block names itself as the next one. libhdf5
  // 1.10 allocates a node per block as it follows the chain: 36 M allocations,
  // 3.9 GB and 9 s before failing. It must be refused in well under a second,
  // under a 1 GiB address-space limit (not with ASan), naming file and group.
  std::string known = std::string(SHARDKIT_SOURCE_DIR) + "/fuzz/corpus/hdf5/regression-local-heap-free-list-loop.h5";
  auto [r, secs, maxrss_kib] = InfoBounded(known);
  CHECK(maxrss_kib < 256 * 1024);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("regression-local-heap-free-list-loop.h5") != std::string::npos);
  CHECK(r.err.find("'fields': object header at 1880 names a local heap at 1920 whose free list loops or overlaps "
                   "(more than 5 blocks of at least 16 bytes in its 88 bytes)") != std::string::npos);
  CHECK(secs < 1);

  // Crafted copies of a good file (old-style groups, superblock version 0,
  // 8-byte addresses and lengths), each with one structure of the root
  // group's symbol table damaged; and a good root group of 300 links (a B-tree
  // of two levels) with free blocks in its heap, which must still open.
  TempDir dir;
  WriteH5(dir / "good.h5", MakeSamples(4));
  r = Py(dir, R"(
import sys, struct, shutil, h5py, numpy as np
d = sys.argv[1]
raw = open(d + '/good.h5', 'rb').read()
assert raw[:9] == b'\x89HDF\r\n\x1a\n\x00' and raw[13] == 8 and raw[14] == 8, raw[:16]
leaf_k = struct.unpack_from('<H', raw, 16)[0]
root = struct.unpack_from('<Q', raw, 64)[0]          # the superblock's root symbol-table entry
assert raw[root] == 1
chunks, stab = [(root + 16, struct.unpack_from('<I', raw, root + 8)[0])], None
while chunks and stab is None:  # the symbol-table message, following continuations
    q, size = chunks.pop()
    end = q + size
    while q + 8 <= end and stab is None:
        t, sz = struct.unpack_from('<HH', raw, q)
        if t == 0x10: chunks.append(struct.unpack_from('<QQ', raw, q + 8))
        if t == 0x11: stab = struct.unpack_from('<QQ', raw, q + 8)
        q += 8 + sz
btree, heap = stab
dsize, free, data = struct.unpack_from('<QQQ', raw, heap + 8)
assert raw[btree:btree + 4] == b'TREE' and raw[btree + 5] == 0
n = struct.unpack_from('<H', raw, btree + 6)[0]
snod = struct.unpack_from('<Q', raw, btree + 32)[0]
assert raw[snod:snod + 4] == b'SNOD'
def patched(name, *edits):
    b = bytearray(raw)
    for off, data in edits: b[off:off + len(data)] = data
    open(d + '/' + name, 'wb').write(b)
at = 'root group: object header at %d ' % root
x = free if free != 1 else (dsize - 16) // 8 * 8
patched('heap-loop.h5', (heap + 16, struct.pack('<Q', x)), (data + x, struct.pack('<QQ', x, 16)))
print('heap-loop.h5\t' + at + 'names a local heap at %d whose free list loops or overlaps' % heap)
patched('heap-free-outside.h5', (heap + 16, struct.pack('<Q', dsize - 8)))
print('heap-free-outside.h5\t' + at + 'names a local heap at %d whose free list has a block at offset %d'
      % (heap, dsize - 8))
patched('tree-level.h5', (btree + 5, b'\x01'))
print('tree-level.h5\t' + at + 'has a symbol-table B-tree node at %d that is not one' % snod)
patched('tree-twice.h5', (btree + 6, struct.pack('<H', n + 1)), (btree + 32 + 16 * n, struct.pack('<Q', snod)))
print('tree-twice.h5\t' + at + 'reaches the symbol node at %d twice' % snod)
patched('tree-self.h5', (btree + 5, b'\x01'), (btree + 32, struct.pack('<Q', btree)))
print('tree-self.h5\t' + at + 'reaches the symbol-table B-tree node at %d twice' % btree)
patched('tree-key.h5', (btree + 24, struct.pack('<Q', dsize + 5)))
print('tree-key.h5\t' + at + 'has a symbol-table B-tree node at %d whose key 0 (heap offset %d) is not a string'
      % (btree, dsize + 5))
patched('snod-count.h5', (snod + 6, struct.pack('<H', 2 * leaf_k + 1)))
print('snod-count.h5\t' + at + 'has a symbol node at %d of %d entries, more than 2 x K = %d'
      % (snod, 2 * leaf_k + 1, 2 * leaf_k))
patched('name-outside.h5', (snod + 8, struct.pack('<Q', dsize + 100)))
print('name-outside.h5\t' + at + 'has a link (entry 0 of the symbol node at %d) whose name at heap offset %d '
      'is not a string inside the local heap' % (snod, dsize + 100))
patched('name-unterminated.h5', (data + dsize - 1, b'x'), (snod + 8, struct.pack('<Q', dsize - 1)))
print('name-unterminated.h5\t' + at + 'has a link (entry 0 of the symbol node at %d) whose name at heap offset %d'
      % (snod, dsize - 1))
with h5py.File(d + '/many.h5', 'w', libver='earliest') as f:
    ds = f.create_dataset('images', (3,), dtype=h5py.vlen_dtype(np.uint8))
    for i in range(3): ds[i] = np.arange(5 + i, dtype=np.uint8)
    f['labels'] = np.array([0, 1, 2], dtype=np.int64)
    for i in range(300): f['link%03d' % i] = f['labels']
    for i in range(0, 300, 7): del f['link%03d' % i]
raw = open(d + '/many.h5', 'rb').read()
assert any(raw[i + 5] == 1 for i in range(len(raw)) if raw.startswith(b'TREE', i))  # a two-level B-tree
)",
         Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto good = Open(dir / "good.h5");
  REQUIRE(good.ok());
  CHECK((*good)->info().num_samples == 4);
  auto many = Open(dir / "many.h5");
  INFO((many.ok() ? std::string() : many.status().ToString()));
  REQUIRE(many.ok());
  CHECK((*many)->info().num_samples == 3);
  int cases = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    auto tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    std::string file = line.substr(0, tab), message = line.substr(tab + 1);
    INFO(file);
    auto t = std::chrono::steady_clock::now();
    auto ds = Open(dir / file);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() < 1);
    REQUIRE_FALSE(ds.ok());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK(ds.status().where().file == dir / file);
    INFO(ds.status().message());
    CHECK(ds.status().message().find(message) != std::string::npos);
    ++cases;
  }
  CHECK(cases == 9);
}

TEST_CASE("hdf5 truncated file is an error naming the file", "[hdf5]") {
  TempDir dir;
  WriteH5(dir / "t.h5", MakeSamples(50));
  std::string bytes = ReadFile(dir / "t.h5");
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t(100), size_t(0)}) {
    WriteFile(dir / "cut.h5", bytes.substr(0, cut));
    auto ds = Open(dir / "cut.h5");
    REQUIRE_FALSE(ds.ok());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK(ds.status().where().file == dir / "cut.h5");
    CHECK(ds.status().ToString().find("cut.h5") != std::string::npos);
    if (cut > 100) CHECK_THAT(ds.status().message(), Catch::Contains("truncated"));
  }
}

TEST_CASE("hdf5 wrong type or shape is an error naming the dataset", "[hdf5]") {
  TempDir dir;
  WriteH5(dir / "good.h5", MakeSamples(12));
  struct Case {
    const char* edit;
    const char* dataset;
    const char* what;
  };
  std::vector<Case> cases = {
      {"del f['labels']; f['labels'] = np.zeros(12, dtype=np.float32)", "'labels'", "integer"},
      {"del f['labels']; f['labels'] = np.zeros(11, dtype=np.int64)", "'labels'", "11 elements"},
      {"o = f['fields/jpg/offsets']; o[5] = o[4] - 1", "'fields/jpg/offsets'", "monotone"},
      {"o = f['fields/jpg/offsets']; o[12] = f['fields/jpg/data'].shape[0] + 1", "'fields/jpg/offsets'", "beyond"},
      {"d = f['fields/txt/data'][:]; del f['fields/txt/data']; f.create_dataset('fields/txt/data', data=d, chunks=(4,))",
       "'fields/txt/data'", "contiguous"},
      {"del f['fields/txt/data']; f['fields/txt/data'] = np.zeros((2, 3), dtype=np.uint8)", "'fields/txt/data'",
       "1 dimension"},
      {"del f['keys']; f['keys'] = np.zeros(12, dtype=np.int32)", "'keys'", "strings"},
  };
  for (const auto& c : cases) {
    INFO(c.edit);
    std::filesystem::copy_file(dir / "good.h5", dir / "bad.h5", std::filesystem::copy_options::overwrite_existing);
    auto r = Py(dir,
                fmt::format("import sys, h5py, numpy as np\nwith h5py.File(sys.argv[1], 'r+') as f:\n    {}\n", c.edit),
                Q(dir / "bad.h5"));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    auto ds = Open(dir / "bad.h5");
    REQUIRE_FALSE(ds.ok());
    INFO(ds.status().ToString());
    CHECK(ds.status().code() == Code::kCorrupt);
    CHECK(ds.status().where().file == dir / "bad.h5");
    CHECK(ds.status().message().find(c.dataset) != std::string::npos);
    CHECK(ds.status().message().find(c.what) != std::string::npos);
  }
  // A third-party file whose labels are floats.
  auto r = Py(dir, R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], 'w') as f:
    ds = f.create_dataset('images', (2,), dtype=h5py.vlen_dtype(np.uint8))
    ds[0] = np.frombuffer(b'\xff\xd8\xff\xe0', dtype=np.uint8); ds[1] = ds[0]
    f['labels'] = np.zeros(2, dtype=np.float64)
)",
              Q(dir / "float.h5"));
  REQUIRE(r.exit_code == 0);
  auto ds = Open(dir / "float.h5");
  REQUIRE_FALSE(ds.ok());
  CHECK(ds.status().message().find("'labels'") != std::string::npos);
  // A file that declares 10^12 samples in a few KB (unallocated chunks): refused before allocating.
  r = Py(dir, R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], 'w') as f:
    f.create_dataset('images', (10**12,), dtype=h5py.vlen_dtype(np.uint8), chunks=(1024,))
    f.create_dataset('labels', (10**12,), dtype='i8', chunks=(1024,))
)",
         Q(dir / "huge.h5"));
  REQUIRE(r.exit_code == 0);
  ds = Open(dir / "huge.h5");
  REQUIRE_FALSE(ds.ok());
  CHECK(ds.status().code() == Code::kCorrupt);
  CHECK(ds.status().message().find("'images'") != std::string::npos);
  CHECK(ds.status().message().find("1000000000000 elements") != std::string::npos);
}

TEST_CASE("hdf5 external links are refused", "[hdf5]") {
  TempDir dir;
  WriteH5(dir / "good.h5", MakeSamples(4));
  auto r = Py(dir, R"(
import sys, shutil, h5py, numpy as np
d = sys.argv[1]
with h5py.File(d + '/other.h5', 'w') as f:
    ds = f.create_dataset('images', (1,), dtype=h5py.vlen_dtype(np.uint8))
    ds[0] = np.frombuffer(b'\xff\xd8\xff\xe0', dtype=np.uint8)
    f['labels'] = np.zeros(1, dtype=np.int64)
with h5py.File(d + '/tp.h5', 'w') as f:
    f['images'] = h5py.ExternalLink('other.h5', '/images')
    f['labels'] = np.zeros(1, dtype=np.int64)
shutil.copy(d + '/good.h5', d + '/ours.h5')
with h5py.File(d + '/ours.h5', 'r+') as f:
    del f['fields/jpg/data']
    f['fields/jpg/data'] = h5py.ExternalLink('other.h5', '/images')
)",
              Q(dir.path()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* name : {"tp.h5", "ours.h5"}) {
    auto ds = Open(dir / name);
    REQUIRE_FALSE(ds.ok());
    INFO(ds.status().ToString());
    CHECK(ds.status().message().find("external link") != std::string::npos);
    CHECK(ds.status().where().file == dir / name);
  }
}

TEST_CASE("hdf5 leaves no output without Finish() and refuses existing output", "[hdf5]") {
  TempDir dir;
  {
    auto w = Create(dir / "o.h5");
    REQUIRE(w.ok());
    for (const auto& s : MakeSamples(20)) REQUIRE((*w)->Write(s).ok());
  }
  CHECK(Listing(dir.path()).empty());
  WriteH5(dir / "o.h5", MakeSamples(5));
  auto again = Create(dir / "o.h5");
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().code() == Code::kAlreadyExists);
  WriteOptions o;
  o.overwrite = true;
  WriteH5(dir / "o.h5", MakeSamples(7), o);
  auto ds = Open(dir / "o.h5");
  REQUIRE(ds.ok());
  CHECK((*ds)->info().num_samples == 7u);
  // A bad key fails the writer and leaves nothing.
  {
    auto w = Create(dir / "k.h5");
    REQUIRE(w.ok());
    Sample s;
    s.key = "";
    CHECK((*w)->Write(s).code() == Code::kInvalidArgument);
    CHECK_FALSE((*w)->Finish().ok());
  }
  CHECK(Listing(dir.path()) == std::vector<std::string>{"o.h5"});
}

TEST_CASE("hdf5 write and fsync failures end the run and leave nothing", "[hdf5]") {
  for (const char* op : {"write", "fsync"}) {
    INFO(op);
    TempDir dir;
    WriteOptions o;
    o.filesystem = sk_test::FaultFs([op](const std::string&, std::string_view x) { return x == op ? ENOSPC : 0; });
    auto w = Create(dir / "f.h5", o);
    REQUIRE(w.ok());
    Status st;
    for (const auto& s : MakeSamples(5)) st = (*w)->Write(s);  // payloads are buffered: Finish() flushes
    auto sum = (*w)->Finish();
    REQUIRE_FALSE(sum.ok());
    CHECK(sum.status().code() == Code::kIOError);
    CHECK(sum.status().where().file == dir / "f.h5");
    CHECK(sum.status().message().find(op) != std::string::npos);
    w = Result<std::unique_ptr<SampleWriter>>(Status::Cancelled("dropped"));
    CHECK(Listing(dir.path()).empty());
  }
}

TEST_CASE("hdf5 format detection", "[hdf5]") {
  TempDir dir;
  WriteH5(dir / "noext", MakeSamples(2));
  CHECK(*DetectFormat(dir / "noext") == "hdf5");  // by signature
  CHECK(*DetectFormat(dir / "missing.hdf5") == "hdf5");
  auto w = Create(dir / "new.hdf5");
  CHECK(w.ok());
}

// Write throughput against cp -r and tar cf of the same folder. Not run by
// default: `test_hdf5 "[.bench]"`. SK_BENCH_PX sets the image side (default
// 128), SK_BENCH_DIR where to work. scripts/bench_convert.sh is the main benchmark.
TEST_CASE("hdf5 write throughput", "[.bench]") {
  const char* root_env = std::getenv("SK_BENCH_DIR");
  const char* px_env = std::getenv("SK_BENCH_PX");
  int px = px_env ? std::atoi(px_env) : 128;
  TempDir tmp;
  std::string root = root_env ? std::string(root_env) : tmp.path();
  std::string src = root + "/src";
  std::vector<std::string> files;
  for (int c = 0; c < 10; ++c) {
    std::filesystem::create_directories(fmt::format("{}/c{}", src, c));
    for (int i = 0; i < 200; ++i) {
      files.push_back(fmt::format("{}/c{}/img{:04d}.jpg", src, c, i));
      WriteFile(files.back(), MakeJpeg(px, px * 3 / 4, uint32_t(c * 1000 + i)));
    }
  }
  uint64_t total = 0;
  for (auto& f : files) total += std::filesystem::file_size(f);
  Run("sync");
  auto secs = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double mb = double(total) / 1e6;
  fmt::print("{} files of {}x{}, {:.1f} MB\n", files.size(), px, px * 3 / 4, mb);
  for (int rep = 0; rep < 3; ++rep) {
    Run(fmt::format("rm -rf {}/out.h5 {}/out.tar {}/copy", root, root, root));
    Run("sync");
    double finish = 0;
    auto t0 = std::chrono::steady_clock::now();
    {
      auto w = Create("hdf5:" + root + "/out.h5");
      REQUIRE(w.ok());
      for (auto& f : files) {
        Sample s;
        s.key = f.substr(src.size() + 1);
        s.key = s.key.substr(0, s.key.rfind('.'));
        s.set("jpg", Bytes::Take(ReadFile(f)));
        s.set_label(s.key[1] - '0');
        REQUIRE((*w)->Write(s).ok());
      }
      auto tf = std::chrono::steady_clock::now();
      REQUIRE((*w)->Finish().ok());  // includes fsync
      finish = secs(tf);
    }
    double h5 = secs(t0);
    t0 = std::chrono::steady_clock::now();
    REQUIRE(Run(fmt::format("tar cf {}/out.tar -C {} . && sync -f {}/out.tar", root, src, root)).exit_code == 0);
    double tar = secs(t0);
    t0 = std::chrono::steady_clock::now();
    REQUIRE(Run(fmt::format("cp -r {} {}/copy && sync -f {}/copy", src, root, root)).exit_code == 0);
    double cp = secs(t0);
    fmt::print("hdf5 {:.3f}s ({:.0f} MB/s)  tar cf+sync {:.3f}s ({:.0f} MB/s)  cp -r+sync {:.3f}s ({:.0f} MB/s)  "
               "hdf5/tar {:.2f} (Finish {:.3f}s)\n",
               h5, mb / h5, tar, mb / tar, cp, mb / cp, tar / h5, finish);
  }
  Run(fmt::format("rm -rf {}/out.h5 {}/out.tar {}/copy {}", root, root, root, src));
}
