// Test helper: every sample of a dataset in its reader's order, failing the test (Catch2
// REQUIRE, with the status in the message) on an error.
#pragma once

#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "shardkit/dataset.h"

namespace sk_test {

inline std::vector<shardkit::Sample> ReadAllSamples(const shardkit::Dataset& ds) {
  auto r = ds.NewReader();
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  std::vector<shardkit::Sample> out;
  for (;;) {
    shardkit::Sample s;
    auto more = (*r)->Next(&s);
    INFO(more.status().ToString());
    REQUIRE(more.ok());
    if (!*more) break;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace sk_test
