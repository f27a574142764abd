// Row-wise prefill helpers over fp32 activations: the fused residual add + RMSNorm (one block per token
// row). The embedding rows are common/embed.cu's.
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

__global__ void add_rmsnorm_rows_kernel(float* x, const float* mix, const uint16_t* gain, int H, float eps, float* n,
                                        __half* hi, __half* lo, float* xs) {
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
  ss = block_sum(ss, red);  // its barriers also make this block's writes of x visible to every thread
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  if (n)
    for (int i = threadIdx.x; i < H; i += blockDim.x) n[off + i] = x[off + i] * inv * bf(gain[i]);
  if (!hi) return;
  // The split as split_rows makes it (split_pair): one warp a 64-column group, columns 2·lane and 2·lane + 1.
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5, G = H / 64;
  for (int gr = threadIdx.x >> 5; gr < G; gr += warps) {
    const int i = gr * 64 + 2 * lane;
    // n's value, each product rounded on its own (__fmul_rn: never contracted into the fma of v − hi or v.x + v.y
    // in split_pair, which would round differently from split_rows on the stored n).
    const float2 v = make_float2(__fmul_rn(__fmul_rn(x[off + i], inv), bf(gain[i])),
                                 __fmul_rn(__fmul_rn(x[off + i + 1], inv), bf(gain[i + 1])));
    split_pair(v, hi, lo, lo ? xs + size_t(blockIdx.x) * G + gr : nullptr, off + i, lane);
  }
}

}  // namespace

Status add_rmsnorm_rows(float* x, const float* mix, const void* gain, int M, int H, float eps, float* n, Stream s,
                        uint16_t* hi, uint16_t* lo, float* xs) {
  if (M <= 0) return Status::ok();
  if (hi && H % 64 != 0) return cu_err("pf::add_rmsnorm_rows: a split needs H % 64 == 0 (H = {})", H);
  if ((lo == nullptr) != (xs == nullptr) || (lo && !hi)) return cu_err("pf::add_rmsnorm_rows: lo and xs come with hi, both or neither");
  add_rmsnorm_rows_kernel<<<M, 256, 0, static_cast<cudaStream_t>(s)>>>(x, mix, static_cast<const uint16_t*>(gain), H, eps, n,
                                                                          reinterpret_cast<__half*>(hi),
                                                                          reinterpret_cast<__half*>(lo), xs);
  return launch_status("pf::add_rmsnorm_rows");
}

}  // namespace lily::cuda::pf
