// pipeline::RowPool (the GPU decode path's host threads), checked on the CPU.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/row_pool.h"

using shardkit::pipeline::RowPool;
using namespace std::chrono_literals;

namespace {

thread_local bool entered = false;

// Opens once, then lets every waiter through.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void Open() {
    std::lock_guard<std::mutex> lk(m);
    open = true;
    cv.notify_all();
  }
  bool Wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lk(m);
    return cv.wait_for(lk, limit, [&] { return open; });
  }
};

}  // namespace

TEST_CASE("row pool: slots are unique among running items, every thread is entered first, all items run", "[row_pool]") {
  const int n = 4;
  std::atomic<int> done{0}, bad_slot{0}, shared_slot{0}, not_entered{0};
  std::vector<std::atomic<int>> busy(n);
  const int items = 300;
  {
    RowPool pool(n, 0, [] { entered = true; });
    REQUIRE(pool.size() == n);
    std::vector<RowPool::Item> v;
    for (int i = 0; i < items; ++i)
      v.push_back([&](int slot) {
        if (!entered) ++not_entered;
        if (slot < 0 || slot >= n) {
          ++bad_slot;
        } else {
          if (busy[size_t(slot)].fetch_add(1) != 0) ++shared_slot;
          std::this_thread::sleep_for(200us);
          busy[size_t(slot)].fetch_sub(1);
        }
        ++done;
      });
    pool.Post(std::move(v), false);
  }  // the destructor returns once every item has run
  CHECK(done.load() == items);
  CHECK(bad_slot.load() == 0);
  CHECK(shared_slot.load() == 0);
  CHECK(not_entered.load() == 0);
}

TEST_CASE("row pool: urgent items are claimed before queued ones, the others in the order posted", "[row_pool]") {
  RowPool pool(1, 0);
  Gate gate;
  std::mutex m;
  std::vector<std::string> order;
  auto note = [&](std::string s) {
    return [&, s](int) {
      std::lock_guard<std::mutex> lk(m);
      order.push_back(s);
    };
  };
  std::atomic<bool> holding{false}, opened{false};
  pool.Post({[&](int) {
              holding = true;
              opened = gate.Wait(10s);  // (no Catch2 assertion off the test's thread)
            }},
            false);
  while (!holding) std::this_thread::sleep_for(1ms);  // the one slot is taken
  pool.Post({note("a"), note("b"), note("c")}, false);
  pool.Post({note("U1"), note("U2")}, true);
  gate.Open();
  for (int k = 0; k < 1000; ++k) {
    {
      std::lock_guard<std::mutex> lk(m);
      if (order.size() == 5) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::lock_guard<std::mutex> lk(m);
  CHECK(opened.load());
  CHECK(order == std::vector<std::string>{"U1", "U2", "a", "b", "c"});
}

TEST_CASE("row pool: more slots than cores still run at once", "[row_pool]") {
  // TBB's default is one thread a core: the pool raises the limit for its slots.
  const int n = int(std::max(2u, std::thread::hardware_concurrency())) * 3;
  RowPool pool(n, 0);
  std::atomic<int> arrived{0}, together{0};
  Gate all;
  std::vector<RowPool::Item> v;
  for (int i = 0; i < n; ++i)
    v.push_back([&](int) {
      if (arrived.fetch_add(1) + 1 == n) all.Open();
      if (all.Wait(20s)) ++together;
    });
  pool.Post(std::move(v), false);
  for (int k = 0; k < 4000 && together.load() < n; ++k) std::this_thread::sleep_for(5ms);
  CHECK(together.load() == n);
}
