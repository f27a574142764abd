// Top-k log-probabilities of the fp32 logits on the device (lm_head GEMV + argmax live in
// gemv_q4.cu as the fused epilogue). Stage 1: per 1024-logit tile, max, Σexp and the tile's top-k;
// stage 2: one block merges tiles into log-sum-exp and the global top-k (ties → lowest id).
#include <cfloat>
#include <climits>

#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kTile = 1024, kThreads = 256, kMaxK = 32;

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// k rounds of block argmax over vals/ids in shared memory (n entries), removing each winner.
__device__ void block_topk(float* vals, int* ids, int n, int k, float* out_v, int* out_i) {
  __shared__ float wv[kThreads / 32];
  __shared__ int wi[kThreads / 32], wpos[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int r = 0; r < k; ++r) {
    float bv = -FLT_MAX;
    int bi = INT_MAX, bp = -1;
    for (int j = threadIdx.x; j < n; j += kThreads)
      if (ids[j] >= 0 && better(vals[j], ids[j], bv, bi)) bv = vals[j], bi = ids[j], bp = j;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o), op = __shfl_xor_sync(0xffffffffu, bp, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi, bp = op;
    }
    if (lane == 0) wv[warp] = bv, wi[warp] = bi, wpos[warp] = bp;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w)
        if (better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w], bp = wpos[w];
      out_v[r] = bv, out_i[r] = bi;
      if (bp >= 0) ids[bp] = -1;
    }
    __syncthreads();
  }
}

__global__ void topk_stage1(const float* logits, int n, int k, float2* ms, float* cv, int* ci) {
  __shared__ float vals[kTile];
  __shared__ int ids[kTile];
  __shared__ float red[32];
  const int base = blockIdx.x * kTile;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j < kTile; j += kThreads) {
    const int i = base + j;
    const float v = i < n ? logits[i] : -FLT_MAX;
    vals[j] = v, ids[j] = i < n && v == v ? i : -1;
    mx = fmaxf(mx, v);
  }
  __shared__ float smx;
  {
    float m = warp_max(mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = -FLT_MAX;
      for (int w = 0; w < kThreads / 32; ++w) t = fmaxf(t, red[w]);
      smx = t;
    }
    __syncthreads();
  }
  float s = 0.f;
  for (int j = threadIdx.x; j < kTile; j += kThreads)
    if (ids[j] >= 0) s += expf(vals[j] - smx);
  s = block_sum(s, red);
  if (threadIdx.x == 0) ms[blockIdx.x] = make_float2(smx, s);
  block_topk(vals, ids, kTile, k, cv + blockIdx.x * k, ci + blockIdx.x * k);
}

__global__ void topk_stage2(int nb, int k, const float2* ms, float* cv, int* ci, int32_t* out_i, float* out_lp) {
  extern __shared__ float sh[];
  float* vals = sh;
  int* ids = reinterpret_cast<int*>(sh + nb * k);
  __shared__ float red[32], lse;
  float M = -FLT_MAX;
  for (int b = threadIdx.x; b < nb; b += kThreads) M = fmaxf(M, ms[b].x);
  {
    float m = warp_max(M);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = -FLT_MAX;
      for (int w = 0; w < kThreads / 32; ++w) t = fmaxf(t, red[w]);
      lse = t;
    }
    __syncthreads();
    M = lse;
  }
  float s = 0.f;
  for (int b = threadIdx.x; b < nb; b += kThreads) s += ms[b].y * expf(ms[b].x - M);
  s = block_sum(s, red);
  for (int j = threadIdx.x; j < nb * k; j += kThreads) vals[j] = cv[j], ids[j] = ci[j];
  __syncthreads();
  __shared__ float tv[kMaxK];
  __shared__ int ti[kMaxK];
  block_topk(vals, ids, nb * k, k, tv, ti);
  if (threadIdx.x < k) {
    out_i[threadIdx.x] = ti[threadIdx.x];
    out_lp[threadIdx.x] = tv[threadIdx.x] - (M + logf(s));
  }
}

}  // namespace

size_t topk_logprobs_scratch_bytes(int n) {
  const int nb = (n + kTile - 1) / kTile;
  return size_t(nb) * (sizeof(float2) + kMaxK * (sizeof(float) + sizeof(int)));
}

Status topk_logprobs(const float* logits, int n, int k, void* scratch, int32_t* ids, float* logprobs, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (k < 1 || k > kMaxK || k > n) return cu_err("topk_logprobs: k={} out of range (1..{})", k, kMaxK);
  const int nb = (n + kTile - 1) / kTile;
  const size_t smem2 = size_t(nb) * k * (sizeof(float) + sizeof(int));
  if (smem2 > 200 * 1024) return cu_err("topk_logprobs: n={} k={} too large", n, k);
  auto* ms = static_cast<float2*>(scratch);
  auto* cv = reinterpret_cast<float*>(ms + nb);
  auto* ci = reinterpret_cast<int*>(cv + size_t(nb) * kMaxK);
  topk_stage1<<<nb, kThreads, 0, s>>>(logits, n, k, ms, cv, ci);
  LILY_TRY(launch_status("topk_stage1"));
  static size_t attr = 0;
  if (smem2 > 48 * 1024 && smem2 > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(topk_stage2, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem2)));
    attr = smem2;
  }
  topk_stage2<<<1, kThreads, smem2, s>>>(nb, k, ms, cv, ci, ids, logprobs);
  return launch_status("topk_stage2");
}

}  // namespace lily::cuda
