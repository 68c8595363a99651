// HDF5 files of decoded images as h5py and Keras users write them
// (formats/hdf5/arrays.*): fixtures made at test time with h5py
// (tests/hdf5_wild_make.py), read as "npy" fields in [H, W, C] order, converted to
// every format and back with identical pixels.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/md5.h"
#include "core/pickle.h"
#include "shardkit/loader.h"
#include "shardkit/shardkit.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
using json = nlohmann::json;

namespace {

std::string Md5Of(const Bytes& b) {
  md5::Md5 m;
  m.Update(b.data(), b.size());
  return m.HexDigest();
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

void CheckAgainst(const std::vector<Sample>& got, const json& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("sample " << i);
    const Field* f = got[i].find("npy");
    REQUIRE(f);
    auto a = pickle::ParseNpy(f->data);
    REQUIRE(a.ok());
    CHECK(a->shape == want[i]["shape"].get<std::vector<uint64_t>>());
    CHECK(Md5Of(a->data) == want[i]["md5"].get<std::string>());
    CHECK(got[i].label() == std::optional<int64_t>(want[i]["label"].get<int64_t>()));
  }
}

}  // namespace

TEST_CASE("hdf5 wild: decoded-image layouts read and convert to every format and back", "[hdf5][wild]") {
  TempDir dir;
  auto r = Run(fmt::format("/usr/bin/python3 {}/tests/hdf5_wild_make.py {}", SHARDKIT_SOURCE_DIR, Q(dir.path())));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  json exp = json::parse(ReadFile(dir / "expected.json"));
  // Datasets read from the file's mapping instead of through libhdf5 (info's "direct_reads").
  const std::map<std::string, std::string> direct = {
      {"contiguous", "images"}, {"chunked", ""},       {"nchw", "images"},   {"keras", "x_train"},  {"gray", "images"},
      {"chunked_raw", "images"}, {"userblock", "images"}, {"sparse", "images"}, {"float_be", ""}};
  for (std::string name :
       {"contiguous", "chunked", "nchw", "keras", "gray", "chunked_raw", "userblock", "sparse", "float_be"}) {
    INFO(name);
    OpenOptions o;
    if (name == "nchw") o.format_options["hdf5.order"] = "nchw";
    std::string src = "hdf5:" + dir / (name + ".h5");
    auto ds = Open(src, o);
    if (!ds.ok()) FAIL(ds.status().ToString());
    CHECK((*ds)->info().num_samples == 10);
    auto samples = ReadAll(**ds);
    CheckAgainst(samples, exp[name]);
    const auto& extra = (*ds)->info().extra;
    CHECK((extra.count("direct_reads") ? extra.at("direct_reads") : "") == direct.at(name));
    {
      // Many threads at once, in an order that looks chunks up concurrently: the same pixels.
      auto ra = (*ds)->NewRandomAccess();
      REQUIRE(ra.ok());
      std::vector<std::string> got(10 * 8);
      std::vector<std::thread> ts;
      for (int t = 0; t < 8; ++t)
        ts.emplace_back([&, t] {
          for (uint64_t k = 0; k < 10; ++k) {
            uint64_t i = (k * 7 + uint64_t(t) * 3) % 10;
            Sample s;
            if (!(*ra)->Get(i, &s).ok()) continue;
            if (const Field* f = s.find("npy"); f) got[size_t(t) * 10 + i] = f->data.str();
          }
        });
      for (auto& t : ts) t.join();
      for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == samples[k % 10].find("npy")->data.str());
    }
    for (std::string dst : {"wds:" + dir / (name + "_o/s-%06d.tar"), "lmdb:" + dir / (name + "_o.lmdb"),
                            "hdf5:" + dir / (name + "_o.h5")}) {
      INFO(dst);
      ConvertOptions co;
      co.open = o;
      if (!dst.starts_with("wds:") && name != "gray" && !o.format_options.count("hdf5.channels")) {
        // h5py's files record no channel order; LMDB and HDF5 outputs record one: it must be said.
        auto refused = Convert(src, dst, co);
        REQUIRE_FALSE(refused.ok());
        CHECK_THAT(refused.status().ToString(), Catch::Contains("no channel order") && Catch::Contains("hdf5.channels=rgb"));
        co.open.format_options["hdf5.channels"] = "rgb";
      }
      auto sum = Convert(src, dst, co);
      if (!sum.ok()) FAIL(sum.status().ToString());
      std::string back = dst.starts_with("wds:") ? "wds:" + dir / (name + "_o/s-000000.tar") : dst;
      auto b = Open(back);
      if (!b.ok()) FAIL(b.status().ToString());
      CheckAgainst(ReadAll(**b), exp[name]);
    }
  }
  // Without the option an NCHW file reads as it is stored ([C, H, W] elements), never silently reordered.
  auto plain = Open("hdf5:" + dir / "nchw.h5");
  REQUIRE(plain.ok());
  CHECK((*plain)->info().extra.at("layout") == "decoded-images");
  // A declared element far larger than anything the file holds (unallocated chunks) is refused, not allocated.
  auto big = Run(fmt::format("/usr/bin/python3 -c \"import h5py, numpy as np; f = h5py.File('{}', 'w'); "
                             "f.create_dataset('images', (2, 20000, 20000, 3), np.uint8, chunks=(1, 64, 64, 3)); "
                             "f.create_dataset('labels', data=np.zeros(2, np.int64)); f.close()\"",
                             dir / "big.h5"));
  REQUIRE(big.exit_code == 0);
  auto bigds = Open("hdf5:" + dir / "big.h5");
  if (bigds.ok()) {
    auto rd = (*bigds)->NewReader();
    REQUIRE(rd.ok());
    Sample s;
    auto st = (*rd)->Next(&s);
    REQUIRE(!st.ok());
    CHECK_THAT(st.status().message(), Catch::Contains("an element of more than 268435456 bytes"));
  } else {
    CHECK_THAT(bigds.status().message(), Catch::Contains("dataset 'images': an element of more than 268435456 bytes"));
  }
  OpenOptions bad;
  bad.format_options["hdf5.order"] = "chwn";
  auto refused = Open("hdf5:" + dir / "nchw.h5", bad);
  REQUIRE(!refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("hdf5.order 'chwn'"));
}

namespace {

Bytes NpyOf(std::vector<uint64_t> shape, uint32_t seed) {
  pickle::NdArray a;
  a.dtype = pickle::DType{'u', 1, '|'};
  a.shape = std::move(shape);
  std::string d(size_t(a.elements()), '\0');
  for (size_t i = 0; i < d.size(); ++i) d[i] = char((i * 131 + seed * 17) & 0xff);
  a.data = Bytes::Copy(d);
  return pickle::ToNpy(a);
}

// Writes `samples` to `path` (any options), returns what Finish() said.
Status WriteSamples(const std::string& path, const std::vector<Sample>& samples, const WriteOptions& o = {}) {
  auto w = Create(path, o);
  if (!w.ok()) return w.status();
  for (const auto& s : samples) SK_RETURN_IF_ERROR((*w)->Write(s));
  return (*w)->Finish().status();
}

}  // namespace

TEST_CASE("hdf5 native arrays: images [N,H,W,C] or vlen + shapes, keys and labels back identical", "[hdf5][native]") {
  TempDir dir;
  for (bool same : {true, false}) {
    INFO("same shape " << same);
    std::vector<Sample> in;
    for (uint32_t i = 0; i < 40; ++i) {
      Sample s;
      s.key = fmt::format("dir/k{:03d}", i);
      s.set("npy", NpyOf(same ? std::vector<uint64_t>{5, 7, 3} : std::vector<uint64_t>{3 + i % 4, 7, 3}, i));
      if (i % 9 != 4) s.set_label(i % 6);
      in.push_back(std::move(s));
    }
    std::string path = dir / fmt::format("n{}.h5", same);
    Status st = WriteSamples(path, in);
    REQUIRE(st.ok());
    auto ds = Open(path);
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("layout") == (same ? "decoded-images" : "decoded-images-vlen"));
    CHECK_THAT((*ds)->info().extra.at("channel_order"), Catch::StartsWith("decoded arrays: rgb (attribute"));
    auto got = ReadAll(**ds);
    REQUIRE(got.size() == in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("sample " << i);
      CHECK(got[i].key == in[i].key);
      CHECK(got[i].find("npy")->data == in[i].find("npy")->data);
      CHECK(got[i].label() == in[i].label());
      CHECK(got[i].fields.size() == in[i].fields.size());
    }
  }
  SECTION("several 16 MiB runs of images (written by hyperslab runs)") {
    for (bool same : {true, false}) {
      std::vector<Sample> in(5);
      for (uint32_t i = 0; i < 5; ++i) {
        in[i].key = fmt::format("big{}", i);
        in[i].set("npy", NpyOf({same ? 1024u : 1000u + i, 2048, 3}, i));  // ~6 MiB each: runs of 2
        in[i].set_label(i);
      }
      std::string path = dir / fmt::format("big{}.h5", same);
      REQUIRE(WriteSamples(path, in).ok());
      auto ds = Open(path);
      REQUIRE(ds.ok());
      auto got = ReadAll(**ds);
      REQUIRE(got.size() == 5);
      for (size_t i = 0; i < 5; ++i) CHECK(got[i].find("npy")->data == in[i].find("npy")->data);
    }
  }
  SECTION("BGR said by the source: recorded, reported, converted only when asked") {
    std::vector<Sample> in(3);
    for (uint32_t i = 0; i < 3; ++i) {
      in[i].key = std::to_string(i);
      in[i].set("npy", NpyOf({2, 3, 3}, i));
    }
    WriteOptions o;
    o.array_channels = "bgr";
    REQUIRE(WriteSamples(dir / "bgr.h5", in, o).ok());
    auto ds = Open(dir / "bgr.h5");
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("channel_order").find("bgr") != std::string::npos);
    CHECK(ReadAll(**ds)[1].find("npy")->data == in[1].find("npy")->data);
    // The loader refuses BGR, naming this format's own option (not LMDB's).
    LoaderOptions lo;
    lo.batch_size = 3;
    lo.threads = 1;
    lo.output_width = lo.output_height = 8;
    auto refused = Loader::Create(dir / "bgr.h5", lo);
    REQUIRE(!refused.ok());
    CHECK_THAT(refused.status().ToString(), Catch::Contains("hdf5.channels=bgr-to-rgb"));
    auto sw = Open(dir / "bgr.h5", OpenOptions{.format_options = {{"hdf5.channels", "bgr-to-rgb"}}});
    REQUIRE(sw.ok());
    auto a = pickle::ParseNpy(ReadAll(**sw)[1].find("npy")->data);
    auto b = pickle::ParseNpy(in[1].find("npy")->data);
    REQUIRE((a.ok() && b.ok()));
    CHECK(a->data.data()[0] == b->data.data()[2]);
    CHECK(a->data.data()[2] == b->data.data()[0]);
    CHECK(a->data.data()[1] == b->data.data()[1]);
  }
  SECTION("a later sample that does not fit is refused, naming it; nothing is published") {
    std::vector<Sample> in(3);
    for (uint32_t i = 0; i < 3; ++i) {
      in[i].key = fmt::format("s{}", i);
      in[i].set("npy", NpyOf(i == 2 ? std::vector<uint64_t>{4, 4} : std::vector<uint64_t>{4, 4, 3}, i));
    }
    Status st = WriteSamples(dir / "bad.h5", in);
    CHECK(st.code() == Code::kInvalidArgument);
    CHECK(st.message().find("s2") != std::string::npos);
    CHECK(!std::filesystem::exists(dir / "bad.h5"));
    in[2].set("npy", NpyOf({4, 4, 3}, 2));
    in[2].set("txt", Bytes::Copy("caption"));
    st = WriteSamples(dir / "bad.h5", in);
    CHECK(st.message().find("--hdf5-arrays fields") != std::string::npos);
    WriteOptions o;
    o.format_options["hdf5.arrays"] = "fields";
    REQUIRE(WriteSamples(dir / "fields.h5", in, o).ok());
    auto ds = Open(dir / "fields.h5");
    REQUIRE(ds.ok());
    CHECK((*ds)->info().extra.at("layout") == "shardkit");
  }
}

TEST_CASE("array writers: a sample that is not one array and a label is refused, naming it, the layout and the way out",
          "[hdf5][lmdb][native][pickle]") {
  TempDir dir;
  struct Target {
    std::string path, layout, instead;
  };
  const Target targets[] = {
      {dir / "a.h5", "the HDF5 images layout", "--hdf5-arrays fields"},
      {"lmdb:" + dir / "a.lmdb", "the LMDB pickle layout", "--lmdb-arrays record"},
  };
  struct Bad {
    std::string why;
    std::function<void(Sample&)> spoil;
    std::string says;
  };
  const Bad bads[] = {
      {"another field", [](Sample& s) { s.set("txt", Bytes::Copy("caption")); }, "not field 'txt'"},
      {"no array", [](Sample& s) { s.fields.clear(); s.set("cls", Bytes::Copy("2")); }, "has no decoded array"},
      {"a label that is no integer", [](Sample& s) { s.set("cls", Bytes::Copy("2x")); }, "not a canonical integer label"},
      {"a label with a leading zero", [](Sample& s) { s.set("cls", Bytes::Copy("02")); }, "not a canonical integer label"},
      {"an array that does not parse", [](Sample& s) { s.set("npy", Bytes::Copy("not an npy")); }, "field npy:"},
  };
  for (const auto& t : targets) {
    for (const auto& b : bads) {
      INFO(t.layout << ": " << b.why);
      std::vector<Sample> in(3);
      for (uint32_t i = 0; i < 3; ++i) {
        in[i].key = fmt::format("s{}", i);
        in[i].set("npy", NpyOf({4, 4, 3}, i));
        in[i].set("cls", Bytes::Copy(std::to_string(i)));
      }
      b.spoil(in[2]);
      Status st = WriteSamples(t.path, in);
      CHECK(st.code() == Code::kInvalidArgument);
      CHECK_THAT(st.message(), Catch::Contains("sample 's2'") && Catch::Contains(b.says));
      if (b.says != "field npy:") {
        CHECK_THAT(st.message(), Catch::Contains(t.instead));
      }
      if (b.why == "another field" || b.why == "no array") {
        CHECK_THAT(st.message(), Catch::Contains(t.layout));
      }
    }
  }
  // HDF5's images layout also wants labels of 0 or more; the pickle layout keeps any.
  std::vector<Sample> in(2);
  for (uint32_t i = 0; i < 2; ++i) {
    in[i].key = fmt::format("s{}", i);
    in[i].set("npy", NpyOf({4, 4, 3}, i));
    in[i].set("cls", Bytes::Copy(i == 1 ? "-3" : "0"));
  }
  Status st = WriteSamples(dir / "neg.h5", in);
  CHECK_THAT(st.message(), Catch::Contains("sample 's1'") && Catch::Contains("negative"));
  CHECK(WriteSamples("lmdb:" + dir / "neg.lmdb", in).ok());
}
