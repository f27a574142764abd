// The arithmetic the attention kernels share, one definition each: the q/k RMSNorm + partial RoPE of one
// head's row (the decode prep of attention.cu, the batched prep of batch_attn.cu and the prefill prep of
// attn_prefill.cu), and the merge of a head's split-K partials (attention.cu's and batch_attn.cu's merge
// kernels). The same code in every caller, so batched and batch-1 results of these steps are the same bits.
#pragma once
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {

// One thread per dim d of a head (blockDim.x = hd): raw [hd] → RMSNorm with the bf16 gain → RoPE on the first
// `rot` dims (NeoX halves, theta^(−2j/rot)) at position pos. xsh: hd floats of shared memory, red: 32.
__device__ __forceinline__ float qk_norm_rope(float raw, const uint16_t* gain, int hd, float eps, int rot, double theta,
                                              int pos, float* xsh, float* red) {
  const int d = threadIdx.x;
  const float ss = block_sum(raw * raw, red);
  const float x = raw * (1.0f / sqrtf(ss / float(hd) + eps)) * bf(gain[d]);
  xsh[d] = x;
  __syncthreads();
  float y = x;
  const int half = rot / 2;
  if (d < rot) {
    const int j = d % half;
    const float inv_freq = 1.0f / powf(float(theta), float(2 * j) / float(rot));
    const float ang = float(pos) * inv_freq;
    float sn, cs;
    sincosf(ang, &sn, &cs);
    y = d < half ? x * cs - xsh[d + half] * sn : x * cs + xsh[d - half] * sn;
  }
  return y;
}

// Merge of one query head's nse split partials, one thread per dim d: partial sp at pk + sp·ws holds
// [o (hd) | m | l]. Split weights exp(m_sp − M) in wsp (shared, ≥ nse floats), then each thread streams its
// dim over the splits (four chains). Returns o[d] / L.
__device__ __forceinline__ float merge_splits(const float* pk, int ws, int hd, int nse, float* wsp, float* red) {
  const int d = threadIdx.x;
  float m = -INFINITY;
  for (int sp = d; sp < nse; sp += blockDim.x) {
    const float v = __ldcg(pk + sp * ws + hd);
    wsp[sp] = v;
    m = fmaxf(m, v);
  }
  const float M = block_max(m, red);
  float lsum = 0.f;
  for (int sp = d; sp < nse; sp += blockDim.x) {
    const float e = expf(wsp[sp] - M);
    wsp[sp] = e;
    lsum += __ldcg(pk + sp * ws + hd + 1) * e;
  }
  const float L = block_sum(lsum, red);
  __syncthreads();
  float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
  int sp = 0;
  for (; sp + 4 <= nse; sp += 4) {
    o0 = fmaf(wsp[sp], __ldcg(pk + sp * ws + d), o0);
    o1 = fmaf(wsp[sp + 1], __ldcg(pk + (sp + 1) * ws + d), o1);
    o2 = fmaf(wsp[sp + 2], __ldcg(pk + (sp + 2) * ws + d), o2);
    o3 = fmaf(wsp[sp + 3], __ldcg(pk + (sp + 3) * ws + d), o3);
  }
  for (; sp < nse; ++sp) o0 = fmaf(wsp[sp], __ldcg(pk + sp * ws + d), o0);
  return ((o0 + o1) + (o2 + o3)) / L;
}

}  // namespace lily::cuda
