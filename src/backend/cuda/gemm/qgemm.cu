// qgemm: the quantized GEMM of the serving step (contract in qgemm.h). Persistent blocks (two per SM
// for tiles of ≤ 16 rows, else one) walk their work units (unit = 128 weight rows × one chunk of
// ≤ 8·NT activation rows × a k range), streaming every unit's stages (256 k: codes, {scale, bias},
// fp16 x and its group sums) through a ring of NS shared-memory stages by cp.async, so NS−1 stages
// stay in flight across unit boundaries.
//
// MMA operands (m16n8k16, f16 → f32), swap AB: A = 16 weight rows × 16 k, B = 16 k × 8 activation
// rows. Within a 64-group, lane quad t owns k 16t..16t+15 of a row: for 4-bit the two code words
// 2t, 2t+1 of the group (8 bytes), for 8-bit the four words 4t..4t+3 (16 bytes). The k order inside
// the MMA is permuted to match the codes: a 4-bit word (n0..n7) yields the fp16 pairs (n0,n4),
// (n1,n5) for one k-step and (n2,n6), (n3,n7) for the next (lop3 into the 1024 exponent), and the
// packers store x in that order ([x0,x4,x1,x5,x2,x6,x3,x7] per 8 values), so one 16-byte load is the
// B fragments of two k-steps. The groups of a stage run as independent accumulator chains (ILP);
// each group's four k-steps accumulate from zero, then y += (scale·2^-e)·part + bias·Σx in a fixed
// order.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/qgemm.h"
#include "backend/cuda/gemm/qgemm_wg.h"
#include "backend/cuda/gemm/q4_mma.cuh"

namespace lily::cuda {
namespace {
using namespace q4;

// Activations enter as fp16 hi + lo (qgemm.h): two MMAs per product.
constexpr int kTerms = 2;
constexpr int kThreads = 256, kWarps = 8, kBN = 128, kBK = 256, kGS = kBK / 64, kMaxItems = 1024;

enum Mode : int { kDense = 0, kItems = 1, kSwiglu = 2 };

template <int BITS, int NT> struct Cfg {
  static constexpr int BM = 8 * NT;
  static constexpr int BPS = (BITS == 4 && NT == 1) ? 2 : 1;  // blocks per SM (≤ 128 registers)
  static constexpr int kRowB = kBK * BITS / 8;  // code bytes of a row per stage (128 / 256)
  static constexpr int kCodes = kBN * kRowB;
  static constexpr int kSb = kBN * kGS * 4;  // {scale, bias} bf16 per row and group
  static constexpr int kXP = BM * kBK * 2;   // one fp16 plane: rows of 512 bytes
  static constexpr int kX = kXP * kTerms;     // hi plane, then the lo plane
  static constexpr int kXs = BM * kGS * 8;   // {Σx, 2^-e} per row and group
  static constexpr int kStage = kCodes + kSb + kX + kXs;
  // After the ring: the swiglu epilogue's per-warp row {max, sum} and per-row scale, then the items.
  static constexpr int kRed = kWarps * BM * 8 + BM * 4;
  static constexpr int kBudget = (BPS == 2 ? 110 : 214) * 1024 - kRed - 6 * 1024;
  static constexpr int NS = kBudget / kStage > 8 ? 8 : kBudget / kStage;
  static constexpr int kRing = NS * kStage;
  // Warp grid: WR warps along the tile's rows (MT m-tiles of 16 each) × WT along its activation rows
  // (NW n-tiles of 8 each). Two token warps for NT ≥ 4 halve the x fragments each warp reads from
  // shared memory (the ring's bandwidth bounds large tiles).
  static constexpr int WT = NT >= 4 ? 2 : 1, WR = kWarps / WT, MT = kBN / (16 * WR), NW = NT / WT;
  // Groups whose MMA chains run together: fewer when the n-tiles already give the warp independent chains.
  static constexpr int GI = NT == 1 ? 2 : 1;
  static constexpr size_t smem(int max_items) { return size_t(kRing + kRed) + size_t(max_items) * 20 + 16; }
  static_assert(NS >= 2, "qgemm: stage too large for the ring");
};

struct Args {
  QGemmArgs a;
  int mode, N, K, nG, nks, T, S, C, n_units;  // N: weight rows of a dense matrix; T tiles; S splits; C chunks
};

// One work unit, as both cursors (loads and MMAs) see it.
struct Unit {
  int tile, chunk, split, ks0, ks1;  // k stages [ks0, ks1)
  int expert, e0, m_cnt;             // items: expert (E = shared), first entry; rows in this chunk
};

template <int BM>
__device__ __forceinline__ Unit unit_of(const Args& g, int u, const int4* its, const int* pu, int n_items) {
  Unit r{};
  if (g.mode == kDense) {
    r.chunk = u % g.C;
    const int ts = u / g.C;
    r.split = ts % g.S, r.tile = ts / g.S;
    r.ks0 = r.split * g.nks / g.S, r.ks1 = (r.split + 1) * g.nks / g.S;
    r.e0 = r.chunk * BM;
    r.m_cnt = min(BM, g.a.M - r.e0);
    r.expert = 0;
    return r;
  }
  const int i = item_of(pu, n_items, u);
  const int4 it = its[i];
  const int c = (it.y + BM - 1) / BM, rr = u - pu[i];
  r.tile = rr / c, r.chunk = rr - r.tile * c, r.split = 0, r.ks0 = 0, r.ks1 = g.nks;
  r.expert = it.x, r.e0 = it.z + r.chunk * BM, r.m_cnt = min(BM, it.y - r.chunk * BM);
  return r;
}

// Global codes and {scale, bias} rows of tile row rr (0..127) of unit t; null when past the matrix.
// swiglu: tile rows 16w..16w+7 are gate rows of outputs tile·64 + 8w + 0..7, rows 16w+8.. their up rows.
template <int BITS>
__device__ __forceinline__ void weight_row(const Args& g, const Unit& t, int rr, const uint8_t*& code,
                                           const uint32_t*& sb) {
  const QGemmArgs& a = g.a;
  const size_t rb = size_t(a.w.cols) * BITS / 8, groups = size_t(a.w.cols / 64);
  const QW* m = &a.w;
  long row;
  code = nullptr, sb = nullptr;
  if (g.mode == kSwiglu) {
    const int o = t.tile * 64 + 8 * (rr >> 4) + (rr & 7);
    const bool up = rr & 8;
    if (o >= a.n_out) return;
    if (t.expert == a.E) m = &a.sh, row = up ? long(a.n_out) + o : o;
    else m = up ? &a.w2 : &a.w, row = long(t.expert) * a.n_out + o;
  } else if (g.mode == kItems) {
    const int n = t.tile * kBN + rr;
    if (n >= a.n_out) return;
    if (t.expert == a.E) m = &a.sh, row = n;
    else row = long(t.expert) * a.n_out + n;
  } else {
    row = long(t.tile) * kBN + rr;
    if (row >= g.N) return;
  }
  code = reinterpret_cast<const uint8_t*>(m->codes) + size_t(row) * rb;
  sb = reinterpret_cast<const uint32_t*>(m->sb) + size_t(row) * groups;
}

template <int BITS, int NT, int MODE>
__global__ void __launch_bounds__(kThreads, Cfg<BITS, NT>::BPS) qgemm_kernel(Args g) {
  using C = Cfg<BITS, NT>;
  constexpr int BM = C::BM, NS = C::NS, GI = C::GI;
  constexpr int kRowChunks = C::kRowB / 16;                         // 16-byte code chunks per row (8 / 16)
  constexpr int kCodeChunks = kBN * kRowChunks / kThreads;          // per thread (4 / 8)
  constexpr int kXChunks = (BM * 32 + kThreads - 1) / kThreads;     // 16-byte x chunks per thread
  extern __shared__ __align__(16) uint8_t sm[];
  float2* red = reinterpret_cast<float2*>(sm + C::kRing);            // [kWarps][BM]
  float* rsc = reinterpret_cast<float*>(red + kWarps * BM);          // [BM]
  int4* its = reinterpret_cast<int4*>(rsc + BM);                     // [max_items]
  int* pu = reinterpret_cast<int*>(its + g.a.max_items);             // [max_items + 1]
  const QGemmArgs& a = g.a;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;

  int n_units = g.n_units, n_items = 0;
  if (MODE != kDense) {
    pdl_wait();
    pdl_trigger();
    n_items = min(__ldcg(a.n_items), a.max_items);
    for (int i = tid; i < n_items; i += kThreads) its[i] = reinterpret_cast<const int4*>(a.items)[i];
    __syncthreads();
    if (tid == 0) {  // units before each item (item i: its tiles × its row chunks)
      int s = 0;
      for (int i = 0; i < n_items; ++i) pu[i] = s, s += g.T * ((its[i].y + BM - 1) / BM);
      pu[n_items] = s;
    }
    __syncthreads();
    n_units = pu[n_items];
  }
  if (int(blockIdx.x) >= n_units) {
    if (MODE == kDense) {
      pdl_wait();
      pdl_trigger();
    }
    return;
  }

  // ---- the load cursor: unit, stage, and this thread's source rows for it ----
  // Thread tid copies code chunk q = tid % kRowChunks of tile rows tid / kRowChunks + j·(256 / kRowChunks);
  // {scale, bias} of row tid / 2, groups 2·(tid % 2) and +1; x chunk (tid + 256j) % 32 of row
  // (tid + 256j) / 32; {Σx, 2^-e} of row tid / 4, group tid % 4.
  constexpr int kRowStep = kThreads / kRowChunks;
  const int cq = tid % kRowChunks, crr = tid / kRowChunks;
  const int cgrp = BITS == 4 ? cq >> 1 : cq >> 2;
  const int cpos = BITS == 4 ? (((cq >> 1) ^ (crr & 3)) << 1) | (cq & 1) : (((cq >> 2) ^ (crr & 3)) << 2) | (cq & 3);
  const bool sb_pairs = (g.nG & 1) == 0;  // {scale, bias} of two groups are 8-byte aligned
  int lu = blockIdx.x, lks = 0;
  Unit lt{};
  const uint8_t* crow[kCodeChunks];
  const uint32_t* sbrow = nullptr;
  const uint16_t* xrow[kXChunks];  // hi rows; the lo rows sit at the same offset from a.xlo
  const float* xsrow = nullptr;
  auto load_unit = [&]() {
    lt = unit_of<BM>(g, lu, its, pu, n_items);
    lks = lt.ks0;
    const uint32_t* d1;
    const uint8_t* d2;
#pragma unroll
    for (int j = 0; j < kCodeChunks; ++j) weight_row<BITS>(g, lt, crr + j * kRowStep, crow[j], d1);
    weight_row<BITS>(g, lt, tid >> 1, d2, sbrow);
#pragma unroll
    for (int j = 0; j < kXChunks; ++j) {
      const int m = (tid + j * kThreads) >> 5;
      xrow[j] = nullptr;
      if (m < BM && m < lt.m_cnt) {
        const int e = lt.e0 + m;
        const int r = MODE == kDense ? e : __ldg(a.xrow + e);
        xrow[j] = a.x + size_t(r) * a.ldx;
      }
    }
    xsrow = nullptr;
    if (tid < kGS * BM && (tid >> 2) < lt.m_cnt) {
      const int e = lt.e0 + (tid >> 2);
      const int r = MODE == kDense ? e : __ldg(a.xrow + e);
      xsrow = a.xs + size_t(r) * g.nG * 2;
    }
  };
  // Stage lks of the load cursor's unit into ring slot `slot`: weights and/or activations.
  auto load_stage = [&](int slot, bool wts, bool acts) {
    uint8_t* st = sm + size_t(slot) * C::kStage;
    const int ng = min(kGS, g.nG - kGS * lks);
    if (wts) {
#pragma unroll
      for (int j = 0; j < kCodeChunks; ++j) {
        const bool ok = crow[j] && cgrp < ng;
        const void* src = ok ? static_cast<const void*>(crow[j] + size_t(lks) * C::kRowB + cq * 16) : a.w.codes;
        cp16(smem_u32(st + (crr + j * kRowStep) * C::kRowB + cpos * 16), src, ok);
      }
      if (tid < 2 * kBN) {
        const int g0 = 2 * (tid & 1);
        const uint32_t dst = smem_u32(st + C::kCodes + tid * 8);
        const uint32_t* src = sbrow ? sbrow + kGS * lks + g0 : reinterpret_cast<const uint32_t*>(a.w.sb);
        const int n = sbrow ? min(max(ng - g0, 0), 2) : 0;
        if (sb_pairs) {
          cp8(dst, src, 4 * n);
        } else {
          cp4(dst, src, n >= 1);
          cp4(dst + 4, n >= 2 ? src + 1 : src, n >= 2);
        }
      }
    }
    if (acts) {
      uint8_t* xs = st + C::kCodes + C::kSb;
#pragma unroll
      for (int j = 0; j < kXChunks; ++j) {
        const int c = tid + j * kThreads, m = c >> 5, q = c & 31;
        if (m < BM) {
          const bool ok = xrow[j] && (q >> 3) < ng;
          const uint32_t dst = smem_u32(xs + m * 512 + ((q ^ (m & 1)) << 4));
          cp16(dst, ok ? static_cast<const void*>(xrow[j] + lks * kBK + q * 8) : a.x, ok);
          cp16(dst + C::kXP, ok ? static_cast<const void*>(a.xlo + (xrow[j] - a.x) + lks * kBK + q * 8) : a.x, ok);
        }
      }
      if (tid < kGS * BM) {
        const bool ok = xsrow && (tid & 3) < ng;
        cp8(smem_u32(xs + C::kX + tid * 8), ok ? static_cast<const void*>(xsrow + 2 * (kGS * lks + (tid & 3))) : a.xs, ok ? 8 : 0);
      }
    }
  };
  auto advance_load = [&]() {
    if (++lks >= lt.ks1) {
      lu += gridDim.x;
      if (lu < n_units) load_unit();
    }
  };

  // Prologue: stages 0..NS-2. Dense: the weights before waiting on the previous kernel (they never
  // depend on it), then the activations; items: the routing table was needed first anyway.
  load_unit();
  if (MODE == kDense) {
    const int u0 = lu, ks0 = lks;
    const Unit t0 = lt;
    for (int s = 0; s < NS - 1; ++s) {
      if (lu < n_units) load_stage(s, true, false);
      if (lu < n_units) advance_load();
    }
    cp_commit();
    pdl_wait();
    pdl_trigger();
    lu = u0, lks = ks0, lt = t0;
    load_unit();
    for (int s = 0; s < NS - 1; ++s) {
      if (lu < n_units) load_stage(s, false, true);
      cp_commit();
      if (lu < n_units) advance_load();
    }
  } else {
    for (int s = 0; s < NS - 1; ++s) {
      if (lu < n_units) load_stage(s, true, true);
      cp_commit();
      if (lu < n_units) advance_load();
    }
  }

  // ---- the MMA cursor ----
  int cu = blockIdx.x, cks;
  Unit ct = unit_of<BM>(g, cu, its, pu, n_items);
  cks = ct.ks0;
  constexpr int MT = C::MT, NW = C::NW, WT = C::WT;
  const int wr = warp / WT, wt = warp % WT;  // this warp's place in the warp grid
  float acc[MT][NW][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][n][i] = 0.f;
  // m-tile mt: tile rows 16·(wr·MT + mt) + gq (rb) and +8; n-tile n: activation rows 8·(wt·NW + n) + ...
  auto row_of = [&](int mt) { return 16 * (wr * MT + mt) + gq; };

  for (int it = 0; cu < n_units; ++it) {
    cp_wait<NS - 2>();
    __syncthreads();
    if (lu < n_units) load_stage((it + NS - 1) % NS, true, true);
    cp_commit();
    if (lu < n_units) advance_load();

    const uint8_t* st = sm + size_t(it % NS) * C::kStage;
    const uint32_t* ssb = reinterpret_cast<const uint32_t*>(st + C::kCodes);
    const uint8_t* sx = st + C::kCodes + C::kSb;
    const float2* sxs = reinterpret_cast<const float2*>(sx + C::kX);
    const int ng = min(kGS, g.nG - kGS * cks);
    constexpr int kUnrollG = NT >= 8 ? 1 : kGS / GI;  // NT = 8: one group at a time keeps the registers
#pragma unroll kUnrollG
    for (int G0 = 0; G0 < kGS; G0 += GI) {
      if (G0 >= ng) break;
      float part[GI][MT][NW][4];
      uint32_t wc0[GI][MT][BITS / 2], wc1[GI][MT][BITS / 2];  // codes of rows rb, rb+8: 4-bit 2 words, 8-bit 4
#pragma unroll
      for (int gi = 0; gi < GI; ++gi) {
        const int G = G0 + gi;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int r0 = row_of(mt), r1 = r0 + 8;
          if constexpr (BITS == 4) {
            const uint2 c0 = *reinterpret_cast<const uint2*>(st + r0 * C::kRowB + ((G ^ (r0 & 3)) << 5) + (tq << 3));
            const uint2 c1 = *reinterpret_cast<const uint2*>(st + r1 * C::kRowB + ((G ^ (r1 & 3)) << 5) + (tq << 3));
            wc0[gi][mt][0] = c0.x, wc0[gi][mt][1] = c0.y, wc1[gi][mt][0] = c1.x, wc1[gi][mt][1] = c1.y;
          } else {
            const uint4 c0 = *reinterpret_cast<const uint4*>(st + r0 * C::kRowB + ((G ^ (r0 & 3)) << 6) + (tq << 4));
            const uint4 c1 = *reinterpret_cast<const uint4*>(st + r1 * C::kRowB + ((G ^ (r1 & 3)) << 6) + (tq << 4));
            wc0[gi][mt][0] = c0.x, wc0[gi][mt][1] = c0.y, wc0[gi][mt][2] = c0.z, wc0[gi][mt][3] = c0.w;
            wc1[gi][mt][0] = c1.x, wc1[gi][mt][1] = c1.y, wc1[gi][mt][2] = c1.z, wc1[gi][mt][3] = c1.w;
          }
#pragma unroll
          for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[gi][mt][n][i] = 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // 16-byte x chunk j of the lane's 32 bytes per group: k-steps 2j, 2j+1
        uint4 xv[GI][NW][kTerms];
#pragma unroll
        for (int gi = 0; gi < GI; ++gi)
#pragma unroll
          for (int n = 0; n < NW; ++n) {
            const int m = 8 * (wt * NW + n) + gq;
            const uint8_t* px = sx + m * 512 + ((((G0 + gi) * 8 + 2 * tq + j) ^ (m & 1)) << 4);
#pragma unroll
            for (int h = 0; h < kTerms; ++h) xv[gi][n][h] = *reinterpret_cast<const uint4*>(px + h * C::kXP);
          }
#pragma unroll
        for (int p = 0; p < 2; ++p) {
#pragma unroll
          for (int gi = 0; gi < GI; ++gi)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              uint32_t a0, a1, a2, a3;
              if constexpr (BITS == 4) {
                cvt4(wc0[gi][mt][j], p, a0, a2);
                cvt4(wc1[gi][mt][j], p, a1, a3);
              } else {
                cvt8(wc0[gi][mt][2 * j + p], a0, a2);
                cvt8(wc1[gi][mt][2 * j + p], a1, a3);
              }
#pragma unroll
              for (int n = 0; n < NW; ++n)
#pragma unroll
                for (int h = 0; h < kTerms; ++h) {  // hi, then lo: both into the group's partial sums
                  const uint4 v = xv[gi][n][h];  // (x0,x4) (x1,x5) (x2,x6) (x3,x7)
                  uint32_t b0, b1;
                  if constexpr (BITS == 4) {
                    b0 = p ? v.z : v.x, b1 = p ? v.w : v.y;
                  } else {  // (x0,x2),(x1,x3) | (x4,x6),(x5,x7)
                    b0 = __byte_perm(v.x, v.z, p ? 0x7632 : 0x5410), b1 = __byte_perm(v.y, v.w, p ? 0x7632 : 0x5410);
                  }
                  mma(part[gi][mt][n], a0, a1, a2, a3, b0, b1);
                }
            }
        }
      }
      // y += (scale·2^-e)·part + bias·Σx, rows rb / rb+8, activation rows 8n + 2t, +1; groups in order.
#pragma unroll
      for (int gi = 0; gi < GI; ++gi) {
        const int G = G0 + gi;
        if (G < ng) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int r0 = row_of(mt);
            const uint32_t q0 = ssb[r0 * kGS + G], q1 = ssb[(r0 + 8) * kGS + G];
            const float s0 = __uint_as_float(q0 << 16), b0 = __uint_as_float(q0 & 0xFFFF0000u);
            const float s1 = __uint_as_float(q1 << 16), b1 = __uint_as_float(q1 & 0xFFFF0000u);
#pragma unroll
            for (int n = 0; n < NW; ++n) {
              const int m = 8 * (wt * NW + n) + 2 * tq;
              const float2 xa = sxs[m * kGS + G], xb = sxs[(m + 1) * kGS + G];
              float* c = acc[mt][n];
              const float* q = part[gi][mt][n];
              c[0] = fmaf(s0 * xa.y, q[0], fmaf(b0, xa.x, c[0]));
              c[1] = fmaf(s0 * xb.y, q[1], fmaf(b0, xb.x, c[1]));
              c[2] = fmaf(s1 * xa.y, q[2], fmaf(b1, xa.x, c[2]));
              c[3] = fmaf(s1 * xb.y, q[3], fmaf(b1, xb.x, c[3]));
            }
          }
        }
      }
    }
    if (++cks < ct.ks1) continue;

    // ---- the unit's epilogue (block-uniform) ----
    // Lane values: acc[mt][n][u] = tile row rb(mt), activation row 8·(wt·NW + n) + 2t + u; acc[..][2 + u]
    // the same for tile row rb + 8.
    if constexpr (MODE == kSwiglu) {
      // Row group q = wr·MT + mt (tile rows 16q..16q+15): outputs tile·64 + 8q + gq, gate in acc[..][0..1],
      // up in acc[..][2..3]. act is packed per activation row over the unit's 64 outputs (one group of
      // the down input), each at its place in the packers' order within 8 values (chunk q, index gq →
      // 2·(gq & 3) + gq / 4); the row's max and sum: over gq by shuffles, then over q = 0..7 in order.
      float act[MT][NW][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const float v = silu(acc[mt][n][u]) * acc[mt][n][2 + u];
            act[mt][n][u] = v;
            float mx = fabsf(v), sum = v;
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {
              mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
              sum += __shfl_xor_sync(0xffffffffu, sum, off);
            }
            if (gq == 0) red[(wr * MT + mt) * BM + 8 * (wt * NW + n) + 2 * tq + u] = make_float2(mx, sum);
          }
      __syncthreads();
      if (tid < BM && tid < ct.m_cnt) {
        const float2 r = swiglu_row_scale(red, kWarps, BM, tid, &rsc[tid]);
        reinterpret_cast<float2*>(a.yxs)[size_t(__ldg(a.yrow + ct.e0 + tid)) * (a.n_out / 64) + ct.tile] = r;
      }
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int q = wr * MT + mt;
        const int o = ct.tile * 64 + 8 * q + gq, opos = ct.tile * 64 + 8 * q + 2 * (gq & 3) + (gq >> 2);
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int m = 8 * (wt * NW + n) + 2 * tq + u;
            if (m < ct.m_cnt && o < a.n_out) {
              const int yr = __ldg(a.yrow + ct.e0 + m);
              put_act(a.yx, a.yxlo, size_t(yr) * a.n_out + opos, act[mt][n][u] * rsc[m]);
            }
          }
      }
    } else if constexpr (MODE == kItems) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int n0 = ct.tile * kBN + row_of(mt);
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int m = 8 * (wt * NW + n) + 2 * tq + u;
            if (m < ct.m_cnt) {
              float* y = a.y + size_t(__ldg(a.yrow + ct.e0 + m)) * a.ldy;
              if (n0 < a.n_out) y[n0] = acc[mt][n][u];
              if (n0 + 8 < a.n_out) y[n0 + 8] = acc[mt][n][2 + u];
            }
          }
      }
    } else {
      bool last = true;
      if (g.S > 1) {  // partials to ws; the last split to arrive sums all of them in split order
        float* wsp = a.ws + (size_t(ct.split) * a.M) * g.N;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int n0 = ct.tile * kBN + row_of(mt);
#pragma unroll
          for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const int mm = 8 * (wt * NW + n) + 2 * tq + u, m = ct.e0 + mm;
              if (mm < ct.m_cnt) {
                if (n0 < g.N) __stcg(wsp + size_t(m) * g.N + n0, acc[mt][n][u]);
                if (n0 + 8 < g.N) __stcg(wsp + size_t(m) * g.N + n0 + 8, acc[mt][n][2 + u]);
              }
            }
        }
        __threadfence();
        __syncthreads();
        int* flag = reinterpret_cast<int*>(rsc);
        if (tid == 0) {
          int* c = a.cnt + ct.tile * g.C + ct.chunk;
          const int old = atomicAdd(c, 1);
          flag[0] = old == g.S - 1;
          if (old == g.S - 1) atomicExch(c, 0);
        }
        __syncthreads();
        last = flag[0] != 0;
        __syncthreads();  // flag read before the next epilogue may reuse rsc
        if (last) {
          __threadfence();
          // Split by split, each split's loads issued together (one L2 round trip a split, not one a value:
          // ~44 us a call at 64 rows on an H100 before); the sums in split order as before.
          float sum[MT][NW][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NW; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) sum[mt][n][i] = 0.f;
          for (int sp = 0; sp < g.S; ++sp) {
            const float* p = a.ws + size_t(sp) * a.M * g.N;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const int n0 = ct.tile * kBN + row_of(mt);
#pragma unroll
              for (int n = 0; n < NW; ++n)
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                  const int mm = 8 * (wt * NW + n) + 2 * tq + u;
                  const bool ok = mm < ct.m_cnt;
                  const float* q = p + size_t(ct.e0 + mm) * g.N;
                  sum[mt][n][u] += sp == ct.split ? acc[mt][n][u] : (ok && n0 < g.N ? __ldcg(q + n0) : 0.f);
                  sum[mt][n][2 + u] += sp == ct.split ? acc[mt][n][2 + u] : (ok && n0 + 8 < g.N ? __ldcg(q + n0 + 8) : 0.f);
                }
            }
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NW; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][n][i] = sum[mt][n][i];  // rows past m_cnt are never stored
        }
      }
      if (last) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int n0 = ct.tile * kBN + row_of(mt);
#pragma unroll
          for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const int m = 8 * (wt * NW + n) + 2 * tq + u;
              if (m < ct.m_cnt) {
                float* y = a.y + size_t(ct.e0 + m) * a.ldy;
                if (n0 < g.N) y[n0] = acc[mt][n][u];
                if (n0 + 8 < g.N) y[n0 + 8] = acc[mt][n][2 + u];
              }
            }
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][n][i] = 0.f;
    cu += gridDim.x;
    if (cu < n_units) {
      ct = unit_of<BM>(g, cu, its, pu, n_items);
      cks = ct.ks0;
    }
  }
  cp_wait<0>();
}

int tiles_of(int rows) { return (rows + kBN - 1) / kBN; }

template <int BITS, int NT, int MODE> Status launch(const Args& g, int grid, cudaStream_t s) {
  using C = Cfg<BITS, NT>;
  grid *= C::BPS;  // persistent: one block per SM slot (dense: no more than its units)
  if (MODE == kDense) grid = std::min(grid, g.n_units);
  auto k = qgemm_kernel<BITS, NT, MODE>;
  const size_t smem = C::smem(g.a.max_items);
  static size_t attr = 0;
  if (smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  return launch_k("qgemm", k, dim3(grid), dim3(kThreads), smem, s, g);
}

template <int BITS, int MODE> Status launch_nt(int nt, const Args& g, int grid, cudaStream_t s) {
  switch (nt) {
    case 1: return launch<BITS, 1, MODE>(g, grid, s);
    case 2: return launch<BITS, 2, MODE>(g, grid, s);
    case 4: return launch<BITS, 4, MODE>(g, grid, s);
    default: return launch<BITS, 8, MODE>(g, grid, s);
  }
}

// The smallest tile height (8 / 16 / 32 / 64 rows) with room for `rows` rows.
int nt_for(double rows) {
  int nt = 1;
  while (nt < 8 && 8.0 * nt < rows) nt *= 2;
  return nt;
}

}  // namespace

// From 64 rows for the model's projections (2^23 weights or more, or 4,096 rows or more), 128 for smaller
// matrices (none measured faster on wgmma below 128 rows). H200, 2026-12-07 (CudaQgemm.Bench, two passes, µs
// mma.sync → wgmma) at 32 / 64 rows: in_proj 12352×2048 30.9 → 30.4 / 56.6 → 31.5; out_proj 2048×4096 (split
// 8 ways) 20.8 → 21.7 / 45.0 → 24.6; qkv 9216×2048 29.6 → 26.2 / 57.0 → 27.7; lm_head 308.0 → 360.9 / 553.0 →
// 372.1. (On 2026-12-04, before the wgmma tile's later work, out_proj at 64 rows was 30.8 → 43.3, so it had
// stayed on mma.sync below 128.)
int qgemm_wg_rows(int rows, int cols) { return rows >= 4096 || size_t(rows) * size_t(cols) >= (size_t(1) << 23) ? 64 : 128; }

// Splits so that the tiles × splits fill about two units per SM, at most 8 and one 256-k stage each. Only
// the router (257 × 2048, 3 tiles) is bound by the stages: 8 splits, 24 units (it had 12 with at least two
// stages a split: 22 µs a call at 16 rows on an H100, latency-bound on 12 SMs). A function of the shape only
// (a row's sums must not depend on the batch). H100, 2026-12-06 (CudaQgemm.Bench, two passes): in_proj and qkv
// unsplit (one unit an SM) instead of split 2 ways: in_proj 20.7 → 15.4 / 30.9 → 21.5 / 56.9 → 38.5 µs at 16 /
// 32 / 64 rows, qkv alike; 4 units an SM: 31.9 µs at 16. But the step (bench-batch, same call) went +1.3% at
// 16 rows and −3.9% at 64 (the bench's back-to-back calls fill the idle SMs with the next call's blocks; the
// step's next kernel waits for this one): kept at 2.
int qgemm_splits(int rows, int cols) {
  const int T = tiles_of(rows), nks = (cols + kBK - 1) / kBK;
  int S = (2 * sm_count()) / std::max(T, 1);
  S = std::min({S, 8, nks});
  return std::max(S, 1);
}
size_t qgemm_ws_floats(int rows, int cols, int M) {
  const int S = qgemm_splits(rows, cols);
  return S > 1 ? size_t(S) * size_t(M) * size_t(rows) : 0;
}
size_t qgemm_counters(int rows, int cols, int M) {
  (void)cols;
  return size_t(tiles_of(rows)) * size_t((M + 7) / 8);
}

// Rows per item: the step's routed entries over min(entries, E) experts; a tile with room for 1.25× the
// mean, so most items fit one chunk while few rows waste few MMAs. H200, 2026-12-04 (CudaQgemm.Bench, two
// passes, 256 experts, 736 rows = 23 per expert): 64-row tiles (room for 2× the mean, the rule before)
// gate+up 729.6 µs, down 420.6; 32-row 444.4 / 284.3; 16-row 557.5 / 378.7. At 256 rows (8 per expert)
// the 16-row tile: 292.4 / 189.7, the 32-row 390.6 / 248.9.
int qgemm_items_nt(const QGemmArgs& a) {
  if (a.nt) return a.nt;
  const double ent = double(std::max(a.ent_hint, 1));
  return nt_for(1.25 * ent / std::min(ent, double(a.E)));
}

Status qgemm(const QGemmArgs& a, Stream stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool items = a.items != nullptr;
  const QW& w = a.w;
  if (!w.codes || !w.sb || (w.bits != 4 && w.bits != 8) || w.cols <= 0 || w.cols % 64 != 0)
    return cu_err("qgemm: weights must be 4- or 8-bit with a multiple of 64 columns (bits {} cols {})", w.bits, w.cols);
  if (!a.x || !a.xs || !a.xlo || a.ldx < w.cols || a.ldx % 8 != 0)
    return cu_err("qgemm: activation rows need x, xs, xlo (two passes), ldx >= K and ldx % 8 == 0");
  if (a.nt != 0 && a.nt != 1 && a.nt != 2 && a.nt != 4 && a.nt != 8) return cu_err("qgemm: nt {} not in 1, 2, 4, 8", a.nt);
  Args g{};
  g.a = a;
  g.K = w.cols, g.nG = w.cols / 64, g.nks = (w.cols + kBK - 1) / kBK;
  int nt = a.nt;
  if (!items) {
    if (a.M < 1 || !a.y || a.ldy < w.rows) return cu_err("qgemm: dense needs M >= 1 and y with ldy >= rows");
    if (a.swiglu) return cu_err("qgemm: swiglu needs the items mode");
    g.mode = kDense, g.N = w.rows, g.T = tiles_of(w.rows), g.S = qgemm_splits(w.rows, w.cols);
    if (!nt) nt = a.M >= 64 ? 8 : nt_for(a.M);
    g.C = (a.M + 8 * nt - 1) / (8 * nt);
    if (g.S > 1 && (!a.ws || !a.cnt)) return cu_err("qgemm: a {}-row matrix is split {} ways and needs ws / cnt", w.rows, g.S);
    if (a.kernel == 2 || (a.kernel == 0 && a.nt == 0 && w.bits == 4 && a.M >= qgemm_wg_rows(w.rows, w.cols))) {
      WgArgs wa{};
      wa.a = a, wa.N = w.rows, wa.K = w.cols, wa.S = g.S, wa.C = qgemm_wg_chunks(a.M), wa.T = tiles_of(w.rows);
      return qgemm_wg(wa, s);
    }
    g.n_units = g.T * g.S * g.C;
    return w.bits == 4 ? launch_nt<4, kDense>(nt, g, sm_count(), s) : launch_nt<8, kDense>(nt, g, sm_count(), s);
  }
  // No shared expert (sh empty): the routing table has no shared item (broute's shared_item false).
  const bool sh = a.sh.codes != nullptr;
  if (w.bits != 4 || (sh && (a.sh.cols != w.cols || a.sh.bits != 4))) return cu_err("qgemm: experts must be 4-bit, a shared expert of the same K");
  if (a.n_out <= 0 || a.max_items < 1 || a.max_items > kMaxItems || !a.xrow || !a.yrow || a.E < 1)
    return cu_err("qgemm: items mode needs n_out, max_items (1..{}), xrow, yrow and E", kMaxItems);
  if (w.rows < a.E * a.n_out) return cu_err("qgemm: expert matrix has {} rows, fewer than E·n_out", w.rows);
  if (a.swiglu) {
    if (!a.w2.codes || a.w2.cols != w.cols || a.w2.rows != w.rows || (sh && a.sh.rows < 2 * a.n_out))
      return cu_err("qgemm: swiglu needs up weights like gate and a shared [gate|up]");
    if (a.n_out % 64 != 0 || !a.yx || !a.yxs) return cu_err("qgemm: swiglu writes packed rows: n_out % 64 == 0, yx and yxs");
    if (!a.yxlo) return cu_err("qgemm: swiglu writes the remainders too (yxlo)");
    g.mode = kSwiglu, g.T = (a.n_out + 63) / 64;
  } else {
    if (!a.y || a.ldy < a.n_out || (sh && a.sh.rows < a.n_out)) return cu_err("qgemm: items output y needs ldy >= n_out");
    g.mode = kItems, g.T = tiles_of(a.n_out);
  }
  g.S = 1, g.C = 0, g.N = a.n_out;
  nt = qgemm_items_nt(a);
  return g.mode == kSwiglu ? launch_nt<4, kSwiglu>(nt, g, sm_count(), s) : launch_nt<4, kItems>(nt, g, sm_count(), s);
}

}  // namespace lily::cuda
