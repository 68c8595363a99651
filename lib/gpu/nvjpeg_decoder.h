// gpu/nvjpeg_decoder.h (internal; built only when nvJPEG is found): nvJPEG's decoders
// behind an interface without nvJPEG or CUDA types.
//
// - Hardware: one nvjpegJpegState per "set" (the pipeline double-buffers batches), used
//   with nvjpegDecodeBatchedInitialize + nvjpegDecodeBatchedEx (per-image decode params:
//   RGBI output and, where nvjpegDecodeBatchedSupportedEx accepts it, an ROI).
// - CUDA backends: the decoupled API (nvjpegDecodeJpegHost / TransferToDevice / Device)
//   with the GPU_HYBRID decoder, else the HYBRID one, whichever
//   nvjpegDecoderJpegSupported accepts; one context per host thread (decoder states,
//   pinned and device buffers, a parsed-stream object, decode params, a CUDA stream and
//   an event), all created once.
//
// Threading: Inspect and DecodeCuda may run concurrently for distinct `tid`s; the other
// methods are called by one thread (the pipeline's producer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardkit/status.h"

namespace shardkit::gpu {

struct NvItem {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool roi = false;  // decode only [x, x+w) x [y, y+h); else the whole image
  int x = 0, y = 0, w = 0, h = 0;
  int backend = 0;   // set by Inspect: 1 hardware, 2 GPU_HYBRID, 3 HYBRID
  uint8_t* dst = nullptr;  // device, interleaved RGB
  int64_t pitch = 0;
};

class NvjpegDecoder {
 public:
  static Result<std::unique_ptr<NvjpegDecoder>> Create(int device, int threads, int max_batch, int sets,
                                                       bool use_hardware);
  ~NvjpegDecoder();

  bool hardware() const { return hw_; }
  bool cuda() const { return cuda_; }

  // Decides the backend for an image whose header classified as hardware (`hw_candidate`)
  // or CUDA. Tries the ROI in *item first (when item->roi), then the whole image; clears
  // item->roi when only the whole image is accepted. False: nvJPEG cannot take it (host).
  bool Inspect(int tid, bool hw_candidate, NvItem* item);

  // Hardware engines, batched, on `stream` (a cudaStream_t), with state `set`.
  Status DecodeHardware(int set, const std::vector<NvItem*>& items, void* stream);

  // CUDA backends for one image on thread `tid`'s stream.
  Status DecodeCuda(int tid, const NvItem& item);
  // Makes `stream` wait for every DecodeCuda issued since the last Join.
  Status Join(void* stream);

  // nvJPEG's own buffers, from a cache that never frees while the decoder lives (no
  // device-wide synchronisation in steady state): bytes held, device and pinned.
  size_t cached_device_bytes() const;
  size_t cached_pinned_bytes() const;

 private:
  struct Impl;
  NvjpegDecoder() = default;
  std::unique_ptr<Impl> impl_;
  bool hw_ = false, cuda_ = false;
};

}  // namespace shardkit::gpu
