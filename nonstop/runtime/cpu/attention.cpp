// Softmax attention of one new query token per sequence over a paged key/value pool, for CPU decode steps:
//   decode_attention(q [B, H, D] f32, k [P, Hkv, D] f32, v [P, Hkv, Dv] f32, rows [B, L] i64,
//                    visible [B] i64, scale) -> o [B, H, Dv] f32
//   o[b, h] = Σ_{s < n} p_s v[rows[b, s], g],   p = softmax_s(scale · q[b, h] · k[rows[b, s], g]),
//   g = h / (H / Hkv) (grouped-query heads), n = min(visible[b], L)  (keys 0..position of the query)
// i.e. ``model.attention.gqa_attention`` for a one-token step, with keys and values read in place from the
// pool rows the page table gives (``cache.pages.pool_rows``). A compiled step otherwise gathers every cached
// row into a copy and runs two batched GEMMs around a softmax loop; here each (sequence, key head) task
// reads its n key rows once for all H/Hkv query heads sharing them (four keys at a time), keeps the scores
// in a buffer, and sums the value rows into register blocks of V_BLOCK outputs. Rows are prefetched
// AHEAD keys early (their addresses come from the page table). Scores, softmax and sums in fp32, in the
// reference's order of operations (softmax, then the weighted sum); summation orders differ, so the values
// agree to rounding. Paired whole-step A/B on a Zen 3 VM (``bench/cpu_attention_ab.py``: 2 threads, 768-wide
// 12-layer Llama, int8 weights, 8 pairs): decode tokens/s +2% (paired range -6%..+15%: noise) after a 32-token
// prompt, +25% (-1%..+40%) after a 1,000-token one (``bench/results/cpu_attention_ab.json``).
// The AVX-512 / AVX2 bodies are the scalar loops compiled for those targets (isa.h picks one at run time).
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include "isa.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// e^x for x <= 0 (a score minus its row's maximum): 2^(x·log2 e) = 2^n · 2^f, n = round, |f| <= 1/2, 2^f by its
// Taylor series to f^6 (relative error < 2e-7), 2^n built in the exponent bits. Plain arithmetic, so the
// softmax loop vectorises (std::exp would be one libm call per score, most of the kernel's time).
inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  const float y = std::max(x, -87.f) * 1.44269504f;
  const float n = std::floor(y + 0.5f), f = y - n;
  float p = 1.5403530e-4f;
  p = p * f + 1.3333558e-3f;
  p = p * f + 9.6181291e-3f;
  p = p * f + 5.5504109e-2f;
  p = p * f + 2.4022651e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

struct Group {  // one (sequence, key head): R query heads [R, D] against n pool rows
  const float* q;
  const float* k;  // pool base + g·D; row r of the pool at k + r·k_row
  const float* v;
  const int64_t* rows;
  int64_t n, R, D, Dv, k_row, v_row;
  float scale;
  float* out;  // [R, Dv]
};

// Scores of keys s..s+3 for every query head: four independent dot products per head (one dependent chain
// of vector FMAs per dot would leave the kernel waiting on FMA latency at head dims of 64-128).
inline __attribute__((always_inline)) void scores4(const Group& a, int64_t s, float* scores) {
  const float* k0 = a.k + a.rows[s] * a.k_row;
  const float* k1 = a.k + a.rows[s + 1] * a.k_row;
  const float* k2 = a.k + a.rows[s + 2] * a.k_row;
  const float* k3 = a.k + a.rows[s + 3] * a.k_row;
  for (int64_t r = 0; r < a.R; ++r) {
    const float* qr = a.q + r * a.D;
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
    for (int64_t d = 0; d < a.D; ++d) {
      d0 += qr[d] * k0[d];
      d1 += qr[d] * k1[d];
      d2 += qr[d] * k2[d];
      d3 += qr[d] * k3[d];
    }
    float* out = scores + r * a.n + s;
    out[0] = d0 * a.scale, out[1] = d1 * a.scale, out[2] = d2 * a.scale, out[3] = d3 * a.scale;
  }
}

// Ask for pool row ``rows[s]`` of ``base`` (``bytes`` long) ahead of its use: the rows of one head are
// ``row`` floats apart in the pool and their addresses come from the page table, which the hardware
// prefetcher does not follow, and at a few hundred cached tokens they are no longer in the caches.
inline __attribute__((always_inline)) void fetch_row(const float* base, const Group& a, int64_t s, int64_t row,
                                                     int64_t bytes) {
  if (s >= a.n) return;
  const char* p = reinterpret_cast<const char*>(base + a.rows[s] * row);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

constexpr int64_t AHEAD = 8;  // keys prefetched ahead of the one in use

// o[0..V_BLOCK) = Σ_s p[s] · v[rows[s], d0 + j]: the block's sums stay in registers across all n value rows
// (an o += p·v per row would load and store the whole output row once per key).
constexpr int64_t V_BLOCK = 32;

inline __attribute__((always_inline)) void weighted_rows(const Group& a, const float* p, int64_t d0, bool fetch,
                                                         float* o) {
  float acc[V_BLOCK] = {};
  for (int64_t s = 0; s < a.n; ++s) {
    if (fetch) fetch_row(a.v, a, s + AHEAD, a.v_row, a.Dv * 4);
    const float w = p[s];
    const float* vr = a.v + a.rows[s] * a.v_row + d0;
#pragma omp simd
    for (int64_t j = 0; j < V_BLOCK; ++j) acc[j] += w * vr[j];
  }
  for (int64_t j = 0; j < V_BLOCK; ++j) o[j] = acc[j];
}

inline __attribute__((always_inline)) void attend(const Group& a, float* scores /* [R, n] */) {
  const int64_t k_bytes = a.D * 4, v_bytes = a.Dv * 4;
  for (int64_t s = 0; s < std::min(a.n, AHEAD); ++s) fetch_row(a.k, a, s, a.k_row, k_bytes);
  int64_t s = 0;
  for (; s + 4 <= a.n; s += 4) {
    for (int64_t j = 0; j < 4; ++j) fetch_row(a.k, a, s + AHEAD + j, a.k_row, k_bytes);
    scores4(a, s, scores);
  }
  for (; s < a.n; ++s) {
    const float* kr = a.k + a.rows[s] * a.k_row;
    for (int64_t r = 0; r < a.R; ++r) {
      const float* qr = a.q + r * a.D;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < a.D; ++d) dot += qr[d] * kr[d];
      scores[r * a.n + s] = dot * a.scale;
    }
  }
  for (int64_t r = 0; r < a.R; ++r) {
    float* sr = scores + r * a.n;
    const float top = *std::max_element(sr, sr + a.n);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t s = 0; s < a.n; ++s) {
      sr[s] = exp_nonpositive(sr[s] - top);
      sum += sr[s];
    }
    const float inv = 1.f / sum;
    for (int64_t s = 0; s < a.n; ++s) sr[s] *= inv;
  }
  for (int64_t s = 0; s < std::min(a.n, AHEAD); ++s) fetch_row(a.v, a, s, a.v_row, v_bytes);
  for (int64_t r = 0; r < a.R; ++r) {
    const float* pr = scores + r * a.n;
    float* o = a.out + r * a.Dv;
    int64_t d0 = 0;
    for (; d0 + V_BLOCK <= a.Dv; d0 += V_BLOCK) weighted_rows(a, pr, d0, r == 0 && d0 == 0, o + d0);
    for (; d0 < a.Dv; ++d0) {
      float acc = 0.f;
      for (int64_t s = 0; s < a.n; ++s) acc += pr[s] * a.v[a.rows[s] * a.v_row + d0];
      o[d0] = acc;
    }
  }
}

void attend_scalar(const Group& a, float* scores) { attend(a, scores); }
__attribute__((target("avx2,fma"))) void attend_avx2(const Group& a, float* scores) { attend(a, scores); }
__attribute__((target("avx512f,avx512bw"))) void attend_avx512(const Group& a, float* scores) { attend(a, scores); }

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rows,
                            const at::Tensor& visible, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [B, H, D], k [P, Hkv, D], v [P, Hkv, Dv]");
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "q, k and v must be contiguous fp32");
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kLong && rows.is_contiguous(), "rows must be int64 [B, L]");
  TORCH_CHECK(visible.dim() == 1 && visible.scalar_type() == at::kLong, "visible must be int64 [B]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), Dv = v.size(2), L = rows.size(1);
  TORCH_CHECK(rows.size(0) == B && visible.size(0) == B, "q, rows and visible disagree on B");
  TORCH_CHECK(k.size(2) == D && v.size(1) == Hkv && v.size(0) == k.size(0) && Hkv > 0 && H % Hkv == 0,
              "k must be [P, Hkv, D] and v [P, Hkv, Dv] with Hkv dividing H");
  const int64_t R = H / Hkv, P = k.size(0);
  at::Tensor out = at::empty({B, H, Dv}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  at::Tensor seen = visible.contiguous();
  const int64_t* np = seen.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(np[b] >= 1, "every query must see at least one key");
    for (int64_t s = 0; s < std::min(np[b], L); ++s)
      TORCH_CHECK(rp[b * L + s] >= 0 && rp[b * L + s] < P, "a row index is outside the pool");
  }
  float* op = out.data_ptr<float>();
  auto fn = nonstop_cpu_isa::level() == 2 ? attend_avx512 : nonstop_cpu_isa::level() == 1 ? attend_avx2 : attend_scalar;
  const int64_t work = std::max<int64_t>(1, L * R * (D + Dv));  // multiply-adds of one task at most
  at::parallel_for(0, B * Hkv, std::max<int64_t>(1, (64 << 10) / work), [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(R * L);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / Hkv, g = t % Hkv;
      const Group a{qp + (b * H + g * R) * D, kp + g * D, vp + g * Dv, rp + b * L, std::min(np[b], L), R, D, Dv,
                    Hkv * D, Hkv * Dv, float(scale), op + (b * H + g * R) * Dv};
      fn(a, scores.data());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nonstop_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor rows, Tensor visible, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(nonstop_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
