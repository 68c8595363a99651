// shardkit/feed.h: the loader's front door. One call decides where batches are made
// (host batches from a Loader, device batches from a GpuLoader), with which decoder, and
// what happens when the device cannot be used, so that every front end (Python's
// shardkit.Loader binds only this; C++ programs) gets the same answer from the same rules:
//
//   device < 0 (host batches):   decoder cpu or auto. decoder gpu: kUnsupported (it
//                                decodes on a device).
//   device >= 0, decoder gpu:    device batches decoded by nvJPEG; a build without CUDA
//                                or nvJPEG, or a device the library cannot use:
//                                kUnsupported saying why. Nothing falls back.
//   device >= 0, cpu or auto:    device batches (GpuLoader: auto takes nvJPEG when built
//                                with it). A build without CUDA gives host batches for
//                                the caller to copy (fallback() empty: nothing was tried);
//                                a device the library cannot use (kUnsupported from
//                                GpuLoader::Create) gives host batches and fallback()
//                                says why.
//
// The thread default is the engine's (pipeline DefaultThreads, docs/loader.md
// "Threads"), resolved by whichever loader is made; threads() reports it.
//
// Threading: as Loader and GpuLoader: one thread at a time calls a Feed's methods (and
// those of host() / device()). Lifetime: host() and device() live as long as the Feed;
// batches follow their loader's rules (shardkit/loader.h, shardkit/gpu.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkit/export.h"
#include "shardkit/gpu.h"
#include "shardkit/loader.h"
#include "shardkit/status.h"

namespace shardkit {

struct FeedOptions {
  int device = -1;  // CUDA device ordinal for device batches; < 0: host batches
  GpuOptions gpu;   // decoder, ring, ... (gpu.device is taken from `device`)
};

class SHARDKIT_API Feed {
 public:
  static Result<std::unique_ptr<Feed>> Create(std::string_view address, const LoaderOptions& opts,
                                              const FeedOptions& fopts);
  ~Feed();

  bool on_device() const { return device_ != nullptr; }
  Loader* host() const { return host_.get(); }        // host batches: the Loader, else nullptr
  GpuLoader* device() const { return device_.get(); }  // device batches: the GpuLoader, else nullptr
  // Why device batches were asked for and host batches are made ("" otherwise).
  const std::string& fallback() const { return fallback_; }
  DecoderKind decoder() const;  // kCpu or kGpu
  int threads() const;          // host decoding threads in use

  uint64_t epoch() const;
  uint64_t num_batches() const;
  uint64_t num_samples() const;
  int rank() const;
  int world_size() const;
  const std::vector<std::string>& class_names() const { return class_names_; }
  void set_epoch(uint64_t e);
  LoaderState save_state() const;
  Status restore(const LoaderState& s);
  std::vector<Status> skipped() const;

 private:
  Feed() = default;
  std::unique_ptr<Loader> host_;
  std::unique_ptr<GpuLoader> device_;
  std::string fallback_;
  std::vector<std::string> class_names_;
};

}  // namespace shardkit
