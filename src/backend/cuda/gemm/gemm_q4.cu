// pf::gemm's dispatch and two of its kernels. The register-prefetch kernel: tensor-core GEMM of fp32
// activations [M, K] against a packed MLX 4-bit weight [N, K] (mma.sync m16n8k16 f16 → f32, sm_90a),
// for the calls without a pre-split A (the prefill's lm_head: one row). Codes are dequantized per
// 64-wide k tile into shared memory as exact fp16 integers; x enters as fp16 hi + lo (~22-bit x); each k tile is one quantization group, so the MMA partial Σq·x is folded per tile as
// s·Σqx + b·Σx (MLX's formula, Σx from the fp32 x). Block 64×128, 8 warps of 32×32, register
// prefetch of the next tile and double-buffered shared memory (one barrier per k tile).
#include <cuda_fp16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

constexpr int BM = kGemmBM, BN = 128, BK = 64, kThreads = 256, LDS = BK + 8;  // LDS in halves

struct Buf {
  __half ah[BM * LDS];
  __half al[BM * LDS];
  __half b[BN * LDS];
  float2 sb[BN];
  float xs[BM];
};

__device__ __forceinline__ uint32_t ld32(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }


__global__ void __launch_bounds__(kThreads, 2) gemm_kernel(GemmArgs p) {
  constexpr int BITS = 4;
  extern __shared__ __align__(16) unsigned char smraw[];
  Buf* bufs = reinterpret_cast<Buf*>(smraw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
  const int nb0 = blockIdx.x * BN;
  int m0, m1, base1;
  if (p.tiles) {
    const int4 tl = reinterpret_cast<const int4*>(p.tiles)[blockIdx.y];
    if (tl.y >= tl.z) return;
    m0 = tl.y, m1 = tl.z;
    base1 = p.row0 + tl.x * p.n_out;
  } else {
    m0 = blockIdx.y * BM, m1 = min(p.M, m0 + BM);
    base1 = p.row0;
  }
  const int K = p.w.cols, KT = K / BK;

  // Loader roles. A: row ar, 16 floats from column ac. B: row br, 32 codes from column bh·32.
  const int ar = tid >> 2, ac = (tid & 3) * 16;
  const float* aptr = nullptr;
  if (m0 + ar < m1) {
    const int src = p.a_rows ? p.a_rows[m0 + ar] : m0 + ar;
    aptr = p.a + size_t(src) * p.lda + ac;
  }
  const int br = tid >> 1, bh = tid & 1;
  const int nloc = nb0 + br;
  const QW& wq = p.w;
  const bool bvalid = nloc < p.n_out;
  const size_t wrow = size_t(base1) + nloc;
  constexpr int NV = BITS / 4;  // uint4 per thread per tile
  const uint4* bptr = reinterpret_cast<const uint4*>(wq.codes) + wrow * (size_t(K) * BITS / 128) + bh * NV;
  const uint32_t* sbptr = reinterpret_cast<const uint32_t*>(wq.sb) + wrow * (K / 64);

  float4 av[4];
  uint4 bv[NV];
  uint32_t sbv = 0;
  auto gload = [&](int kt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = aptr ? __ldg(reinterpret_cast<const float4*>(aptr + kt * BK) + i) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < NV; ++i) bv[i] = bvalid ? __ldg(bptr + size_t(kt) * (BK * BITS / 128) + i) : make_uint4(0, 0, 0, 0);
    sbv = (bvalid && bh == 0) ? __ldg(sbptr + kt) : 0u;
  };
  auto sstore = [&](Buf& B) {
    // A: fp16 hi (+ lo) and the row's Σx over this group.
    const float* f = reinterpret_cast<const float*>(av);
    uint32_t hi[8], lo[8];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x0 = f[2 * i], x1 = f[2 * i + 1];
      s += x0 + x1;
      const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
      __half2 hh = __halves2half2(h0, h1);
      hi[i] = *reinterpret_cast<uint32_t*>(&hh);
      __half2 ll = __halves2half2(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
      lo[i] = *reinterpret_cast<uint32_t*>(&ll);
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    uint4* dh = reinterpret_cast<uint4*>(B.ah + ar * LDS + ac);
    dh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    dh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    uint4* dl = reinterpret_cast<uint4*>(B.al + ar * LDS + ac);
    dl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    dl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    if ((tid & 3) == 0) B.xs[ar] = s;
    // B: 32 codes → 32 fp16 integers.
    uint32_t h[16];
    const uint32_t* wv = reinterpret_cast<const uint32_t*>(bv);
#pragma unroll
    for (int wi = 0; wi < 4; ++wi)
#pragma unroll
      for (int j = 0; j < 4; ++j) h[wi * 4 + j] = q2h((wv[wi] >> (8 * j)) & 0xF, (wv[wi] >> (8 * j + 4)) & 0xF);
    uint4* db = reinterpret_cast<uint4*>(B.b + br * LDS + bh * 32);
#pragma unroll
    for (int i = 0; i < 4; ++i) db[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
    if (bh == 0) B.sb[br] = make_float2(__uint_as_float(sbv << 16), __uint_as_float(sbv & 0xFFFF0000u));
  };

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;

  gload(0);
  sstore(bufs[0]);
  __syncthreads();
  for (int kt = 0; kt < KT; ++kt) {
    if (kt + 1 < KT) gload(kt + 1);
    const Buf& B = bufs[kt & 1];
    float part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) part[i][j][k] = 0.f;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      const int kk = ks * 16 + 2 * t;
      uint32_t fa[2][4], fl[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + g;
        fa[mt][0] = ld32(B.ah + r * LDS + kk);
        fa[mt][1] = ld32(B.ah + (r + 8) * LDS + kk);
        fa[mt][2] = ld32(B.ah + r * LDS + kk + 8);
        fa[mt][3] = ld32(B.ah + (r + 8) * LDS + kk + 8);
        fl[mt][0] = ld32(B.al + r * LDS + kk);
        fl[mt][1] = ld32(B.al + (r + 8) * LDS + kk);
        fl[mt][2] = ld32(B.al + r * LDS + kk + 8);
        fl[mt][3] = ld32(B.al + (r + 8) * LDS + kk + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = wn * 32 + nt * 8 + g;
        const uint32_t b0 = ld32(B.b + n * LDS + kk), b1 = ld32(B.b + n * LDS + kk + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_f16(part[mt][nt], fa[mt], b0, b1);
          mma_f16(part[mt][nt], fl[mt], b0, b1);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int r = wm * 32 + mt * 16 + g;
      const float x0 = B.xs[r], x1 = B.xs[r + 8];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = wn * 32 + nt * 8 + 2 * t;
        const float2 s0 = B.sb[c], s1 = B.sb[c + 1];
        acc[mt][nt][0] += fmaf(s0.x, part[mt][nt][0], s0.y * x0);
        acc[mt][nt][1] += fmaf(s1.x, part[mt][nt][1], s1.y * x0);
        acc[mt][nt][2] += fmaf(s0.x, part[mt][nt][2], s0.y * x1);
        acc[mt][nt][3] += fmaf(s1.x, part[mt][nt][3], s1.y * x1);
      }
    }
    if (kt + 1 < KT) sstore(bufs[(kt + 1) & 1]);
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hv = 0; hv < 2; ++hv) {
      const int m = m0 + wm * 32 + mt * 16 + g + 8 * hv;
      if (m >= m1) continue;
      float* yr = p.y + size_t(m) * p.ldy;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = nb0 + wn * 32 + nt * 8 + 2 * t;
        if (n < p.n_out) yr[n] = acc[mt][nt][2 * hv];
        if (n + 1 < p.n_out) yr[n + 1] = acc[mt][nt][2 * hv + 1];
      }
    }
}

constexpr size_t kSmem = 2 * sizeof(Buf);

Status launch(const GemmArgs& a, cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    attr = true;
  }
  dim3 grid((a.n_out + BN - 1) / BN, a.tiles ? a.max_tiles : (a.M + BM - 1) / BM);
  gemm_kernel<<<grid, kThreads, kSmem, s>>>(a);
  return launch_status("pf::gemm");
}

}  // namespace

Status gemm(const GemmArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.w.bits != 4 && a.w.bits != 8) return cu_err("pf::gemm: {} bits unsupported", a.w.bits);
  if (a.w.cols % BK != 0) return cu_err("pf::gemm: K={} must be a multiple of 64", a.w.cols);
  if (a.lda % 4 != 0 || (reinterpret_cast<uintptr_t>(a.a) & 15)) return cu_err("pf::gemm: A must be 16-byte aligned rows");
  if (a.n_out <= 0 || (!a.tiles && a.M <= 0)) return Status::ok();
  if (a.tiles && a.max_tiles > 65535) return cu_err("pf::gemm: {} tiles exceed the grid", a.max_tiles);
  if (!a.tiles && (a.M + BM - 1) / BM > 65535) return cu_err("pf::gemm: M={} too large", a.M);
  if (a.swiglu && (a.w2.cols != a.w.cols || a.w2.bits != a.w.bits)) return cu_err("pf::gemm: SwiGLU weights differ in shape");
  if (a.ah) return a.w.bits == 4 ? gemm_wg(a, stream) : gemm_pipe(a, stream);
  if (a.w.bits != 4 || a.swiglu) return cu_err("pf::gemm: without a pre-split A, 4-bit plain only");
  return launch(a, s);
}

}  // namespace lily::cuda::pf
