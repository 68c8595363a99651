// Internal: how many cores this process may run on.
#pragma once

namespace shardkit::core {

// The CPUs in this process's affinity mask (sched_getaffinity), else the hardware's
// thread count, at least 1. Under Slurm, taskset or a per-rank pinning a process may
// own 2 of 256 cores: thread defaults come from here, not from the machine's size.
int UsableCores();

}  // namespace shardkit::core
