// Fast CPU kernels: quantized matvec/matmul straight from the packed MLX layout, and the vector
// helpers of DeltaNet and attention. One table per instruction set (scalar, AVX2, AVX-512+VNNI),
// chosen at run time (fast_ops.cpp); every entry is tested against ref_ops (cpu_fast_test.cpp).
//
// Key decision: activations enter the 4-bit kernels as two int16 terms per group of 64,
// x ≈ dx·(hi + lo/65534) with dx = max|x_g|/32767, so the inner product is exact integer arithmetic
// (vpdpwssd / vpmaddwd) and the representation error is ≤ max|x_g|/(2·32767·65534) ≈ 2.3e-10·max|x_g|,
// below fp32 rounding: fp32-activation accuracy (a single int16 term was measured to move golden
// logits by up to 0.47 through MoE routing near-ties). The bias term uses the exact fp32 Σx.
// The 8-bit weights (router, shared-expert gate) use fp32 activations.
#pragma once
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace lily::cpu::fast {

constexpr int kGroup = 64;          // the only group size the fast kernels take
constexpr int kPairsPerGroup = 32;  // int32 pairs of int16 per group (64 values)
constexpr float kLoScale = 1.0f / 65534.0f;  // weight of the lo term

// Activation rows quantized for the 4-bit kernels. For row m, group g, j ∈ [0,4), w ∈ [0,8):
//   pairs[(m·G + g)·32 + j·8 + w] = hi(x[64g+8w+j]) | hi(x[64g+8w+4+j]) << 16   (int16 halves)
// (the order in which a packed u32 word's nibbles come out of one shift-and-mask), lo likewise, and
//   x ≈ dx[m·G + g]·(hi + lo/65534);  xsum[m·G + g] = Σ x over the group (fp32, exact input).
struct PreparedX {
  int M = 0, K = 0, G = 0;
  std::vector<int32_t> pairs;  // [M, G, 32] hi terms
  std::vector<int32_t> lo;     // [M, G, 32] lo terms (residual·65534)
  std::vector<float> dx;       // [M, G]
  std::vector<float> xsum;     // [M, G]
  const int32_t* row_pairs(int m) const { return pairs.data() + size_t(m) * G * kPairsPerGroup; }
  const int32_t* row_lo(int m) const { return lo.data() + size_t(m) * G * kPairsPerGroup; }
  const float* row_dx(int m) const { return dx.data() + size_t(m) * G; }
  const float* row_xsum(int m) const { return xsum.data() + size_t(m) * G; }
};

// Quantizes x [M, K] (row stride ldx, K a multiple of 64) into out (resized as needed).
void prepare_x(const float* x, int M, int ldx, int K, PreparedX& out);

// One quantized matmul: y[i·ldy + r] = Σ_c w[r,c]·x[ids[i], c] for all rows r and i < n.
// 4-bit weights take x (PreparedX), 8-bit weights take xf (fp32 rows, stride ldxf).
// A 4-bit job without x (nullptr) runs the fp32 GEMM on xf (prefill); with x, the int16 matvec (decode).
struct QJob {
  const QWeight* w = nullptr;
  const PreparedX* x = nullptr;
  const float* xf = nullptr;
  int ldxf = 0;
  const int32_t* ids = nullptr;
  int n = 0;
  float* y = nullptr;
  int ldy = 0;
};
// One piece of a QJob handed to a kernel: its rows [r0, r1).
struct QArgs : QJob {
  int r0 = 0, r1 = 0;
};

// One chunk (n ≤ 64 tokens) of the chunked (WY) DeltaNet prefill of model-spec §1.4.2 for one key
// head and the n_heads value heads that share it (fast_gdn_impl.inc). Token i, value head j:
//   q, k: q + i·ldqk, k + i·ldqk [dk] (normalized as gdn_step takes them);  v: v + i·ldv + j·dv [dv];
//   g (log decay ≤ 0), beta: g[i·ldg + j], beta[i·ldg + j];  state S + j·dk·dv [dk, dv] fp32, in place;
//   out: out + i·ldo + j·dv [dv].  dk, dv: multiples of 64.  ws: gdn_chunk_ws_floats(dk, dv) floats.
struct GdnChunkArgs {
  int n = 0, dk = 0, dv = 0, n_heads = 0;
  const float *q = nullptr, *k = nullptr;
  int ldqk = 0;
  const float* v = nullptr;
  int ldv = 0;
  const float *g = nullptr, *beta = nullptr;
  int ldg = 0;
  float* S = nullptr;
  float* out = nullptr;
  int ldo = 0;
  float* ws = nullptr;
};
constexpr int kGdnChunk = 64;
inline size_t gdn_chunk_ws_floats(int dk, int dv) {
  const size_t C = kGdnChunk;
  return 3 * C * dk + 2 * size_t(dk) * C + 5 * C * C + 2 * C * (dk + dv) + 64;
}

// The entries written once over a vector type in fast_gdn_impl.inc and compiled per instruction set
// (fast_gdn_kernels.h): DeltaNet prefill, and the elementwise and norm rows that share its vector code.
struct GdnKernels {
  // DeltaNet prefill, one chunk (GdnChunkArgs above).
  void (*gdn_chunk)(const GdnChunkArgs& a);
  // Causal depthwise conv (kernel 4) + SiLU of channels [c0, c1) of C, for M tokens: the contract of
  // ref_ops::conv_silu with K = 4 (u [M, ldu], w [C, 4] bf16, window [C, 3] advanced, out [M, C]),
  // fp32 storage (the caller rounds when bf16 storage is on).
  void (*conv4_silu)(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window, float* out);
  // Gated RMSNorm of DeltaNet's output (model-spec §1.4.2), rows of dv in place:
  // o = w ⊙ o·rsqrt(mean(o²)+eps) ⊙ SiLU(z); o, z: [rows, dv]; w: [dv] bf16 (fp32 storage).
  void (*gated_norm)(float* o, const float* z, const bf16* w, int rows, int dv, float eps);
  // MoE SwiGLU (model-spec §1.4.3): g[i] = SiLU(g[i])·u[i], fp32 storage.
  void (*silu_mul)(float* g, const float* u, size_t n);
  // out[r] = x[r]·rsqrt(mean(x[r]²)+eps)·gain, rows of n (a multiple of 16), gain fp32, fp32 storage.
  void (*rmsnorm)(const float* x, int rows, int n, const float* gain, float eps, float* out);
  // Attention of one query row over positions 0..n-1 (model-spec §1.4.1) for the G query heads sharing one
  // KV head: out_g = Σ_t softmax_t(q_g·k_t·scale)·v_t. q, out: [G][hd] (any hd; vector code where it is a
  // multiple of the table's width); k_t, v_t at k + t·ld, v + t·ld [hd]; p: scratch of G·n floats (the
  // probabilities on return).
  void (*attend)(const float* q, int G, int hd, const float* k, const float* v, int ld, int n, float scale, float* p,
                 float* out);
};

// One instruction set's kernels, initialized as {gdn kernels, name, q4_rows, ...} (the base first).
struct KernelTable : GdnKernels {
  const char* name;
  // 4-bit weights, int16 activations (PreparedX).
  void (*q4_rows)(const QArgs& a);
  // 4-bit weights, fp32 activations (xf): the prefill GEMM (fast_gemm.h).
  void (*q4_gemm)(const QArgs& a);
  // 8-bit weights, fp32 activations.
  void (*q8_rows)(const QArgs& a);
  // Σ a[i]·b[i] (fp32).
  float (*dot)(const float* a, const float* b, int n);
  // y[i] += s·x[i]
  void (*axpy)(float* y, float s, const float* x, int n);
  // One delta-rule step of one value head (model-spec §1.4.2), fused to two passes over S:
  // S [dk, dv] fp32 in place, row stride ldS (≥ dv); q, k [dk] (normalized); v, out [dv]; alpha = e^g; beta.
  // Columns of S evolve independently, so a block of columns (S + j0, v + j0, out + j0, dv = width,
  // ldS = the full width) is one valid call: prefill runs L1-sized column blocks over all tokens.
  void (*gdn_step)(float* S, const float* q, const float* k, const float* v, float alpha, float beta,
                   float* out, int dk, int dv, int ldS);
  // The fp32 FMA rate of one core: iters rounds of independent register-wide FMA chains (no memory);
  // returns the FLOPs done, the result's sum in *sink. For bench-cpu's compute peak (fast_membw.h).
  double (*fma_flops)(long iters, float* sink);
};

const KernelTable& scalar_table();
const KernelTable& scalar_f32_table();  // fp32 activations in the 4-bit kernel (slow; accuracy reference)
const KernelTable* avx2_table();    // nullptr when not compiled in
const KernelTable* avx512_table();  // nullptr when not compiled in

}  // namespace lily::cpu::fast
