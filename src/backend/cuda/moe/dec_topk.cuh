// Router top-k from the router logits (softmax, top-k by p desc / id asc, renormalized weights,
// sigmoid of the shared-expert gate): by one warp per row (warp_router_topk: the router GEMV's epilogue,
// the batched and the prefill routing) and by one 256-thread block (block_router_topk: the MoE decode
// kernels and moe.cu), so that all pick the same experts.
#pragma once
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {

// (v, i) ranks before (bv, bi): larger p first, then the lower id.
__device__ __forceinline__ bool topk_better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

struct WarpTopk {
  int id;      // lane j < top_k: the expert of round j
  float p;     // its probability
  float tsum;  // every lane: Σ of the top_k probabilities in round order
};

// Router top-k of one row by one warp (the epilogues of the batch-1 router GEMV, the batched and the
// prefill routing): p = softmax of the logits l[0..E) into p (shared memory, E floats), then top_k
// rounds of argmax over p (p desc, id asc; each round's winner set to -2).
__device__ inline WarpTopk warp_router_topk(const float* l, int E, int top_k, float* p) {
  const int lane = threadIdx.x & 31;
  float mx = -3.402823466e38f;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, __ldcg(l + e));
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) sum += (p[e] = expf(__ldcg(l + e) - mx));
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) p[e] = p[e] / sum;
  __syncwarp();
  WarpTopk r{0, 0.f, 0.f};
  for (int k = 0; k < top_k; ++k) {
    float bv = -1.f;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (topk_better(p[e], e, bv, bi)) bv = p[e], bi = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (topk_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    r.tsum += bv;
    if (lane == k) r.id = bi, r.p = bv;
    __syncwarp();
    if (lane == 0) p[bi] = -2.f;
    __syncwarp();
  }
  return r;
}

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
