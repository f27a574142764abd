// Router top-k of one 256-thread block from the router logits (softmax, top-k by p desc / id asc,
// renormalized weights, sigmoid of the shared-expert gate), shared by the MoE decode kernels
// (moe.cu: gate_up and down; dec_moe.cu: the fused MoE kernel) so that all pick the same experts.
#pragma once
#include "backend/cuda/common.cuh"

namespace lily::cuda {

constexpr int kTopkThreads = 256, kTopkWarps = 8;
constexpr int kTopkScratch = 2 * kTopkWarps + 1 + 2 * kTopkThreads;  // floats of block_router_topk's scratch

// Router top-k of the whole block from the logits [E + 1] (E ≤ 256 = blockDim.x; lv = logit of
// expert threadIdx.x, -inf past E, loaded by the caller so its latency overlaps other loads):
// p = softmax, the top_k experts by (p desc, id asc) into ids[rank], weights (renormalized when
// norm) into w[rank], w[top_k] = σ(logit E). Candidates: with ≥ k warps holding experts, only p ≥
// p(smallest warp maximum) can be in the top k (the k warp maxima are at least that), so the ranks
// are taken among few candidates instead of all E. Shared memory: sc [kTopkWarps·2 + 1 + 2·256].
__device__ inline void block_router_topk(float lv, float lg, int E, int k, bool norm, float* sc, int* ids, float* w) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float* wm = sc;                                   // [kTopkWarps] warp maxima
  float* wsum = sc + kTopkWarps;                        // [kTopkWarps] Σ exp(l − warp max)
  int* cnt = reinterpret_cast<int*>(sc + 2 * kTopkWarps);
  float* cp = sc + 2 * kTopkWarps + 1;                  // [256] candidate p
  int* ci = reinterpret_cast<int*>(cp + kTopkThreads);  // [256] candidate ids
  if (t == 0) *cnt = 0;
  const float m = warp_max(lv);
  const float s = warp_sum(m == -INFINITY ? 0.f : expf(lv - m));
  if (lane == 0) wm[warp] = m, wsum[warp] = s;
  __syncthreads();
  const int nw_data = (E + 31) / 32;  // warps holding experts (E ≤ 256)
  float mx = -INFINITY, mmin = INFINITY;
  for (int w2 = 0; w2 < nw_data; ++w2) mx = fmaxf(mx, wm[w2]), mmin = fminf(mmin, wm[w2]);
  float sum = 0.f;
  for (int w2 = 0; w2 < nw_data; ++w2) sum += wsum[w2] * expf(wm[w2] - mx);
  const float p = t < E ? expf(lv - mx) / sum : -1.f;
  const float thr = nw_data >= k ? expf(mmin - mx) / sum : -1.f;
  if (t < E && p >= thr) {
    const int at = atomicAdd(cnt, 1);
    cp[at] = p, ci[at] = t;
  }
  __syncthreads();
  const int nc = *cnt;
  if (t < nc) {
    const float pm = cp[t];
    const int im = ci[t];
    int rank = 0;
    for (int j = 0; j < nc; ++j) {
      const float pj = cp[j];
      rank += pj > pm || (pj == pm && ci[j] < im);
    }
    if (rank < k) ids[rank] = im, w[rank] = pm;
  }
  __syncthreads();
  if (t <= k) {
    float tsum = 0.f;
    for (int j = 0; j < k; ++j) tsum += w[j];  // in rank order, as the router epilogue
    const float v = t == k ? sigmoid(lg) : (norm ? w[t] / tsum : w[t]);
    __syncwarp(0x1FFFF & ((2u << k) - 1));
    w[t] = v;
  }
  __syncthreads();
}

}  // namespace lily::cuda
