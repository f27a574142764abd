// xpack16: fp32 activation rows → qgemm's fp16 rows with per-group {Σx, 2^-e} (pack16.cuh): a group per
// warp, 8 groups of a row per block (grid: rows × ⌈K/512⌉; a row per block left most SMs idle at 16 rows).
// xpack16_swiglu: the same of silu(gate)·up from [gate | up] rows (the shared expert outside the routing
// table, the value qgemm's SwiGLU epilogue packs).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/pack16.cuh"
#include "backend/cuda/gemm/qgemm.h"

namespace lily::cuda {
namespace {

template <bool SWIGLU>
__global__ void __launch_bounds__(256) xpack16_kernel(const float* x, int ldx, int K, uint16_t* X, float* XS, uint16_t* Xlo) {
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.x, G = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (G >= K / 64) return;
  const float* xg = x + size_t(r) * ldx + 64 * G + 8 * (lane >> 2) + (lane & 3);
  float v0 = xg[0], v1 = xg[4];
  if constexpr (SWIGLU) v0 = silu(v0) * xg[K], v1 = silu(v1) * xg[K + 4];
  pack16_group(v0, v1, reinterpret_cast<__half2*>(X + size_t(r) * K + 64 * G),
               reinterpret_cast<float2*>(XS + size_t(r) * (K / 64) * 2) + G,
               reinterpret_cast<__half2*>(Xlo + size_t(r) * K + 64 * G));
}

// Rows of ldx floats holding K values (2K under SWIGLU: gate then up).
template <bool SWIGLU>
Status pack_launch(const char* name, const float* x, int ldx, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s) {
  if (K <= 0 || K % 64 != 0 || ldx < (SWIGLU ? 2 * K : K) || ldx % 2 != 0 || R < 1 || !x || !X || !XS || !Xlo)
    return cu_err("{}: K={} ldx={} R={} unsupported", name, K, ldx, R);
  return launch_k(name, xpack16_kernel<SWIGLU>, dim3(R, (K / 64 + 7) / 8), dim3(256), 0, static_cast<cudaStream_t>(s), x, ldx,
                  K, X, XS, Xlo);
}

}  // namespace

Status xpack16(const float* x, int ldx, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s) {
  return pack_launch<false>("xpack16", x, ldx, K, R, X, XS, Xlo, s);
}

Status xpack16_swiglu(const float* gu, int ld, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s) {
  return pack_launch<true>("xpack16_swiglu", gu, ld, K, R, X, XS, Xlo, s);
}

}  // namespace lily::cuda
