// Attention prefill: (1) per token and head, q/k RMSNorm + partial NeoX RoPE; K/V written into the
// cache (fp32 or bf16) at their positions, q to a bf16 scratch (hi, and lo = q − hi when split);
// (2) causal GQA flash attention. Split operands (terms = 3, fp32 caches, the default): the wgmma
// kernel of attn_wg.cu, every operand x as bf16 hi + lo (lo = bf16(x − hi)) and each product as
// hi·hi + hi·lo + lo·hi, ~16-bit operands instead of 8 (one bf16 rounding of K/V alone moves the
// random golden models' logprobs by ~0.2; helpers-common numerics finding). Plain bf16 operands
// (terms = 1: bf16 caches, LILY_CUDA_KV=bf16, or LILY_PREFILL_ATTN_TERMS=1): the mma.sync kernel
// here (m16n8k16 bf16 → f32): a block = 64 query tokens of one head, 4 warps × 16 rows, key tiles
// of 64 from the cache (positions 0..pos0+m; the latest query blocks first), online softmax in
// fp32 (exp2), P as A fragments straight from the S accumulators, V via ldmatrix.trans; the sigmoid
// output gate is applied in the epilogue (fp32 out [M, nh·hd]). (Its split-operand variant lost to
// wgmma, +1.6% / +4.0% prefill at 8k / 32k, docs/perf/2026-12-03-cuda-prefill-4.md, and is gone.)
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/attention/attn_common.cuh"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

// Query rows per block (threads: 2 per row) and keys per tile of flash_kernel.
constexpr int kBQ = 64, kBKV = 64;

// Grid (rows of the longest segment, nh + nkv, segments): block (m, head) of segment z.
__global__ void prep_kernel(AttnPrefillArgs base, AttnSegs segs) {
  extern __shared__ float xsh[];
  __shared__ float red[32];
  const AttnSeg& sg = segs.s[blockIdx.z];
  if (int(blockIdx.x) >= sg.M) return;  // block-uniform
  const AttnPrefillArgs a = seg_attn_args(base, sg);
  const int m = blockIdx.x, b = blockIdx.y, d = threadIdx.x, hd = a.hd, pos = a.pos0 + m;
  const float* u = a.u + size_t(m) * a.ldu;
  const bool is_q = b < a.nh;
  const int kvh = b - a.nh;
  const float raw = is_q ? u[b * a.qw + d] : u[a.nh * a.qw + kvh * hd + d];
  const float y = qk_norm_rope(raw, static_cast<const uint16_t*>(is_q ? a.q_norm : a.k_norm), hd, a.eps, a.rot, a.theta, pos, xsh, red);
  if (is_q) {
    uint16_t* qb = static_cast<uint16_t*>(a.qb) + (size_t(m) * a.nh + b) * hd + d;
    const uint16_t hi = to_bf(y);
    qb[0] = hi;
    if (a.terms == 3) qb[size_t(a.M) * a.nh * hd] = to_bf(y - bf(hi));
  } else {
    const size_t at = (size_t(kvh) * a.max_seq + pos) * hd + d;
    const float vv = u[a.nh * a.qw + a.nkv * hd + kvh * hd + d];
    if (a.kv_f32) {
      static_cast<float*>(a.kc)[at] = y;
      static_cast<float*>(a.vc)[at] = vv;
    } else {
      static_cast<uint16_t*>(a.kc)[at] = to_bf(y);
      static_cast<uint16_t*>(a.vc)[at] = to_bf(vv);
    }
  }
}

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 8 cache values (bf16 or fp32) at p → 8 bf16 packed in a uint4.
template <bool F32> __device__ __forceinline__ uint4 load8(const void* base, size_t idx) {
  if constexpr (!F32) {
    return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + idx);
  } else {
    const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(base) + idx);
    const float4 x = f[0], y = f[1];
    return make_uint4(pack_bf2(x.x, x.y), pack_bf2(x.z, x.w), pack_bf2(y.x, y.y), pack_bf2(y.z, y.w));
  }
}

// Plain bf16 operands (F32: the caches hold fp32, rounded to bf16 as they load); 4 warps, 64-key tiles.
template <int HD, bool F32> __global__ void __launch_bounds__(128) flash_kernel(AttnPrefillArgs a) {
  constexpr int BQ = kBQ, BKV = kBKV, kThreads = BQ / 16 * 32, NKT = BKV / 8;
  constexpr int LD = HD + 8, NT = HD / 8;
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* Qs = sm;
  uint16_t* Ks = Qs + BQ * LD;
  uint16_t* Vs = Ks + BKV * LD;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BQ, h = blockIdx.y, kvh = h / (a.nh / a.nkv);
  const int kend = a.pos0 + min(m0 + BQ, a.M);
  constexpr int CPR = HD / 8;  // uint4 per row
  for (int idx = tid; idx < BQ * CPR; idx += kThreads) {
    const int r = idx / CPR, cc = idx % CPR;
    uint4 v = make_uint4(0, 0, 0, 0);
    const uint16_t* qrow = static_cast<const uint16_t*>(a.qb) + (size_t(m0 + r) * a.nh + h) * HD + cc * 8;
    if (m0 + r < a.M) {
      v = *reinterpret_cast<const uint4*>(qrow);
    }
    *reinterpret_cast<uint4*>(Qs + r * LD + cc * 8) = v;
  }
  const size_t kvbase = size_t(kvh) * a.max_seq * HD;
  float o[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int ra = warp * 16 + g;
  const int qpos[2] = {a.pos0 + m0 + ra, a.pos0 + m0 + ra + 8};
  const float sl2 = (1.0f / sqrtf(float(HD))) * 1.4426950408889634f;

  for (int j0 = 0; j0 < kend; j0 += BKV) {
    __syncthreads();
    for (int idx = tid; idx < BKV * CPR; idx += kThreads) {
      const int r = idx / CPR, cc = idx % CPR, j = j0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j < kend) {
        kv = load8<F32>(a.kc, kvbase + size_t(j) * HD + cc * 8);
        vv = load8<F32>(a.vc, kvbase + size_t(j) * HD + cc * 8);
      }
      *reinterpret_cast<uint4*>(Ks + r * LD + cc * 8) = kv;
      *reinterpret_cast<uint4*>(Vs + r * LD + cc * 8) = vv;
    }
    __syncthreads();
    float s[NKT][4];
#pragma unroll
    for (int i = 0; i < NKT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c0 = kk * 16 + 2 * t;
      uint32_t fa[4];
      fa[0] = *reinterpret_cast<const uint32_t*>(Qs + ra * LD + c0);
      fa[1] = *reinterpret_cast<const uint32_t*>(Qs + (ra + 8) * LD + c0);
      fa[2] = *reinterpret_cast<const uint32_t*>(Qs + ra * LD + c0 + 8);
      fa[3] = *reinterpret_cast<const uint32_t*>(Qs + (ra + 8) * LD + c0 + 8);
#pragma unroll
      for (int nt = 0; nt < NKT; ++nt) {
        const uint16_t* kr = Ks + (nt * 8 + g) * LD + c0;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr), b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
        mma_bf16(s[nt], fa, b0, b1);
      }
    }
    // Mask, scale (log2 domain), online softmax.
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NKT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = j0 + nt * 8 + 2 * t + (i & 1), hr = i >> 1;
        const float v = key <= qpos[hr] ? s[nt][i] * sl2 : -INFINITY;
        s[nt][i] = v;
        tmax[hr] = fmaxf(tmax[hr], v);
      }
    float corr[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 1));
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 2));
      const float mn = fmaxf(mrow[hr], tmax[hr]);
      corr[hr] = mn == -INFINITY ? 1.f : exp2f(mrow[hr] - mn);
      mrow[hr] = mn;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NKT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int hr = i >> 1;
        const float p = mrow[hr] == -INFINITY ? 0.f : exp2f(s[nt][i] - mrow[hr]);
        s[nt][i] = p;
        ls[hr] += p;
      }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) lrow[hr] = lrow[hr] * corr[hr] + ls[hr];
#pragma unroll
    for (int i = 0; i < NT; ++i) o[i][0] *= corr[0], o[i][1] *= corr[0], o[i][2] *= corr[1], o[i][3] *= corr[1];
    // O += P V
#pragma unroll
    for (int k2 = 0; k2 < BKV / 16; ++k2) {
      uint32_t pa[4];
      pa[0] = pack_bf2(s[2 * k2][0], s[2 * k2][1]);
      pa[1] = pack_bf2(s[2 * k2][2], s[2 * k2][3]);
      pa[2] = pack_bf2(s[2 * k2 + 1][0], s[2 * k2 + 1][1]);
      pa[3] = pack_bf2(s[2 * k2 + 1][2], s[2 * k2 + 1][3]);
      const int vrow = k2 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int dt = 0; dt < HD / 16; ++dt) {
        uint32_t vr[4];
        ldsm_x4_t(vr, Vs + vrow * LD + dt * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * dt], pa, vr[0], vr[1]);
        mma_bf16(o[2 * dt + 1], pa, vr[2], vr[3]);
      }
    }
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 1);
    lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 2);
  }
  const int ow = a.nh * HD;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int m = m0 + ra + 8 * hr;
    if (m >= a.M) continue;
    const float inv = 1.0f / lrow[hr];
    const float* gate = a.qw == 2 * HD ? a.u + size_t(m) * a.ldu + h * a.qw + HD : nullptr;
    float* out = a.out + size_t(m) * ow + h * HD;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int d = nt * 8 + 2 * t + i;
        float v = o[nt][2 * hr + i] * inv;
        if (gate) v = v * sigmoid(gate[d]);
        out[d] = v;
      }
  }
}

template <int HD> constexpr size_t flash_smem() { return size_t(kBQ + 2 * kBKV) * (HD + 8) * 2; }

template <int HD> Status launch_flash(const AttnPrefillArgs& a, cudaStream_t s) {
  const dim3 grid((a.M + kBQ - 1) / kBQ, a.nh);
  if (a.kv_f32)
    flash_kernel<HD, true><<<grid, kBQ * 2, flash_smem<HD>(), s>>>(a);
  else
    flash_kernel<HD, false><<<grid, kBQ * 2, flash_smem<HD>(), s>>>(a);
  return launch_status("pf::flash");
}
template <int HD> Status init_hd() {
  LILY_CU_TRY(cudaFuncSetAttribute(flash_kernel<HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(flash_smem<HD>())));
  LILY_CU_TRY(cudaFuncSetAttribute(flash_kernel<HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(flash_smem<HD>())));
  return Status::ok();
}

}  // namespace

Status attn_prefill_init() {
  static bool done = false;
  if (done) return Status::ok();
  LILY_TRY(init_hd<64>());
  LILY_TRY(init_hd<128>());
  LILY_TRY(init_hd<256>());
  done = true;
  return Status::ok();
}

Status attn_prefill(const AttnPrefillArgs& a, Stream stream) {
  AttnSeg sg;
  sg.u = a.u, sg.out = a.out, sg.kc = a.kc, sg.vc = a.vc, sg.qb = a.qb, sg.M = a.M, sg.pos0 = a.pos0, sg.max_seq = a.max_seq;
  return attn_prefill_segments(a, &sg, 1, stream);
}

Status attn_prefill_segments(const AttnPrefillArgs& a, const AttnSeg* segs, int n, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.hd != 64 && a.hd != 128 && a.hd != 256) return cu_err("pf::attn_prefill: head dim {} unsupported", a.hd);
  if (a.rot > a.hd || a.rot % 2 != 0 || a.rot <= 0) return cu_err("pf::attn_prefill: rotary dim {} unsupported", a.rot);
  if (a.nkv <= 0 || a.nh % a.nkv != 0) return cu_err("pf::attn_prefill: {} heads / {} kv heads", a.nh, a.nkv);
  if (a.terms != 1 && a.terms != 3) return cu_err("pf::attn_prefill: terms {} (1 or 3)", a.terms);
  if (a.terms == 3 && !a.kv_f32) return cu_err("pf::attn_prefill: split operands (terms 3) need fp32 caches");
  for (int i = 0; i < n; ++i)
    if (segs[i].pos0 < 0 || segs[i].pos0 + segs[i].M > segs[i].max_seq)
      return cu_err("pf::attn_prefill: positions {}+{} exceed the cache", segs[i].pos0, segs[i].M);
  // Groups of up to kMaxAttnSegs non-empty segments, each group one launch per kernel.
  for (int i0 = 0; i0 < n;) {
    AttnSegs g;
    int max_m = 0;
    for (; i0 < n && g.n < kMaxAttnSegs; ++i0)
      if (segs[i0].M > 0) g.s[g.n++] = segs[i0], max_m = std::max(max_m, segs[i0].M);
    if (g.n == 0) break;
    prep_kernel<<<dim3(max_m, a.nh + a.nkv, g.n), a.hd, a.hd * sizeof(float), s>>>(a, g);
    LILY_TRY(launch_status("pf::attn_prep"));
    if (a.prof) a.prof(a.prof_ctx, "attn: q/k norm+rope+cache (prep)");
    if (a.terms == 3) {  // (fp32 caches, checked above)
      LILY_TRY(attn_flash_wg(a, g, stream));
      if (a.prof) a.prof(a.prof_ctx, "attn: flash (wgmma, split operands)");
      continue;
    }
    LILY_TRY(attn_prefill_init());
    for (int j = 0; j < g.n; ++j) {  // the plain-operand kernel: a segment a launch
      const AttnPrefillArgs b = seg_attn_args(a, g.s[j]);
      switch (a.hd) {
        case 64: LILY_TRY(launch_flash<64>(b, s)); break;
        case 128: LILY_TRY(launch_flash<128>(b, s)); break;
        default: LILY_TRY(launch_flash<256>(b, s)); break;
      }
    }
    if (a.prof) a.prof(a.prof_ctx, "attn: flash");
  }
  return Status::ok();
}

}  // namespace lily::cuda::pf
