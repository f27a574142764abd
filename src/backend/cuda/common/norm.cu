// Standalone residual add + RMSNorm (the decode step fuses this into the next GEMV's input
// staging; this kernel serves tests and paths without a following GEMV), and the pos bump.
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

__global__ void add_rmsnorm_kernel(const float* x, const float* mix, const uint16_t* gain, int H, float eps,
                                   float* r_out, float* n_out) {
  __shared__ float red[32];
  __shared__ float v[8192];
  pdl_wait();
  pdl_trigger();
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float t = x[i];
    if (mix) t += mix[i];
    v[i] = t;
    ss += t * t;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    if (r_out) r_out[i] = v[i];
    n_out[i] = v[i] * inv * bf(gain[i]);
  }
}

__global__ void bump_pos_kernel(StepCtl* ctl) {
  pdl_wait();
  pdl_trigger();
  ctl->pos += 1;
}

}  // namespace

Status add_rmsnorm(const float* x, const float* mix, const void* gain, int H, float eps, float* r_out, float* n_out,
                   Stream s) {
  if (H <= 0 || H > 8192) return cu_err("add_rmsnorm: H={} unsupported", H);
  return launch_k("add_rmsnorm", add_rmsnorm_kernel, dim3(1), dim3(1024), 0, static_cast<cudaStream_t>(s), x, mix,
                  static_cast<const uint16_t*>(gain), H, eps, r_out, n_out);
}

Status bump_pos(StepCtl* ctl, Stream s) {
  return launch_k("bump_pos", bump_pos_kernel, dim3(1), dim3(1), 0, static_cast<cudaStream_t>(s), ctl);
}

}  // namespace lily::cuda
