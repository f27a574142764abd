// The per-instruction-set DeltaNet prefill kernels (fast_gdn_impl.inc compiled three times), for
// the kernel tables of fast_kernels_{scalar,avx2,avx512}.cpp.
#pragma once
#include <cstddef>

#include "backend/cpu/fast_kernels.h"

namespace lily::cpu::fast {

void gdn_chunk_scalar(const GdnChunkArgs& a);
void conv4_silu_scalar(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window, float* out);
void gated_norm_scalar(float* o, const float* z, const bf16* w, int rows, int dv, float eps);
void silu_mul_scalar(float* g, const float* u, size_t n);
void rmsnorm_scalar(const float* x, int rows, int n, const float* gain, float eps, float* out);

void gdn_chunk_avx2(const GdnChunkArgs& a);
void conv4_silu_avx2(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window, float* out);
void gated_norm_avx2(float* o, const float* z, const bf16* w, int rows, int dv, float eps);
void silu_mul_avx2(float* g, const float* u, size_t n);
void rmsnorm_avx2(const float* x, int rows, int n, const float* gain, float eps, float* out);

void gdn_chunk_avx512(const GdnChunkArgs& a);
void conv4_silu_avx512(const float* u, int M, int ldu, int c0, int c1, int C, const bf16* w, float* window, float* out);
void gated_norm_avx512(float* o, const float* z, const bf16* w, int rows, int dv, float eps);
void silu_mul_avx512(float* g, const float* u, size_t n);
void rmsnorm_avx512(const float* x, int rows, int n, const float* gain, float eps, float* out);

}  // namespace lily::cpu::fast
