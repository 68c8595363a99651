// pipeline/row_pool.cc: RowPool (row_pool.h).
#include "pipeline/row_pool.h"

#include <tbb/info.h>

#include <atomic>

namespace shardkit::pipeline {

namespace {
std::atomic<uint64_t> next_pool_id{1};
// The pool whose on_entry this thread ran last: a thread entering another pool (or a new
// pool at the address of an old one) runs that pool's on_entry again.
thread_local uint64_t entered_pool = 0;
}  // namespace

RowPool::RowPool(int threads, int other_threads, std::function<void()> on_entry)
    : threads_(threads), arena_(threads, 0), on_entry_(std::move(on_entry)), id_(next_pool_id++) {
  // Let the arena have `threads` workers even beyond TBB's default (hardware - 1), beside
  // the caller's other arenas.
  const size_t want = size_t(threads) + size_t(other_threads) + 1;
  if (want > size_t(tbb::info::default_concurrency()))
    control_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, want);
}

RowPool::~RowPool() {
  std::unique_lock<std::mutex> lk(m_);
  idle_.wait(lk, [&] { return running_ == 0; });
}

void RowPool::Post(std::vector<Item> items, bool urgent) {
  const size_t n = items.size();
  {
    std::lock_guard<std::mutex> lk(m_);
    auto& q = urgent ? urgent_ : normal_;
    for (auto& f : items) q.push_back(std::move(f));
    running_ += n;
  }
  for (size_t k = 0; k < n; ++k) arena_.enqueue([this] { RunOne(); });
}

void RowPool::RunOne() {
  Item f;
  {
    std::lock_guard<std::mutex> lk(m_);
    auto& q = !urgent_.empty() ? urgent_ : normal_;
    f = std::move(q.front());
    q.pop_front();
  }
  if (entered_pool != id_) {
    if (on_entry_) on_entry_();
    entered_pool = id_;
  }
  f(tbb::this_task_arena::current_thread_index());
  std::lock_guard<std::mutex> lk(m_);
  if (--running_ == 0) idle_.notify_all();
}

}  // namespace shardkit::pipeline
