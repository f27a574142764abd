// Tensor-core 4-bit GEMV for batch-1 decode (K = 2048 or 4096): integer mma.sync m16n8k32
// (s8 codes 0..15 × s8 limbs → s32, exact). The fp32 input x is staged once per block as 4 signed 7-bit
// limbs against one power-of-two scale S (x·S = L0 + L1/128 + L2/128² + L3/128³, |x·S| ≤ 64, so
// 27 bits below the largest |x|): the limbs are the 4 used columns of B, the weight codes (0..15,
// exact) are A, and each group of 64 codes gives Σq·L_c exactly; y = (Σ_g s_g·Σq·xS + b_g·Σx·S)/S.
// Warps split K (8 slices), a block owns 16·T rows per pass; prologues add+RMSNorm or plain,
// epilogues none or the lm_head argmax (same rules as gemv_q4.cu). Selected by gemv() for the decode
// step's calls (GemvArgs::tc) where it applies; other calls and shapes take gemv_q4.cu's CUDA-core kernels.
#include "backend/cuda/gemm/gemv_argmax.cuh"
#include "backend/cuda/gemm/gemv_tc.h"
#include "backend/cuda/common/tc_dot.cuh"

namespace lily::cuda {
namespace {

// Shared memory: staged x (tc_dot.cuh), row partials [2][8][16T], red [64].
template <int K, int T> constexpr size_t tc_smem() { return size_t(tc_stage_bytes(K)) + 2 * 8 * 16 * T * 4 + 64 * 4; }

template <Pro PRO, Epi EPI, int K, int T> __global__ void __launch_bounds__(256, 2) gemv_tc_kernel(GemvArgs a) {
  constexpr int NG = K / 64, GP = NG / 8, RT = 16 * T;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* bs = smem;
  float* xs_g = reinterpret_cast<float*>(smem + NG * 256);
  float* part = xs_g + NG;  // [2][8][RT]
  float* red = part + 2 * 8 * RT;
  // g: the lane's row in each 8-row half of a tile; t: its lane in the quad.
  const int rows = a.w.rows, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ntiles = (rows + RT - 1) / RT;
  int tile = blockIdx.x;

  uint2 wa[T][GP][2];
  uint32_t sba[T][GP][2];
  auto load = [&](int tl) {
#pragma unroll
    for (int j = 0; j < T; ++j)
#pragma unroll
      for (int i = 0; i < GP; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = tl * RT + 16 * j + 8 * h + g, G = warp * GP + i;
          if (tl < ntiles && r < rows) {
            wa[j][i][h] = __ldg(reinterpret_cast<const uint2*>(a.w.codes) + size_t(r) * (K / 16) + G * 4 + t);
            sba[j][i][h] = __ldg(reinterpret_cast<const uint32_t*>(a.w.sb) + size_t(r) * NG + G);
          } else {
            wa[j][i][h] = make_uint2(0, 0);
            sba[j][i][h] = 0;
          }
        }
  };
  load(tile);  // weights only: may overlap the previous kernel
  constexpr int NO = K / 2048;
  float gn[NO][8];
#pragma unroll
  for (int j = 0; j < NO; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      gn[j][i] = PRO == Pro::kAddNorm ? bf(__ldg(static_cast<const uint16_t*>(a.gain) + 8 * (threadIdx.x + 256 * j) + i)) : 1.f;
  pdl_wait_after_loads(a.w.rows);
  pdl_trigger();
  const float invS = tc_stage<PRO == Pro::kAddNorm, NO>(a.in, a.mix, gn, K, a.eps, a.res_out, a.n_out, bs, xs_g, red);
  __syncthreads();

  const TcLane L;
  float bv = -FLT_MAX;
  int bi = INT_MAX, buf = 0;
  for (; tile < ntiles; tile += gridDim.x) {
    float acc[T][2];
#pragma unroll
    for (int j = 0; j < T; ++j) acc[j][0] = acc[j][1] = 0.f;
#pragma unroll
    for (int i = 0; i < GP; ++i) {
      const int G = warp * GP + i;
      const uint4 bq = tc_bfrag(bs, G);
      const float xsb = xs_g[G] * L.cb;
#pragma unroll
      for (int j = 0; j < T; ++j) {
        float v0, v1;
        tc_group(wa[j][i][0], wa[j][i][1], bq, L, v0, v1);
        acc[j][0] = tc_fold(acc[j][0], sba[j][i][0], v0, xsb);
        acc[j][1] = tc_fold(acc[j][1], sba[j][i][1], v1, xsb);
      }
    }
    load(tile + gridDim.x);  // next pass's rows, in flight during the reduction
#pragma unroll
    for (int j = 0; j < T; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = tc_quad_sum(acc[j][h]);
        if (t == 0) part[(buf * 8 + warp) * RT + 16 * j + 8 * h + g] = s;
      }
    __syncthreads();
    if (threadIdx.x < RT) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) s += part[(buf * 8 + w) * RT + threadIdx.x];
      const float yv = s * invS;
      const int r = tile * RT + threadIdx.x;
      if (r < rows) {
        a.y[r] = yv;
        if constexpr (EPI == Epi::kArgmax)
          if (yv == yv && topk_better(yv, r, bv, bi)) bv = yv, bi = r;
      }
    }
    buf ^= 1;
  }

  if constexpr (EPI == Epi::kArgmax) {
    __shared__ int flag;
    __shared__ float wbv[8];
    __shared__ int wbi[8];
    if (warp == 0) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (topk_better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (lane == 0) static_cast<float2*>(a.partial)[blockIdx.x] = make_float2(bv, __int_as_float(bi));
    }
    if (grid_last_block(&a.ctl->counter[1], &flag)) argmax_finish(a, 8, wbv, wbi);
  }
}

// One 16-row tile per warp pass (T = 1), 2 blocks per SM, at K 2048 and 4096. K 2048, 256 context with
// the tensor-core MoE kernels, H200 (docs/perf/2026-12-03-cuda-decode-5.md): 500.6 tok/s vs 478.5 with two
// tiles per pass and 497.0 with a register cap for 3 blocks per SM. (A rolling L2 prefetch of later
// passes, c2753f9, off by default and never measured, is gone.)
template <Pro PRO, Epi EPI, int K> Status launch_tc(const GemvArgs& a, cudaStream_t s) {
  constexpr int T = 1;
  auto kern = gemv_tc_kernel<PRO, EPI, K, T>;
  constexpr size_t smem = tc_smem<K, T>();
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, smem) != cudaSuccess || per_sm <= 0) per_sm = 1;
  per_sm = per_sm > 8 ? 8 : per_sm;  // the argmax scratch holds 8 per SM
  int cap = sm_count() * per_sm;
  if (a.max_blocks > 0 && a.max_blocks < cap) cap = a.max_blocks;
  const int ntiles = (a.w.rows + 16 * T - 1) / (16 * T);
  return launch_k("gemv_tc", kern, dim3(ntiles < cap ? ntiles : cap), dim3(256), smem, s, a);
}

template <Pro PRO, Epi EPI> Status dispatch_k(const GemvArgs& a, cudaStream_t s) {
  if (a.w.cols == 4096) return launch_tc<PRO, EPI, 4096>(a, s);
  return launch_tc<PRO, EPI, 2048>(a, s);
}

}  // namespace

// Every kind it takes (add-norm, plain, lm_head argmax) for the calls that ask for it (GemvArgs::tc, the
// decode step). H200, 2026-12-03 (docs/perf/2026-12-03-cuda-decode-5.md), 256 context: 518.8 tok/s with
// the tensor-core MoE down kernel too (default), 453.6 with both off; GEMV alone (T 2 then) 471.2 vs 452.8.
bool gemv_tc_eligible(const GemvArgs& a) {
  if (!a.tc || a.w.bits != 4 || (a.w.cols != 2048 && a.w.cols != 4096)) return false;
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(a.in) || misaligned(a.mix) || misaligned(a.res_out) || misaligned(a.w.codes) || misaligned(a.w.sb))
    return false;
  if (a.epi == Epi::kArgmax) return a.pro == Pro::kPlain || a.pro == Pro::kAddNorm;
  if (a.epi != Epi::kNone) return false;
  return a.pro == Pro::kAddNorm || a.pro == Pro::kPlain;
}

Status gemv_tc(const GemvArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.epi == Epi::kArgmax)
    return a.pro == Pro::kAddNorm ? dispatch_k<Pro::kAddNorm, Epi::kArgmax>(a, s) : dispatch_k<Pro::kPlain, Epi::kArgmax>(a, s);
  return a.pro == Pro::kAddNorm ? dispatch_k<Pro::kAddNorm, Epi::kNone>(a, s) : dispatch_k<Pro::kPlain, Epi::kNone>(a, s);
}

}  // namespace lily::cuda
