// AVX2 prefill GEMM for 4-bit weights with fp32 activations (see fast_gemm.h): panels of 16 rows
// dequantized once into wt[K][16] (rows in lanes, exact fp32), blocks of up to 6 tokens with 12
// ymm accumulators of broadcast-x FMAs.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"

#define LILY_AVX2 __attribute__((target("avx2,fma,bmi2")))

namespace lily::cpu::fast {
namespace {

constexpr int kPanel = 16;  // rows per panel (2 ymm)
constexpr int kTok = 6;     // tokens per register block
constexpr int kKc = 64;     // k chunk of the packed activations

LILY_AVX2 inline __m256i lane_mask(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);  // lane < n
}

// wt[k·16 + lane] = scale·q + bias of row r+lane at column k (lanes ≥ nr: 0).
LILY_AVX2 void dequant_panel(const QWeight& w, int r, int nr, float* wt) {
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i nib = _mm256_set1_epi32(0xF);
  __m256i m[2], off[2];
  for (int j = 0; j < 2; ++j) {
    m[j] = lane_mask(nr - 8 * j);
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
        float* dst = wt + size_t(g * kKc + kw * 8) * kPanel + 8 * j;
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(c, 4 * n), nib));
          _mm256_store_ps(dst + n * kPanel, _mm256_fmadd_ps(s, q, b));
        }
      }
    }
  }
}

template <int T>
LILY_AVX2 void tile(const float* wt, const float* xb, int K, float* const* yr, int nr) {
  __m256 a0[T], a1[T];
#pragma GCC unroll 6
  for (int t = 0; t < T; ++t) a0[t] = _mm256_setzero_ps(), a1[t] = _mm256_setzero_ps();
  for (int c = 0; c < K; c += kKc) {
    const float* xc = xb + size_t(c) * T;
    const float* wc = wt + size_t(c) * kPanel;
    for (int k = 0; k < kKc; ++k) {
      const __m256 w0 = _mm256_load_ps(wc + k * kPanel), w1 = _mm256_load_ps(wc + k * kPanel + 8);
#pragma GCC unroll 6
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_broadcast_ss(xc + t * kKc + k);
        a0[t] = _mm256_fmadd_ps(w0, xv, a0[t]);
        a1[t] = _mm256_fmadd_ps(w1, xv, a1[t]);
      }
    }
  }
  const __m256i m0 = lane_mask(nr), m1 = lane_mask(nr - 8);
  const bool any1 = nr > 8;
#pragma GCC unroll 6
  for (int t = 0; t < T; ++t) {
    _mm256_maskstore_ps(yr[t], m0, a0[t]);
    if (any1) _mm256_maskstore_ps(yr[t] + 8, m1, a1[t]);
  }
}

LILY_AVX2 void run_tile(int T, const float* wt, const float* xb, int K, float* const* yr, int nr) {
  switch (T) {
    case 6: return tile<6>(wt, xb, K, yr, nr);
    case 5: return tile<5>(wt, xb, K, yr, nr);
    case 4: return tile<4>(wt, xb, K, yr, nr);
    case 3: return tile<3>(wt, xb, K, yr, nr);
    case 2: return tile<2>(wt, xb, K, yr, nr);
    default: return tile<1>(wt, xb, K, yr, nr);
  }
}

LILY_AVX2 void pack_x(const QArgs& a, int i0, int T, int K, float* xb) {
  for (int t = 0; t < T; ++t) {
    const float* x = a.xf + size_t(a.ids[i0 + t]) * a.ldxf;
    for (int c = 0; c < K; c += kKc)
      for (int v = 0; v < kKc; v += 8) _mm256_store_ps(xb + size_t(c) * T + t * kKc + v, _mm256_loadu_ps(x + c + v));
  }
}

struct AlignedBuf {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      n = want;
      p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
    }
    return p;
  }
  ~AlignedBuf() { std::free(p); }
};

}  // namespace

LILY_AVX2 void q4_gemm_avx2(const QArgs& a) {
  const QWeight& w = *a.w;
  const int K = w.cols;
  thread_local AlignedBuf wbuf, xbuf;
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
