// The process-wide stop request (shardkit/convert.h): one lock-free atomic, so that a
// signal handler may set it.
#include <atomic>

#include "shardkit/convert.h"

namespace shardkit {

namespace {
std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

void RequestStop(int signal_number) noexcept { g_stop.store(signal_number == 0 ? -1 : signal_number); }
int StopRequested() noexcept { return g_stop.load(std::memory_order_relaxed); }
void ClearStopRequest() noexcept { g_stop.store(0); }

}  // namespace shardkit
