// The CUDA DeviceKernels: streams, the caching allocator, cuBLAS, and the
// launchers of kernels_*.cu on the calling thread's stream.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/cuda/cuda_check.h"
#include "engine/device_counters.h"
#include "engine/counted_kernels.h"
#include "engine/cuda/launch.h"
#include "engine/cuda/module_entry.h"
#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "engine/core/error.h"

namespace vqddp::cuda {

// ---- device guard, streams, cuBLAS handles ---------------------------------------

DeviceGuard::DeviceGuard(int device) {
  VQDDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) VQDDP_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

namespace {

constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

struct ThreadDeviceState {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
};

// Per thread: one state per device. The destructor runs at thread exit;
// errors there are ignored (the runtime may already be shutting down).
struct ThreadStates;
thread_local ThreadStates* g_states = nullptr;  // null before first use and after thread-exit teardown

struct ThreadStates {
  std::map<int, ThreadDeviceState> by_device;
  ThreadStates() { g_states = this; }
  ~ThreadStates() {
    g_states = nullptr;
    for (auto& [device, st] : by_device) {
      if (cudaSetDevice(device) != cudaSuccess) continue;
      if (st.stream) cudaStreamSynchronize(st.stream);
      if (st.blas) cublasDestroy(st.blas);
      if (st.workspace) cudaFree(st.workspace);
      if (st.stream) cudaStreamDestroy(st.stream);
    }
  }
};

// The calling thread's stream on `device` if it has one, without creating
// anything (safe while the thread's states are being torn down).
cudaStream_t existing_stream(int device) {
  if (!g_states) return nullptr;
  auto it = g_states->by_device.find(device);
  return it == g_states->by_device.end() ? nullptr : it->second.stream;
}

ThreadDeviceState& thread_state(int device) {
  thread_local ThreadStates states;
  ThreadDeviceState& st = states.by_device[device];
  if (!st.stream) {
    DeviceGuard guard(device);
    VQDDP_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
  }
  return st;
}

}  // namespace

cudaStream_t current_stream(int device) { return thread_state(device).stream; }

cublasHandle_t current_blas(int device) {
  ThreadDeviceState& st = thread_state(device);
  if (!st.blas) {
    DeviceGuard guard(device);
    VQDDP_CUBLAS_CHECK(cublasCreate(&st.blas));
    VQDDP_CUBLAS_CHECK(cublasSetStream(st.blas, st.stream));
    VQDDP_CUDA_CHECK(cudaMalloc(&st.workspace, kBlasWorkspaceBytes));
    VQDDP_CUBLAS_CHECK(cublasSetWorkspace(st.blas, st.workspace, kBlasWorkspaceBytes));
    // Full float32 GEMMs by default (the CPU reference's precision);
    // VQDDP_TF32=1 lets cuBLAS use TF32 tensor cores instead.
    const char* tf32 = std::getenv("VQDDP_TF32");
    if (tf32 && std::string(tf32) == "1") VQDDP_CUBLAS_CHECK(cublasSetMathMode(st.blas, CUBLAS_TF32_TENSOR_OP_MATH));
  }
  return st.blas;
}

namespace {

// While this thread's stream captures a step graph (engine/step_graph.h),
// the blocks it frees: a captured kernel keeps using its scratch's address
// on every replay, so none may go back to the pool (nor be synchronised on
// and freed, which a capture forbids) before the graph is destroyed.
thread_local std::vector<void*>* t_held = nullptr;

// ---- caching allocator -------------------------------------------------------------
//
// cudaMalloc/cudaFree synchronise the device, so every step would stall
// without a cache. Freed blocks are kept per (stream, rounded size) and
// handed out again only on the stream that last used them: work on one
// stream is ordered, so a new user of a block always runs after the old
// one. On out-of-memory the cache is returned to the driver and the
// allocation retried once. VQDDP_CUDA_CACHE=0 turns caching off (for
// compute-sanitizer runs).
class CachingAllocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {
    const char* env = std::getenv("VQDDP_CUDA_CACHE");
    caching_ = !(env && std::string(env) == "0");
  }

  void* alloc(size_t bytes) {
    if (bytes == 0) return nullptr;
    size_t size = round(bytes);
    cudaStream_t stream = current_stream(device_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find({stream, size});
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        live_[p] = {stream, size};
        return p;
      }
    }
    DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !t_held) {  // no device-wide sync inside a capture
      cudaGetLastError();  // clear the sticky-free error state of this call
      empty_cache();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      VQDDP_THROW("cuda:{}: cannot allocate {} bytes ({}; {} of {} MiB free)", device_, size, cudaGetErrorString(err),
                  free_b >> 20, total_b >> 20);
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = {stream, size};
    return p;
  }

  void release(void* p) {
    if (!p) return;
    if (t_held) {  // this thread's stream is capturing a step graph
      t_held->push_back(p);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: never happens, but never double-free
    Block b = it->second;
    live_.erase(it);
    // Freed by another thread than the one that allocated it: that thread's
    // stream may still use the block, so wait for it before the block goes
    // back to its own stream's pool.
    cudaStream_t here = existing_stream(device_);
    if (here && here != b.stream) {
      DeviceGuard guard(device_);
      cudaStreamSynchronize(here);
      count_wait();
    }
    if (caching_) {
      free_[{b.stream, b.size}].push_back(p);
    } else {
      DeviceGuard guard(device_);
      cudaStreamSynchronize(b.stream);
      count_wait();
      cudaFree(p);
    }
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceGuard guard(device_);
    cudaDeviceSynchronize();
    count_wait();
    for (auto& [key, ptrs] : free_)
      for (void* p : ptrs) cudaFree(p);
    free_.clear();
  }

 private:
  struct Block {
    cudaStream_t stream;
    size_t size;
  };
  // Powers of two up to 1 MiB (at least 512 bytes), then multiples of 2 MiB.
  static size_t round(size_t bytes) {
    if (bytes <= (size_t{1} << 20)) {
      size_t s = 512;
      while (s < bytes) s *= 2;
      return s;
    }
    size_t unit = size_t{2} << 20;
    return (bytes + unit - 1) / unit * unit;
  }

  int device_;
  bool caching_ = true;
  std::mutex mu_;
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> live_;
};

// Scratch memory for one kernel sequence on the calling thread's stream.
class Scratch {
 public:
  Scratch(CachingAllocator& a, size_t bytes) : a_(a), p_(a.alloc(bytes)) {}
  ~Scratch() { a_.release(p_); }  // stream-ordered: later users run after this sequence
  void* get() const { return p_; }

 private:
  CachingAllocator& a_;
  void* p_;
};

void check_int(int64_t v, const char* what) {
  VQDDP_CHECK(v >= 0 && v <= 0x7fffffff, "cuBLAS/CUB limit: {} = {} does not fit an int", what, v);
}

class CudaKernels final : public DeviceKernels {
 public:
  explicit CudaKernels(int device) : device_(device), alloc_(device) {}

  void* alloc(size_t bytes) override { return alloc_.alloc(bytes); }
  void release(void* p, size_t) override { alloc_.release(p); }

  void copy(void* dst, bool dst_host, const void* src, bool src_host, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    cudaStream_t s = stream();
    cudaMemcpyKind kind = src_host ? (dst_host ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                   : (dst_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    VQDDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    // A copy to the host waits for the queue (the host reads the result).
    // A copy from the host does not add a wait: every host buffer here is
    // pageable (nothing is pinned), and cudaMemcpyAsync from pageable memory
    // returns only once the driver has taken the bytes (staged into pinned
    // memory, synchronising with the stream itself where it must: CUDA's "API
    // synchronization behavior"), so the caller may free or reuse the
    // source at once. A pinned source would be copied later: such a buffer
    // must outlive its copy. Waiting here would make every upload of a batch
    // wait for the whole previous step.
    if (dst_host) {
      VQDDP_CUDA_CHECK(cudaStreamSynchronize(s));
      if (!src_host) count_to_host(static_cast<int64_t>(bytes));
    } else if (src_host) {
      count_to_device(static_cast<int64_t>(bytes));
    }
  }

  void fill(void* p, DType dtype, int64_t n, double value) override {
    DeviceGuard guard(device_);
    cuda::fill(p, dtype, n, value, stream());
  }

  void synchronize() override {
    DeviceGuard guard(device_);
    VQDDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    count_wait();
  }

  // Step graphs (engine/step_graph.h): the calling thread's stream records
  // a step. Relaxed mode: the step's arena may cudaMalloc a block while the
  // capture runs (unsafe for a graph in general, since the allocation is not
  // replayed; here the arena keeps every block for the graph's lifetime).
  // A graph, with the blocks freed while it was captured (t_held).
  struct CapturedGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<void*> held;
  };
  bool captures_streams() const override { return true; }
  void begin_capture() override {
    DeviceGuard guard(device_);
    VQDDP_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
    t_held = new std::vector<void*>();
  }
  void* end_capture() override {
    auto* g = new CapturedGraph;
    if (t_held) {  // (none when begin_capture itself failed)
      g->held = std::move(*t_held);
      delete t_held;
      t_held = nullptr;
    }
    DeviceGuard guard(device_);
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream(), &graph);
    if (err == cudaSuccess) {
      err = cudaGraphInstantiate(&g->exec, graph, 0);
      cudaGraphDestroy(graph);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      destroy_graph(g);
      VQDDP_CUDA_CHECK(err);
    }
    return g;
  }
  void launch_graph(void* graph) override {
    DeviceGuard guard(device_);
    VQDDP_CUDA_CHECK(cudaGraphLaunch(static_cast<CapturedGraph*>(graph)->exec, stream()));
  }
  void destroy_graph(void* graph) override {
    auto* g = static_cast<CapturedGraph*>(graph);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    for (void* p : g->held) alloc_.release(p);  // stream-ordered after the last replay, as any release
    delete g;
  }

  void binary(BinaryOp op, const float* a, const float* b, float* out, const BroadcastPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::binary(op, a, b, out, plan, stream());
  }
  void unary(const UnaryFn& fn, const float* x, float* out, int64_t n) override {
    DeviceGuard guard(device_);
    cuda::unary(fn, x, out, n, stream());
  }
  void unary_backward(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out,
                      int64_t n) override {
    DeviceGuard guard(device_);
    cuda::unary_backward(fn, x, y, g, out, n, stream());
  }
  void cast_f64_to_f32(const double* src, float* dst, int64_t n) override {
    DeviceGuard guard(device_);
    cuda::cast_f64_to_f32(src, dst, n, stream());
  }

  void reduce_sum(const float* x, float* out, const ReducePlan& plan) override {
    DeviceGuard guard(device_);
    cuda::reduce_sum(x, out, plan, stream());
  }
  void arg_best(const float* x, int64_t* out, float* values, int64_t rows, int64_t k, bool max) override {
    DeviceGuard guard(device_);
    cuda::arg_best(x, out, values, rows, k, max, stream());
  }
  int64_t first_nonfinite(const float* x, int64_t n) override {
    DeviceGuard guard(device_);
    Scratch result(alloc_, sizeof(unsigned long long));
    auto* r = static_cast<unsigned long long*>(result.get());
    cuda::first_nonfinite(x, n, r, stream());
    unsigned long long host = 0;
    copy(&host, true, r, false, sizeof host);
    return host == ~0ull ? -1 : static_cast<int64_t>(host);
  }
  void max_abs_finite(const float* x, int64_t n, double* acc) override {
    DeviceGuard guard(device_);
    cuda::max_abs_finite(x, n, acc, stream());
  }
  void min_max_i64(const int64_t* x, int64_t n, int64_t* lo, int64_t* hi) override {
    DeviceGuard guard(device_);
    Scratch result(alloc_, 2 * sizeof(long long));
    auto* r = static_cast<long long*>(result.get());
    cuda::min_max_i64(x, n, r, stream());
    long long host[2] = {0, 0};
    copy(host, true, r, false, sizeof host);
    *lo = host[0];
    *hi = host[1];
  }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    for (auto [v, what] : {std::pair{m, "m"}, {n, "n"}, {k, "k"}, {lda, "lda"}, {ldb, "ldb"}, {ldc, "ldc"}})
      check_int(v, what);
    DeviceGuard guard(device_);
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
    // row-major buffers ARE the column-major transposes, so swap A and B and
    // keep each one's flag.
    VQDDP_CUBLAS_CHECK(cublasSgemm(current_blas(device_), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                   static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
  }

  void gemm_fixed(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, const GemmBatch& batch) override {
    DeviceGuard guard(device_);
    cuda::gemm_fixed(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, batch, stream());
  }

  void strided_copy(const void* src, void* dst, size_t elem_size, const StridedCopyPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::strided_copy(src, dst, elem_size, plan, stream());
  }
  void copy_blocks(const CopyBlock* blocks, int64_t count, size_t elem_size) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::copy_blocks(blocks + t, std::min(kMultiTensors, count - t), elem_size, stream());
  }
  void unit_sums(const UnitSumBlock* blocks, int64_t count) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::unit_sums(blocks + t, std::min(kMultiTensors, count - t), stream());
  }
  void gather_rows(const void* x, const int64_t* index, int64_t m, size_t row_bytes, void* out) override {
    DeviceGuard guard(device_);
    cuda::gather_rows(x, index, m, row_bytes, out, stream());
  }
  void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                      double* sums, const double* grid_max) override {
    with_scatter_scratch(n, d, k, [&](void* scratch, size_t bytes) {
      cuda::index_add_rows(src, index, n, d, k, counts, sums, grid_max, scratch, bytes, stream());
    });
  }
  void im2col(const float* x, float* cols, const ConvPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::im2col(x, cols, plan, stream());
  }
  void col2im(const float* cols, float* x, const ConvPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::col2im(cols, x, plan, stream());
  }
  void conv_fixed(const float* x, const float* w, const float* bias, int64_t cout, float* y,
                  const ConvPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::conv_fixed(x, w, bias, cout, y, plan, stream());
  }
  void conv_fixed_data(const float* g, const float* w, const float* bias, int64_t cout, float* dx,
                       const ConvPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::conv_fixed_data(g, w, bias, cout, dx, plan, stream());
  }
  void conv_fixed_weight(const float* x, const float* g, int64_t cout, float* partials, float* bias_partials,
                         const ConvPlan& plan) override {
    DeviceGuard guard(device_);
    cuda::conv_fixed_weight(x, g, cout, partials, bias_partials, plan, stream());
  }
  void index_copy_rows(const float* src, const int64_t* index, int64_t m, int64_t d, float scale,
                       float* dst) override {
    DeviceGuard guard(device_);
    cuda::index_copy_rows(src, index, m, d, scale, dst, stream());
  }

  void sgd_step(const SgdStep& step, float* p, const float* g, float* buf, int64_t n) override {
    DeviceGuard guard(device_);
    cuda::sgd_step(step, p, g, buf, n, stream());
  }
  // Multi-tensor calls: one launch (two for sum_squares) per kMultiTensors.
  void adamw_step(const AdamWStep& step, const AdamWTensor* tensors, int64_t count) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::adamw_step(step, tensors + t, std::min(kMultiTensors, count - t), stream());
  }
  void sum_squares(const float* const* xs, const int64_t* ns, int64_t count, double* acc) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors) {
      int64_t c = std::min(kMultiTensors, count - t);
      Scratch scratch(alloc_, static_cast<size_t>(cuda::sum_squares_scratch(ns + t, c)) * sizeof(double));
      cuda::sum_squares(xs + t, ns + t, c, static_cast<double*>(scratch.get()), acc, stream());
    }
  }
  void clip_scale(float* const* xs, const int64_t* ns, int64_t count, const double* total_sq,
                  float max_norm) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::clip_scale(xs + t, ns + t, std::min(kMultiTensors, count - t), total_sq, max_norm, stream());
  }
  void clip_norm(const double* total_sq, float* norm) override {
    DeviceGuard guard(device_);
    cuda::clip_norm(total_sq, norm, stream());
  }
  void weight_norm(const WeightNormTensor* tensors, int64_t count) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::weight_norm(tensors + t, std::min(kMultiTensors, count - t), stream());
  }
  void weight_norm_backward(const WeightNormTensor* tensors, int64_t count) override {
    DeviceGuard guard(device_);
    for (int64_t t = 0; t < count; t += kMultiTensors)
      cuda::weight_norm_backward(tensors + t, std::min(kMultiTensors, count - t), stream());
  }
  void mse(const float* a, const float* b, int64_t n, float* out) override {
    DeviceGuard guard(device_);
    Scratch scratch(alloc_, static_cast<size_t>(cuda::sum_squares_scratch(n)) * sizeof(double));
    cuda::mse(a, b, n, static_cast<double*>(scratch.get()), out, stream());
  }
  void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k,
                          float* sums) override {
    with_scatter_scratch(n, d, k, [&](void* scratch, size_t bytes) {
      cuda::index_add_rows_f32(src, index, n, d, k, sums, scratch, bytes, stream());
    });
  }

  // The sizes checked (the sort works on int keys), the device current and
  // the scatter-adds' scratch block, for `run`.
  template <class Run>
  void with_scatter_scratch(int64_t n, int64_t d, int64_t k, Run run) {
    check_int(n, "rows");
    check_int(k, "codes");
    DeviceGuard guard(device_);
    size_t bytes = cuda::index_add_rows_scratch(n, d, k);
    Scratch scratch(alloc_, bytes);
    run(scratch.get(), bytes);
  }

 private:
  cudaStream_t stream() const { return current_stream(device_); }

  int device_;
  CachingAllocator alloc_;
};

}  // namespace

// Backends live for the whole process: tensors freed during static
// destruction still find their allocator.
DeviceKernels* backend_for(int device) {
  static std::mutex mu;
  static std::vector<DeviceKernels*>* backends = new std::vector<DeviceKernels*>();
  std::lock_guard<std::mutex> lock(mu);
  if (backends->empty()) backends->resize(static_cast<size_t>(std::max(0, device_count())), nullptr);
  VQDDP_CHECK(device >= 0 && device < static_cast<int>(backends->size()),
              "device cuda:{} is not available: this machine has {} CUDA device(s)", device, backends->size());
  // Launches counted by the sim's rule (counted_kernels.h).
  if (!(*backends)[device]) (*backends)[device] = new CountedKernels(*new CudaKernels(device), true);
  return (*backends)[device];
}

void check_gemm_fixed_columns(int64_t n, const char* what) {
  constexpr int64_t kMaxColumns = int64_t{65535} * kGemmFixedTile;  // gridDim.y is 16-bit
  VQDDP_CHECK(n <= kMaxColumns, "{}: {} columns exceed the GPU kernel's grid ({} at most)", what, n, kMaxColumns);
}

void check_gemm_fixed_batch(int64_t count, const char* what) {
  constexpr int64_t kMaxBatch = 65535;  // gridDim.z
  VQDDP_CHECK(count <= kMaxBatch, "{}: a batch of {} products exceeds the GPU kernel's grid ({} at most)", what, count,
              kMaxBatch);
}

int device_count() {
  // cudaGetDeviceCount fails without a driver or GPU: that is 0 devices.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

}  // namespace vqddp::cuda

// The module's entries (engine/cuda/module_entry.h).
extern "C" {
__attribute__((visibility("default"))) const vqddp::CudaEngineEntry* vqddp_cuda_engine_entry() {
  static const vqddp::CudaEngineEntry entry{&vqddp::cuda::device_count, &vqddp::cuda::backend_for};
  return &entry;
}
}
