// attention/: gated GQA attention with q/k RMSNorm and partial NeoX RoPE over K/V caches [nkv, max_seq,
// hd], fp32 or bf16; output fp32 [tokens, nh·hd] with the sigmoid output gate applied. Entry points:
// attn_prep / attn_decode (common/ops.h; attention.cu: one token, split-K flash decoding in fp32,
// hd ∈ {64, 128, 256}); pf::attn_prefill (step/prefill_ops.h; attn_prefill.cu, attn_wg.cu: M tokens,
// causal flash attention on tensor cores, operands bf16 hi + lo (~16 bits; fp32 caches) or bf16,
// softmax in fp32); battn (step/batch_ops.h; batch_attn.cu: B rows over fp32 caches, per-position
// split-K, within 1e-5 of attn_decode).
//
// Attention decode: (1) q/k RMSNorm + partial NeoX RoPE + K/V cache write at pos; (2) split-K
// flash decoding over positions 0..pos with the GQA group's query heads sharing each K/V row
// read; (3) a merge kernel, one block per query head, combining the splits (log-sum-exp) and
// applying the sigmoid output gate. Position and split count come from the device, so one graph serves
// every context length. Activations fp32; the cache fp32 or bf16 (template KT).
#include <cfloat>

#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 256, kMinPerSplit = 64, kMaxSplits = 128;

__device__ __forceinline__ void st_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ void st_kv(uint16_t* p, float v) { *p = to_bf(v); }

template <typename KT> __global__ void attn_prep_kernel(AttnArgs a) {
  extern __shared__ float xsh[];
  __shared__ float red[32];
  const int b = blockIdx.x, d = threadIdx.x, hd = a.hd;
  pdl_wait();
  pdl_trigger();
  const int pos = a.ctl ? a.ctl->pos : a.pos;
  const float* qkv = a.qkv;
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
    a.q[b * hd + d] = y;
  } else {
    const size_t at = (size_t(kvh) * a.max_seq + pos) * hd + d;
    st_kv(static_cast<KT*>(a.kc) + at, y);
    st_kv(static_cast<KT*>(a.vc) + at, qkv[a.nh * a.qw + a.nkv * hd + kvh * hd + d]);
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
template <int DPL> __device__ __forceinline__ void load_row(const uint16_t* p, float* out) {
  if constexpr (DPL == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) out[2 * i] = __uint_as_float(w[i] << 16), out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  } else if constexpr (DPL == 4) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    out[0] = __uint_as_float(v.x << 16), out[1] = __uint_as_float(v.x & 0xFFFF0000u);
    out[2] = __uint_as_float(v.y << 16), out[3] = __uint_as_float(v.y & 0xFFFF0000u);
  } else {
    const uint32_t v = __ldg(reinterpret_cast<const uint32_t*>(p));
    out[0] = __uint_as_float(v << 16), out[1] = __uint_as_float(v & 0xFFFF0000u);
  }
}

__device__ __forceinline__ int n_splits_for(int n, int n_split, int min_per) {
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
// update per position; battn still works so): 437.7 vs 435.6 tok/s at 4k,
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
  // partials [kWarps][G][hd + 2] | q [G][hd] | per warp: probabilities [32] + chunk maxima [8]
  return (size_t(kWarps) * G * (DPL * 32 + 2) + size_t(G) * DPL * 32 + size_t(kWarps) * 40) * sizeof(float);
}

template <int DPL, int G, typename KT> __global__ void __launch_bounds__(kThreads) attn_decode_chunk_kernel(AttnArgs a) {
  static_assert(G * kChunkP <= 32, "GQA group too large for one transposing sum");
  extern __shared__ float sm[];
  using CS = ChunkShape<G>;
  constexpr int P = kChunkP, HD = DPL * 32, VW = DPL >= 4 ? 4 : 2;  // q read as float4 (float2 at hd 64)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.x, kvh = blockIdx.y;
  pdl_wait();
  pdl_trigger();
  const int n = a.ctl->pos + 1, nse = n_splits_for(n, a.n_split, a.min_per_split > 0 ? a.min_per_split : kMinPerSplit);
  if (split >= nse) return;
  const int len = (n + nse - 1) / nse, t0 = split * len, t1 = min(n, t0 + len);
  const int ws = G * (HD + 2);
  float* qs = sm + kWarps * ws;           // [G][DPL/VW][32 lanes][VW]: lane-contiguous vector reads
  float* pw = qs + G * HD + warp * 40;     // [32] chunk probabilities, [8] chunk maxima per head
  // q of the group, lane l's dims l·DPL.. stored so that lane reads are contiguous.
  for (int i = threadIdx.x; i < G * HD; i += kThreads) {
    const int g = i / HD, d = i % HD, l = d / DPL, j = d % DPL;
    qs[((g * (DPL / VW) + j / VW) * 32 + l) * VW + j % VW] = __ldcg(a.q + size_t(kvh) * G * HD + i);
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
  const KT* kbase = static_cast<const KT*>(a.kc) + size_t(kvh) * a.max_seq * HD + lane * DPL;
  const KT* vbase = static_cast<const KT*>(a.vc) + size_t(kvh) * a.max_seq * HD + lane * DPL;
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
  float* part = a.partial + (size_t(kvh) * a.n_split + split) * ws;
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

// Merge of the splits: one block per query head, one thread per dim. Split weights
// exp(m_sp − M) in shared memory, then each thread streams its dim over the splits.
__global__ void __launch_bounds__(256) attn_merge_kernel(AttnArgs a) {
  __shared__ float wsp[kMaxSplits];
  __shared__ float red[32];
  const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.x, kvh = h / G, g = h % G, d = threadIdx.x;
  pdl_wait();
  pdl_trigger();
  const int n = a.ctl->pos + 1, nse = n_splits_for(n, a.n_split, a.min_per_split > 0 ? a.min_per_split : kMinPerSplit), ws = G * (hd + 2);
  const float* pk = a.partial + size_t(kvh) * a.n_split * ws + g * (hd + 2);
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
  float val = ((o0 + o1) + (o2 + o3)) / L;
  if (a.qw == 2 * hd) val = val * sigmoid(a.qkv[h * a.qw + hd + d]);
  a.out[h * hd + d] = val;
}

template <int DPL, int G, typename KT> Status launch_decode(const AttnArgs& a, cudaStream_t s) {
  // Splits capped so that all nkv·splits blocks are resident at once (one wave): measured on the
  // H200 at 32k (fp32 K/V), 66 splits (132 blocks) against 128 (256 blocks, two waves): attention
  // 0.87 → 0.58 ms per step.
  auto kern = attn_decode_chunk_kernel<DPL, G, KT>;
  static const int per_sm = [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, chunk_smem<DPL, G>()) != cudaSuccess || n < 1) n = 1;
    return n;
  }();
  AttnArgs b = a;
  const int cap = sm_count() * per_sm / a.nkv;
  if (cap >= 1 && cap < b.n_split) b.n_split = cap;
  LILY_TRY(launch_k("attn_decode", kern, dim3(b.n_split, b.nkv), dim3(kThreads), chunk_smem<DPL, G>(), s, b));
  return launch_k("attn_merge", attn_merge_kernel, dim3(b.nh), dim3(b.hd), 0, s, b);
}

template <int DPL, typename KT> Status dispatch_g(const AttnArgs& a, cudaStream_t s) {
  switch (a.nh / a.nkv) {
    case 1: return launch_decode<DPL, 1, KT>(a, s);
    case 2: return launch_decode<DPL, 2, KT>(a, s);
    case 3: return launch_decode<DPL, 3, KT>(a, s);
    case 4: return launch_decode<DPL, 4, KT>(a, s);
    case 6: return launch_decode<DPL, 6, KT>(a, s);
    case 8: return launch_decode<DPL, 8, KT>(a, s);
    default: return cu_err("attn_decode: GQA group {} unsupported (1, 2, 3, 4, 6, 8)", a.nh / a.nkv);
  }
}

}  // namespace

int attn_max_splits() { return kMaxSplits; }

template <int DPL, typename KT> static Status init_g() {
  auto set_t = [](auto kern, size_t smem) -> Status {
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return Status::ok();
  };
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 1, KT>, chunk_smem<DPL, 1>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 2, KT>, chunk_smem<DPL, 2>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 3, KT>, chunk_smem<DPL, 3>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 4, KT>, chunk_smem<DPL, 4>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 6, KT>, chunk_smem<DPL, 6>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 8, KT>, chunk_smem<DPL, 8>()));
  return Status::ok();
}

Status attn_init() {
  LILY_TRY((init_g<2, float>()));
  LILY_TRY((init_g<4, float>()));
  LILY_TRY((init_g<8, float>()));
  LILY_TRY((init_g<2, uint16_t>()));
  LILY_TRY((init_g<4, uint16_t>()));
  return init_g<8, uint16_t>();
}

Status attn_prep(const AttnArgs& a, Stream s) {
  if (a.hd % 32 != 0 || a.hd > 1024 || a.rot > a.hd || a.rot % 2 != 0) return cu_err("attn_prep: head dim {} / rotary {} unsupported", a.hd, a.rot);
  if (!a.ctl && (a.pos < 0 || a.pos >= a.max_seq)) return cu_err("attn_prep: position {} outside the cache", a.pos);
  auto st = static_cast<cudaStream_t>(s);
  const dim3 grid(a.nh + a.nkv), block(a.hd);
  if (a.kv_f32) return launch_k("attn_prep", attn_prep_kernel<float>, grid, block, a.hd * sizeof(float), st, a);
  return launch_k("attn_prep", attn_prep_kernel<uint16_t>, grid, block, a.hd * sizeof(float), st, a);
}

Status attn_decode(const AttnArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!a.ctl) return cu_err("attn_decode: needs the step control block");
  if (a.nkv > 14 || a.nkv <= 0 || a.nh % a.nkv != 0) return cu_err("attn_decode: {} kv heads unsupported", a.nkv);
  if (a.n_split < 1 || a.n_split > attn_max_splits()) return cu_err("attn_decode: n_split {} out of range", a.n_split);
  switch (a.hd * (a.kv_f32 ? 1 : -1)) {
    case 64: return dispatch_g<2, float>(a, s);
    case 128: return dispatch_g<4, float>(a, s);
    case 256: return dispatch_g<8, float>(a, s);
    case -64: return dispatch_g<2, uint16_t>(a, s);
    case -128: return dispatch_g<4, uint16_t>(a, s);
    case -256: return dispatch_g<8, uint16_t>(a, s);
    default: return cu_err("attn_decode: head dim {} unsupported (64, 128, 256)", a.hd);
  }
}


}  // namespace lily::cuda
