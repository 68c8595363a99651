// A toy format that lives in a test folder: what a new format needs to register
// (docs/architecture.md, "Adding a format"): its files and one formats::Register() call,
// nothing in tools/ or python/. One JSON file (x.toy) of samples, fields as hex; one
// writer option, toy.case ("keep" or "upper": the keys as given or upper-cased).
#pragma once

#include "formats/registry.h"

namespace sk_test {

shardkit::formats::Format ToyFormat();

}  // namespace sk_test
