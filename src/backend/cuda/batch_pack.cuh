// One packing unit of the batched tensor-core GEMM's B operand (batch_tc*.cu): 4 fp32 values of a row's
// 64-group → fp16 hi + lo of x·2^e in MMA fragment order, the group's 2^e and Σx by half-warp butterflies.
// Shared by bpack / bnorm_pack (batch_tc_aux.cu) and the expert kernel's epilogue (batch_tc_stream.cu),
// so every producer packs a row bit-identically.
#pragma once
#include <cuda_fp16.h>

namespace lily::cuda {

__device__ __forceinline__ uint32_t bpk_h2(__half a, __half b) {
  __half2 h = __halves2half2(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Unit u of a row (G = u / 16, k-step s = (u / 4) % 4, quad t = u % 4) holds the values at phys positions
// base, base+4 (b0) and base+1, base+5 (b1), base = 64G + 8(2t + s/2) + 2(s%2); v0..v3 are those four
// (zero when !ok). The 16 units of a group must be 16 consecutive lanes of one half-warp, and every lane
// of the warp must call (the butterflies use the full mask). Writes P[u] and, for u % 16 == 0, XS[G].
__device__ __forceinline__ void pack_unit(float v0, float v1, float v2, float v3, bool ok, int u, uint4* P, float2* XS) {
  float m = fmaxf(fmaxf(fabsf(v0), fabsf(v1)), fmaxf(fabsf(v2), fabsf(v3)));
  float sum = (v0 + v2) + (v1 + v3);
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  if (!ok) return;
  int E = 0;
  frexpf(m, &E);
  int e = m > 0.f ? 15 - E : 0;  // largest |x|·2^e in [2^14, 2^15)
  e = e < -120 ? -120 : e > 120 ? 120 : e;
  const float sc = ldexpf(1.f, e);
  const float xs[4] = {v0 * sc, v1 * sc, v2 * sc, v3 * sc};
  __half hi[4], lo[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    hi[i] = __float2half_rn(xs[i]);
    lo[i] = __float2half_rn(xs[i] - __half2float(hi[i]));
  }
  P[u] = make_uint4(bpk_h2(hi[0], hi[1]), bpk_h2(hi[2], hi[3]), bpk_h2(lo[0], lo[1]), bpk_h2(lo[2], lo[3]));
  if ((u & 15) == 0) XS[u >> 4] = make_float2(sum, ldexpf(1.f, -e));
}
// Phys position of value 0 of unit u (values at +0, +4, +1, +5).
__device__ __forceinline__ int pack_base(int u) {
  const int G = u >> 4, s = (u >> 2) & 3, t = u & 3;
  return 64 * G + 8 * (2 * t + (s >> 1)) + 2 * (s & 1);
}

}  // namespace lily::cuda
