// Row-wise prefill helpers over fp32 activations: embedding rows (4-bit dequant) and the fused
// residual add + RMSNorm (one block per token row).
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

__global__ void embed_rows_kernel(QW e, const int32_t* tok, float* x) {
  const int m = blockIdx.x, H = e.cols, wpr = H / 8, groups = H / 64;
  const int r = tok[m];
  const uint32_t* codes = e.codes + size_t(r) * wpr;
  const uint32_t* sb = reinterpret_cast<const uint32_t*>(e.sb) + size_t(r) * groups;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    const uint32_t q = (codes[c / 8] >> (4 * (c % 8))) & 0xF;
    const uint32_t p = sb[c / 64];
    const float s = __uint_as_float(p << 16), b = __uint_as_float(p & 0xFFFF0000u);
    x[size_t(m) * H + c] = __fadd_rn(__fmul_rn(s, float(q)), b);
  }
}

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

Status embed_rows(const QW& e, const int32_t* tok, int M, float* x, Stream s) {
  if (e.bits != 4 || e.cols % 64 != 0) return cu_err("pf::embed_rows: needs a 4-bit table with group 64");
  if (M <= 0) return Status::ok();
  embed_rows_kernel<<<M, 256, 0, static_cast<cudaStream_t>(s)>>>(e, tok, x);
  return launch_status("pf::embed_rows");
}

Status add_rmsnorm_rows(float* x, const float* mix, const void* gain, int M, int H, float eps, float* n, Stream s) {
  if (M <= 0) return Status::ok();
  add_rmsnorm_rows_kernel<<<M, 256, 0, static_cast<cudaStream_t>(s)>>>(x, mix, static_cast<const uint16_t*>(gain), H, eps, n);
  return launch_status("pf::add_rmsnorm_rows");
}

}  // namespace lily::cuda::pf
