// What the two prefill flash-attention kernels share (attn_wg.cu's split-operand kernel, attn_wg16.cuh's
// single pass): the P·V wgmma by head dim and operand type, the epilogue from the accumulator fragments
// to the output rows.
#pragma once
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/wgmma_util.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {

// O[64×HD] += P[64×16] (registers, the A fragment) · Vᵀ tile (smem desc): fp16 operands (F16) or bf16.
template <int HD, bool F16> __device__ __forceinline__ void pv_mma(float (&o)[HD / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (F16 && HD == 256) wgmma_64x256_rs(o, a, desc, 1);
  else if constexpr (F16 && HD == 128) wgmma_64x128_rs(o, a, desc, 1);
  else if constexpr (F16) wgmma_64x64_rs(o, a, desc, 1);
  else if constexpr (HD == 256) wgmma_bf16_64x256_rs(o, a, desc, 1);
  else if constexpr (HD == 128) wgmma_bf16_64x128_rs(o, a, desc, 1);
  else wgmma_bf16_64x64_rs(o, a, desc, 1);
}

// o: the warpgroup's O fragment (o[4jj + 2hr + e]: row row0 + 8hr, column 8jj + 2t + e), lrow: the thread's
// partial softmax sums of rows row0 and row0 + 8 (summed here over the 4 threads of a row). Writes
// out[m][h·HD + d] = O / l, times sigmoid(gate) when the projection carries one (qw = 2·HD), fp32 or (out16)
// rounded to fp16; rows past the segment's M are skipped.
template <int HD>
__device__ __forceinline__ void flash_store(const AttnPrefillArgs& a, const float (&o)[HD / 2], float (&lrow)[2], int row0, int h, int t) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 1);
    lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 2);
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int m = row0 + 8 * hr;
    if (m >= a.M) continue;
    const float inv = 1.0f / lrow[hr];
    const float* gate = a.qw == 2 * HD ? a.u + size_t(m) * a.ldu + h * a.qw + HD : nullptr;
    const size_t row = size_t(m) * a.nh * HD + h * HD;
#pragma unroll
    for (int jj = 0; jj < HD / 8; ++jj) {
      const int d = jj * 8 + 2 * t;
      float v0 = o[4 * jj + 2 * hr] * inv, v1 = o[4 * jj + 2 * hr + 1] * inv;
      if (gate) v0 *= sigmoid(gate[d]), v1 *= sigmoid(gate[d + 1]);
      if (a.out16) *reinterpret_cast<__half2*>(a.out16 + row + d) = __floats2half2_rn(v0, v1);
      else *reinterpret_cast<float2*>(a.out + row + d) = make_float2(v0, v1);
    }
  }
}

}  // namespace lily::cuda::pf
