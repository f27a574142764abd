// Skinny tensor-core GEMM of the batched decode step (issue 7, "swap AB"): the packed 4/8-bit weight
// is the MMA's A operand (16 output features × k16; codes → exact fp16 integers in registers,
// streamed from global memory without L1 allocation, each weight used by one warp), the activations
// the B operand (n8 = 8 batch rows), packed once by bpack/bnorm_pack as fp16 hi + lo of x·2^e per
// 64-group in fragment order (one 16-byte load per lane and k-step, L1 resident). mma.sync
// m16n8k16 f16 → f32; per group one fp32 partial, folded as acc += s·(part·2^-e) + b·Σx. The k range
// is split over KS warps of a block (fixed per matrix, not per B) and summed in warp order, so every
// output element's operation sequence depends only on its row and the matrix: batch invariant.
#include <cuda_fp16.h>

#include "backend/cuda/batch_ops.h"
#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kW = 8, kThreads = 256;

__device__ __forceinline__ uint32_t ld_na(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void ld_na2(const uint32_t* p, uint32_t* v) {
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
}
__device__ __forceinline__ void ld_na4(const uint32_t* p, uint32_t* v) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
}
// B fragments: hi pair b0, b1 then lo pair b0, b1 (L1-cached; volatile keeps them next to their MMAs).
__device__ __forceinline__ uint4 ld_frag(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
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

// 4-bit word → two fp16 pairs (exact integers): p = 0: (n0, n4), (n1, n5); p = 1: (n2, n6), (n3, n7).
__device__ __forceinline__ void cvt4(uint32_t w, int p, uint32_t& lo, uint32_t& hi) {
  const uint32_t v = p ? w >> 8 : w;
  const uint32_t a = lop_or(v, 0x000F000Fu, 0x64006400u), b = lop_or(v, 0x00F000F0u, 0x64006400u);
  lo = h2u(__hsub2(u2h(a), h2c(0x6400)));                // (1024 + n) − 1024
  hi = h2u(__hfma2(u2h(b), h2c(0x2C00), h2c(0xD400)));   // (1024 + 16n)/16 − 64
}
// 8-bit: (byte i of wa, byte i of wb) as an exact fp16 pair.
__device__ __forceinline__ uint32_t cvt8(uint32_t wa, uint32_t wb, int i) {
  const uint32_t sel = uint32_t(i) | (uint32_t(i) << 4) | (uint32_t(4 + i) << 8) | (uint32_t(4 + i) << 12);
  return h2u(__hsub2(u2h(lop_or(__byte_perm(wa, wb, sel), 0x00FF00FFu, 0x64006400u)), h2c(0x6400)));
}

// grid (row tiles, items or 1). Warp (rg, ks): output rows [rbase, rbase + ROWS) over groups
// [ks·nG/KS, (ks+1)·nG/KS). SW: MT = 2 tiles = gate rows and up rows of the same 16 outputs.
// Two blocks per SM (≤ 128 registers) where the accumulators allow it: more weight bytes in flight.
template <int BITS, int MT, int NT, int KS, bool SW, int D>
__global__ void __launch_bounds__(kThreads, MT * NT <= 4 ? 2 : 1) btc_kernel(BtcArgs a) {
  constexpr int RG = kW / KS, CW = BITS == 4 ? 2 : 4, ROWS = SW ? 16 : 16 * MT;
  extern __shared__ float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rg = warp / KS, ks = warp % KS;
  const int K = a.w.cols, nG = K / 64, wpr = K * BITS / 32;
  const int rbase = (int(blockIdx.x) * RG + rg) * ROWS;
  const bool items = a.items != nullptr;
  const uint32_t *wc = a.w.codes, *wc2 = a.w2.codes;
  const uint32_t *ws = reinterpret_cast<const uint32_t*>(a.w.sb), *ws2 = reinterpret_cast<const uint32_t*>(a.w2.sb);
  int n_out = items ? a.n_out : a.w.rows, cnt = a.B, off = 0, r0 = 0, r2 = 0;
  if (items) {
    pdl_wait();
    if (int(blockIdx.y) >= *a.n_items) return;
    const int4 it = reinterpret_cast<const int4*>(a.items)[blockIdx.y];
    cnt = it.y, off = it.z;
    if (it.x >= a.E) {
      n_out = a.n_out_sh;
      wc = wc2 = a.sh.codes;
      ws = ws2 = reinterpret_cast<const uint32_t*>(a.sh.sb);
      r2 = SW ? n_out : 0;
    } else {
      r0 = r2 = it.x * n_out;
    }
  }
  if (int(blockIdx.x) * RG * ROWS >= n_out) return;
  const int gb = ks * nG / KS, ge = (ks + 1) * nG / KS;
  // Weight pointers of this lane's rows (g, g + 8) per tile; rows past n_out read the last row.
  uint32_t cp[MT][2], sp[MT][2];  // word offsets from the tile's code / scale-bias base
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = rbase + (SW ? 0 : 16 * mt) + g + 8 * h;
      const int row = (SW && mt == 1 ? r2 : r0) + (rr < n_out ? rr : n_out - 1);
      cp[mt][h] = uint32_t(row) * wpr + (BITS == 4 ? 2 * t : 4 * t);
      sp[mt][h] = uint32_t(row) * nG;
    }
  uint32_t cw[D][MT][2][CW], sv[D][MT][2];
  auto load = [&](int d, int G) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* c = SW && mt == 1 ? wc2 : wc;
        const uint32_t* q = SW && mt == 1 ? ws2 : ws;
        if constexpr (BITS == 4) ld_na2(c + cp[mt][h] + 8 * G, cw[d][mt][h]);
        else ld_na4(c + cp[mt][h] + 16 * G, cw[d][mt][h]);
        sv[d][mt][h] = ld_na(q + sp[mt][h] + G);
      }
  };
  auto prologue = [&] {
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (gb + d < ge) load(d, gb + d);
  };
  prologue();  // weights only: may overlap the previous kernel (dense)
  if (!items) pdl_wait();
  pdl_trigger();
  const uint4* P4 = reinterpret_cast<const uint4*>(a.P);
  const float2* XS2 = reinterpret_cast<const float2*>(a.XS);
  for (int c0 = 0; c0 < cnt; c0 += 8 * NT) {
    if (c0 > 0) prologue();
    int xr[NT], xc[NT][2];
    bool xv[NT], xcv[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int e = c0 + nt * 8 + g;
      xv[nt] = e < cnt;
      xr[nt] = xv[nt] ? (a.xrow ? a.xrow[off + e] : e) : 0;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int e2 = c0 + nt * 8 + 2 * t + j;
        xcv[nt][j] = e2 < cnt;
        xc[nt][j] = xcv[nt][j] ? (a.xrow ? a.xrow[off + e2] : e2) : 0;
      }
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.f;
    for (int G0 = gb; G0 < ge; G0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int G = G0 + d;
        if (G < ge) {
          float part[MT][NT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int c = 0; c < 4; ++c) part[mt][nt][c] = 0.f;
          // The group's B fragments: all 4 k-steps issued together (one L1/L2 round trip per group).
          uint4 bfg[4][NT];
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              bfg[s][nt] = xv[nt] ? ld_frag(P4 + (size_t(xr[nt]) * nG + G) * 16 + s * 4 + t) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint4* bf = bfg[s];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              uint32_t A[4];
              if constexpr (BITS == 4) {
                cvt4(cw[d][mt][0][s >> 1], s & 1, A[0], A[2]);
                cvt4(cw[d][mt][1][s >> 1], s & 1, A[1], A[3]);
              } else {
                const int i = 2 * (s & 1), wi = 2 * (s >> 1);
                A[0] = cvt8(cw[d][mt][0][wi], cw[d][mt][0][wi + 1], i);
                A[2] = cvt8(cw[d][mt][0][wi], cw[d][mt][0][wi + 1], i + 1);
                A[1] = cvt8(cw[d][mt][1][wi], cw[d][mt][1][wi + 1], i);
                A[3] = cvt8(cw[d][mt][1][wi], cw[d][mt][1][wi + 1], i + 1);
              }
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                mma16816(part[mt][nt], A, bf[nt].x, bf[nt].y);  // hi
                mma16816(part[mt][nt], A, bf[nt].z, bf[nt].w);  // lo
              }
            }
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const float2 x0 = xcv[nt][0] ? __ldg(XS2 + size_t(xc[nt][0]) * nG + G) : make_float2(0.f, 0.f);
            const float2 x1 = xcv[nt][1] ? __ldg(XS2 + size_t(xc[nt][1]) * nG + G) : make_float2(0.f, 0.f);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const float sc = __uint_as_float(sv[d][mt][h] << 16), bi = __uint_as_float(sv[d][mt][h] & 0xFFFF0000u);
                acc[mt][nt][2 * h] += fmaf(sc, part[mt][nt][2 * h] * x0.y, bi * x0.x);
                acc[mt][nt][2 * h + 1] += fmaf(sc, part[mt][nt][2 * h + 1] * x1.y, bi * x1.x);
              }
          }
          if (G + D < ge) load(d, G + D);
        }
      }
    }
    if constexpr (KS > 1) {  // k split over the block's warps: summed in warp order
      constexpr int NV = MT * NT * 4;
      float* mine = red + warp * NV * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) mine[((mt * NT + nt) * 4 + c) * 32 + lane] = acc[mt][nt][c];
      __syncthreads();
      if (ks == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int i = ((mt * NT + nt) * 4 + c) * 32 + lane;
              float v = mine[i];
#pragma unroll
              for (int k2 = 1; k2 < KS; ++k2) v += red[(warp + k2) * NV * 32 + i];
              acc[mt][nt][c] = v;
            }
      }
      __syncthreads();
    }
    if (KS == 1 || ks == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int e = c0 + nt * 8 + 2 * t + j;
          if (e >= cnt) continue;
          float* yp = a.y + size_t(a.yrow ? a.yrow[off + e] : e) * a.ldy;
          if constexpr (SW) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = rbase + g + 8 * h;
              if (row < n_out) yp[row] = silu(acc[0][nt][2 * h + j]) * acc[1][nt][2 * h + j];
            }
          } else {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int row = rbase + 16 * mt + g + 8 * h;
                if (row < n_out) yp[row] = acc[mt][nt][2 * h + j];
              }
          }
        }
    }
  }
}

int g_sms = 0;
int sm_count() {
  if (!g_sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
    if (g_sms <= 0) g_sms = 132;
  }
  return g_sms;
}
int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}
// Preferred shared-memory carveout (percent of the maximum) of the GEMM: small, so the L1 keeps the
// packed activations (LILY_BTC_CARVE; -1 = leave the driver's choice).
int carve_pct() {
  static const int v = env_int("LILY_BTC_CARVE", 25);
  return v;
}

template <int BITS, int MT, int NT, int KS, bool SW>
Status go(const BtcArgs& a, dim3 grid, cudaStream_t s) {
  constexpr int D = MT * NT <= 2 ? 4 : 2;  // weight groups in flight per warp (registers)
  auto kern = btc_kernel<BITS, MT, NT, KS, SW, D>;
  const size_t smem = KS > 1 ? size_t(kW) * MT * NT * 4 * 32 * sizeof(float) : 0;
  static bool attr = false;
  if (!attr) {
    if (smem > 48 * 1024) LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    if (carve_pct() >= 0) cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, carve_pct());
    attr = true;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  cfg.attrs = at;
  cfg.numAttrs = 0;
  if (pdl_enabled() && s != nullptr) {
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 1;
  }
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, a);
  if (e != cudaSuccess) return cu_err("CUDA launch of btc_gemm failed: {}", cudaGetErrorString(e));
  return launch_status("btc_gemm");
}

// n8 tiles per pass over the weights: ⌈B/8⌉ rounded up to 1, 2, 4, 8, capped by LILY_BTC_NTMAX
// (4: B > 32 takes two passes, the second from L2 where it still holds the tile).
int nt_of(int rows) {
  static const int cap = env_int("LILY_BTC_NTMAX", 8);
  const int nt = rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
  return nt < cap ? nt : cap <= 1 ? 1 : cap <= 2 ? 2 : cap <= 4 ? 4 : 8;
}

template <int BITS, int KS> Status dense_nt(const BtcArgs& a, int NT, cudaStream_t s) {
  constexpr int RG = kW / KS;
  auto grid = [&](int MT) { return dim3((a.w.rows + 16 * MT * RG - 1) / (16 * MT * RG)); };
  if constexpr (BITS == 8) {  // small matrices (router): one tile per warp
    if (NT == 1) return go<8, 1, 1, KS, false>(a, grid(1), s);
    if (NT == 2) return go<8, 1, 2, KS, false>(a, grid(1), s);
    if (NT == 4) return go<8, 1, 4, KS, false>(a, grid(1), s);
    return go<8, 1, 8, KS, false>(a, grid(1), s);
  } else {
    if (NT == 1) return go<4, 2, 1, KS, false>(a, grid(2), s);
    if (NT == 2) return go<4, 2, 2, KS, false>(a, grid(2), s);
    if (NT == 4) return go<4, 2, 4, KS, false>(a, grid(2), s);
    return go<4, 1, 8, KS, false>(a, grid(1), s);
  }
}

}  // namespace

// The persistent staged kernel (batch_tc_stream.cu) for the experts and for 4-bit dense matrices of at
// least 8192 rows (the choice depends on the matrix only: batch invariance), unless LILY_BTC_STREAM=0
// (LILY_BTC_SDENSE=0: experts only) or the caller picks (stream 0 / 1; 2 = dense at any size, tests).
bool btc_uses_stream(const BtcArgs& a) {
  static const int stream_env = env_int("LILY_BTC_STREAM", -1), dense_env = env_int("LILY_BTC_SDENSE", 1);
  static const int smin = env_int("LILY_BTC_SMIN", 16), smin_d = env_int("LILY_BTC_SMIN_DENSE", 32);
  int want = a.stream >= 0 ? a.stream : stream_env;
  // Auto (default): by the step's rows (items: B·(k + 1) entries, k + 1 = 9 in the model): the experts
  // from 16 rows, the dense matrices from 32 (H200, 14:32: the stream kernel's down is faster from 16
  // rows, its dense in_proj only at 64). Either kernel gives the same bits, so the choice may depend on B.
  if (want < 0) want = a.items ? (a.max_ent / 9 >= smin ? 1 : 0) : (a.B >= smin_d ? 1 : 0);
  if (want < 1) return false;
  if (!a.items && !(want == 2 || (dense_env != 0 && a.w.rows >= 8192))) return false;
  return btc_stream_ok(a);
}

Status btc_gemm(const BtcArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const QW& w = a.w;
  if (w.bits != 4 && w.bits != 8) return cu_err("btc_gemm: {} bits unsupported", w.bits);
  if (w.cols % 64 != 0 || w.cols <= 0 || w.rows <= 0) return cu_err("btc_gemm: shape {}x{} unsupported", w.rows, w.cols);
  if (!a.P || !a.XS || !a.y) return cu_err("btc_gemm: null input or output");
  if (!a.items) {
    if (a.B < 1) return cu_err("btc_gemm: B={}", a.B);
    const int NT = nt_of(a.B);
    // The k split depends on the matrix only (batch invariance): one warp per full k when there are
    // enough 256-row blocks to fill the GPU twice, else k split over the block's 8 warps.
    // LILY_BTC_KS=1 / 8 forces full-k / split for every 4-bit matrix (A/B; fixed for the process).
    static const int ks_env = env_int("LILY_BTC_KS", 0);
    const bool split = w.bits == 8 || (ks_env == 8 || (ks_env != 1 && (w.rows + 255) / 256 < 2 * sm_count()));
    if (btc_uses_stream(a)) {
      BtcArgs b = a;
      b.ks = split ? 8 : 1;
      return btc_stream(b, stream);
    }
    if (w.bits == 8) return dense_nt<8, 8>(a, NT, s);
    return split ? dense_nt<4, 8>(a, NT, s) : dense_nt<4, 1>(a, NT, s);
  }
  if (w.bits != 4 || !a.n_items || a.max_items < 1 || a.n_out <= 0 || a.n_out_sh <= 0)
    return cu_err("btc_gemm: bad items arguments");
  if (a.sh.cols != w.cols || (a.swiglu && (a.w2.cols != w.cols || a.sh.rows < 2 * a.n_out_sh)))
    return cu_err("btc_gemm: expert shapes disagree");
  const int NT = env_int("LILY_BTC_ENT", 1) == 2 ? 2 : 1;
  const int rows = a.n_out > a.n_out_sh ? a.n_out : a.n_out_sh;
  // A/B (fixed for the process, so invariance holds): LILY_BTC_SWKS=4 gives gate+up blocks of 32 outputs
  // with k split over 4 warps; LILY_BTC_DNKS=2 gives down blocks of 128 outputs with k split over 2.
  static const int sw_ks = env_int("LILY_BTC_SWKS", 8), dn_ks = env_int("LILY_BTC_DNKS", 1);
  if (btc_uses_stream(a)) {
    BtcArgs b = a;
    b.ks = a.swiglu ? (sw_ks == 4 && NT == 1 ? 4 : 8) : (dn_ks == 2 && NT == 1 ? 2 : 1);
    return btc_stream(b, stream);
  }
  if (a.swiglu) {  // 16 outputs (gate + up tiles) per block, k split over 8 warps
    if (sw_ks == 4 && NT == 1) return go<4, 2, 1, 4, true>(a, dim3((rows + 31) / 32, a.max_items), s);
    const dim3 grid((rows + 15) / 16, a.max_items);
    return NT == 1 ? go<4, 2, 1, 8, true>(a, grid, s) : go<4, 2, 2, 8, true>(a, grid, s);
  }
  if (dn_ks == 2 && NT == 1) return go<4, 2, 1, 2, false>(a, dim3((rows + 127) / 128, a.max_items), s);
  const dim3 grid((rows + 255) / 256, a.max_items);  // 8 warps × 32 rows, full k each
  return NT == 1 ? go<4, 2, 1, 1, false>(a, grid, s) : go<4, 2, 2, 1, false>(a, grid, s);
}

}  // namespace lily::cuda
