// Hopper wgmma GEMM over the packed MLX 4-bit layout (sm_90a), in two precisions chosen by the chunk's rows
// (pf::gemm's dispatch at the end; ../shared/docs/precision.md):
//  - single pass (TERMS 1, chunks of kPfSinglePassRows rows or more: always prefilled alone, never rows of a
//    mixed step, so a request's rounding does not depend on what else runs): y = Σ_k fp16(s·q + b)·fp16(x),
//    the scale and bias in the weights (one fp16 rounding of s·q + b by hfma2, as transformers' fp16
//    weights), every k tile summed into one fp32 accumulator by the tensor cores; 128-token tiles for dense
//    calls (wgmma m64n128k16: each dequantized fragment feeds twice the tokens); grouped tiles of 64 rows, or
//    of 128 and 64 rows (a wide route: one launch per class);
//  - two pass (TERMS 2, shorter chunks: the precision class of the mixed step's qgemm/xgemm that runs the same
//    prompt as segments beside decode rows): weights exact fp16 integers, x as fp16 hi + lo, per 64-group a
//    fresh partial folded as acc += s·part + b·Σx (fp32, MLX's formula, as gemm_q8.cu); 64-token tiles.
// Swapped roles: the weights are the wgmma A operand, dequantized once per k tile from the raw codes in
// shared memory into registers, one 64-row slice per warpgroup; the activations are B, cp.async'd into the
// 128-byte swizzle and read by the tensor cores from shared memory. Block: 2 warpgroups = 128 weight rows,
// a 4-stage cp.async ring, one barrier a k tile. Modes: plain, SwiGLU (gate rows in the first warpgroup, up
// rows in the second), grouped expert tiles with gathered A. Every 4-bit prefill GEMM runs here; pf::gemm's
// dispatch (4-bit here, 8-bit gemm_q8.cu) is at the end.
#include <cuda_fp16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"
#include "backend/cuda/common/wgmma_util.cuh"

namespace lily::cuda::pf {
namespace {

constexpr int BK = 64;  // k per stage (one quantization group)
// Warpgroups per block: 2 (128 weight rows). Prefill tok/s at 8k / 32k on the H200 (two-pass activations
// then) 20,981 / 15,002 against 20,215 / 14,597 with 4 (docs/perf/2026-12-03-cuda-prefill-4.md).
constexpr int WGS = 2;

template <int BT, int TERMS> struct WgLayout {
  static constexpr int NT = 128 * WGS, BW = 64 * WGS;  // threads, weight rows per block
  static constexpr int kPlane = BT * BK * 2;            // one activation plane (BT × 128 bytes)
  static constexpr int kCodes = TERMS * kPlane;         // BW rows × 32 bytes of codes
  static constexpr int kSb = kCodes + BW * 32;          // BW × (bf16 scale, bf16 bias)
  static constexpr int kXs = kSb + BW * 4;              // BT × Σx (two pass)
  static constexpr int kStage = (kXs + (TERMS == 2 ? BT * 4 : 0) + 1023) / 1024 * 1024;
  static constexpr int kStages = 4;
  static constexpr int kSmem = kStage * kStages + 1024;  // + slack to align the ring to 1024
};

// Byte b (= 2 codes: low nibble = even k) placed in bytes 0 and 2 of r by prmt → half2 (lo, hi) of
// exact integers: lop3 keeps lo in half 0 and hi·16 in half 1 under the exponent of 1024, one
// hfma2 scales half 1 by 1/16 and removes the offsets (1024 + q, 1024 + 16q → q).
__device__ __forceinline__ __half2 pair2q(uint32_t r) {
  uint32_t pk;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(pk) : "r"(r), "n"(0x00F0000F), "n"(0x64006400));
  return __hfma2(*reinterpret_cast<const __half2*>(&pk), __halves2half2(__ushort_as_half(0x3C00), __ushort_as_half(0x2C00)),
                 __halves2half2(__ushort_as_half(0xE400), __ushort_as_half(0xD400)));
}
__device__ __forceinline__ uint32_t h2bits(__half2 v) { return *reinterpret_cast<const uint32_t*>(&v); }

template <int BT> __device__ __forceinline__ void wgmma_rs(float (&d)[BT / 2], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  if constexpr (BT == 128) wgmma_64x128_rs(d, a, desc, scale_d);
  else wgmma_64x64_rs(d, a, desc, scale_d);
}

template <bool SWIGLU, int BT, int TERMS> __global__ void __launch_bounds__(128 * WGS, 2) gemm_wg_kernel(GemmArgs p) {
  using Lo = WgLayout<BT, TERMS>;
  static_assert(TERMS == 1 || BT == 64, "two-pass tiles are 64 tokens");
  constexpr int NT = Lo::NT, BW = Lo::BW, S = Lo::kStages, NA = BT / 2;
  constexpr int NB = SWIGLU ? BW / 2 : BW;  // output columns per block
  extern __shared__ __align__(16) unsigned char smraw[];
  unsigned char* sm = smraw + ((1024u - (smem_u32(smraw) & 1023u)) & 1023u);
  const uint32_t sm_s = smem_u32(sm);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3, g = lane >> 2, t = lane & 3;
  const int nb0 = blockIdx.x * NB;
  int m0, m1, base1, base2;
  if (p.tiles) {
    const int4 tl = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
    if (tl.y >= tl.z || (BT == 128) != (tl.w == 1)) return;  // empty, or the other launch's class
    m0 = tl.y, m1 = tl.z;
    base1 = p.row0 + tl.x * p.n_out, base2 = p.row0_2 + tl.x * p.n_out;
  } else {
    m0 = blockIdx.y * BT, m1 = min(p.M, m0 + BT);
    base1 = p.row0, base2 = p.row0_2;
  }
  const int K = p.w.cols, KT = K / BK, G = K / 64;
  auto src_row = [&](int r) { return p.a_rows ? p.a_rows[m0 + r] : m0 + r; };

  // Loader roles. A: BT rows × 8 chunks of 16 bytes, AR chunks per thread.
  constexpr int AR = BT * 8 / NT;
  size_t aoff[AR];
  bool aval[AR];
#pragma unroll
  for (int i = 0; i < AR; ++i) {
    const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
    aval[i] = m0 + r < m1;
    aoff[i] = aval[i] ? size_t(src_row(r)) * K + c * 8 : 0;
  }
  // Weight local row lr → packed row (plain: nb0 + lr; SwiGLU: gate rows, then up rows).
  auto wrow_of = [&](int lr, bool& valid) -> size_t {
    const bool second = SWIGLU && lr >= NB;
    const int n = nb0 + (second ? lr - NB : lr);
    valid = n < p.n_out;
    return size_t(second ? base2 : base1) + (valid ? n : 0);
  };
  auto wq_of = [&](int lr) -> const QW& { return (SWIGLU && lr >= NB) ? p.w2 : p.w; };
  // Codes: row tid/2, 16-byte half tid&1 of its 32-byte k tile. Scale/bias: threads 0..BW-1 (row tid).
  const int br = tid >> 1, bc = tid & 1;
  bool bvalid;
  const size_t brow = wrow_of(br, bvalid);
  const unsigned char* bsrc = reinterpret_cast<const unsigned char*>(wq_of(br).codes) + brow * (size_t(K) / 2) + bc * 16;
  bool sbvalid = false;
  const uint32_t* sbsrc = reinterpret_cast<const uint32_t*>(p.w.sb);
  if (tid < BW) {
    const size_t r = wrow_of(tid, sbvalid);
    sbsrc = reinterpret_cast<const uint32_t*>(wq_of(tid).sb) + r * G;
  }
  // Two pass: Σx of token tid − BW (threads BW..BW+BT−1).
  const bool xsvalid = TERMS == 2 && tid >= BW && tid < BW + BT && m0 + (tid - BW) < m1;
  const float* xssrc = xsvalid ? p.axs + size_t(src_row(tid - BW)) * G : p.axs;

  auto issue = [&](int kt) {
    if (kt < KT) {
      const uint32_t st = sm_s + uint32_t(kt % S) * Lo::kStage;
      const size_t k0 = size_t(kt) * BK;
#pragma unroll
      for (int i = 0; i < AR; ++i) {
        const int idx = tid + i * NT;
        const uint32_t o = sw128_off(idx >> 3, idx & 7);
        cp16(st + o, p.ah + aoff[i] + k0, aval[i]);
        if constexpr (TERMS == 2) cp16(st + Lo::kPlane + o, p.al + aoff[i] + k0, aval[i]);
      }
      cp16(st + Lo::kCodes + br * 32 + bc * 16, bsrc + k0 / 2, bvalid);
      if (tid < BW) cp4(st + Lo::kSb + tid * 4, sbsrc + kt, sbvalid);
      else if (TERMS == 2 && tid < BW + BT) cp4(st + Lo::kXs + (tid - BW) * 4, xssrc + kt, xsvalid);
    }
    cp_commit();
  };

  // This thread's weight rows (local): r0 and r0 + 8 of warpgroup wg's 64-row slice.
  const int r0 = wg * 64 + w4 * 16 + g;
  const uint32_t psel = uint32_t(t) | (4u << 4) | (uint32_t(t) << 8) | (4u << 12);  // byte t → bytes 0 and 2
  float acc[NA];
#pragma unroll
  for (int i = 0; i < NA; ++i) acc[i] = 0.f;

  // A fragments of stage stg: rows r0 / r0+8, k = 16s + 2t, +1 (regs 0, 1) and 16s + 2t + 8, +9
  // (regs 2, 3): byte t of code words 2s and 2s + 1 of each row; single pass: times the row's scale plus
  // its bias, rounded once to fp16 (bf16 s, b → fp16 exact for |s|, |b| ≥ 2^-14; smaller ones lose bits as
  // fp16 subnormals, as transformers' fp16 weights do).
  auto dequant = [&](int stg, uint32_t (&a)[4][4]) {
    const unsigned char* st = sm + size_t(stg) * Lo::kStage;
    const uint4* c0 = reinterpret_cast<const uint4*>(st + Lo::kCodes + r0 * 32);
    const uint4* c1 = reinterpret_cast<const uint4*>(st + Lo::kCodes + (r0 + 8) * 32);
    const uint4 x0a = c0[0], x0b = c0[1], x1a = c1[0], x1b = c1[1];
    const uint32_t w0[8] = {x0a.x, x0a.y, x0a.z, x0a.w, x0b.x, x0b.y, x0b.z, x0b.w};
    const uint32_t w1[8] = {x1a.x, x1a.y, x1a.z, x1a.w, x1b.x, x1b.y, x1b.z, x1b.w};
    __half2 s0, b0, s1, b1;
    if constexpr (TERMS == 1) {
      const uint32_t sb0 = reinterpret_cast<const uint32_t*>(st + Lo::kSb)[r0];
      const uint32_t sb1 = reinterpret_cast<const uint32_t*>(st + Lo::kSb)[r0 + 8];
      s0 = __float2half2_rn(__uint_as_float(sb0 << 16)), b0 = __float2half2_rn(__uint_as_float(sb0 & 0xFFFF0000u));
      s1 = __float2half2_rn(__uint_as_float(sb1 << 16)), b1 = __float2half2_rn(__uint_as_float(sb1 & 0xFFFF0000u));
    }
    auto w = [&](uint32_t word, bool second) {
      const __half2 q = pair2q(__byte_perm(word, 0u, psel));
      if constexpr (TERMS == 1) return h2bits(second ? __hfma2(q, s1, b1) : __hfma2(q, s0, b0));
      else return h2bits(q);
    };
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      a[s][0] = w(w0[2 * s], false);
      a[s][1] = w(w1[2 * s], true);
      a[s][2] = w(w0[2 * s + 1], false);
      a[s][3] = w(w1[2 * s + 1], true);
    }
  };
  // Two pass: waits for the MMAs, then acc += s·part, acc += b·Σx (two fma) with stage stg's scale/bias and Σx.
  auto fold = [&](int stg, float (&part)[NA]) {
    const unsigned char* st = sm + size_t(stg) * Lo::kStage;
    const uint32_t sb0 = reinterpret_cast<const uint32_t*>(st + Lo::kSb)[r0];
    const uint32_t sb1 = reinterpret_cast<const uint32_t*>(st + Lo::kSb)[r0 + 8];
    const float s0 = __uint_as_float(sb0 << 16), b0 = __uint_as_float(sb0 & 0xFFFF0000u);
    const float s1 = __uint_as_float(sb1 << 16), b1 = __uint_as_float(sb1 & 0xFFFF0000u);
    const float* xs = reinterpret_cast<const float*>(st + Lo::kXs);
    wg_wait<0>();
    fence_regs(part);
#pragma unroll
    for (int j = 0; j < BT / 8; ++j) {
      const float2 x = *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t);
      acc[4 * j + 0] = fmaf(b0, x.x, fmaf(s0, part[4 * j + 0], acc[4 * j + 0]));
      acc[4 * j + 1] = fmaf(b0, x.y, fmaf(s0, part[4 * j + 1], acc[4 * j + 1]));
      acc[4 * j + 2] = fmaf(b1, x.x, fmaf(s1, part[4 * j + 2], acc[4 * j + 2]));
      acc[4 * j + 3] = fmaf(b1, x.y, fmaf(s1, part[4 * j + 3], acc[4 * j + 3]));
    }
  };

  // Tile kt: wait for its copies, one barrier (every warpgroup is done with tile kt − 1, so its stage takes
  // tile kt + S − 1), dequantize, the wgmmas, wait for them (two pass: fold). The tensor cores stay busy
  // through the other warpgroups of the SM (two blocks of two); overlapping a warpgroup's own next
  // dequantization with its wgmmas (two register sets, wait_group 1) makes ptxas serialize them (C7513).
  [[maybe_unused]] float part[TERMS == 2 ? NA : 1];
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<S - 2>();
    fence_async_smem();  // cp.async writes (generic proxy) → wgmma reads (async proxy)
    __syncthreads();
    issue(kt + S - 1);
    const int stg = kt % S;
    uint32_t a[4][4];
    dequant(stg, a);
    const uint32_t st_s = sm_s + uint32_t(stg) * Lo::kStage;
    const uint64_t dh = sw128_desc(st_s);
    wg_arrive();
    if constexpr (TERMS == 1) {
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_rs<BT>(acc, a[s], dh + 2 * s, 1);
      wg_commit();
      wg_wait<0>();
    } else {
      const uint64_t dl = sw128_desc(st_s + Lo::kPlane);
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_rs<BT>(part, a[s], dh + 2 * s, s > 0);
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_rs<BT>(part, a[s], dl + 2 * s, 1);
      wg_commit();
      fold(stg, part);
    }
  }
  fence_regs(acc);
  cp_wait<0>();

  // acc[4j + 2hv + e]: weight row r0 + 8hv, token 8j + 2t + e. Output fp32 y, or (y16) its fp16 rounding (RN:
  // the bits split_rows would give the next GEMM).
  auto put = [&](size_t i, float v) {
    if (p.y16) p.y16[i] = __half_as_ushort(__float2half_rn(v));
    else p.y[i] = v;
  };
  if constexpr (!SWIGLU) {
#pragma unroll
    for (int hv = 0; hv < 2; ++hv) {
      const int n = nb0 + r0 + 8 * hv;
      if (n >= p.n_out) continue;
#pragma unroll
      for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * j + 2 * t + e;
          if (m < m1) put(size_t(m) * p.ldy + n, acc[4 * j + 2 * hv + e]);
        }
    }
  } else {
    __syncthreads();  // the ring is reused for the gate/up exchange
    constexpr int LC = BT + 1;
    float* cs = reinterpret_cast<float*>(sm);  // [NB][BT + 1]: up values
    static_assert(NB * LC * 4 <= Lo::kStage * Lo::kStages, "exchange tile must fit");
    if (wg >= WGS / 2) {
#pragma unroll
      for (int hv = 0; hv < 2; ++hv)
#pragma unroll
        for (int j = 0; j < BT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) cs[(r0 - NB + 8 * hv) * LC + 8 * j + 2 * t + e] = acc[4 * j + 2 * hv + e];
    }
    __syncthreads();
    if (wg < WGS / 2) {
#pragma unroll
      for (int hv = 0; hv < 2; ++hv) {
        const int r = r0 + 8 * hv, n = nb0 + r;
        if (n >= p.n_out) continue;
#pragma unroll
        for (int j = 0; j < BT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * j + 2 * t + e, m = m0 + c;
            if (m < m1) put(size_t(m) * p.ldy + n, silu(acc[4 * j + 2 * hv + e]) * cs[r * LC + c]);
          }
      }
    }
  }
}

template <bool SWIGLU, int BT, int TERMS> Status launch(const GemmArgs& a, cudaStream_t s) {
  constexpr int smem = WgLayout<BT, TERMS>::kSmem;
  auto k = gemm_wg_kernel<SWIGLU, BT, TERMS>;
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  constexpr int NB = SWIGLU ? 32 * WGS : 64 * WGS;
  dim3 grid((a.n_out + NB - 1) / NB, a.tiles ? a.max_tiles : (a.M + BT - 1) / BT);
  k<<<grid, 128 * WGS, smem, s>>>(a);
  return launch_status("pf::gemm_wg");
}
// Grouped single-pass calls: one launch per tile class (each skips the other's tiles), so every tile runs at
// the wgmma width of its rows (a narrow route's tiles are all class 0: the second launch's blocks exit at once).
template <bool SWIGLU> Status launch_terms(const GemmArgs& a, cudaStream_t s) {
  if (a.terms == 2) return launch<SWIGLU, kGemmBM, 2>(a, s);
  if (!a.tiles) return launch<SWIGLU, 128, 1>(a, s);
  LILY_TRY((launch<SWIGLU, kGemmBM, 1>(a, s)));
  return launch<SWIGLU, 128, 1>(a, s);
}

}  // namespace

Status gemm_wg(const GemmArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.terms != 1 && a.terms != 2) return cu_err("pf::gemm_wg: terms {} (1 or 2)", a.terms);
  if (!a.ah || (a.terms == 2 && (!a.al || !a.axs))) return cu_err("pf::gemm_wg: needs the split A ({} terms)", a.terms);
  if (a.w.bits != 4) return cu_err("pf::gemm_wg: {} bits unsupported (4 only)", a.w.bits);
  if (a.y16 && a.terms != 1) return cu_err("pf::gemm_wg: fp16 output (y16) is single pass only");
  return a.swiglu ? launch_terms<true>(a, s) : launch_terms<false>(a, s);
}

Status gemm(const GemmArgs& a, Stream stream) {
  if (a.w.bits != 4 && a.w.bits != 8) return cu_err("pf::gemm: {} bits unsupported", a.w.bits);
  if (a.w.cols % BK != 0) return cu_err("pf::gemm: K={} must be a multiple of 64", a.w.cols);
  if (a.n_out <= 0 || (!a.tiles && a.M <= 0)) return Status::ok();
  if (a.tiles && a.max_tiles > 65535) return cu_err("pf::gemm: {} tiles exceed the grid", a.max_tiles);
  if (!a.tiles && (a.M + 127) / 128 > 65535) return cu_err("pf::gemm: M={} too large", a.M);
  if (a.swiglu && (a.w2.cols != a.w.cols || a.w2.bits != a.w.bits)) return cu_err("pf::gemm: SwiGLU weights differ in shape");
  return a.w.bits == 4 ? gemm_wg(a, stream) : gemm_pipe(a, stream);
}

}  // namespace lily::cuda::pf
