// xgemm (contract in xgemm.h): persistent blocks of two warpgroups walk the work units of qgemm's items
// mode (unit = one item × one tile of 8 warp blocks × one chunk of BM = 8·NT activation rows). The block
// stages the unit's activation rows (fp16 hi [+ lo], and the group sums) in shared memory in chunks of KC
// columns through two buffers, the next chunk (or the next unit's first) loading while one computes. Each
// warp streams its 16-row weight block group by group through a ring of kS shared-memory stages that the
// copy engine fills (bulk copies completing on an mbarrier per stage), kS groups ahead and on into the
// warp's block of the next unit, so the weight loads never stop at a unit or chunk boundary and hold no
// registers. Per group a warpgroup (4 blocks = 64 weight rows, the A operand converted into registers) runs
// four wgmma k-steps (eight with two passes) over the group's activation tile (the B operand, read by the
// tensor cores from shared memory once for the 64 rows: mma.sync made each warp read it, which bound the
// kernel on shared memory) into a zeroed partial, then y += (scale·2^-e)·part + bias·Σx in fp32 (qgemm's
// formula), that epilogue overlapping the next group's wgmmas. The wgmma width is the unit's rows rounded
// up to 8, 16, 32 or 64.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/wgmma_util.cuh"
#include "backend/cuda/gemm/q4_mma.cuh"
#include "backend/cuda/moe/xgemm.h"

namespace lily::cuda {
namespace {
using namespace q4;

constexpr int kThreads = 256, kWarps = 8, kMaxItems = 1024;
// The weight ring: kS stages a warp, each one group (512 bytes of codes + 64 of sb), filled by the copy engine.
constexpr int kS = 7, kStage = 576;
constexpr int kKMult = 256;  // K of the matrices xgemm takes (and frag_experts copies): a multiple of this
enum Mode : int { kItems = 1, kSwiglu = 2 };

struct XArgs {
  QGemmArgs a;
  FragW w, sh;
  int K, nG, T, bpe;  // bpe: weight blocks per expert (swiglu n_out/8, plain n_out/16)
  int KC;             // activation columns a shared-memory buffer holds (K / KC chunks a unit, two buffers)
};

// ---- the fragment copy ----
// Thread per (block, group, lane 4·gq + t): per row (r0, r1) two words, words 0..3 and 4..7 of the row's
// eight, word w's nibbles t and t + 4 at bits 4(w & 3) and 16 + 4(w & 3); and (lanes with t == 0) the
// {sb(r0), sb(r1)} pair.
__device__ __forceinline__ uint2 lane_nibbles(const uint32_t* c, int t) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    const uint32_t v = (c[w] >> (4 * t)) & 0x000F000Fu;
    (w < 4 ? lo : hi) |= v << (4 * (w & 3));
  }
  return make_uint2(lo, hi);
}
__global__ void frag_pack_kernel(QW a, QW b, int ra, int oa, int rb, int ob, int blocks, uint32_t* codes, uint32_t* sb) {
  const int nG = a.cols / 64, wpr = a.cols / 8;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x, n = size_t(blocks) * nG * 32;
  if (i >= n) return;
  const int lane = int(i & 31), G = int((i >> 5) % size_t(nG));
  const size_t blk = (i >> 5) / size_t(nG);
  const int gq = lane >> 2, t = lane & 3;
  const size_t r0 = size_t(ra) * blk + size_t(oa) + gq, r1 = size_t(rb) * blk + size_t(ob) + gq;
  const uint2 n0 = lane_nibbles(a.codes + r0 * wpr + size_t(G) * 8, t);
  const uint2 n1 = lane_nibbles(b.codes + r1 * wpr + size_t(G) * 8, t);
  reinterpret_cast<uint4*>(codes)[i] = make_uint4(n0.x, n0.y, n1.x, n1.y);
  if (t == 0) {
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

// The warp's weight stream: unit u's block of this warp, group by group (512 bytes of codes, 64 of sb a
// group), then the next unit's.
struct Stream4 {
  const uint8_t* c;  // the block's codes, group 0
  const uint8_t* s;  // the block's {sb(r0), sb(r1)} × 8, group 0
};
__device__ __forceinline__ Stream4 stream_of(const XArgs& g, const Unit& t, int warp) {
  const bool shared = t.expert == g.a.E;
  const FragW& f = shared ? g.sh : g.w;
  const size_t blk = size_t(shared ? 0 : t.expert) * g.bpe + size_t(t.tile) * kWarps + warp;
  return Stream4{reinterpret_cast<const uint8_t*>(f.codes) + blk * g.nG * 512,
                 reinterpret_cast<const uint8_t*>(f.sb) + blk * g.nG * 64};
}
// The shared-memory mbarrier at bar: init (count arrivals), arrive expecting tx bytes, wait for a phase parity.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// bytes (a multiple of 16) from global src to shared dst by the copy engine, completing tx bytes on bar.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Bytes of one activation buffer of BM rows × KC columns (x hi [+ lo], {Σx, 2^-e}), 1024-aligned.
__host__ __device__ constexpr size_t x_bytes(int BM, int KC, int terms) {
  return (size_t(BM) * KC * 2 * terms + size_t(BM) * (KC / 64) * 8 + 1023) / 1024 * 1024;
}

// A group's wgmmas at width N (the unit's rows rounded up to 8, 16, 32 or 64): four k-steps of the hi
// plane, then (two passes) four of the lo plane, into a zeroed partial, as one wgmma group.
template <int N, int TERMS>
__device__ __forceinline__ void group_issue(float* part, const uint32_t (&af)[4][4], uint64_t dh, uint64_t dl) {
  pf::wg_arrive();
#pragma unroll
  for (int s = 0; s < 4; ++s) pf::wgmma_rs<N>(part, af[s], dh + 2 * s, s > 0);
  if constexpr (TERMS == 2) {
#pragma unroll
    for (int s = 0; s < 4; ++s) pf::wgmma_rs<N>(part, af[s], dl + 2 * s, 1);
  }
  pf::wg_commit();
}
// A group's epilogue: per 8-row tile n holding rows, acc[n] += (scale·2^-e)·part + bias·Σx (qgemm's formula).
// sb: {sb(r0), sb(r1)}; sxs: the chunk's {Σx, 2^-e} [BM][gpc].
template <int N, int NT>
__device__ __forceinline__ void group_acc(float (&acc)[NT][4], float (&part)[N / 2], uint2 sb, const float2* sxs, int gpc,
                                          int Gl, int nsub, int tq) {
  pf::fence_regs(part);
  const float s0 = __uint_as_float(sb.x << 16), b0 = __uint_as_float(sb.x & 0xFFFF0000u);
  const float s1 = __uint_as_float(sb.y << 16), b1 = __uint_as_float(sb.y & 0xFFFF0000u);
#pragma unroll
  for (int n = 0; n < N / 8; ++n) {
    if (n >= nsub) break;
    const int m = 8 * n + 2 * tq;
    const float2 xa = sxs[m * gpc + Gl], xb = sxs[(m + 1) * gpc + Gl];
    float* cc = acc[n];
    const float* pp = part + 4 * n;
    cc[0] = fmaf(s0 * xa.y, pp[0], fmaf(b0, xa.x, cc[0]));
    cc[1] = fmaf(s0 * xb.y, pp[1], fmaf(b0, xb.x, cc[1]));
    cc[2] = fmaf(s1 * xa.y, pp[2], fmaf(b1, xa.x, cc[2]));
    cc[3] = fmaf(s1 * xb.y, pp[3], fmaf(b1, xb.x, cc[3]));
  }
}
// One chunk's gpc groups (gpc even) at width N, each group's weights from next(c, q) (the warp's ring),
// pipelined: group G's wgmmas are issued before group G − 1's epilogue, so the tensor cores run while the
// warp does its FMAs; all done on return (the chunk's buffer may be overwritten after the block's next
// barrier). x tile of group G at sx_s + G·gstride (hi) and + plane (lo).
template <int N, int NT, int TERMS, class Next>
__device__ __forceinline__ void chunk_mma(float (&acc)[NT][4], Next& next, uint32_t sx_s, uint32_t gstride, uint32_t plane,
                                          const float2* sxs, int gpc, int nsub, int tq) {
  float part[2][N / 2];
  uint2 sbp = make_uint2(0u, 0u);
  for (int G0 = 0; G0 < gpc; G0 += 2) {
#pragma unroll
    for (int d = 0; d < 2; ++d) {
      const int Gl = G0 + d;
      uint4 c;
      uint2 q;
      next(c, q);
      // A fragments of k-step s: rows r0 / r1, words 2s (k-slots 2t, 2t + 1) and 2s + 1 (2t + 8, 2t + 9).
      uint32_t af[4][4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t w0 = s < 2 ? c.x : c.y, w1 = s < 2 ? c.z : c.w;
        const int s0 = 8 * (s & 1), s1 = s0 + 4;
        af[s][0] = nib2h(w0 >> s0), af[s][1] = nib2h(w1 >> s0), af[s][2] = nib2h(w0 >> s1), af[s][3] = nib2h(w1 >> s1);
      }
      const uint32_t gb = sx_s + uint32_t(Gl) * gstride;
      group_issue<N, TERMS>(part[d], af, pf::sw128_desc(gb), pf::sw128_desc(gb + plane));
      if (d > 0 || G0 > 0) {
        pf::wg_wait<1>();
        group_acc<N, NT>(acc, part[d ^ 1], sbp, sxs, gpc, Gl - 1, nsub, tq);
      }
      sbp = q;
    }
  }
  pf::wg_wait<0>();
  group_acc<N, NT>(acc, part[1], sbp, sxs, gpc, gpc - 1, nsub, tq);  // gpc even: the last group's partial
}

template <int NT, int MODE, int TERMS>
__global__ void __launch_bounds__(kThreads, NT == 8 ? 1 : 2) xgemm_kernel(XArgs g) {
  constexpr int BM = 8 * NT;
  extern __shared__ __align__(16) uint8_t smraw[];
  uint8_t* sm = smraw + ((1024u - (smem_u32(smraw) & 1023u)) & 1023u);
  const QGemmArgs& a = g.a;
  const int K = g.K, nG = g.nG;
  // Shared memory (1024-aligned): two activation buffers, each one chunk of KC columns of the unit's rows:
  // x hi as KC/64 group tiles of [BM rows][128 bytes] in the 128-byte swizzle (the wgmma B operand), x lo
  // the same, {Σx, 2^-e} [BM][KC/64]; then the swiglu epilogue's [kWarps][BM] {max, sum} and [BM] scales,
  // the items and their unit prefix.
  const int KC = g.KC, gpc = KC / 64, nC = K / KC;  // groups a chunk, chunks a unit
  const size_t plane = size_t(BM) * KC * 2, xbytes = x_bytes(BM, KC, TERMS);
  // The weight ring (kWarps × kS stages of kStage bytes) and its mbarriers follow the buffers.
  uint8_t* wring = sm + xbytes * 2;
  uint64_t* bars = reinterpret_cast<uint64_t*>(wring + kWarps * kS * kStage);
  float2* red = reinterpret_cast<float2*>(bars + kWarps * kS);
  float* rsc = reinterpret_cast<float*>(red + kWarps * BM);
  int4* its = reinterpret_cast<int4*>(rsc + BM);
  int* pu = reinterpret_cast<int*>(its + a.max_items);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
  if (lane == 0) {
    for (int i = 0; i < kS; ++i) mbar_init(smem_u32(bars + warp * kS + i), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
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

  // The ring: the warp's groups in stream order through its kS stages, lane 0 filling stage i with the
  // stream's group kS ahead of the one consumed from it; every lane waits on the stage's mbarrier (phase =
  // the stage's use count, mod 2), reads its 16 bytes of codes and its sb pair, and (after the warp's reads)
  // lane 0 refills it.
  const uint32_t ring_s = smem_u32(wring + warp * kS * kStage), bar_s = smem_u32(bars + warp * kS);
  int lu = blockIdx.x, lg = 0;  // the fill cursor: unit, group
  Stream4 ls = stream_of(g, unit_of<BM>(g, lu, its, pu, n_items), warp);
  int fill = 0, cons = 0;  // the stages to fill and to consume next
  uint32_t phase = 0;      // the consumed stage's phase parity
  auto issue = [&]() {
    if (lu >= n_units) return;
    if (lane == 0) {
      const uint32_t bar = bar_s + fill * 8, dst = ring_s + fill * kStage;
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the warp's reads of the stage before the refill
      mbar_expect_tx(bar, kStage);
      bulk_g2s(dst, ls.c + size_t(lg) * 512, 512, bar);
      bulk_g2s(dst + 512, ls.s + size_t(lg) * 64, 64, bar);
    }
    if (++fill == kS) fill = 0;
    if (++lg == nG) {
      lg = 0;
      lu += gridDim.x;
      if (lu < n_units) ls = stream_of(g, unit_of<BM>(g, lu, its, pu, n_items), warp);
    }
  };
  auto next = [&](uint4& c, uint2& q) {
    mbar_wait(bar_s + cons * 8, phase);
    const uint32_t st = ring_s + cons * kStage;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "r"(st + lane * 16));
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(q.x), "=r"(q.y) : "r"(st + 512 + gq * 8));
    if (++cons == kS) cons = 0, phase ^= 1;
    __syncwarp();
    issue();
  };

  // Chunk h (columns [h·KC, +KC)) of unit t's activation rows into buffer b (rows past m_cnt zero), as one
  // cp.async group: 16-byte piece q of group G of row m at G·BM·128 + m·128 + ((q ^ (m & 7)) << 4).
  auto stage_x = [&](const Unit& t, int h, int b) {
    uint8_t* bx = sm + xbytes * b;
    for (int c = tid; c < BM * gpc * 8; c += kThreads) {
      const int q = c & 7, mg = c >> 3, m = mg / gpc, G = mg - m * gpc;
      const bool ok = m < t.m_cnt;
      const size_t src = (ok ? size_t(__ldg(a.xrow + t.e0 + m)) * a.ldx : 0) + size_t(h) * KC + G * 64 + q * 8;
      const uint32_t dst = smem_u32(bx + size_t(G) * BM * 128 + pf::sw128_off(m, q));
      cp16(dst, a.x + src, ok);
      if constexpr (TERMS == 2) cp16(dst + uint32_t(plane), a.xlo + src, ok);
    }
    float2* bxs = reinterpret_cast<float2*>(bx + plane * TERMS);
    for (int c = tid; c < BM * gpc; c += kThreads) {
      const int m = c / gpc, G = c - m * gpc;
      const bool ok = m < t.m_cnt;
      const size_t row = ok ? size_t(__ldg(a.xrow + t.e0 + m)) : 0;
      cp8(smem_u32(bxs + c), a.xs + (row * nG + size_t(h) * gpc + G) * 2, ok ? 8 : 0);
    }
    cp_commit();
  };

  for (int i = 0; i < kS; ++i) issue();
  Unit ct = unit_of<BM>(g, blockIdx.x, its, pu, n_items);
  int buf = 0;
  stage_x(ct, 0, 0);
  for (int cu = blockIdx.x; cu < n_units; cu += gridDim.x) {
    const int nx = cu + int(gridDim.x);
    Unit nt{};
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
    // The 8-row tiles holding the unit's rows, as the wgmma width (rounded up to a power of two; the rows
    // past m_cnt are zero and never stored). Block-uniform.
    const int nsub = (ct.m_cnt + 7) >> 3, wn = nsub <= 1 ? 8 : nsub <= 2 ? 16 : nsub <= 4 ? 32 : 64;
    for (int hc = 0; hc < nC; ++hc) {
      // Chunk hc is in buffer buf; every warp's wgmmas on the last chunk are done, so the other buffer takes
      // the next one (this unit's, or the next unit's first) while this one computes.
      cp_wait<0>();
      pf::fence_async_smem();  // the cp.async writes (generic proxy) before the wgmma reads (async proxy)
      __syncthreads();
      if (hc + 1 < nC) {
        stage_x(ct, hc + 1, buf ^ 1);
      } else if (nx < n_units) {
        nt = unit_of<BM>(g, nx, its, pu, n_items);
        stage_x(nt, 0, buf ^ 1);
      }
      const uint8_t* sx = sm + xbytes * buf;
      const uint32_t sx_s = smem_u32(sx);
      const float2* sxs = reinterpret_cast<const float2*>(sx + plane * TERMS);
      buf ^= 1;
      const uint32_t gs = BM * 128, pl = uint32_t(plane);
      if (wn == 8) chunk_mma<8, NT, TERMS>(acc, next, sx_s, gs, pl, sxs, gpc, nsub, tq);
      else if (NT >= 2 && wn == 16) chunk_mma<(NT >= 2 ? 16 : 8), NT, TERMS>(acc, next, sx_s, gs, pl, sxs, gpc, nsub, tq);
      else if (NT >= 4 && wn == 32) chunk_mma<(NT >= 4 ? 32 : 8), NT, TERMS>(acc, next, sx_s, gs, pl, sxs, gpc, nsub, tq);
      else if (NT >= 8) chunk_mma<(NT >= 8 ? 64 : 8), NT, TERMS>(acc, next, sx_s, gs, pl, sxs, gpc, nsub, tq);
    }

    // ---- the unit's epilogue (as qgemm's, one m-tile a warp) ----
    // Lane values: acc[n][u] = weight row r0 (block row gq), activation row 8n + 2t + u; acc[n][2 + u] row r1.
    if constexpr (MODE == kSwiglu) {
      // Warp w's block: outputs tile·64 + 8w + gq, gate in acc[..][0..1], up in acc[..][2..3].
      float act[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const float v = silu(acc[n][u]) * acc[n][2 + u];
          act[n][u] = v;
          float mx = fabsf(v), sum = v;
#pragma unroll
          for (int off = 4; off < 32; off <<= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
          }
          if (gq == 0) red[warp * BM + 8 * n + 2 * tq + u] = make_float2(mx, sum);
        }
      __syncthreads();
      if (tid < BM && tid < ct.m_cnt) {
        const float2 r = swiglu_row_scale(red, kWarps, BM, tid, &rsc[tid]);
        reinterpret_cast<float2*>(a.yxs)[size_t(__ldg(a.yrow + ct.e0 + tid)) * (a.n_out / 64) + ct.tile] = r;
      }
      __syncthreads();
      const int opos = ct.tile * 64 + 8 * warp + 2 * (gq & 3) + (gq >> 2);
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int m = 8 * n + 2 * tq + u;
          if (m < ct.m_cnt) {
            const int yr = __ldg(a.yrow + ct.e0 + m);
            put_act<TERMS>(a.yx, a.yxlo, size_t(yr) * a.n_out + opos, act[n][u] * rsc[m]);
          }
        }
    } else {
      const int n0 = ct.tile * 128 + 16 * warp + gq;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int m = 8 * n + 2 * tq + u;
          if (m < ct.m_cnt) {
            float* y = a.y + size_t(__ldg(a.yrow + ct.e0 + m)) * a.ldy;
            y[n0] = acc[n][u];
            y[n0 + 8] = acc[n][2 + u];
          }
        }
    }
    ct = nt;
  }
}

template <int NT, int MODE, int TERMS> Status launch(const XArgs& g, cudaStream_t s) {
  constexpr int BM = 8 * NT, per_sm = NT == 8 ? 1 : 2;
  auto k = xgemm_kernel<NT, MODE, TERMS>;
  // The weight ring and its barriers, the epilogue's scratch, the items, + 1024 bytes of alignment slack.
  const size_t rest = size_t(kWarps) * kS * (kStage + 8) + size_t(kWarps) * BM * 8 + BM * 4 + size_t(g.a.max_items) * 20 + 16 + 1024;
  // Activation chunks: the widest KC (K / 2^i, a multiple of 128: an even number of groups) whose two buffers
  // leave per_sm blocks an SM.
  const size_t cap = per_sm == 2 ? 112 * 1024 : 220 * 1024;
  XArgs h = g;
  h.KC = g.K;
  while (2 * x_bytes(BM, h.KC, TERMS) + rest > cap && h.KC % 2 == 0 && (h.KC / 2) % 128 == 0) h.KC /= 2;
  if (2 * x_bytes(BM, h.KC, TERMS) + rest > cap) return cu_err("xgemm: K {} with {} items does not fit the shared memory", g.K, g.a.max_items);
  const size_t smem = 2 * x_bytes(BM, h.KC, TERMS) + rest;
  static size_t attr = 0;
  if (smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  return launch_k("xgemm", k, dim3(per_sm * sm_count()), dim3(kThreads), smem, s, h);
}
template <int MODE> Status launch_nt(int nt, const XArgs& g, cudaStream_t s) {
  const bool two = g.a.xlo != nullptr;
  if (nt == 1) return two ? launch<1, MODE, 2>(g, s) : launch<1, MODE, 1>(g, s);
  if (nt == 2) return two ? launch<2, MODE, 2>(g, s) : launch<2, MODE, 1>(g, s);
  if (nt == 4) return two ? launch<4, MODE, 2>(g, s) : launch<4, MODE, 1>(g, s);
  return two ? launch<8, MODE, 2>(g, s) : launch<8, MODE, 1>(g, s);
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
  LILY_TRY(frag_pack(sh_gate_up, sh_gate_up, 8, 0, 8, I, I / 8, p, &out->sgu, s));
  p += frag_bytes(I / 8, H);
  LILY_TRY(frag_pack(down, down, 16, 0, 16, 8, E * H / 16, p, &out->dn, s));
  p += frag_bytes(E * H / 16, I);
  return frag_pack(sh_down, sh_down, 16, 0, 16, 8, H / 16, p, &out->sdn, s);
}

Status frag_experts(DevWeights& d, int E, int I, int H, void** mem, Stream s) {
  *mem = nullptr;
  if (H % (kKMult) != 0 || I % (kKMult) != 0) return Status::ok();  // no xgemm at these K: no copies
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

bool xgemm_fits(const QGemmArgs& a) {
  const int nt = qgemm_items_nt(a);
  return a.items && a.w.cols % (kKMult) == 0 && (nt == 1 || nt == 2 || nt == 4 || nt == 8) && (a.swiglu ? a.n_out % 64 == 0 : a.n_out % 128 == 0);
}

Status xgemm(const QGemmArgs& a, const FragW& w, const FragW& sh, Stream stream) {
  if (!xgemm_fits(a)) return cu_err("xgemm: needs items, K % {} == 0 (K {}), a tile of 8, 16, 32 or 64 rows and whole tiles", kKMult, a.w.cols);
  if (!w.codes || !sh.codes || w.K != a.w.cols || sh.K != a.w.cols) return cu_err("xgemm: fragment copies of K {} needed", a.w.cols);
  if (!a.x || !a.xs || !a.xrow || !a.yrow || a.max_items < 1 || a.max_items > kMaxItems || a.E < 1)
    return cu_err("xgemm: items mode needs x, xs, xrow, yrow, max_items (1..{}) and E", kMaxItems);
  XArgs g{};
  g.a = a, g.w = w, g.sh = sh, g.K = a.w.cols, g.nG = a.w.cols / 64;
  if (a.swiglu) {
    if (!a.yx || !a.yxs || !a.xlo != !a.yxlo) return cu_err("xgemm: swiglu writes packed rows (yx, yxs; yxlo with xlo)");
    g.T = a.n_out / 64, g.bpe = a.n_out / 8;
  } else {
    if (!a.y || a.ldy < a.n_out) return cu_err("xgemm: items output y needs ldy >= n_out");
    g.T = a.n_out / 128, g.bpe = a.n_out / 16;
  }
  if (w.blocks < a.E * g.bpe || sh.blocks < g.bpe) return cu_err("xgemm: fragment copies hold {} / {} blocks, fewer than the experts' {}", w.blocks, sh.blocks, g.bpe);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int nt = qgemm_items_nt(a);
  return a.swiglu ? launch_nt<kSwiglu>(nt, g, s) : launch_nt<kItems>(nt, g, s);
}

}  // namespace lily::cuda
