// xpack16: fp32 activation rows → qgemm's fp16 rows with per-group {Σx, 2^-e} (pack16.cuh), one row
// per block.
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/pack16.cuh"
#include "backend/cuda/gemm/qgemm.h"

namespace lily::cuda {
namespace {

__global__ void __launch_bounds__(256) xpack16_kernel(const float* x, int ldx, int K, uint16_t* X, float* XS, uint16_t* Xlo) {
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.x;
  pack16_row(x + size_t(r) * ldx, K, X + size_t(r) * K, XS + size_t(r) * (K / 64) * 2, Xlo ? Xlo + size_t(r) * K : nullptr);
}

}  // namespace

Status xpack16(const float* x, int ldx, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s) {
  if (K <= 0 || K % 64 != 0 || ldx < K || ldx % 2 != 0 || R < 1 || !x || !X || !XS)
    return cu_err("xpack16: K={} ldx={} R={} unsupported", K, ldx, R);
  return launch_k("xpack16", xpack16_kernel, dim3(R), dim3(256), 0, static_cast<cudaStream_t>(s), x, ldx, K, X, XS, Xlo);
}

}  // namespace lily::cuda
