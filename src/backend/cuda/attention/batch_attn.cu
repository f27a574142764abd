// Batched attention decode, each sequence with its own fp32 K/V cache and length through pointer
// tables: attention.cu's prep and merge arithmetic, and a split-K kernel (persistent blocks over the
// step's (row, kv head, split) items) taking one position per warp at a time (the batch-1 step's chunked kernel sums in another order: within 1e-5, CudaBatch.AttentionEqualsBatch1).
// The batched GDN step, once in the same file, is deltanet/batch_gdn.cu.
#include <algorithm>

#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 256, kMinPerSplit = 64;

// grid (nh + nkv, B), hd threads.
__global__ void battn_prep_kernel(BAttnArgs a) {
  extern __shared__ float xsh[];
  __shared__ float red[32];
  const int b = blockIdx.x, d = threadIdx.x, hd = a.hd, row = blockIdx.y;
  pdl_wait();
  pdl_trigger();
  const int pos = a.pos[row];
  const float* qkv = a.qkv + size_t(row) * a.ldqkv;
  const bool is_q = b < a.nh;
  const int kvh = b - a.nh;
  const float raw = is_q ? qkv[b * a.qw + d] : qkv[a.nh * a.qw + kvh * hd + d];
  const uint16_t* gain = static_cast<const uint16_t*>(is_q ? a.q_norm : a.k_norm);
  const float ss = block_sum(raw * raw, red);
  const float x = raw * (1.0f / sqrtf(ss / float(hd) + a.eps)) * bf(gain[d]);
  xsh[d] = x;
  __syncthreads();
  float y = x;
  const int half = a.rot / 2;
  if (d < a.rot) {
    const int j = d % half;
    const float inv_freq = 1.0f / powf(float(a.theta), float(2 * j) / float(a.rot));
    const float ang = float(pos) * inv_freq;
    float sn, cs;
    sincosf(ang, &sn, &cs);
    y = d < half ? x * cs - xsh[d + half] * sn : x * cs + xsh[d - half] * sn;
  }
  if (is_q) {
    a.q[size_t(row) * a.nh * hd + b * hd + d] = y;
  } else {
    const size_t at = (size_t(kvh) * a.cap[row] + pos) * hd + d;
    static_cast<float*>(a.kc[row])[at] = y;
    static_cast<float*>(a.vc[row])[at] = qkv[a.nh * a.qw + a.nkv * hd + kvh * hd + d];
  }
}

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

__device__ __forceinline__ int n_splits_for(int n, int n_split, int min_per) {
  const int want = (n + min_per - 1) / min_per;
  return want < n_split ? want : n_split;
}

// Persistent blocks walking the step's work items (row, kv head, split), splits per row as attn_decode:
// nse(n) = min(n_split, ⌈n / min_per_split⌉) for the row's n = pos + 1 positions; each item runs
// attention.cu's attn_decode_kernel arithmetic over its positions. The items are counted on the device
// (a prefix over the rows in shared memory), so the launch does not depend on the positions and the
// graph replays at any; an item's sums do not depend on the grid. Before (H100, 2026-12-06): a grid of
// n_split (128) × nkv × B blocks, most of them empty, 3 resident an SM (their 66 KB of merge space): 4.11 ms
// of the 256-row step at context 256 (0.41 ms a layer, for 0.27 GB of K/V).
template <int DPL, int G> __global__ void __launch_bounds__(kThreads) battn_decode_kernel(BAttnArgs a) {
  extern __shared__ float sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = DPL * 32;
  const int ws = G * (hd + 2), min_per = a.min_per_split > 0 ? a.min_per_split : kMinPerSplit;
  // Shared memory: the warps' partial [kWarps][G][hd + 2], then the items before each row [B + 1].
  int* pre = reinterpret_cast<int*>(sm + kWarps * ws);
  __shared__ int wsum[kWarps];
  pdl_wait();
  pdl_trigger();
  {  // an exclusive scan of the rows' items: thread t counts a run of rows, the runs in thread order
    const int per = (a.B + kThreads - 1) / kThreads, r0 = min(a.B, int(threadIdx.x) * per), r1 = min(a.B, r0 + per);
    int own = 0;
    for (int r = r0; r < r1; ++r) {
      const int c = a.nkv * n_splits_for(a.pos[r] + 1, a.n_split, min_per);
      pre[r] = c;
      own += c;
    }
    int inc = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= off) inc += v;
    }
    if (lane == 31) wsum[warp] = inc;
    __syncthreads();
    int base = inc - own;
    for (int w = 0; w < warp; ++w) base += wsum[w];
    for (int r = r0; r < r1; ++r) {
      const int c = pre[r];
      pre[r] = base;
      base += c;
    }
    if (threadIdx.x == kThreads - 1) pre[a.B] = base;
  }
  __syncthreads();
  const int n_items = pre[a.B];
  const float scale = 1.0f / sqrtf(float(hd));
  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    int lo = 0, hi = a.B - 1;  // the row: the last with pre[row] <= item
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (pre[mid] <= item) lo = mid;
      else hi = mid - 1;
    }
    const int row = lo, n = a.pos[row] + 1, nse = n_splits_for(n, a.n_split, min_per);
    const int kvh = (item - pre[row]) / nse, split = (item - pre[row]) % nse;
    const int len = (n + nse - 1) / nse, t0 = split * len, t1 = min(n, t0 + len);
    const int cap = a.cap[row];
    float q[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) load_row<DPL>(a.q + size_t(row) * a.nh * hd + (kvh * G + g) * hd + lane * DPL, q[g]);
    float m[G], l[G], o[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
    }
    const float* kbase = static_cast<const float*>(a.kc[row]) + size_t(kvh) * cap * hd + lane * DPL;
    const float* vbase = static_cast<const float*>(a.vc[row]) + size_t(kvh) * cap * hd + lane * DPL;
    auto process = [&](const float* k, const float* v) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += q[g][i] * k[i];
        s = warp_sum(s) * scale;
        const float mn = fmaxf(m[g], s), c = expf(m[g] - mn), p = expf(s - mn);
        l[g] = l[g] * c + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = o[g][i] * c + p * v[i];
        m[g] = mn;
      }
    };
    for (int t = t0 + warp; t < t1; t += 2 * kWarps) {
      const int t2 = t + kWarps;
      float k0[DPL], v0[DPL], k1[DPL], v1[DPL];
      load_row<DPL>(kbase + size_t(t) * hd, k0);
      load_row<DPL>(vbase + size_t(t) * hd, v0);
      if (t2 < t1) {
        load_row<DPL>(kbase + size_t(t2) * hd, k1);
        load_row<DPL>(vbase + size_t(t2) * hd, v1);
      }
      process(k0, v0);
      if (t2 < t1) process(k1, v1);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float* dst = sm + warp * ws + g * (hd + 2);
#pragma unroll
      for (int i = 0; i < DPL; ++i) dst[lane * DPL + i] = o[g][i];
      if (lane == 0) dst[hd] = m[g], dst[hd + 1] = l[g];
    }
    __syncthreads();
    const size_t per_row = size_t(a.nkv) * a.n_split * ws;
    float* part = a.partial + row * per_row + (size_t(kvh) * a.n_split + split) * ws;
    for (int idx = threadIdx.x; idx < ws; idx += kThreads) {
      const int g = idx / (hd + 2), d = idx % (hd + 2);
      float M = -INFINITY;
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w * ws + g * (hd + 2) + hd]);
      float acc = 0.f;
      if (d == hd) {
        acc = M;
      } else {
        for (int w = 0; w < kWarps; ++w) {
          const float mw = sm[w * ws + g * (hd + 2) + hd];
          if (mw != -INFINITY) acc += sm[w * ws + g * (hd + 2) + d] * expf(mw - M);
        }
      }
      part[idx] = acc;
    }
    __syncthreads();  // the merge space is read before the next item writes it
  }
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

constexpr int kMaxSplits = 128;

// grid (nh, B), hd threads: attention.cu's merge for row blockIdx.y.
__global__ void __launch_bounds__(256) battn_merge_kernel(BAttnArgs a) {
  __shared__ float wsp[kMaxSplits];
  __shared__ float red[32];
  const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.x, kvh = h / G, g = h % G, d = threadIdx.x, row = blockIdx.y;
  pdl_wait();
  pdl_trigger();
  const int n = a.pos[row] + 1, nse = n_splits_for(n, a.n_split, a.min_per_split > 0 ? a.min_per_split : kMinPerSplit),
            ws = G * (hd + 2);
  const float* pk = a.partial + row * (size_t(a.nkv) * a.n_split * ws) + size_t(kvh) * a.n_split * ws + g * (hd + 2);
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
  const float* qkv = a.qkv + size_t(row) * a.ldqkv;
  float val = ((o0 + o1) + (o2 + o3)) / L;
  if (a.qw == 2 * hd) val = val * sigmoid(qkv[h * a.qw + hd + d]);
  a.out[size_t(row) * a.nh * hd + h * hd + d] = val;
}

template <int DPL, int G> Status launch_decode(const BAttnArgs& a, cudaStream_t s) {
  const size_t smem = size_t(kWarps) * G * (DPL * 32 + 2) * sizeof(float) + size_t(a.B + 1) * sizeof(int);
  auto kern = battn_decode_kernel<DPL, G>;
  static size_t set = 0;
  static int per_sm = 1;
  if (smem > set) {
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kThreads, smem));
    per_sm = std::max(per_sm, 1);
    set = smem;
  }
  // Persistent: the resident blocks, or fewer where the items cannot need them (every row's splits).
  const int grid = int(std::min<size_t>(size_t(per_sm) * sm_count(), size_t(a.B) * a.nkv * a.n_split));
  LILY_TRY(launch_k("battn_decode", kern, dim3(grid), dim3(kThreads), smem, s, a));
  return launch_k("battn_merge", battn_merge_kernel, dim3(a.nh, a.B), dim3(a.hd), 0, s, a);
}

template <int DPL> Status dispatch_g(const BAttnArgs& a, cudaStream_t s) {
  switch (a.nh / a.nkv) {
    case 1: return launch_decode<DPL, 1>(a, s);
    case 2: return launch_decode<DPL, 2>(a, s);
    case 4: return launch_decode<DPL, 4>(a, s);
    case 8: return launch_decode<DPL, 8>(a, s);
    default: return cu_err("battn: GQA group {} unsupported (1, 2, 4, 8)", a.nh / a.nkv);
  }
}

}  // namespace

size_t battn_partial_floats(int nh, int nkv, int hd, int n_split) {
  return size_t(nkv) * n_split * (nh / nkv) * (hd + 2);
}

Status battn(const BAttnArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.hd % 32 != 0 || a.hd > 1024 || a.rot > a.hd || a.rot % 2 != 0) return cu_err("battn: head dim {} / rotary {}", a.hd, a.rot);
  if (a.nkv <= 0 || a.nh % a.nkv != 0 || a.n_split < 1 || a.n_split > kMaxSplits) return cu_err("battn: heads {}/{} splits {}", a.nh, a.nkv, a.n_split);
  LILY_TRY(launch_k("battn_prep", battn_prep_kernel, dim3(a.nh + a.nkv, a.B), dim3(a.hd), a.hd * sizeof(float), s, a));
  switch (a.hd) {
    case 64: return dispatch_g<2>(a, s);
    case 128: return dispatch_g<4>(a, s);
    case 256: return dispatch_g<8>(a, s);
    default: return cu_err("battn: head dim {} unsupported (64, 128, 256)", a.hd);
  }
}

}  // namespace lily::cuda
