// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), declared here
// from the specification (v1.0) so that the module needs no extra package. Both the
// legacy DLManagedTensor (capsule "dltensor", what torch 1.x and numpy consume) and
// DLManagedTensorVersioned (capsule "dltensor_versioned", asked for through
// __dlpack__(max_version=(1, ...))) are produced.
#pragma once

#include <cstdint>

namespace shardkit::python::dl {

enum DeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
};

struct Device {
  int32_t device_type;  // DeviceType
  int32_t device_id;
};

enum DataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct PackVersion {
  uint32_t major;
  uint32_t minor;
};

constexpr uint32_t kMajorVersion = 1;
constexpr uint32_t kMinorVersion = 0;
constexpr uint64_t kFlagReadOnly = 1ull << 0;
constexpr uint64_t kFlagIsCopied = 1ull << 1;

struct ManagedTensorVersioned {
  PackVersion version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

}  // namespace shardkit::python::dl
