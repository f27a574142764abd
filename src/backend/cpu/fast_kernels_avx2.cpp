// AVX2 + FMA kernels (function-level target attributes; used when AVX-512 VNNI is absent or when
// LILY_CPU_ISA=avx2). 4-bit: a group's 8 words in one ymm; shifting each 16-bit lane by 4j and
// masking gives pair j of PreparedX, and vpmaddwd + vpaddd give the exact integer dot product.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "backend/cpu/fast_gdn_kernels.h"
#include "backend/cpu/fast_gemm.h"

#define LILY_TGT __attribute__((target("avx2,fma,bmi2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx2.inc"
using V = Avx2;

constexpr int kMaxGroups = 256;
// q4_rows (fast_kernels_simd.inc): blocks of 2 rows x 2 tokens, 64 tokens at a time; the scales and
// biases are not prefetched (that was measured on AVX-512 only).
constexpr int kRowBlock = 2, kTokTile = 2, kTokBlock = 64, kParamRowsAhead = 0;
constexpr int kStepColVecs = 1;  // gdn_step's first pass: 8 columns of S at a time

#include "backend/cpu/fast_kernels_simd.inc"

LILY_TGT float dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = V::hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

LILY_TGT void axpy(float* y, float s, const float* x, int n) {
  const __m256 sv = _mm256_set1_ps(s);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += s * x[i];
}

template <int R, int T>
LILY_TGT void q4_block(const QArgs& a, int r, int i0, const float* sb, const float* bb) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  const __m256i nib = _mm256_set1_epi16(0xF);
  const auto [codes, xp, xl, dx] = q4_streams<R, T>(a, r, i0);
  __m256 acc[R][T] = {};
  for (int g = 0; g < G; ++g) {
    // Software prefetch 1 KiB ahead in every row stream (the hardware prefetchers restart at each 4 KiB).
    if ((g & 1) == 0)
#pragma GCC unroll 2
      for (int rr = 0; rr < R; ++rr) _mm_prefetch(reinterpret_cast<const char*>(codes[rr] + g * 8 + 256), _MM_HINT_T0);
    __m256i wj[R][4];
#pragma GCC unroll 2
    for (int rr = 0; rr < R; ++rr) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes[rr] + g * 8));
      wj[rr][0] = _mm256_and_si256(c, nib);
      wj[rr][1] = _mm256_and_si256(_mm256_srli_epi16(c, 4), nib);
      wj[rr][2] = _mm256_and_si256(_mm256_srli_epi16(c, 8), nib);
      wj[rr][3] = _mm256_srli_epi16(c, 12);
    }
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      const int32_t* xg = xp[t] + g * kPairsPerGroup;
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 8));
      const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 16));
      const __m256i x3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 24));
      const int32_t* lg = xl[t] + g * kPairsPerGroup;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg + 8));
      const __m256i l2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg + 16));
      const __m256i l3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg + 24));
      const __m256 d = _mm256_set1_ps(dx[t][g]);
#pragma GCC unroll 2
      for (int rr = 0; rr < R; ++rr) {
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(wj[rr][0], x0), _mm256_madd_epi16(wj[rr][1], x1)),
                                           _mm256_add_epi32(_mm256_madd_epi16(wj[rr][2], x2), _mm256_madd_epi16(wj[rr][3], x3)));
        const __m256i sl = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(wj[rr][0], l0), _mm256_madd_epi16(wj[rr][1], l1)),
                                            _mm256_add_epi32(_mm256_madd_epi16(wj[rr][2], l2), _mm256_madd_epi16(wj[rr][3], l3)));
        acc[rr][t] = q4_group_sum(acc[rr][t], s, sl, d, sb[rr * G + g]);
      }
    }
  }
#pragma GCC unroll 2
  for (int t = 0; t < T; ++t) {
    const float* xs = a.x->row_xsum(a.ids[i0 + t]);
#pragma GCC unroll 2
    for (int rr = 0; rr < R; ++rr)
      a.y[size_t(i0 + t) * a.ldy + r + rr] = V::hsum(acc[rr][t]) + dot(bb + rr * G, xs, G);
  }
}

LILY_TGT void load_row_params(const QWeight& w, int r, int R, float* sb, float* bb) {
  const int G = w.groups_per_row();
  for (int rr = 0; rr < R; ++rr)
    for (int g = 0; g < G; ++g) {
      sb[rr * G + g] = bf16_to_f32(w.scales[size_t(r + rr) * G + g]);
      bb[rr * G + g] = bf16_to_f32(w.biases[size_t(r + rr) * G + g]);
    }
}

}  // namespace

const KernelTable* avx2_table() {
  static const KernelTable t{kGdnAvx2, "avx2", q4_rows, q4_gemm_avx2, q8_rows, dot, axpy, gdn_step, fma_flops};
  return &t;
}

}  // namespace lily::cpu::fast
