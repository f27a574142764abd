// The DeltaNet prefill kernels of fast_gdn_impl.inc on AVX-512F (16 lanes; GEMM blocks of 6 rows x
// 64 columns = 24 zmm accumulators), with a vector expf (fast_vec_avx512.inc, vscalefps).
#include "backend/cpu/fast_avx512.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cpu/fast_gdn_kernels.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx512f,avx512dq,avx512vl,fma,avx2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx512.inc"

struct V : Avx512 {
  static constexpr int NV = 4, MR = 6;  // GEMM blocks of 6 rows x 64 columns: 24 zmm accumulators
};

#include "backend/cpu/fast_gdn_impl.inc"

#define LILY_TGT_BW __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2")))

// One token (decode): conv4_silu_impl's arithmetic, with the [C, 4] taps and the [C, 3] window of 16
// channels deinterleaved and the window advanced by permutes instead of 112 scalar moves.
// Index tables of conv4_silu_one, built once.
struct Conv1Tables {
  alignas(64) int16_t tap[4][32] = {};  // tap t of channel l: word 4l + t of the 16 channels' [16, 4] taps
  alignas(64) int32_t win[3][16];       // slot t of channel l: 3l + t of the [16, 3] window (0..47)
  alignas(64) int32_t x[3][16];         // advanced window, vector k, lane j: the channel (16k + j) / 3
  __mmask16 xpos[3] = {0, 0, 0};        // ... and the lanes that take the new input: (16k + j) % 3 == 2
  Conv1Tables() {
    for (int l = 0; l < 16; ++l) {
      for (int t = 0; t < 4; ++t) tap[t][l] = int16_t(4 * l + t);
      for (int t = 0; t < 3; ++t) win[t][l] = 3 * l + t;
    }
    for (int k = 0; k < 3; ++k)
      for (int j = 0; j < 16; ++j) {
        x[k][j] = (16 * k + j) / 3;
        if ((16 * k + j) % 3 == 2) xpos[k] |= __mmask16(1u << j);
      }
  }
};

LILY_TGT_BW void conv4_silu_one(const float* u, int c0, int c1, const bf16* w, float* window, float* out) {
  static const Conv1Tables tb;
  __m512i tap_idx[4], win_idx[3], x_idx[3];
  for (int t = 0; t < 4; ++t) tap_idx[t] = _mm512_load_si512(tb.tap[t]);
  for (int t = 0; t < 3; ++t) win_idx[t] = _mm512_load_si512(tb.win[t]);  // below 32 from (W0, W1), else W2
  for (int k = 0; k < 3; ++k) x_idx[k] = _mm512_load_si512(tb.x[k]);
  const __mmask16* xpos = tb.xpos;
  const __m512i k32 = _mm512_set1_epi32(32);
  int ch = c0;
  for (; ch + 16 <= c1; ch += 16) {
    const __m512i wa = _mm512_loadu_si512(w + size_t(ch) * 4), wb = _mm512_loadu_si512(w + size_t(ch) * 4 + 32);
    __m512 wt[4];
    for (int t = 0; t < 4; ++t) {
      const __m256i b = _mm512_castsi512_si256(_mm512_permutex2var_epi16(wa, tap_idx[t], wb));
      wt[t] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    float* win = window + size_t(ch) * 3;
    const __m512 W0 = _mm512_loadu_ps(win), W1 = _mm512_loadu_ps(win + 16), W2 = _mm512_loadu_ps(win + 32);
    __m512 h[3];
    for (int t = 0; t < 3; ++t) {
      const __m512 lo = _mm512_permutex2var_ps(W0, win_idx[t], W1);
      const __mmask16 hi = _mm512_cmpge_epi32_mask(win_idx[t], k32);
      h[t] = _mm512_mask_permutexvar_ps(lo, hi, _mm512_sub_epi32(win_idx[t], k32), W2);
    }
    const __m512 x = _mm512_loadu_ps(u + ch);
    const __m512 sv = _mm512_fmadd_ps(wt[3], x, _mm512_fmadd_ps(wt[2], h[2], _mm512_fmadd_ps(wt[1], h[1], _mm512_mul_ps(wt[0], h[0]))));
    _mm512_storeu_ps(out + ch, silu_v(sv));
    // Advanced window: each channel's (h1, h2, x), i.e. the old window one slot on, every third slot x.
    const __m512 n0 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(W1), _mm512_castps_si512(W0), 1));
    const __m512 n1 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(W2), _mm512_castps_si512(W1), 1));
    const __m512 n2 = _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(W2), _mm512_castps_si512(W2), 1));
    _mm512_storeu_ps(win, _mm512_mask_permutexvar_ps(n0, xpos[0], x_idx[0], x));
    _mm512_storeu_ps(win + 16, _mm512_mask_permutexvar_ps(n1, xpos[1], x_idx[1], x));
    _mm512_storeu_ps(win + 32, _mm512_mask_permutexvar_ps(n2, xpos[2], x_idx[2], x));
  }
  if (ch < c1) conv4_silu_impl(u, 1, 0, ch, c1, 0, w, window, out);
}

// conv4_silu_impl, one token (decode) through conv4_silu_one.
LILY_TGT void conv4_silu(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window,
                         float* out) {
  if (M == 1) return conv4_silu_one(u, c0, c1, w, window, out);
  conv4_silu_impl(u, M, ldu, c0, c1, C, w, window, out);
}

}  // namespace

constinit const GdnKernels kGdnAvx512{gdn_chunk_impl, conv4_silu, gated_norm_impl, silu_mul_impl, rmsnorm_impl, attend_impl};

}  // namespace lily::cpu::fast
