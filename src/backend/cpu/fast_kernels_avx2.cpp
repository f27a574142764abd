// AVX2 + FMA kernels (function-level target attributes; used when AVX-512 VNNI is absent or when
// LILY_CPU_ISA=avx2). 4-bit: a group's 8 words in one ymm; shifting each 16-bit lane by 4j and
// masking gives pair j of PreparedX, and vpmaddwd + vpaddd give the exact integer dot product.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/fast_gdn_kernels.h"
#include "backend/cpu/fast_gemm.h"

#define LILY_AVX2 __attribute__((target("avx2,fma,bmi2")))

namespace lily::cpu::fast {
namespace {

constexpr int kMaxGroups = 256;

LILY_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LILY_AVX2 float dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum8(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

LILY_AVX2 void axpy(float* y, float s, const float* x, int n) {
  const __m256 sv = _mm256_set1_ps(s);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += s * x[i];
}

template <int R, int T>
LILY_AVX2 void q4_block(const QArgs& a, int r, int i0, const float* sb, const float* bb) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m256i nib = _mm256_set1_epi16(0xF);
  const uint32_t* codes[R];
  const int32_t* xp[T];
  const int32_t* xl[T];
  const float* dx[T];
#pragma GCC unroll 2
  for (int rr = 0; rr < R; ++rr) codes[rr] = w.codes + size_t(r + rr) * wpr;
#pragma GCC unroll 2
  for (int t = 0; t < T; ++t) {
    xp[t] = a.x->row_pairs(a.ids[i0 + t]);
    xl[t] = a.x->row_lo(a.ids[i0 + t]);
    dx[t] = a.x->row_dx(a.ids[i0 + t]);
  }
  __m256 acc[R][T];
#pragma GCC unroll 2
  for (int rr = 0; rr < R; ++rr)
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) acc[rr][t] = _mm256_setzero_ps();
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
        const __m256 hl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sl), _mm256_set1_ps(kLoScale), _mm256_cvtepi32_ps(s));
        const __m256 f = _mm256_mul_ps(hl, d);
        acc[rr][t] = _mm256_fmadd_ps(f, _mm256_set1_ps(sb[rr * G + g]), acc[rr][t]);
      }
    }
  }
#pragma GCC unroll 2
  for (int t = 0; t < T; ++t) {
    const float* xs = a.x->row_xsum(a.ids[i0 + t]);
#pragma GCC unroll 2
    for (int rr = 0; rr < R; ++rr)
      a.y[size_t(i0 + t) * a.ldy + r + rr] = hsum8(acc[rr][t]) + dot(bb + rr * G, xs, G);
  }
}

template <int R>
LILY_AVX2 void q4_rowblock(const QArgs& a, int r, int i0, int i1, const float* sb, const float* bb) {
  int i = i0;
  for (; i + 2 <= i1; i += 2) q4_block<R, 2>(a, r, i, sb, bb);
  if (i < i1) q4_block<R, 1>(a, r, i, sb, bb);
}

LILY_AVX2 void load_row_params(const QWeight& w, int r, int R, float* sb, float* bb) {
  const int G = w.groups_per_row();
  for (int rr = 0; rr < R; ++rr)
    for (int g = 0; g < G; ++g) {
      sb[rr * G + g] = bf16_to_f32(w.scales[size_t(r + rr) * G + g]);
      bb[rr * G + g] = bf16_to_f32(w.biases[size_t(r + rr) * G + g]);
    }
}

LILY_AVX2 void q4_rows(const QArgs& a) {
  alignas(32) float sb[2 * kMaxGroups], bb[2 * kMaxGroups];
  constexpr int kTokBlock = 64;
  for (int i0 = 0; i0 < a.n; i0 += kTokBlock) {
    const int i1 = a.n < i0 + kTokBlock ? a.n : i0 + kTokBlock;
    int r = a.r0;
    for (; r + 2 <= a.r1; r += 2) {
      load_row_params(*a.w, r, 2, sb, bb);
      q4_rowblock<2>(a, r, i0, i1, sb, bb);
    }
    for (; r < a.r1; ++r) {
      load_row_params(*a.w, r, 1, sb, bb);
      q4_rowblock<1>(a, r, i0, i1, sb, bb);
    }
  }
}

LILY_AVX2 void q8_rows(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  for (int r = a.r0; r < a.r1; ++r) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(w.codes + size_t(r) * w.words_per_row());
    for (int i = 0; i < a.n; ++i) {
      const float* x = a.xf + size_t(a.ids[i]) * a.ldxf;
      __m256 acc = _mm256_setzero_ps(), accb = _mm256_setzero_ps();
      for (int g = 0; g < G; ++g) {
        __m256 d = _mm256_setzero_ps(), xs = _mm256_setzero_ps();
        for (int c = 0; c < kGroup; c += 8) {
          const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + g * kGroup + c));
          const __m256 xv = _mm256_loadu_ps(x + g * kGroup + c);
          d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), xv, d);
          xs = _mm256_add_ps(xs, xv);
        }
        acc = _mm256_fmadd_ps(d, _mm256_set1_ps(bf16_to_f32(w.scales[size_t(r) * G + g])), acc);
        accb = _mm256_fmadd_ps(xs, _mm256_set1_ps(bf16_to_f32(w.biases[size_t(r) * G + g])), accb);
      }
      a.y[size_t(i) * a.ldy + r] = hsum8(_mm256_add_ps(acc, accb));
    }
  }
}

LILY_AVX2 void gdn_step(float* S, const float* q, const float* k, const float* v, float alpha, float beta, float* out,
                        int dk, int dv, int ldS) {
  alignas(32) float kv[512], oq[512];
  if (dv % 8 != 0 || dv > 512) {
    scalar_table().gdn_step(S, q, k, v, alpha, beta, out, dk, dv, ldS);
    return;
  }
  for (int j0 = 0; j0 < dv; j0 += 8) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0;
    for (int i = 0; i < dk; ++i) {
      const __m256 s0 = _mm256_loadu_ps(S + size_t(i) * ldS + j0);
      a0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(k[i]), a0);
      b0 = _mm256_fmadd_ps(s0, _mm256_set1_ps(q[i]), b0);
    }
    _mm256_store_ps(kv + j0, a0), _mm256_store_ps(oq + j0, b0);
  }
  const float kq = dot(k, q, dk);
  for (int j = 0; j < dv; ++j) {
    const float delta = beta * (v[j] - alpha * kv[j]);
    kv[j] = delta;
    out[j] = alpha * oq[j] + kq * delta;
  }
  const __m256 al = _mm256_set1_ps(alpha);
  for (int i = 0; i < dk; ++i) {
    float* Si = S + size_t(i) * ldS;
    const __m256 ki = _mm256_set1_ps(k[i]);
    for (int j = 0; j < dv; j += 8)
      _mm256_storeu_ps(Si + j, _mm256_fmadd_ps(al, _mm256_loadu_ps(Si + j), _mm256_mul_ps(ki, _mm256_load_ps(kv + j))));
  }
}

}  // namespace

const KernelTable* avx2_table() {
  static const KernelTable t{"avx2", q4_rows, q4_gemm_avx2, q8_rows, dot, axpy, gdn_step,
                             gdn_chunk_avx2, conv4_silu_avx2, gated_norm_avx2, silu_mul_avx2,
                             rmsnorm_avx2};
  return &t;
}

}  // namespace lily::cpu::fast
