// Quantized GEMV over the packed MLX layout (4-bit and 8-bit, group 64): R rows per warp (2 with
// 8-warp blocks, 1 with 2-warp blocks when the matrix has too few rows to give every SM a block),
// 16-byte code loads issued before the input is staged (and before the PDL wait, so they overlap
// the previous kernel), y = Σ scale·Σqx + bias·Σx in fp32 from an fp32 input.
// The input staging (prologue) fuses the residual add + RMSNorm or the GDN gated norm; the
// epilogue fuses the router top-k or the lm_head argmax (last block done), so a decode step
// needs no separate norm, top-k or argmax kernels.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdlib>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/gemv_argmax.cuh"
#include "backend/cuda/gemm/gemv_tc.h"

namespace lily::cuda {
namespace {

constexpr int kMaxWarps = 8;

// Input staging. Every thread issues all its loads (up to U = 16 elements: K ≤ 4096 with 256
// threads) before the first use and the norm gains are loaded before the PDL wait (weights), so a
// block pays about one L2 latency per pass instead of one per element (the loops used to store to
// global memory between loads, which the compiler may not reorder).
constexpr int kU = 16;  // most elements per thread (K ≤ 4096)
// Elements per thread for a GEMV with CPL chunks per lane: K ≤ 32·CPL·128/BITS.
template <int BITS, int CPL> constexpr int stage_u() { return CPL * 16 / BITS < kU ? CPL * 16 / BITS : kU; }
template <int U> struct StageRegs {
  float g[U];  // norm gain of this thread's elements (bf16 → fp32), loaded before the PDL wait
};
template <Pro PRO, int kU> __device__ __forceinline__ void stage_pre(const GemvArgs& a, int K, StageRegs<kU>& r) {
  if constexpr (PRO == Pro::kPlain) return;
  const uint16_t* gain = static_cast<const uint16_t*>(a.gain);
  const int nt = blockDim.x;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int e = threadIdx.x + u * nt;
    const int d = PRO == Pro::kGatedNorm ? e % a.gn_dv : e;
    r.g[u] = e < K ? bf(__ldg(gain + d)) : 0.f;
  }
}

template <int BITS> __device__ __forceinline__ void put_x(int e, float x, float* xs, float* xcs) {
  constexpr int CC = Chunk<BITS>::kCodes;
  const int lane = threadIdx.x & 31;
  xs[xs_index<BITS>(e)] = x;
  float s = x;
#pragma unroll
  for (int o = CC / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane % CC == 0) xcs[e / CC] = s;
}

// Needs K ≤ kU·blockDim.x (checked at launch). Elements of thread t: t + u·blockDim.x.
template <int BITS, Pro PRO, int kU>
__device__ __forceinline__ void stage_x(const GemvArgs& a, int K, float* xs, float* xcs, float* red, float* hs,
                                        const StageRegs<kU>& r) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nt = blockDim.x;
  const float* __restrict__ in = a.in;
  if constexpr (PRO == Pro::kPlain) {
    stage_plain<BITS>(in, K, xs, xcs);
  } else if constexpr (PRO == Pro::kAddNorm) {
    const float* __restrict__ mix = a.mix;
    float v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = threadIdx.x + u * nt;
      v[u] = e < K ? __ldcg(in + e) : 0.f;
    }
    if (mix) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int e = threadIdx.x + u * nt;
        if (e < K) v[u] += __ldcg(mix + e);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kU; ++u) ss += v[u] * v[u];  // zeros past K
    if (blockIdx.x == 0 && a.res_out) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (threadIdx.x + u * nt < K) a.res_out[threadIdx.x + u * nt] = v[u];
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(K) + a.eps);
    float* n_out = blockIdx.x == 0 ? a.n_out : nullptr;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = threadIdx.x + u * nt;
      if (e - lane < K) {  // warp-uniform (K, nt multiples of 32)
        const float x = v[u] * inv * r.g[u];
        if (n_out) n_out[e] = x;
        put_x<BITS>(e, x, xs, xcs);
      }
    }
  } else {  // kGatedNorm
    const float* __restrict__ z = a.z;
    // Per-32 partial sums of squares, then per-head sums in a fixed order (deterministic).
    const int dv = a.gn_dv, nh = K / dv;
    float* part = hs + 64;  // [K/32]
    float v[kU], zv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = threadIdx.x + u * nt;
      v[u] = e < K ? __ldcg(in + e) : 0.f;
      zv[u] = e < K ? __ldcg(z + e) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = threadIdx.x + u * nt;
      if (e - lane < K) {
        const float s = warp_sum(v[u] * v[u]);
        if (lane == 0) part[e / 32] = s;
      }
    }
    __syncthreads();
    for (int h = threadIdx.x; h < nh; h += nt) {
      float t = 0.f;
      for (int j = 0; j < dv / 32; ++j) t += part[h * (dv / 32) + j];
      hs[h] = t;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = threadIdx.x + u * nt;
      if (e - lane < K) {
        const float inv = 1.0f / sqrtf(hs[e / dv] / float(dv) + a.eps);
        put_x<BITS>(e, r.g[u] * v[u] * inv * silu(zv[u]), xs, xcs);
      }
    }
    (void)warp;
  }
}

__device__ void router_topk(const GemvArgs& a, float* p) {
  // One warp: softmax over E fp32 logits, top_k rounds of argmax (ties → lowest id), renormalize.
  const int lane = threadIdx.x & 31, E = a.n_experts;
  const float* l = static_cast<const float*>(a.y);
  const WarpTopk r = warp_router_topk(l, E, a.top_k, p);
  if (lane < a.top_k) {
    a.topk_ids[lane] = r.id;
    a.topk_w[lane] = a.norm_topk ? r.p / r.tsum : r.p;
  }
  if (lane == 0 && a.w.rows > E) a.topk_w[a.top_k] = sigmoid(__ldcg(l + E));
}

template <int BITS, int CPL, int R, Pro PRO, Epi EPI> __global__ void __launch_bounds__(256) gemv_kernel(GemvArgs a) {
  extern __shared__ float sm[];
  constexpr int CS = Chunk<BITS>::kStride;
  const int K = a.w.cols, nch = K * BITS / 128, rows = a.w.rows;
  float* xs = sm;
  float* xcs = xs + nch * CS;
  float* red = xcs + nch;
  float* hs = red + 32;  // [64] head sums (gated norm), then [K/32] partials
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int rstep = gridDim.x * nw * R;

  uint4 wv[R][CPL];
  uint32_t sbv[R][CPL];
  auto load_tile = [&](int rb) {
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int i = 0; i < CPL; ++i) {
        const int r = rb + j, c = lane + 32 * i;
        if (r < rows && c < nch) {
          wv[j][i] = load_chunk(a.w, r, c, nch);
          sbv[j][i] = load_sb<BITS>(a.w, r, c);
        } else {
          wv[j][i] = make_uint4(0, 0, 0, 0);
          sbv[j][i] = 0;
        }
      }
  };
  int rb = (blockIdx.x * nw + warp) * R;
  StageRegs<stage_u<BITS, CPL>()> sr;
  load_tile(rb);  // weights only: may overlap the previous kernel
  stage_pre<PRO>(a, K, sr);  // (K ≤ 32·CPL·128/BITS = stage_u·256 by the dispatch)
  pdl_wait_after_loads(a.w.rows);
  pdl_trigger();
  stage_x<BITS, PRO>(a, K, xs, xcs, red, hs, sr);
  __syncthreads();

  float bv = -FLT_MAX;
  int bi = INT_MAX;
  for (; rb < rows; rb += rstep) {
    float acc[R];
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = 0.f;
    // Each chunk's x (shared memory) is read once for all R rows.
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int c = lane + 32 * i;
      if (c < nch) {
        const float* xc = xs + c * CS;
        const float xsum = xcs[c];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const float d = chunk_dot<BITS>(wv[j][i], xc);
          acc[j] += fmaf(__uint_as_float(sbv[j][i] << 16), d, __uint_as_float(sbv[j][i] & 0xFFFF0000u) * xsum);
        }
      }
    }
    const int next = rb + rstep;
    if (next < rows) load_tile(next);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const float v = warp_sum(acc[j]);
      const int r = rb + j;
      if (r < rows) {
        if (lane == 0) a.y[r] = v;
        if constexpr (EPI == Epi::kArgmax)
          if (v == v && topk_better(v, r, bv, bi)) bv = v, bi = r;
      }
    }
  }

  if constexpr (EPI == Epi::kTopK) {
    __shared__ int flag;
    if (grid_last_block(&a.ctl->counter[0], &flag)) {
      if (warp == 0) router_topk(a, xs);
      if (threadIdx.x == 0) a.ctl->counter[0] = 0;
    }
  } else if constexpr (EPI == Epi::kArgmax) {
    __shared__ float wbv[kMaxWarps];
    __shared__ int wbi[kMaxWarps];
    __shared__ int flag;
    if (lane == 0) wbv[warp] = bv, wbi[warp] = bi;
    __syncthreads();
    float2* part = static_cast<float2*>(a.partial);
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (topk_better(wbv[w], wbi[w], bv, bi)) bv = wbv[w], bi = wbi[w];
      part[blockIdx.x] = make_float2(bv, __int_as_float(bi));
    }
    if (grid_last_block(&a.ctl->counter[1], &flag)) argmax_finish(a, nw, wbv, wbi);
  }
}


// Grid cap per SM (≤ 8 keeps the argmax scratch valid).
constexpr int kBlocksPerSm = 8;

// Small matrices (fewer than 2 16-row tiles per SM: out_proj/o_proj, the router) use 8-warp blocks
// with 1 row per warp (twice the blocks). Measured on the H200: +1.4% decode at 256 over 2-row warps;
// 1–4-warp blocks were far worse (each block's input staging is work over the whole K: router 34 µs
// vs 13) and are gone (the staging assumes 256 threads). Other matrices, the lm_head (argmax)
// included, take 2 rows per warp.
constexpr int kSmallWarps = 8;

// The grid is capped at what is resident at once (occupancy × SMs, at most kBlocksPerSm per SM), so a
// matrix with more 16-row tiles than slots loops inside one wave instead of paying a second wave's
// launch, load latency and input staging.
template <typename K> int resident_blocks(K kern, int threads, size_t smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem) != cudaSuccess || per_sm <= 0) per_sm = 1;
  return sm_count() * std::min(per_sm, kBlocksPerSm);
}

template <int BITS, int CPL, Pro PRO, Epi EPI> Status launch(const GemvArgs& a, cudaStream_t s) {
  const int nch = a.w.cols * BITS / 128;
  const size_t smem = size_t(nch * Chunk<BITS>::kStride + nch + 32 + 64 + 256) * sizeof(float);
  const int need2 = (a.w.rows + 15) / 16, nw = kSmallWarps;
  if (EPI != Epi::kArgmax && need2 < 2 * sm_count()) {
    auto kern = gemv_kernel<BITS, CPL, 1, PRO, EPI>;
    const int cap = a.max_blocks > 0 ? a.max_blocks : resident_blocks(kern, 32 * nw, smem);
    const int need1 = (a.w.rows + nw - 1) / nw;
    return launch_k("gemv", kern, dim3(need1 < cap ? need1 : cap), dim3(32 * nw), smem, s, a);
  }
  auto kern = gemv_kernel<BITS, CPL, 2, PRO, EPI>;
  const int cap = a.max_blocks > 0 ? a.max_blocks : resident_blocks(kern, 256, smem);
  return launch_k("gemv", kern, dim3(need2 < cap ? need2 : cap), dim3(256), smem, s, a);
}

template <int BITS, int CPL> Status dispatch_pe(const GemvArgs& a, cudaStream_t s) {
  if constexpr (BITS == 8) {
    if (a.pro == Pro::kAddNorm && a.epi == Epi::kTopK) return launch<8, CPL, Pro::kAddNorm, Epi::kTopK>(a, s);
    if (a.pro == Pro::kAddNorm && a.epi == Epi::kNone) return launch<8, CPL, Pro::kAddNorm, Epi::kNone>(a, s);
    if (a.pro == Pro::kPlain && a.epi == Epi::kNone) return launch<8, CPL, Pro::kPlain, Epi::kNone>(a, s);
    if (a.pro == Pro::kPlain && a.epi == Epi::kTopK) return launch<8, CPL, Pro::kPlain, Epi::kTopK>(a, s);
  } else {
    if (a.epi == Epi::kNone) {
      if (a.pro == Pro::kPlain) return launch<4, CPL, Pro::kPlain, Epi::kNone>(a, s);
      if (a.pro == Pro::kAddNorm) return launch<4, CPL, Pro::kAddNorm, Epi::kNone>(a, s);
      if (a.pro == Pro::kGatedNorm) return launch<4, CPL, Pro::kGatedNorm, Epi::kNone>(a, s);
    } else if (a.epi == Epi::kArgmax) {
      if (a.pro == Pro::kPlain) return launch<4, CPL, Pro::kPlain, Epi::kArgmax>(a, s);
      if (a.pro == Pro::kAddNorm) return launch<4, CPL, Pro::kAddNorm, Epi::kArgmax>(a, s);
    }
  }
  return cu_err("gemv: unsupported combination bits={} prologue={} epilogue={}", BITS, int(a.pro), int(a.epi));
}

}  // namespace

Status gemv(const GemvArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const QW& w = a.w;
  if (w.bits != 4 && w.bits != 8) return cu_err("gemv: {} bits unsupported", w.bits);
  if (w.cols % 64 != 0 || w.cols <= 0) return cu_err("gemv: K={} must be a positive multiple of 64", w.cols);
  if (!a.in || !a.y) return cu_err("gemv: null input or output");
  if (w.rows <= 0) return cu_err("gemv: no rows");
  if (a.pro != Pro::kPlain && w.cols > kU * 256)
    return cu_err("gemv: K={} too large for the normed input staging", w.cols);
  if (a.pro == Pro::kGatedNorm && (a.gn_dv % 32 != 0 || w.cols / a.gn_dv > 64 || w.cols % a.gn_dv != 0))
    return cu_err("gemv: gated norm head dim {} unsupported for K={}", a.gn_dv, w.cols);
  if (a.epi != Epi::kNone && !a.ctl) return cu_err("gemv: epilogue needs the step control block");
  if (a.epi == Epi::kTopK && (a.n_experts > w.cols || a.top_k > 32 || a.top_k > a.n_experts || a.top_k < 1))
    return cu_err("gemv: router top-k needs E ≤ K and 1 ≤ k ≤ 32 (E={}, k={})", a.n_experts, a.top_k);
  if (a.epi == Epi::kArgmax && !a.partial) return cu_err("gemv: argmax needs scratch");
  if (gemv_tc_eligible(a)) return gemv_tc(a, stream);  // tensor-core path (GemvArgs::tc)
  const int nch = w.cols * w.bits / 128;
  const int cpl = (nch + 31) / 32;
  if (w.bits == 4) {
    if (cpl == 1) return dispatch_pe<4, 1>(a, s);
    if (cpl == 2) return dispatch_pe<4, 2>(a, s);
    if (cpl <= 4) return dispatch_pe<4, 4>(a, s);
  } else {
    if (cpl == 1) return dispatch_pe<8, 1>(a, s);
    if (cpl == 2) return dispatch_pe<8, 2>(a, s);
    if (cpl <= 4) return dispatch_pe<8, 4>(a, s);
  }
  return cu_err("gemv: K={} too large for {}-bit", w.cols, w.bits);
}

int gemv_argmax_max_blocks() { return sm_count() * 8; }

}  // namespace lily::cuda
