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
