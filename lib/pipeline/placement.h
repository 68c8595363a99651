// pipeline/placement.h (internal): adaptive placement of the GPU decode path (decoder
// auto with GpuOptions::hardware_load unset; docs/gpu.md "Placement").
//
// The GPU decode path sends a share of the JPEGs that the hardware JPEG engines accept to
// the engines (the submitter thread's batched call) and decodes the rest on the host
// threads (the producer's phase 1), both at once. Which share keeps the training loop fed
// with the least GPU work depends on the model, the batch size and the phase (training,
// evaluation), so it is measured while the loader runs: after every batch the consumer
// takes, Observe() gets the consumer's wait in Next() and its step (the time since its
// previous Next() returned), and the producer's and the submitter's busy times for their
// last batch.
//  - The consumer waits (its smoothed wait > 2% of its step) and the producer was not
//    held back by the device ring (so the feed, not the consumer's GPU work, is what it
//    waits for): the share moves towards the split where the host side (phase 1) and the
//    engine side (submitter) take equal time, the feed's maximum, by 0.3 x their relative
//    difference per batch (a few batches to converge from any start).
//  - The consumer does not wait: the share goes down, so that the GPU does the least work
//    that still keeps the consumer fed; once the host threads fall behind, the consumer
//    waits and the first rule pushes it back up. The step down is 0.3 x the distance to
//    the last share at which the consumer waited (the floor; 0 at start), at least 0.02:
//    from the default start (0.7) a model the host threads keep fed alone reaches 0 in
//    about 10 batches, and near the floor it creeps (0.02) instead of overshooting into
//    waits again. The floor sinks by 0.01 per batch without a wait, so a consumer that
//    slows down later (a heavier model, evaluation) still brings the share to 0.
//  - The nvJPEG CUDA backend (which runs on the SMs, beside the model) takes the images the
//    engines reject only while the consumer waits with the share at 1.
// Threading: Observe() from one thread (the consumer); share() and cuda_on() from any.
#pragma once

#include <algorithm>
#include <atomic>

namespace shardkit::pipeline {

class PlacementController {
 public:
  static constexpr double kWaiting = 0.02;   // the consumer waits: > 2% of its step
  static constexpr double kGain = 0.3;       // per batch, times the relative imbalance
  static constexpr double kStepDown = 0.02;  // per batch while the consumer does not wait, at least
  static constexpr double kFall = 0.3;       // ... else this times the distance to the floor
  static constexpr double kFloorSink = 0.01; // the floor's fall per batch without a wait

  explicit PlacementController(double start = 0.7) : share_(std::clamp(start, 0.0, 1.0)) {}

  // wait_s: the consumer's wait in this Next(); step_s: since its previous Next()
  // returned; prepare_s: the host threads' time for the last batch's phase 1 divided by
  // their number (its cost without a barrier between batches); acquire_s: the
  // submitter's wait for a ring slot; submit_s: the engine side's time for its last
  // batch (the GPU decode path's decoder stage).
  void Observe(double wait_s, double step_s, double prepare_s, double acquire_s, double submit_s) {
    const double frac = step_s > 0 ? wait_s / step_s : 0;
    wait_ = 0.6 * wait_ + 0.4 * frac;
    double s = share_.load(std::memory_order_relaxed);
    const bool feed_bound = wait_ > kWaiting && acquire_s < 0.25 * std::max(prepare_s, 1e-6);
    if (feed_bound) {
      floor_ = s;
      const double err = (prepare_s - submit_s) / std::max({prepare_s, submit_s, 1e-6});  // > 0: host slower
      s += kGain * err;
      cuda_on_.store(s >= 0.999 && err > 0, std::memory_order_relaxed);
    } else {
      floor_ = std::max(0.0, floor_ - kFloorSink);
      s -= std::max(kStepDown, kFall * (s - floor_));
      cuda_on_.store(false, std::memory_order_relaxed);
    }
    share_.store(std::clamp(s, 0.0, 1.0), std::memory_order_relaxed);
  }

  double share() const { return share_.load(std::memory_order_relaxed); }
  bool cuda_on() const { return cuda_on_.load(std::memory_order_relaxed); }
  double smoothed_wait() const { return wait_; }  // (consumer thread)

 private:
  std::atomic<double> share_;
  std::atomic<bool> cuda_on_{false};
  double wait_ = 0;
  double floor_ = 0;  // the share at the last batch the consumer waited for (consumer thread)
};

}  // namespace shardkit::pipeline
