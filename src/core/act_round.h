// The one rounding of GEMM activations that every CUDA path shares (../shared/docs/precision.md,
// issue 24): each activation entering a 4- or 8-bit weight product is rounded to 11 significant
// bits (fp16's mantissa), round to nearest even, at any exponent; the bias term's Σx takes the
// unrounded values. The batch-1 decode kernels round as they stage x (limbs or fp32), the batched
// step's qgemm and the prefill GEMMs hold the same values as fp16 (x·2^e per 64-group, or plain fp16
// in range), so a row gets the same products on every path and its logits differ between paths by
// fp32 summation order only. The CPU reference rounds likewise when asked (cpu::set_round_gemm_inputs),
// so kernels are compared with a reference that rounds where they do.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LILY_ACT_HD __host__ __device__ __forceinline__
#else
#define LILY_ACT_HD inline
#endif

namespace lily {

// x to 11 significant bits, ties to even (NaN and ±inf unchanged). For |x| in fp16's normal range
// this is exactly float(half(x)).
LILY_ACT_HD float round_act(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) != 0x7F800000u) {
    u += 0x0FFFu + ((u >> 13) & 1u);
    u &= 0xFFFFE000u;
  }
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

}  // namespace lily
