// pipeline/row_pool.h: a pool of row workers on a TBB arena of its own, for work whose
// items must know which thread slot runs them (the GPU decode path's host threads:
// nvJPEG's per-thread contexts, docs/gpu.md).
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace shardkit::pipeline {

// A work item is claimed when a thread is free, not when it is posted: each task the
// arena runs takes the most urgent item queued then (urgent items first, then the others
// in the order posted), so the items of the next batches start while the last ones of a
// batch finish, and urgent items never queue behind them.
//
// Threading: Post from any thread. An item runs on one arena thread and is told its slot,
// 0 .. size()-1, which no other item running at the same time has. on_entry(), when
// given, runs on a thread before the first item of this pool it runs (TBB's threads move
// between arenas: per-thread state such as CUDA's current device is set there). Items must not wait on
// TBB work themselves (the waiting thread could take another item into the same slot),
// and must not throw. The destructor returns once every posted item has run.
class RowPool {
 public:
  using Item = std::function<void(int slot)>;
  // `threads` slots. `other_threads`: threads of the caller's other arenas that run at
  // the same time, for TBB's process-wide thread limit (raised when the cores are fewer).
  RowPool(int threads, int other_threads, std::function<void()> on_entry = {});
  ~RowPool();
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  int size() const { return threads_; }
  void Post(std::vector<Item> items, bool urgent);

 private:
  void RunOne();

  const int threads_;
  std::unique_ptr<tbb::global_control> control_;
  tbb::task_arena arena_;
  const std::function<void()> on_entry_;
  const uint64_t id_;  // unique among the pools of the process: which threads have entered
  std::mutex m_;
  std::condition_variable idle_;
  std::deque<Item> urgent_, normal_;
  size_t running_ = 0;  // items posted and not finished
};

}  // namespace shardkit::pipeline
