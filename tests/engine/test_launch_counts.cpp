// Launch counting on the simulated device (engine/counted_kernels.h): what a
// GPU would queue for the same calls, and the bytes layout copies write.
#include <doctest/doctest.h>

#include <vector>

#include "engine/device_counters.h"
#include "engine/ops.h"
#include "engine/core/tensor.h"

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

TEST_CASE("launch counts: concat is one multi-tensor copy per 64 inputs each way, with the CPU's values") {
  for (int64_t inputs : {3, 64, 130}) {
    CAPTURE(inputs);
    std::vector<Tensor> host, sim;
    for (int64_t i = 0; i < inputs; ++i) {
      Tensor h = full({2, 1 + i % 3}, static_cast<float>(i), DType::f32);
      h.set_requires_grad(true);
      Tensor s = h.detach().to(Device::sim());
      s.set_requires_grad(true);
      host.push_back(h);
      sim.push_back(s);
    }
    Tensor y_sim, y_host = concat(host, 1);
    const int64_t launches = (inputs + 63) / 64;
    DeviceCounters c = counted([&] { y_sim = concat(sim, 1); });
    CHECK(c.launches == launches);
    CHECK(c.layout_bytes == y_host.numel() * 4);
    CHECK(y_sim.to(Device::cpu()).to_vector<float>() == y_host.to_vector<float>());
    // The backward hands each input its columns, again in one copy per 64.
    Tensor w = reshape(arange(0, y_host.numel(), 1, DType::f32), y_host.shape());
    sum(mul(y_host, w)).backward();
    Tensor w_sim = w.to(Device::sim());
    c = counted([&] { sum(mul(y_sim, w_sim)).backward(); });
    // The same loss on a leaf of y's shape launches everything but concat's
    // backward.
    Tensor leaf = y_sim.detach().clone();
    leaf.set_requires_grad(true);
    DeviceCounters without = counted([&] { sum(mul(leaf, w_sim)).backward(); });
    CHECK(c.launches == without.launches + launches);
    for (int64_t i = 0; i < inputs; ++i)
      CHECK(sim[i].grad().to(Device::cpu()).to_vector<float>() == host[i].grad().to_vector<float>());
  }
}

TEST_CASE("launch counts: slice_rows' backward is one launch (zeros, the slice's gradient, zeros), with the CPU's values") {
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {1, 3}, {3, 5}, {0, 5}}) {
    CAPTURE(begin);
    CAPTURE(end);
    Tensor h = reshape(arange(0, 15, 1, DType::f32), {5, 3});
    h.set_requires_grad(true);
    Tensor s = h.detach().to(Device::sim());
    s.set_requires_grad(true);
    sum(square(slice_rows(h, begin, end))).backward();
    Tensor loss = sum(square(slice_rows(s, begin, end)));
    DeviceCounters c = counted([&] { loss.backward(); });
    // The seed's fill, square's backward, sum's backward, slice_rows' backward.
    CHECK(c.launches == 4);
    CHECK(c.layout_bytes == (end - begin) * 3 * 4);
    CHECK(s.grad().to(Device::cpu()).to_vector<float>() == h.grad().to_vector<float>());
  }
}
