// HDF5 files of decoded images as h5py and Keras users write them
// (formats/hdf5/arrays.*): fixtures made at test time with h5py
// (tests/hdf5_wild_make.py), read as "npy" fields in [H, W, C] order, converted to
// every format and back with identical pixels.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/md5.h"
#include "core/pickle.h"
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
  for (std::string name : {"contiguous", "chunked", "nchw", "keras", "gray"}) {
    INFO(name);
    OpenOptions o;
    if (name == "nchw") o.format_options["hdf5.order"] = "nchw";
    std::string src = "hdf5:" + dir / (name + ".h5");
    auto ds = Open(src, o);
    if (!ds.ok()) FAIL(ds.status().ToString());
    CHECK((*ds)->info().num_samples == 10);
    auto samples = ReadAll(**ds);
    CheckAgainst(samples, exp[name]);
    for (std::string dst : {"wds:" + dir / (name + "_o/s-%06d.tar"), "lmdb:" + dir / (name + "_o.lmdb"),
                            "hdf5:" + dir / (name + "_o.h5")}) {
      INFO(dst);
      ConvertOptions co;
      co.open = o;
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
