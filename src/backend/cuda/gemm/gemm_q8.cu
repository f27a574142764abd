// Pipelined tensor-core GEMM over the packed MLX 8-bit layout: the prefill's router (+ shared-expert
// gate row), the one 8-bit weight (the 4-bit ones run gemm_wg.cu). A enters as fp16 hi + lo planes
// with per-group sums Σx, made once per activation by split_rows() (also here) and shared by every GEMM
// that reads it; a block streams raw tiles (A planes, packed codes, scale/bias, Σx) through a 3-deep
// cp.async ring and dequantizes the codes when it loads the B fragments (no conversion pass, one barrier
// per k tile).
// Block 64×128, 8 warps of 32×32, mma.sync m16n8k16 f16 → f32; plain output (grouped tiles with
// gathered A rows supported).
#include <cuda_fp16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

constexpr int BM = kGemmBM, BN = 128, BK = 64, kThreads = 256, LDA = BK + 8;  // LDA in halves

constexpr int BITS = 8;
struct Layout {
  static constexpr int LDB = BK * BITS / 8 + 16;  // bytes per code row (16-byte pad: no bank conflicts)
  static constexpr int kA = BM * LDA * 2;          // one plane, bytes
  static constexpr int kB = BN * LDB;
  static constexpr int kStage = 2 * kA + kB + BN * 4 + BM * 4;
  static constexpr int kStages = 3;
  static constexpr int kSmem = kStage * kStages;
};



__global__ void __launch_bounds__(kThreads, 2) gemm_pipe_kernel(GemmArgs p) {
  using Lo = Layout;
  constexpr int S = Lo::kStages, LDB = Lo::LDB;
  extern __shared__ __align__(16) unsigned char smraw[];
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
  const int K = p.w.cols, KT = K / BK, G = K / 64;
  auto stage = [&](int s) { return smraw + size_t(s) * Lo::kStage; };

  // Loader roles. A: rows ar and ar + 32, 16-byte chunk ac of each plane.
  const int ar = tid >> 3, ac = (tid & 7) * 8;
  auto src_row = [&](int r) { return p.a_rows ? p.a_rows[m0 + r] : m0 + r; };
  const bool av0 = m0 + ar < m1, av1 = m0 + ar + 32 < m1;
  const size_t ao0 = av0 ? size_t(src_row(ar)) * K + ac : 0, ao1 = av1 ? size_t(src_row(ar + 32)) * K + ac : 0;
  // B: row br, 16-byte chunks bc.. of its code row (2 of 4).
  const int br = tid >> 1;
  auto wrow_of = [&](int r, bool& valid) -> size_t {
    const int nloc = nb0 + r;
    valid = nloc < p.n_out;
    return size_t(base1) + (valid ? nloc : 0);
  };
  bool bvalid;
  const size_t brow = wrow_of(br, bvalid);
  const unsigned char* bsrc = reinterpret_cast<const unsigned char*>(p.w.codes) + brow * (size_t(K) * BITS / 8);
  constexpr int BCH = BITS / 4;  // chunks per thread per tile
  const int bc0 = (tid & 1) * BCH;
  // Scale/bias (threads 0..127: row tid) and Σx (threads 128..191: row tid − 128).
  bool sbvalid = false;
  const uint32_t* sbsrc = nullptr;
  if (tid < BN) {
    const size_t r = wrow_of(tid, sbvalid);
    sbsrc = reinterpret_cast<const uint32_t*>(p.w.sb) + r * G;
  }
  const bool xsvalid = tid >= BN && tid < BN + BM && m0 + (tid - BN) < m1;
  const float* xssrc = xsvalid ? p.axs + size_t(src_row(tid - BN)) * G : p.axs;

  auto issue = [&](int kt) {
    if (kt < KT) {
      unsigned char* st = stage(kt % S);
      __half* ah = reinterpret_cast<__half*>(st);
      __half* al = reinterpret_cast<__half*>(st + Lo::kA);
      unsigned char* bq = st + 2 * Lo::kA;
      uint32_t* sb = reinterpret_cast<uint32_t*>(bq + Lo::kB);
      float* xs = reinterpret_cast<float*>(sb + BN);
      const size_t k0 = size_t(kt) * BK;
      cp16(ah + ar * LDA + ac, p.ah + ao0 + k0, av0);
      cp16(ah + (ar + 32) * LDA + ac, p.ah + ao1 + k0, av1);
      cp16(al + ar * LDA + ac, p.al + ao0 + k0, av0);
      cp16(al + (ar + 32) * LDA + ac, p.al + ao1 + k0, av1);
#pragma unroll
      for (int c = 0; c < BCH; ++c)
        cp16(bq + br * LDB + (bc0 + c) * 16, bsrc + k0 * BITS / 8 + (bc0 + c) * 16, bvalid);
      if (tid < BN) cp4(sb + tid, sbsrc + kt, sbvalid);
      else if (tid < BN + BM) cp4(xs + (tid - BN), xssrc + kt, xsvalid);
    }
    cp_commit();
  };

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;

#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<S - 2>();
    __syncthreads();
    issue(kt + S - 1);
    const unsigned char* st = stage(kt % S);
    const __half* ah = reinterpret_cast<const __half*>(st);
    const __half* al = reinterpret_cast<const __half*>(st + Lo::kA);
    const unsigned char* bq = st + 2 * Lo::kA;
    const uint32_t* sb = reinterpret_cast<const uint32_t*>(bq + Lo::kB);
    const float* xs = reinterpret_cast<const float*>(sb + BN);
    float part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) part[i][j][k] = 0.f;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      uint32_t fa[2][4], fl[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + (lane & 15), c = ks * 16 + (lane >> 4) * 8;
        ldsm_x4(fa[mt], ah + r * LDA + c);
        ldsm_x4(fl[mt], al + r * LDA + c);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const unsigned char* row = bq + (wn * 32 + nt * 8 + g) * LDB;
        const uint32_t v0 = *reinterpret_cast<const uint16_t*>(row + ks * 16 + 2 * t);
        const uint32_t v1 = *reinterpret_cast<const uint16_t*>(row + ks * 16 + 8 + 2 * t);
        const uint32_t b0 = q2h(v0 & 0xFF, v0 >> 8);
        const uint32_t b1 = q2h(v1 & 0xFF, v1 >> 8);
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
      const float x0 = xs[r], x1 = xs[r + 8];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = wn * 32 + nt * 8 + 2 * t;
        const uint32_t v0 = sb[c], v1 = sb[c + 1];
        const float s0 = __uint_as_float(v0 << 16), b0 = __uint_as_float(v0 & 0xFFFF0000u);
        const float s1 = __uint_as_float(v1 << 16), b1 = __uint_as_float(v1 & 0xFFFF0000u);
        acc[mt][nt][0] += fmaf(s0, part[mt][nt][0], b0 * x0);
        acc[mt][nt][1] += fmaf(s1, part[mt][nt][1], b1 * x0);
        acc[mt][nt][2] += fmaf(s0, part[mt][nt][2], b0 * x1);
        acc[mt][nt][3] += fmaf(s1, part[mt][nt][3], b1 * x1);
      }
    }
  }
  cp_wait<0>();

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

// One warp per 64-column group of a row: hi = fp16(x), lo = fp16(x − hi), xs = Σx (fp32); lo and xs only
// where given (the 8-bit GEMM reads them, the 4-bit single-pass one only hi).
__global__ void split_rows_kernel(const float* a, int lda, int M, int K, __half* hi, __half* lo, float* xs) {
  const int lane = threadIdx.x & 31, G = K / 64;
  const long gi = long(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (gi >= long(M) * G) return;
  const int m = int(gi / G), gr = int(gi % G);
  const float2 x = *reinterpret_cast<const float2*>(a + size_t(m) * lda + gr * 64 + 2 * lane);
  split_pair(x, hi, lo, lo ? xs + size_t(m) * G + gr : nullptr, size_t(m) * K + gr * 64 + 2 * lane, lane);
}

Status launch(const GemmArgs& a, cudaStream_t s) {
  constexpr int smem = Layout::kSmem;
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(gemm_pipe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  dim3 grid((a.n_out + BN - 1) / BN, a.tiles ? a.max_tiles : (a.M + BM - 1) / BM);
  gemm_pipe_kernel<<<grid, kThreads, smem, s>>>(a);
  return launch_status("pf::gemm_pipe");
}

}  // namespace

Status split_rows(const float* a, int lda, int M, int K, uint16_t* hi, uint16_t* lo, float* xs, Stream stream) {
  if (K % 64 != 0 || lda % 2 != 0) return cu_err("pf::split_rows: K={} must be a multiple of 64, lda even", K);
  if (!hi || (lo == nullptr) != (xs == nullptr)) return cu_err("pf::split_rows: hi, and lo and xs both or neither");
  if (M <= 0) return Status::ok();
  const long groups = long(M) * (K / 64);
  split_rows_kernel<<<unsigned((groups + 7) / 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      a, lda, M, K, reinterpret_cast<__half*>(hi), reinterpret_cast<__half*>(lo), xs);
  return launch_status("pf::split_rows");
}

Status gemm_pipe(const GemmArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!a.ah || !a.al || !a.axs) return cu_err("pf::gemm_pipe: needs the split A planes");
  if (a.w.bits != 8 || a.swiglu) return cu_err("pf::gemm_pipe: 8-bit plain only; {} bits", a.w.bits);
  return launch(a, s);
}

}  // namespace lily::cuda::pf
