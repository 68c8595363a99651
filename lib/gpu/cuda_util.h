// gpu/cuda_util.h (internal): CUDA runtime errors as Status values.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "shardkit/status.h"

namespace shardkit::gpu {

// "cudaMemcpyAsync(...): invalid argument (cudaErrorInvalidValue)"
inline Status CudaError(cudaError_t e, const char* what) {
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

#define SK_CUDA_RETURN(expr)                                                  \
  do {                                                                        \
    cudaError_t sk_ce_ = (expr);                                              \
    if (sk_ce_ != cudaSuccess) return ::shardkit::gpu::CudaError(sk_ce_, #expr); \
  } while (0)

// Logs nothing, returns nothing: for destructors.
#define SK_CUDA_IGNORE(expr) (void)(expr)

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
inline cudaEvent_t AsEvent(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace shardkit::gpu
