// Launch counting on the simulated device (engine/counted_kernels.h): what a
// GPU would queue for the same calls, and the bytes layout copies write.
#include <doctest/doctest.h>

#include "engine/device_counters.h"
#include "engine/ops.h"
#include "engine/tensor.h"

using namespace vqddp;

namespace {

DeviceCounters counted(const auto& work) {
  reset_device_counters();
  work();
  return device_counters();
}

}  // namespace

TEST_CASE("launch counts: sim counts one launch per kernel call, views none, and layout copies' bytes") {
  Tensor a = full({4, 6}, 1.5f, DType::f32, Device::sim());
  Tensor b = full({4, 6}, 2.0f, DType::f32, Device::sim());
  DeviceCounters c = counted([&] { Tensor y = add(a, b); });
  CHECK(c.launches == 1);
  CHECK(c.layout_bytes == 0);
  c = counted([&] { Tensor y = reshape(slice_rows(a, 1, 3), {12}); });  // views: nothing queued
  CHECK(c.launches == 0);
  c = counted([&] { Tensor y = transpose(a, 0, 1); });
  CHECK(c.launches == 1);
  CHECK(c.layout_bytes == 4 * 6 * 4);
  c = counted([&] { Tensor y = a.clone(); });  // a device-to-device copy
  CHECK(c.launches == 1);
  CHECK(c.layout_bytes == 4 * 6 * 4);
  c = counted([&] { Tensor y = add(slice_rows(a, 0, 0), slice_rows(b, 0, 0)); });  // no elements: nothing queued
  CHECK(c.launches == 0);
  // Copies to and from the host are transfers, not launches.
  c = counted([&] { Tensor h = to_device(a, Device::cpu()); });
  CHECK(c.launches == 0);
  CHECK(c.to_host == 1);
}

TEST_CASE("launch counts: the CPU counts nothing") {
  Tensor a = full({4, 6}, 1.5f);
  DeviceCounters c = counted([&] { Tensor y = transpose(add(a, a), 0, 1); });
  CHECK(c.launches == 0);
  CHECK(c.layout_bytes == 0);
}
