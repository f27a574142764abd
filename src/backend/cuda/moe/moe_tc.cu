// The MoE decode down kernel on tensor cores (tc_dot.cuh: x as 4 int8 limbs, codes as A of
// mma.sync m16n8k32 s8 → s32): moe.cu's down kernel with the same routing (block_router_topk) and
// PDL placement, selected by moe_down_combine for the decode step's calls (MoeArgs::tc) at the shapes
// below; other calls and shapes, and gate+up always, take moe.cu's kernels.
// Block of 16 output rows, the act vector [k·I + Is] split by groups of 64 over the 8 warps (group G:
// warp G mod 8), each group's term weighted by its slot's combine weight.
#include "backend/cuda/moe/dec_topk.cuh"
#include "backend/cuda/moe/moe_tc.h"
#include "backend/cuda/common/tc_dot.cuh"

namespace lily::cuda {
namespace {

constexpr int kDnMaxGPW = 9;  // groups per warp at most (k·I + Is ≤ 4608)

// Shared memory after the staged x: partials [8][16], red [64], top-k scratch.
constexpr size_t kTopkBytes = (kTopkScratch + 16 + 17) * 4;
size_t dn_smem(int K) { return size_t(tc_stage_bytes(K)) + 8 * 16 * 4 + 64 * 4 + kTopkBytes; }

template <int NO> __global__ void __launch_bounds__(256, 1) down_tc_kernel(MoeArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int H = a.H, I = a.I, Is = a.Is, k = a.top_k, K = k * I + Is, NG = K / 64;
  uint8_t* bs = smem;
  float* xs_g = reinterpret_cast<float*>(smem + NG * 256);
  float* part = xs_g + NG;  // [8][16]
  float* red = part + 8 * 16;
  float* sc = red + 64;
  int* ids = reinterpret_cast<int*>(sc + kTopkScratch);
  float* ws = reinterpret_cast<float*>(ids + 16);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  // Ids and weights from the router, two kernels back: complete before this kernel's wait.
  const int32_t* tids = a.topk_ids;
  const float* tw = a.topk_w;
  if (a.logits) {
    const float lv = int(threadIdx.x) < a.n_experts ? __ldcg(a.logits + threadIdx.x) : -INFINITY;
    block_router_topk(lv, __ldcg(a.logits + a.n_experts), a.n_experts, k, a.norm_topk, sc, ids, ws);
    if (blockIdx.x == 0 && int(threadIdx.x) <= k) {
      if (a.ids_out && int(threadIdx.x) < k) a.ids_out[threadIdx.x] = ids[threadIdx.x];
      if (a.w_out) a.w_out[threadIdx.x] = ws[threadIdx.x];
    }
    tids = ids, tw = ws;
  }
  uint2 wa[kDnMaxGPW][2];
  uint32_t sba[kDnMaxGPW][2];
  float wt[kDnMaxGPW];
#pragma unroll
  for (int i = 0; i < kDnMaxGPW; ++i) {
    const int G = warp + 8 * i, c0 = G * 64;
    wt[i] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) wa[i][h] = make_uint2(0, 0), sba[i][h] = 0;
    if (G >= NG) continue;
    const bool routed = c0 < k * I;
    const int j = routed ? c0 / I : k, gi = routed ? (c0 % I) / 64 : (c0 - k * I) / 64, cols = routed ? I : Is;
    const QW& w = routed ? a.down : a.sh_down;
    wt[i] = tw[j];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h + g;
      if (r < H) {
        const size_t row = (routed ? size_t(tids[j]) * H : 0) + r;
        wa[i][h] = __ldg(reinterpret_cast<const uint2*>(w.codes) + row * (cols / 16) + gi * 4 + t);
        sba[i][h] = __ldg(reinterpret_cast<const uint32_t*>(w.sb) + row * (cols / 64) + gi);
      }
    }
  }
  pdl_wait();
  pdl_trigger();
  const float gn[NO][8] = {};
  const float invS = tc_stage<false, NO>(a.act, nullptr, gn, K, 0.f, nullptr, nullptr, bs, xs_g, red);
  __syncthreads();
  const TcLane L;
  float acc[2] = {};
#pragma unroll
  for (int i = 0; i < kDnMaxGPW; ++i) {
    const int G = warp + 8 * i;
    if (G < NG) {  // warp-uniform
      const uint4 bq = tc_bfrag(bs, G);
      const float xsb = xs_g[G] * L.cb;
      float v0, v1;
      tc_group(wa[i][0], wa[i][1], bq, L, v0, v1);
      acc[0] = fmaf(wt[i], tc_fold(0.f, sba[i][0], v0, xsb), acc[0]);
      acc[1] = fmaf(wt[i], tc_fold(0.f, sba[i][1], v1, xsb), acc[1]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float s = tc_quad_sum(acc[h]);
    if (t == 0) part[warp * 16 + 8 * h + g] = s;
  }
  __syncthreads();
  if (threadIdx.x < 16 && r0 + int(threadIdx.x) < H) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) s += part[w * 16 + threadIdx.x];
    a.out[r0 + threadIdx.x] = s * invS;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

// Down only, for the calls that ask for it (MoeArgs::tc, the decode step). H200, 2026-12-03
// (docs/perf/2026-12-03-cuda-decode-5.md), 256 context, with the tensor-core GEMV: 518.8 tok/s with down
// only, 500.6 with gate+up on tensor cores too (13.2 µs per launch vs 11.8 for moe.cu's; that kernel is
// gone), 453.6 with all tensor-core kernels off.
bool moe_down_tc_ok(const MoeArgs& a) {
  const int K = a.top_k * a.I + a.Is;
  return a.tc && a.I % 64 == 0 && a.Is % 64 == 0 && K <= 8 * 64 * kDnMaxGPW && a.H % 16 == 0 &&
         a.down.bits == 4 && a.sh_down.bits == 4 && aligned16(a.act) && aligned16(a.down.codes) &&
         aligned16(a.sh_down.codes) && (!a.logits || (a.n_experts >= a.top_k && a.n_experts <= kTopkThreads));
}

Status moe_down_tc(const MoeArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int K = a.top_k * a.I + a.Is;
  const size_t smem = dn_smem(K);
  const dim3 grid((a.H + 15) / 16);
  if (K <= 2048) return launch_k("moe_down_tc", down_tc_kernel<1>, grid, dim3(256), smem, s, a);
  if (K <= 4096) return launch_k("moe_down_tc", down_tc_kernel<2>, grid, dim3(256), smem, s, a);
  return launch_k("moe_down_tc", down_tc_kernel<3>, grid, dim3(256), smem, s, a);
}

}  // namespace lily::cuda
