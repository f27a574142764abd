// Packing of activation rows for qgemm (qgemm.h): one 64-group per warp. Lane l holds the values
// 8c + i and 8c + i + 4 (c = l / 4, i = l % 4), which the layout stores side by side at 8c + 2i (the
// order qgemm's 4-bit codes come in: [x0,x4,x1,x5,x2,x6,x3,x7] per 8 values). The group's largest |x|
// picks e (largest |x|·2^e in [2^14, 2^15)), Σx is a fixed butterfly over the warp (deterministic),
// and x·2^e is rounded to fp16. Shared by xpack16 and bnorm_pack so every producer packs a row the
// same way.
#pragma once
#include <cuda_fp16.h>

namespace lily::cuda {

// X: the group's 64 fp16 values in the stored order (lane l writes positions 2l, 2l+1); XS: {Σx, 2^-e}
// (lane 0); Xlo: the fp16 remainders x·2^e − X (with X, ~22 bits of every x). Every lane calls.
__device__ __forceinline__ void pack16_group(float v0, float v1, __half2* X, float2* XS, __half2* Xlo) {
  float m = fmaxf(fabsf(v0), fabsf(v1)), s = v0 + v1;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  int E = 0;
  frexpf(m, &E);
  int e = m > 0.f ? 15 - E : 0;
  e = e < -120 ? -120 : e > 120 ? 120 : e;
  const float sc = ldexpf(1.f, e);
  const int lane = threadIdx.x & 31;
  const __half2 h = __floats2half2_rn(v0 * sc, v1 * sc);
  X[lane] = h;
  Xlo[lane] = __floats2half2_rn(v0 * sc - __low2float(h), v1 * sc - __high2float(h));
  if (lane == 0) *XS = make_float2(s, ldexpf(1.f, -e));
}

// A row of K values (K a multiple of 64; x in global or shared memory) by the block's warps, group
// by group.
__device__ __forceinline__ void pack16_row(const float* x, int K, uint16_t* X, float* XS, uint16_t* Xlo) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int G = warp; G < K / 64; G += nw) {
    const float* xg = x + 64 * G + 8 * (lane >> 2) + (lane & 3);
    pack16_group(xg[0], xg[4], reinterpret_cast<__half2*>(X + 64 * G), reinterpret_cast<float2*>(XS) + G,
                 reinterpret_cast<__half2*>(Xlo + 64 * G));
  }
}

}  // namespace lily::cuda
