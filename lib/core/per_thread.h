// Internal: one slot per (object, thread), found without a lock.
//
// The random-access readers hand out zero-copy views (Bytes) whose owner is a
// shared_ptr. If every thread's views shared one control block (the mapping's),
// each Get() would bounce that block's reference count between cores: at two
// threads and a few hundred ns per view, that alone halves the scaling. A
// PerThread<Slot> gives each calling thread a Slot of its own, and the views
// made on that thread use the slot's control block instead.
//
// Get() looks the slot up in a thread_local list keyed by the object's id (ids
// are never reused, unlike addresses); only a thread's first Get() on an object
// takes the object's mutex (to make a slot, or to reuse one whose thread has
// exited). The object holds its slots; the thread_local list holds weak
// references, so a slot lives while its object or any view of it does, never
// longer. A Slot should be alignas(64): slots made one after another would
// otherwise put two threads' reference counts in one cache line. Thread safety: Get() may be called from any number of threads; the
// object must outlive the calls (not the slots it returned).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::core {

inline uint64_t NextPerThreadId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <class Slot>
class PerThread {
 public:
  PerThread() : id_(NextPerThreadId()) {}
  PerThread(const PerThread&) = delete;
  PerThread& operator=(const PerThread&) = delete;

  // This thread's slot; `make` (() -> Result<std::shared_ptr<Slot>>) makes one on
  // the thread's first call when no slot of an exited thread is free.
  template <class Make>
  Result<std::shared_ptr<Slot>> Get(Make&& make) const {
    ThreadList& mine = Mine();
    for (auto& e : mine.entries)
      if (e.owner_id == id_) {
        // Alive: held_ holds it as long as this object lives.
        if (auto s = e.slot.lock()) return s;
        break;
      }
    Held h;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& x : held_)
        if (x.thread_gone->load(std::memory_order_acquire)) {
          x.thread_gone->store(false, std::memory_order_relaxed);
          h = x;
          break;
        }
      if (!h.slot) {
        SK_ASSIGN_OR_RETURN(h.slot, make());
        h.thread_gone = std::make_shared<std::atomic<bool>>(false);
        held_.push_back(h);
      }
    }
    // Forget slots of objects that are gone, and this object's old entry.
    std::erase_if(mine.entries, [&](const Entry& e) { return e.owner_id == id_ || e.slot.expired(); });
    mine.entries.push_back({id_, h.slot, h.thread_gone});
    return h.slot;
  }

  // Slots made so far (tests).
  size_t slots() const {
    std::lock_guard<std::mutex> g(mu_);
    return held_.size();
  }

 private:
  struct Held {
    std::shared_ptr<Slot> slot;
    std::shared_ptr<std::atomic<bool>> thread_gone;  // its thread exited: free for another one
  };
  struct Entry {
    uint64_t owner_id;
    std::weak_ptr<Slot> slot;
    std::shared_ptr<std::atomic<bool>> thread_gone;
  };
  // This thread's slots, one per object it has called Get() on.
  struct ThreadList {
    std::vector<Entry> entries;
    ~ThreadList() {
      for (auto& e : entries) e.thread_gone->store(true, std::memory_order_release);
    }
  };
  static ThreadList& Mine() {
    thread_local ThreadList mine;
    return mine;
  }

  const uint64_t id_;
  mutable std::mutex mu_;
  mutable std::vector<Held> held_;
};

// A slot that only keeps `target` alive: the per-thread owner of zero-copy views
// into a mapping (see above). Cache-line aligned, so that the reference counts of
// two threads' slots (in the control block that make_shared puts before the slot)
// never share a line.
struct alignas(64) ViewOwner {
  explicit ViewOwner(std::shared_ptr<const void> t) : target(std::move(t)) {}
  std::shared_ptr<const void> target;
};

// A PerThread<ViewOwner> bound to its target: Owner() is the owner to give the
// views this thread makes.
class PerThreadViewOwner {
 public:
  explicit PerThreadViewOwner(std::shared_ptr<const void> target) : target_(std::move(target)) {}
  std::shared_ptr<const void> Owner() const {
    auto r = slots_.Get([&]() -> Result<std::shared_ptr<ViewOwner>> { return std::make_shared<ViewOwner>(target_); });
    // make() cannot fail; should it ever, the shared owner is still correct, only slower.
    if (!r.ok()) return target_;
    return std::shared_ptr<const void>(std::move(r).value());
  }
  size_t slots() const { return slots_.slots(); }

 private:
  std::shared_ptr<const void> target_;
  PerThread<ViewOwner> slots_;
};

}  // namespace shardkit::core
