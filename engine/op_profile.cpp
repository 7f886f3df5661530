#include "engine/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "engine/device_counters.h"

namespace vqddp {

namespace {

using Clock = std::chrono::steady_clock;

thread_local bool t_active = false;
thread_local DeviceKernels* t_sync = nullptr;  // the scope's device, unless the CPU

struct ThreadProfile {
  Clock::time_point last = Clock::now();
  DeviceCounters counted;  // the device counters at the last charge
  std::unordered_map<std::string, OpProfileEntry> entries;
};

ThreadProfile& mine() {
  thread_local ThreadProfile p;
  return p;
}

}  // namespace

OpProfileScope::OpProfileScope(Device device) {
  t_active = true;
  t_sync = device.is_cpu() ? nullptr : &device_kernels(device);
  if (t_sync) t_sync->synchronize();
  mine().last = Clock::now();
  mine().counted = device_counters();
}

OpProfileScope::~OpProfileScope() {
  t_active = false;
  t_sync = nullptr;
}

bool op_profile_enabled() { return t_active; }

void op_profile_mark(const std::string& what) {
  if (!op_profile_enabled()) return;
  ThreadProfile& p = mine();
  if (t_sync) t_sync->synchronize();
  const Clock::time_point now = Clock::now();
  OpProfileEntry& e = p.entries[what];
  if (e.name.empty()) e.name = what;
  e.calls += 1;
  e.seconds += std::chrono::duration<double>(now - p.last).count();
  const DeviceCounters counted = device_counters();
  e.launches += counted.launches - p.counted.launches;
  e.layout_bytes += counted.layout_bytes - p.counted.layout_bytes;
  p.last = now;
  p.counted = counted;
}

void op_profile_mark(const char* what) {
  if (op_profile_enabled()) op_profile_mark(std::string(what));
}

std::vector<OpProfileEntry> op_profile_take() {
  ThreadProfile& p = mine();
  std::vector<OpProfileEntry> out;
  for (auto& [name, e] : p.entries) out.push_back(e);
  p.entries.clear();
  p.last = Clock::now();
  p.counted = device_counters();
  std::sort(out.begin(), out.end(), [](const OpProfileEntry& a, const OpProfileEntry& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

std::string op_profile_table(const std::vector<OpProfileEntry>& entries, int64_t steps) {
  double total = 0;
  int64_t calls = 0, launches = 0, bytes = 0;
  for (const OpProfileEntry& e : entries) {
    total += e.seconds;
    calls += e.calls;
    launches += e.launches;
    bytes += e.layout_bytes;
  }
  const double per = 1.0 / std::max<int64_t>(steps, 1);
  std::string out = fmt::format("{:<40} {:>10} {:>7} {:>10} {:>10} {:>10}\n", "op (rank 0)", "ms/step", "share",
                                "calls/step", "launches", "layout kB");
  auto row = [&](const std::string& name, double seconds, int64_t c, int64_t l, int64_t b) {
    out += fmt::format("{:<40} {:>10.3f} {:>6.1f}% {:>10.1f} {:>10.1f} {:>10.1f}\n", name, seconds * per * 1e3,
                       total > 0 ? 100 * seconds / total : 0.0, c * per, l * per, b * per / 1e3);
  };
  for (const OpProfileEntry& e : entries) row(e.name, e.seconds, e.calls, e.launches, e.layout_bytes);
  row("total", total, calls, launches, bytes);
  return out;
}

}  // namespace vqddp
