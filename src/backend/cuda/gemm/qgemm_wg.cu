// The dense tile of qgemm for many rows (qgemm.h): Hopper wgmma over the packed activation rows that
// every qgemm call reads (X fp16 x·2^e in the codes' order, Xlo the two-pass remainders, XS {Σx, 2^-e}).
// Block: two warpgroups = 128 weight rows (64 each, the wgmma A operand, dequantized once per group
// from the raw codes in shared memory into registers as exact fp16 integers) × 64 activation rows (the
// B operand, cp.async'd into the 128-byte swizzle and read by the tensor cores straight from shared
// memory); one 64-group per stage through a 4-stage ring; per group 4 wgmma m64n64k16 with X (and 4
// with Xlo) into a fresh partial, then y += (scale·2^-e)·part + bias·Σx in fp32 (qgemm's formula).
// Grid: 128-row tiles × 64-row chunks × the matrix's k splits (qgemm_splits: a function of its shape);
// split partials meet in qgemm's workspace, summed in split order by the last block to arrive.
//
// The codes' order: X holds value 8c + i at 8c + 2i and 8c + i + 4 at 8c + 2i + 1 (i < 4), so the A
// fragment of lane quad t for k-slots 2t, 2t + 1 of a 16-k step (8 values of one code word) is nibbles
// t and t + 4 of that word: one shift, one lop3 into the exponent of 1024, one subtract.
#include <cuda_fp16.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/gemm/q4_mma.cuh"
#include "backend/cuda/gemm/qgemm_wg.h"
#include "backend/cuda/common/wgmma_util.cuh"

namespace lily::cuda {
namespace {

constexpr int kRows = 128, kTok = 64, kThreads = 256, kStages = 4;
// One stage (1024-aligned): X plane, Xlo plane (64 rows × 128 bytes each, swizzled), codes (128 rows
// × 32 bytes), {scale, bias} bf16 pairs (128 × 4 bytes), {Σx, 2^-e} (64 × 8 bytes).
constexpr int kPlane = kTok * 128, kCodes = 2 * kPlane, kSb = kCodes + kRows * 32, kXs = kSb + kRows * 4;
constexpr int kStage = (kXs + kTok * 8 + 1023) / 1024 * 1024;
constexpr int kSmem = kStage * kStages + 1024;  // + slack to align the ring to 1024
constexpr int kRed = 16;                         // the last-arrival flag, after the ring

__device__ __forceinline__ void cp8_async(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 8 : 0) : "memory");
}
using q4::nib2h;

__global__ void __launch_bounds__(kThreads, 2) qgemm_wg_kernel(WgArgs g) {
  const QGemmArgs& a = g.a;
  extern __shared__ __align__(16) unsigned char smraw[];
  unsigned char* sm = smraw + ((1024u - (smem_u32(smraw) & 1023u)) & 1023u);
  const uint32_t sm_s = smem_u32(sm);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3, gq = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, chunk = blockIdx.y, split = blockIdx.z;
  const int n0 = tile * kRows, m0 = chunk * kTok, m_cnt = min(kTok, a.M - m0);
  const int G = g.K / 64, nks = (g.K + 255) / 256;
  const int kt0 = 4 * (split * nks / g.S), kt1 = min(G, 4 * ((split + 1) * nks / g.S));

  // Loader roles. Activations: 64 rows × 8 chunks of 16 bytes per plane, two per thread.
  size_t xoff[2];
  bool xval[2];
  uint32_t xdst[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + i * kThreads, r = idx >> 3, c = idx & 7;
    xval[i] = r < m_cnt;
    xoff[i] = xval[i] ? size_t(m0 + r) * a.ldx + c * 8 : 0;
    xdst[i] = pf::sw128_off(r, c);
  }
  // Codes: tile row tid / 2, 16-byte half tid & 1 of its 32 bytes per group.
  const int crow = n0 + (tid >> 1);
  const bool cval = crow < g.N;
  const unsigned char* csrc = reinterpret_cast<const unsigned char*>(a.w.codes) + size_t(cval ? crow : 0) * (g.K / 2) + (tid & 1) * 16;
  // {scale, bias}: threads 0..127 (tile row tid); {Σx, 2^-e}: threads 128..191 (activation row tid − 128).
  const bool sval = tid < kRows && n0 + tid < g.N;
  const uint32_t* ssrc = reinterpret_cast<const uint32_t*>(a.w.sb) + (sval ? size_t(n0 + tid) * G : 0);
  const bool xsval = tid >= kRows && tid < kRows + kTok && tid - kRows < m_cnt;
  const float* xssrc = a.xs + (xsval ? size_t(m0 + tid - kRows) * G * 2 : 0);

  auto issue_w = [&](int kt) {  // the weights of group kt (they never depend on the previous kernel)
    if (kt >= kt1) return;
    const uint32_t st = sm_s + uint32_t((kt - kt0) % kStages) * kStage;
    cp16(st + kCodes + (tid >> 1) * 32 + (tid & 1) * 16, csrc + size_t(kt) * 32, cval);
    if (tid < kRows) cp4(st + kSb + tid * 4, ssrc + kt, sval);
  };
  auto issue_x = [&](int kt) {  // the activations of group kt
    if (kt >= kt1) return;
    const uint32_t st = sm_s + uint32_t((kt - kt0) % kStages) * kStage;
    const size_t k0 = size_t(kt) * 64;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      cp16(st + xdst[i], a.x + xoff[i] + k0, xval[i]);
      cp16(st + kPlane + xdst[i], a.xlo + xoff[i] + k0, xval[i]);
    }
    if (tid >= kRows && tid < kRows + kTok) cp8_async(st + kXs + (tid - kRows) * 8, xssrc + 2 * kt, xsval);
  };

  // Prologue: the first stages' weights, then (after the previous kernel) their activations.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_w(kt0 + s);
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue_x(kt0 + s);
    cp_commit();
  }

  // This thread's weight rows (local): r0 and r0 + 8 of warpgroup wg's 64-row slice.
  const int r0 = wg * 64 + w4 * 16 + gq;
  float acc[32], part[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.f, part[i] = 0.f;

  for (int kt = kt0; kt < kt1; ++kt) {
    const int stg = (kt - kt0) % kStages;
    cp_wait<kStages - 2>();
    pf::fence_async_smem();  // cp.async writes (generic proxy) → wgmma reads (async proxy)
    __syncthreads();
    issue_w(kt + kStages - 1);
    issue_x(kt + kStages - 1);
    cp_commit();
    const unsigned char* st = sm + size_t(stg) * kStage;
    // A fragments: rows r0 / r0 + 8, k-step s: nibbles t, t + 4 of code words 2s (k-slots 2t, 2t + 1)
    // and 2s + 1 (k-slots 2t + 8, 2t + 9).
    uint32_t af[4][4];
    {
      const uint4* c0 = reinterpret_cast<const uint4*>(st + kCodes + r0 * 32);
      const uint4* c1 = reinterpret_cast<const uint4*>(st + kCodes + (r0 + 8) * 32);
      const uint4 x0a = c0[0], x0b = c0[1], x1a = c1[0], x1b = c1[1];
      const uint32_t w0[8] = {x0a.x, x0a.y, x0a.z, x0a.w, x0b.x, x0b.y, x0b.z, x0b.w};
      const uint32_t w1[8] = {x1a.x, x1a.y, x1a.z, x1a.w, x1b.x, x1b.y, x1b.z, x1b.w};
      const int sh = 4 * t;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        af[s][0] = nib2h(w0[2 * s] >> sh);
        af[s][1] = nib2h(w1[2 * s] >> sh);
        af[s][2] = nib2h(w0[2 * s + 1] >> sh);
        af[s][3] = nib2h(w1[2 * s + 1] >> sh);
      }
    }
    const uint32_t st_s = sm_s + uint32_t(stg) * kStage;
    const uint64_t dh = pf::sw128_desc(st_s), dl = pf::sw128_desc(st_s + kPlane);
    pf::wg_arrive();
#pragma unroll
    for (int s = 0; s < 4; ++s) pf::wgmma_64x64_rs(part, af[s], dh + 2 * s, s > 0);
#pragma unroll
    for (int s = 0; s < 4; ++s) pf::wgmma_64x64_rs(part, af[s], dl + 2 * s, 1);
    pf::wg_commit();
    const uint32_t sb0 = reinterpret_cast<const uint32_t*>(st + kSb)[r0];
    const uint32_t sb1 = reinterpret_cast<const uint32_t*>(st + kSb)[r0 + 8];
    const float s0 = __uint_as_float(sb0 << 16), b0 = __uint_as_float(sb0 & 0xFFFF0000u);
    const float s1 = __uint_as_float(sb1 << 16), b1 = __uint_as_float(sb1 & 0xFFFF0000u);
    const float4* xs = reinterpret_cast<const float4*>(st + kXs);
    pf::wg_wait<0>();
    pf::fence_regs(part);
    // acc[4j + 2hv + e]: tile row r0 + 8hv, activation row 8j + 2t + e.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 x = xs[4 * j + t];  // {Σx, 2^-e} of rows 8j + 2t and + 1
      acc[4 * j + 0] = fmaf(s0 * x.y, part[4 * j + 0], fmaf(b0, x.x, acc[4 * j + 0]));
      acc[4 * j + 1] = fmaf(s0 * x.w, part[4 * j + 1], fmaf(b0, x.z, acc[4 * j + 1]));
      acc[4 * j + 2] = fmaf(s1 * x.y, part[4 * j + 2], fmaf(b1, x.x, acc[4 * j + 2]));
      acc[4 * j + 3] = fmaf(s1 * x.w, part[4 * j + 3], fmaf(b1, x.z, acc[4 * j + 3]));
    }
  }
  cp_wait<0>();

  bool last = true;
  if (g.S > 1) {  // partials to the workspace; the last split to arrive sums all of them in split order
    float* wsp = a.ws + size_t(split) * a.M * g.N;
#pragma unroll
    for (int hv = 0; hv < 2; ++hv) {
      const int n = n0 + r0 + 8 * hv;
      if (n >= g.N) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int mm = 8 * j + 2 * t + e;
          if (mm < m_cnt) __stcg(wsp + size_t(m0 + mm) * g.N + n, acc[4 * j + 2 * hv + e]);
        }
    }
    __threadfence();
    __syncthreads();
    int* flag = reinterpret_cast<int*>(sm + kStage * kStages);
    if (tid == 0) {
      int* c = a.cnt + tile * g.C + chunk;
      const int old = atomicAdd(c, 1);
      flag[0] = old == g.S - 1;
      if (old == g.S - 1) atomicExch(c, 0);
    }
    __syncthreads();
    last = flag[0] != 0;
    if (!last) return;
    __threadfence();
    // Split by split, each split's 32 loads issued together (one L2 round trip a split, not one a value);
    // the sums in split order as before.
    float sum[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) sum[i] = 0.f;
    for (int sp = 0; sp < g.S; ++sp) {
      const float* p = a.ws + size_t(sp) * a.M * g.N;
#pragma unroll
      for (int hv = 0; hv < 2; ++hv) {
        const int n = n0 + r0 + 8 * hv;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int mm = 8 * j + 2 * t + e, i = 4 * j + 2 * hv + e;
            const bool ok = n < g.N && mm < m_cnt;
            sum[i] += sp == split ? acc[i] : ok ? __ldcg(p + size_t(m0 + mm) * g.N + n) : 0.f;
          }
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = sum[i];  // entries past N or m_cnt are never stored
  }
#pragma unroll
  for (int hv = 0; hv < 2; ++hv) {
    const int n = n0 + r0 + 8 * hv;
    if (n >= g.N) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int mm = 8 * j + 2 * t + e;
        if (mm < m_cnt) a.y[size_t(m0 + mm) * a.ldy + n] = acc[4 * j + 2 * hv + e];
      }
  }
}

Status launch(const WgArgs& g, cudaStream_t s) {
  constexpr int smem = kSmem + kRed;
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(qgemm_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  return launch_k("qgemm_wg", qgemm_wg_kernel, dim3(g.T, g.C, g.S), dim3(kThreads), smem, s, g);
}

}  // namespace

int qgemm_wg_chunks(int M) { return (M + kTok - 1) / kTok; }

Status qgemm_wg(const WgArgs& g, cudaStream_t s) {
  if (g.a.w.bits != 4) return cu_err("qgemm_wg: 4-bit weights only ({} bits)", g.a.w.bits);
  return launch(g, s);
}

}  // namespace lily::cuda
