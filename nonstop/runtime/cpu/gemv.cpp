// Weight-only low-precision matrix-vector products for CPUs: y = x Wᵀ with fp32 activations and
// fp32 accumulation, W stored as bf16 or int8 (+ fp32 scales per group of `group` input columns)
// and converted to fp32 in registers (never materialised). Decode is bound by reading W, so halving
// or quartering its bytes is the speed-up, whether or not the CPU has native bf16 arithmetic.
//   linear_bf16(x [M, K] f32, w [N, K] bf16)                       -> y [M, N] f32
//   linear_int8(x [M, K] f32, q [N, K] i8, s [N, K/group] f32, group) -> y [M, N] f32,
//     y[m, n] = Σ_g s[n, g] · Σ_{k ∈ g} x[m, k] · q[n, k]
// Rows of W are split over threads (at::parallel_for); each row is read once for all M rows of x.
// AVX-512 and AVX2 paths are chosen at run time (__builtin_cpu_supports); a scalar path covers the rest.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace {

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---------------------------------------------------------------- dot products of one row, K columns
float dot_bf16_scalar(const float* x, const uint16_t* w, int64_t K) {
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc += x[k] * bf16_to_f32(w[k]);
  return acc;
}

float dot_i8_scalar(const float* x, const int8_t* w, int64_t K) {
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc += x[k] * float(w[k]);
  return acc;
}

__attribute__((target("avx512f,avx512bw"))) float dot_bf16_avx512(const float* x, const uint16_t* w, int64_t K) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i w0 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k))), 16);
    __m512i w1 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k + 16))), 16);
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_castsi512_ps(w0), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), _mm512_castsi512_ps(w1), a1);
  }
  for (; k + 16 <= K; k += 16) {
    __m512i w0 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k))), 16);
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_castsi512_ps(w0), a0);
  }
  float acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  return acc + dot_bf16_scalar(x + k, w + k, K - k);
}

__attribute__((target("avx512f,avx512bw"))) float dot_i8_avx512(const float* x, const int8_t* w, int64_t K) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + k))));
    __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + k + 16))));
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), w0, a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), w1, a1);
  }
  for (; k + 16 <= K; k += 16) {
    __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + k))));
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), w0, a0);
  }
  float acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  return acc + dot_i8_scalar(x + k, w + k, K - k);
}

// Four rows of W (``stride`` elements apart) against one row of x over ``K`` columns: four independent
// accumulator chains, each x vector loaded once.
__attribute__((target("avx512f,avx512bw"))) void dot4_bf16_avx512(const float* x, const uint16_t* w, int64_t K,
                                                                  int64_t stride, float* out) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv = _mm512_loadu_ps(x + k);
    for (int r = 0; r < 4; ++r) {
      __m256i raw = _mm256_loadu_si256((const __m256i*)(w + r * stride + k));
      __m512i wv = _mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16);
      a[r] = _mm512_fmadd_ps(xv, _mm512_castsi512_ps(wv), a[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = _mm512_reduce_add_ps(a[r]) + dot_bf16_scalar(x + k, w + r * stride + k, K - k);
}

__attribute__((target("avx512f,avx512bw"))) void dot4_i8_avx512(const float* x, const int8_t* w, int64_t K,
                                                                int64_t stride, float* out) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv = _mm512_loadu_ps(x + k);
    for (int r = 0; r < 4; ++r) {
      __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + r * stride + k))));
      a[r] = _mm512_fmadd_ps(xv, wv, a[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = _mm512_reduce_add_ps(a[r]) + dot_i8_scalar(x + k, w + r * stride + k, K - k);
}

// Four int8 rows with one scale per ``group`` columns (group % 16 == 0): each group's partial sums are
// scaled and accumulated in vector registers; one horizontal sum per row at the end.
__attribute__((target("avx512f,avx512bw"))) void dot4_i8_groups_avx512(const float* x, const int8_t* w, int64_t K,
                                                                       int64_t group, const float* s, int64_t G,
                                                                       float* out) {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t g = 0; g < G; ++g) {
    __m512 p[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      __m512 xv = _mm512_loadu_ps(x + k);
      for (int r = 0; r < 4; ++r) {
        __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + r * K + k))));
        p[r] = _mm512_fmadd_ps(xv, wv, p[r]);
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

__attribute__((target("avx2,fma"))) float dot_bf16_avx2(const float* x, const uint16_t* w, int64_t K) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256i w0 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + k))), 16);
    __m256i w1 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + k + 8))), 16);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_castsi256_ps(w0), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_castsi256_ps(w1), a1);
  }
  return hsum256(_mm256_add_ps(a0, a1)) + dot_bf16_scalar(x + k, w + k, K - k);
}

__attribute__((target("avx2,fma"))) float dot_i8_avx2(const float* x, const int8_t* w, int64_t K) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(w + k))));
    __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(w + k + 8))));
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), w0, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), w1, a1);
  }
  return hsum256(_mm256_add_ps(a0, a1)) + dot_i8_scalar(x + k, w + k, K - k);
}

using DotBf16 = float (*)(const float*, const uint16_t*, int64_t);
using DotI8 = float (*)(const float*, const int8_t*, int64_t);

int isa() {  // 2: AVX-512, 1: AVX2+FMA, 0: scalar
  static int level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 2
                     : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
  return level;
}

void check(const at::Tensor& x, const at::Tensor& w, at::ScalarType wt) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be a contiguous fp32 [M, K]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == wt && w.is_contiguous(),
              "weight must be contiguous [N, K] of the packed type");
  TORCH_CHECK(x.size(1) == w.size(1), "x and weight disagree on K");
}

// Rows [M, K] of x against rows n0..n1 of W; grain: enough rows per task to amortise the dispatch.
int64_t grain(int64_t K) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)); }

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w) {
  check(x, w, at::kBFloat16);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  DotBf16 dot = isa() == 2 ? dot_bf16_avx512 : isa() == 1 ? dot_bf16_avx2 : dot_bf16_scalar;
  const bool wide = isa() == 2;
  at::parallel_for(0, N, grain(K), [&](int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; wide && n + 4 <= n1; n += 4)
      for (int64_t m = 0; m < M; ++m) {
        float out[4];
        dot4_bf16_avx512(xp + m * K, wp + n * K, K, K, out);
        for (int r = 0; r < 4; ++r) yp[m * N + n + r] = out[r];
      }
    for (; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) yp[m * N + n] = dot(xp + m * K, wp + n * K, K);
  });
  return y;
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s, int64_t group) {
  check(x, q, at::kChar);
  const int64_t M = x.size(0), N = q.size(0), K = x.size(1);
  TORCH_CHECK(group > 0 && K % group == 0, "group must divide K");
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.size(0) == N && s.size(1) == K / group,
              "scales must be fp32 [N, K/group]");
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t G = K / group;
  DotI8 dot = isa() == 2 ? dot_i8_avx512 : isa() == 1 ? dot_i8_avx2 : dot_i8_scalar;
  const bool wide = isa() == 2;
  at::parallel_for(0, N, grain(K), [&](int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; wide && group % 16 == 0 && n + 4 <= n1; n += 4)
      for (int64_t m = 0; m < M; ++m)
        dot4_i8_groups_avx512(xp + m * K, qp + n * K, K, group, sp + n * G, G, yp + m * N + n);
    for (; wide && n + 4 <= n1; n += 4)  // four rows at once; each group's partial dot scaled by its row's scale
      for (int64_t m = 0; m < M; ++m) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f}, part[4];
        for (int64_t g = 0; g < G; ++g) {
          dot4_i8_avx512(xp + m * K + g * group, qp + n * K + g * group, group, K, part);
          for (int r = 0; r < 4; ++r) acc[r] += sp[(n + r) * G + g] * part[r];
        }
        for (int r = 0; r < 4; ++r) yp[m * N + n + r] = acc[r];
      }
    for (; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float acc = 0.f;
        for (int64_t g = 0; g < G; ++g)
          acc += sp[n * G + g] * dot(xp + m * K + g * group, qp + n * K + g * group, group);
        yp[m * N + n] = acc;
      }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(nonstop_cpu, m) {
  m.def("linear_bf16(Tensor x, Tensor w) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor q, Tensor s, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(nonstop_cpu, CPU, m) {
  m.impl("linear_bf16", &linear_bf16);
  m.impl("linear_int8", &linear_int8);
}
