#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "pipeline/bench_render.h"
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

// The plot's data lines, in document order: (stroke colour, dataset) of each
// `<polyline fill="none" stroke="#rrggbb" ...><title>DATASET (MODE)</title>`. Plain
// string scanning: std::regex's recursive matcher overflows the stack under ASan on an
// SVG this size.
std::vector<std::pair<std::string, std::string>> PlotLines(const std::string& svg) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string open = "<polyline fill=\"none\" stroke=\"";
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    const size_t c = p + open.size();
    std::string colour = svg.substr(c, 7);
    if (colour.size() != 7 || colour[0] != '#' ||
        colour.find_first_not_of("0123456789abcdef", 1) != std::string::npos)
      continue;
    const size_t gt = svg.find('>', c);
    if (gt == std::string::npos || svg.compare(gt + 1, 7, "<title>") != 0) continue;
    const size_t t0 = gt + 8, t1 = svg.find("</title>", t0);
    if (t1 == std::string::npos) continue;
    std::string title = svg.substr(t0, t1 - t0);
    const size_t paren = title.rfind(" (");
    if (paren == std::string::npos || title.back() != ')') continue;
    out.emplace_back(colour, title.substr(0, paren));
  }
  return out;
}

// The legend's entries: (y, dataset) of each `<text x="N" y="Y">DATASET <tspan`.
std::vector<std::pair<int, std::string>> LegendEntries(const std::string& svg) {
  std::vector<std::pair<int, std::string>> out;
  const std::string open = "<text x=\"";
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    size_t q = p + open.size();
    const size_t xend = svg.find_first_not_of("0123456789", q);
    if (xend == q || xend == std::string::npos || svg.compare(xend, 5, "\" y=\"") != 0) continue;
    q = xend + 5;
    const size_t yend = svg.find_first_not_of("0123456789", q);
    if (yend == q || yend == std::string::npos || svg.compare(yend, 2, "\">") != 0) continue;
    const int y = std::stoi(svg.substr(q, yend - q));
    const size_t t0 = yend + 2, lt = svg.find('<', t0);
    if (lt == std::string::npos || lt == t0 || svg[lt - 1] != ' ' || svg.compare(lt, 6, "<tspan") != 0) continue;
    out.emplace_back(y, svg.substr(t0, lt - 1 - t0));
  }
  return out;
}

TEST_CASE("bench plot: title, human units, one colour per dataset in both panels, legend outside", "[bench]") {
  BenchReport r;
  const std::vector<std::string> datasets = {"wds:a-{0..3}.tar", "lmdb:b.lmdb", "floor:memcpy"};
  for (const auto& ds : datasets)
    for (const char* mode : {"random-view", "random-copy"})
      for (int t : {1, 2, 4}) {
        BenchRow row;
        row.dataset = ds;
        row.format = ds.substr(0, ds.find(':'));
        row.mode = mode;
        row.threads = t;
        row.latency.count = 500;
        row.samples_per_s = 10971529.0 / double(5 - t) / double(1 + (&ds - datasets.data()));
        r.rows.push_back(row);
        if (t == 1) {
          std::vector<float> us;
          for (int i = 1; i <= 500; ++i) us.push_back(float(i) * 3.0f);
          r.cdfs.emplace_back(r.rows.size() - 1, std::move(us));
        }
      }
  std::string svg = BenchSvg(r);
  // A title saying what ran.
  CHECK(svg.find("shardkit bench: random-view, random-copy") != std::string::npos);
  CHECK(svg.find("threads 1, 2, 4; 500 samples per pass; warm page cache; 3 datasets") != std::string::npos);
  // Human units: rates in k/s and M/s, times in us and ms; no raw counts.
  CHECK(svg.find("M/s</text>") != std::string::npos);
  CHECK(svg.find(">1 ms</text>") != std::string::npos);
  CHECK(svg.find(">10 us</text>") != std::string::npos);
  CHECK(svg.find("10971529") == std::string::npos);
  CHECK(svg.find("5485764") == std::string::npos);
  // The throughput panel: a log rate axis with decade labels (a linear one would step by
  // 2.5M/s and squeeze the 0.9M/s series against zero) and both axes named.
  CHECK(svg.find(">samples per second (log scale)</text>") != std::string::npos);
  CHECK(svg.find(">100k/s</text>") != std::string::npos);
  CHECK(svg.find(">1M/s</text>") != std::string::npos);
  CHECK(svg.find(">10M/s</text>") != std::string::npos);
  CHECK(svg.find(">2.5M/s</text>") == std::string::npos);
  CHECK(svg.find(">threads (worker threads reading)</text>") != std::string::npos);
  CHECK(svg.find(">time per sample (log scale)</text>") != std::string::npos);
  // Every line of a dataset, in either panel, has the dataset's colour; datasets differ.
  std::map<std::string, std::set<std::string>> colours;
  std::vector<std::string> order;
  for (const auto& [colour, name] : PlotLines(svg)) {
    colours[name].insert(colour);
    order.push_back(name);
  }
  REQUIRE(colours.size() == 3);
  std::set<std::string> all;
  for (const auto& [ds, c] : colours) {
    CHECK(c.size() == 1);
    all.insert(*c.begin());
  }
  CHECK(all.size() == 3);
  // 6 CDF lines then 6 throughput lines, each panel in the rows' order.
  REQUIRE(order.size() == 12);
  CHECK(std::vector<std::string>(order.begin(), order.begin() + 6) ==
        std::vector<std::string>(order.begin() + 6, order.end()));
  CHECK(order[0] == "wds:a-{0..3}.tar");
  CHECK(order[2] == "lmdb:b.lmdb");
  // The legend names each dataset once, below the plot areas (which end at y = 390).
  int entries = 0;
  for (const auto& [y, name] : LegendEntries(svg)) {
    CHECK(y > 390);
    CHECK(colours.count(name) == 1);
    ++entries;
  }
  CHECK(entries == 3);
}

TEST_CASE("bench table: a zero-copy view has no MB/s", "[bench]") {
  BenchReport r;
  for (const char* mode : {"random-view", "random-copy"}) {
    BenchRow row;
    row.dataset = "lmdb:b.lmdb";
    row.format = "lmdb";
    row.mode = mode;
    row.latency.count = 100;
    row.samples_per_s = 1000;
    row.mb_per_s = std::string(mode) == "random-view" ? 226661.0 : 812.5;
    r.rows.push_back(row);
  }
  std::string t = BenchTable(r);
  CHECK(t.find("226661") == std::string::npos);
  CHECK(t.find(" view ") != std::string::npos);
  CHECK(t.find("812.5") != std::string::npos);
  CHECK(t.find("copies no bytes") != std::string::npos);
  auto j = nlohmann::json::parse(BenchJson(r));
  CHECK(j["rows"][0]["zero_copy"] == true);
  CHECK(j["rows"][1]["zero_copy"] == false);
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
  // Without a model step there is no stall to measure: the feed rate, "-" and how to
  // measure it, never "stall 100.0%".
  r = sk_test::Cli("bench " + sk_test::Q(d / "s.manifest.json") + " --loader --batch-size 4 --batches 3 --threads 1");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("%") == std::string::npos);
  CHECK(r.out.find("pass --step-ms") != std::string::npos);
  CHECK(r.out.find("images/s: the feed rate") != std::string::npos);
  r = sk_test::Cli("bench " + sk_test::Q(d / "s.manifest.json") +
                   " --loader --batch-size 4 --batches 3 --threads 1 --json");
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["rows"][0]["stall_share"].is_null());
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

TEST_CASE("bench threads: more workers than reads per slice, one pool reused across passes", "[bench]") {
  sk_test::TempDir d;
  sk_test::MakeImageFolder(d / "imgs", 2, 4);
  BenchOptions o;
  o.threads = {3, 1, 3};  // a count given twice reuses its pool
  o.samples = 7;          // 7 slices of one read: two of the three workers idle in each
  auto r = RunBench({d / "imgs"}, o);
  REQUIRE(r.ok());
  int rows3 = 0;
  for (const auto& row : r->rows) {
    CHECK(row.latency.count == 7);
    CHECK(row.samples_per_s > 0);
    CHECK(row.bytes > 0);
    rows3 += row.threads == 3;
  }
  CHECK(rows3 == 2 * (2 + 1 + 2));  // view, copy, floor, memory view and copy; twice
}

TEST_CASE("bench of a stream (pipe: shard): random mode fails clearly, sequential works", "[bench][pipe]") {
  sk_test::TempDir d;
  sk_test::MakeImageFolder(d / "imgs", 2, 5);
  auto conv = sk_test::Cli("convert " + sk_test::Q(d / "imgs") + " " + sk_test::Q("wds:" + (d / "s-%06d.tar")));
  REQUIRE(conv.exit_code == 0);
  std::string addr = "pipe:cat " + (d / "s-000000.tar");
  auto r = RunBench({addr}, BenchOptions{});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnsupported);
  CHECK(r.status().message().find(addr) != std::string::npos);
  CHECK(r.status().message().find("no random access") != std::string::npos);
  CHECK(r.status().message().find("--mode sequential") != std::string::npos);
  BenchOptions o;
  o.random = false;
  o.sequential = true;
  r = RunBench({addr}, o);  // size unknown up front: counted by one read of the stream
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  REQUIRE(r->rows.size() == 1);
  CHECK(r->rows[0].mode == "sequential");
  CHECK(r->rows[0].latency.count == 10);
  CHECK(r->rows[0].bytes > 0);
  o.samples = 25;  // wraps around: the command runs again
  r = RunBench({addr, d / "s.manifest.json"}, o);
  REQUIRE(r.ok());
  REQUIRE(r->rows.size() == 2);
  CHECK(r->rows[0].latency.count == 25);
  CHECK(r->rows[0].bytes == r->rows[1].bytes);  // the same samples as the files
  // A failing command is an error, not a short pass.
  r = RunBench({"pipe:cat " + (d / "s-000000.tar") + "; exit 5"}, o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("exit status 5") != std::string::npos);

  auto cli = sk_test::Cli("bench " + sk_test::Q(addr));
  CHECK(cli.exit_code == 1);
  CHECK(cli.err.find("no random access") != std::string::npos);
  CHECK(cli.err.find(addr) != std::string::npos);
  cli = sk_test::Cli("bench " + sk_test::Q(addr) + " --mode both");
  CHECK(cli.exit_code == 1);
  cli = sk_test::Cli("bench " + sk_test::Q(addr) + " --mode sequential --json");
  INFO(cli.err);
  REQUIRE(cli.exit_code == 0);
  auto j = nlohmann::json::parse(cli.out);
  REQUIRE(j["rows"].size() == 1);
  CHECK(j["rows"][0]["mode"] == "sequential");
  CHECK(j["rows"][0]["samples"] == 10);
}
