// The DLPack structs that ArrayView reads (array_args.h), as dlpack.h v1.0 defines them:
// https://github.com/dmlc/dlpack, Copyright (c) 2017 by Contributors, Apache License 2.0
// (http://www.apache.org/licenses/LICENSE-2.0). Only the names this binding uses; layouts unchanged.
#pragma once

#include <cstdint>

namespace sparkgrad::bindings::dlpack {

// DLDeviceType values (a C enum: int-sized)
constexpr std::int32_t kDLCPU = 1;
constexpr std::int32_t kDLCUDA = 2;
constexpr std::int32_t kDLCUDAHost = 3;  // pinned host memory
constexpr std::int32_t kDLCUDAManaged = 13;

// DLDataTypeCode values
constexpr std::uint8_t kDLInt = 0;
constexpr std::uint8_t kDLUInt = 1;
constexpr std::uint8_t kDLFloat = 2;

// DLManagedTensorVersioned::flags bits
constexpr std::uint64_t kFlagReadOnly = 1ULL << 0;
constexpr std::uint64_t kFlagIsCopied = 1ULL << 1;

struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null: C-contiguous
  std::uint64_t byte_offset;
};

// Capsule "dltensor" (DLPack before 1.0).
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};

// Capsule "dltensor_versioned" (DLPack 1.0).
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

}  // namespace sparkgrad::bindings::dlpack
