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
  e.flops += counted.flops - p.counted.flops;
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

std::string op_profile_table(const std::vector<OpProfileEntry>& entries, int64_t steps, const ProfileFloor& floor) {
  OpProfileEntry sum;
  for (const OpProfileEntry& e : entries) {
    sum.seconds += e.seconds;
    sum.calls += e.calls;
    sum.launches += e.launches;
    sum.layout_bytes += e.layout_bytes;
    sum.flops += e.flops;
  }
  const double per = 1.0 / std::max<int64_t>(steps, 1);
  const bool floored = floor.gflops > 0;
  std::string out = fmt::format("{:<40} {:>10} {:>7} {:>10} {:>8}{} {:>10} {:>10} {:>10}\n", "op (rank 0)", "ms/step",
                                "share", "GFLOP/step", "GFLOP/s", floored ? fmt::format(" {:>7}", "floor") : "",
                                "calls/step", "launches", "layout kB");
  auto row = [&](const std::string& name, const OpProfileEntry& e) {
    const double gflops = e.seconds > 0 ? e.flops / e.seconds / 1e9 : 0.0;
    out += fmt::format("{:<40} {:>10.3f} {:>6.1f}% {:>10.4f} {:>8.1f}{} {:>10.1f} {:>10.1f} {:>10.1f}\n", name,
                       e.seconds * per * 1e3, sum.seconds > 0 ? 100 * e.seconds / sum.seconds : 0.0,
                       e.flops * per / 1e9, gflops,
                       floored ? fmt::format(" {:>6.1f}%", 100 * gflops / (floor.gflops * floor.share)) : "",
                       e.calls * per, e.launches * per, e.layout_bytes * per / 1e3);
  };
  for (const OpProfileEntry& e : entries) row(e.name, e);
  row("total", sum);
  return out;
}

}  // namespace vqddp
