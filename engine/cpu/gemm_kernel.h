// The fixed-order GEMM and the fused distance + argmin, written once for
// every instruction set. Included by exactly one .cpp per set, which says
// which in VQDDP_GEMM_ISA (512, 256 or 0); everything here is in an
// anonymous namespace on purpose, so the AVX-512 instantiations can never be
// merged by the linker into the AVX2 or scalar ones (same names, other code).
//
// Layout (BLIS-style, simplified): B is packed into panels of NR columns
// (k-major), A into panels of MR rows (k-major), and an MR x NR register
// tile accumulates over a block of KC values of k. The next block continues
// from the tile as stored in C: storing a float and loading it back changes
// no bit, so every element is one fma chain over k ascending whatever KC,
// MC or NC are, and whatever tile or thread computed it.
// Not `#pragma once`: a second inclusion in one translation unit (a unity
// build merging two sets' files) must fail to compile, not silently give
// the second set the first one's kernels.
#ifdef VQDDP_GEMM_KERNEL_INCLUDED
#error "gemm_kernel.h twice in one translation unit: each instruction set needs its own (unity builds: see engine/meson.build)"
#endif
#define VQDDP_GEMM_KERNEL_INCLUDED

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "engine/cpu/gemm_isa.h"
#include "engine/kernel_math.h"

// The instruction set is switched on here, after every header, and not by
// -m flags on the including file: with -m flags every inline library
// function that file instantiates (std::vector's destructor, ...) would be
// compiled for the set too, and the linker keeps ONE copy of each for the
// whole program, possibly the AVX-512 one, which then faults on a CPU
// without AVX-512. Functions defined after the pragma (ours, below) get the
// set; those defined in the headers above keep the baseline.
#if !defined(VQDDP_GEMM_ISA)
#error "define VQDDP_GEMM_ISA (512, 256 or 0) before including gemm_kernel.h"
#elif VQDDP_GEMM_ISA == 512
#pragma GCC target("avx512f,fma")
#elif VQDDP_GEMM_ISA == 256
#pragma GCC target("avx2,fma")
#elif VQDDP_GEMM_ISA != 0
#error "VQDDP_GEMM_ISA must be 512, 256 or 0"
#endif

namespace vqddp::cpu {
namespace {

#if VQDDP_GEMM_ISA == 512
// GCC 12's own AVX-512 conversions (cvtps_pd, cvtpd_ps, extractf64x4) pass
// an undefined vector as the merge source of a full mask, which
// -Wmaybe-uninitialized reports at every caller: a false alarm in the
// header, not in our code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct Isa {
  using V = __m512;
  static constexpr int W = 16, MR = 8;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Doubles: H vectors of them per V; DR rows of conv1d_data's float and
  // double sums (2 + 2 H vectors a row) fit the 32 registers.
  using D = __m512d;
  static constexpr int H = 2, DR = 4;
  static D dzero() { return _mm512_setzero_pd(); }
  static D dadd(D a, D b) { return _mm512_add_pd(a, b); }
  static D dload(const double* p) { return _mm512_loadu_pd(p); }
  static void dstore(double* p, D d) { _mm512_storeu_pd(p, d); }
  static void widen(V v, D* d) {
    d[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    d[1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static V narrow(const D* d) {
    const __m512d lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(d[0])));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm512_cvtpd_ps(d[1])), 1));
  }
};
#elif VQDDP_GEMM_ISA == 256
struct Isa {
  using V = __m256;
  static constexpr int W = 8, MR = 6;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  using D = __m256d;  // 2 + 2 H vectors a row of conv1d_data: 2 rows in 16 registers
  static constexpr int H = 2, DR = 2;
  static D dzero() { return _mm256_setzero_pd(); }
  static D dadd(D a, D b) { return _mm256_add_pd(a, b); }
  static D dload(const double* p) { return _mm256_loadu_pd(p); }
  static void dstore(double* p, D d) { _mm256_storeu_pd(p, d); }
  static void widen(V v, D* d) {
    d[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    d[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  }
  static V narrow(const D* d) { return _mm256_set_m128(_mm256_cvtpd_ps(d[1]), _mm256_cvtpd_ps(d[0])); }
};
#else
struct Isa {
  using V = float;
  static constexpr int W = 1, MR = 4;
  static V zero() { return 0.f; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V bcast(const float* p) { return *p; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  using D = double;
  static constexpr int H = 1, DR = 4;
  static D dzero() { return 0.0; }
  static D dadd(D a, D b) { return a + b; }
  static D dload(const double* p) { return *p; }
  static void dstore(double* p, D d) { *p = d; }
  static void widen(V v, D* d) { d[0] = v; }
  static V narrow(const D* d) { return static_cast<float>(d[0]); }
};
#endif

constexpr int MR = Isa::MR, W = Isa::W, NR = 2 * W;
// KC: a B micro-panel (KC x NR floats) stays in L1 while the A panels of an
// MC block stream from L2; NC x KC of packed B stays in L2/L3.
constexpr int64_t KC = 256, MC = 96, NC = 1536;
static_assert(MC % MR == 0 && NC % NR == 0, "blocks hold whole tiles");

// C tile (MR x NR, row stride ldc) = (first ? 0 : C tile) + A * B panel over
// kc, one fma per (row, column, p) in ascending p. A(r, p) = ap[r * ars + p * aks]:
// a packed panel (1, MR) or A in place (lda, 1) or (1, lda) when transposed.
inline void micro_tile(int64_t kc, const float* ap, int64_t ars, int64_t aks, const float* bp, float* c, int64_t ldc,
                       bool first) {
  typename Isa::V acc[MR][2];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = first ? Isa::zero() : Isa::load(c + r * ldc);
    acc[r][1] = first ? Isa::zero() : Isa::load(c + r * ldc + W);
  }
  for (int64_t p = 0; p < kc; ++p) {
    typename Isa::V b0 = Isa::load(bp + p * NR), b1 = Isa::load(bp + p * NR + W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      typename Isa::V a = Isa::bcast(ap + r * ars + p * aks);
      acc[r][0] = Isa::fma(a, b0, acc[r][0]);
      acc[r][1] = Isa::fma(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    Isa::store(c + r * ldc, acc[r][0]);
    Isa::store(c + r * ldc + W, acc[r][1]);
  }
}

// A rows [i0, i0 + mc) x k [p0, p0 + kc) -> panels of MR rows:
// out[(panel * kc + p) * MR + r]; rows past mc are zero.
void pack_a(bool ta, const float* a, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  for (int64_t ip = 0; ip < mc; ip += MR) {
    float* dst = out + ip * kc;
    int64_t rows = std::min<int64_t>(MR, mc - ip);
    for (int64_t p = 0; p < kc; ++p)
      for (int r = 0; r < MR; ++r) {
        int64_t i = i0 + ip + r, q = p0 + p;
        dst[p * MR + r] = r < rows ? (ta ? a[q * lda + i] : a[i * lda + q]) : 0.f;
      }
  }
}

// B k [p0, p0 + kc) x columns [j0, j0 + nc) -> panels of NR columns:
// out[(panel * kc + p) * NR + l]; columns past nc are zero.
void pack_b(bool tb, const float* b, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
  for (int64_t jp = 0; jp < nc; jp += NR) {
    float* dst = out + jp * kc;
    int64_t cols = std::min<int64_t>(NR, nc - jp);
    if (!tb && cols == NR) {
      for (int64_t p = 0; p < kc; ++p) std::copy_n(b + (p0 + p) * ldb + j0 + jp, NR, dst + p * NR);
      continue;
    }
    for (int64_t p = 0; p < kc; ++p)
      for (int l = 0; l < NR; ++l) {
        int64_t j = j0 + jp + l, q = p0 + p;
        dst[p * NR + l] = l < cols ? (tb ? b[j * ldb + q] : b[q * ldb + j]) : 0.f;
      }
  }
}

// With at most this many column panels in a block, A is read in place
// rather than packed: packing would copy A once per use, about the cost of
// the products themselves (the codec's 16- and 40-column layers).
constexpr int64_t kPackAFromPanels = 3;

void gemm_blocked(const GemmArgs& g) {
  thread_local std::vector<float> apack_v, bpack_v;
  float* apack = scratch(apack_v, MC * KC);
  float* bpack = scratch(bpack_v, KC * NC);
  for (int64_t jc = 0; jc < g.n; jc += NC) {
    int64_t nc = std::min(NC, g.n - jc);
    for (int64_t pc = 0; pc < g.k; pc += KC) {
      int64_t kc = std::min(KC, g.k - pc);
      bool first = pc == 0;
      pack_b(g.tb, g.b, g.ldb, pc, kc, jc, nc, bpack);
      for (int64_t ic = 0; ic < g.m; ic += MC) {
        int64_t mc = std::min(MC, g.m - ic);
        bool packed = (nc + NR - 1) / NR >= kPackAFromPanels || mc % MR != 0;
        if (packed) pack_a(g.ta, g.a, g.lda, ic, mc, pc, kc, apack);
        for (int64_t jr = 0; jr < nc; jr += NR)
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t i = ic + ir;
            const float* ap = packed ? apack + ir * kc : g.ta ? g.a + pc * g.lda + i : g.a + i * g.lda + pc;
            int64_t ars = packed ? 1 : g.ta ? 1 : g.lda, aks = packed ? MR : g.ta ? g.lda : 1;
            const float* bp = bpack + jr * kc;
            float* c = g.c + i * g.ldc + jc + jr;
            int64_t rows = std::min<int64_t>(MR, mc - ir), cols = std::min<int64_t>(NR, nc - jr);
            if (rows == MR && cols == NR) {
              micro_tile(kc, ap, ars, aks, bp, c, g.ldc, first);
              continue;
            }
            // Edge tile: through a full-size buffer; only the valid part of C is read or written.
            float tile[MR * NR] = {};
            if (!first)
              for (int64_t r = 0; r < rows; ++r) std::copy_n(c + r * g.ldc, cols, tile + r * NR);
            micro_tile(kc, ap, ars, aks, bp, tile, NR, first);
            for (int64_t r = 0; r < rows; ++r) std::copy_n(tile + r * NR, cols, c + r * g.ldc);
          }
      }
    }
  }
}

void pack_codes(const float* embed, int64_t k, int64_t d, float* out) { pack_b(true, embed, d, 0, d, 0, k, out); }

// Rows are taken in blocks of AM; for each panel of NR codes, every MR-row
// tile of the block is computed over the whole d (one fma chain per dot, as
// in gemm_blocked) and scanned at once: lane l of a row keeps the first
// minimum among codes j = l mod NR (strict <, codes ascending), then the
// lanes merge by score and, on equal scores, lower code. That total order
// makes the result independent of tiles, blocks and threads.
void argmin_blocked(const ArgminArgs& g) {
  constexpr int64_t AM = 64;
  thread_local std::vector<float> apack_v, best_v;
  thread_local std::vector<int32_t> at_v;
  int64_t am = (AM + MR - 1) / MR * MR;
  float* apack = scratch(apack_v, am * g.d);
  float* best = scratch(best_v, am * NR);
  int32_t* at = scratch(at_v, am * NR);
  for (int64_t ic = 0; ic < g.rows; ic += am) {
    int64_t mc = std::min(am, g.rows - ic);
    pack_a(false, g.x, g.d, ic, mc, 0, g.d, apack);
    std::fill_n(best, am * NR, std::numeric_limits<float>::infinity());
    std::fill_n(at, am * NR, -1);
    for (int64_t jp = 0; jp < g.panels; ++jp) {
      const float* bp = g.packed + jp * g.d * NR;
      const float* bias = g.bias + jp * NR;
      int32_t j0 = static_cast<int32_t>(jp * NR);
      for (int64_t ir = 0; ir < mc; ir += MR) {
        alignas(64) float tile[MR * NR];
        micro_tile(g.d, apack + ir * g.d, 1, MR, bp, tile, NR, true);
        int64_t rows = std::min<int64_t>(MR, mc - ir);
        for (int64_t r = 0; r < rows; ++r) {
          float* b = best + (ir + r) * NR;
          int32_t* a = at + (ir + r) * NR;
          const float* t = tile + r * NR;
          for (int l = 0; l < NR; ++l) {
            float s = nearest_score(bias[l], g.factor, t[l]);
            bool better = s < b[l];
            b[l] = better ? s : b[l];
            a[l] = better ? j0 + l : a[l];
          }
        }
      }
    }
    for (int64_t r = 0; r < mc; ++r) {
      const float* b = best + r * NR;
      const int32_t* a = at + r * NR;
      int64_t result = -1;
      float score = 0.f;
      for (int l = 0; l < NR; ++l)
        if (nearest_better(b[l], a[l], score, result)) {
          score = b[l];
          result = a[l];
        }
      g.out[ic + r] = result < 0 ? 0 : result;
    }
  }
}

// One output row of a convolution with width stride 1 as a GEMM whose B is
// read in place: y[o, j] = chain over p = (c, ky, kx) ascending of
// fma(w[o, p], B(p, j), acc) with B(p, j) = xp[off[p] + j], where xp is the
// row's start in the zero-padded input and off[p] the tap's offset
// (fixed_conv.cpp). Row j of B for NR columns is NR consecutive floats of
// xp, so no im2col buffer is written; the chains are micro_tile's, so the
// bits are those of gemm_blocked on unfold(x). xp must hold NR - 1
// readable floats past every row's last output.
void conv1d_sample(const Conv1dArgs& g) {
  for (int64_t o0 = g.o_begin; o0 < g.o_end; o0 += MR) {
    const int64_t rows = std::min<int64_t>(MR, g.o_end - o0);
    for (int64_t j0 = 0; j0 < g.lout; j0 += NR) {
      const int64_t cols = std::min<int64_t>(NR, g.lout - j0);
      typename Isa::V acc[MR][2];
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = Isa::zero();
      // Rows past `rows` repeat the last real one (their results are dropped).
      const float* wr[MR];
      for (int r = 0; r < MR; ++r) wr[r] = g.w + (o0 + std::min<int64_t>(r, rows - 1)) * g.ck;
      const float* xj = g.xp + j0;
      for (int64_t p = 0; p < g.ck; ++p) {
        const float* bp = xj + g.off[p];
        typename Isa::V b0 = Isa::load(bp), b1 = Isa::load(bp + W);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          typename Isa::V a = Isa::bcast(wr[r] + p);
          acc[r][0] = Isa::fma(a, b0, acc[r][0]);
          acc[r][1] = Isa::fma(a, b1, acc[r][1]);
        }
      }
      float* y = g.y + o0 * g.y_stride + j0;
      if (rows == MR && cols == NR) {
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
          Isa::store(y + r * g.y_stride, acc[r][0]);
          Isa::store(y + r * g.y_stride + W, acc[r][1]);
        }
        continue;
      }
      alignas(64) float tile[MR * NR];
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        Isa::store(tile + r * NR, acc[r][0]);
        Isa::store(tile + r * NR + W, acc[r][1]);
      }
      for (int64_t r = 0; r < rows; ++r) std::copy_n(tile + r * NR, cols, y + r * g.y_stride);
    }
  }
}

// See Conv1dWeightArgs: a tile of R rows j (each broadcast from the padded
// input, the row's own offset) by V vectors of W columns q (loaded from g's
// row r) accumulates over every row r of the unit in ascending order.
void transpose(const float* a, int64_t lda, int64_t rows, int64_t cols, float* b, int64_t ldb);  // below

template <int R, int V>
void conv1d_weight_tile(const Conv1dWeightArgs& g, int64_t j0, int64_t rows, int64_t q0) {
  int64_t off[R];
  for (int r = 0; r < R; ++r) off[r] = g.off[j0 + std::min<int64_t>(r, rows - 1)];
  typename Isa::V acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = Isa::zero();
  // The samples' positions in one loop: a sample's run of lout, then the
  // next's (g's rows follow one another).
  const float* xs = g.xp;
  const float* gs = g.g + q0;
  const int64_t total = g.samples * g.lout;
  for (int64_t t = 0, i = 0; t < total; ++t) {
    typename Isa::V b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = Isa::load(gs + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      typename Isa::V a = Isa::bcast(xs + off[r] + i);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = Isa::fma(a, b[v], acc[r][v]);
    }
    gs += g.o_pad;
    if (++i == g.lout) {
      i = 0;
      xs += g.sample_stride;
    }
  }
  // Through a tile with the loop's constant bounds: an accumulator indexed
  // by `rows` made g++ keep them all in memory, storing every one at every
  // position (4.5x slower than the forward kernel). The tile [j, q] goes
  // into out [q, j] transposed from L1: writing it as [ck, o_pad] and
  // transposing the whole gradient after cost a write and a read of every
  // partial more (the main job's stride-5 convolution: 5 MB a step).
  alignas(64) float tile[R * V * W];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) Isa::store(tile + (r * V + v) * W, acc[r][v]);
  const int64_t cols = std::min<int64_t>(V * W, g.cout - q0);
  if (cols > 0) transpose(tile, V * W, rows, cols, g.out + q0 * g.ck + j0, g.ck);
}

// Tiles of MR rows by NR columns; where g's rows are one vector wide
// (o_pad == W: at most W output channels), of 2 MR rows by one vector, so
// no lane computes a padding column's zeros (half the work at 8 output
// channels on AVX2's 16-column tile).
void conv1d_weight(const Conv1dWeightArgs& g) {
  if (g.o_pad == W) {
    for (int64_t j0 = g.j_begin; j0 < g.j_end; j0 += 2 * MR)
      conv1d_weight_tile<2 * MR, 1>(g, j0, std::min<int64_t>(2 * MR, g.j_end - j0), 0);
    return;
  }
  for (int64_t j0 = g.j_begin; j0 < g.j_end; j0 += MR)
    for (int64_t q0 = 0; q0 < g.o_pad; q0 += NR) conv1d_weight_tile<MR, 2>(g, j0, std::min<int64_t>(MR, g.j_end - j0), q0);
}

// See GemmIsa::transpose. With vectors, 8 x 8 blocks through eight
// registers: 8 loads and 8 stores a block instead of 64 of each, the
// scalar loop's strided stores (the weight gradient's reshuffle of g cost
// more than either of its two tile kernels). Edges of fewer than 8 rows or
// columns go float by float.
void transpose(const float* a, int64_t lda, int64_t rows, int64_t cols, float* b, int64_t ldb) {
  int64_t r0 = 0;
  [[maybe_unused]] int64_t c0 = 0;  // (the scalar set has no blocks)
#if VQDDP_GEMM_ISA != 0
  for (; r0 + 8 <= rows; r0 += 8)
    for (c0 = 0; c0 + 8 <= cols; c0 += 8) {
      const float* from = a + r0 * lda + c0;
      __m256 x[8], t[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) x[r] = _mm256_loadu_ps(from + r * lda);
      // Pairs of rows interleaved, then pairs of pairs: each 128-bit half
      // holds a 4 x 4 block transposed; the halves are swapped last.
#pragma GCC unroll 4
      for (int r = 0; r < 8; r += 2) {
        t[r] = _mm256_unpacklo_ps(x[r], x[r + 1]);
        t[r + 1] = _mm256_unpackhi_ps(x[r], x[r + 1]);
      }
#pragma GCC unroll 2
      for (int r = 0; r < 8; r += 4) {
        x[r] = _mm256_shuffle_ps(t[r], t[r + 2], 0x44);
        x[r + 1] = _mm256_shuffle_ps(t[r], t[r + 2], 0xEE);
        x[r + 2] = _mm256_shuffle_ps(t[r + 1], t[r + 3], 0x44);
        x[r + 3] = _mm256_shuffle_ps(t[r + 1], t[r + 3], 0xEE);
      }
      float* to = b + c0 * ldb + r0;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(to + c * ldb, _mm256_permute2f128_ps(x[c], x[c + 4], 0x20));
        _mm256_storeu_ps(to + (c + 4) * ldb, _mm256_permute2f128_ps(x[c], x[c + 4], 0x31));
      }
    }
  // The columns past the last block of the rows done above, then the rows past them.
  for (int64_t r = 0; r < r0; ++r)
    for (int64_t c = c0; c < cols; ++c) b[c * ldb + r] = a[r * lda + c];
#endif
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b[c * ldb + r] = a[r * lda + c];
}

// See Conv1dDataArgs: a tile of R channels (weights broadcast) by NR
// positions (the shifted gradient rows, shared by the tile's channels)
// accumulates over q ascending; each chain is then added to its element's
// double sum, kept in registers (InMemory false: R = Isa::DR rows fit) or
// in a small tile in L1 (true). Each tile row is an independent fma chain
// per vector, so R rows keep 2 R chains in flight: at R = 2, AVX2's four
// chains leave its two fma units waiting on the latency (4-5 cycles on
// the cores measured); R = MR gives twelve, at the price of a trip through
// L1 per tap for the sums, which a tap of many output channels (o) pays
// back. The same chains and sums, so the same bits, either way.
template <int R, bool InMemory>
void conv1d_data_tile(const Conv1dDataArgs& g, int64_t ch0) {
  constexpr int H = Isa::H, DW = W / H;  // DW doubles a D
  const int64_t rows = std::min<int64_t>(R, g.ch_end - ch0);
  const float* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = g.w + (ch0 + std::min<int64_t>(r, rows - 1)) * g.k;
  for (int64_t i0 = 0; i0 < g.l; i0 += NR) {
    typename Isa::D sum[InMemory ? 1 : R][2 * H];
    alignas(64) double mem[InMemory ? R : 1][2 * H * DW];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int h = 0; h < 2 * H; ++h) {
        if constexpr (InMemory) Isa::dstore(mem[r] + h * DW, Isa::dzero());
        else sum[r][h] = Isa::dzero();
      }
    for (int64_t t = 0; t < g.taps; ++t) {
      const float* gp = g.gp[t] + i0;
      const int64_t tap = g.tap[t];
      typename Isa::V acc[R][2];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Isa::zero();
      for (int64_t q = 0; q < g.o; ++q) {
        const float* bp = gp + q * g.lg;
        typename Isa::V b0 = Isa::load(bp), b1 = Isa::load(bp + W);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          typename Isa::V a = Isa::bcast(wr[r] + tap + q * g.ck);
          acc[r][0] = Isa::fma(a, b0, acc[r][0]);
          acc[r][1] = Isa::fma(a, b1, acc[r][1]);
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {  // each chain rounded to double, added in tap order
        typename Isa::D d[2 * H];
        Isa::widen(acc[r][0], d);
        Isa::widen(acc[r][1], d + H);
#pragma GCC unroll 16
        for (int h = 0; h < 2 * H; ++h) {
          if constexpr (InMemory) Isa::dstore(mem[r] + h * DW, Isa::dadd(Isa::dload(mem[r] + h * DW), d[h]));
          else sum[r][h] = Isa::dadd(sum[r][h], d[h]);
        }
      }
    }
    const int64_t cols = std::min<int64_t>(NR, g.l - i0);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {  // unrolled, so that sum stays in registers
      if (r >= rows) break;
      typename Isa::D d[2 * H];
#pragma GCC unroll 16
      for (int h = 0; h < 2 * H; ++h) {
        if constexpr (InMemory) d[h] = Isa::dload(mem[r] + h * DW);
        else d[h] = sum[r][h];
      }
      float* out = g.dx + (ch0 + r) * g.dx_stride + i0;
      alignas(64) float tile[NR];
      Isa::store(cols == NR ? out : tile, Isa::narrow(d));
      Isa::store((cols == NR ? out : tile) + W, Isa::narrow(d + H));
      if (cols < NR) std::copy_n(tile, cols, out);
    }
  }
}

// Output channels from which MR rows with their sums in L1 beat Isa::DR
// rows with them in registers, on AVX2 (AVX-512's DR rows already keep
// eight chains in flight, and the scalar set has one lane). Measured alone
// on one core of a Zen (AMD EPYC) host, the same bits: 1.4-1.8x from 8 to
// 128 output channels, 1.11x at 4, 1.01-1.05x at 1-3. A block of fewer
// than MR channels (the last of c = 8) goes by DR rows: MR rows of which
// some repeat a channel cost more than they save (0.98x at c = 8).
constexpr int64_t kDataTileMinO = 4;

void conv1d_data(const Conv1dDataArgs& g) {
  int64_t ch0 = g.ch_begin;
  if constexpr (W == 8)  // (no L1 tile compiled for the other sets)
    if (g.o >= kDataTileMinO)
      for (; ch0 + MR <= g.ch_end; ch0 += MR) conv1d_data_tile<MR, true>(g, ch0);
  for (; ch0 < g.ch_end; ch0 += Isa::DR) conv1d_data_tile<Isa::DR, false>(g, ch0);
}

// The unary loops, one per op with the op a constant (no switch per
// element), so each vectorizes where its formula allows.
template <UnaryFn::Op Op>
void unary_as(const UnaryFn& fn, const float* x, float* out, int64_t n) {
  const UnaryFn f{Op, fn.low, fn.high};
  for (int64_t i = 0; i < n; ++i) out[i] = f.f(x[i]);
}

template <UnaryFn::Op Op>
void unary_backward_as(const UnaryFn& fn, const float* x, const float* y, const float* g, float* out, int64_t n) {
  const UnaryFn f{Op, fn.low, fn.high};
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * f.df(x[i], y[i]);
}

template <size_t... I>
constexpr std::array<GemmIsa::UnaryLoop, sizeof...(I)> unary_loops(std::index_sequence<I...>) {
  return {&unary_as<static_cast<UnaryFn::Op>(I)>...};
}
template <size_t... I>
constexpr std::array<GemmIsa::UnaryBackwardLoop, sizeof...(I)> unary_backward_loops(std::index_sequence<I...>) {
  return {&unary_backward_as<static_cast<UnaryFn::Op>(I)>...};
}
// The optimizer's update, per element as written. The set's files are
// built with -fno-math-errno (engine/meson.build), so sqrtf is the
// instruction and the loop vectorizes; a sqrt that sets errno is a call.
// The four arrays are distinct tensors (no alias checks in the loop).
void adamw_loop(const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n) {
  const AdamWStep c = s;  // by value: the stores through p, m, v cannot change it
  float* __restrict pr = p;
  const float* __restrict gr = g;
  float* __restrict mr = m;
  float* __restrict vr = v;
  for (int64_t i = 0; i < n; ++i) adamw_update(c, pr[i], gr[i], mr[i], vr[i]);
}

constexpr auto kUnaryLoops = unary_loops(std::make_index_sequence<UnaryFn::kOps>());
constexpr auto kUnaryBackwardLoops = unary_backward_loops(std::make_index_sequence<UnaryFn::kOps>());

}  // namespace
}  // namespace vqddp::cpu

// The table for the including file's instruction set.
#define VQDDP_GEMM_ISA_TABLE(NAME) \
  const GemmIsa gemm_isa_##NAME = {#NAME, MR, NR, gemm_blocked, pack_codes, argmin_blocked, conv1d_sample, conv1d_weight, \
                                    conv1d_data, transpose, kUnaryLoops.data(), kUnaryBackwardLoops.data(), adamw_loop};
