#include "engine/device_counters.h"

#include <fmt/format.h>

#include <functional>

#include "engine/core/error.h"

namespace vqddp {

namespace {
thread_local DeviceCounters t_counts;
thread_local bool t_staging = false;
thread_local std::vector<LaunchRecord>* t_recording = nullptr;
}  // namespace

namespace {
// Field by field: the counters are plain sums.
template <class Op>
DeviceCounters combine(const DeviceCounters& a, const DeviceCounters& b, Op op) {
  return {op(a.to_host, b.to_host),
          op(a.to_device, b.to_device),
          op(a.waits, b.waits),
          op(a.to_host_bytes, b.to_host_bytes),
          op(a.to_device_bytes, b.to_device_bytes),
          op(a.staged_to_host, b.staged_to_host),
          op(a.staged_to_device, b.staged_to_device),
          op(a.staged_waits, b.staged_waits),
          op(a.launches, b.launches),
          op(a.layout_bytes, b.layout_bytes),
          op(a.flops, b.flops)};
}
}  // namespace

DeviceCounters DeviceCounters::operator-(const DeviceCounters& e) const { return combine(*this, e, std::minus<>()); }
DeviceCounters DeviceCounters::operator+(const DeviceCounters& m) const { return combine(*this, m, std::plus<>()); }

std::string DeviceCounters::str() const {
  return fmt::format("{} to host ({} B), {} to device ({} B), {} waits, {} launches, {} B of layout copies; "
                     "collective staging: {} to host, {} to device, {} waits",
                     to_host, to_host_bytes, to_device, to_device_bytes, waits, launches, layout_bytes,
                     staged_to_host, staged_to_device, staged_waits);
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

// A communicator's staging copies are its cost, counted apart (above).
void count_launch(const char* kernel, std::initializer_list<int64_t> sizes) {
  if (t_staging) return;
  ++t_counts.launches;
  if (!t_recording) return;
  LaunchRecord r;
  r.kernel = kernel;
  size_t i = 0;
  for (int64_t s : sizes)
    if (i < 4) r.sizes[i++] = s;
  t_recording->push_back(r);
}

LaunchRecording::LaunchRecording() {
  VQDDP_CHECK(!t_recording, "a launch recording is already running on this thread");
  t_recording = &launches;
}
LaunchRecording::~LaunchRecording() { t_recording = nullptr; }

void count_layout_bytes(int64_t bytes) {
  if (!t_staging) t_counts.layout_bytes += bytes;
}

// A collective's own sums (staging) are the backend's, as its copies are.
void count_flops(int64_t flops) {
  if (!t_staging) t_counts.flops += flops;
}

void count_wait() { ++(t_staging ? t_counts.staged_waits : t_counts.waits); }

CollectiveStagingScope::CollectiveStagingScope() : outer_(!t_staging) { t_staging = true; }
CollectiveStagingScope::~CollectiveStagingScope() {
  if (outer_) t_staging = false;
}

}  // namespace vqddp
