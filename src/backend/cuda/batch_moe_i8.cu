// Expert GEMMs of the batched decode step on int8 tensor cores (issue 7): the batch-1 decode's
// tc_dot.cuh arithmetic (activations as 4 signed 7-bit limbs under a power-of-two scale, 4-bit codes
// as A of mma.sync m16n8k32 s8 → s32, exact group sums, scale/bias folded in fp32), with the MMA's 8
// columns holding two activation rows × 4 limbs. Half the MMAs and a quarter of the code conversions of
// the fp16 hi + lo kernels (batch_tc*.cu) per weight byte.
//
// Work unit: (16 output rows, one 8-entry chunk of a routing item); the chunk's entries run in pairs
// over weights held in registers. Per output element the operation sequence depends only on its own
// activation row and the weights (exact integer sums, fold per group in k order, cross-warp sum in
// warp order), so results are batch invariant and independent of the entry's slot in the pair.
#include "backend/cuda/batch_ops.h"
#include "backend/cuda/tc_dot.cuh"

namespace lily::cuda {
namespace {

// One row per block (tc_limb_row).
__global__ void __launch_bounds__(256) blimb_kernel(const float* x, int ldx, int K, uint8_t* L, float* XG, float* IS) {
  __shared__ float red[32];
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.x, NG = K / 64;
  tc_limb_row<true>(x + size_t(r) * ldx, K, L + size_t(r) * NG * 256, XG + size_t(r) * NG, IS + r, red);
}

// Lane coefficients of the two-row layout: columns 2t, 2t+1 of the MMA are limbs (0, 1) of entry
// t / 2 for even t, limbs (2, 3) for odd t; even lanes add the bias term of their entry.
__device__ __forceinline__ TcLane pair_lane() {
  TcLane L;
  const int t = threadIdx.x & 3;
  L.c0 = t & 1 ? 1.f / 16384 : 1.f;
  L.c1 = t & 1 ? 1.f / 2097152 : 1.f / 128;
  L.cb = t & 1 ? 0.f : 1.f;
  return L;
}

// The chunk of block row blockIdx.y: item index (-1: past the last chunk). Prefixes (items[i][3]) are
// strictly increasing (every item has a row), so the item is the count of prefixes ≤ c, minus one.
__device__ __forceinline__ int chunk_item(const int32_t* items, const int32_t* n_items, int c) {
  const int ni = __ldcg(n_items), nc = __ldcg(n_items + 1);
  if (c >= nc) return -1;
  int n = 0;
  for (int i0 = 0; i0 < ni; i0 += blockDim.x) {
    const int i = i0 + int(threadIdx.x);
    n += __syncthreads_count(i < ni && __ldcg(items + 4 * i + 3) <= c);
  }
  return n - 1;
}

// This lane's B fragment of group G for the pair: lanes g < 4 read limb g of row ra, g ≥ 4 limb g − 4
// of row rb (rows < 0: zeros).
__device__ __forceinline__ uint4 pair_bfrag(const uint8_t* L, int NG, int ra, int rb, int G) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, r = g < 4 ? ra : rb;
  if (r < 0) return make_uint4(0, 0, 0, 0);
  return __ldcg(reinterpret_cast<const uint4*>(L + (size_t(r) * NG + G) * 256 + ((t * 4 + (g & 3)) * 16)));
}

struct Chunk {
  int e, n, off, e0;  // expert, entries in this chunk (1..8), item offset, first entry of the chunk
};
__device__ __forceinline__ Chunk load_chunk(const BI8Args& a, int it) {
  const int4 v = __ldcg(reinterpret_cast<const int4*>(a.items) + it);
  Chunk c;
  c.e = v.x, c.off = v.z, c.e0 = (int(blockIdx.y) - v.w) * 8;
  c.n = min(8, v.y - c.e0);
  return c;
}

// gate+up+SwiGLU. Block: 16 outputs (their gate and up rows: tiles 0 and 1) of one chunk; warp w takes
// groups [w·GP, w·GP + GP) of K (past NG: idle, adds zeros). y[yrow] = silu(gate)·up.
template <int GP> __global__ void __launch_bounds__(256, GP == 4 ? 2 : 3) bi8_gate_up_kernel(BI8Args a) {
  __shared__ float part[8][8][32];  // [warp][entry][gate 16 | up 16]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  pdl_wait();
  const int it = chunk_item(a.items, a.n_items, blockIdx.y);
  if (it < 0) return;
  const Chunk ch = load_chunk(a, it);
  const bool sh = ch.e >= a.E;
  const int n_out = sh ? a.n_out_sh : a.n_out, r0 = blockIdx.x * 16;
  if (r0 >= n_out) return;
  pdl_trigger();
  const int K = a.w.cols, NG = K / 64;
  // Weight pointers as scalars (a conditional reference to a kernel parameter would copy it to local memory).
  const uint2* cg = reinterpret_cast<const uint2*>(sh ? a.sh.codes : a.w.codes);
  const uint2* cu = reinterpret_cast<const uint2*>(sh ? a.sh.codes : a.w2.codes);
  const uint32_t* sg_ = reinterpret_cast<const uint32_t*>(sh ? a.sh.sb : a.w.sb);
  const uint32_t* su_ = reinterpret_cast<const uint32_t*>(sh ? a.sh.sb : a.w2.sb);
  const size_t bg = sh ? 0 : size_t(ch.e) * n_out, bu = sh ? size_t(n_out) : size_t(ch.e) * n_out;
  uint2 wa[2][GP][2];
  uint32_t sba[2][GP][2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int i = 0; i < GP; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h + g, G = warp * GP + i;
        if (r < n_out && G < NG) {
          const size_t row = (j ? bu : bg) + r;
          wa[j][i][h] = __ldg((j ? cu : cg) + row * (K / 16) + G * 4 + t);
          sba[j][i][h] = __ldg((j ? su_ : sg_) + row * NG + G);
        } else {
          wa[j][i][h] = make_uint2(0, 0), sba[j][i][h] = 0;
        }
      }
  const TcLane L = pair_lane();
  const int np = (ch.n + 1) / 2;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    if (p >= np) break;  // block-uniform
    const int ea = ch.off + ch.e0 + 2 * p, has_b = 2 * p + 1 < ch.n;
    const int ra = __ldcg(a.xrow + ea), rb = has_b ? __ldcg(a.xrow + ea + 1) : -1;
    const int rme = t < 2 ? ra : rb;  // this lane's entry (bias term)
    float acc[2][2] = {};
#pragma unroll
    for (int i = 0; i < GP; ++i) {
      const int G = warp * GP + i;
      if (G < NG) {  // warp-uniform
        const uint4 bq = pair_bfrag(a.L, NG, ra, rb, G);
        const float xsb = rme >= 0 ? __ldcg(a.XG + size_t(rme) * NG + G) * L.cb : 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float v0, v1;
          tc_group(wa[j][i][0], wa[j][i][1], bq, L, v0, v1);
          acc[j][0] = tc_fold(acc[j][0], sba[j][i][0], v0, xsb);
          acc[j][1] = tc_fold(acc[j][1], sba[j][i][1], v1, xsb);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = acc[j][h] + __shfl_xor_sync(0xffffffffu, acc[j][h], 1);
        if ((t & 1) == 0) part[warp][2 * p + (t >> 1)][16 * j + 8 * h + g] = s;
      }
  }
  __syncthreads();
  if (int(threadIdx.x) < ch.n * 16) {
    const int en = threadIdx.x >> 4, o = threadIdx.x & 15, r = r0 + o;
    if (r < n_out) {
      float sg = 0.f, su = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) sg += part[w][en][o], su += part[w][en][16 + o];
      const int e = ch.off + ch.e0 + en;
      const float invS = __ldcg(a.IS + __ldcg(a.xrow + e));
      a.y[size_t(__ldcg(a.yrow + e)) * a.ldy + r] = silu(sg * invS) * (su * invS);
    }
  }
}

// down (plain). Block: 8 warps × 16 output rows, each warp over the whole K (≤ 8 groups): no cross-warp
// sum. y[yrow] row values = Σ_G fold / S.
template <int NG> __global__ void __launch_bounds__(256, 2) bi8_down_kernel(BI8Args a) {
  constexpr int MG = NG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  pdl_wait();
  const int it = chunk_item(a.items, a.n_items, blockIdx.y);
  if (it < 0) return;
  const Chunk ch = load_chunk(a, it);
  const bool sh = ch.e >= a.E;
  const int n_out = sh ? a.n_out_sh : a.n_out, rbase = blockIdx.x * 128 + warp * 16;
  if (int(blockIdx.x) * 128 >= n_out) return;
  pdl_trigger();
  const uint2* cw = reinterpret_cast<const uint2*>(sh ? a.sh.codes : a.w.codes);
  const uint32_t* sw = reinterpret_cast<const uint32_t*>(sh ? a.sh.sb : a.w.sb);
  constexpr int K = NG * 64;
  const size_t b0 = sh ? 0 : size_t(ch.e) * n_out;
  uint2 wa[MG][2];
  uint32_t sba[MG][2];
#pragma unroll
  for (int i = 0; i < MG; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rbase + 8 * h + g;
      if (r < n_out) {
        const size_t row = b0 + r;
        wa[i][h] = __ldg(cw + row * (K / 16) + i * 4 + t);
        sba[i][h] = __ldg(sw + row * NG + i);
      } else {
        wa[i][h] = make_uint2(0, 0), sba[i][h] = 0;
      }
    }
  const TcLane L = pair_lane();
  const int np = (ch.n + 1) / 2;
  for (int p = 0; p < np; ++p) {
    const int ea = ch.off + ch.e0 + 2 * p, has_b = 2 * p + 1 < ch.n;
    const int ra = __ldcg(a.xrow + ea), rb = has_b ? __ldcg(a.xrow + ea + 1) : -1;
    const int rme = t < 2 ? ra : rb;
    float acc[2] = {};
#pragma unroll
    for (int i0 = 0; i0 < MG; i0 += 4) {  // 4 groups' fragments in flight at a time (registers)
      uint4 bq[4];
      float xsb[4];
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const int i = i0 + d;
        bq[d] = i < NG ? pair_bfrag(a.L, NG, ra, rb, i) : make_uint4(0, 0, 0, 0);
        xsb[d] = i < NG && rme >= 0 ? __ldcg(a.XG + size_t(rme) * NG + i) * L.cb : 0.f;
      }
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const int i = i0 + d;
        if (i < NG) {  // warp-uniform
          float v0, v1;
          tc_group(wa[i][0], wa[i][1], bq[d], L, v0, v1);
          acc[0] = tc_fold(acc[0], sba[i][0], v0, xsb[d]);
          acc[1] = tc_fold(acc[1], sba[i][1], v1, xsb[d]);
        }
      }
    }
    const float invS = rme >= 0 ? __ldcg(a.IS + rme) : 0.f;
    const int yr = rme >= 0 ? __ldcg(a.yrow + (t < 2 ? ea : ea + 1)) : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float s = acc[h] + __shfl_xor_sync(0xffffffffu, acc[h], 1);
      const int r = rbase + 8 * h + g;
      if ((t & 1) == 0 && rme >= 0 && r < n_out) a.y[size_t(yr) * a.ldy + r] = s * invS;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

Status blimb_pack(const float* x, int ldx, int K, int R, uint8_t* L, float* XG, float* IS, Stream stream) {
  if (K % 64 != 0 || K <= 0 || R < 1) return cu_err("blimb_pack: K={} ldx={} R={}", K, ldx, R);
  if (!aligned16(L)) return cu_err("blimb_pack: unaligned buffer");
  return launch_k("blimb_pack", blimb_kernel, dim3(R), dim3(256), 0, static_cast<cudaStream_t>(stream), x, ldx, K, L,
                  XG, IS);
}

bool bi8_ok(const BI8Args& a) {
  if (a.w.bits != 4 || a.sh.bits != 4 || a.w.cols % 64 != 0 || a.sh.cols != a.w.cols) return false;
  if (!aligned16(a.w.codes) || !aligned16(a.sh.codes) || !aligned16(a.L)) return false;
  if (a.swiglu) return a.w2.bits == 4 && a.w2.cols == a.w.cols && aligned16(a.w2.codes) && a.w.cols <= 4 * 512;
  return a.w.cols <= 8 * 64;
}

Status bi8_moe(const BI8Args& a, Stream stream) {
  if (!bi8_ok(a)) return cu_err("bi8_moe: unsupported shapes (K {}, bits {})", a.w.cols, a.w.bits);
  if (!a.items || !a.n_items || a.max_chunks < 1 || a.n_out <= 0 || a.n_out_sh <= 0 || !a.y || !a.XG || !a.IS)
    return cu_err("bi8_moe: bad arguments");
  auto s = static_cast<cudaStream_t>(stream);
  const int rows = a.n_out > a.n_out_sh ? a.n_out : a.n_out_sh;
  if (!a.swiglu) {
    const dim3 grid((rows + 127) / 128, a.max_chunks);
    switch (a.w.cols / 64) {
      case 1: return launch_k("bi8_down", bi8_down_kernel<1>, grid, dim3(256), 0, s, a);
      case 2: return launch_k("bi8_down", bi8_down_kernel<2>, grid, dim3(256), 0, s, a);
      case 3: return launch_k("bi8_down", bi8_down_kernel<3>, grid, dim3(256), 0, s, a);
      case 4: return launch_k("bi8_down", bi8_down_kernel<4>, grid, dim3(256), 0, s, a);
      case 5: return launch_k("bi8_down", bi8_down_kernel<5>, grid, dim3(256), 0, s, a);
      case 6: return launch_k("bi8_down", bi8_down_kernel<6>, grid, dim3(256), 0, s, a);
      case 7: return launch_k("bi8_down", bi8_down_kernel<7>, grid, dim3(256), 0, s, a);
      default: return launch_k("bi8_down", bi8_down_kernel<8>, grid, dim3(256), 0, s, a);
    }
  }
  const dim3 grid((rows + 15) / 16, a.max_chunks);
  const int NG = a.w.cols / 64, GP = (NG + 7) / 8;
  if (GP == 1) return launch_k("bi8_gate_up", bi8_gate_up_kernel<1>, grid, dim3(256), 0, s, a);
  if (GP == 2) return launch_k("bi8_gate_up", bi8_gate_up_kernel<2>, grid, dim3(256), 0, s, a);
  if (GP == 3) return launch_k("bi8_gate_up", bi8_gate_up_kernel<3>, grid, dim3(256), 0, s, a);
  return launch_k("bi8_gate_up", bi8_gate_up_kernel<4>, grid, dim3(256), 0, s, a);
}

}  // namespace lily::cuda
