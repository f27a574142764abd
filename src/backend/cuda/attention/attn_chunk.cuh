// The split-K decode attention both decode paths run (attention.cu: one token; batch_attn.cu: the rows of a
// batched step): one split of one KV head, positions [t0, t1) of its cache, the G query heads of the group
// sharing every K/V row read, written as the split's partial [G][hd + 2] = {o (unnormalized), m, l} for the
// merge (attn_common.cuh's merge_splits).
#pragma once
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {

constexpr int kAttnWarps = 8, kAttnThreads = 256;  // the decode kernels' blocks
constexpr int kAttnMaxSplits = 128;                  // splits of one KV head (the merge's shared weights)

template <int DPL> __device__ __forceinline__ void load_row(const float* p, float* out) {
  if constexpr (DPL == 8) {
    const float4 v0 = __ldg(reinterpret_cast<const float4*>(p)), v1 = __ldg(reinterpret_cast<const float4*>(p) + 1);
    out[0] = v0.x, out[1] = v0.y, out[2] = v0.z, out[3] = v0.w, out[4] = v1.x, out[5] = v1.y, out[6] = v1.z, out[7] = v1.w;
  } else if constexpr (DPL == 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    out[0] = v.x, out[1] = v.y;
  }
}
// Splits of n positions: at most n_split, each of at least min_per positions (≤ 0: 64). Both decode paths
// cut a row so, which is what makes the batched row's sums batch 1's.
__device__ __forceinline__ int n_splits_for(int n, int n_split, int min_per) {
  if (min_per <= 0) min_per = 64;
  const int want = (n + min_per - 1) / min_per;
  return want < n_split ? want : n_split;
}

// Chunked split kernel (attn_decode's, the decode step's): each warp takes chunks of P = 4 consecutive
// positions (K and V rows of all P loaded before the first use).
// The G·P partial dot products of a chunk (lanes over dims, q from shared memory) are summed over
// the warp by one transposing butterfly (G·P values in 31 shuffles instead of 5 per value; lane l
// ends up with value l >> SH), the online softmax is updated once per chunk (one rescale of o per
// head instead of one per position), and the chunk's probabilities go through shared memory to
// every lane for P·V. H200, 2026-12-03, against a per-position kernel (one warp sum and one softmax
// update per position; the batched battn ran so until 2026-12-06): 437.7 vs 435.6 tok/s at 4k,
// 343.3 vs 330.0 at 32k (attention −7% / −12%; docs/perf/2026-12-03-cuda-decode-3.md, since removed
// from the tree: git show 7e8cc9c:docs/perf/2026-12-03-cuda-decode-3.md).
// Transposing warp sum: v[0..C) per lane → lane l holds Σ_lanes v[l >> (5 − log2 C)] in v[0].
template <int C, int O> __device__ __forceinline__ void xpose_sum(float* v, int lane) {
  if constexpr (O >= 1) {
    if constexpr (C > 1) {
      const bool up = lane & O;
#pragma unroll
      for (int j = 0; j < C / 2; ++j) {
        const float send = up ? v[j] : v[j + C / 2], keep = up ? v[j + C / 2] : v[j];
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      xpose_sum<C / 2, O / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      xpose_sum<1, O / 2>(v, lane);
    }
  }
}
constexpr int kChunkP = 4;
template <int G> struct ChunkShape {
  static constexpr int NV = G * kChunkP;
  static constexpr int NVP = NV <= 4 ? 4 : NV <= 8 ? 8 : NV <= 16 ? 16 : 32;  // padded to a power of 2
  static constexpr int SH = NVP == 4 ? 3 : NVP == 8 ? 2 : NVP == 16 ? 1 : 0;  // lane l holds value l >> SH
};
template <int DPL, int G> constexpr size_t chunk_smem() {
  // partials [kAttnWarps][G][hd + 2] | q [G][hd] | per warp: probabilities [32] + chunk maxima [8]
  return (size_t(kAttnWarps) * G * (DPL * 32 + 2) + size_t(G) * DPL * 32 + size_t(kAttnWarps) * 40) * sizeof(float);
}

// One split (a block of kAttnThreads): q fp32 [G][hd] of the group; kc, vc this KV head's cache rows [.., hd]
// (position t at t·hd); part: the split's partial. Shared memory: chunk_smem<DPL, G>() floats at sm. Ends with
// a __syncthreads, so a persistent caller may run the next split on the same memory.
template <int DPL, int G>
__device__ __forceinline__ void attn_split(const float* q, const float* kc, const float* vc, int t0, int t1, float* part, float* sm) {
  static_assert(G * kChunkP <= 32, "GQA group too large for one transposing sum");
  using CS = ChunkShape<G>;
  constexpr int P = kChunkP, HD = DPL * 32, VW = DPL >= 4 ? 4 : 2;  // q read as float4 (float2 at hd 64)
  constexpr int kWarps = kAttnWarps, kThreads = kAttnThreads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ws = G * (HD + 2);
  float* qs = sm + kWarps * ws;           // [G][DPL/VW][32 lanes][VW]: lane-contiguous vector reads
  float* pw = qs + G * HD + warp * 40;     // [32] chunk probabilities, [8] chunk maxima per head
  // q of the group, lane l's dims l·DPL.. stored so that lane reads are contiguous.
  for (int i = threadIdx.x; i < G * HD; i += kThreads) {
    const int g = i / HD, d = i % HD, l = d / DPL, j = d % DPL;
    qs[((g * (DPL / VW) + j / VW) * 32 + l) * VW + j % VW] = __ldcg(q + i);
  }
  __syncthreads();
  const float scale = 1.0f / sqrtf(float(HD));
  float m[G], l[G], o[G][DPL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
  }
  const float* kbase = kc + lane * DPL;
  const float* vbase = vc + lane * DPL;
  const int idx = lane >> CS::SH, g_me = idx / P, p_me = idx % P;
  for (int tc = t0 + warp * P; tc < t1; tc += kWarps * P) {
    float kr[P][DPL], vr[P][DPL];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (tc + p < t1) {
        load_row<DPL>(kbase + size_t(tc + p) * HD, kr[p]);
        load_row<DPL>(vbase + size_t(tc + p) * HD, vr[p]);
      } else {
#pragma unroll
        for (int i = 0; i < DPL; ++i) kr[p][i] = vr[p][i] = 0.f;
      }
    }
    float sv[CS::NVP];
#pragma unroll
    for (int j = CS::NV; j < CS::NVP; ++j) sv[j] = 0.f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float qv[DPL];
#pragma unroll
      for (int j = 0; j < DPL / VW; ++j) {
        const float* src = qs + ((g * (DPL / VW) + j) * 32 + lane) * VW;
        if constexpr (VW == 4) {
          const float4 t = *reinterpret_cast<const float4*>(src);
          qv[4 * j] = t.x, qv[4 * j + 1] = t.y, qv[4 * j + 2] = t.z, qv[4 * j + 3] = t.w;
        } else {
          const float2 t = *reinterpret_cast<const float2*>(src);
          qv[2 * j] = t.x, qv[2 * j + 1] = t.y;
        }
      }
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += qv[i] * kr[p][i];
        sv[g * P + p] = s;
      }
    }
    xpose_sum<CS::NVP, 16>(sv, lane);
    // Lane holds score (g_me, p_me); the P lanes-groups of one head reduce their maximum.
    const bool valid = idx < CS::NV && tc + p_me < t1;
    const float s = valid ? sv[0] * scale : -INFINITY;
    float cm = s;
#pragma unroll
    for (int o2 = 1; o2 < P; o2 <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o2 << CS::SH));
    float mo = -INFINITY;
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g == g_me) mo = m[g];
    const float mn = fmaxf(mo, cm);
    if ((lane & ((1 << CS::SH) - 1)) == 0 && idx < CS::NV) {
      pw[idx] = valid ? expf(s - mn) : 0.f;
      if (p_me == 0) pw[32 + g_me] = mn;
    }
    __syncwarp();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float mg = pw[32 + g], c = expf(m[g] - mg);
      const float4 e = *reinterpret_cast<const float4*>(pw + g * P);
      l[g] = l[g] * c + ((e.x + e.y) + (e.z + e.w));
#pragma unroll
      for (int i = 0; i < DPL; ++i)
        o[g][i] = fmaf(e.w, vr[3][i], fmaf(e.z, vr[2][i], fmaf(e.y, vr[1][i], fmaf(e.x, vr[0][i], o[g][i] * c))));
      m[g] = mg;
    }
    __syncwarp();
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* dst = sm + warp * ws + g * (HD + 2);
#pragma unroll
    for (int i = 0; i < DPL; ++i) dst[lane * DPL + i] = o[g][i];
    if (lane == 0) dst[HD] = m[g], dst[HD + 1] = l[g];
  }
  __syncthreads();
  for (int idx2 = threadIdx.x; idx2 < ws; idx2 += kThreads) {
    const int g = idx2 / (HD + 2), d = idx2 % (HD + 2);
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w * ws + g * (HD + 2) + HD]);
    float acc = 0.f;
    if (d == HD) {
      acc = M;
    } else {
      for (int w = 0; w < kWarps; ++w) {
        const float mw = sm[w * ws + g * (HD + 2) + HD];
        if (mw != -INFINITY) acc += sm[w * ws + g * (HD + 2) + d] * expf(mw - M);
      }
    }
    part[idx2] = acc;
  }
  __syncthreads();  // the partials and q are read before the next split writes them
}

}  // namespace lily::cuda
