#include "shardkit/version.h"

namespace shardkit {
// SHARDKIT_VERSION comes from CMake's project(VERSION) (lib/CMakeLists.txt).
const char* Version() { return SHARDKIT_VERSION; }
}  // namespace shardkit
