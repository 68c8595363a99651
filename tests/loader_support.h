// What the loader tests compare between runs: every batch's keys, dataset indices,
// labels and a fingerprint of each row's pixels. Include after catch2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardkit/loader.h"
#include "support.h"

namespace sk_test {

struct Seen {
  std::vector<std::string> keys;
  std::vector<uint64_t> indices;
  std::vector<int64_t> labels;
  std::vector<uint64_t> rows;  // Fnv of each row's pixels
  bool operator==(const Seen& o) const {
    return keys == o.keys && indices == o.indices && labels == o.labels && rows == o.rows;
  }
};

inline Seen OneBatch(const shardkit::Batch& b) {
  Seen s;
  s.keys = b.keys();
  s.indices = b.indices();
  s.labels = b.labels();
  const size_t row = b.size() ? b.bytes() / b.size() : 0;
  for (size_t i = 0; i < b.size(); ++i) s.rows.push_back(Fnv(static_cast<const uint8_t*>(b.data()) + i * row, row));
  return s;
}

// Runs the rest of the current epoch.
inline std::vector<Seen> Drain(shardkit::Loader& l) {
  std::vector<Seen> out;
  for (;;) {
    auto r = l.Next();
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    if (r->end_of_epoch()) break;
    out.push_back(OneBatch(*r));
  }
  return out;
}

}  // namespace sk_test
