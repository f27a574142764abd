// Row-wise prefill helpers over fp32 activations: the fused residual add + RMSNorm (one block per token
// row). The embedding rows are common/embed.cu's.
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

__global__ void add_rmsnorm_rows_kernel(float* x, const float* mix, const uint16_t* gain, int H, float eps, float* n) {
  __shared__ float red[32];
  const size_t off = size_t(blockIdx.x) * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float v = x[off + i];
    if (mix) {
      v = v + mix[off + i];
      x[off + i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) n[off + i] = x[off + i] * inv * bf(gain[i]);
}

}  // namespace

Status add_rmsnorm_rows(float* x, const float* mix, const void* gain, int M, int H, float eps, float* n, Stream s) {
  if (M <= 0) return Status::ok();
  add_rmsnorm_rows_kernel<<<M, 256, 0, static_cast<cudaStream_t>(s)>>>(x, mix, static_cast<const uint16_t*>(gain), H, eps, n);
  return launch_status("pf::add_rmsnorm_rows");
}

}  // namespace lily::cuda::pf
