// gpu/ring.h (internal): the ring of device batch slots shared by a GpuLoader and the
// DeviceBatch es it handed out (either may die first).
//
// A slot is `held` from the moment the producer takes it until its DeviceBatch is
// released. At release an event is recorded on the consumer's stream; the producer's
// stream waits for that event (cudaStreamWaitEvent) before writing the slot again.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::detail {

struct DeviceRing {
  struct Slot {
    void* out = nullptr;          // the batch in its final dtype/layout
    uint8_t* staging = nullptr;   // copy path: uint8 NHWC landing area (== out for uint8 NHWC)
    cudaEvent_t ready = nullptr;     // recorded when the data is complete
    cudaEvent_t released = nullptr;  // recorded on the consumer's stream at release
    bool held = false;
    bool handed = false;  // held by the consumer (not in production or queued)
  };

  int device = 0;
  void* consumer_stream = nullptr;
  size_t out_bytes = 0, staging_bytes = 0;
  std::vector<Slot> slots;
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;  // round-robin start

  ~DeviceRing();
  // Allocates `count` slots of out_bytes (+ staging_bytes when staging is separate).
  Status Init(int dev, int count, size_t out_b, size_t staging_b, bool staging_is_out);
  // A free slot (now held), or -1.
  int TryAcquire();
  // Waits until a slot is free or *stop becomes true (then -1).
  int Acquire(const std::atomic<bool>* stop);
  // Records the release event on `stream` and frees the slot.
  void Release(int slot, void* stream);
  // Frees a slot that was never handed out (no event).
  void Abandon(int slot);
  // The consumer got the slot's batch.
  void MarkHanded(int slot);
  // How many slots the consumer holds.
  int Handed();
  void Wake() {
    { std::lock_guard<std::mutex> lk(mu); }
    cv.notify_all();
  }
};

}  // namespace shardkit::detail
