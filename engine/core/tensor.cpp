#include "engine/core/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "engine/autograd.h"
#include "engine/core/cpu_allocator.h"
#include "engine/device_plans.h"
#include "engine/ops.h"
#include "engine/core/random.h"

namespace vqddp {

// ---- storage ----------------------------------------------------------------

Storage::Storage(size_t n, Device dev) : nbytes(n), device(dev) {
  data = dev.is_cpu() ? cpu_alloc(n) : device_kernels(dev).alloc(n);
}

Storage::~Storage() {
  if (device.is_cpu())
    cpu_free(data, nbytes);
  else
    device_kernels(device).release(data, nbytes);
}


// ---- accessors ----------------------------------------------------------------

void Tensor::check_defined() const { VQDDP_CHECK(impl_ != nullptr, "use of an undefined tensor"); }

const Shape& Tensor::shape() const {
  check_defined();
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  VQDDP_CHECK(d >= -n && d < n, "dimension {} out of range for {}", d, desc());
  return shape()[d < 0 ? d + n : d];
}

int64_t Tensor::numel() const { return shape_numel(shape()); }

size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }

DType Tensor::dtype() const {
  check_defined();
  return impl_->dtype;
}

Device Tensor::device() const {
  check_defined();
  return impl_->storage->device;
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{} on {}", dtype_name(dtype()), shape_str(shape()), device().str());
}

void* Tensor::raw_data() const {
  check_defined();
  VQDDP_CHECK(impl_->storage->device.is_cpu(), "host access to a tensor on {} ({}): move it with .to(Device::cpu())",
              impl_->storage->device.str(), desc());
  return raw_ptr();
}

void* Tensor::raw_ptr() const {
  check_defined();
  return static_cast<char*>(impl_->storage->data) + impl_->offset * dtype_size(impl_->dtype);
}

template <class T>
T* Tensor::data() {
  return const_cast<T*>(std::as_const(*this).data<T>());
}

template <class T>
const T* Tensor::data() const {
  check_defined();
  VQDDP_CHECK(impl_->dtype == dtype_of<T>(), "expected a {} tensor, got {}", dtype_name(dtype_of<T>()), desc());
  VQDDP_CHECK(device().is_cpu(), "host access to a tensor on {}", device().str());
  return static_cast<const T*>(raw_data());
}

template <class T>
T Tensor::item() const {
  VQDDP_CHECK(numel() == 1, "item() needs a one-element tensor, got {}", desc());
  if (!device().is_cpu()) return detach().to(Device::cpu()).item<T>();
  return data<T>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (!device().is_cpu()) return detach().to(Device::cpu()).to_vector<T>();
  const T* p = data<T>();
  return std::vector<T>(p, p + numel());
}

template float* Tensor::data<float>();
template int64_t* Tensor::data<int64_t>();
template const float* Tensor::data<float>() const;
template const int64_t* Tensor::data<int64_t>() const;
template float Tensor::item<float>() const;
template int64_t Tensor::item<int64_t>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template double* Tensor::data<double>();
template const double* Tensor::data<double>() const;
template double Tensor::item<double>() const;
template std::vector<double> Tensor::to_vector<double>() const;

// ---- autograd handle ------------------------------------------------------------

AutogradMeta& Tensor::autograd_meta() const {
  check_defined();
  if (!impl_->autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const { return defined() && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool on) {
  VQDDP_CHECK(!on || dtype() == DType::f32, "only float32 tensors can require grad, got {}", desc());
  AutogradMeta& meta = autograd_meta();
  VQDDP_CHECK(!meta.grad_fn, "set_requires_grad on a non-leaf tensor (result of '{}')", meta.grad_fn->name);
  meta.requires_grad = on;
  meta.batch_free = on;  // a trainable leaf is a parameter: the same on every rank
  return *this;
}

Tensor Tensor::grad() const { return impl_ && impl_->autograd ? impl_->autograd->grad : Tensor(); }

void Tensor::set_grad(const Tensor& g) {
  VQDDP_CHECK(!g.defined() || (g.shape() == shape() && g.dtype() == dtype()), "set_grad: gradient {} does not match tensor {}", g.desc(), desc());
  autograd_meta().grad = g;
}

void Tensor::zero_grad() {
  if (impl_ && impl_->autograd) impl_->autograd->grad = Tensor();
}

Tensor Tensor::detach() const {
  check_defined();
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->autograd = nullptr;
  return Tensor(impl);
}

// ---- copies ---------------------------------------------------------------------

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  out.impl_->storage->version.store(0, std::memory_order_relaxed);
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  VQDDP_CHECK(src.shape() == shape() && src.dtype() == dtype(), "copy_: source {} does not match destination {}",
              src.desc(), desc());
  size_t bytes = nbytes();
  if (device().is_cpu() && src.device().is_cpu()) {
    std::memmove(raw_data(), src.raw_data(), bytes);
  } else {
    // One side is a device: its backend copies (host<->device, or on the
    // device). Two different GPUs go through the host.
    VQDDP_CHECK(device().is_cpu() || src.device().is_cpu() || device() == src.device(),
                "copy_ between {} and {}: copy through the CPU", src.device().str(), device().str());
    DeviceKernels& k = device_kernels(device().is_cpu() ? src.device() : device());
    k.copy(raw_ptr(), device().is_cpu(), src.raw_ptr(), src.device().is_cpu(), bytes);
  }
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  device_of("fill_", {this}).fill(raw_ptr(), dtype(), numel(), value);
  bump_version();
  return *this;
}

uint64_t Tensor::version() const {
  check_defined();
  return impl_->storage->version.load(std::memory_order_relaxed);
}

void Tensor::bump_version() {
  check_defined();
  impl_->storage->version.fetch_add(1, std::memory_order_relaxed);
}

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

void Tensor::move_to_(Device d) {
  check_defined();
  if (device() == d) return;
  Tensor moved = empty(shape(), dtype(), d);
  moved.copy_(*this);
  impl_->storage = moved.impl_->storage;
  impl_->offset = 0;
  zero_grad();
}

Tensor Tensor::to(Device d) const { return vqddp::to_device(*this, d); }

Tensor Tensor::reshape(const Shape& s) const { return vqddp::reshape(*this, s); }
Tensor Tensor::slice_rows(int64_t begin, int64_t end) const { return vqddp::slice_rows(*this, begin, end); }

// ---- creation -------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  size_t bytes = 0;
  VQDDP_CHECK(!__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &bytes),
              "shape {} of {} is too large to allocate", shape_str(shape), dtype_name(dtype));
  impl->storage = std::make_shared<Storage>(bytes, device);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor scalar(float value) { return full({}, value); }

Tensor arange(int64_t begin, int64_t end, int64_t step, DType dtype) {
  VQDDP_CHECK(step != 0, "arange: step must not be zero");
  int64_t n = std::max<int64_t>(0, (end - begin + step + (step > 0 ? -1 : 1)) / step);
  Tensor t = empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = begin + i * step;
    if (dtype == DType::f32)
      t.data<float>()[i] = static_cast<float>(v);
    else
      t.data<int64_t>()[i] = v;
  }
  return t;
}

Tensor arange(int64_t n, DType dtype) { return arange(0, n, 1, dtype); }

template <class T>
static Tensor tensor_from(const std::vector<T>& values, const Shape& shape) {
  VQDDP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: {} values for shape {}",
              values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));  // data() may be null
  return t;
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape) { return tensor_from(values, shape); }
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape) { return tensor_from(values, shape); }
Tensor from_vector(const std::vector<double>& values, const Shape& shape) { return tensor_from(values, shape); }
Tensor from_vector(std::initializer_list<float> values, const Shape& shape) {
  return tensor_from(std::vector<float>(values), shape);
}

Tensor rand_uniform(const Shape& shape, Generator& gen, float low, float high) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = low + (high - low) * gen.uniform();
  return t;
}

Tensor rand_normal(const Shape& shape, Generator& gen, float mean, float std) {
  Tensor t = empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = mean + std * gen.normal();
  return t;
}

}  // namespace vqddp
