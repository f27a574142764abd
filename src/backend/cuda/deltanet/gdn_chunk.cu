// Gated DeltaNet recurrence over M tokens in the chunked (WY) form of model-spec §1.4.2, chunk 64,
// on tensor cores (mma.sync m16n8k8 tf32, every product split 3xTF32: hi·hi + hi·lo + lo·hi, ~fp32; single
// pass for the long chunks, GdnPrefillArgs::terms = 1: hi·hi, each operand rounded once to tf32).
// Kernel 1 (all chunks and value heads in parallel): γ = cumsum g, KKᵀ and QKᵀ (masked, decayed),
// the forward substitution [U | W] = (I + L)⁻¹·[diag(β)V | diag(β e^γ)K] and P = QKᵀ ⊙ Γ, to scratch.
// Kernel 2 (one block per value head and 32-column slice of S, chunks in order, S fp32 in shared
// memory, read from and rounded back to the fp16 state once a call): U' = U − W·S; O = diag(e^γ)Q·S + P·U'; S ← e^{γ_n}·S + (diag(e^{γ_n−γ})K)ᵀ·U'.
#include <cstdlib>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

constexpr int kD = 128;        // key / value head dim (the shape guard in gdn_prefill)
constexpr int kC = 64;         // chunk
constexpr int kCS = 32;        // S columns per block of kernel 2
constexpr int kSlices = kD / kCS;
// Scratch per (value head, chunk), floats: U [64][128], W [64][128], P [64][64], γ [64].
constexpr int kOffU = 0, kOffW = kC * kD, kOffP = 2 * kC * kD, kOffG = kOffP + kC * kC;
constexpr int kPer = kOffG + kC;


// x = hi + lo, both tf32 (hi = x rounded to 10 mantissa bits, lo = the rest rounded likewise).
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  const float r = x - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(r));
}
__device__ __forceinline__ void mma1(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Fragments of one m16n8k8 step, split: A (16×8) a[0..3] at (g, t), (g+8, t), (g, t+4), (g+8, t+4);
// B (8×8) b[0..1] at (t, g), (t+4, g); C (16×8) at (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
struct FragA {
  uint32_t h[4], l[4];
  __device__ __forceinline__ void set(float x0, float x1, float x2, float x3) {
    split(x0, h[0], l[0]), split(x1, h[1], l[1]), split(x2, h[2], l[2]), split(x3, h[3], l[3]);
  }
};
struct FragB {
  uint32_t h[2], l[2];
  __device__ __forceinline__ void set(float x0, float x1) { split(x0, h[0], l[0]), split(x1, h[1], l[1]); }
};
// kT = 3: hi·lo + lo·hi + hi·hi (~fp32 products); kT = 1 (single pass, the long chunks): hi·hi, each operand
// rounded once to tf32 (10 mantissa bits; the lo halves are then never computed: the cvt asm is not volatile).
template <int kT> __device__ __forceinline__ void mma_t(float* d, const FragA& a, const FragB& b) {
  if constexpr (kT == 3) {
    mma1(d, a.h, b.l);
    mma1(d, a.l, b.h);
  }
  mma1(d, a.h, b.h);
}

// ---- kernel 1: per (chunk, value head) -----------------------------------------------------------
constexpr int kLdK1 = kD + 4;  // Ks, Qs row stride (floats): A loads (g, t) and B loads (n=g, k=t) hit 32 banks
constexpr int kSmem1 = (2 * kC * kLdK1 + kC * kC + 3 * kC) * 4;

template <bool kSeg, int kT>
__global__ void __launch_bounds__(256, 2) wy_kernel(GdnPrefillArgs a0, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  if (int(blockIdx.x) * kC >= a.M) return;  // segments: the grid covers the longest
  extern __shared__ float4 sm4[];
  float* Ks = reinterpret_cast<float*>(sm4);
  float* Qs = Ks + kC * kLdK1;
  float* Ls = Qs + kC * kLdK1;  // [64][64] strict lower
  float* gam = Ls + kC * kC;
  float* bet = gam + kC;
  float* eg = bet + kC;
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = c * kC, n = min(kC, a.M - t0), kh = h / (a.nv / a.nk);
  const int kd = a.nk * kD, vd = a.nv * kD;
  const int nch = kSeg ? (a.M + kC - 1) / kC : int(gridDim.x);
  float* out = a.wy + (size_t(h) * nch + c) * kPer;
  // Q, K rows of the chunk (zero past n), every load of the thread in flight at once.
#pragma unroll
  for (int it = 0; it < kC * (kD / 4) / 256; ++it) {
    const int idx = tid + it * 256, r = idx / (kD / 4), c4 = idx % (kD / 4);
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), qv = kv;
    if (r < n) {
      kv = *reinterpret_cast<const float4*>(a.kn + size_t(t0 + r) * kd + kh * kD + c4 * 4);
      qv = *reinterpret_cast<const float4*>(a.qn + size_t(t0 + r) * kd + kh * kD + c4 * 4);
    }
    *reinterpret_cast<float4*>(Ks + r * kLdK1 + c4 * 4) = kv;
    *reinterpret_cast<float4*>(Qs + r * kLdK1 + c4 * 4) = qv;
  }
  if (warp == 0) {  // γ = inclusive cumsum of g (flat past n), β (0 past n)
    float g0 = lane < n ? a.g[size_t(t0 + lane) * a.nv + h] : 0.f;
    float g1 = lane + 32 < n ? a.g[size_t(t0 + lane + 32) * a.nv + h] : 0.f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float u0 = __shfl_up_sync(0xffffffffu, g0, o), u1 = __shfl_up_sync(0xffffffffu, g1, o);
      if (lane >= o) g0 += u0, g1 += u1;
    }
    g1 += __shfl_sync(0xffffffffu, g0, 31);
    gam[lane] = g0, gam[lane + 32] = g1;
    eg[lane] = expf(g0), eg[lane + 32] = expf(g1);
    bet[lane] = lane < n ? a.beta[size_t(t0 + lane) * a.nv + h] : 0.f;
    bet[lane + 32] = lane + 32 < n ? a.beta[size_t(t0 + lane + 32) * a.nv + h] : 0.f;
    out[kOffG + lane] = g0, out[kOffG + lane + 32] = g1;
  }
  __syncthreads();
  // G = K Kᵀ, Pq = Q Kᵀ: warp → rows rt·16.., columns ch·32.. (4 n-tiles).
  {
    const int g = lane >> 2, t = lane & 3, rt = warp & 3, ch = warp >> 2;
    float accG[4][4] = {}, accP[4][4] = {};
    const int r0 = rt * 16;
#pragma unroll 2
    for (int k0 = 0; k0 < kD; k0 += 8) {
      FragA fk, fq;
      const float* kr = Ks + (r0 + g) * kLdK1 + k0 + t;
      const float* qr = Qs + (r0 + g) * kLdK1 + k0 + t;
      fk.set(kr[0], kr[8 * kLdK1], kr[4], kr[8 * kLdK1 + 4]);
      fq.set(qr[0], qr[8 * kLdK1], qr[4], qr[8 * kLdK1 + 4]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float* br = Ks + (ch * 32 + j * 8 + g) * kLdK1 + k0 + t;
        FragB fb;
        fb.set(br[0], br[4]);
        mma_t<kT>(accG[j], fk, fb);
        mma_t<kT>(accP[j], fq, fb);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + (e >> 1) * 8, jj = ch * 32 + j * 8 + 2 * t + (e & 1);
        const float dec = expf(fminf(gam[i] - gam[jj], 0.f));
        Ls[i * kC + jj] = jj < i ? bet[i] * accG[j][e] * dec : 0.f;
        out[kOffP + i * kC + jj] = jj <= i ? accP[j][e] * dec : 0.f;
      }
  }
  __syncthreads();
  // Forward substitution, one right-hand column per thread: x_i ← b_i − Σ_{j<i} L_ij x_j
  // (L_ij = 0 for j ≥ i, so whole float4 groups up to the diagonal are summed).
  {
    float x[kC];
    if (tid < kD) {
#pragma unroll
      for (int i = 0; i < kC; ++i) x[i] = i < n ? bet[i] * a.v[size_t(t0 + i) * vd + h * kD + tid] : 0.f;
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) x[i] = bet[i] * eg[i] * Ks[i * kLdK1 + tid - kD];
    }
#pragma unroll
    for (int i = 1; i < kC; ++i) {
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
      for (int j = 0; j < i; j += 4) {
        const float4 l = *reinterpret_cast<const float4*>(Ls + i * kC + j);
        s0 = fmaf(l.x, x[j], s0);
        s1 = fmaf(l.y, x[j + 1], s1);
        s2 = fmaf(l.z, x[j + 2], s2);
        s3 = fmaf(l.w, x[j + 3], s3);
      }
      x[i] -= (s0 + s1) + (s2 + s3);
    }
    float* dst = out + (tid < kD ? kOffU + tid : kOffW + tid - kD);
#pragma unroll
    for (int i = 0; i < kC; ++i) dst[i * kD] = x[i];
  }
}

// ---- kernel 2: per (value head, 32-column slice), chunks in order ---------------------------------
constexpr int kLdW = kD + 4, kLdQ = kD + 4, kLdK = kD + 8, kLdU = kCS + 8, kLdP = kC + 4, kLdS = kCS + 8;
constexpr int kSmem2 = (kC * kLdW + kC * kLdQ + kC * kLdK + 2 * kC * kLdU + kC * kLdP + kD * kLdS + 3 * kC) * 4;

template <bool kSeg, int kT>
__global__ void __launch_bounds__(256, 1) state_kernel(GdnPrefillArgs a0, int nch0, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  const int nch = kSeg ? (a.M + kC - 1) / kC : nch0;
  extern __shared__ float4 sm4[];
  float* Ws = reinterpret_cast<float*>(sm4);
  float* Qs = Ws + kC * kLdW;
  float* Ks = Qs + kC * kLdQ;
  float* Us = Ks + kC * kLdK;   // U slice [64][32], then U' in place
  float* Up = Us + kC * kLdU;   // U' [64][32]
  float* Ps = Up + kC * kLdU;
  float* Ss = Ps + kC * kLdP;   // S slice [128][32]
  float* gam = Ss + kD * kLdS;  // γ, then e^γ and e^{γ_n − γ}
  float* eg = gam + kC;
  float* ed = eg + kC;
  const int h = blockIdx.x / kSlices, cs = blockIdx.x % kSlices, kh = h / (a.nv / a.nk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int kd = a.nk * kD, vd = a.nv * kD;
  // The state slice in fp32 for the whole call (the fp16 state converted here, rounded once at the end).
  const size_t s_off = size_t(h) * kD * kD + cs * kCS;
  for (int idx = tid; idx < kD * (kCS / 4); idx += 256) {
    const int r = idx / (kCS / 4), c4 = idx % (kCS / 4);
    const uint2 hv = *reinterpret_cast<const uint2*>(a.S + s_off + size_t(r) * kD + c4 * 4);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&hv.x)), hi = __half22float2(*reinterpret_cast<const __half2*>(&hv.y));
    *reinterpret_cast<float4*>(Ss + r * kLdS + c4 * 4) = make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  // Loads of chunk c in three cp.async groups, each issued as soon as the previous chunk's last
  // reader is done and waited for just before its first reader: G1 = W, U slice, γ (step 1 and the
  // decay setup); G2 = Q, P (step 2); G3 = K (step 3). Empty groups keep the count uniform.
  auto load0 = [&](int c) {
    const float* src = a.wy + (size_t(h) * nch + c) * kPer;
    for (int idx = tid; idx < kC * (kD / 4); idx += 256) {
      const int r = idx / (kD / 4), c4 = idx % (kD / 4);
      cp16(Ws + r * kLdW + c4 * 4, src + kOffW + r * kD + c4 * 4, true);
    }
    for (int idx = tid; idx < kC * (kCS / 4); idx += 256) {
      const int r = idx / (kCS / 4), c4 = idx % (kCS / 4);
      cp16(Us + r * kLdU + c4 * 4, src + kOffU + r * kD + cs * kCS + c4 * 4, true);
    }
    if (tid < kC / 4) cp16(gam + tid * 4, src + kOffG + tid * 4, true);
  };
  auto load_qp = [&](int c) {
    const float* src = a.wy + (size_t(h) * nch + c) * kPer;
    const int t0 = c * kC, n = min(kC, a.M - t0);
    for (int idx = tid; idx < kC * (kD / 4); idx += 256) {
      const int r = idx / (kD / 4), c4 = idx % (kD / 4);
      cp16(Qs + r * kLdQ + c4 * 4, a.qn + size_t(t0 + (r < n ? r : 0)) * kd + kh * kD + c4 * 4, r < n);
    }
    for (int idx = tid; idx < kC * (kC / 4); idx += 256) {
      const int r = idx / (kC / 4), c4 = idx % (kC / 4);
      cp16(Ps + r * kLdP + c4 * 4, src + kOffP + r * kC + c4 * 4, true);
    }
  };
  auto load_k = [&](int c) {
    const int t0 = c * kC, n = min(kC, a.M - t0);
    for (int idx = tid; idx < kC * (kD / 4); idx += 256) {
      const int r = idx / (kD / 4), c4 = idx % (kD / 4);
      cp16(Ks + r * kLdK + c4 * 4, a.kn + size_t(t0 + (r < n ? r : 0)) * kd + kh * kD + c4 * 4, r < n);
    }
  };
  load0(0);
  cp_commit();
  load_qp(0);
  cp_commit();
  load_k(0);
  cp_commit();
  for (int c = 0; c < nch; ++c) {
    const int t0 = c * kC, n = min(kC, a.M - t0);
    cp_wait<2>();  // G1(c)
    __syncthreads();
    if (tid < kC) eg[tid] = expf(gam[tid]), ed[tid] = expf(gam[kC - 1] - gam[tid]);
    const float egn = expf(gam[kC - 1]);
    // Step 1: U' = U − W·S (64×32): warp → row tile rt, column tiles ct0, ct0+1.
    const int rt = warp & 3, ct0 = (warp >> 2) * 2, r0 = rt * 16;
    {
      float acc[2][4] = {};
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 8) {
        FragA fa;
        const float* ar = Ws + (r0 + g) * kLdW + k0 + t;
        fa.set(ar[0], ar[8 * kLdW], ar[4], ar[8 * kLdW + 4]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float* br = Ss + (k0 + t) * kLdS + (ct0 + j) * 8 + g;
          FragB fb;
          fb.set(br[0], br[4 * kLdS]);
          mma_t<kT>(acc[j], fa, fb);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = r0 + g + (e >> 1) * 8, col = (ct0 + j) * 8 + 2 * t + (e & 1);
          Up[i * kLdU + col] = Us[i * kLdU + col] - acc[j][e];
        }
    }
    cp_wait<1>();     // G2(c): Q, P
    __syncthreads();  // U' complete; W, U, γ free
    if (c + 1 < nch) load0(c + 1);
    cp_commit();
    // Step 2: O = diag(e^γ)·Q·S + P·U' (P lower triangular: k past the row tile is zero).
    {
      float acc[2][4] = {};
#pragma unroll 4
      for (int k0 = 0; k0 < kD; k0 += 8) {
        FragA fa;
        const float* ar = Qs + (r0 + g) * kLdQ + k0 + t;
        fa.set(ar[0], ar[8 * kLdQ], ar[4], ar[8 * kLdQ + 4]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float* br = Ss + (k0 + t) * kLdS + (ct0 + j) * 8 + g;
          FragB fb;
          fb.set(br[0], br[4 * kLdS]);
          mma_t<kT>(acc[j], fa, fb);
        }
      }
      const float e0 = eg[r0 + g], e1 = eg[r0 + g + 8];
#pragma unroll
      for (int j = 0; j < 2; ++j) acc[j][0] *= e0, acc[j][1] *= e0, acc[j][2] *= e1, acc[j][3] *= e1;
      for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
        FragA fa;
        const float* ar = Ps + (r0 + g) * kLdP + k0 + t;
        fa.set(ar[0], ar[8 * kLdP], ar[4], ar[8 * kLdP + 4]);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float* br = Up + (k0 + t) * kLdU + (ct0 + j) * 8 + g;
          FragB fb;
          fb.set(br[0], br[4 * kLdU]);
          mma_t<kT>(acc[j], fa, fb);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int i = r0 + g + hr * 8, col = cs * kCS + (ct0 + j) * 8 + 2 * t;
          if (i < n)
            *reinterpret_cast<float2*>(a.o_raw + size_t(t0 + i) * vd + h * kD + col) =
                make_float2(acc[j][2 * hr], acc[j][2 * hr + 1]);
        }
    }
    cp_wait<1>();     // G3(c): K
    __syncthreads();  // every read of Q and P done
    if (c + 1 < nch) load_qp(c + 1);
    cp_commit();
    // Step 3: S ← e^{γ_n}·S + Kdᵀ·U' (128×32, k = 64 tokens): warp → rows warp·16.., all 4 column tiles.
    float accS[4][4];
    {
      const int m0 = warp * 16;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) accS[j][e] = egn * Ss[(m0 + g + (e >> 1) * 8) * kLdS + j * 8 + 2 * t + (e & 1)];
#pragma unroll 2
      for (int k0 = 0; k0 < kC; k0 += 8) {
        FragA fa;  // A[m][k] = ed[k]·K[k][m]
        const float d0 = ed[k0 + t], d1 = ed[k0 + t + 4];
        const float* ar = Ks + (k0 + t) * kLdK + m0 + g;
        fa.set(d0 * ar[0], d0 * ar[8], d1 * ar[4 * kLdK], d1 * ar[4 * kLdK + 8]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float* br = Up + (k0 + t) * kLdU + j * 8 + g;
          FragB fb;
          fb.set(br[0], br[4 * kLdU]);
          mma_t<kT>(accS[j], fa, fb);
        }
      }
    }
    __syncthreads();  // every read of S, K, U', e^γ done
    if (c + 1 < nch) load_k(c + 1);
    cp_commit();
    {
      const int m0 = warp * 16;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          *reinterpret_cast<float2*>(Ss + (m0 + g + hr * 8) * kLdS + j * 8 + 2 * t) = make_float2(accS[j][2 * hr], accS[j][2 * hr + 1]);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kD * (kCS / 4); idx += 256) {
    const int r = idx / (kCS / 4), c4 = idx % (kCS / 4);
    const float4 v = *reinterpret_cast<const float4*>(Ss + r * kLdS + c4 * 4);
    const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
    uint2 hv;
    hv.x = *reinterpret_cast<const uint32_t*>(&lo), hv.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(a.S + s_off + size_t(r) * kD + c4 * 4) = hv;
  }
}

}  // namespace

size_t gdn_wy_floats(int M, int nv) { return size_t((M + kC - 1) / kC) * nv * kPer; }

template <int kT> Status chunk_launch_t(const GdnPrefillArgs& a, const GdnPrefillArgs* segs, int n_seg, cudaStream_t s) {
  static bool attr = false;
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(wy_kernel<false, kT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem1));
    LILY_CU_TRY(cudaFuncSetAttribute(wy_kernel<true, kT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem1));
    LILY_CU_TRY(cudaFuncSetAttribute(state_kernel<false, kT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem2));
    LILY_CU_TRY(cudaFuncSetAttribute(state_kernel<true, kT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem2));
    attr = true;
  }
  const int nch = (a.M + kC - 1) / kC;
  if (segs) wy_kernel<true, kT><<<dim3(nch, a.nv, n_seg), 256, kSmem1, s>>>(a, segs);
  else wy_kernel<false, kT><<<dim3(nch, a.nv), 256, kSmem1, s>>>(a, nullptr);
  LILY_TRY(launch_status("pf::gdn_wy"));
  if (a.prof) a.prof(a.prof_ctx, kT == 1 ? "gdn: chunk WY factors (tensor cores, single pass)" : "gdn: chunk WY factors (tensor cores)");
  if (segs) state_kernel<true, kT><<<dim3(a.nv * kSlices, 1, n_seg), 256, kSmem2, s>>>(a, nch, segs);
  else state_kernel<false, kT><<<a.nv * kSlices, 256, kSmem2, s>>>(a, nch, nullptr);
  LILY_TRY(launch_status("pf::gdn_chunk_state"));
  if (a.prof) a.prof(a.prof_ctx, kT == 1 ? "gdn: chunk state + output (tensor cores, single pass)" : "gdn: chunk state + output (tensor cores)");
  return Status::ok();
}

// The two kernels over one sequence's M tokens (segs null: a, grid z = 1) or over n_seg segments
// (segs: device array of their args, grid z = segment, x sized for the longest; a holds the longest M and
// the terms every segment runs).
static Status chunk_launch(const GdnPrefillArgs& a, const GdnPrefillArgs* segs, int n_seg, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.terms == 1) return chunk_launch_t<1>(a, segs, n_seg, s);
  if (a.terms == 3) return chunk_launch_t<3>(a, segs, n_seg, s);
  return cu_err("pf::gdn_chunk: terms {} (1 or 3)", a.terms);
}

Status gdn_chunk_scan(const GdnPrefillArgs& a, Stream stream) { return chunk_launch(a, nullptr, 1, stream); }

Status gdn_chunk_scan_segments(const GdnPrefillArgs& longest, const GdnPrefillArgs* segs, int n_seg, Stream stream) {
  return chunk_launch(longest, segs, n_seg, stream);
}

}  // namespace lily::cuda::pf
