// Drivers of the fast DeltaNet prefill kernels over the thread pool: the chunked (WY) form of the
// recurrence (chunk 64, key heads over the pool, the state carried across chunks), the kernel-4
// causal conv + SiLU (channel blocks over the pool) and the gated RMSNorm (rows over the pool).
#pragma once
#include "backend/cpu/ref_ops.h"
#include "core/bf16.h"

namespace lily::cpu::fast {

// Whether gdn_chunked takes these dims (dk, dv multiples of 64, whole value heads per key head).
bool gdn_chunked_ok(const GdnDims& d);
// ref_ops::gdn_chunked's contract with chunk 64: q, k [M, n_k_heads, dk] normalized; v [M, n_v_heads, dv];
// g (log decay), beta [M, n_v_heads]; S [n_v_heads, dk, dv] fp32 in place; out [M, n_v_heads, dv].
void gdn_chunked(const GdnDims& d, int M, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* S, float* out);

// ref_ops::conv_silu with K = 4 (out [M, C], window [C, 3] advanced), fp32 storage.
void conv4_silu(const float* u, int M, int ldu, int C, const bf16* w, float* window, float* out);
// ref_ops::conv_silu's contract (store() on the outputs): conv4_silu when K = 4, else the reference.
void conv_silu(const float* u, int M, int ldu, int C, int K, const bf16* w, float* window, float* out);

// DeltaNet's gated RMSNorm (model-spec §1.4.2) per row of dv, in place; o, z: [rows, dv]; w: [dv]:
// o = store(w ⊙ õ·rsqrt(mean(õ²)+eps) ⊙ SiLU(z)) with õ = store(o). The vector kernel when storage is
// fp32 and dv is a multiple of 16 up to 512, else a scalar loop.
void gated_norm(float* o, const float* z, const bf16* w, int rows, int dv, float eps);

// The MoE's SwiGLU product in place: g[i] = store(SiLU(store(g[i]))·store(u[i])), over the pool.
void silu_mul(float* g, const float* u, size_t n);

// ref_ops::rmsnorm's contract (store() on the outputs), rows over the pool; the vector kernel when
// storage is fp32 and n is a multiple of 16, else the reference.
void rmsnorm(const float* x, int M, int n, const bf16* gain, float eps, float* out);

}  // namespace lily::cpu::fast
