// formats/array_sample.h (internal): a sample that is one decoded array and, optionally,
// its label, as the array writers store it (HDF5's "images" layout, LMDB's "pickle"
// layout): one "npy" field, at most a "cls" field, nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/pickle.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::formats {

struct ArraySample {
  pickle::NdArray arr;
  std::optional<int64_t> label;  // from "cls", when there is one
};

// Parses `s`; kInvalidArgument naming the sample and `layout` (e.g. "the HDF5 images
// layout") for another field, a missing npy field, a cls that is not a canonical
// integer or an npy that does not parse, each followed by `instead` (how to keep such
// samples: e.g. "--hdf5-arrays fields keeps every field"). The array's dtype and shape
// are the caller's to check.
Result<ArraySample> ParseArraySample(const Sample& s, const Location& at, std::string_view layout,
                                     std::string_view instead);

}  // namespace shardkit::formats
