// The quantized tensor-core GEMMs' device helpers (gemm/qgemm.cu, moe/xgemm.cu), beside common/mma_sync.cuh's
// copies and MMA: the f16 MMA by fragment registers, the exact conversion of 4-bit (and 8-bit) MLX codes into
// fp16 integer pairs in the k order the activation packers use (gemm/qgemm.h: qgemm_xpos), the items' unit
// lookup, and the SwiGLU epilogue's packing of its output rows.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common/mma_sync.cuh"

namespace lily::cuda::q4 {

__device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma_f16(c, a, b0, b1);
}
__device__ __forceinline__ uint32_t lop_or(uint32_t a, uint32_t m, uint32_t c) {  // (a & m) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(m), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
// 4-bit word → two fp16 pairs of exact integers: p = 0: (n0, n4), (n1, n5); p = 1: (n2, n6), (n3, n7).
__device__ __forceinline__ void cvt4(uint32_t w, int p, uint32_t& lo, uint32_t& hi) {
  const uint32_t v = p ? w >> 8 : w;
  const uint32_t a = lop_or(v, 0x000F000Fu, 0x64006400u), b = lop_or(v, 0x00F000F0u, 0x64006400u);
  lo = h2u(__hsub2(u2h(a), u2h(0x64006400u)));                     // 1024 + n − 1024
  hi = h2u(__hfma2(u2h(b), u2h(0x2C002C00u), u2h(0xD400D400u)));   // (1024 + 16n)/16 − 64
}
// Nibbles n and n + 4 of a code word (v = word >> 4n; only bits 0..3 and 16..19 are read) → half2 of the
// exact integers: the A fragment pair of the wgmma tile (qgemm_wg.cu).
__device__ __forceinline__ uint32_t nib2h(uint32_t v) {
  return h2u(__hsub2(u2h(lop_or(v, 0x000F000Fu, 0x64006400u)), u2h(0x64006400u)));
}
// 8-bit word (b0..b3) → (b0, b2), (b1, b3).
__device__ __forceinline__ void cvt8(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = h2u(__hsub2(u2h(lop_or(w, 0x00FF00FFu, 0x64006400u)), u2h(0x64006400u)));
  hi = h2u(__hsub2(u2h(lop_or(w >> 8, 0x00FF00FFu, 0x64006400u)), u2h(0x64006400u)));
}

// Items (expert-major units): the item of unit u, pu[i] the units before item i, by binary search over n items.
__device__ __forceinline__ int item_of(const int* pu, int n, int u) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (pu[mid] <= u) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The SwiGLU epilogue's per-row packing (gemm/qgemm.h's activation form) of activation row m, from the
// nw warps' {max |act|, Σ act} of the row in red[q·BM + m] (q in order): the scale 2^e that puts the row's
// largest |act| in [2^14, 2^15) (e within ±120) to *scale; returns {Σ act, 2^-e}.
__device__ __forceinline__ float2 swiglu_row_scale(const float2* red, int nw, int BM, int m, float* scale) {
  float mx = 0.f, sum = 0.f;
  for (int q = 0; q < nw; ++q) mx = fmaxf(mx, red[q * BM + m].x), sum += red[q * BM + m].y;
  int E2 = 0;
  frexpf(mx, &E2);
  int e = mx > 0.f ? 15 - E2 : 0;
  e = e < -120 ? -120 : e > 120 ? 120 : e;
  *scale = ldexpf(1.f, e);
  return make_float2(sum, ldexpf(1.f, -e));
}
// v (already scaled) as fp16 at hi[i] and its remainder at lo[i] (the two-pass form of qgemm.h).
__device__ __forceinline__ void put_act(uint16_t* hi, uint16_t* lo, size_t i, float v) {
  const __half h = __float2half_rn(v);
  hi[i] = *reinterpret_cast<const uint16_t*>(&h);
  const __half l = __float2half_rn(v - __half2float(h));
  lo[i] = *reinterpret_cast<const uint16_t*>(&l);
}

}  // namespace lily::cuda::q4
