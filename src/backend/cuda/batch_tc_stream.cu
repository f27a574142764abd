// Persistent expert kernel of the batched MoE (issue 7, items mode of btc_gemm): one block per SM walks
// a list of work units (item's 8-row chunk × 256 weight rows), every unit's weights streamed through a
// ring of NS shared-memory stages by cp.async (256 rows × 4 groups of 64 k each, plus the chunk's packed
// activation fragments), so NS−1 stages of loads stay in flight while the warps run the MMAs of the
// current one. Same operands, fold and k-range sums as batch_tc.cu's block kernel (4-bit codes → exact
// fp16, activations fp16 hi + lo of x·2^e, acc += s·(part·2^-e) + b·Σx per group, the block kernel's k
// split emulated by partial sums per range in range order): bit-identical to it, so either kernel may
// run for any batch size, and a row's result depends only on its row and the weights.
#include <cuda_fp16.h>

#include "backend/cuda/batch_ops.h"
#include "backend/cuda/batch_pack.cuh"
#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256, kRows = 256, kSlots = 8;
// Stage layout (bytes), KC groups of 64 k per stage. codes: row r's KC groups × 32 B as 2·KC chunks of
// 16 B, chunk c stored at swz(c, r) (a half-warp's 4 rows × 32 B hit 32 distinct banks); sb: word r·KC + G;
// act: slot j, group G, fragment i (= k-step·4 + quad) at i ^ ((j & 1)·4); xs: float2 [G][slot].
template <int KC> struct Lay {
  static constexpr int RB = KC * 32, codes = kRows * RB, sb = kRows * KC * 4, act = kSlots * KC * 256, xs = kSlots * KC * 8;
  static constexpr int stage = codes + sb + act + xs;
  static __device__ __forceinline__ int swz(int c, int r) { return KC == 4 ? c ^ ((2 * r) & 7) : c ^ (((r >> 1) & 1) << 1); }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int n) {  // n = 16 or 0 (zero fill)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp8(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t lop_or(uint32_t a, uint32_t m, uint32_t c) {  // (a & m) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(m), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ __half2 h2c(uint16_t b) { return __halves2half2(__ushort_as_half(b), __ushort_as_half(b)); }
// 4-bit word → two fp16 pairs (exact integers), batch_tc.cu's cvt4: p = 0: (n0, n4), (n1, n5); p = 1: (n2, n6), (n3, n7).
__device__ __forceinline__ void cvt4(uint32_t w, int p, uint32_t& lo, uint32_t& hi) {
  const uint32_t v = p ? w >> 8 : w;
  const uint32_t a = lop_or(v, 0x000F000Fu, 0x64006400u), b = lop_or(v, 0x00F000F0u, 0x64006400u);
  lo = h2u(__hsub2(u2h(a), h2c(0x6400)));
  hi = h2u(__hfma2(u2h(b), h2c(0x2C00), h2c(0xD400)));
}

// One unit: item (expert or shared), chunk j of its rows (entries off + 8j ..), m-block mb.
struct Unit {
  int expert, cnt, off, mb;
};
// Unit u → (item, chunk, m-block): units are chunk-major (u = chunk·MB + mb); the chunk's item is the
// last with items[i].w ≤ chunk (items[i].w: chunks before item i).
// Dense (nch > 0: one implicit item of all rows): m-block-major (u = mb·nch + chunk), so the chunks of
// one weight tile run together and share its DRAM read through the L2.
__device__ __forceinline__ Unit unit_of(const int4* it, int n_items, int u, int MB, int nch) {
  if (nch > 0) {
    const int mb = u / nch, j = u - mb * nch, c = it[0].y - 8 * j;
    return Unit{it[0].x, c < 8 ? c : 8, 8 * j, mb};
  }
  const int ch = u / MB;
  int lo = 0, hi = n_items - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (it[mid].w <= ch) lo = mid;
    else hi = mid - 1;
  }
  const int4 x = it[lo];
  const int j = ch - x.w, c = x.y - 8 * j;
  return Unit{x.x, c < 8 ? c : 8, x.z + 8 * j, u - ch * MB};
}

// SW: gate+up+SwiGLU (unit = 128 outputs: gate rows 0..127, up rows 128..255 of the stage; warp w owns
// outputs 16w..16w+15 as m-tiles (gate, up)); else down (unit = 256 outputs; warp w rows 32w..32w+31).
// KC = 2: 16 warps per SM (two blocks); KC = 4: one block of 8 warps with 44 KB stages.
template <bool SW, int NS, int KC>
__global__ void __launch_bounds__(kThreads, KC == 2 ? 2 : 1) bstream_kernel(BtcArgs a) {
  using L = Lay<KC>;
  constexpr int kKC = KC, kCodesB = L::codes, kSbB = L::sb, kActB = L::act, kStageB = L::stage;
  extern __shared__ __align__(16) uint8_t sm[];
  int4* its = reinterpret_cast<int4*>(sm + size_t(NS) * kStageB);
  int32_t* xrs = reinterpret_cast<int32_t*>(its + a.max_items);  // [max_ent] row of each entry
  int32_t* yrs = xrs + a.max_ent;                                // [max_ent] output row of each entry
  float* ep = reinterpret_cast<float*>(yrs + ((a.max_ent + 3) & ~3));  // SW + Pout: [8 slots][128] outputs
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int K = a.w.cols, nG = K / 64, wpr = K / 8, NK = (nG + kKC - 1) / kKC, n_out = a.n_out;
  constexpr int OUTS = SW ? kRows / 2 : kRows;  // outputs per unit
  const int MB = (n_out + OUTS - 1) / OUTS;
  // Dense (items null): one item {E, B rows, entries 0..B-1} (the host passes the weight as sh), rows
  // in order; nothing read from the previous kernel before the first stage's activations.
  const bool dense = a.items == nullptr;
  const int nch = dense ? (a.B + 7) / 8 : 0;
  if (!dense) {
    pdl_wait();
    pdl_trigger();
  }
  const int n_items = dense ? 1 : a.n_items[0], n_units = (dense ? nch : a.n_items[1]) * MB;
  if (int(blockIdx.x) >= n_units) return;
  if (dense) {
    if (tid == 0) its[0] = make_int4(a.E, a.B, 0, 0);
    for (int i = tid; i < a.B; i += kThreads) xrs[i] = i, yrs[i] = i;
  } else {
    for (int i = tid; i < n_items; i += kThreads) its[i] = reinterpret_cast<const int4*>(a.items)[i];
    const int4 last = reinterpret_cast<const int4*>(a.items)[n_items - 1];
    const int nent = min(last.z + last.y, a.max_ent);
    for (int i = tid; i < nent; i += kThreads) xrs[i] = __ldg(a.xrow + i), yrs[i] = __ldg(a.yrow + i);
  }
  __syncthreads();
  const int my_units = (n_units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int T = my_units * NK;
  const uint4* P4 = reinterpret_cast<const uint4*>(a.P);
  const float2* XS2 = reinterpret_cast<const float2*>(a.XS);
  const uint32_t sbase = smem_u32(sm);

  // Producer state: the unit of the last issued stage and its rows' code / scale pointers (this thread's
  // rows: codes chunk tid % CPR of rows tid / CPR + RPI·n; sb word tid % KC of rows tid / KC + (256/KC)·n).
  constexpr int CPR = 2 * KC, RPI = kRows / CPR, SPI = kRows / KC;
  int p_ui = -1, p_cnt = 0, p_off = 0;
  const uint32_t* pc[CPR];
  const uint32_t* ps[KC];
  // Weight row of stage row r (clamped to the last output: rows past n_out are read, never stored).
  auto wrow = [&](const Unit& U, int r, const uint32_t*& codes, const uint32_t*& sb) {
    const bool sh = U.expert >= a.E;
    int o, base;
    const uint32_t* qc;
    const uint16_t* qs;
    if constexpr (SW) {
      const bool up = r >= kRows / 2;
      o = U.mb * OUTS + (up ? r - kRows / 2 : r);
      qc = sh ? a.sh.codes : up ? a.w2.codes : a.w.codes;
      qs = sh ? a.sh.sb : up ? a.w2.sb : a.w.sb;
      base = sh ? (up ? n_out : 0) : U.expert * n_out;
    } else {
      o = U.mb * OUTS + r;
      qc = sh ? a.sh.codes : a.w.codes;
      qs = sh ? a.sh.sb : a.w.sb;
      base = sh ? 0 : U.expert * n_out;
    }
    o = o < n_out ? o : n_out - 1;
    codes = qc + size_t(base + o) * wpr;
    sb = reinterpret_cast<const uint32_t*>(qs) + size_t(base + o) * nG;
  };
  // Issues stage i's copies (every thread its share) into ring slot i % NS: weights (W) and / or the
  // activation rows (X).
  auto issue = [&](int i, bool W, bool X) {
    const int ui = i / NK, kc = i - ui * NK, G0 = kc * kKC, ng = min(kKC, nG - G0);
    if (ui != p_ui) {  // block-uniform
      p_ui = ui;
      const Unit U = unit_of(its, n_items, int(blockIdx.x) + ui * int(gridDim.x), MB, nch);
      p_cnt = U.cnt, p_off = U.off;
      const uint32_t* dummy;
#pragma unroll
      for (int n = 0; n < CPR; ++n) wrow(U, tid / CPR + RPI * n, pc[n], dummy);
#pragma unroll
      for (int n = 0; n < KC; ++n) wrow(U, tid / KC + SPI * n, dummy, ps[n]);
    }
    const uint32_t st = sbase + uint32_t((i % NS) * kStageB);
    if (W) {  // codes: 256 rows × 2·KC chunks of 16 B
      const int c = tid % CPR;
#pragma unroll
      for (int n = 0; n < CPR; ++n) {
        const int r = tid / CPR + RPI * n;
        if (c < 2 * ng) cp16(st + uint32_t(r * L::RB + L::swz(c, r) * 16), pc[n] + G0 * 8 + c * 4, 16);
      }
      const int G = tid % KC;  // sb: 256 rows × KC words
#pragma unroll
      for (int n = 0; n < KC; ++n) {
        const int r = tid / KC + SPI * n;
        if (G < ng) cp4(st + uint32_t(kCodesB + (r * kKC + G) * 4), ps[n] + G0 + G);
      }
    }
    if (X) {  // act: 8 slots × KC groups × 16 fragments of 16 B (zero for slots past the chunk's rows)
#pragma unroll
      for (int n = 0; n < KC / 2; ++n) {
        const int q = tid + kThreads * n, j = q / (16 * KC), G = (q >> 4) % KC, f = q & 15;
        if (G >= ng) continue;
        const bool ok = j < p_cnt;
        const int xr = ok ? xrs[p_off + j] : 0;
        cp16(st + uint32_t(kCodesB + kSbB + ((j * kKC + G) * 16 + (f ^ ((j & 1) << 2))) * 16),
             P4 + (size_t(xr) * nG + G0 + G) * 16 + f, ok ? 16 : 0);
      }
      if (tid < kSlots * kKC) {  // xs: {Σx, 2^-e} per slot and group, [G][slot]
        const int j = tid & 7, G = tid >> 3;
        if (G < ng) {
          const bool ok = j < p_cnt;
          const int xr = ok ? xrs[p_off + j] : 0;
          cp8(st + uint32_t(kCodesB + kSbB + kActB + (G * kSlots + j) * 8), XS2 + size_t(xr) * nG + G0 + G, ok ? 8 : 0);
        }
      }
    }
  };

  // This warp's stage rows per m-tile.
  const int trow0 = SW ? 16 * warp : 32 * warp, trow1 = SW ? kRows / 2 + 16 * warp : 32 * warp + 16;
  // The block kernel (batch_tc.cu) splits k into KS ranges [k·nG/KS, (k+1)·nG/KS) summed in range order;
  // the same partial sums here (pacc per range, acc the running total) make the two kernels bit-identical.
  const int KSp = a.ks > 0 ? a.ks : 1;
  auto bnd = [&](int k) { return ((k + 1) * nG) / KSp; };
  int ksn = 0, nb = bnd(0);
  auto first_range = [&] {
    ksn = 0, nb = bnd(0);
    while (ksn < KSp - 1 && nb == 0) nb = bnd(++ksn);
  };
  first_range();
  float acc[2][4], pacc[2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[mt][c] = 0.f, pacc[mt][c] = 0.f;

  if (dense) {  // the first stages' weights before the PDL wait (they overlap the previous kernel)
#pragma unroll
    for (int i = 0; i < NS - 1; ++i)
      if (i < T) issue(i, true, false);
    pdl_wait();
    pdl_trigger();
  }
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (i < T) issue(i, !dense, true);
    cp_commit();
  }
  for (int i = 0; i < T; ++i) {
    cp_wait<NS - 2>();
    __syncthreads();
    if (i + NS - 1 < T) issue(i + NS - 1, true, true);
    cp_commit();
    const int ui = i / NK, kc = i - ui * NK, ng = min(kKC, nG - kc * kKC);
    const uint8_t* st = sm + size_t(i % NS) * kStageB;
    const uint8_t* cs = st;
    const uint32_t* sbs = reinterpret_cast<const uint32_t*>(st + kCodesB);
    const uint4* as = reinterpret_cast<const uint4*>(st + kCodesB + kSbB);
    const float2* xs = reinterpret_cast<const float2*>(st + kCodesB + kSbB + kActB);
#pragma unroll
    for (int G = 0; G < kKC; ++G) {
      if (G >= ng) break;
      uint2 cw[2][2];
      uint32_t sv[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = (mt ? trow1 : trow0) + g + 8 * h;
          const int c = 2 * G + (t >> 1);
          cw[mt][h] = *reinterpret_cast<const uint2*>(cs + r * L::RB + L::swz(c, r) * 16 + (t & 1) * 8);
          sv[mt][h] = sbs[r * kKC + G];
        }
      uint4 bf[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) bf[s] = as[(g * kKC + G) * 16 + ((s * 4 + t) ^ ((g & 1) << 2))];
      const float2 x0 = xs[G * kSlots + 2 * t], x1 = xs[G * kSlots + 2 * t + 1];
      // batch_tc.cu's per-group sequence: one fp32 partial, hi then lo per k-step, then the fold.
      float part[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[mt][c] = 0.f;
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t A[4];
          const uint32_t w0 = (s >> 1) ? cw[mt][0].y : cw[mt][0].x, w1 = (s >> 1) ? cw[mt][1].y : cw[mt][1].x;
          cvt4(w0, s & 1, A[0], A[2]);
          cvt4(w1, s & 1, A[1], A[3]);
          mma16816(part[mt], A, bf[s].x, bf[s].y);
          mma16816(part[mt], A, bf[s].z, bf[s].w);
        }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float sc = __uint_as_float(sv[mt][h] << 16), bi = __uint_as_float(sv[mt][h] & 0xFFFF0000u);
          pacc[mt][2 * h] += fmaf(sc, part[mt][2 * h] * x0.y, bi * x0.x);
          pacc[mt][2 * h + 1] += fmaf(sc, part[mt][2 * h + 1] * x1.y, bi * x1.x);
        }
      // End of one of the block kernel's k-split ranges: its partial joins the total in range order.
      const int Gg = kc * kKC + G;
      if (Gg + 1 == nb) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mt][c] += pacc[mt][c], pacc[mt][c] = 0.f;
        ++ksn;
        nb = bnd(ksn);
        while (ksn < KSp - 1 && nb == Gg + 1) nb = bnd(++ksn);
      }
    }
    if (kc == NK - 1) {  // the unit's last stage: store its outputs, reset
      const Unit U = unit_of(its, n_items, int(blockIdx.x) + ui * int(gridDim.x), MB, nch);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int e = 2 * t + jj;
        if (e < U.cnt) {
          float* yp = a.y + size_t(yrs[U.off + e]) * a.ldy;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (SW) {
              const int o = U.mb * OUTS + 16 * warp + g + 8 * h;
              const float v = silu(acc[0][2 * h + jj]) * acc[1][2 * h + jj];
              if (o < n_out) yp[o] = v;
              if (a.Pout) ep[e * OUTS + 16 * warp + g + 8 * h] = v;
            } else {
#pragma unroll
              for (int mt = 0; mt < 2; ++mt) {
                const int o = U.mb * OUTS + 32 * warp + 16 * mt + g + 8 * h;
                if (o < n_out) yp[o] = acc[mt][2 * h + jj];
              }
            }
          }
        }
      }
      if constexpr (SW) {
        if (a.Pout) {  // pack the unit's outputs (two 64-groups per slot): warp = slot, half-warp = group
          __syncthreads();
          const int j = warp, u = lane, Gl = u >> 4;
          if (j < U.cnt) {  // warp-uniform
            const int o0 = U.mb * OUTS + 64 * Gl;
            const bool ok = o0 < n_out;
            const float* x = ep + j * OUTS + 64 * Gl;
            const int b = pack_base(u & 15);
            const float v0 = ok ? x[b] : 0.f, v1 = ok ? x[b + 4] : 0.f, v2 = ok ? x[b + 1] : 0.f, v3 = ok ? x[b + 5] : 0.f;
            const int row = yrs[U.off + j];
            pack_unit(v0, v1, v2, v3, ok, (U.mb * 2 + Gl) * 16 + (u & 15),
                      reinterpret_cast<uint4*>(a.Pout) + size_t(row) * (n_out / 4),
                      reinterpret_cast<float2*>(a.XSout) + size_t(row) * (n_out / 64));
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][c] = 0.f;
      first_range();
    }
  }
  cp_wait<0>();
}

int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}
int sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

int kc_env() {  // groups per stage (LILY_BTC_KC: 2 = default, two blocks per SM; 4 = one block, 44 KB stages)
  static const int kc = env_int("LILY_BTC_KC", 2) == 4 ? 4 : 2;
  return kc;
}
size_t smem_of(const BtcArgs& a, int NS) {
  return size_t(NS) * size_t(kc_env() == 4 ? Lay<4>::stage : Lay<2>::stage) + size_t(a.max_items) * 16 + size_t(a.max_ent) * 4 + size_t((a.max_ent + 3) & ~3) * 4 +
         (a.swiglu && a.Pout ? size_t(kSlots) * (kRows / 2) * 4 : 0);
}
int ns_env() {  // stages in the ring (LILY_BTC_NS: 3, or 4 = default: 4 × 44 KB + the tables fit 227 KB)
  static const int ns = env_int("LILY_BTC_NS", 4) == 3 ? 3 : 4;
  return ns;
}

template <bool SW, int NS, int KC> Status go(const BtcArgs& a, cudaStream_t s) {
  auto kern = bstream_kernel<SW, NS, KC>;
  const size_t smem = smem_of(a, NS);
  static size_t attr = 0;
  if (smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  return launch_k("btc_stream", kern, dim3(sms() * (KC == 2 ? 2 : 1)), dim3(kThreads), smem, s, a);
}

}  // namespace

// Dense calls (items null) as the kernel takes them: the weight as the one "shared" item, identity rows.
static BtcArgs dense_args(const BtcArgs& a) {
  BtcArgs d = a;
  d.sh = a.w, d.n_out = d.n_out_sh = a.w.rows, d.E = 0, d.max_items = 1, d.max_ent = a.B, d.swiglu = false;
  d.Pout = nullptr, d.XSout = nullptr;
  return d;
}

bool btc_stream_ok(const BtcArgs& a0) {
  if (!a0.items && (a0.B < 1 || a0.w.bits != 4 || a0.w.cols % 64 != 0)) return false;
  const BtcArgs a = a0.items ? a0 : dense_args(a0);
  return a.w.bits == 4 && a.n_out == a.n_out_sh && a.w.cols % 64 == 0 && a.n_out > 0 && a.max_items >= 1 &&
         a.max_ent >= 1 && (!a.Pout || (a.XSout && a.n_out % 64 == 0)) && smem_of(a, ns_env()) <= 227 * 1024;
}

Status btc_stream(const BtcArgs& a0, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!btc_stream_ok(a0)) return cu_err("btc_stream: unsupported arguments");
  const BtcArgs a = a0.items ? a0 : dense_args(a0);
  const int ns = ns_env();
  if (kc_env() == 4) {
    if (a.swiglu) return ns == 3 ? go<true, 3, 4>(a, s) : go<true, 4, 4>(a, s);
    return ns == 3 ? go<false, 3, 4>(a, s) : go<false, 4, 4>(a, s);
  }
  if (a.swiglu) return ns == 3 ? go<true, 3, 2>(a, s) : go<true, 4, 2>(a, s);
  return ns == 3 ? go<false, 3, 2>(a, s) : go<false, 4, 2>(a, s);
}

}  // namespace lily::cuda
