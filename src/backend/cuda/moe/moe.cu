// moe/: the sparse MoE block. Router top-k (dec_topk.cuh: softmax in fp32, top-k by p desc / id asc,
// renormalized, σ of the shared-expert gate logit), then per slot gate+up+SwiGLU and down, combined
// with the routing weights and the σ-gated shared expert. Activations fp32, weights 4-bit (router
// 8-bit), fp32 sums. Entry points: moe_gate_up / moe_down_combine (common/ops.h; moe.cu, moe_tc.cu: one
// token, x fp32 [H] → act fp32 [k·I + Is] → out fp32 [H]); pf::moe_route / pf::moe_combine
// (step/prefill_ops.h; moe_prefill.cu: M tokens, expert GEMMs by gemm/'s pf::gemm); the batched step's
// experts are qgemm / xgemm on the routing table (gemm/qgemm.h, moe/xgemm.h).
//
// MoE decode in two kernels, expert ids read on the device: (1) gate+up+SwiGLU for the top-k
// routed experts (width I) and the shared expert (width Is) as one extra slot; (2) down for all
// slots + the score-weighted sum + the sigmoid-gated shared expert, writing the FFN branch output.
// Activations fp32. PDL: every kernel triggers its dependents only after its own wait, so a kernel's
// pre-wait code may read anything written two or more kernels back. gate_up loads the shared
// expert before its wait (the routed rows need the router, the previous kernel); down loads all its
// rows before its wait (the router is two kernels back). The expert ids come either from the
// router's top-k epilogue (topk_ids/topk_w) or, by default, from the router's logits: each block
// computes the top-k itself (block_router_topk), so the router needs no last-block tail.
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/moe/dec_topk.cuh"
#include "backend/cuda/moe/moe_tc.h"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256, kWarps = 8;
static_assert(kThreads == kTopkThreads && kWarps == kTopkWarps);

template <int CPL> __global__ void __launch_bounds__(kThreads) gate_up_kernel(MoeArgs a) {
  extern __shared__ float sm[];
  const int H = a.H, I = a.I, Is = a.Is, nch = H / 32;
  float* xs = sm;
  float* xcs = xs + nch * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = blockIdx.y, r = blockIdx.x * kWarps + warp;
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
  int e = -1;
  const bool route_here = !shared && a.logits;
  if (route_here) {
    // Routing here (the router, the previous kernel, wrote only its logits); the logit and x loads
    // are in flight together.
    float* sc = xcs + nch;
    int* ids = reinterpret_cast<int*>(sc + kTopkScratch);
    float* tw = reinterpret_cast<float*>(ids + 16);
    const float lv = threadIdx.x < a.n_experts ? __ldcg(a.logits + threadIdx.x) : -INFINITY;
    stage_plain<4>(a.x, H, xs, xcs);
    block_router_topk(lv, 0.f, a.n_experts, a.top_k, a.norm_topk, sc, ids, tw);
    e = ids[slot];
    load(a.gate, a.up, e * I + r, e * I + r);
  } else if (!shared) {
    e = a.topk_ids[slot];
    load(a.gate, a.up, e * I + r, e * I + r);
  }
  if (!route_here) stage_plain<4>(a.x, H, xs, xcs);
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
  if (lane == 0) a.act[slot * I + r] = silu(ag) * au;
}

// One warp per output row. The row's work items are the 16-byte chunks of every slot's down row:
// routed slot j, chunk c → item j·CHr + c; shared chunk c → item k·CHr + c (the same order as
// act, so item i reads staged chunk i). Lane l takes items l, l+32, ... (P per lane); each item's
// term is weighted by its slot's combine weight, then one warp sum.
template <int P> __global__ void __launch_bounds__(kThreads) down_kernel(MoeArgs a) {
  extern __shared__ float sm[];
  const int H = a.H, I = a.I, Is = a.Is, k = a.top_k;
  const int CHr = I / 32, CHs = Is / 32, n_items = k * CHr + CHs;
  float* xs = sm;
  float* xcs = xs + n_items * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * kWarps + warp;
  // The expert ids and weights come from the router, two kernels back (complete once the previous
  // kernel passed its own wait), so the down rows are loaded before this kernel's wait; only act
  // (from gate_up, the previous kernel) is read after it.
  const int32_t* tids = a.topk_ids;
  const float* tw = a.topk_w;
  if (a.logits) {  // routing here, before the wait (off the critical path)
    float* sc = xcs + n_items;
    int* ids = reinterpret_cast<int*>(sc + kTopkScratch);
    float* ws = reinterpret_cast<float*>(ids + 16);
    const float lv = threadIdx.x < a.n_experts ? __ldcg(a.logits + threadIdx.x) : -INFINITY;
    block_router_topk(lv, __ldcg(a.logits + a.n_experts), a.n_experts, k, a.norm_topk, sc, ids, ws);
    if (blockIdx.x == 0 && threadIdx.x <= k) {
      if (a.ids_out && threadIdx.x < k) a.ids_out[threadIdx.x] = ids[threadIdx.x];
      if (a.w_out) a.w_out[threadIdx.x] = ws[threadIdx.x];
    }
    tids = ids, tw = ws;
  }
  uint4 w[P];
  uint32_t sb[P];
  float wt[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int it = lane + 32 * p;
    w[p] = make_uint4(0, 0, 0, 0), sb[p] = 0, wt[p] = 0.f;
    if (it < n_items && row < H) {
      if (it < k * CHr) {
        const int j = it / CHr, c = it % CHr, e = tids[j];
        w[p] = load_chunk(a.down, e * H + row, c, CHr), sb[p] = load_sb<4>(a.down, e * H + row, c);
        wt[p] = tw[j];
      } else {
        const int c = it - k * CHr;
        w[p] = load_chunk(a.sh_down, row, c, CHs), sb[p] = load_sb<4>(a.sh_down, row, c);
        wt[p] = tw[k];
      }
    }
  }
  pdl_wait();
  pdl_trigger();
  stage_plain<4>(a.act, k * I + Is, xs, xcs);
  __syncthreads();
  if (row >= H) return;
  float y = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int it = lane + 32 * p;
    if (it < n_items) y = fmaf(wt[p], chunk_term<4>(w[p], sb[p], xs, xcs, it), y);
  }
  y = warp_sum(y);
  if (lane == 0) a.out[row] = y;
}

int shared_width(const MoeArgs& a) { return a.Is > 0 ? a.Is : a.I; }

}  // namespace

Status moe_gate_up(const MoeArgs& a0, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  MoeArgs a = a0;
  a.Is = shared_width(a0);
  if (a.H % 64 != 0 || a.H <= 0 || a.H > 4096) return cu_err("moe_gate_up: H={} unsupported (multiple of 64, ≤ 4096)", a.H);
  if (a.I % 32 != 0 || a.Is % 32 != 0 || a.I <= 0) return cu_err("moe_gate_up: widths I={} Is={} must be multiples of 32", a.I, a.Is);
  if (a.sh_gate_up.rows != 2 * a.Is) return cu_err("moe_gate_up: shared [gate|up] has {} rows, want 2·{}", a.sh_gate_up.rows, a.Is);
  if (a.top_k < 1 || a.top_k > 16) return cu_err("moe_gate_up: top_k={} unsupported (1..16)", a.top_k);
  const int nch = a.H / 32, cpl = (nch + 31) / 32;
  if (a.logits && (a.n_experts < a.top_k || a.n_experts > kThreads))
    return cu_err("moe_gate_up: routing in the kernel needs top_k ≤ E ≤ {} (E={})", kThreads, a.n_experts);
  const size_t smem = size_t(nch * Chunk<4>::kStride + nch + (a.logits ? kTopkScratch + 16 + 17 : 0)) * sizeof(float);
  const int wmax = a.I > a.Is ? a.I : a.Is;
  dim3 grid((wmax + kWarps - 1) / kWarps, a.top_k + 1);
  if (cpl == 1) return launch_k("moe_gate_up", gate_up_kernel<1>, grid, dim3(kThreads), smem, s, a);
  if (cpl == 2) return launch_k("moe_gate_up", gate_up_kernel<2>, grid, dim3(kThreads), smem, s, a);
  return launch_k("moe_gate_up", gate_up_kernel<4>, grid, dim3(kThreads), smem, s, a);
}

Status moe_down_combine(const MoeArgs& a0, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  MoeArgs a = a0;
  a.Is = shared_width(a0);
  if (a.top_k < 1 || a.top_k > 16) return cu_err("moe_down_combine: top_k={} unsupported (1..16)", a.top_k);
  if (a.I % 32 != 0 || a.Is % 32 != 0 || a.I <= 0) return cu_err("moe_down_combine: widths I={} Is={} must be multiples of 32", a.I, a.Is);
  if (a.sh_down.cols != a.Is || a.down.cols != a.I) return cu_err("moe_down_combine: down widths {} / {} differ from I={} / Is={}", a.down.cols, a.sh_down.cols, a.I, a.Is);
  const int n_items = a.top_k * (a.I / 32) + a.Is / 32, P = (n_items + 31) / 32;
  if (a.logits && (a.n_experts < a.top_k || a.n_experts > kThreads))
    return cu_err("moe_down_combine: routing in the kernel needs top_k ≤ E ≤ {} (E={})", kThreads, a.n_experts);
  if (moe_down_tc_ok(a)) return moe_down_tc(a, s);  // tensor cores (MoeArgs::tc)
  const size_t smem = size_t(n_items * Chunk<4>::kStride + n_items + (a.logits ? kTopkScratch + 16 + 17 : 0)) * sizeof(float);
  if (smem > 200 * 1024) return cu_err("moe_down_combine: {} chunks per row exceed shared memory", n_items);
  const dim3 grid((a.H + kWarps - 1) / kWarps), block(kThreads);
  auto go = [&](auto kern) -> Status {
    if (smem > 48 * 1024) LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return launch_k("moe_down_combine", kern, grid, block, smem, s, a);
  };
  if (P <= 1) return go(down_kernel<1>);
  if (P <= 2) return go(down_kernel<2>);
  if (P <= 3) return go(down_kernel<3>);
  if (P <= 5) return go(down_kernel<5>);
  if (P <= 8) return go(down_kernel<8>);
  if (P <= 12) return go(down_kernel<12>);
  if (P <= 17) return go(down_kernel<17>);
  return cu_err("moe_down_combine: {} chunks per row unsupported (≤ 544)", n_items);
}

}  // namespace lily::cuda
