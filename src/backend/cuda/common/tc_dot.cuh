// Tensor-core dot products of 4-bit weight rows with an fp32 vector, shared by the decode GEMV
// (gemv_tc.cu) and the MoE expert kernels (moe_tc.cu). x is staged once per block as 4 signed
// 7-bit limbs against one power-of-two scale S (x·S = L0 + L1/128 + L2/128² + L3/128³, |x·S| ≤ 64:
// 27 bits below the largest |x|), the 4 used columns of B of mma.sync m16n8k32 s8·s8 → s32 (exact);
// weight codes 0..15 are A. Per group of 64 codes and 16 rows a warp issues 2 MMAs; lane t of each
// quad folds its two limb columns (t 0: limbs 0, 1; t 1: limbs 2, 3), lane t 2 the bias term:
// row value = (Σ_g s_g·Σq·(x·S) + b_g·Σx·S) / S, summed over the quad.
#pragma once
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {

constexpr float kTcMagic = 12582912.0f;  // 1.5·2^23: y + kTcMagic holds rint(y) in its low mantissa bits
constexpr int kTcMagicBits = 0x4B400000;

__device__ __forceinline__ void tc_mma(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1, int c0, int c1, int c2, int c3) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
// Low bytes of a, b, c, d packed into one word (a lowest).
__device__ __forceinline__ uint32_t tc_pack4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Shared memory of the staged x: B limbs [K/64 groups][t 4][limb 4][16 B] + Σx·S per group [K/64] floats.
// The 16-byte record (group G, t, limb c) holds the limb of codes 16t+{0,2,4,6}, 16t+{1,3,5,7},
// 16t+8+{0,2,4,6}, 16t+8+{1,3,5,7} of G: b0/b1 of the group's two k32 MMAs, matching
// A = word & 0x0F0F0F0F (even codes) and (word >> 4) & 0x0F0F0F0F (odd codes).
__host__ __device__ constexpr int tc_stage_bytes(int K) { return K / 64 * 256 + K / 64 * 4; }

// Per-lane fold coefficients (see the header comment).
struct TcLane {
  float c0, c1, cb;
  __device__ __forceinline__ TcLane() {
    const int t = threadIdx.x & 3;
    c0 = t == 0 ? 1.f : (t == 1 ? 1.f / 16384 : 0.f);
    c1 = t == 0 ? 1.f / 128 : (t == 1 ? 1.f / 2097152 : 0.f);
    cb = t == 2 ? 1.f : 0.f;
  }
};

// B fragment of group G for this lane (zeros for the unused columns 4..7).
__device__ __forceinline__ uint4 tc_bfrag(const uint8_t* bs, int G) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  return g < 4 ? *reinterpret_cast<const uint4*>(bs + ((G * 4 + t) * 4 + g) * 16) : make_uint4(0, 0, 0, 0);
}
// One group (64 codes) of rows g (w0: this lane's 8 bytes of it) and g+8 (w1): v0, v1 = this lane's
// limb fold of Σq·(x·S) for the two rows.
__device__ __forceinline__ void tc_group(uint2 w0, uint2 w1, uint4 bq, const TcLane& L, float& v0, float& v1) {
  const uint32_t m = 0x0F0F0F0Fu;
  int d[4];
  // C starts at the bits of kTcMagic, so each s32 result read as fp32 is kTcMagic + Σ (|Σ| < 2^22).
  tc_mma(d, w0.x & m, w1.x & m, (w0.x >> 4) & m, (w1.x >> 4) & m, bq.x, bq.y, kTcMagicBits, kTcMagicBits, kTcMagicBits,
         kTcMagicBits);
  tc_mma(d, w0.y & m, w1.y & m, (w0.y >> 4) & m, (w1.y >> 4) & m, bq.z, bq.w, d[0], d[1], d[2], d[3]);
  v0 = fmaf(__int_as_float(d[1]) - kTcMagic, L.c1, (__int_as_float(d[0]) - kTcMagic) * L.c0);
  v1 = fmaf(__int_as_float(d[3]) - kTcMagic, L.c1, (__int_as_float(d[2]) - kTcMagic) * L.c0);
}
// acc += s·v + b·xsb (sb: the row's interleaved bf16 scale/bias of the group; xsb = Σx·S · cb).
__device__ __forceinline__ float tc_fold(float acc, uint32_t sb, float v, float xsb) {
  return fmaf(__uint_as_float(sb << 16), v, fmaf(__uint_as_float(sb & 0xFFFF0000u), xsb, acc));
}
// Sum over the lane quad (t 0..3): the full row value in S units (every lane of the quad).
__device__ __forceinline__ float tc_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The 4 limbs of one octet y[0..7] (values x·S of codes 8o .. 8o+7, |y| ≤ 64) into its records: rec
// points at record (G, t, limb 0) of the octet's group and quad, word = o & 1 picks the 8-byte half.
// y is consumed (left holding the last remainder).
__device__ __forceinline__ void tc_put_limbs(float (&y)[8], uint8_t* rec, int word) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t tb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float tm = y[i] + kTcMagic;
      tb[i] = __float_as_uint(tm);
      y[i] = (y[i] - (tm - kTcMagic)) * 128.f;
    }
    *reinterpret_cast<uint2*>(rec + c * 16 + word * 8) =
        make_uint2(tc_pack4(tb[0], tb[2], tb[4], tb[6]), tc_pack4(tb[1], tb[3], tb[5], tb[7]));
  }
}
// S = 2^(6−e) with bound < 2^e, so |x·S| ≤ 64 (a few ulps over at most: rint gives ≤ 64); returns S, sets invS.
__device__ __forceinline__ float tc_scale(float bound, float& invS) {
  int e = int((__float_as_uint(bound) >> 23) & 0xFF) - 126;
  e = e < -100 ? -100 : e;
  invS = __uint_as_float(uint32_t(127 - 6 + e) << 23);
  return __uint_as_float(uint32_t(127 + 6 - e) << 23);
}

// Stages x (K a multiple of 64, K ≤ 8·256·NO) into bs / xs_g; whole block (256 threads, 8 warps),
// octet o = 8 consecutive elements taken by thread o mod 256. ADDNORM: r = in + mix (mix may be
// null), block 0 writes r to res_out (if set), x = r·rsqrt(mean r² + eps)·gain (gn: this thread's
// gains, loaded before the PDL wait), block 0 writes x to n_out (if set); else x = in.
// Returns 1/S. Ends with the block barrier of its reductions only: the caller syncs before reading bs.
template <bool ADDNORM, int NO>
__device__ __forceinline__ float tc_stage(const float* in, const float* mix, const float (&gn)[NO][8], int K, float eps,
                                          float* res_out, float* n_out, uint8_t* bs, float* xs_g, float* red) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_oct = K / 8;
  float v[NO][8];
  float ss = 0.f, m = 0.f;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int o = tid + 256 * j;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[j][i] = 0.f;
    if (o < n_oct) {
      const float4 f0 = __ldcg(reinterpret_cast<const float4*>(in) + 2 * o);
      const float4 f1 = __ldcg(reinterpret_cast<const float4*>(in) + 2 * o + 1);
      v[j][0] = f0.x, v[j][1] = f0.y, v[j][2] = f0.z, v[j][3] = f0.w;
      v[j][4] = f1.x, v[j][5] = f1.y, v[j][6] = f1.z, v[j][7] = f1.w;
      if (ADDNORM && mix) {
        const float4 m0 = __ldcg(reinterpret_cast<const float4*>(mix) + 2 * o);
        const float4 m1 = __ldcg(reinterpret_cast<const float4*>(mix) + 2 * o + 1);
        v[j][0] += m0.x, v[j][1] += m0.y, v[j][2] += m0.z, v[j][3] += m0.w;
        v[j][4] += m1.x, v[j][5] += m1.y, v[j][6] += m1.z, v[j][7] += m1.w;
      }
      if (ADDNORM && res_out && blockIdx.x == 0 && blockIdx.y == 0) {
        reinterpret_cast<float4*>(res_out)[2 * o] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
        reinterpret_cast<float4*>(res_out)[2 * o + 1] = make_float4(v[j][4], v[j][5], v[j][6], v[j][7]);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (ADDNORM) ss += v[j][i] * v[j][i], m = fmaxf(m, fabsf(v[j][i] * gn[j][i]));
      else m = fmaxf(m, fabsf(v[j][i]));
    }
  }
  ss = warp_sum(ss), m = warp_max(m);
  if (lane == 0) red[warp] = ss, red[32 + warp] = m;
  __syncthreads();
  ss = 0.f, m = 0.f;
#pragma unroll
  for (int w = 0; w < 8; ++w) ss += red[w], m = fmaxf(m, red[32 + w]);
  float bound = m;
  if (ADDNORM) {
    const float inv = 1.0f / sqrtf(ss / float(K) + eps);
    const bool wn = n_out && blockIdx.x == 0 && blockIdx.y == 0;
#pragma unroll
    for (int j = 0; j < NO; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[j][i] = v[j][i] * inv * gn[j][i];
        const int e = 8 * (tid + 256 * j) + i;
        if (wn && e < K) n_out[e] = v[j][i];
      }
    bound = m * inv;
  }
  float invS;
  const float S = tc_scale(bound, invS);
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int o = tid + 256 * j;
    // Group sum (8 octets = 8 consecutive lanes; the octet count is a multiple of 8, so a group is
    // either wholly in range or wholly out).
    float gs = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) gs += v[j][i];
    gs += __shfl_xor_sync(0xffffffffu, gs, 1);
    gs += __shfl_xor_sync(0xffffffffu, gs, 2);
    gs += __shfl_xor_sync(0xffffffffu, gs, 4);
    if (o < n_oct) {
      if ((o & 7) == 0) xs_g[o / 8] = gs * S;
      float y[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = v[j][i] * S;
      const int G = o / 8, t = (o & 7) >> 1;
      tc_put_limbs(y, bs + (G * 4 + t) * 4 * 16, o & 1);
    }
  }
  return invS;
}

}  // namespace lily::cuda
