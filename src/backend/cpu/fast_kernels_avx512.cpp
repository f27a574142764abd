// AVX-512 (F/BW/VL/DQ + VNNI) kernels, compiled with function-level target attributes so the rest
// of the binary stays baseline x86-64; fast_isa.cpp calls them only when the CPU reports the features.
// 4-bit: one u32 word holds 8 nibbles; a 256-bit load of a group (8 words) broadcast to both halves
// of a zmm, shifted per 16-bit lane by {0|4} and {8|12} and masked, gives the int16 codes in exactly
// the pair order of PreparedX, so two vpdpwssd per group and row give the exact integer dot product.
// GCC 12's avx512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only (clang has no such group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cpu/fast_gdn_kernels.h"
#include "backend/cpu/fast_gemm.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,avx2,bmi2")))

namespace lily::cpu::fast {
namespace {

constexpr int kMaxGroups = 256;  // K ≤ 16384; checked by the backend at load

// 16 bf16 → fp32 (n ≤ 16 valid, rest zero).
LILY_AVX512 inline __m512 load_bf16x16(const bf16* p, int n) {
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Σ_g a[g]·b[g] over n floats.
LILY_AVX512 float dot512(const float* a, const float* b, int n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const int r = n - i;
    const __mmask16 m = r >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << r) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Software prefetch of the decode kernel: a block of R rows is R·K/2 contiguous bytes, read as R
// streams advancing 32 bytes a group; the prefetch walks the same bytes linearly, kPrefetchBytes
// ahead of the block's start (R·32 bytes a group, so it stays that far ahead). Measured on the full
// checkpoint, 2 threads, AVX-512 (docs/perf/2026-12-06-cpu-decode.md): 1 KiB ahead in every row stream
// (the earlier scheme, which at K = 2048 prefetched the next row of the same block) 10.1 tok/s; linear
// 2 KiB 11.1; with 512 KiB tasks (fast_ops.cpp) 12.1 at 2 KiB, 12.9 at 4 KiB, 12.8 at 8 KiB, 12.5 at 16 KiB.
constexpr int kPrefetchBytes = 4096;
constexpr int kParamRowsAhead = 16;

// The horizontal sums of four vectors: {Σa, Σb, Σc, Σd}.
LILY_AVX512 inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Quarters q0..q3 of a vector: [a.q0+a.q2, a.q1+a.q3, b.q0+b.q2, b.q1+b.q3], likewise c, d.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // One quarter per vector, [a, b, c, d], each 4 partial sums; then within each quarter.
  __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

// Rows r..r+R-1 times tokens ids[i0..i0+T-1]; sb/bb: [R][G] fp32 scales and biases of the rows.
template <int R, int T>
LILY_AVX512 void q4_block(const QArgs& a, int r, int i0, const float* sb, const float* bb) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i sh23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(8)), _mm256_set1_epi16(12), 1);
  const __m512i nib = _mm512_set1_epi16(0xF);
  const __m512 lo_scale = _mm512_set1_ps(kLoScale);
  const uint32_t* codes[R];
  const int32_t* xp[T];
  const int32_t* xl[T];
  const float* dx[T];
#pragma GCC unroll 4
  for (int rr = 0; rr < R; ++rr) codes[rr] = w.codes + size_t(r + rr) * wpr;
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const int m = a.ids[i0 + t];
    xp[t] = a.x->row_pairs(m);
    xl[t] = a.x->row_lo(m);
    dx[t] = a.x->row_dx(m);
  }
  __m512 acc[R][T];
#pragma GCC unroll 4
  for (int rr = 0; rr < R; ++rr)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) acc[rr][t] = _mm512_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(codes[0]) + kPrefetchBytes;  // rows r.. are contiguous
  for (int g = 0; g < G; ++g) {
    // R·32 bytes of codes a group: one cache line every 2 / 1 group(s) at R = 1 / 2, two at R = 4.
    if (R * 32 >= 64 || (g & 1) == 0) _mm_prefetch(ahead + g * R * 32, _MM_HINT_T0);
    if (R * 32 >= 128) _mm_prefetch(ahead + g * R * 32 + 64, _MM_HINT_T0);
    __m512i wa[R], wb[R];
#pragma GCC unroll 4
    for (int rr = 0; rr < R; ++rr) {
      const __m512i c = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes[rr] + g * 8)));
      wa[rr] = _mm512_and_si512(_mm512_srlv_epi16(c, sh01), nib);
      wb[rr] = _mm512_and_si512(_mm512_srlv_epi16(c, sh23), nib);
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512i xa = _mm512_loadu_si512(xp[t] + g * kPairsPerGroup);
      const __m512i xb = _mm512_loadu_si512(xp[t] + g * kPairsPerGroup + 16);
      const __m512i la = _mm512_loadu_si512(xl[t] + g * kPairsPerGroup);
      const __m512i lb = _mm512_loadu_si512(xl[t] + g * kPairsPerGroup + 16);
      const __m512 d = _mm512_set1_ps(dx[t][g]);
#pragma GCC unroll 4
      for (int rr = 0; rr < R; ++rr) {
        __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wa[rr], xa);
        s = _mm512_dpwssd_epi32(s, wb[rr], xb);
        __m512i sl = _mm512_dpwssd_epi32(_mm512_setzero_si512(), wa[rr], la);
        sl = _mm512_dpwssd_epi32(sl, wb[rr], lb);
        const __m512 hl = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), lo_scale, _mm512_cvtepi32_ps(s));
        const __m512 f = _mm512_mul_ps(hl, d);
        acc[rr][t] = _mm512_fmadd_ps(f, _mm512_set1_ps(sb[rr * G + g]), acc[rr][t]);
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    // The bias term Σ_g bias_g·Σx_g joins the row's lanes, then one horizontal sum for four rows
    // (a fifth of the ops of a K = 512 row went to two separate sums per row).
    const float* xs = a.x->row_xsum(a.ids[i0 + t]);
    for (int g = 0; g < G; g += 16) {
      const __mmask16 m = G - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (G - g)) - 1);
      const __m512 xv = _mm512_maskz_loadu_ps(m, xs + g);
#pragma GCC unroll 4
      for (int rr = 0; rr < R; ++rr) acc[rr][t] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bb + rr * G + g), xv, acc[rr][t]);
    }
    float* y = a.y + size_t(i0 + t) * a.ldy + r;
    if constexpr (R == 4) {
      _mm_storeu_ps(y, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    } else {
#pragma GCC unroll 4
      for (int rr = 0; rr < R; ++rr) y[rr] = _mm512_reduce_add_ps(acc[rr][t]);
    }
  }
}

template <int R>
LILY_AVX512 void q4_rowblock(const QArgs& a, int r, int i0, int i1, const float* sb, const float* bb) {
  int i = i0;
  for (; i + 4 <= i1; i += 4) q4_block<R, 4>(a, r, i, sb, bb);
  switch (i1 - i) {
    case 3: q4_block<R, 3>(a, r, i, sb, bb); break;
    case 2: q4_block<R, 2>(a, r, i, sb, bb); break;
    case 1: q4_block<R, 1>(a, r, i, sb, bb); break;
    default: break;
  }
}

LILY_AVX512 void load_row_params(const QWeight& w, int r, int R, float* sb, float* bb) {
  const int G = w.groups_per_row();
  for (int rr = 0; rr < R; ++rr)
    for (int g = 0; g < G; g += 16) {
      const int n = G - g;
      const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
      _mm512_mask_storeu_ps(sb + rr * G + g, m, load_bf16x16(w.scales + size_t(r + rr) * G + g, n));
      _mm512_mask_storeu_ps(bb + rr * G + g, m, load_bf16x16(w.biases + size_t(r + rr) * G + g, n));
    }
}

LILY_AVX512 void q4_rows(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  alignas(64) float sb[4 * kMaxGroups], bb[4 * kMaxGroups];
  constexpr int kTokBlock = 16;  // x of 16 tokens (hi + lo, 8 KiB each at K = 2048) stays in L2; the task's codes in L1/L2
  for (int i0 = 0; i0 < a.n; i0 += kTokBlock) {
    const int i1 = a.n < i0 + kTokBlock ? a.n : i0 + kTokBlock;
    int r = a.r0;
    for (; r + 4 <= a.r1; r += 4) {
      // The scales and biases are two more streams, 1/16 of the codes' bytes: prefetched
      // kParamRowsAhead rows ahead (without it, their misses took 15% of decode cycles).
      const size_t ahead = size_t(r + kParamRowsAhead) * G;
      for (int o = 0; o < 4 * G * 2; o += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w.scales + ahead) + o, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w.biases + ahead) + o, _MM_HINT_T0);
      }
      load_row_params(w, r, 4, sb, bb);
      q4_rowblock<4>(a, r, i0, i1, sb, bb);
    }
    for (; r < a.r1; ++r) {
      load_row_params(w, r, 1, sb, bb);
      q4_rowblock<1>(a, r, i0, i1, sb, bb);
    }
  }
  (void)G;
}

// 8-bit codes are bytes in element order; fp32 activations.
LILY_AVX512 void q8_rows(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  for (int r = a.r0; r < a.r1; ++r) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(w.codes + size_t(r) * w.words_per_row());
    for (int i = 0; i < a.n; ++i) {
      const float* x = a.xf + size_t(a.ids[i]) * a.ldxf;
      __m512 acc = _mm512_setzero_ps(), accb = _mm512_setzero_ps();
      for (int g = 0; g < G; ++g) {
        __m512 d = _mm512_setzero_ps(), xs = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int c = 0; c < kGroup; c += 16) {
          const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * kGroup + c));
          const __m512 xv = _mm512_loadu_ps(x + g * kGroup + c);
          d = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), xv, d);
          xs = _mm512_add_ps(xs, xv);
        }
        acc = _mm512_fmadd_ps(d, _mm512_set1_ps(bf16_to_f32(w.scales[size_t(r) * G + g])), acc);
        accb = _mm512_fmadd_ps(xs, _mm512_set1_ps(bf16_to_f32(w.biases[size_t(r) * G + g])), accb);
      }
      a.y[size_t(i) * a.ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc, accb));
    }
  }
}

LILY_AVX512 float dot(const float* a, const float* b, int n) { return dot512(a, b, n); }

LILY_AVX512 void axpy(float* y, float s, const float* x, int n) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int i = 0; i < n; i += 16) {
    const int r = n - i;
    const __mmask16 m = r >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << r) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Pass 1 reads S once for Sᵀk and Sᵀq (64 columns at a time in registers); pass 2 writes
// S ← αS + k δᵀ. Same algebra as the reference's decay / read / update / read sequence.
LILY_AVX512 void gdn_step(float* S, const float* q, const float* k, const float* v, float alpha, float beta,
                          float* out, int dk, int dv, int ldS) {
  alignas(64) float kv[512], oq[512];
  if (dv % 16 != 0 || dv > 512) {
    scalar_table().gdn_step(S, q, k, v, alpha, beta, out, dk, dv, ldS);
    return;
  }
  int j0 = 0;
  for (; j0 + 64 <= dv; j0 += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < dk; ++i) {
      const float* Si = S + size_t(i) * ldS + j0;
      const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
      const __m512 s0 = _mm512_loadu_ps(Si), s1 = _mm512_loadu_ps(Si + 16), s2 = _mm512_loadu_ps(Si + 32),
                   s3 = _mm512_loadu_ps(Si + 48);
      a0 = _mm512_fmadd_ps(s0, ki, a0), a1 = _mm512_fmadd_ps(s1, ki, a1);
      a2 = _mm512_fmadd_ps(s2, ki, a2), a3 = _mm512_fmadd_ps(s3, ki, a3);
      b0 = _mm512_fmadd_ps(s0, qi, b0), b1 = _mm512_fmadd_ps(s1, qi, b1);
      b2 = _mm512_fmadd_ps(s2, qi, b2), b3 = _mm512_fmadd_ps(s3, qi, b3);
    }
    _mm512_store_ps(kv + j0, a0), _mm512_store_ps(kv + j0 + 16, a1);
    _mm512_store_ps(kv + j0 + 32, a2), _mm512_store_ps(kv + j0 + 48, a3);
    _mm512_store_ps(oq + j0, b0), _mm512_store_ps(oq + j0 + 16, b1);
    _mm512_store_ps(oq + j0 + 32, b2), _mm512_store_ps(oq + j0 + 48, b3);
  }
  for (; j0 < dv; j0 += 16) {
    __m512 a0 = _mm512_setzero_ps(), b0 = a0;
    for (int i = 0; i < dk; ++i) {
      const __m512 s0 = _mm512_loadu_ps(S + size_t(i) * ldS + j0);
      a0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(k[i]), a0);
      b0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(q[i]), b0);
    }
    _mm512_store_ps(kv + j0, a0), _mm512_store_ps(oq + j0, b0);
  }
  const float kq = dot512(k, q, dk);
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta), kqv = _mm512_set1_ps(kq);
  for (int j = 0; j < dv; j += 16) {
    const __m512 delta = _mm512_mul_ps(be, _mm512_fnmadd_ps(al, _mm512_load_ps(kv + j), _mm512_loadu_ps(v + j)));
    _mm512_store_ps(kv + j, delta);
    _mm512_storeu_ps(out + j, _mm512_fmadd_ps(al, _mm512_load_ps(oq + j), _mm512_mul_ps(kqv, delta)));
  }
  for (int i = 0; i < dk; ++i) {
    float* Si = S + size_t(i) * ldS;
    const __m512 ki = _mm512_set1_ps(k[i]);
    for (int j = 0; j < dv; j += 16)
      _mm512_storeu_ps(Si + j, _mm512_fmadd_ps(al, _mm512_loadu_ps(Si + j), _mm512_mul_ps(ki, _mm512_load_ps(kv + j))));
  }
}

}  // namespace

const KernelTable* avx512_table() {
  static const KernelTable t{"avx512-vnni", q4_rows, q4_gemm_avx512, q8_rows, dot, axpy, gdn_step,
                             gdn_chunk_avx512, conv4_silu_avx512, gated_norm_avx512, silu_mul_avx512,
                             rmsnorm_avx512};
  return &t;
}

}  // namespace lily::cpu::fast
