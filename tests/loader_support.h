// What the loader tests compare between runs: every batch's keys, dataset indices,
// labels and a fingerprint of each row's pixels. Include after catch2.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
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

// One line naming everything a consumer observes of a batch (for call-sequence logs).
inline std::string Describe(const shardkit::Batch& b) {
  Seen s = OneBatch(b);
  std::string out = "batch e" + std::to_string(b.epoch()) + " #" + std::to_string(b.index()) + ":";
  for (size_t i = 0; i < s.keys.size(); ++i)
    out += " " + s.keys[i] + "/" + std::to_string(s.indices[i]) + "/" + std::to_string(s.labels[i]) + "/" +
           std::to_string(s.rows[i]);
  return out;
}

// A call sequence for the loader: 'E' set_epoch(arg); 'N' arg Next() calls; 'D' Next()
// until the end of the epoch (or an error); 'S' save_state(); 'R' restore(the saved
// state); 'W' wait (no assertion) until a batch of the next epoch is decoded ahead and
// none is still decoding, or 100 ms if none is (only with prefetch_next_epoch: lets the
// prefetch run as a slow consumer would).
struct Step {
  char op;
  uint64_t arg = 0;
};

// Runs `steps` and logs every observable: each Next()'s batch, end marker or error,
// save_state() after each call, skipped() and stream_stats() after each 'D'.
inline std::vector<std::string> Script(shardkit::Loader& l, const std::vector<Step>& steps) {
  std::vector<std::string> log;
  shardkit::LoaderState saved = l.save_state();
  auto next = [&]() -> bool {  // false at the end of the epoch or an error
    auto r = l.Next();
    bool more = false;
    if (!r.ok()) log.push_back("error: " + r.status().ToString());
    else if (r->end_of_epoch()) log.push_back("end e" + std::to_string(r->epoch()) + " #" + std::to_string(r->index()));
    else {
      log.push_back(Describe(*r));
      more = true;
    }
    log.push_back("state " + l.save_state().ToJson());
    return more;
  };
  for (const Step& s : steps) {
    switch (s.op) {
      case 'E': l.set_epoch(s.arg); log.push_back("set_epoch " + std::to_string(s.arg)); break;
      case 'N':
        for (uint64_t i = 0; i < s.arg; ++i) next();
        break;
      case 'D': {
        while (next()) {
        }
        const bool ended = log[log.size() - 2].rfind("end ", 0) == 0;  // (not an error)
        for (const auto& st : l.skipped()) log.push_back("skipped " + st.ToString());
        // Streamed counters once the epoch is complete (after an error they depend on
        // how far the reader thread had read ahead, with or without the prefetch).
        if (ended) {
          auto ss = l.stream_stats();
          log.push_back("stream " + std::to_string(ss.max_buffered) + " " + std::to_string(ss.samples_read) + " " +
                        std::to_string(ss.shards_opened));
        }
        break;
      }
      case 'S': saved = l.save_state(); break;
      case 'R': log.push_back("restore " + l.restore(saved).ToString()); break;
      case 'W':
        if (l.options().prefetch_next_epoch) {
          const auto t0 = std::chrono::steady_clock::now();
          for (;;) {
            auto ps = l.prefetch_stats();
            const auto waited = std::chrono::steady_clock::now() - t0;
            if (ps.decoding_ahead == 0 && (ps.ready_ahead > 0 || waited > std::chrono::milliseconds(100))) break;
            if (waited > std::chrono::seconds(10)) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }
        break;
    }
  }
  return log;
}

// Waits (up to 20 s) until `count` batches of the next epoch are decoded ahead.
inline bool WaitAhead(const shardkit::Loader& l, uint64_t count) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (l.prefetch_stats().ready_ahead < count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The call sequence the prefetch tests run with and without LoaderOptions::
// prefetch_next_epoch (nb: batches per epoch): successive epochs, set_epoch(e + 1)
// mid-epoch (also right before the end), the same epoch again, a non-successor epoch,
// save/restore mid-epoch and at the end of an epoch.
inline std::vector<Step> EpochSteps(uint64_t nb) {
  using S = Step;
  return {S{'E', 0}, S{'D'}, S{'W'}, S{'E', 1}, S{'D'}, S{'E', 2}, S{'N', 1}, S{'E', 3},
          S{'N', nb ? nb - 1 : 0}, S{'W'}, S{'E', 4}, S{'D'}, S{'W'}, S{'E', 6}, S{'D'}, S{'W'},
          S{'E', 6}, S{'N', 1}, S{'S'}, S{'D'}, S{'W'}, S{'R'}, S{'D'}, S{'W'}, S{'S'}, S{'E', 7},
          S{'N', 1}, S{'R'}, S{'N', 1}, S{'W'}, S{'E', 7}, S{'D'}, S{'W'}, S{'E', 8}, S{'D'}};
}

// Makes two loaders with make(o) (returning std::unique_ptr<Loader>), prefetch_next_epoch
// off and on, runs EpochSteps on both and checks that their logs agree line for line.
// Returns {off, on} for further checks.
template <class Make>
std::pair<std::unique_ptr<shardkit::Loader>, std::unique_ptr<shardkit::Loader>> SameWithAndWithoutPrefetch(
    shardkit::LoaderOptions o, Make make) {
  o.prefetch_next_epoch = false;
  std::unique_ptr<shardkit::Loader> off = make(o);
  o.prefetch_next_epoch = true;
  std::unique_ptr<shardkit::Loader> on = make(o);
  auto steps = EpochSteps(on->num_batches());
  auto want = Script(*off, steps);
  auto got = Script(*on, steps);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("log line " << i);
    CHECK(got[i] == want[i]);
  }
  return {std::move(off), std::move(on)};
}

}  // namespace sk_test
