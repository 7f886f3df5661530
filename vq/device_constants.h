// Constants of a module (FSQ's per-level numbers, LFQ's code table, ...),
// made on the host once and uploaded once per device they are used on,
// not on every call: a GPU step then makes no transfer for them. They are
// not state (no checkpoint entry, Module::to does not move them). A module
// belongs to one rank thread, like its cache.
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

class DeviceConstants {
 public:
  // Registers a host tensor; returns its number for on().
  size_t add(Tensor host) {
    host_.push_back(std::move(host));
    return host_.size() - 1;
  }
  // Constant i on `device` (uploaded the first time, and again only when
  // the module is used on another device).
  const Tensor& on(size_t i, Device device) const {
    if (copies_.empty() || !(device_ == device)) {
      copies_.clear();
      for (const Tensor& t : host_) copies_.push_back(t.to(device));
      device_ = device;
    }
    return copies_[i];
  }

 private:
  std::vector<Tensor> host_;
  mutable std::vector<Tensor> copies_;
  mutable Device device_;
};

}  // namespace vqddp
