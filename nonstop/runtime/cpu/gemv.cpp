// Weight-only matrix-vector products for CPUs: y = x Wᵀ with fp32 activations and fp32 accumulation,
// W stored as fp32, bf16 or int8 (+ fp32 scales per group of input columns), low precisions converted
// to fp32 in registers (never materialised). Decode is bound by reading W: halving or quartering its
// bytes is the speed-up, whether or not the CPU has native bf16 arithmetic; at fp32 the tiled stream
// below reads W faster than a BLAS GEMM on one to a few rows (bench/cpu_gemv.py).
//   linear_f32(x [M, K] f32, w tiled f32 [Np, Kp], n, stream)                   -> y [M, n] f32
//   linear_bf16(x [M, K] f32, w tiled bf16 [Np, Kp], n, stream)                  -> y [M, n] f32
//   linear_int8(x [M, K] f32, q tiled i8 [Np, Kp], s [Np, G] f32, n, stream)     -> y [M, n] f32,
//     y[m, i] = Σ_g s[i, g] · Σ_{k ∈ group g} x[m, k] · q[i, k]   (group g: Kp/G consecutive columns)
//
// Row tiles (``packed.tile_rows``): W [n, K] is stored as Np/4 tiles of 4 rows (Np = n rounded up to 4,
// Kp = K rounded up to C = 16 fp32 / 32 bf16 / 16 int8 columns, zeros past n and K); a tile holds its rows'
// columns in chunks of C, the 4 rows' chunks side by side:  tiled[4t + r', C·c + j] = W[4t + r, C·c + j]
// with the tile's memory ordered [c][r][j]. A tile is one contiguous stream of 4·Kp weights, each
// chunk step reads one 64-byte line (int8) or four lines (fp32, bf16), and a thread walks its
// tiles front to back (fp32 and bf16 as two streams, below). On a plain [n, K] matrix read four
// rows at a time the hardware prefetcher left the kernels at half the bandwidth; on the tiles' single
// stream it does better alone for fp32 and bf16 (an interleaved A/B on an EPYC, 2 threads: fp32 +3-14%,
// bf16 even, at 2816x1024 .. 32000x1024), while int8, whose chunk step is one line, keeps a software
// prefetch PREFETCH bytes ahead (it lost up to 20% without one at 1024x2816).
// stream (``pack.streams_weights``: the step's weights outgrow the cache, so none is still there the next
// step): every chunk's lines are requested STREAM_AHEAD bytes ahead with the non-temporal hint instead, so
// the weights pass through L1 without evicting from L2 / L3 what the rest of the step reuses (activations,
// the KV cache, code). Whole decode steps on a Zen 5 EPYC VM (AVX-512 path, 2 threads, 64-token runs
// alternated, median of the paired ratios over 10-16 pairs): while neighbours loaded its memory, a 246M
// Llama fp32 +3..6%, bf16 +9%, int8 +6% (against its T0 prefetch), k3-nano +10%; on the quiet machine later
// fp32 -1%, bf16 -2%, int8 +2%, k3-nano +7%. On a Zen 3 EPYC VM (AVX2 path, 2 threads, paired runs) streaming
// lost for fp32 (-7% on a 768-wide Llama, -15% on k3-nano) and bf16 (-9%) and was even for int8 (+3%),
// so on the AVX2 path only int8 streams. On an Intel Xeon VM (AVX-512 path) streaming read fp32 / bf16 /
// int8 at 0.42 / 0.39 / 0.52x the cached rate (NTA fills L1 only, past the L2 streamer): Intel never
// streams (``pack.streams_weights``).
// bf16 chunks are widened without shuffles: a 32-bit lane holds columns 2j (low half: shift left 16)
// and 2j+1 (high half: mask), so x is reordered once per call to [even columns | odd columns] per chunk.
// Tiles are split over threads (at::parallel_for); each tile is read once for all M rows of x. For fp32 and
// bf16 a thread reads its share as two streams side by side (``run_tiles``' paired form: its two halves,
// one tile of each per pass): on a Zen 3 EPYC VM (AVX2 path), paired medians fp32 1.03-1.18x, bf16
// 1.10-1.25x over 768x768 .. 24576x768 at 2 threads (bench/cpu_gemv_ab.py); on a Xeon VM (AVX-512 path) 1.03-1.10x and 1.02-1.17x.
// AVX-512 and AVX2 paths are chosen at run time (isa.h); a scalar path covers the rest.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include "isa.h"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t I8_CHUNK = 16, BF16_CHUNK = 32, F32_CHUNK = 16, PREFETCH = 8192, STREAM_AHEAD = 4096;

// Request ``lines`` cache lines from p + STREAM_AHEAD on, non-temporally (see ``stream`` above).
inline void fetch_ahead(const void* p, int lines) {
  const char* b = static_cast<const char*>(p) + STREAM_AHEAD;
  for (int i = 0; i < lines; ++i) _mm_prefetch(b + 64 * i, _MM_HINT_NTA);
}

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

int isa() { return nonstop_cpu_isa::level(); }

int64_t limit_isa(int64_t level) { return nonstop_cpu_isa::limit(level); }

int64_t isa_level() { return isa(); }  // the vector path in effect, unchanged

// ---------------------------------------------------------------- one tile (4 rows) against one row of x
// int8: x [Kp] (zero past K), t the tile, s its rows' scales (row r: s[r·G .. r·G+G)), cpg chunks per group.
void tile_i8_scalar(const float* x, const int8_t* t, const float* s, int64_t G, int64_t cpg, bool, float* out) {
  for (int r = 0; r < 4; ++r) {
    float acc = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      float part = 0.f;
      for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c)
        for (int64_t j = 0; j < I8_CHUNK; ++j) part += x[c * I8_CHUNK + j] * float(t[(c * 4 + r) * I8_CHUNK + j]);
      acc += s[r * G + g] * part;
    }
    out[r] = acc;
  }
}

__attribute__((target("avx512f,avx512bw"))) void tile_i8_avx512(const float* x, const int8_t* t, const float* s,
                                                                int64_t G, int64_t cpg, bool stream, float* out) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    __m512 p[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
      const int8_t* b = t + c * 4 * I8_CHUNK;
      if (stream)
        fetch_ahead(b, 1);
      else
        _mm_prefetch(reinterpret_cast<const char*>(b) + PREFETCH, _MM_HINT_T0);
      __m512 xv = _mm512_loadu_ps(x + c * I8_CHUNK);
      for (int r = 0; r < 4; ++r) {
        __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + r * I8_CHUNK));
        p[r] = _mm512_fmadd_ps(xv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw)), p[r]);
      }
    }
    for (int r = 0; r < 4; ++r) a[r] = _mm512_fmadd_ps(p[r], _mm512_set1_ps(s[r * G + g]), a[r]);
  }
  for (int r = 0; r < 4; ++r) out[r] = _mm512_reduce_add_ps(a[r]);
}

__attribute__((target("avx2,fma"))) float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void tile_i8_avx2(const float* x, const int8_t* t, const float* s, int64_t G,
                                                      int64_t cpg, bool stream, float* out) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    __m256 p[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 q[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
      const int8_t* b = t + c * 4 * I8_CHUNK;
      if (stream)
        fetch_ahead(b, 1);
      else
        _mm_prefetch(reinterpret_cast<const char*>(b) + PREFETCH, _MM_HINT_T0);
      __m256 x0 = _mm256_loadu_ps(x + c * I8_CHUNK), x1 = _mm256_loadu_ps(x + c * I8_CHUNK + 8);
      for (int r = 0; r < 4; ++r) {
        const int8_t* w = b + r * I8_CHUNK;
        __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
        __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 8))));
        p[r] = _mm256_fmadd_ps(x0, w0, p[r]);
        q[r] = _mm256_fmadd_ps(x1, w1, q[r]);
      }
    }
    for (int r = 0; r < 4; ++r) a[r] = _mm256_fmadd_ps(_mm256_add_ps(p[r], q[r]), _mm256_set1_ps(s[r * G + g]), a[r]);
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum256(a[r]);
}

// bf16: x [Kp] reordered per 32-column chunk to [x0, x2, .., x30, x1, x3, .., x31] (``even_odd``); S tiles as
// for fp32.
template <int S>
void tiles_bf16_scalar(const float* xeo, const uint16_t* const* t, int64_t chunks, bool, float (*out)[4]) {
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) {
      float acc = 0.f;
      for (int64_t c = 0; c < chunks; ++c) {
        const uint16_t* w = t[s] + (c * 4 + r) * BF16_CHUNK;
        const float* xc = xeo + c * BF16_CHUNK;
        for (int64_t j = 0; j < BF16_CHUNK / 2; ++j)
          acc += xc[j] * bf16_to_f32(w[2 * j]) + xc[BF16_CHUNK / 2 + j] * bf16_to_f32(w[2 * j + 1]);
      }
      out[s][r] = acc;
    }
}

template <int S>
__attribute__((target("avx512f,avx512bw"))) void tiles_bf16_avx512(const float* xeo, const uint16_t* const* t,
                                                                   int64_t chunks, bool stream, float (*out)[4]) {
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  __m512 a[S][4], b[S][4];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = b[s][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512 even = _mm512_loadu_ps(xeo + c * BF16_CHUNK), odd = _mm512_loadu_ps(xeo + c * BF16_CHUNK + 16);
    for (int s = 0; s < S; ++s) {
      const uint16_t* w = t[s] + c * 4 * BF16_CHUNK;
      if (stream) fetch_ahead(w, 4);
      for (int r = 0; r < 4; ++r) {
        __m512i raw = _mm512_loadu_si512(w + r * BF16_CHUNK);
        a[s][r] = _mm512_fmadd_ps(even, _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16)), a[s][r]);
        b[s][r] = _mm512_fmadd_ps(odd, _mm512_castsi512_ps(_mm512_and_si512(raw, high)), b[s][r]);
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) out[s][r] = _mm512_reduce_add_ps(_mm512_add_ps(a[s][r], b[s][r]));
}

template <int S>
__attribute__((target("avx2,fma"))) void tiles_bf16_avx2(const float* xeo, const uint16_t* const* t,
                                                         int64_t chunks, bool stream, float (*out)[4]) {
  const __m256i high = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  __m256 a[S][4];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const float* xc = xeo + c * BF16_CHUNK;
    for (int s = 0; s < S; ++s) {
      const uint16_t* w = t[s] + c * 4 * BF16_CHUNK;
      if (stream) fetch_ahead(w, 4);
      for (int half = 0; half < 2; ++half) {  // columns 16·half .. 16·half+15 of the chunk
        __m256 even = _mm256_loadu_ps(xc + 8 * half), odd = _mm256_loadu_ps(xc + 16 + 8 * half);
        for (int r = 0; r < 4; ++r) {
          __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * BF16_CHUNK + 16 * half));
          a[s][r] = _mm256_fmadd_ps(even, _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)), a[s][r]);
          a[s][r] = _mm256_fmadd_ps(odd, _mm256_castsi256_ps(_mm256_and_si256(raw, high)), a[s][r]);
        }
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) out[s][r] = hsum256(a[s][r]);
}

// fp32: x [Kp], S tiles side by side (``run_tiles``' two streams per thread), each as chunks of 16 columns (one
// 64-byte line per row); out[s] gets tile t[s]'s 4 rows.
template <int S>
void tiles_f32_scalar(const float* x, const float* const* t, int64_t chunks, bool, float (*out)[4]) {
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) {
      float acc = 0.f;
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t j = 0; j < F32_CHUNK; ++j) acc += x[c * F32_CHUNK + j] * t[s][(c * 4 + r) * F32_CHUNK + j];
      out[s][r] = acc;
    }
}

template <int S>
__attribute__((target("avx512f,avx512bw"))) void tiles_f32_avx512(const float* x, const float* const* t,
                                                                  int64_t chunks, bool stream, float (*out)[4]) {
  __m512 a[S][4];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512 xv = _mm512_loadu_ps(x + c * F32_CHUNK);
    for (int s = 0; s < S; ++s) {
      const float* w = t[s] + c * 4 * F32_CHUNK;
      if (stream) fetch_ahead(w, 4);
      for (int r = 0; r < 4; ++r) a[s][r] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + r * F32_CHUNK), a[s][r]);
    }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) out[s][r] = _mm512_reduce_add_ps(a[s][r]);
}

template <int S>
__attribute__((target("avx2,fma"))) void tiles_f32_avx2(const float* x, const float* const* t, int64_t chunks,
                                                        bool stream, float (*out)[4]) {
  __m256 a[S][4];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) a[s][r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m256 x0 = _mm256_loadu_ps(x + c * F32_CHUNK), x1 = _mm256_loadu_ps(x + c * F32_CHUNK + 8);
    for (int s = 0; s < S; ++s) {
      const float* w = t[s] + c * 4 * F32_CHUNK;
      if (stream) fetch_ahead(w, 4);
      for (int r = 0; r < 4; ++r) {
        a[s][r] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + r * F32_CHUNK), a[s][r]);
        a[s][r] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + r * F32_CHUNK + 8), a[s][r]);
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < 4; ++r) out[s][r] = hsum256(a[s][r]);
}

// ---------------------------------------------------------------- operators
void check(const at::Tensor& x, const at::Tensor& w, at::ScalarType wt, int64_t n, int64_t chunk) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous fp32 [M, K]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == wt && w.is_contiguous(),
              "weight must be contiguous row tiles [Np, Kp] of the packed type");
  TORCH_CHECK(w.size(0) % 4 == 0 && w.size(1) % chunk == 0, "row tiles need Np % 4 == 0 and Kp % ", chunk, " == 0");
  TORCH_CHECK(n > w.size(0) - 4 && n <= w.size(0), "n must be the weight's row count before padding to 4");
  TORCH_CHECK(x.size(1) <= w.size(1) && x.size(1) > w.size(1) - chunk, "x and weight disagree on K");
}

// x [M, K] -> [M, Kp] with zero columns past K (and, for bf16, each chunk reordered even | odd).
std::vector<float> padded_x(const at::Tensor& x, int64_t Kp, bool even_odd) {
  const int64_t M = x.size(0), K = x.size(1);
  const float* xp = x.data_ptr<float>();
  std::vector<float> out(M * Kp, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    float* row = out.data() + m * Kp;
    if (!even_odd) {
      std::memcpy(row, xp + m * K, K * sizeof(float));
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t c = k / BF16_CHUNK, j = k % BF16_CHUNK;
      row[c * BF16_CHUNK + (j % 2) * (BF16_CHUNK / 2) + j / 2] = xp[m * K + k];
    }
  }
  return out;
}

// Tiles per task: enough weight bytes (64 KB) to amortise handing a task to a thread.
int64_t grain(int64_t tile_bytes) { return std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(tile_bytes, 1)); }

// tiles(x row, ts, count, out): count (1, or 2 where ``paired``) tiles ts[0..count) against one row of x,
// out[i] = tile ts[i]'s 4 outputs. Paired, a thread reads its range's two halves as two sequential streams
// side by side, one tile of each per pass: on a Zen 3 EPYC (AVX2 path) one core keeps more lines in flight
// from two streams than from one (the hardware prefetcher follows both). Software prefetches on the single
// stream (T0, 1-16 KB ahead) were slower than none there.
template <typename TilesFn>
at::Tensor run_tiles(const at::Tensor& x, const std::vector<float>& xs, int64_t n, int64_t Np, int64_t Kp,
                     int64_t tile_bytes, bool paired, TilesFn tiles) {
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, n}, x.options());
  float* yp = y.data_ptr<float>();
  const float* xsp = xs.data();
  at::parallel_for(0, Np / 4, grain(tile_bytes), [&](int64_t t0, int64_t t1) {
    float out[2][4];
    auto emit = [&](int64_t m, int64_t t, const float* o) {
      for (int r = 0; r < 4 && 4 * t + r < n; ++r) yp[m * n + 4 * t + r] = o[r];
    };
    const int64_t half = paired ? (t1 - t0) / 2 : 0;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ts[2] = {t0 + i, t0 + half + i};
      for (int64_t m = 0; m < M; ++m) {
        tiles(xsp + m * Kp, ts, 2, out);
        emit(m, ts[0], out[0]);
        emit(m, ts[1], out[1]);
      }
    }
    for (int64_t t = t0 + 2 * half; t < t1; ++t)
      for (int64_t m = 0; m < M; ++m) {
        tiles(xsp + m * Kp, &t, 1, out);
        emit(m, t, out[0]);
      }
  });
  return y;
}

// fp32 / bf16 weights W (no scales) on every vector path as two streams per thread: ``tiles[isa][S - 1]`` reads
// S tiles side by side (on a Xeon VM with AMX, AVX-512 path, 2 threads: fp32 1.03-1.10x, bf16 1.02-1.17x over one
// stream, bench/results/cpu_gemv_ab_xeon.json, as the AVX2 path's pairs did on Zen 3).
template <typename W>
using UnscaledTiles = void (*)(const float*, const W* const*, int64_t, bool, float (*)[4]);

template <typename W>
at::Tensor run_unscaled(const at::Tensor& x, const std::vector<float>& xs, int64_t n, int64_t Np, int64_t Kp,
                        const W* wp, int64_t chunks, bool stream, const UnscaledTiles<W> (&tiles)[3][2]) {
  const UnscaledTiles<W>* fn = tiles[isa()];
  return run_tiles(x, xs, n, Np, Kp, 4 * Kp * int64_t(sizeof(W)), true,
                   [&](const float* xr, const int64_t* ts, int count, float (*out)[4]) {
                     const W* t[2] = {wp + ts[0] * 4 * Kp, count == 2 ? wp + ts[1] * 4 * Kp : nullptr};
                     fn[count - 1](xr, t, chunks, stream, out);
                   });
}

const UnscaledTiles<float> F32_TILES[3][2] = {{tiles_f32_scalar<1>, tiles_f32_scalar<2>},
                                              {tiles_f32_avx2<1>, tiles_f32_avx2<2>},
                                              {tiles_f32_avx512<1>, tiles_f32_avx512<2>}};
const UnscaledTiles<uint16_t> BF16_TILES[3][2] = {{tiles_bf16_scalar<1>, tiles_bf16_scalar<2>},
                                                  {tiles_bf16_avx2<1>, tiles_bf16_avx2<2>},
                                                  {tiles_bf16_avx512<1>, tiles_bf16_avx512<2>}};

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w, int64_t n, bool stream) {
  check(x, w, at::kFloat, n, F32_CHUNK);
  const int64_t Np = w.size(0), Kp = w.size(1);
  return run_unscaled(x, padded_x(x, Kp, false), n, Np, Kp, w.data_ptr<float>(), Kp / F32_CHUNK, stream, F32_TILES);
}

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w, int64_t n, bool stream) {
  check(x, w, at::kBFloat16, n, BF16_CHUNK);
  const int64_t Np = w.size(0), Kp = w.size(1);
  return run_unscaled(x, padded_x(x, Kp, true), n, Np, Kp, reinterpret_cast<const uint16_t*>(w.data_ptr()),
                      Kp / BF16_CHUNK, stream, BF16_TILES);
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, int64_t n, bool stream) {
  check(x, q, at::kChar, n, I8_CHUNK);
  const int64_t Np = q.size(0), Kp = q.size(1), G = s.size(1), chunks = Kp / I8_CHUNK;
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.dim() == 2 && s.size(0) == Np && G > 0 &&
                  chunks % G == 0,
              "scales must be fp32 [Np, G] with G dividing the Kp/16 column chunks");
  const std::vector<float> xs = padded_x(x, Kp, false);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  const int64_t cpg = chunks / G;
  auto fn = isa() == 2 ? tile_i8_avx512 : isa() == 1 ? tile_i8_avx2 : tile_i8_scalar;
  return run_tiles(x, xs, n, Np, Kp, 4 * Kp, false, [&](const float* xr, const int64_t* ts, int, float (*out)[4]) {
    fn(xr, qp + ts[0] * 4 * Kp, sp + ts[0] * 4 * G, G, cpg, stream, out[0]);
  });
}

}  // namespace

TORCH_LIBRARY(nonstop_cpu, m) {
  m.def("linear_f32(Tensor x, Tensor w, int n, bool stream=False) -> Tensor");
  m.def("linear_bf16(Tensor x, Tensor w, int n, bool stream=False) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor q, Tensor s, int n, bool stream=False) -> Tensor");
  m.def("limit_isa(int level) -> int", &limit_isa);
  m.def("isa_level() -> int", &isa_level);
}

TORCH_LIBRARY_IMPL(nonstop_cpu, CPU, m) {
  m.impl("linear_f32", &linear_f32);
  m.impl("linear_bf16", &linear_bf16);
  m.impl("linear_int8", &linear_int8);
}
