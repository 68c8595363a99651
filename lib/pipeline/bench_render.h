// Internal: how `shardkit bench` shows its reports (shardkit/bench.h runs them). Defined in
// bench.cc.
#pragma once

#include <string>
#include <vector>

#include "shardkit/bench.h"

namespace shardkit {

// A report as a table, as JSON (schema "shardkit-bench-v1", docs/bench.md), and as an SVG
// with the latency CDF of every dataset (log time axis) and throughput versus threads.
std::string BenchTable(const BenchReport& r);
std::string BenchJson(const BenchReport& r);
std::string BenchSvg(const BenchReport& r);
// `bench --loader` rows as a table and as JSON.
std::string LoaderBenchTable(const std::vector<LoaderBenchResult>& r);
std::string LoaderBenchJson(const std::vector<LoaderBenchResult>& r);

}  // namespace shardkit
