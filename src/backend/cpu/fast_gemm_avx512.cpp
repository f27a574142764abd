// AVX-512 prefill GEMM for 4-bit weights with fp32 activations: a panel of 32 rows is dequantized
// once (w = fma(scale, q, bias), exact fp32 per weight) into a k-major buffer wt[K][32] (rows in
// lanes), then every block of up to 12 tokens runs 24 accumulators of broadcast-x FMAs over it
// (fast_gemm_impl.inc, shared with AVX2). No activation quantization and no per-group work in the
// inner loop: 16 MACs per instruction. Jobs of few tokens go to fast_gemm_thin_avx512.cpp.
#include "backend/cpu/fast_avx512.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "backend/cpu/fast_buf.h"
#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx512.inc"
using V = Avx512;

constexpr int kPanel = 32;  // rows per panel (2 zmm)
constexpr int kTok = 12;    // tokens per register block

// wt[k·32 + lane] = scale·q + bias of row r+lane at column k (lanes ≥ nr: 0). Codes come in by a
// masked gather of one u32 word from each of 16 rows, which yields 8 columns per gather.
LILY_TGT void dequant_panel(const QWeight& w, int r, int nr, float* wt) {
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 m[2];
  __m512i off[2];
  for (int j = 0; j < 2; ++j) {
    m[j] = V::mask(nr - 16 * j);
    off[j] = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * j)), _mm512_set1_epi32(wpr));
  }
  // The panel's scales and biases in fp32, row-major [32][G] (vector bf16 conversion), read per group
  // by a gather with stride G.
  thread_local AlignedBuf<float> sbuf;
  float* rs = sbuf.get(size_t(2) * kPanel * G);
  float* rb = rs + size_t(kPanel) * G;
  for (int l = 0; l < nr; ++l)
    for (int g0 = 0; g0 < G; g0 += 16) {
      const __mmask16 mg = V::mask(G - g0);
      _mm512_mask_storeu_ps(rs + size_t(l) * G + g0, mg, V::load_bf16(mg, w.scales + size_t(r + l) * G + g0));
      _mm512_mask_storeu_ps(rb + size_t(l) * G + g0, mg, V::load_bf16(mg, w.biases + size_t(r + l) * G + g0));
    }
  __m512i soff[2];
  for (int j = 0; j < 2; ++j) soff[j] = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * j)), _mm512_set1_epi32(G));
  for (int g = 0; g < G; ++g) {
    // The gathers touch 32 rows' lines at once, which the hardware prefetchers do not follow:
    // fetch each row's codes 8 groups (4 lines) ahead, one line per two groups.
    if ((g & 1) == 0 && g + 8 < G)
      for (int l = 0; l < nr; ++l) _mm_prefetch(reinterpret_cast<const char*>(w.codes + size_t(r + l) * wpr + size_t(g + 8) * 8), _MM_HINT_T0);
    const uint32_t* base = w.codes + size_t(r) * wpr + size_t(g) * 8;
    for (int j = 0; j < 2; ++j) {
      if (!m[j]) {
        for (int c = 0; c < kGroup; ++c) _mm512_store_ps(wt + size_t(g * kGroup + c) * kPanel + 16 * j, _mm512_setzero_ps());
        continue;
      }
      const __m512 s = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m[j], soff[j], rs + g, 4);
      const __m512 b = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m[j], soff[j], rb + g, 4);
      for (int kw = 0; kw < 8; ++kw) {
        const __m512i c = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m[j], off[j], base + kw, 4);
        float* dst = wt + size_t(g * kGroup + kw * 8) * kPanel + 16 * j;
        // float(q) by a permute of {0, 1, ..., 15}: vpermps reads only the low 4 bits of each index,
        // so the nibble needs no mask and no int→float conversion.
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const __m512 q = _mm512_permutexvar_ps(n ? _mm512_srli_epi32(c, 4 * n) : c, iota);
          _mm512_store_ps(dst + n * kPanel, _mm512_fmadd_ps(s, q, b));
        }
      }
    }
  }
}

#include "backend/cpu/fast_gemm_impl.inc"

}  // namespace

// Jobs of up to 12 tokens take the thin kernel (measured at 1 thread on 256 random experts, K = 2048:
// 57 vs 42 GMAC/s at 8 tokens, 51 vs 47 at 11, 49 vs 49 at 12; K = 512: 53 vs 39 at 12).
LILY_TGT void q4_gemm_avx512(const QArgs& a) {
  if (a.n <= kThinMaxTokens) {
    q4_gemm_thin_avx512(a);
    return;
  }
  q4_gemm_panels(a);
}

}  // namespace lily::cpu::fast
