// Plain CPU reference ops (scalar loops, fp32 accumulation). Activations are fp32 arrays.
// Storage points go through store(): by default the reference keeps activations in fp32 (the
// closest match to transformers in fp32, and immune to bf16-induced routing flips); with
// set_bf16_storage(true) it rounds to bf16 exactly where model-spec §1.5 stores bf16, which is
// what the fast paths do (KV cache included).
// These are the reference every faster kernel is tested against: keep them readable.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "model/weights.h"

namespace lily::cpu {

// Storage precision of activations (process-wide; LILY_CPU_STORAGE=bf16 sets it at start-up).
void set_bf16_storage(bool on);
bool bf16_storage();
// A value at a bf16 storage point of model-spec §1.5: rounded in bf16 mode, kept otherwise.
inline float store(float v) { return bf16_storage() ? round_bf16(v) : v; }

// y[m, r] = Σ_g scale[r,g]·Σ_{c∈g} q[r,c]·x[m,c] + bias[r,g]·Σ_{c∈g} x[m,c]   (fp32)
// x: [M, w.cols] (row stride ldx), y: [M, w.rows] (row stride ldy). round: pass through store().
void qmatmul(const QWeight& w, const float* x, int M, int ldx, float* y, int ldy, bool round);

// out[i, :] = store(scale·q + bias) of row ids[i]. out: [n, H]
void embed_rows(const QWeight& e, std::span<const int32_t> ids, float* out);

// out[m] = store(x[m]·rsqrt(mean(x[m]²)+eps)·gain). x, out: [M, n]; gain: [n] bf16 (may alias).
void rmsnorm(const float* x, int M, int n, const bf16* gain, float eps, float* out);

// Causal depthwise conv (kernel K) + SiLU over C channels for M tokens, continuing from
// window [C, K-1] (oldest first), which is advanced in place.
// u: [M, ldu] (first C columns used), w: [C, K] bf16, out: [M, C].
void conv_silu(const float* u, int M, int ldu, int C, int K, const bf16* w, float* window, float* out);

struct GdnDims {
  int n_k_heads, n_v_heads, dk, dv;
};
// Splits the conv output c [M, 2·n_k_heads·dk + n_v_heads·dv] into q̂ = q/√(Σq²+ε)·dk^-½ and
// k̂ = k/√(Σk²+ε) [M, n_k_heads, dk] (fp32, ε = 1e-6 as HF's l2norm) and v [M, n_v_heads, dv].
void gdn_split_qkv(const GdnDims& d, int M, const float* c, float* q, float* k, float* v);
// Gates per token and v-head: beta = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias) (log decay).
// a, b, g, beta: [M, n_v_heads]; A_log: [n_v_heads] fp32; dt_bias: [n_v_heads] bf16.
void gdn_gates(int M, int n_v_heads, const float* a, const float* b, const float* A_log, const bf16* dt_bias,
               float* g, float* beta);

// Per-token GDN inputs after the conv: q, k [M, n_k_heads, dk] (already L2-normalized, q
// scaled by dk^-1/2, fp32), v [M, n_v_heads, dv], gate g (log decay) and beta [M, n_v_heads].
// State S: [n_v_heads, dk, dv] fp32. out: [M, n_v_heads, dv] fp32 (caller rounds).
void gdn_recurrent(const GdnDims& d, int M, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, float* out);
// The chunked (WY) form of model-spec §1.4.2 with chunk C; same contract as gdn_recurrent.
void gdn_chunked(const GdnDims& d, int M, int chunk, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, float* S, float* out);

// Partial NeoX RoPE in place on the first rot dims of each of n_heads vectors of size hd.
void rope_neox(float* x, int n_heads, int hd, int rot, int pos, double theta);

// One token's expert choice: softmax of the E router logits in fp32, the top_k largest (ties → lowest id),
// their weights renormalized over the k chosen when norm. ids, w: [top_k], best first.
void route_topk(const float* logits, int E, int top_k, bool norm, int* ids, float* w);

}  // namespace lily::cpu
