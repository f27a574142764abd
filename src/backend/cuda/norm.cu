// Standalone residual add + RMSNorm (the decode step fuses this into the next GEMV's input
// staging; this kernel serves tests and paths without a following GEMV), and the pos bump.
#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

__global__ void add_rmsnorm_kernel(const uint16_t* x, const uint16_t* mix, const uint16_t* gain, int H, float eps,
                                   uint16_t* r_out, uint16_t* n_out) {
  __shared__ float red[32];
  __shared__ float v[8192];
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float t = bf(x[i]);
    if (mix) t = rbf(t + bf(mix[i]));
    v[i] = t;
    ss += t * t;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    if (r_out) r_out[i] = to_bf(v[i]);
    n_out[i] = to_bf(v[i] * inv * bf(gain[i]));
  }
}

__global__ void bump_pos_kernel(StepCtl* ctl) { ctl->pos += 1; }

}  // namespace

Status add_rmsnorm(const void* x, const void* mix, const void* gain, int H, float eps, void* r_out, void* n_out,
                   Stream s) {
  if (H <= 0 || H > 8192) return cu_err("add_rmsnorm: H={} unsupported", H);
  add_rmsnorm_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(s)>>>(
      static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(mix), static_cast<const uint16_t*>(gain), H, eps,
      static_cast<uint16_t*>(r_out), static_cast<uint16_t*>(n_out));
  return launch_status("add_rmsnorm");
}

Status bump_pos(StepCtl* ctl, Stream s) {
  bump_pos_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(ctl);
  return launch_status("bump_pos");
}

}  // namespace lily::cuda
