// Host memory for tensors, with a cache of large blocks.
//
// A training step allocates and frees the same large activations every
// step. Straight from malloc, each 16 MiB tensor is a fresh mmap whose pages
// fault in on first touch, which made elementwise ops over [16384, 256]
// tensors 2-3x slower than memory bandwidth allows. Blocks of 64 KiB or
// more are mapped from the kernel; freed ones are kept (by rounded size)
// and handed out again, to a request of their size or of at least half it. The cache is shared by all threads and holds
// at most VQDDP_CPU_CACHE_MB (default 2048) MiB, and never so much that it
// and the blocks in use exceed 9/8 of the most blocks ever in use at once
// (cpu_allocator.cpp says why). Small blocks go to the system allocator.
// Internal header: not installed with the library (the CPU kernels' allocator).
#pragma once

#include <cstddef>

namespace vqddp {

// 64-byte aligned, never null (a zero-byte request gets a minimal block).
void* cpu_alloc(size_t bytes);
void cpu_free(void* p, size_t bytes);

// Bytes currently held in the cache (for tests and logs).
size_t cpu_cache_bytes();
// The most bytes of blocks of 64 KiB or more ever handed out and not yet
// freed at once: the cache and those blocks together never exceed it and
// an eighth of it.
size_t cpu_peak_live_bytes();
// Returns every cached block to the kernel (for tests: a test of the cache
// starts from an empty one, whatever the tests before it left there).
void cpu_release_cache();

}  // namespace vqddp
