// Big allocations checked before they are made: the allocator alone says
// only std::bad_alloc (or the kernel kills the process), naming nothing.
// Internal header: not installed with the library (the trainer's memory check).
#pragma once

#include <cstdint>
#include <string>

namespace vqddp {

// The memory this process may still take: MemAvailable of /proc/meminfo
// (free memory plus what the kernel can reclaim), or -1 where unknown. The
// environment variable VQDDP_MEMORY_AVAILABLE (bytes) stands in for it, so
// tests can exercise the refusal on any machine.
int64_t available_memory_bytes();

// Refuses, with an Error "`what`: needs about N GiB of memory for `purpose`,
// and M GiB are available", when `bytes` is more than is available.
void require_memory(int64_t bytes, const std::string& what, const std::string& purpose);

}  // namespace vqddp
