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

constinit const GdnKernels kGdnScalar{gdn_chunk_impl, conv4_silu_impl, gated_norm_impl, silu_mul_impl, rmsnorm_impl, attend_impl};

}  // namespace lily::cpu::fast
