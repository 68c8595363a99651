// The strict pickle subset reader (lib/core/pickle.*): pickles made at test time by
// Debian's python3-numpy (tests/pickle_make.py) for protocols 2-5 and every accepted
// dtype, compared byte for byte with np.save of the same array; plain data; the
// hostile set; and the .npy writer read back by numpy.
#include <catch2/catch.hpp>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/pickle.h"
#include "support.h"

using namespace shardkit;
using namespace sk_test;
namespace fs = std::filesystem;
using pickle::Value;
using K = pickle::Value::Kind;

namespace {

const std::string& Fixtures() {
  static TempDir dir;
  static bool made = [] {
    auto r = Run(fmt::format("/usr/bin/python3 {}/tests/pickle_make.py {}", SHARDKIT_SOURCE_DIR, Q(dir.path())));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return true;
  }();
  (void)made;
  return dir.path();
}

Bytes Load(const std::string& path) { return Bytes::Take(ReadFile(path)); }

}  // namespace

TEST_CASE("pickle: numpy arrays of every protocol and dtype match np.save", "[pickle]") {
  const std::string dir = Fixtures();
  auto cases = nlohmann::json::parse(ReadFile(dir + "/cases.json"));
  REQUIRE(cases.size() > 300);
  size_t fortran = 0;
  for (const auto& c : cases) {
    std::string name = c.get<std::string>();
    INFO(name);
    auto v = pickle::ParsePickle(Load(dir + "/" + name + ".pkl"));
    REQUIRE(v.ok());
    REQUIRE(v->kind == K::kArray);
    auto want = pickle::ParseNpy(Load(dir + "/" + name + ".npy"));
    REQUIRE(want.ok());
    CHECK(v->array.dtype.descr() == want->dtype.descr());
    CHECK(v->array.shape == want->shape);
    CHECK(v->array.fortran_order == want->fortran_order);
    CHECK(v->array.data == want->data);
    fortran += v->array.fortran_order;
  }
  CHECK(fortran > 50);
}

TEST_CASE("pickle: (image, label) tuples, numpy scalars and plain data", "[pickle]") {
  const std::string dir = Fixtures();
  for (int proto = 2; proto <= 5; ++proto) {
    INFO("protocol " << proto);
    auto t = pickle::ParsePickle(Load(fmt::format("{}/p{}_tuple.pkl", dir, proto)));
    REQUIRE(t.ok());
    REQUIRE(t->kind == K::kTuple);
    REQUIRE(t->items.size() == 2);
    auto img = pickle::ParseNpy(Load(fmt::format("{}/p{}_tuple.npy", dir, proto)));
    REQUIRE(img.ok());
    CHECK(t->items[0].array.shape == std::vector<uint64_t>{7, 9, 3});
    CHECK(t->items[0].array.data == img->data);
    CHECK(t->items[1].kind == K::kInt);
    CHECK(t->items[1].i == 3);

    auto s = pickle::ParsePickle(Load(fmt::format("{}/p{}_scalar.pkl", dir, proto)));
    REQUIRE(s.ok());
    REQUIRE(s->items.size() == 3);
    for (const auto& x : s->items) CHECK((x.kind == K::kArray && x.array.shape.empty()));
    int64_t i64;
    std::memcpy(&i64, s->items[0].array.data.data(), 8);
    CHECK(i64 == -5);
    CHECK(s->items[0].array.dtype.descr() == "<i8");
    float f32;
    std::memcpy(&f32, s->items[1].array.data.data(), 4);
    CHECK(f32 == 1.5f);
    CHECK(s->items[2].array.data.data()[0] == 200);

    auto d = pickle::ParsePickle(Load(fmt::format("{}/p{}_data.pkl", dir, proto)));
    REQUIRE(d.ok());
    REQUIRE(d->kind == K::kDict);
    std::map<std::string, const Value*> m;
    for (const auto& [k, val] : d->dict) {
      REQUIRE(k.kind == K::kStr);
      m[k.s] = &val;
    }
    REQUIRE(m.size() == 7);
    std::vector<int64_t> ints;
    for (const auto& x : m["a"]->items) ints.push_back(x.i);
    CHECK(ints == std::vector<int64_t>{1, -1, 255, 256, 65535, 65536, INT32_MIN, int64_t(1) << 31, INT64_MAX, INT64_MIN});
    CHECK(m["s"]->s == "h\xc3\xa9llo \xe2\x9c\x93");
    CHECK(m["b"]->kind == K::kBytes);
    CHECK(m["b"]->bytes.str() == std::string("\x00\xffraw", 5));
    CHECK(m["e"]->kind == K::kBytes);
    CHECK(m["e"]->bytes.empty());
    const auto& t5 = m["t"]->items;
    REQUIRE(t5.size() == 5);
    CHECK(t5[0].kind == K::kNone);
    CHECK((t5[1].kind == K::kBool && t5[1].b));
    CHECK((t5[2].kind == K::kBool && !t5[2].b));
    CHECK(t5[3].f == 1.25);
    CHECK(std::signbit(t5[4].f));
    CHECK(m["nested"]->items[0].items[1].items[1].items[0].i == 3);
    CHECK(m["nested"]->items[1].dict[0].second.s == "v");
    REQUIRE(m["shared"]->items.size() == 2);
    CHECK(m["shared"]->items[1].items[1].i == 2);
  }
}

TEST_CASE("pickle: the hostile set gives clear errors and executes nothing", "[pickle][hostile]") {
  const std::string dir = Fixtures();
  std::map<std::string, std::string> want = {
      {"os_system", "global 'posix.system' is refused"},
      {"os_system_p4", "global 'posix.system' is refused"},
      {"eval_in_tuple", "global 'posix.system' is refused"},
      {"builtins_getattr", "global 'builtins.getattr' is refused"},
      {"reduce_ndarray", "REDUCE of numpy.ndarray"},
      {"reduce_tuple", "REDUCE of a tuple"},
      {"truncated", "FRAME of 158 bytes runs past the end"},
      {"truncated_p2", "truncated"},
      {"truncated_frame", "FRAME of"},
      {"memo_out_of_range", "memo entry 5 is not defined"},
      {"memo_long_out_of_range", "memo entry 4294967295 is not defined"},
      {"shape_exceeds", "need 1000000 bytes, the data has 6"},
      {"shape_exceeds_p5", "the data has 6"},
      {"self_list", "nesting deeper than 64 (or a cycle)"},
      {"deep_nesting", "nesting deeper than 64"},
      {"shared_bomb", "result of more than"},
      {"marks_bomb", "stack limit exceeded"},
      {"object_array", "numpy dtype 'O8' is not read"},
      {"string_array", "numpy dtype 'U2' is not read"},
      {"out_of_band", "out-of-band buffer"},
      {"protocol_0", "not a pickle of protocol 2-5"},
      {"trailing", "4 bytes after STOP"},
      {"huge_long", "does not fit 64 bits"},
      {"set", "EMPTY_SET"},
  };
  auto names = nlohmann::json::parse(ReadFile(dir + "/hostile.json"));
  REQUIRE(names.size() == want.size());
  for (const auto& n : names) {
    std::string name = n.get<std::string>();
    INFO(name);
    REQUIRE(want.count(name));
    auto v = pickle::ParsePickle(Load(dir + "/hostile_" + name + ".pkl"));
    REQUIRE(!v.ok());
    CHECK_THAT(v.status().message(), Catch::Contains(want[name]));
  }
  CHECK(!fs::exists(dir + "/PWNED"));
  // Every prefix of a good pickle is refused cleanly (never read past the end).
  Bytes good = Load(dir + "/p4_tuple.pkl");
  for (size_t n = 0; n < good.size(); ++n) CHECK(!pickle::ParsePickle(good.slice(0, n)).ok());
  CHECK(pickle::ParsePickle(good).ok());
}

TEST_CASE("pickle: .npy written by shardkit is read by numpy", "[pickle]") {
  TempDir t;
  std::vector<uint8_t> px(4 * 5 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(i * 7);
  pickle::NdArray a;
  a.shape = {4, 5, 3};
  a.data = Bytes::Copy(px.data(), px.size());
  Bytes npy = pickle::ToNpy(a);
  CHECK((npy.size() - px.size()) % 64 == 0);
  WriteFile(t / "a.npy", npy.str());
  pickle::NdArray b;
  b.dtype = {'f', 4, '<'};
  b.shape = {3};
  float fl[3] = {1.5f, -2.f, 0.25f};
  b.data = Bytes::Copy(fl, sizeof fl);
  WriteFile(t / "b.npy", pickle::ToNpy(b).str());
  auto r = Run(fmt::format(
      "/usr/bin/python3 -c \"import numpy as np; a=np.load('{0}/a.npy'); b=np.load('{0}/b.npy'); "
      "assert a.shape==(4,5,3) and a.dtype==np.uint8 and (a.ravel()==(np.arange(60)*7%256)).all(); "
      "assert b.tolist()==[1.5,-2.0,0.25]; print('ok')\"",
      t.path()));
  INFO(r.err);
  CHECK(r.exit_code == 0);
  auto back = pickle::ParseNpy(npy);
  REQUIRE(back.ok());
  CHECK(back->shape == a.shape);
  CHECK(back->data == a.data);
}
