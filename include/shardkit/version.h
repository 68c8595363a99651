// shardkit/version.h
#pragma once

#include "shardkit/export.h"

#define SHARDKIT_VERSION_MAJOR 0
#define SHARDKIT_VERSION_MINOR 1
#define SHARDKIT_VERSION_PATCH 0

namespace shardkit {
// The library's version string, e.g. "0.1.0".
SHARDKIT_API const char* Version();
}  // namespace shardkit
