// Causal GQA flash attention for the prefill on Hopper wgmma, single pass (terms 1): q, K, V and P each
// rounded once to fp16, one product per term, fp32 accumulators and softmax. The prefill chunks of
// pf::kPfSinglePassRows tokens and more run it (they always run alone, so a prompt's rounding depends on
// its chunking only); shorter ones the split-operand kernel (attn_wg.cu, three bf16 products a term).
// A block = 128 queries of one head, 2 warpgroups × 64 rows; q (fp16, 64 KB at hd 256) resident in shared
// memory in the 128-byte swizzle; 64-key tiles of K [keys][hd] and Vᵀ [hd][keys] (fp16 planes written by
// attn_wg.cu's kv_split) in two stages each by cp.async, a tile's loads landing during the iteration before
// it is used, one block barrier a tile. S = q·Kᵀ (16 wgmma m64n64k16, both operands from shared memory),
// online softmax in the log2 domain, P packed to fp16 from the S registers as the A fragments of O += P·V
// (4 wgmma m64n{hd}k16). Each warpgroup overlaps its own softmax with its tensor cores: S of tile j + 1
// and P·V of tile j are issued together, the softmax of tile j + 1 runs once S is done while P·V runs on
// (wait_group 1). The causal mask runs only on the tiles that cross a warpgroup's diagonal.
// Included by attn_wg.cu (its only user), which launches it.
#pragma once
#include <cuda_fp16.h>

#include "backend/cuda/attention/flash_common.cuh"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/wgmma_util.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace wg16 {

constexpr int kBQ = 128, kBN = 64;

template <int HD> struct Layout {
  static constexpr int CB = HD / 64;          // 64-column blocks of a q / K row
  static constexpr int kQBlk = 64 * 128;      // 64 rows × 64 fp16 columns
  static constexpr int kQ = 2 * CB * kQBlk;   // [wg][cb]
  static constexpr int kKStage = CB * kBN * 128;  // [cb] blocks of 64 keys × 128 bytes
  static constexpr int kVStage = HD * 128;        // Vᵀ: HD rows × 64 keys
  static constexpr int kK = kQ, kV = kK + 2 * kKStage;
  static constexpr int kSmem = kV + 2 * kVStage + 1024;  // + slack to align to 1024
};

__device__ __forceinline__ uint32_t h2_bits(float x0, float x1) {
  const __half2 h = __floats2half2_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Grid (query tiles of the longest segment, nh, segments): segment z's tiles, latest first; 256 threads.
// Segment planes (sg.ks): K fp16 [nkv][Np][HD], then Vᵀ fp16 [nkv][HD][Np]; q fp16 [M][nh][HD] (sg.qb).
template <int HD> __global__ void __launch_bounds__(256, 1) flash_kernel(AttnPrefillArgs base, AttnSegs segs) {
  using L = Layout<HD>;
  constexpr int CB = L::CB, KS = HD / 16;
  const AttnSeg& sg = segs.s[blockIdx.z];
  const int nq = (sg.M + kBQ - 1) / kBQ;
  if (int(blockIdx.x) >= nq) return;  // block-uniform
  const AttnPrefillArgs a = seg_attn_args(base, sg);
  const int Np = sg.Np;
  const uint16_t* ks = sg.ks;
  const uint16_t* vt = sg.ks + size_t(a.nkv) * Np * HD;
  extern __shared__ __align__(16) unsigned char smraw[];
  unsigned char* sm = smraw + ((1024u - (smem_u32(smraw) & 1023u)) & 1023u);
  const uint32_t sq = smem_u32(sm), sk = sq + L::kK, sv = sq + L::kV;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3, g = lane >> 2, t = lane & 3;
  const int m0 = (nq - 1 - int(blockIdx.x)) * kBQ, h = blockIdx.y, kvh = h / (a.nh / a.nkv);
  const int kend = a.pos0 + min(m0 + kBQ, a.M), NJ = (kend + kBN - 1) / kBN;
  const uint16_t* qb = static_cast<const uint16_t*>(a.qb);

  // q: [wg][cb] blocks of 64 rows × 128 bytes; rows past the chunk zero.
  for (int idx = tid; idx < kBQ * (HD / 8); idx += 256) {
    const int c16 = idx % (HD / 8), r = idx / (HD / 8);
    const int m = m0 + r, w = r >> 6, rr = r & 63;
    const bool ok = m < a.M;
    const uint16_t* src = qb + (size_t(ok ? m : 0) * a.nh + h) * HD + c16 * 8;
    cp16(sq + uint32_t((w * CB + c16 / 8) * L::kQBlk) + sw128_off(rr, c16 % 8), src, ok);
  }
  auto load_k = [&](int j) {  // K of key tile j into K stage j & 1 (the Np padding keeps it in range)
    const uint32_t kst = sk + uint32_t(j & 1) * L::kKStage;
    for (int idx = tid; idx < kBN * (HD / 8); idx += 256) {
      const int c16 = idx % (HD / 8), r = idx / (HD / 8);
      const uint16_t* src = ks + (size_t(kvh) * Np + j * kBN + r) * HD + c16 * 8;
      cp16(kst + uint32_t((c16 / 8) * kBN * 128) + sw128_off(r, c16 % 8), src, true);
    }
  };
  auto load_v = [&](int j) {  // Vᵀ of key tile j into V stage j & 1
    const uint32_t vst = sv + uint32_t(j & 1) * L::kVStage;
    for (int idx = tid; idx < HD * (kBN / 8); idx += 256) {
      const int c = idx % (kBN / 8), d = idx / (kBN / 8);
      const uint16_t* src = vt + (size_t(kvh) * HD + d) * Np + j * kBN + c * 8;
      cp16(vst + sw128_off(d, c), src, true);
    }
  };
  load_k(0);
  if (NJ > 1) load_k(1);
  load_v(0);
  cp_commit();  // group: q, K of tiles 0 and 1, V of tile 0

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  float s[kBN / 2];
  uint32_t p[kBN / 16][4];  // P of the tile whose P·V is next (fp16 pairs, the wgmma A fragments)
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f}, corr[2];
  const int rloc = w4 * 16 + g;  // row within the warpgroup (and + 8)
  const int qlo = a.pos0 + m0 + wg * 64;  // the warpgroup's first query position
  const int qpos[2] = {qlo + rloc, qlo + rloc + 8};
  const float sl2 = (1.0f / sqrtf(float(HD))) * 1.4426950408889634f;
  const uint32_t qa = sq + uint32_t(wg * CB * L::kQBlk);
  auto s_mma = [&](int j) {  // S = q·K(j)ᵀ, issued and committed (not waited)
    const uint32_t kst = sk + uint32_t(j & 1) * L::kKStage;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      const uint32_t off = uint32_t((k >> 2) * L::kQBlk + (k & 3) * 32), koff = uint32_t((k >> 2) * kBN * 128 + (k & 3) * 32);
      wgmma_64x64_ss(s, sw128_desc(qa + off), sw128_desc(kst + koff), k > 0);
    }
    wg_commit();
  };
  auto pv_tile = [&](int j) {  // O += P·V(j), issued and committed
    const uint32_t vst = sv + uint32_t(j & 1) * L::kVStage;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) pv_mma<HD, true>(o, p[kk], sw128_desc(vst + uint32_t(kk * 32)));
    wg_commit();
  };
  // softmax of tile j's S (s[4jj + 2hr + e]: row rloc + 8hr, key j0 + 8jj + 2t + e) in the log2 domain: the
  // running max and sum, corr = the factor O must take before P(j)·V(j), P(j) packed into p. The causal
  // mask only where the tile crosses the warpgroup's diagonal (a warpgroup-uniform branch, no wgmma in it).
  auto softmax = [&](int j) {
    const int j0 = j * kBN;
    float tmax[2] = {-INFINITY, -INFINITY};
    if (j0 + kBN - 1 > qlo) {
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        const int key = j0 + (i >> 2) * 8 + 2 * t + (i & 1), hr = (i >> 1) & 1;
        s[i] = key <= qpos[hr] ? s[i] * sl2 : -INFINITY;
        tmax[hr] = fmaxf(tmax[hr], s[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) {
        s[i] *= sl2;
        tmax[(i >> 1) & 1] = fmaxf(tmax[(i >> 1) & 1], s[i]);
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 1));
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(0xffffffffu, tmax[hr], 2));
      const float mn = fmaxf(mrow[hr], tmax[hr]);
      corr[hr] = mn == -INFINITY ? 1.f : exp2f(mrow[hr] - mn);
      mrow[hr] = mn;
    }
    const float mb[2] = {mrow[0] == -INFINITY ? 0.f : mrow[0], mrow[1] == -INFINITY ? 0.f : mrow[1]};
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) {
      const int hr = (i >> 1) & 1;
      s[i] = exp2f(s[i] - mb[hr]);  // −inf (masked, or a row with no key yet) → 0
      ls[hr] += s[i];
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) lrow[hr] = lrow[hr] * corr[hr] + ls[hr];
  };
  // P as the A fragments of keys 16kk..16kk+15: (row g, k 2t), (g + 8, 2t), (g, 8 + 2t), (g + 8, 8 + 2t).
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = h2_bits(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  };
  auto rescale = [&] {
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[4 * i] *= corr[0], o[4 * i + 1] *= corr[0], o[4 * i + 2] *= corr[1], o[4 * i + 3] *= corr[1];
  };

  // Tile 0: S, softmax, P (O is zero: no rescale).
  cp_wait<0>();
  fence_async_smem();
  __syncthreads();
  wg_arrive();
  s_mma(0);
  wg_wait<0>();
  fence_regs(s);
  softmax(0);
  pack_p();
  // Tile j + 1's S runs on the tensor cores while the previous P·V is issued behind it; the softmax of tile
  // j + 1 runs while P(j)·V(j) does (wait_group 1), then O takes tile j + 1's correction. Loads: at the top of
  // iteration j, K of tile j + 2 into the K stage S(j) read and V of tile j + 1 into the one P(j − 1)·V(j − 1)
  // read, both finished by every warpgroup before the barrier; they land during the iteration.
  for (int j = 0; j + 1 < NJ; ++j) {
    cp_wait<0>();  // K(j + 1), V(j) landed
    fence_async_smem();
    __syncthreads();
    if (j + 2 < NJ) load_k(j + 2);
    load_v(j + 1);
    cp_commit();
    wg_arrive();
    s_mma(j + 1);
    pv_tile(j);
    wg_wait<1>();  // S(j + 1) done; P(j)·V(j) may run on
    fence_regs(s);
    softmax(j + 1);
    wg_wait<0>();
    fence_regs(o);
    rescale();
    pack_p();
  }
  cp_wait<0>();
  fence_async_smem();
  __syncthreads();
  wg_arrive();
  pv_tile(NJ - 1);
  wg_wait<0>();
  fence_regs(o);
  flash_store<HD>(a, o, lrow, m0 + wg * 64 + rloc, h, t);
}

}  // namespace wg16
}  // namespace lily::cuda::pf
