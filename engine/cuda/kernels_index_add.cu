// Deterministic scatter-add of rows by index (per-code counts and sums of
// the EMA step, index_select's backward).
//
// Floating-point atomics would add rows in whatever order the threads
// arrive, so the sums would change from run to run. Instead:
//   1. a STABLE radix sort of the row positions by index (rows outside
//      [0, k) get the key k and sort last, where nothing reads them);
//   2. each code's segment [start[c], start[c+1]) by binary search;
//   3. segments cut into chunks of kChunkRows rows, a chunk summed in
//      ascending row order in double (balanced even when one code gets
//      every row);
//   4. per code, its chunks' partial sums added in chunk order.
// Every step has a fixed order for fixed inputs: bitwise reproducible.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "engine/cuda/cuda_check.h"
#include "engine/kernel_math.h"
#include "engine/cuda/grid.cuh"
#include "engine/cuda/launch.h"

namespace vqddp::cuda {

namespace {

constexpr int64_t kChunkRows = 256;
constexpr int kColThreads = 128;

struct Layout {
  int* keys_in;
  int* keys_out;
  int* pos_in;
  int* pos_out;
  int* seg_start;   // k + 1
  int* chunks;      // k + 1: chunks per code (last 0)
  int* chunk_off;   // k + 1: exclusive scan of chunks
  double* partial;  // max_chunks * d
  void* cub_temp;
  size_t cub_bytes;
  size_t total;
};

size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

// At most min(n, k) codes are non-empty, each adding at most one partial chunk.
int64_t max_chunks(int64_t n, int64_t k) { return n / kChunkRows + (n < k ? n : k) + 1; }

size_t cub_bytes_for(int64_t n, int64_t k) {
  size_t sort_bytes = 0, scan_bytes = 0;
  VQDDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<int*>(nullptr),
                                                    static_cast<int*>(nullptr), static_cast<int*>(nullptr),
                                                    static_cast<int*>(nullptr), static_cast<int>(n)));
  VQDDP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<int*>(nullptr),
                                                  static_cast<int*>(nullptr), static_cast<int>(k + 1)));
  return sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
}

// Carves the scratch block; with base == nullptr it only measures.
Layout carve(char* base, int64_t n, int64_t d, int64_t k) {
  Layout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? base + at : nullptr;
    at += align_up(bytes);
    return p;
  };
  l.keys_in = reinterpret_cast<int*>(take(n * sizeof(int)));
  l.keys_out = reinterpret_cast<int*>(take(n * sizeof(int)));
  l.pos_in = reinterpret_cast<int*>(take(n * sizeof(int)));
  l.pos_out = reinterpret_cast<int*>(take(n * sizeof(int)));
  l.seg_start = reinterpret_cast<int*>(take((k + 1) * sizeof(int)));
  l.chunks = reinterpret_cast<int*>(take((k + 1) * sizeof(int)));
  l.chunk_off = reinterpret_cast<int*>(take((k + 1) * sizeof(int)));
  l.partial = reinterpret_cast<double*>(take(max_chunks(n, k) * d * sizeof(double)));
  l.cub_bytes = cub_bytes_for(n, k);
  l.cub_temp = take(l.cub_bytes);
  l.total = at;
  return l;
}

__global__ void keys_kernel(const int64_t* index, int64_t n, int64_t k, int* keys, int* pos) {
  VQDDP_GRID_LOOP(i, n) {
    int64_t c = index[i];
    keys[i] = static_cast<int>(c >= 0 && c < k ? c : k);
    pos[i] = static_cast<int>(i);
  }
}

// seg_start[c] = first sorted position with key >= c, for c in [0, k];
// chunks[c] = ceil(segment length / kChunkRows).
__global__ void segments_kernel(const int* keys, int64_t n, int64_t k, int* seg_start) {
  VQDDP_GRID_LOOP(c, k + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      int64_t mid = (lo + hi) / 2;
      if (keys[mid] < c) lo = mid + 1; else hi = mid;
    }
    seg_start[c] = static_cast<int>(lo);
  }
}

__global__ void chunk_count_kernel(const int* seg_start, int64_t k, int* chunks) {
  VQDDP_GRID_LOOP(c, k + 1) {
    int len = c < k ? seg_start[c + 1] - seg_start[c] : 0;
    chunks[c] = static_cast<int>((len + kChunkRows - 1) / kChunkRows);
  }
}

// Block (chunk, column tile): partial sum of one chunk's rows, in order;
// with grid_max each value is rounded to the exact-sum grid first
// (kernel_math.h), and then the chunks give the CPU's bits.
__global__ void chunk_sum_kernel(const float* src, const int* pos, const int* seg_start, const int* chunk_off,
                                 int64_t k, int64_t d, const double* grid_max, double* partial) {
  int64_t chunk = blockIdx.x;
  if (chunk >= chunk_off[k]) return;
  // The code owning this chunk: the last c with chunk_off[c] <= chunk.
  int64_t lo = 0, hi = k;  // answer in [0, k)
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (chunk_off[mid] <= chunk) lo = mid; else hi = mid - 1;
  }
  int64_t c = lo;
  int64_t begin = seg_start[c] + (chunk - chunk_off[c]) * kChunkRows;
  int64_t end = begin + kChunkRows < seg_start[c + 1] ? begin + kChunkRows : seg_start[c + 1];
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    double acc = 0.0;
    if (grid_max) {
      const double q = grid_quantum(*grid_max);
      for (int64_t s = begin; s < end; ++s) acc += to_grid(src[static_cast<int64_t>(pos[s]) * d + j], q);
    } else {
      for (int64_t s = begin; s < end; ++s) acc += src[static_cast<int64_t>(pos[s]) * d + j];
    }
    partial[chunk * d + j] = acc;
  }
}

__global__ void combine_kernel(const double* partial, const int* seg_start, const int* chunk_off, int64_t k, int64_t d,
                               double* counts, double* sums) {
  int64_t c = blockIdx.x;
  if (counts && blockIdx.y == 0 && threadIdx.x == 0) counts[c] = static_cast<double>(seg_start[c + 1] - seg_start[c]);
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    double acc = 0.0;
    for (int64_t i = chunk_off[c]; i < chunk_off[c + 1]; ++i) acc += partial[i * d + j];
    sums[c * d + j] = acc;
  }
}

// index_select's backward: each code's rows added one by one in float, in
// ascending row order (the stable sort keeps it), from +0: the CPU's loop.
// One thread per (code, column); a code with many rows takes its time.
__global__ void segment_sum_f32_kernel(const float* src, const int* pos, const int* seg_start, int64_t k, int64_t d,
                                       float* sums) {
  int64_t c = blockIdx.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float acc = 0.f;
    for (int64_t s = seg_start[c]; s < seg_start[c + 1]; ++s) acc += src[static_cast<int64_t>(pos[s]) * d + j];
    sums[c * d + j] = acc;
  }
}

// The stable sort of the row positions by index and each code's segment,
// steps 1 and 2 of both scatter-adds.
void sort_segments(const int64_t* index, int64_t n, int64_t k, const Layout& l, cudaStream_t s) {
  keys_kernel<<<grid_for(n), kThreads, 0, s>>>(index, n, k, l.keys_in, l.pos_in);
  VQDDP_CUDA_CHECK_LAUNCH();
  // Keys are in [0, k]: sort only the bits that can be set.
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= k) ++end_bit;
  size_t cub_bytes = l.cub_bytes;
  VQDDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(l.cub_temp, cub_bytes, l.keys_in, l.keys_out, l.pos_in, l.pos_out,
                                                    static_cast<int>(n), 0, end_bit, s));
  segments_kernel<<<grid_for(k + 1), kThreads, 0, s>>>(l.keys_out, n, k, l.seg_start);
  VQDDP_CUDA_CHECK_LAUNCH();
}

unsigned column_tiles(int64_t d) {
  int64_t tiles = d > 0 ? (d + kColThreads - 1) / kColThreads : 1;
  return static_cast<unsigned>(tiles < 65535 ? tiles : 65535);  // grid y's limit; the kernels loop
}

}  // namespace

size_t index_add_rows_scratch(int64_t n, int64_t d, int64_t k) { return carve(nullptr, n, d, k).total; }

void index_add_rows(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, double* counts,
                    double* sums, const double* grid_max, void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (k <= 0) return;
  if (n <= 0) {
    if (counts) VQDDP_CUDA_CHECK(cudaMemsetAsync(counts, 0, k * sizeof(double), s));
    if (d > 0) VQDDP_CUDA_CHECK(cudaMemsetAsync(sums, 0, k * d * sizeof(double), s));
    return;
  }
  Layout l = carve(static_cast<char*>(scratch), n, d, k);
  if (scratch_bytes < l.total) cuda_fail(__FILE__, __LINE__, "index_add_rows", 0, "scratch block too small");
  sort_segments(index, n, k, l, s);
  chunk_count_kernel<<<grid_for(k + 1), kThreads, 0, s>>>(l.seg_start, k, l.chunks);
  VQDDP_CUDA_CHECK_LAUNCH();
  size_t cub_bytes = l.cub_bytes;
  VQDDP_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(l.cub_temp, cub_bytes, l.chunks, l.chunk_off, static_cast<int>(k + 1), s));
  unsigned col_tiles = column_tiles(d);
  if (d > 0) {
    dim3 grid(static_cast<unsigned>(max_chunks(n, k)), col_tiles);
    chunk_sum_kernel<<<grid, kColThreads, 0, s>>>(src, l.pos_out, l.seg_start, l.chunk_off, k, d, grid_max, l.partial);
    VQDDP_CUDA_CHECK_LAUNCH();
  }
  combine_kernel<<<dim3(static_cast<unsigned>(k), col_tiles), kColThreads, 0, s>>>(l.partial, l.seg_start, l.chunk_off,
                                                                                   k, d, counts, sums);
  VQDDP_CUDA_CHECK_LAUNCH();
}

void index_add_rows_f32(const float* src, const int64_t* index, int64_t n, int64_t d, int64_t k, float* sums,
                        void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (k <= 0 || d <= 0) return;
  if (n <= 0) {
    VQDDP_CUDA_CHECK(cudaMemsetAsync(sums, 0, k * d * sizeof(float), s));  // all-zero bits are +0.0f
    return;
  }
  Layout l = carve(static_cast<char*>(scratch), n, d, k);
  if (scratch_bytes < l.total) cuda_fail(__FILE__, __LINE__, "index_add_rows_f32", 0, "scratch block too small");
  sort_segments(index, n, k, l, s);
  segment_sum_f32_kernel<<<dim3(static_cast<unsigned>(k), column_tiles(d)), kColThreads, 0, s>>>(
      src, l.pos_out, l.seg_start, k, d, sums);
  VQDDP_CUDA_CHECK_LAUNCH();
}

}  // namespace vqddp::cuda
