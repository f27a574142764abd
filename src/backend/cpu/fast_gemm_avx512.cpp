// AVX-512 prefill GEMM for 4-bit weights with fp32 activations: a panel of 32 rows is dequantized
// once (w = fma(scale, q, bias), exact fp32 per weight) into a k-major buffer wt[K][32] (rows in
// lanes), then every block of up to 12 tokens runs 24 accumulators of broadcast-x FMAs over it.
// No activation quantization and no per-group work in the inner loop: 16 MACs per instruction.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only (clang has no such group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")))

namespace lily::cpu::fast {
namespace {

constexpr int kPanel = 32;  // rows per panel (2 zmm)
constexpr int kTok = 12;    // tokens per register block
constexpr int kKc = 64;     // k chunk of the packed activations (one group)

inline __mmask16 lane_mask(int n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

template <class T>
struct AlignedBuf {
  T* p = nullptr;
  size_t n = 0;
  T* get(size_t want) {
    if (want > n) {
      std::free(p);
      n = want;
      p = static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
    }
    return p;
  }
  ~AlignedBuf() { std::free(p); }
};

// Up to 16 bf16 (mask m) → fp32.
LILY_AVX512 inline __m512 load_bf16x16(__mmask16 m, const bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// wt[k·32 + lane] = scale·q + bias of row r+lane at column k (lanes ≥ nr: 0). Codes come in by a
// masked gather of one u32 word from each of 16 rows, which yields 8 columns per gather.
LILY_AVX512 void dequant_panel(const QWeight& w, int r, int nr, float* wt) {
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 m[2];
  __m512i off[2];
  for (int j = 0; j < 2; ++j) {
    m[j] = lane_mask(nr - 16 * j);
    off[j] = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * j)), _mm512_set1_epi32(wpr));
  }
  // The panel's scales and biases in fp32, row-major [32][G] (vector bf16 conversion), read per group
  // by a gather with stride G.
  thread_local AlignedBuf<float> sbuf;
  float* rs = sbuf.get(size_t(2) * kPanel * G);
  float* rb = rs + size_t(kPanel) * G;
  for (int l = 0; l < nr; ++l)
    for (int g0 = 0; g0 < G; g0 += 16) {
      const __mmask16 mg = lane_mask(G - g0);
      _mm512_mask_storeu_ps(rs + size_t(l) * G + g0, mg, load_bf16x16(mg, w.scales + size_t(r + l) * G + g0));
      _mm512_mask_storeu_ps(rb + size_t(l) * G + g0, mg, load_bf16x16(mg, w.biases + size_t(r + l) * G + g0));
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
        for (int c = 0; c < kKc; ++c) _mm512_store_ps(wt + size_t(g * kKc + c) * kPanel + 16 * j, _mm512_setzero_ps());
        continue;
      }
      const __m512 s = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m[j], soff[j], rs + g, 4);
      const __m512 b = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m[j], soff[j], rb + g, 4);
      for (int kw = 0; kw < 8; ++kw) {
        const __m512i c = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m[j], off[j], base + kw, 4);
        float* dst = wt + size_t(g * kKc + kw * 8) * kPanel + 16 * j;
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

// y rows [r, r+nr) for T tokens: xb is [K/64][T][64] (packed), wt as above.
template <int T>
LILY_AVX512 void tile(const float* wt, const float* xb, int K, float* const* yr, int nr) {
  __m512 a0[T], a1[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) a0[t] = _mm512_setzero_ps(), a1[t] = _mm512_setzero_ps();
  for (int c = 0; c < K; c += kKc) {
    const float* xc = xb + size_t(c) * T;
    const float* wc = wt + size_t(c) * kPanel;
    for (int k = 0; k < kKc; ++k) {
      const __m512 w0 = _mm512_load_ps(wc + k * kPanel), w1 = _mm512_load_ps(wc + k * kPanel + 16);
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_set1_ps(xc[t * kKc + k]);
        a0[t] = _mm512_fmadd_ps(w0, xv, a0[t]);
        a1[t] = _mm512_fmadd_ps(w1, xv, a1[t]);
      }
    }
  }
  const __mmask16 m0 = lane_mask(nr), m1 = lane_mask(nr - 16);
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(yr[t], m0, a0[t]);
    if (m1) _mm512_mask_storeu_ps(yr[t] + 16, m1, a1[t]);
  }
}

LILY_AVX512 void run_tile(int T, const float* wt, const float* xb, int K, float* const* yr, int nr) {
  switch (T) {
    case 12: return tile<12>(wt, xb, K, yr, nr);
    case 11: return tile<11>(wt, xb, K, yr, nr);
    case 10: return tile<10>(wt, xb, K, yr, nr);
    case 9: return tile<9>(wt, xb, K, yr, nr);
    case 8: return tile<8>(wt, xb, K, yr, nr);
    case 7: return tile<7>(wt, xb, K, yr, nr);
    case 6: return tile<6>(wt, xb, K, yr, nr);
    case 5: return tile<5>(wt, xb, K, yr, nr);
    case 4: return tile<4>(wt, xb, K, yr, nr);
    case 3: return tile<3>(wt, xb, K, yr, nr);
    case 2: return tile<2>(wt, xb, K, yr, nr);
    default: return tile<1>(wt, xb, K, yr, nr);
  }
}

// Packs tokens ids[i0..i0+T) of x into xb[K/64][T][64].
LILY_AVX512 void pack_x(const QArgs& a, int i0, int T, int K, float* xb) {
  for (int t = 0; t < T; ++t) {
    const float* x = a.xf + size_t(a.ids[i0 + t]) * a.ldxf;
    for (int c = 0; c < K; c += kKc)
      for (int v = 0; v < kKc; v += 16) _mm512_store_ps(xb + size_t(c) * T + t * kKc + v, _mm512_loadu_ps(x + c + v));
  }
}


}  // namespace

// Jobs of up to 12 tokens take the thin kernel (measured at 1 thread on 256 random experts, K = 2048:
// 57 vs 42 GMAC/s at 8 tokens, 51 vs 47 at 11, 49 vs 49 at 12; K = 512: 53 vs 39 at 12).
LILY_AVX512 void q4_gemm_avx512(const QArgs& a) {
  if (a.n <= kThinMaxTokens) {
    q4_gemm_thin_avx512(a);
    return;
  }
  const QWeight& w = *a.w;
  const int K = w.cols;
  thread_local AlignedBuf<float> wbuf, xbuf;
  float* wt = wbuf.get(size_t(K) * kPanel);
  float* xb = xbuf.get(size_t(K) * kTok);
  float* yr[kTok];
  for (int r = a.r0; r < a.r1; r += kPanel) {
    const int nr = std::min(kPanel, a.r1 - r);
    dequant_panel(w, r, nr, wt);
    for (int i0 = 0; i0 < a.n; i0 += kTok) {
      const int T = std::min(kTok, a.n - i0);
      pack_x(a, i0, T, K, xb);
      for (int t = 0; t < T; ++t) yr[t] = a.y + size_t(i0 + t) * a.ldy + r;
      run_tile(T, wt, xb, K, yr, nr);
    }
  }
}

}  // namespace lily::cpu::fast
