// Tensor: a handle to shared, dense, contiguous storage.
//
// Copying a Tensor copies the handle, never the data: two handles to the same
// tensor see each other's in-place writes. That is what makes collectives
// safe here: comm/ writes results into the storage the caller holds, and
// there is no strided "view" that a .contiguous() could silently copy
// (vector-quantize-pytorch #101 reduced such a copy for two years).
//
// Views share storage: reshape() and slice_rows() return views; transpose
// copies (matmul takes transpose flags instead of strided operands).
//
// Autograd state lives in a separate AutogradMeta (engine/autograd.h) so the
// graph can refer to a tensor's gradient slot without keeping its data alive.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace vqddp {

struct AutogradMeta;
class Generator;

// Raw memory of one or more tensors. CPU memory is 64-byte aligned so BLAS
// and vectorised loops see aligned rows; device memory comes from the
// device's caching allocator (engine/device.h).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  // Bumped by every in-place write (copy_, fill_, optimizer steps,
  // collectives, bump_version()). Autograd records it for the tensors a
  // backward formula reads and refuses to run on changed values.
  std::atomic<uint64_t> version{0};

  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements, for row-slice views
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;  // null until autograd needs it
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  size_t nbytes() const;  // numel() * dtype_size(dtype())
  DType dtype() const;
  Device device() const;
  std::string desc() const;  // "float32[2, 3] on cpu", for error messages

  // Typed access to the elements. Throws if T does not match dtype() or the
  // tensor is not on the CPU.
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  void* raw_data() const;
  // Address of the first element on whatever device the tensor lives (a
  // device pointer for cuda tensors): for kernels, never for host access.
  void* raw_ptr() const;

  // The single element of a one-element tensor. For a device tensor,
  // item() and to_vector() copy to the host (and wait for the device).
  template <class T = float>
  T item() const;
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd ---------------------------------------------------------
  bool requires_grad() const;
  // Marks a leaf tensor as trainable. Returns *this for chaining.
  Tensor& set_requires_grad(bool on);
  // Accumulated gradient of a leaf (undefined until a backward reached it).
  Tensor grad() const;
  void set_grad(const Tensor& g);
  void zero_grad();  // drops the gradient (next backward starts from zero)
  // Backpropagates from this one-element tensor into every leaf it depends on.
  // Inside an exact step (engine/exact_batch.h) every sum over the batch is
  // taken by units and reduced over the ranks on the way: every rank must
  // call it, and ends with the global batch's gradients.
  void backward() const;
  // Same storage, no history, requires_grad false.
  Tensor detach() const;

  // ---- copies and in-place writes (never recorded by autograd) ----------
  Tensor clone() const;                // new storage on the same device, same values, no history
  Tensor& copy_(const Tensor& src);    // same shape and dtype; src may alias or be on another device
  Tensor& fill_(double value);
  bool shares_storage(const Tensor& other) const;
  // In-place write counter of the storage (see Storage::version). Code that
  // writes into an existing tensor through data<T>() must call
  // bump_version() so a pending backward that saved it fails loudly.
  uint64_t version() const;
  void bump_version();

  // This tensor on `device` (differentiable; *this when already there).
  Tensor to(Device device) const;
  // Moves the storage to `device` IN PLACE: every handle sharing this
  // tensor sees the new device. Drops the gradient. For Module::to only.
  void move_to_(Device device);

  // Views (differentiable, see ops.h for the free-function forms).
  Tensor reshape(const Shape& shape) const;
  Tensor slice_rows(int64_t begin, int64_t end) const;

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  AutogradMeta& autograd_meta() const;  // created on first use

 private:
  void check_defined() const;
  std::shared_ptr<TensorImpl> impl_;
};

// ---- creation -------------------------------------------------------------
// Creation on a device other than the CPU needs a CUDA build and a GPU
// (engine/device.h); host data (from_vector, rand_*) is moved with to().
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);  // same shape, dtype and device
// [0, 1, ..., n-1]; arange(begin, end, step) for the general case.
Tensor arange(int64_t n, DType dtype = DType::i64);
Tensor arange(int64_t begin, int64_t end, int64_t step, DType dtype = DType::i64);
Tensor from_vector(const std::vector<float>& values, const Shape& shape);
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);
Tensor from_vector(const std::vector<double>& values, const Shape& shape);
// Brace lists are float32: from_vector({1, 2, 3}, {3}). Spell int64 data as
// std::vector<int64_t>{...}.
Tensor from_vector(std::initializer_list<float> values, const Shape& shape);
Tensor scalar(float value);  // shape [] (one element)
// Uniform in [low, high) and normal(mean, std), drawn from `gen`, which
// advances by exactly the number of values drawn (see engine/core/random.h).
Tensor rand_uniform(const Shape& shape, Generator& gen, float low = 0.f, float high = 1.f);
Tensor rand_normal(const Shape& shape, Generator& gen, float mean = 0.f, float std = 1.f);

}  // namespace vqddp
