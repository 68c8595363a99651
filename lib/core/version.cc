#include "shardkit/version.h"

namespace shardkit {
const char* Version() { return "0.1.0"; }
}  // namespace shardkit
