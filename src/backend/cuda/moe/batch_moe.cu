// Batched MoE decode: moe.cu's gate+up+SwiGLU and down+combine+shared kernels with a row index, so
// each row's arithmetic (chunk order, the down kernel's slot-interleaved fmaf chain per lane) is the
// batch-1 kernel's and results are bit-identical. The grid puts every (row, slot) of one weight tile
// next to each other in launch order: rows that chose the same expert (and the shared expert, read
// by all rows) read the same weight lines at the same time, so DRAM serves them about once and
// the repeats come from L2.
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

// Warps per block: 32 (8 in moe.cu): a block stages its row's input once for 32 output rows, so larger
// blocks cut the L2 traffic of the staging (B·(k+1)·⌈I/32⌉ blocks). H200, B = 16: 838 tok/s against 811
// with 8-warp blocks (docs/perf/2026-12-03-batching-cuda.md). The down kernel takes 8-warp blocks where
// a row has more than 8 chunks per lane.
constexpr int kWarpsPerBlock = 32;

// grid (B·(top_k+1), ⌈max(I, Is)/8⌉): x = b·(k+1) + slot (slot k = shared expert), y = row tile.
template <int CPL, int W> __global__ void __launch_bounds__(W * 32) bgate_up_kernel(BMoeArgs a) {
  extern __shared__ float sm[];
  const int H = a.H, I = a.I, Is = a.Is, nch = H / 32, k1 = a.top_k + 1;
  float* xs = sm;
  float* xcs = xs + nch * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x / k1, slot = blockIdx.x % k1, r = blockIdx.y * W + warp;
  const bool shared = slot == a.top_k;
  const int width = shared ? Is : I;
  uint4 g[CPL], u[CPL];
  uint32_t sg[CPL], su[CPL];
  auto load = [&](const QW& wg, const QW& wu, int rg, int ru) {
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int c = lane + 32 * i;
      if (r < width && c < nch) {
        g[i] = load_chunk(wg, rg, c, nch), sg[i] = load_sb<4>(wg, rg, c);
        u[i] = load_chunk(wu, ru, c, nch), su[i] = load_sb<4>(wu, ru, c);
      } else {
        g[i] = u[i] = make_uint4(0, 0, 0, 0), sg[i] = su[i] = 0;
      }
    }
  };
  if (shared) load(a.sh_gate_up, a.sh_gate_up, r, Is + r);
  pdl_wait();
  pdl_trigger();
  if (!shared) {
    const int e = a.topk_ids[b * a.top_k + slot];
    load(a.gate, a.up, e * I + r, e * I + r);
  }
  stage_plain<4>(a.x + size_t(b) * H, H, xs, xcs);
  __syncthreads();
  if (r >= width) return;
  float ag = 0.f, au = 0.f;
#pragma unroll
  for (int i = 0; i < CPL; ++i) {
    const int c = lane + 32 * i;
    if (c < nch) {
      ag += chunk_term<4>(g[i], sg[i], xs, xcs, c);
      au += chunk_term<4>(u[i], su[i], xs, xcs, c);
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) a.act[size_t(b) * (a.top_k * I + Is) + slot * I + r] = silu(ag) * au;
}

// grid (B, ⌈H/8⌉): one warp per output row of row b; items as moe.cu's down_kernel.
template <int P, int W> __global__ void __launch_bounds__(W * 32) bdown_kernel(BMoeArgs a) {
  extern __shared__ float sm[];
  const int H = a.H, I = a.I, Is = a.Is, k = a.top_k;
  const int CHr = I / 32, CHs = Is / 32, n_items = k * CHr + CHs;
  float* xs = sm;
  float* xcs = xs + n_items * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x, row = blockIdx.y * W + warp;
  const int32_t* ids = a.topk_ids + b * k;
  const float* tw = a.topk_w + b * (k + 1);
  uint4 w[P];
  uint32_t sb[P];
  float wt[P];
  pdl_wait();  // ids and weights come from the router, one kernel back here
  pdl_trigger();
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int it = lane + 32 * p;
    w[p] = make_uint4(0, 0, 0, 0), sb[p] = 0, wt[p] = 0.f;
    if (it < n_items && row < H) {
      if (it < k * CHr) {
        const int j = it / CHr, c = it % CHr, e = ids[j];
        w[p] = load_chunk(a.down, e * H + row, c, CHr), sb[p] = load_sb<4>(a.down, e * H + row, c);
        wt[p] = tw[j];
      } else {
        const int c = it - k * CHr;
        w[p] = load_chunk(a.sh_down, row, c, CHs), sb[p] = load_sb<4>(a.sh_down, row, c);
        wt[p] = tw[k];
      }
    }
  }
  stage_plain<4>(a.act + size_t(b) * (k * I + Is), k * I + Is, xs, xcs);
  __syncthreads();
  if (row >= H) return;
  float y = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int it = lane + 32 * p;
    if (it < n_items) y = fmaf(wt[p], chunk_term<4>(w[p], sb[p], xs, xcs, it), y);
  }
  y = warp_sum(y);
  if (lane == 0) a.out[size_t(b) * H + row] = y;
}

}  // namespace

Status bmoe_gate_up(const BMoeArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.H % 64 != 0 || a.H <= 0 || a.H > 4096) return cu_err("bmoe_gate_up: H={} unsupported", a.H);
  if (a.I % 32 != 0 || a.Is % 32 != 0 || a.I <= 0 || a.Is <= 0) return cu_err("bmoe_gate_up: widths {} / {}", a.I, a.Is);
  if (a.sh_gate_up.rows != 2 * a.Is) return cu_err("bmoe_gate_up: shared [gate|up] rows {} != 2·{}", a.sh_gate_up.rows, a.Is);
  if (a.top_k < 1 || a.top_k > 16 || a.B < 1) return cu_err("bmoe_gate_up: top_k={} B={}", a.top_k, a.B);
  const int nch = a.H / 32, cpl = (nch + 31) / 32;
  const size_t smem = size_t(nch * Chunk<4>::kStride + nch) * sizeof(float);
  const int wmax = a.I > a.Is ? a.I : a.Is;
  auto go = [&](auto kern, int W) {
    return launch_k("bmoe_gate_up", kern, dim3(a.B * (a.top_k + 1), (wmax + W - 1) / W), dim3(32 * W), smem, s, a);
  };
  constexpr int W = kWarpsPerBlock;
  if (cpl == 1) return go(bgate_up_kernel<1, W>, W);
  if (cpl == 2) return go(bgate_up_kernel<2, W>, W);
  return go(bgate_up_kernel<4, W>, W);
}

Status bmoe_down(const BMoeArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.top_k < 1 || a.top_k > 16 || a.B < 1) return cu_err("bmoe_down: top_k={} B={}", a.top_k, a.B);
  if (a.I % 32 != 0 || a.Is % 32 != 0 || a.I <= 0 || a.Is <= 0) return cu_err("bmoe_down: widths {} / {}", a.I, a.Is);
  if (a.sh_down.cols != a.Is || a.down.cols != a.I) return cu_err("bmoe_down: down widths {} / {} differ from {} / {}", a.down.cols, a.sh_down.cols, a.I, a.Is);
  const int n_items = a.top_k * (a.I / 32) + a.Is / 32, P = (n_items + 31) / 32;
  const size_t smem = size_t(n_items * Chunk<4>::kStride + n_items) * sizeof(float);
  if (smem > 200 * 1024) return cu_err("bmoe_down: {} chunks per row exceed shared memory", n_items);
  constexpr int W = kWarpsPerBlock;
  const dim3 grid(a.B, (a.H + W - 1) / W), block(32 * W);
  auto go = [&](auto kern) -> Status {
    if (smem > 48 * 1024) LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return launch_k("bmoe_down", kern, grid, block, smem, s, a);
  };
  // P buckets (P only sets the unrolled loop bound; items past n_items are skipped). Up to 8 with
  // 32-warp blocks (64 registers per thread), beyond with 8-warp blocks.
  if (P <= 8) {
    if (P <= 1) return go(bdown_kernel<1, W>);
    if (P <= 2) return go(bdown_kernel<2, W>);
    if (P <= 3) return go(bdown_kernel<3, W>);
    if (P <= 5) return go(bdown_kernel<5, W>);
    return go(bdown_kernel<8, W>);
  }
  const dim3 grid8(a.B, (a.H + 7) / 8), block8(256);
  auto go8 = [&](auto kern) -> Status {
    if (smem > 48 * 1024) LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return launch_k("bmoe_down", kern, grid8, block8, smem, s, a);
  };
  if (P <= 1) return go8(bdown_kernel<1, 8>);
  if (P <= 2) return go8(bdown_kernel<2, 8>);
  if (P <= 3) return go8(bdown_kernel<3, 8>);
  if (P <= 5) return go8(bdown_kernel<5, 8>);
  if (P <= 8) return go8(bdown_kernel<8, 8>);
  if (P <= 12) return go8(bdown_kernel<12, 8>);
  if (P <= 17) return go8(bdown_kernel<17, 8>);
  return cu_err("bmoe_down: {} chunks per row unsupported (≤ 544)", n_items);
}

}  // namespace lily::cuda
