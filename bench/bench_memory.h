// Shared by the benchmarks in bench/: wall time and the process's resident memory.
#pragma once

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

namespace sk_bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Resident memory of this process in MB (1024 * 1024 bytes): now (VmRSS) and the peak
// so far (VmHWM), from /proc/self/status.
struct Rss {
  double now_mb = 0, peak_mb = 0;
};
inline Rss ProcessRss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  Rss r;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) r.now_mb = std::strtod(line.c_str() + 6, nullptr) / 1024;
    if (line.rfind("VmHWM:", 0) == 0) r.peak_mb = std::strtod(line.c_str() + 6, nullptr) / 1024;
  }
  return r;
}

}  // namespace sk_bench
