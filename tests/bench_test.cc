#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "shardkit/bench.h"
#include "support.h"

using namespace shardkit;

TEST_CASE("bench order is a seeded permutation, deterministic", "[bench]") {
  auto a = BenchOrder(7, 100, 100);
  auto b = BenchOrder(7, 100, 100);
  auto c = BenchOrder(8, 100, 100);
  CHECK(a == b);
  CHECK(a != c);
  std::set<uint64_t> uniq(a.begin(), a.end());
  CHECK(uniq.size() == 100);
  CHECK(*uniq.rbegin() == 99);
  auto d = BenchOrder(7, 10, 25);  // wraps with fresh permutations
  REQUIRE(d.size() == 25);
  CHECK(std::set<uint64_t>(d.begin(), d.begin() + 10).size() == 10);
  // Fixed values: the order must not change between machines or versions.
  CHECK(BenchOrder(1, 5, 5) == BenchOrder(1, 5, 5));
}

TEST_CASE("latency percentiles by nearest rank", "[bench]") {
  std::vector<float> v;
  for (int i = 1000; i >= 1; --i) v.push_back(float(i));
  auto s = ComputeLatency(v);
  CHECK(s.count == 1000);
  CHECK(s.p50 == 500);
  CHECK(s.p90 == 900);
  CHECK(s.p99 == 990);
  CHECK(s.p999 == 999);
  CHECK(s.max == 1000);
  CHECK(s.mean == Approx(500.5));
}

TEST_CASE("bench of a missing dataset fails clearly", "[bench]") {
  auto r = RunBench({"/nonexistent/ds"}, BenchOptions{});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().ToString().find("/nonexistent/ds") != std::string::npos);
  CHECK_FALSE(RunBench({}, BenchOptions{}).ok());
  BenchOptions o;
  o.random = false;
  CHECK(RunBench({"/tmp"}, o).status().message().find("mode") != std::string::npos);
}

TEST_CASE("bench report on an image folder: structure, JSON schema, SVG", "[bench]") {
  sk_test::TempDir d;
  sk_test::MakeImageFolder(d / "imgs", 3, 10);
  BenchOptions o;
  o.sequential = true;
  o.threads = {1, 2};
  o.samples = 60;
  auto r = RunBench({"folder:" + (d / "imgs")}, o);
  REQUIRE(r.ok());
  // random-view and random-copy at 1 and 2 threads, sequential once, floor at 1 and 2,
  // in-memory view/copy at 1 and 2.
  std::set<std::string> modes;
  for (const auto& row : r->rows) {
    modes.insert(row.format + "/" + row.mode);
    CHECK(row.latency.count == 60);
    CHECK(row.latency.p50 > 0);
    CHECK(row.latency.p50 <= row.latency.p90);
    CHECK(row.latency.p90 <= row.latency.p99);
    CHECK(row.latency.p99 <= row.latency.p999);
    CHECK(row.latency.p999 <= row.latency.max);
    CHECK(row.samples_per_s > 0);
    CHECK(row.bytes > 0);
  }
  CHECK(modes == std::set<std::string>{"folder/random-view", "folder/random-copy", "folder/sequential",
                                       "memcpy/random-copy", "memory/random-view", "memory/random-copy"});
  CHECK(r->rows.size() == 2 + 2 + 1 + 2 + 4);
  auto j = nlohmann::json::parse(BenchJson(*r));
  CHECK(j["schema"] == "shardkit-bench-v1");
  for (const auto& row : j["rows"])
    for (const char* k : {"p50", "p90", "p99", "p99.9", "max", "mean"}) CHECK(row["latency_us"].contains(k));
  std::string svg = BenchSvg(*r);
  sk_test::WriteFile(d / "plot.svg", svg);
  auto x = sk_test::Run("/usr/bin/python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1]); print(\"ok\")' " +
                        sk_test::Q(d / "plot.svg"));
  CHECK(x.exit_code == 0);
  CHECK(x.out == "ok\n");
  CHECK(BenchTable(*r).find("p99.9 us") != std::string::npos);
}

TEST_CASE("cold bench drops the page cache and says so", "[bench]") {
  sk_test::TempDir d;
  sk_test::MakeImageFolder(d / "imgs", 2, 5);
  BenchOptions o;
  o.cold = true;
  o.samples = 10;
  o.slices = 2;
  o.floor = false;
  auto r = RunBench({d / "imgs"}, o);
  REQUIRE(r.ok());
  for (const auto& row : r->rows) CHECK(row.cold);
  bool said = false;
  for (const auto& n : r->notes) said |= n.find("DONTNEED") != std::string::npos;
  CHECK(said);
}

TEST_CASE("shardkit bench on the command line: table, JSON, plot, loader mode, errors", "[bench][cli]") {
  sk_test::TempDir d;
  sk_test::MakeImageFolder(d / "imgs", 2, 8);
  auto conv = sk_test::Cli("convert " + sk_test::Q(d / "imgs") + " " + sk_test::Q("wds:" + (d / "s-%06d.tar")));
  REQUIRE(conv.exit_code == 0);
  auto r = sk_test::Cli(sk_test::Q(d / "imgs") + " " + sk_test::Q(d / "s.manifest.json"));
  CHECK(r.exit_code == 2);  // no subcommand given: usage
  r = sk_test::Cli("bench " + sk_test::Q(d / "imgs") + " " + sk_test::Q(d / "s.manifest.json") +
                   " --samples 32 --threads 1,2 --json --plot " + sk_test::Q(d / "p.svg"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["schema"] == "shardkit-bench-v1");
  std::set<std::string> formats;
  for (const auto& row : j["rows"]) formats.insert(row["format"].get<std::string>());
  CHECK(formats == std::set<std::string>{"folder", "wds", "memcpy", "memory"});
  CHECK(sk_test::ReadFile(d / "p.svg").find("<svg") != std::string::npos);
  r = sk_test::Cli("bench " + sk_test::Q(d / "s.manifest.json") + " --samples 16");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("random-view") != std::string::npos);
  CHECK(r.out.find("floor:memcpy") != std::string::npos);
  r = sk_test::Cli("bench " + sk_test::Q(d / "s.manifest.json") +
                   " --loader --batch-size 4 --batches 3 --threads 1 --step-ms 1 --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto l = nlohmann::json::parse(r.out);
  CHECK(l["schema"] == "shardkit-bench-loader-v1");
  REQUIRE(l["rows"].size() == 1);
  CHECK(l["rows"][0]["batches"] == 3);
  CHECK(l["rows"][0]["images"] == 12);
  CHECK(l["rows"][0]["images_per_s"].get<double>() > 0);
  double stall = l["rows"][0]["stall_share"].get<double>();
  CHECK(stall >= 0);
  CHECK(stall <= 1);
  r = sk_test::Cli("bench " + sk_test::Q(d / "missing"));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(d / "missing") != std::string::npos);
  r = sk_test::Cli("bench " + sk_test::Q(d / "imgs") + " --threads 0,x");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--threads") != std::string::npos);
  r = sk_test::Cli("bench --help");
  for (const char* flag : {"--mode", "--threads", "--samples", "--seconds", "--cold", "--seed", "--json", "--plot",
                           "--loader", "--batch-size", "--step-ms"})
    CHECK(r.out.find(flag) != std::string::npos);
}
