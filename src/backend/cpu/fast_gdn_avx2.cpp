// The DeltaNet prefill kernels of fast_gdn_impl.inc on AVX2 + FMA (8 lanes; GEMM blocks of 4 rows
// x 16 columns, which fit the 16 ymm registers), with a vector expf (Cephes polynomial, ~1 ulp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/fast_gdn_kernels.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx2,fma")))

namespace lily::cpu::fast {
namespace {

struct V {
  using T = __m256;
  static constexpr int W = 8, NV = 2, MR = 4;
  LILY_TGT static inline T zero() { return _mm256_setzero_ps(); }
  LILY_TGT static inline T set1(float x) { return _mm256_set1_ps(x); }
  LILY_TGT static inline T load(const float* p) { return _mm256_loadu_ps(p); }
  LILY_TGT static inline void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  LILY_TGT static inline T add(T a, T b) { return _mm256_add_ps(a, b); }
  LILY_TGT static inline T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  LILY_TGT static inline T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  LILY_TGT static inline T div(T a, T b) { return _mm256_div_ps(a, b); }
  LILY_TGT static inline T min(T a, T b) { return _mm256_min_ps(a, b); }
  LILY_TGT static inline T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  LILY_TGT static inline float hsum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // e^x: x = n·ln2 + r, |r| ≤ ln2/2, Cephes' degree-7 polynomial for e^r, 2^n built in the exponent
  // field; x < −87.3 gives 0, x > 88.3 is clamped (not reached by the callers).
  LILY_TGT static inline T exp(T x0) {
    const T x = _mm256_max_ps(_mm256_min_ps(x0, set1(88.3f)), set1(-87.3f));
    const T n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    T p = set1(1.9875691500e-4f);
    p = fmadd(p, r, set1(1.3981999507e-3f));
    p = fmadd(p, r, set1(8.3334519073e-3f));
    p = fmadd(p, r, set1(4.1665795894e-2f));
    p = fmadd(p, r, set1(1.6666665459e-1f));
    p = fmadd(p, r, set1(5.0000001201e-1f));
    p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const T y = mul(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x0, set1(-87.3f), _CMP_LT_OQ), y);
  }
};

#include "backend/cpu/fast_gdn_impl.inc"

}  // namespace

LILY_TGT void gdn_chunk_avx2(const GdnChunkArgs& a) { gdn_chunk_impl(a); }
LILY_TGT void conv4_silu_avx2(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window,
                              float* out) {
  conv4_silu_impl(u, M, ldu, c0, c1, C, w, window, out);
}
LILY_TGT void gated_norm_avx2(float* o, const float* z, const bf16* w, int rows, int dv, float eps) {
  gated_norm_impl(o, z, w, rows, dv, eps);
}
LILY_TGT void silu_mul_avx2(float* g, const float* u, size_t n) { silu_mul_impl(g, u, n); }
LILY_TGT void rmsnorm_avx2(const float* x, int rows, int n, const float* gain, float eps, float* out) {
  rmsnorm_impl(x, rows, n, gain, eps, out);
}

}  // namespace lily::cpu::fast
