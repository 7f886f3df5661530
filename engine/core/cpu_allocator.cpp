#include "engine/core/cpu_allocator.h"

#include <cstdlib>
#include <mutex>
#include <new>
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

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  size_t held = 0;
  size_t limit;

  Cache() {
    const char* env = std::getenv("VQDDP_CPU_CACHE_MB");
    std::optional<int64_t> mb = env ? parse_int(env) : std::optional<int64_t>(2048);
    VQDDP_CHECK(mb && *mb >= 0 && *mb < (int64_t{1} << 40), "VQDDP_CPU_CACHE_MB={} is not a size in MiB", env);
    limit = static_cast<size_t>(*mb) << 20;
  }
};

Cache& cache() {
  // Never destroyed: a tensor freed during static destruction must still
  // find it. The blocks stay reachable from here, so leak checkers are quiet.
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

void* cpu_alloc(size_t bytes) {
  // Far beyond any host, and small enough that rounding up cannot wrap.
  VQDDP_CHECK(bytes <= (size_t{1} << 60), "cannot allocate {} bytes on the host: more than any machine has", bytes);
  size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.held -= size;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlign, size);
  // Say how much: a bare std::bad_alloc names neither the size nor the place.
  VQDDP_CHECK(p, "cannot allocate {} bytes ({:.2f} GiB) on the host: out of memory", size, size / 1073741824.0);
  return p;
}

void cpu_free(void* p, size_t bytes) {
  if (!p) return;
  size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (c.held + size <= c.limit) {
      c.free_blocks[size].push_back(p);
      c.held += size;
      return;
    }
  }
  std::free(p);
}

size_t cpu_cache_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return c.held;
}

}  // namespace vqddp
