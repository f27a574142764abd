// AVX2 prefill GEMM for 4-bit weights with fp32 activations (see fast_gemm.h): panels of 16 rows
// dequantized once into wt[K][16] (rows in lanes, exact fp32), blocks of up to 6 tokens with 12
// ymm accumulators of broadcast-x FMAs (fast_gemm_impl.inc, shared with AVX-512).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/cpu/fast_buf.h"
#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx2,fma,bmi2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx2.inc"
using V = Avx2;

constexpr int kPanel = 16;  // rows per panel (2 ymm)
constexpr int kTok = 6;     // tokens per register block

// wt[k·16 + lane] = scale·q + bias of row r+lane at column k (lanes ≥ nr: 0).
LILY_TGT void dequant_panel(const QWeight& w, int r, int nr, float* wt) {
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i nib = _mm256_set1_epi32(0xF);
  __m256i m[2], off[2];
  for (int j = 0; j < 2; ++j) {
    m[j] = V::mask(nr - 8 * j);
    off[j] = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8 * j)), _mm256_set1_epi32(wpr));
  }
  alignas(32) float sc[kPanel], bi[kPanel];
  for (int g = 0; g < G; ++g) {
    // The gathers touch 32 rows' lines at once, which the hardware prefetchers do not follow:
    // fetch each row's codes 8 groups (4 lines) ahead, one line per two groups.
    if ((g & 1) == 0 && g + 8 < G)
      for (int l = 0; l < nr; ++l) _mm_prefetch(reinterpret_cast<const char*>(w.codes + size_t(r + l) * wpr + size_t(g + 8) * 8), _MM_HINT_T0);
    for (int l = 0; l < kPanel; ++l) {
      sc[l] = l < nr ? bf16_to_f32(w.scales[size_t(r + l) * G + g]) : 0.0f;
      bi[l] = l < nr ? bf16_to_f32(w.biases[size_t(r + l) * G + g]) : 0.0f;
    }
    const int* base = reinterpret_cast<const int*>(w.codes + size_t(r) * wpr + size_t(g) * 8);
    for (int j = 0; j < 2; ++j) {
      const __m256 s = _mm256_load_ps(sc + 8 * j), b = _mm256_load_ps(bi + 8 * j);
      for (int kw = 0; kw < 8; ++kw) {
        const __m256i c = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base + kw, off[j], m[j], 4);
        float* dst = wt + size_t(g * kGroup + kw * 8) * kPanel + 8 * j;
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(c, 4 * n), nib));
          _mm256_store_ps(dst + n * kPanel, _mm256_fmadd_ps(s, q, b));
        }
      }
    }
  }
}

#include "backend/cpu/fast_gemm_impl.inc"

}  // namespace

LILY_TGT void q4_gemm_avx2(const QArgs& a) { q4_gemm_panels(a); }

}  // namespace lily::cpu::fast
