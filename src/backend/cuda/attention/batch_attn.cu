// Batched attention decode, each sequence with its own fp32 K/V cache and length through pointer
// tables: attention.cu's prep, split and merge arithmetic (attn_common.cuh, attn_chunk.cuh), the splits
// run by persistent blocks over the step's (row, kv head, split) items: a row's result is the batch-1 step's
// bit for bit wherever both cut its positions into the same splits (attn_decode caps its splits at one wave
// of blocks; CudaBatch.AttentionEqualsBatch1 requires it).
// The batched GDN step, once in the same file, is deltanet/batch_gdn.cu.
#include <algorithm>

#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/attention/attn_chunk.cuh"
#include "backend/cuda/attention/attn_common.cuh"
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = kAttnWarps, kThreads = kAttnThreads, kMaxSplits = kAttnMaxSplits;

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
  const float y = qk_norm_rope(raw, static_cast<const uint16_t*>(is_q ? a.q_norm : a.k_norm), hd, a.eps, a.rot, a.theta, pos, xsh, red);
  if (is_q) {
    a.q[size_t(row) * a.nh * hd + b * hd + d] = y;
  } else {
    const size_t at = (size_t(kvh) * a.cap[row] + pos) * hd + d;
    static_cast<float*>(a.kc[row])[at] = y;
    static_cast<float*>(a.vc[row])[at] = qkv[a.nh * a.qw + a.nkv * hd + kvh * hd + d];
  }
}

// Persistent blocks walking the step's work items (row, kv head, split), splits per row as attn_decode:
// nse(n) = min(n_split, ⌈n / min_per_split⌉) for the row's n = pos + 1 positions; each item is the decode
// step's split (attn_chunk.cuh's attn_split). The items are counted on the device (a prefix over the rows in
// shared memory), so the launch does not depend on the positions and the graph replays at any; an item's sums
// do not depend on the grid. H100, 2026-12-06, the 256-row step at context 256: a grid of n_split (128) × nkv ×
// B blocks, most of them empty, 3 resident an SM: attention 4.11 ms; persistent blocks with a per-position
// split (one warp sum and one softmax update a position and head): 2.93 ms; with attn_split: 2.66 ms.
template <int DPL, int G> __global__ void __launch_bounds__(kThreads) battn_decode_kernel(BAttnArgs a) {
  extern __shared__ float sm[];
  constexpr int HD = DPL * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ws = G * (HD + 2), min_per = a.min_per_split;
  // Shared memory: attn_split's (chunk_smem), then the items before each row [B + 1].
  int* pre = reinterpret_cast<int*>(sm + chunk_smem<DPL, G>() / sizeof(float));
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
    const size_t kv0 = size_t(kvh) * a.cap[row] * HD;
    float* part = a.partial + size_t(row) * a.nkv * a.n_split * ws + (size_t(kvh) * a.n_split + split) * ws;
    attn_split<DPL, G>(a.q + size_t(row) * a.nh * HD + size_t(kvh) * G * HD, static_cast<const float*>(a.kc[row]) + kv0,
                              static_cast<const float*>(a.vc[row]) + kv0, t0, t1, part, sm);
  }
}


// grid (nh, B), hd threads: attention.cu's merge for row blockIdx.y.
__global__ void __launch_bounds__(256) battn_merge_kernel(BAttnArgs a) {
  __shared__ float wsp[kMaxSplits];
  __shared__ float red[32];
  const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.x, kvh = h / G, g = h % G, d = threadIdx.x, row = blockIdx.y;
  pdl_wait();
  pdl_trigger();
  const int n = a.pos[row] + 1, nse = n_splits_for(n, a.n_split, a.min_per_split),
            ws = G * (hd + 2);
  const float* pk = a.partial + row * (size_t(a.nkv) * a.n_split * ws) + size_t(kvh) * a.n_split * ws + g * (hd + 2);
  float val = merge_splits(pk, ws, hd, nse, wsp, red);
  const float* qkv = a.qkv + size_t(row) * a.ldqkv;
  if (a.qw == 2 * hd) val = val * sigmoid(qkv[h * a.qw + hd + d]);
  a.out[size_t(row) * a.nh * hd + h * hd + d] = val;
}

template <int DPL, int G> Status launch_decode(const BAttnArgs& a, cudaStream_t s) {
  const size_t smem = chunk_smem<DPL, G>() + size_t(a.B + 1) * sizeof(int);
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
