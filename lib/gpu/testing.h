// gpu/testing.h (internal): small CUDA helpers for tests and benchmarks, without CUDA
// types (streams and events are void*). In a build without CUDA every function returns
// kUnsupported.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardkit/status.h"

namespace shardkit::gpu::testing {

Status CreateStream(int device, void** stream);   // non-blocking stream
Status DestroyStream(void* stream);
Status CreateEvent(void** event, bool timing);
Status DestroyEvent(void* event);
Status RecordEvent(void* event, void* stream);
// *done = the work before the event has completed (cudaEventQuery), without waiting.
Status EventDone(void* event, bool* done);
Status SyncEvent(void* event);
Status ElapsedMs(void* start, void* end, float* ms);
Status SyncStream(void* stream);
// Device memory in use on `device` (total - free from cudaMemGetInfo).
Status DeviceMemoryUsed(int device, size_t* used);
// A kernel that spins ~ns nanoseconds on `stream` (the consumer's "training step").
Status Spin(void* stream, uint64_t ns);

}  // namespace shardkit::gpu::testing
