#include "engine/core/cpu_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/parse_number.h"

namespace vqddp {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kCachedFrom = 64 * 1024;

size_t rounded(size_t bytes) {
  size_t r = (bytes + kAlign - 1) / kAlign * kAlign;
  if (r >= kCachedFrom) r = (r + kCachedFrom - 1) / kCachedFrom * kCachedFrom;  // fewer distinct sizes
  return r == 0 ? kAlign : r;
}

// Blocks of kCachedFrom or more are the kernel's pages (mmap), not malloc's:
// glibc raises its mmap threshold to the size of each mmapped block freed
// (up to 32 MiB), after which blocks of that size come from its heaps,
// which keep what is freed there. Measured with VQDDP_CPU_CACHE_MB=0 (every
// large block freed to malloc): the main job validating 200 held-out clips
// on 4 thread ranks peaked at 507 MB against 344 MB for 20 clips.
// Under AddressSanitizer they stay its allocator's (which has no such
// threshold), so a write past a large tensor is still caught.
#if defined(__SANITIZE_ADDRESS__)
void* map_block(size_t size) { return std::aligned_alloc(kAlign, size); }
void unmap_block(void* p, size_t) { std::free(p); }
size_t largest_block_for(size_t size) { return size; }  // exact sizes: a write past a tensor is still caught
#else
// A request may take a cached block of up to twice its size (see Cache).
size_t largest_block_for(size_t size) { return 2 * size; }
void* map_block(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;  // page-aligned, so kAlign-aligned
}

void unmap_block(void* p, size_t size) { ::munmap(p, size); }
#endif

// The cache keeps freed blocks by exact size, so with several threads
// allocating in their own phases (4 thread ranks each validating its
// chunks) it used to hold, for every size, the most blocks of that size
// ever free at once: the sum of per-size peaks, reached at no single
// moment, and approached further the more chunks the ranks ran (the CPU
// cache held 185 MiB at the peak with 20 held-out clips, 239 MiB with 200).
// Now the cached and live bytes together never exceed the most bytes ever
// live at once (`peak`) and an eighth of it (below): a block freed is
// always kept (live + held does not change), and an allocation that
// misses the cache first returns cached blocks until live + held fits
// that bound again. So the cache never makes the process hold more than
// 9/8 of its tensors' own peak, whatever the number of steps, chunks or
// sizes.
// Exact sizes alone made work of many nearly equal sizes miss: `vqddp
// eval` scores a minute of audio through STFTs at three resolutions whose
// frames x bins differ by under 1%, each on its own thread beside the
// others, so a size missed, evicted the largest blocks (others' sizes) to
// stay within the peak, and faulted a fresh block in: 240,000-265,000
// page faults for a minute of audio and four classic codecs, a fifth of
// its CPU time in the kernel. So a request takes the smallest cached block
// of its size up to twice it (largest_block_for): 96,000-126,000, and 2.2-2.3 s
// instead of 2.5-2.8; the main job validating 200 held-out clips
// (bench/validation_memory) took 15.7 s instead of 20.2, at 125 MiB
// instead of 120. The block's own size is what live and peak count and
// what cpu_free gives back (`larger`), so the bound above holds in the
// bytes really held.
// The bound is the peak plus an eighth (kHeadroom): at the peak exactly,
// a step that allocates the same sizes every time did not settle where its
// sizes' own demand, each size at its busiest, summed past the peak (or a
// request took a larger block another request of the step then missed).
// The large config (speech_codec_large.json) then unmapped and mapped again
// about 12 blocks, some 120 MB, every step: 30,000 page faults a step, a
// fifth of its CPU time in the kernel. With an eighth more room, none after
// the first steps: its step took 196-216 ms instead of 254-282 (3 pairs,
// alternating; 2 cores, AMD EPYC), at 537 MB peak resident instead of 479.
constexpr size_t kHeadroom = 8;  // the cache and live blocks stay within peak + peak / kHeadroom

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // by size: the largest go back first
  std::unordered_map<void*, size_t> larger;          // blocks handed out for a smaller request: their size
  size_t held = 0;   // bytes in free_blocks
  size_t live = 0;   // bytes of blocks of kCachedFrom or more handed out and not freed
  size_t peak = 0;   // the most `live` has been
  size_t limit;      // VQDDP_CPU_CACHE_MB: held never exceeds it either

  Cache() {
    const char* env = std::getenv("VQDDP_CPU_CACHE_MB");
    std::optional<int64_t> mb = env ? parse_int(env) : std::optional<int64_t>(2048);
    VQDDP_CHECK(mb && *mb >= 0 && *mb < (int64_t{1} << 40), "VQDDP_CPU_CACHE_MB={} is not a size in MiB", env);
    limit = static_cast<size_t>(*mb) << 20;
  }

  // Returns cached blocks, the largest first, until held <= room. Under mu.
  void shrink_to(size_t room) {
    while (held > room) {
      auto last = std::prev(free_blocks.end());
      unmap_block(last->second.back(), last->first);
      held -= last->first;
      last->second.pop_back();
      if (last->second.empty()) free_blocks.erase(last);
    }
  }
};

Cache& cache() {
  // Never destroyed: a tensor freed during static destruction must still
  // find it. The blocks stay reachable from here, so leak checkers are quiet.
  static Cache* c = new Cache;
  return *c;
}

[[noreturn]] void out_of_memory(size_t size) {
  // Say how much: a bare std::bad_alloc names neither the size nor the place.
  VQDDP_THROW("cannot allocate {} bytes ({:.2f} GiB) on the host: out of memory", size, size / 1073741824.0);
}

}  // namespace

void* cpu_alloc(size_t bytes) {
  // Far beyond any host, and small enough that rounding up cannot wrap.
  VQDDP_CHECK(bytes <= (size_t{1} << 60), "cannot allocate {} bytes on the host: more than any machine has", bytes);
  size_t size = rounded(bytes);
  if (size < kCachedFrom) {
    void* p = std::aligned_alloc(kAlign, size);
    if (!p) out_of_memory(size);
    return p;
  }
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    auto it = c.free_blocks.lower_bound(size);  // the exact size if cached, else the next larger
    if (it != c.free_blocks.end() && it->first <= largest_block_for(size)) {
      const size_t block = it->first;
      void* p = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) c.free_blocks.erase(it);
      if (block != size) c.larger.emplace(p, block);
      c.held -= block;
      c.live += block;
      c.peak = std::max(c.peak, c.live);
      return p;
    }
    c.live += size;
    c.peak = std::max(c.peak, c.live);
    c.shrink_to(c.peak + c.peak / kHeadroom - c.live);
  }
  void* p = map_block(size);
  if (!p) {
    std::lock_guard lock(c.mu);
    c.live -= size;
    out_of_memory(size);
  }
  return p;
}

void cpu_free(void* p, size_t bytes) {
  if (!p) return;
  size_t size = rounded(bytes);
  if (size < kCachedFrom) {
    std::free(p);
    return;
  }
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  if (auto it = c.larger.find(p); it != c.larger.end()) {
    size = it->second;
    c.larger.erase(it);
  }
  c.live -= size;
  if (c.held + size <= c.limit) {
    c.free_blocks[size].push_back(p);
    c.held += size;
    return;
  }
  unmap_block(p, size);
}

size_t cpu_cache_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return c.held;
}

void cpu_release_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.shrink_to(0);
}

size_t cpu_peak_live_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return c.peak;
}

}  // namespace vqddp
