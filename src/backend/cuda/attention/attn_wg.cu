// Causal GQA flash attention for the prefill on Hopper wgmma (sm_90a), split operands (fp32
// caches, terms 3): (1) kv_split converts this layer's cached K/V (fp32 [nkv, max_seq, hd],
// positions 0..pos0+M) once into bf16 hi/lo planes, K as key rows [2][nkv][Np][hd] and V
// transposed [2][nkv][hd][Np], zero past the last key; (2) flash_wg: a block = 128 queries of one
// head, 2 warpgroups × 64 rows, Q hi/lo resident in shared memory (128-byte swizzle), 32-key tiles
// arriving by cp.async (K double-buffered, V single; V of tile j loads during S of tile j, K of
// j + 1 during softmax and PV). S = Qh·Kh + Qh·Kl + Ql·Kh (wgmma m64n32k16, both operands from
// shared memory), online softmax in fp32 (exp2), P split into bf16 hi/lo straight from the S
// registers, O += Ph·Vh + Ph·Vl + Pl·Vh (wgmma m64n{hd}k16, P from registers, Vᵀ in the 64-byte
// swizzle). Output gate in the epilogue. (The products of the mma.sync split-operand kernel it replaced.)
// Terms 1 (AttnPrefillArgs::terms, the long chunks): kv_split writes single fp16 planes and the
// single-pass kernel of attn_wg16.cuh runs instead. Both share the planes' scratch.
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/attention/attn_wg16.cuh"
#include "backend/cuda/attention/flash_common.cuh"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"
#include "backend/cuda/common/wgmma_util.cuh"

namespace lily::cuda::pf {
namespace {

constexpr int kBQ = 128, kBN = 32, kPadKeys = 64;

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
// hi = bf16(x), lo = bf16(x − hi) of two floats, packed (x0 in the low half).
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  hi = bf2_bits(h);
  lo = bf2_bits(__floats2bfloat162_rn(x0 - hf.x, x1 - hf.y));
}

// Grid (the largest Np / 64, nkv, segments), 256 threads; segment z from its caches' positions 0..pos0+M:
// split (F16 false): ks [2][nkv][Np][HD], vt [2][nkv][HD][Np], bf16 hi and lo planes; single (F16 true, the
// single-pass kernel attn_wg16.cuh): ks [nkv][Np][HD], vt [nkv][HD][Np], fp16.
template <int HD, bool F16> __global__ void __launch_bounds__(256) kv_split_kernel(AttnSegs segs, int nkv) {
  __shared__ float tile[64][65];
  const AttnSeg& sg = segs.s[blockIdx.z];
  const int Np = sg.Np, max_seq = sg.max_seq, ntot = sg.pos0 + sg.M;
  if (int(blockIdx.x) * 64 >= Np) return;  // block-uniform
  const float* __restrict__ kc = static_cast<const float*>(sg.kc);
  const float* __restrict__ vc = static_cast<const float*>(sg.vc);
  uint16_t* ks = sg.ks;
  uint16_t* vt = sg.ks + size_t(F16 ? 1 : 2) * nkv * Np * HD;
  const int k0 = blockIdx.x * 64, h = blockIdx.y, tid = threadIdx.x;
  const size_t src0 = (size_t(h) * max_seq) * HD;
  const size_t plane_k = size_t(nkv) * Np * HD;
  // K: 64 keys × HD, 4 floats per item.
  for (int idx = tid; idx < 64 * HD / 4; idx += 256) {
    const int r = idx / (HD / 4), c = idx % (HD / 4), key = k0 + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (key < ntot) x = *reinterpret_cast<const float4*>(kc + src0 + size_t(key) * HD + c * 4);
    const size_t o = (size_t(h) * Np + key) * HD + c * 4;
    if constexpr (F16) {
      *reinterpret_cast<uint2*>(ks + o) = make_uint2(wg16::h2_bits(x.x, x.y), wg16::h2_bits(x.z, x.w));
    } else {
      uint2 hi, lo;
      split_pair(x.x, x.y, hi.x, lo.x);
      split_pair(x.z, x.w, hi.y, lo.y);
      *reinterpret_cast<uint2*>(ks + o) = hi;
      *reinterpret_cast<uint2*>(ks + plane_k + o) = lo;
    }
  }
  // V transposed, 64 columns of d at a time through shared memory.
  for (int d0 = 0; d0 < HD; d0 += 64) {
    __syncthreads();
    for (int idx = tid; idx < 64 * 16; idx += 256) {
      const int r = idx / 16, c = idx % 16, key = k0 + r;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (key < ntot) x = *reinterpret_cast<const float4*>(vc + src0 + size_t(key) * HD + d0 + c * 4);
      tile[r][c * 4 + 0] = x.x, tile[r][c * 4 + 1] = x.y, tile[r][c * 4 + 2] = x.z, tile[r][c * 4 + 3] = x.w;
    }
    __syncthreads();
    for (int idx = tid; idx < 64 * 8; idx += 256) {
      const int d = idx % 64, kg = idx / 64;  // 8 consecutive keys kg·8.. of column d
      const size_t o = (size_t(h) * HD + d0 + d) * Np + k0 + kg * 8;
      if constexpr (F16) {
        auto h2 = [&](int i) { return wg16::h2_bits(tile[kg * 8 + i][d], tile[kg * 8 + i + 1][d]); };
        *reinterpret_cast<uint4*>(vt + o) = make_uint4(h2(0), h2(2), h2(4), h2(6));
        continue;
      }
      uint4 hi, lo;
      split_pair(tile[kg * 8 + 0][d], tile[kg * 8 + 1][d], hi.x, lo.x);
      split_pair(tile[kg * 8 + 2][d], tile[kg * 8 + 3][d], hi.y, lo.y);
      split_pair(tile[kg * 8 + 4][d], tile[kg * 8 + 5][d], hi.z, lo.z);
      split_pair(tile[kg * 8 + 6][d], tile[kg * 8 + 7][d], hi.w, lo.w);
      *reinterpret_cast<uint4*>(vt + o) = hi;
      *reinterpret_cast<uint4*>(vt + plane_k + o) = lo;
    }
  }
}

// K-major operand with 64-byte rows (32 bf16) in the 64-byte swizzle: 16-byte chunk c of row r at
// r·64 + ((c ^ ((r >> 1) & 3)) << 4); 8-row atoms 512 bytes apart (SBO); base aligned to 512.
__device__ __forceinline__ uint64_t sw64_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(512 >> 4) << 32) | (uint64_t(2) << 62);
}
__device__ __forceinline__ uint32_t sw64_off(int r, int c) { return uint32_t(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }

template <int HD> struct FwLayout {
  static constexpr int CB = HD / 64;                 // 64-column blocks of a row
  static constexpr int kQBlk = 64 * 128;             // one warpgroup's 64 rows × 64 columns
  static constexpr int kQ = 2 * 2 * CB * kQBlk;      // [plane][wg][cb]
  static constexpr int kKBlk = kBN * 128;            // 32 keys × 64 columns
  static constexpr int kKStage = 2 * CB * kKBlk;     // [plane][cb]
  static constexpr int kVPlane = HD * 64;            // HD rows × 32 keys
  static constexpr int kK = kQ, kV = kK + 2 * kKStage;
  static constexpr int kSmem = kV + 2 * kVPlane + 1024;  // + slack to align to 1024
};

// The three S products chain into one accumulator (48 dependent wgmmas per tile at hd 256). Every warpgroup
// runs every key tile of its block, the tiles past its own last query too (all masked: p = 0, corr = 1): a
// wgmma under a per-warpgroup branch makes ptxas serialize them all (C7518).
// Grid (query tiles of the longest segment, nh, segments): segment z's tiles, latest first.
template <int HD> __global__ void __launch_bounds__(256, 1) flash_wg_kernel(AttnPrefillArgs base, AttnSegs segs) {
  using L = FwLayout<HD>;
  constexpr int CB = L::CB, KS = HD / 16;
  const AttnSeg& sg = segs.s[blockIdx.z];
  const int nq = (sg.M + kBQ - 1) / kBQ;
  if (int(blockIdx.x) >= nq) return;  // block-uniform
  const AttnPrefillArgs a = seg_attn_args(base, sg);
  const int Np = sg.Np;
  const uint16_t* ks = sg.ks;
  const uint16_t* vt = sg.ks + size_t(2) * a.nkv * Np * HD;
  extern __shared__ __align__(16) unsigned char smraw[];
  unsigned char* sm = smraw + ((1024u - (smem_u32(smraw) & 1023u)) & 1023u);
  const uint32_t sq = smem_u32(sm), sk = sq + L::kK, sv = sq + L::kV;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3, g = lane >> 2, t = lane & 3;
  const int m0 = (nq - 1 - int(blockIdx.x)) * kBQ, h = blockIdx.y, kvh = h / (a.nh / a.nkv);
  const int kend = a.pos0 + min(m0 + kBQ, a.M), NJ = (kend + kBN - 1) / kBN;
  const size_t qplane = size_t(a.M) * a.nh * HD, kplane = size_t(a.nkv) * Np * HD;
  const uint16_t* qb = static_cast<const uint16_t*>(a.qb);

  // Q: [plane][wg][cb] blocks of 64 rows × 128 bytes.
  for (int idx = tid; idx < 2 * kBQ * (HD / 8); idx += 256) {
    const int c16 = idx % (HD / 8), r = (idx / (HD / 8)) % kBQ, pl = idx / (HD / 8) / kBQ;
    const int m = m0 + r, w = r >> 6, rr = r & 63;
    const bool ok = m < a.M;
    const uint16_t* src = qb + pl * qplane + (size_t(ok ? m : 0) * a.nh + h) * HD + c16 * 8;
    cp16(sq + uint32_t(((pl * 2 + w) * CB + c16 / 8) * L::kQBlk) + sw128_off(rr, c16 % 8), src, ok);
  }
  auto load_k = [&](int j) {
    if (j < NJ) {
      const uint32_t st = sk + uint32_t(j & 1) * L::kKStage;
      for (int idx = tid; idx < 2 * kBN * (HD / 8); idx += 256) {
        const int c16 = idx % (HD / 8), r = (idx / (HD / 8)) % kBN, pl = idx / (HD / 8) / kBN;
        const uint16_t* src = ks + pl * kplane + (size_t(kvh) * Np + j * kBN + r) * HD + c16 * 8;
        const int blk = pl * CB + c16 / 8;
        cp16(st + uint32_t(blk * L::kKBlk) + sw128_off(r, c16 % 8), src, true);
      }
    }
    cp_commit();
  };
  auto load_v = [&](int j) {
    if (j < NJ) {
      for (int idx = tid; idx < 2 * HD * (kBN / 8); idx += 256) {
        const int c = idx % (kBN / 8), d = (idx / (kBN / 8)) % HD, pl = idx / (kBN / 8) / HD;
        const uint16_t* src = vt + pl * kplane + (size_t(kvh) * HD + d) * Np + j * kBN + c * 8;
        cp16(sv + uint32_t(pl * L::kVPlane) + sw64_off(d, c), src, true);
      }
    }
    cp_commit();
  };
  load_k(0);  // group 0: Q and K tile 0
  load_v(0);  // group 1: V tile 0

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  float s[16];
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
  const int rloc = w4 * 16 + g;  // row within the warpgroup (and + 8)
  const int qpos[2] = {a.pos0 + m0 + wg * 64 + rloc, a.pos0 + m0 + wg * 64 + rloc + 8};
  const float sl2 = (1.0f / sqrtf(float(HD))) * 1.4426950408889634f;
  const uint32_t qh = sq + uint32_t((0 * 2 + wg) * CB * L::kQBlk), ql = sq + uint32_t((1 * 2 + wg) * CB * L::kQBlk);

  for (int j = 0; j < NJ; ++j) {
    const int j0 = j * kBN;
    cp_wait<1>();  // K tile j (and Q) landed; V tile j may be in flight
    fence_async_smem();
    __syncthreads();
    const uint32_t kst = sk + uint32_t(j & 1) * L::kKStage;
    {
      wg_arrive();
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        const uint32_t qo = uint32_t((k >> 2) * L::kQBlk + (k & 3) * 32), ko = uint32_t((k >> 2) * L::kKBlk + (k & 3) * 32);
        const uint64_t dqh = sw128_desc(qh + qo), dql = sw128_desc(ql + qo);
        const uint64_t dkh = sw128_desc(kst + ko), dkl = sw128_desc(kst + uint32_t(CB * L::kKBlk) + ko);
        wgmma_bf16_64x32_ss(s, dqh, dkh, k > 0);
        wgmma_bf16_64x32_ss(s, dqh, dkl, 1);
        wgmma_bf16_64x32_ss(s, dql, dkh, 1);
      }
      wg_commit();
    }
    load_k(j + 1);  // into the other stage (its last reader, tile j − 1, finished before the barrier)
    uint32_t ph[2][4], pl[2][4];
    {
      wg_wait<0>();
      fence_regs(s);
      // s[4jj + 2hr + e]: row rloc + 8hr, key j0 + 8jj + 2t + e. Mask, scale (log2 domain), online softmax.
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = j0 + jj * 8 + 2 * t + (i & 1), hr = i >> 1;
          const float v = key <= qpos[hr] ? s[4 * jj + i] * sl2 : -INFINITY;
          s[4 * jj + i] = v;
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
      for (int i = 0; i < 16; ++i) {
        const int hr = (i >> 1) & 1;
        const float p = mrow[hr] == -INFINITY ? 0.f : exp2f(s[i] - mrow[hr]);
        s[i] = p;
        ls[hr] += p;
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) lrow[hr] = lrow[hr] * corr[hr] + ls[hr];
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) o[4 * i] *= corr[0], o[4 * i + 1] *= corr[0], o[4 * i + 2] *= corr[1], o[4 * i + 3] *= corr[1];
      // P as the wgmma A fragment of keys 16kk..16kk+15: chunks 2kk (k 2t, +1) and 2kk + 1 (k 8 + 2t, +1).
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        split_pair(s[8 * kk + 0], s[8 * kk + 1], ph[kk][0], pl[kk][0]);
        split_pair(s[8 * kk + 2], s[8 * kk + 3], ph[kk][1], pl[kk][1]);
        split_pair(s[8 * kk + 4], s[8 * kk + 5], ph[kk][2], pl[kk][2]);
        split_pair(s[8 * kk + 6], s[8 * kk + 7], ph[kk][3], pl[kk][3]);
      }
    }
    cp_wait<1>();  // V tile j landed; K tile j + 1 may be in flight
    fence_async_smem();
    __syncthreads();
    {
      wg_arrive();
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint64_t dvh = sw64_desc(sv + uint32_t(kk * 32)), dvl = sw64_desc(sv + uint32_t(L::kVPlane + kk * 32));
        pv_mma<HD, false>(o, ph[kk], dvh);
        pv_mma<HD, false>(o, ph[kk], dvl);
        pv_mma<HD, false>(o, pl[kk], dvh);
      }
      wg_commit();
      wg_wait<0>();
      fence_regs(o);
    }
    __syncthreads();  // both warpgroups are done with V tile j
    load_v(j + 1);
  }
  cp_wait<0>();
  flash_store<HD>(a, o, lrow, m0 + wg * 64 + rloc, h, t);
}

// Split-plane scratch, grown on demand (prefill runs eagerly on one stream; freed never).
struct Scratch {
  std::mutex mu;
  uint16_t* p = nullptr;
  size_t n = 0;  // uint16 elements
};
Scratch& scratch() {
  static Scratch s;
  return s;
}

template <int HD> Status launch(const AttnPrefillArgs& a, AttnSegs& g, cudaStream_t s) {
  using L = FwLayout<HD>;
  using L16 = wg16::Layout<HD>;
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(flash_wg_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmem));
    LILY_CU_TRY(cudaFuncSetAttribute(wg16::flash_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, L16::kSmem));
    attr = true;
  }
  const bool single = a.terms == 1;
  // Each segment's planes at its own offset of the scratch: ks and vt, 2 planes each (split) or 1 (single).
  auto planes = [&](int np) { return size_t(single ? 2 : 4) * a.nkv * np * HD; };
  size_t need = 0;
  int max_np = 0, max_nq = 0;
  for (int i = 0; i < g.n; ++i) {
    AttnSeg& sg = g.s[i];
    sg.Np = (sg.pos0 + sg.M + kPadKeys - 1) / kPadKeys * kPadKeys;
    need += planes(sg.Np);
    max_np = std::max(max_np, sg.Np), max_nq = std::max(max_nq, (sg.M + kBQ - 1) / kBQ);
  }
  Scratch& sc = scratch();
  std::lock_guard<std::mutex> lk(sc.mu);
  if (sc.n < need) {
    LILY_CU_TRY(cudaStreamSynchronize(s));
    if (sc.p) LILY_CU_TRY(cudaFree(sc.p));
    sc.p = nullptr, sc.n = 0;
    const size_t n = need + need / 4;  // headroom for the next chunk
    LILY_CU_TRY(cudaMalloc(&sc.p, n * sizeof(uint16_t)));
    sc.n = n;
  }
  size_t off = 0;
  for (int i = 0; i < g.n; ++i) {
    g.s[i].ks = sc.p + off;
    off += planes(g.s[i].Np);
  }
  const dim3 split_grid(max_np / 64, a.nkv, g.n), grid(max_nq, a.nh, g.n);
  static_assert(wg16::kBQ == kBQ && kPadKeys % wg16::kBN == 0, "both kernels' query tiles and key padding");
  if (single) {
    kv_split_kernel<HD, true><<<split_grid, 256, 0, s>>>(g, a.nkv);
    LILY_TRY(launch_status("pf::kv_split"));
    if (a.prof) a.prof(a.prof_ctx, "attn: K/V fp16 planes");
    wg16::flash_kernel<HD><<<grid, 256, L16::kSmem, s>>>(a, g);
    return launch_status("pf::flash_wg16");
  }
  kv_split_kernel<HD, false><<<split_grid, 256, 0, s>>>(g, a.nkv);
  LILY_TRY(launch_status("pf::kv_split"));
  if (a.prof) a.prof(a.prof_ctx, "attn: K/V split (bf16 hi/lo planes)");
  flash_wg_kernel<HD><<<grid, 256, L::kSmem, s>>>(a, g);
  return launch_status("pf::flash_wg");
}

}  // namespace

Status attn_flash_wg(const AttnPrefillArgs& a, AttnSegs& g, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.hd) {
    case 64: return launch<64>(a, g, s);
    case 128: return launch<128>(a, g, s);
    case 256: return launch<256>(a, g, s);
    default: return cu_err("pf::attn_flash_wg: head dim {} unsupported", a.hd);
  }
}

}  // namespace lily::cuda::pf
