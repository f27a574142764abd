// Prefill GEMM for 4-bit weights with fp32 activations (QArgs.xf, rows ids[0..n)): a panel of rows
// is dequantized once to fp32 (w = fma(scale, q, bias)) with rows in lanes, then reused by every
// token block through broadcast-x FMAs. Used when a QJob carries no PreparedX (x == nullptr).
// Exact fp32 weights and activations: only the summation order differs from ref_ops.
#pragma once
#include "backend/cpu/fast_kernels.h"

namespace lily::cpu::fast {

void q4_gemm_scalar(const QArgs& a);
void q4_gemm_avx2(const QArgs& a);
void q4_gemm_avx512(const QArgs& a);
// Few tokens (≤ kThinMaxTokens; the routed experts), k in lanes, dequant in registers
// (fast_gemm_thin_avx512.cpp); q4_gemm_avx512 hands it jobs of ≤ 12 tokens.
constexpr int kThinMaxTokens = 12;
void q4_gemm_thin_avx512(const QArgs& a);

}  // namespace lily::cpu::fast
