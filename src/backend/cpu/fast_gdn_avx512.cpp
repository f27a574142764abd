// The DeltaNet prefill kernels of fast_gdn_impl.inc on AVX-512F (16 lanes; GEMM blocks of 6 rows x
// 64 columns = 24 zmm accumulators), with a vector expf (Cephes polynomial, ~1 ulp, vscalefps).
// GCC 12's avx512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* helpers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only (clang has no such group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/fast_gdn_kernels.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx512f,avx512dq,avx512vl,fma,avx2")))

namespace lily::cpu::fast {
namespace {

struct V {
  using T = __m512;
  static constexpr int W = 16, NV = 4, MR = 6;
  LILY_TGT static inline T zero() { return _mm512_setzero_ps(); }
  LILY_TGT static inline T set1(float x) { return _mm512_set1_ps(x); }
  LILY_TGT static inline T load(const float* p) { return _mm512_loadu_ps(p); }
  LILY_TGT static inline void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  LILY_TGT static inline T add(T a, T b) { return _mm512_add_ps(a, b); }
  LILY_TGT static inline T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  LILY_TGT static inline T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  LILY_TGT static inline T div(T a, T b) { return _mm512_div_ps(a, b); }
  LILY_TGT static inline T min(T a, T b) { return _mm512_min_ps(a, b); }
  LILY_TGT static inline T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  LILY_TGT static inline float hsum(T v) { return _mm512_reduce_add_ps(v); }
  // e^x: x = n·ln2 + r, |r| ≤ ln2/2, Cephes' degree-7 polynomial for e^r, times 2^n by vscalefps
  // (which underflows to 0 below −104 and needs no exponent-field arithmetic).
  LILY_TGT static inline T exp(T x0) {
    const T x = _mm512_max_ps(_mm512_min_ps(x0, set1(88.3f)), set1(-104.0f));
    const T n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    T p = set1(1.9875691500e-4f);
    p = fmadd(p, r, set1(1.3981999507e-3f));
    p = fmadd(p, r, set1(8.3334519073e-3f));
    p = fmadd(p, r, set1(4.1665795894e-2f));
    p = fmadd(p, r, set1(1.6666665459e-1f));
    p = fmadd(p, r, set1(5.0000001201e-1f));
    p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
};

#include "backend/cpu/fast_gdn_impl.inc"

}  // namespace

LILY_TGT void gdn_chunk_avx512(const GdnChunkArgs& a) { gdn_chunk_impl(a); }
LILY_TGT void conv4_silu_avx512(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window,
                                float* out) {
  conv4_silu_impl(u, M, ldu, c0, c1, C, w, window, out);
}
LILY_TGT void gated_norm_avx512(float* o, const float* z, const bf16* w, int rows, int dv, float eps) {
  gated_norm_impl(o, z, w, rows, dv, eps);
}
LILY_TGT void silu_mul_avx512(float* g, const float* u, size_t n) { silu_mul_impl(g, u, n); }
LILY_TGT void rmsnorm_avx512(const float* x, int rows, int n, const float* gain, float eps, float* out) {
  rmsnorm_impl(x, rows, n, gain, eps, out);
}

}  // namespace lily::cpu::fast
