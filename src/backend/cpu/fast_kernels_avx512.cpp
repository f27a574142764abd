// AVX-512 (F/BW/VL/DQ + VNNI) kernels, compiled with function-level target attributes so the rest
// of the binary stays baseline x86-64; fast_ops.cpp calls them only when the CPU reports the features.
// 4-bit: one u32 word holds 8 nibbles; a 256-bit load of a group (8 words) broadcast to both halves
// of a zmm, shifted per 16-bit lane by {0|4} and {8|12} and masked, gives the int16 codes in exactly
// the pair order of PreparedX, so two vpdpwssd per group and row give the exact integer dot product.
#include "backend/cpu/fast_avx512.h"

#include <cstdint>
#include <utility>

#include "backend/cpu/fast_gdn_kernels.h"
#include "backend/cpu/fast_gemm.h"

#define LILY_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,avx2,bmi2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx512.inc"
using V = Avx512;

constexpr int kMaxGroups = 256;  // K ≤ 16384; checked by the backend at load
constexpr int kStepColVecs = 4;  // gdn_step's first pass: 64 columns of S at a time (8 zmm accumulators)

// Σ_g a[g]·b[g] over n floats.
LILY_TGT float dot(const float* a, const float* b, int n) {
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
// past the block's end (R·32 bytes a group, so it stays a block and kPrefetchBytes ahead of the
// block's first row). Measured on the full checkpoint, 2 threads, AVX-512 (docs/perf/2026-12-06-cpu-decode.md):
// 1 KiB ahead in every row stream (the earlier scheme, which at K = 2048 prefetched the next row of the
// same block) 10.1 tok/s; linear from the block's start 2 KiB 11.1; with 512 KiB tasks (fast_ops.cpp)
// 12.1 at 2 KiB, 12.9 at 4 KiB, 12.8 at 8 KiB, 12.5 at 16 KiB. From the block's start, a K = 4096 block
// (8 KiB) had its rows 2 and 3 prefetched barely ahead of their reads: past the block's end instead,
// out_proj / o_proj 5.24 → 4.31 ms a token (36 → 44 GB/s) and decode 20.95 → 21.83 tok/s, medians of 9
// alternating runs on the Zen 5 dev VM (docs/perf/2026-12-07-cpu-prefetch.md).
constexpr int kPrefetchBytes = 4096;
// q4_rows (fast_kernels_simd.inc): blocks of 4 rows x 4 tokens, 16 tokens at a time (x of 16 tokens,
// hi + lo, 8 KiB each at K = 2048, stays in L2; the task's codes in L1/L2), the scales and biases
// prefetched 16 rows ahead.
constexpr int kRowBlock = 4, kTokTile = 4, kTokBlock = 16, kParamRowsAhead = 16;

#include "backend/cpu/fast_kernels_simd.inc"

// The horizontal sums of four vectors: {Σa, Σb, Σc, Σd}.
LILY_TGT inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
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
LILY_TGT void q4_block(const QArgs& a, int r, int i0, const float* sb, const float* bb) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i sh23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(8)), _mm256_set1_epi16(12), 1);
  const __m512i nib = _mm512_set1_epi16(0xF);
  const auto [codes, xp, xl, dx] = q4_streams<R, T>(a, r, i0);
  __m512 acc[R][T] = {};
  // Rows r.. are contiguous: the next block starts R·G·32 bytes on.
  const char* ahead = reinterpret_cast<const char*>(codes[0]) + R * G * 32 + kPrefetchBytes;
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
        acc[rr][t] = q4_group_sum(acc[rr][t], s, sl, d, sb[rr * G + g]);
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

LILY_TGT void load_row_params(const QWeight& w, int r, int R, float* sb, float* bb) {
  const int G = w.groups_per_row();
  for (int rr = 0; rr < R; ++rr)
    for (int g = 0; g < G; g += 16) {
      const int n = G - g;
      const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
      _mm512_mask_storeu_ps(sb + rr * G + g, m, V::load_bf16(m, w.scales + size_t(r + rr) * G + g));
      _mm512_mask_storeu_ps(bb + rr * G + g, m, V::load_bf16(m, w.biases + size_t(r + rr) * G + g));
    }
}

LILY_TGT void axpy(float* y, float s, const float* x, int n) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int i = 0; i < n; i += 16) {
    const int r = n - i;
    const __mmask16 m = r >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << r) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

}  // namespace

const KernelTable* avx512_table() {
  static const KernelTable t{kGdnAvx512, "avx512-vnni", q4_rows, q4_gemm_avx512, q8_rows, dot, axpy, gdn_step, fma_flops};
  return &t;
}

}  // namespace lily::cpu::fast
