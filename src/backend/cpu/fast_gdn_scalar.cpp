// The DeltaNet prefill kernels of fast_gdn_impl.inc on plain floats (one lane): the fallback of
// CPUs without AVX2, and a third, independent instantiation for the tests.
#include <algorithm>
#include <cmath>

#include "backend/cpu/fast_gdn_kernels.h"
#include "core/bf16.h"

#define LILY_TGT

namespace lily::cpu::fast {
namespace {

struct V {
  using T = float;
  static constexpr int W = 1, NV = 4, MR = 4;
  static T zero() { return 0.0f; }
  static T set1(float x) { return x; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T min(T a, T b) { return std::min(a, b); }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T exp(T x) { return std::exp(x); }
  static float hsum(T x) { return x; }
};

#include "backend/cpu/fast_gdn_impl.inc"

}  // namespace

void gdn_chunk_scalar(const GdnChunkArgs& a) { gdn_chunk_impl(a); }
void conv4_silu_scalar(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window, float* out) {
  conv4_silu_impl(u, M, ldu, c0, c1, C, w, window, out);
}
void gated_norm_scalar(float* o, const float* z, const bf16* w, int rows, int dv, float eps) {
  gated_norm_impl(o, z, w, rows, dv, eps);
}
void silu_mul_scalar(float* g, const float* u, size_t n) { silu_mul_impl(g, u, n); }
void rmsnorm_scalar(const float* x, int rows, int n, const float* gain, float eps, float* out) {
  rmsnorm_impl(x, rows, n, gain, eps, out);
}

}  // namespace lily::cpu::fast
