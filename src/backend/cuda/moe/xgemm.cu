// xgemm (contract in xgemm.h): persistent blocks walk the work units of qgemm's items mode (unit = one item ×
// one tile of 8 weight blocks of 16 rows × one chunk of BM = 8·NT activation rows), a block's warps holding
// WB weight blocks each (8 / WB warps). The block stages the unit's activation rows (fp16 hi [+ lo], and the
// group sums) in shared memory in chunks of KC columns through two buffers, the next chunk (or the next
// unit's first) loading while one computes; each warp streams its weight blocks' groups from HBM into a ring
// of kD / WB register slots a block, the ring running on into the warp's blocks of the next unit, so the
// weight loads never stop at a unit boundary; each activation fragment read feeds the warp's WB blocks.
// Per group: four k-steps of m16n8k16 (weights as A, activation rows as B) into a zeroed partial, then
// y += (scale·2^-e)·part + bias·Σx, exactly as qgemm.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/q4_mma.cuh"
#include "backend/cuda/moe/xgemm.h"

namespace lily::cuda {
namespace {
using namespace q4;

// kBlocks 16-row weight blocks a unit tile; WB of them a warp (kBlocks / WB warps a block); kD groups of
// ring a stream (kD / WB with two streams a warp: the same bytes in flight a warp).
constexpr int kTerms = 2;  // activations as fp16 hi + lo (qgemm.h): two MMAs a product
constexpr int kBlocks = 8, kD = 4, kMaxItems = 1024;
enum Mode : int { kItems = 1, kSwiglu = 2 };

struct XArgs {
  QGemmArgs a;
  FragW w, sh;
  int K, nG, T, bpe;  // bpe: weight blocks per expert (swiglu n_out/8, plain n_out/16)
  int KC;             // activation columns a shared-memory buffer holds (K / KC chunks a unit, two buffers)
};

// ---- the fragment copy ----
// Thread per (block, group, lane): four code words, and (lanes with tq == 0) the {sb(r0), sb(r1)} pair.
__global__ void frag_pack_kernel(QW a, QW b, int ra, int oa, int rb, int ob, int blocks, uint32_t* codes, uint32_t* sb) {
  const int nG = a.cols / 64, wpr = a.cols / 8;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x, n = size_t(blocks) * nG * 32;
  if (i >= n) return;
  const int lane = int(i & 31), G = int((i >> 5) % size_t(nG));
  const size_t blk = (i >> 5) / size_t(nG);
  const int gq = lane >> 2, tq = lane & 3;
  const size_t r0 = size_t(ra) * blk + size_t(oa) + gq, r1 = size_t(rb) * blk + size_t(ob) + gq;
  const uint32_t* c0 = a.codes + r0 * wpr + size_t(G) * 8 + 2 * tq;
  const uint32_t* c1 = b.codes + r1 * wpr + size_t(G) * 8 + 2 * tq;
  reinterpret_cast<uint4*>(codes)[i] = make_uint4(c0[0], c0[1], c1[0], c1[1]);
  if (tq == 0) {
    const uint32_t* s0 = reinterpret_cast<const uint32_t*>(a.sb) + r0 * nG + G;
    const uint32_t* s1 = reinterpret_cast<const uint32_t*>(b.sb) + r1 * nG + G;
    reinterpret_cast<uint2*>(sb)[(i >> 5) * 8 + gq] = make_uint2(*s0, *s1);
  }
}

// ---- the GEMM ----
struct Unit {
  int tile, expert, e0, m_cnt;
};

template <int BM> __device__ __forceinline__ Unit unit_of(const XArgs& g, int u, const int4* its, const int* pu, int n_items) {
  const int i = item_of(pu, n_items, u);
  const int4 it = its[i];
  const int c = (it.y + BM - 1) / BM, rr = u - pu[i];
  Unit r;
  r.tile = rr / c;
  const int chunk = rr - r.tile * c;
  r.expert = it.x, r.e0 = it.z + chunk * BM, r.m_cnt = min(BM, it.y - chunk * BM);
  return r;
}

// The warp's weight stream: unit u's block of this warp, group by group, then the next unit's.
struct Stream4 {
  const uint4* c;  // this lane's code words of group 0 of the block
  const uint2* s;  // this lane's {sb(r0), sb(r1)} of group 0
};
__device__ __forceinline__ Stream4 stream_of(const XArgs& g, const Unit& t, int bi, int lane) {
  const bool shared = t.expert == g.a.E;
  const FragW& f = shared ? g.sh : g.w;
  const size_t blk = size_t(shared ? 0 : t.expert) * g.bpe + size_t(t.tile) * kBlocks + bi;
  Stream4 r;
  r.c = reinterpret_cast<const uint4*>(f.codes) + blk * g.nG * 32 + lane;
  r.s = reinterpret_cast<const uint2*>(f.sb) + blk * g.nG * 8 + (lane >> 2);
  return r;
}
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream2(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

template <int NT, int MODE, int WB>
__global__ void __launch_bounds__(32 * kBlocks / WB, 2 * WB) xgemm_kernel(XArgs g) {
  constexpr int BM = 8 * NT, kThreads = 32 * kBlocks / WB, KD = kD / WB;
  extern __shared__ __align__(16) uint8_t sm[];
  const QGemmArgs& a = g.a;
  const int K = g.K, nG = g.nG;
  // Shared memory: two activation buffers, each one chunk of KC columns of the unit's rows: x hi [BM][KC]
  // fp16 (16-byte chunk q of row m at ((q ^ (m & 1)) << 4)), x lo the same, {Σx, 2^-e} [BM][KC/64]; then
  // the swiglu epilogue's [kBlocks][BM] {max, sum} and [BM] scales, the items and their unit prefix.
  const int KC = g.KC, gpc = KC / 64, nC = K / KC;  // groups a chunk, chunks a unit
  const size_t plane = size_t(BM) * KC * 2, xbytes = plane * kTerms + size_t(BM) * gpc * 8;
  float2* red = reinterpret_cast<float2*>(sm + xbytes * 2);
  float* rsc = reinterpret_cast<float*>(red + kBlocks * BM);
  int4* its = reinterpret_cast<int4*>(rsc + BM);
  int* pu = reinterpret_cast<int*>(its + a.max_items);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;

  pdl_wait();
  pdl_trigger();
  const int n_items = min(__ldcg(a.n_items), a.max_items);
  for (int i = tid; i < n_items; i += kThreads) its[i] = reinterpret_cast<const int4*>(a.items)[i];
  __syncthreads();
  {  // units before each item (its tiles × its row chunks): an exclusive scan over the threads' item runs
    const int per = (n_items + kThreads - 1) / kThreads, i0 = tid * per, i1 = min(i0 + per, n_items);
    int own = 0;
    for (int i = i0; i < i1; ++i) own += g.T * ((its[i].y + BM - 1) / BM);
    int inc = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inc, off);
      if (lane >= off) inc += v;
    }
    int* wsum = reinterpret_cast<int*>(red);
    if (lane == 31) wsum[warp] = inc;
    __syncthreads();
    int s = inc - own;
    for (int w = 0; w < warp; ++w) s += wsum[w];
    for (int i = i0; i < i1; ++i) pu[i] = s, s += g.T * ((its[i].y + BM - 1) / BM);
    if (tid == kThreads - 1) pu[n_items] = s;
  }
  __syncthreads();
  const int n_units = pu[n_items];
  if (int(blockIdx.x) >= n_units) return;

  // The ring: slot d holds the streams' group ≡ d (mod KD) (nG % KD == 0, so a unit starts at slot 0); a
  // warp's WB blocks are consecutive in the copy (block 2w + 1 is nG groups after 2w's).
  // kD = 4: 4 × 528 bytes in flight a warp, 34 KB an SM at two blocks (kD = 8 spilled at 128 registers).
  uint4 rc[KD][WB];
  uint2 rs[KD][WB];
  int lu = blockIdx.x, lg = 0;  // the load cursor: unit, group
  Stream4 ls = stream_of(g, unit_of<BM>(g, lu, its, pu, n_items), warp * WB, lane);
  auto load = [&](int d) {
    if (lu >= n_units) return;
#pragma unroll
    for (int wb = 0; wb < WB; ++wb) {
      rc[d][wb] = ld_stream(ls.c + (size_t(wb) * nG + lg) * 32);
      rs[d][wb] = ld_stream2(ls.s + (size_t(wb) * nG + lg) * 8);
    }
    if (++lg == nG) {
      lg = 0;
      lu += gridDim.x;
      if (lu < n_units) ls = stream_of(g, unit_of<BM>(g, lu, its, pu, n_items), warp * WB, lane);
    }
  };
#pragma unroll
  for (int d = 0; d < KD; ++d) load(d);

  // Chunk h (columns [h·KC, +KC)) of unit t's activation rows into buffer b (rows past m_cnt zero), as one
  // cp.async group.
  auto stage_x = [&](const Unit& t, int h, int b) {
    uint8_t* bx = sm + xbytes * b;
    const int cpr = KC / 8;  // 16-byte chunks per row
    for (int c = tid; c < BM * cpr; c += kThreads) {
      const int m = c / cpr, q = c - m * cpr;
      const bool ok = m < t.m_cnt;
      const size_t src = (ok ? size_t(__ldg(a.xrow + t.e0 + m)) * a.ldx : 0) + size_t(h) * KC + q * 8;
      const uint32_t dst = smem_u32(bx + size_t(m) * KC * 2 + ((q ^ (m & 1)) << 4));
      cp16(dst, a.x + src, ok);
      cp16(dst + uint32_t(plane), a.xlo + src, ok);
    }
    float2* bxs = reinterpret_cast<float2*>(bx + plane * kTerms);
    for (int c = tid; c < BM * gpc; c += kThreads) {
      const int m = c / gpc, G = c - m * gpc;
      const bool ok = m < t.m_cnt;
      const size_t row = ok ? size_t(__ldg(a.xrow + t.e0 + m)) : 0;
      cp8(smem_u32(bxs + c), a.xs + (row * nG + size_t(h) * gpc + G) * 2, ok ? 8 : 0);
    }
    cp_commit();
  };

  Unit ct = unit_of<BM>(g, blockIdx.x, its, pu, n_items);
  int buf = 0;
  stage_x(ct, 0, 0);
  for (int cu = blockIdx.x; cu < n_units; cu += gridDim.x) {
    const int nx = cu + int(gridDim.x);
    Unit nt{};
    float acc[WB][NT][4];
#pragma unroll
    for (int wb = 0; wb < WB; ++wb)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[wb][n][i] = 0.f;
    for (int hc = 0; hc < nC; ++hc) {
      // Chunk hc is in buffer buf; every warp is done with the last chunk, so the other buffer takes the
      // next one (this unit's, or the next unit's first) while this one computes.
      cp_wait<0>();
      __syncthreads();
      if (hc + 1 < nC) {
        stage_x(ct, hc + 1, buf ^ 1);
      } else if (nx < n_units) {
        nt = unit_of<BM>(g, nx, its, pu, n_items);
        stage_x(nt, 0, buf ^ 1);
      }
      const uint8_t* sx = sm + xbytes * buf;
      const float2* sxs = reinterpret_cast<const float2*>(sx + plane * kTerms);
      buf ^= 1;
      for (int G0 = hc * gpc; G0 < (hc + 1) * gpc; G0 += KD) {
#pragma unroll
        for (int d = 0; d < KD; ++d) {
          const int G = G0 + d, Gl = G - hc * gpc;  // the weights' group, the chunk's
          uint4 c[WB];
          uint2 q[WB];
#pragma unroll
          for (int wb = 0; wb < WB; ++wb) c[wb] = rc[d][wb], q[wb] = rs[d][wb];
          load(d);  // the slot's next group (KD ahead), while this one computes
          float part[WB][NT][4];
#pragma unroll
          for (int wb = 0; wb < WB; ++wb)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) part[wb][n][i] = 0.f;
#pragma unroll
          for (int j = 0; j < 2; ++j) {  // 16-byte x chunk j of the lane's 32 bytes per group: k-steps 2j, 2j+1
            // Every 8-row tile's x chunk loaded before the MMAs (loading each tile's just before its own MMAs
            // cost 6% of the 16- and 64-row decode step, H100 2026-12-06), each x fragment feeding the warp's
            // WB weight blocks.
            uint4 xv[NT][kTerms];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const int m = 8 * n + gq;
              const uint8_t* px = sx + size_t(m) * KC * 2 + (((Gl * 8 + 2 * tq + j) ^ (m & 1)) << 4);
#pragma unroll
              for (int h = 0; h < kTerms; ++h) xv[n][h] = *reinterpret_cast<const uint4*>(px + h * plane);
            }
#pragma unroll
            for (int p = 0; p < 2; ++p)
#pragma unroll
              for (int wb = 0; wb < WB; ++wb) {
                uint32_t a0, a1, a2, a3;
                cvt4(j ? c[wb].y : c[wb].x, p, a0, a2);
                cvt4(j ? c[wb].w : c[wb].z, p, a1, a3);
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                  for (int h = 0; h < kTerms; ++h) {
                    const uint4 v = xv[n][h];
                    mma(part[wb][n], a0, a1, a2, a3, p ? v.z : v.x, p ? v.w : v.y);
                  }
              }
          }
#pragma unroll
          for (int wb = 0; wb < WB; ++wb) {
            const float s0 = __uint_as_float(q[wb].x << 16), b0 = __uint_as_float(q[wb].x & 0xFFFF0000u);
            const float s1 = __uint_as_float(q[wb].y << 16), b1 = __uint_as_float(q[wb].y & 0xFFFF0000u);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const int m = 8 * n + 2 * tq;
              const float2 xa = sxs[m * gpc + Gl], xb = sxs[(m + 1) * gpc + Gl];
              float* cc = acc[wb][n];
              const float* pp = part[wb][n];
              cc[0] = fmaf(s0 * xa.y, pp[0], fmaf(b0, xa.x, cc[0]));
              cc[1] = fmaf(s0 * xb.y, pp[1], fmaf(b0, xb.x, cc[1]));
              cc[2] = fmaf(s1 * xa.y, pp[2], fmaf(b1, xa.x, cc[2]));
              cc[3] = fmaf(s1 * xb.y, pp[3], fmaf(b1, xb.x, cc[3]));
            }
          }
        }
      }
    }

    // ---- the unit's epilogue (as qgemm's, one m-tile a weight block) ----
    // Lane values: acc[wb][n][u] = weight row r0 (block row gq) of the tile's block bi = WB·warp + wb,
    // activation row 8n + 2t + u; acc[wb][n][2 + u] row r1.
    if constexpr (MODE == kSwiglu) {
      // Block bi: outputs tile·64 + 8·bi + gq, gate in acc[..][0..1], up in acc[..][2..3].
      float act[WB][NT][2];
#pragma unroll
      for (int wb = 0; wb < WB; ++wb)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float v = silu(acc[wb][n][u]) * acc[wb][n][2 + u];
            act[wb][n][u] = v;
            float mx = fabsf(v), sum = v;
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {
              mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
              sum += __shfl_xor_sync(0xffffffffu, sum, off);
            }
            if (gq == 0) red[(WB * warp + wb) * BM + 8 * n + 2 * tq + u] = make_float2(mx, sum);
          }
      __syncthreads();
      if (tid < BM && tid < ct.m_cnt) {
        const float2 r = swiglu_row_scale(red, kBlocks, BM, tid, &rsc[tid]);
        reinterpret_cast<float2*>(a.yxs)[size_t(__ldg(a.yrow + ct.e0 + tid)) * (a.n_out / 64) + ct.tile] = r;
      }
      __syncthreads();
#pragma unroll
      for (int wb = 0; wb < WB; ++wb) {
        const int opos = ct.tile * 64 + 8 * (WB * warp + wb) + 2 * (gq & 3) + (gq >> 2);
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int m = 8 * n + 2 * tq + u;
            if (m < ct.m_cnt) {
              const int yr = __ldg(a.yrow + ct.e0 + m);
              put_act(a.yx, a.yxlo, size_t(yr) * a.n_out + opos, act[wb][n][u] * rsc[m]);
            }
          }
      }
    } else {
#pragma unroll
      for (int wb = 0; wb < WB; ++wb) {
        const int n0 = ct.tile * 128 + 16 * (WB * warp + wb) + gq;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int m = 8 * n + 2 * tq + u;
            if (m < ct.m_cnt) {
              float* y = a.y + size_t(__ldg(a.yrow + ct.e0 + m)) * a.ldy;
              y[n0] = acc[wb][n][u];
              y[n0 + 8] = acc[wb][n][2 + u];
            }
          }
      }
    }
    ct = nt;
  }
}

// WB weight blocks a warp: 2·WB blocks of 8 / WB warps an SM, each with 1/WB of the SM's shared memory for its
// activation chunks.
template <int NT, int MODE, int WB> Status launch(const XArgs& g, cudaStream_t s) {
  constexpr int BM = 8 * NT, KD = kD / WB;
  auto k = xgemm_kernel<NT, MODE, WB>;
  const size_t rest = size_t(kBlocks) * BM * 8 + BM * 4 + size_t(g.a.max_items) * 20 + 16;
  // Activation chunks: the widest KC (K / 2^i, a multiple of 64·KD) whose two buffers leave 2·WB blocks an SM
  // (WB 1: K = 2048 at 8 rows, two passes: 1,024; K = 512: all of it).
  auto xbytes = [&](int kc) { return size_t(BM) * kc * 2 * kTerms + size_t(BM) * (kc / 64) * 8; };
  XArgs h = g;
  h.KC = g.K;
  while (2 * xbytes(h.KC) + rest > 110 * 1024 / WB && h.KC % 2 == 0 && (h.KC / 2) % (64 * KD) == 0) h.KC /= 2;
  const size_t smem = 2 * xbytes(h.KC) + rest;
  static size_t attr = 0;
  if (smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  return launch_k("xgemm", k, dim3(2 * WB * sm_count()), dim3(32 * kBlocks / WB), smem, s, h);
}
// 16-row tiles two weight blocks a warp (half the shared-memory reads of the activation fragments a weight
// byte: the 256-row step's experts were bound by them, 2026-12-06-kv-f16.md; 127 registers, no spill), 8-row
// tiles one. Every block's MMAs and sums are the same whatever WB: the same bits. H100, same call against one
// block a warp (docs/perf/2026-12-06-xgemm-wb2.md): bench-batch 2,035.7 / 4,003.7 / 8,005.8 tok/s at 16 / 64 /
// 256 rows vs 2,024.0 / 3,996.7 / 7,381.1.
template <int MODE> Status launch_nt(int nt, const XArgs& g, cudaStream_t s) {
  return nt == 1 ? launch<1, MODE, 1>(g, s) : launch<2, MODE, 2>(g, s);
}

}  // namespace

size_t frag_bytes(int blocks, int K) { return size_t(blocks) * (K / 64) * (32 * 16 + 8 * 8); }

Status frag_pack(const QW& a, const QW& b, int ra, int oa, int rb, int ob, int blocks, void* dst, FragW* out, Stream s) {
  if (a.bits != 4 || b.bits != 4 || a.cols != b.cols || a.cols % 64 != 0 || blocks < 1 || !dst)
    return cu_err("frag_pack: 4-bit matrices of one K (a multiple of 64) and a destination (K {} / {})", a.cols, b.cols);
  if (size_t(ra) * (blocks - 1) + oa + 8 > size_t(a.rows) || size_t(rb) * (blocks - 1) + ob + 8 > size_t(b.rows))
    return cu_err("frag_pack: {} blocks run past the matrices ({} / {} rows)", blocks, a.rows, b.rows);
  const int nG = a.cols / 64;
  uint32_t* codes = static_cast<uint32_t*>(dst);
  uint32_t* sb = codes + size_t(blocks) * nG * 32 * 4;
  const size_t n = size_t(blocks) * nG * 32;
  frag_pack_kernel<<<unsigned((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(s)>>>(a, b, ra, oa, rb, ob, blocks, codes, sb);
  LILY_TRY(launch_status("frag_pack"));
  out->codes = codes, out->sb = sb, out->blocks = blocks, out->K = a.cols;
  return Status::ok();
}

size_t frag_expert_bytes(int E, int I, int H) {
  return frag_bytes(E * I / 8, H) + frag_bytes(I / 8, H) + frag_bytes(E * H / 16, I) + frag_bytes(H / 16, I);
}

Status frag_pack_experts(const QW& gate, const QW& up, const QW& sh_gate_up, const QW& down, const QW& sh_down, int E,
                         int I, int H, void* dst, FragExperts* out, Stream s) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  LILY_TRY(frag_pack(gate, up, 8, 0, 8, 0, E * I / 8, p, &out->gu, s));
  p += frag_bytes(E * I / 8, H);
  // The shared expert in the table only at the routed experts' width (else it runs apart: no copies).
  const bool sh = sh_gate_up.rows == 2 * I && sh_down.cols == I;
  if (sh) LILY_TRY(frag_pack(sh_gate_up, sh_gate_up, 8, 0, 8, I, I / 8, p, &out->sgu, s));
  p += frag_bytes(I / 8, H);
  LILY_TRY(frag_pack(down, down, 16, 0, 16, 8, E * H / 16, p, &out->dn, s));
  p += frag_bytes(E * H / 16, I);
  return sh ? frag_pack(sh_down, sh_down, 16, 0, 16, 8, H / 16, p, &out->sdn, s) : Status::ok();
}

Status frag_experts(DevWeights& d, int E, int I, int H, void** mem, Stream s) {
  *mem = nullptr;
  if (H % (64 * kD) != 0 || I % (64 * kD) != 0) return Status::ok();  // no xgemm at these K: no copies
  const size_t per = frag_expert_bytes(E, I, H);
  LILY_CU_TRY(cudaMalloc(mem, per * d.layers.size()));
  uint8_t* p = static_cast<uint8_t*>(*mem);
  for (DevLayer& L : d.layers) {
    LILY_TRY(frag_pack_experts(L.gate, L.up, L.sh_gate_up, L.down, L.sh_down, E, I, H, p, &L.frag, s));
    p += per;
  }
  LILY_CU_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
  return Status::ok();
}

// Unforced, at most 16-row tiles: qgemm's rule picks 32-row ones from ~16 entries an expert, but xgemm's
// 16-row tiles (two chunks an expert there) run faster. H200, 2026-12-07 (CudaQgemm.Bench, two passes, 736
// rows = 23 an expert, a mixed step's decode + prompt rows): gate+up 364.1 µs vs 478.9 with 32-row tiles, down
// 190.5 vs 235.0. Any tile height gives the same bits.
static int xgemm_nt(const QGemmArgs& a) { return a.nt ? a.nt : std::min(qgemm_items_nt(a), 2); }

bool xgemm_fits(const QGemmArgs& a) {
  const int nt = xgemm_nt(a);
  return a.items && a.w.cols % (64 * kD) == 0 && (nt == 1 || nt == 2) && (a.swiglu ? a.n_out % 64 == 0 : a.n_out % 128 == 0);
}

Status xgemm(const QGemmArgs& a, const FragW& w, const FragW& sh, Stream stream) {
  if (!xgemm_fits(a)) return cu_err("xgemm: needs items, K % {} == 0 (K {}), a tile of 8 or 16 rows and whole tiles", 64 * kD, a.w.cols);
  // No shared copy (sh empty): the routing table has no shared item (broute's shared_item false).
  if (!w.codes || w.K != a.w.cols || (sh.codes && sh.K != a.w.cols)) return cu_err("xgemm: fragment copies of K {} needed", a.w.cols);
  if (!a.x || !a.xs || !a.xlo || !a.xrow || !a.yrow || a.max_items < 1 || a.max_items > kMaxItems || a.E < 1)
    return cu_err("xgemm: items mode needs x, xs, xlo, xrow, yrow, max_items (1..{}) and E", kMaxItems);
  XArgs g{};
  g.a = a, g.w = w, g.sh = sh, g.K = a.w.cols, g.nG = a.w.cols / 64;
  if (a.swiglu) {
    if (!a.yx || !a.yxs || !a.yxlo) return cu_err("xgemm: swiglu writes packed rows (yx, yxs, yxlo)");
    g.T = a.n_out / 64, g.bpe = a.n_out / 8;
  } else {
    if (!a.y || a.ldy < a.n_out) return cu_err("xgemm: items output y needs ldy >= n_out");
    g.T = a.n_out / 128, g.bpe = a.n_out / 16;
  }
  if (w.blocks < a.E * g.bpe || (sh.codes && sh.blocks < g.bpe)) return cu_err("xgemm: fragment copies hold {} / {} blocks, fewer than the experts' {}", w.blocks, sh.blocks, g.bpe);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int nt = xgemm_nt(a);
  return a.swiglu ? launch_nt<kSwiglu>(nt, g, s) : launch_nt<kItems>(nt, g, s);
}

}  // namespace lily::cuda
