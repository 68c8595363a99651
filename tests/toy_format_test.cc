// A new format registers from a test folder (tests/toy_format/) without an edit in
// tools/ or python/: its row and its writer options reach the registry, FormatOptions()
// (from which the CLI's flags and Python's keyword arguments are made), Convert() and
// Open().
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "formats/registry.h"
#include "read_all.h"
#include "shardkit/convert.h"
#include "shardkit/dataset.h"
#include "support.h"
#include "toy_format/toy.h"

using namespace shardkit;

namespace {

// Every sample of a dataset by key: field -> bytes.
std::map<std::string, std::map<std::string, std::string>> ByKey(const std::string& address) {
  auto ds = Open(address);
  INFO(address << ": " << ds.status().ToString());
  REQUIRE(ds.ok());
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const Sample& s : sk_test::ReadAllSamples(**ds))
    for (const auto& f : s.fields) out[s.key][f.ext] = std::string(f.data.view());
  return out;
}

}  // namespace

TEST_CASE("toy format: registers from a test folder, its option table reaches FormatOptions and Convert",
          "[registry]") {
  REQUIRE(formats::Register(sk_test::ToyFormat()).ok());
  CHECK(formats::Register(sk_test::ToyFormat()).code() == Code::kAlreadyExists);  // a name is taken once
  auto names = FormatNames();
  CHECK(std::find(names.begin(), names.end(), "toy") != names.end());
  auto options = FormatOptions();
  auto toy = std::find_if(options.begin(), options.end(), [](const FormatOption& o) { return o.key() == "toy.case"; });
  REQUIRE(toy != options.end());
  CHECK(toy->default_value == "keep");
  CHECK(toy->choices == std::vector<std::string>{"keep", "upper"});

  sk_test::TempDir t;
  sk_test::MakeImageFolder(t / "src", 2, 3, 4);
  const auto source = ByKey(t / "src");
  REQUIRE(source.size() == 6);

  // Written by name (x.toy bids), with the option; read back by name.
  ConvertOptions co;
  co.write.format_options["toy.case"] = "upper";
  co.write.format_options["lmdb.layout"] = "caffe";  // another format's key: ignored
  auto sum = Convert(t / "src", t / "out.toy", co);
  INFO(sum.status().ToString());
  REQUIRE(sum.ok());
  CHECK(sum->samples == 6u);
  auto back = ByKey(t / "out.toy");
  REQUIRE(back.size() == 6);
  for (const auto& [key, fields] : source) {
    std::string upper = key;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return char(std::toupper(c)); });
    REQUIRE(back.count(upper) == 1);
    CHECK(back.at(upper) == fields);
  }
  // And on to a format of the library's own.
  REQUIRE(Convert(t / "out.toy", "wds:" + (t / "tar/x-%03d.tar"), {}).ok());
  CHECK(ByKey(t / "tar/x.manifest.json") == back);

  // Its table is enforced: an unknown option and a value outside the choices are refused.
  ConvertOptions bad;
  bad.write.format_options["toy.nope"] = "1";
  auto r = Convert(t / "src", t / "bad.toy", bad);
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().find("toy.nope") != std::string::npos);
  CHECK(r.status().message().find("toy.case") != std::string::npos);  // says what is known
  bad.write.format_options = {{"toy.case", "lower"}};
  r = Convert(t / "src", t / "bad.toy", bad);
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().find("'keep', 'upper'") != std::string::npos);
}
