#include "engine/device_counters.h"

#include <fmt/format.h>

namespace vqddp {

namespace {
thread_local DeviceCounters t_counts;
thread_local bool t_staging = false;
}  // namespace

DeviceCounters DeviceCounters::operator-(const DeviceCounters& e) const {
  return {to_host - e.to_host,
          to_device - e.to_device,
          waits - e.waits,
          to_host_bytes - e.to_host_bytes,
          to_device_bytes - e.to_device_bytes,
          staged_to_host - e.staged_to_host,
          staged_to_device - e.staged_to_device,
          staged_waits - e.staged_waits};
}

DeviceCounters DeviceCounters::operator+(const DeviceCounters& m) const {
  return {to_host + m.to_host,
          to_device + m.to_device,
          waits + m.waits,
          to_host_bytes + m.to_host_bytes,
          to_device_bytes + m.to_device_bytes,
          staged_to_host + m.staged_to_host,
          staged_to_device + m.staged_to_device,
          staged_waits + m.staged_waits};
}

std::string DeviceCounters::str() const {
  return fmt::format("{} to host ({} B), {} to device ({} B), {} waits; collective staging: {} to host, {} to device, "
                     "{} waits",
                     to_host, to_host_bytes, to_device, to_device_bytes, waits, staged_to_host, staged_to_device,
                     staged_waits);
}

DeviceCounters device_counters() { return t_counts; }
void reset_device_counters() { t_counts = {}; }

void count_to_host(int64_t bytes) {
  if (t_staging) {
    ++t_counts.staged_to_host;
    ++t_counts.staged_waits;
    return;
  }
  ++t_counts.to_host;
  t_counts.to_host_bytes += bytes;
  ++t_counts.waits;
}

void count_to_device(int64_t bytes) {
  if (t_staging) {
    ++t_counts.staged_to_device;
    return;
  }
  ++t_counts.to_device;
  t_counts.to_device_bytes += bytes;
}

void count_wait() { ++(t_staging ? t_counts.staged_waits : t_counts.waits); }

CollectiveStagingScope::CollectiveStagingScope() : outer_(!t_staging) { t_staging = true; }
CollectiveStagingScope::~CollectiveStagingScope() {
  if (outer_) t_staging = false;
}

}  // namespace vqddp
