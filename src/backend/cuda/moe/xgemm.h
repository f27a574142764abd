// xgemm: the batched step's expert GEMMs (qgemm's items mode, gemm/qgemm.h) on expert weights laid out
// in the MMA's fragment order, so each warp streams its weights from HBM straight into registers: no
// shared-memory staging of weights, no swizzle arithmetic, one 16-byte load per lane per 64-group.
// Why: docs/perf/2026-12-05-qgemm-experts.md (qgemm's expert tiles are issue-bound at ~800 instructions
// a warp per 256-k stage). The arithmetic is qgemm's (same fragments, k order, per-group partial sums
// and epilogue), so a row's results equal qgemm's items mode bit for bit.
//
// Fragment layout of a 4-bit MLX matrix (FragW): blocks of 16 weight rows, each block's K/64 groups in
// order, each group 512 bytes: lane L = 4·gq + tq holds the code words 2tq, 2tq+1 (of the group's 8) of
// the block's rows r0(gq) and r1(gq) — {r0 w0, r0 w1, r1 w0, r1 w1}, the A fragments of the group's four
// k-steps; and per group 8 × {sb(r0), sb(r1)} (bf16 scale | bias words). Which rows form a block:
//   gate+up (swiglu):  block b of expert e: r0(i) = gate row e·I + 8b + i, r1(i) = up row e·I + 8b + i
//                      (shared expert, [gate|up] rows: r0 = 8b + i, r1 = I + 8b + i);
//   down:              block b of expert e: r0(i) = e·H + 16b + i, r1(i) = r0(i) + 8.
// The copy costs the experts' bytes once more in device memory (18.1 GB for the full model).
#pragma once
#include <cstdint>

#include "backend/cuda/common/dev_weights.h"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/gemm/qgemm.h"
#include "core/status.h"

namespace lily::cuda {

// Device bytes of a fragment copy of `blocks` 16-row blocks of K columns (codes, then sb).
size_t frag_bytes(int blocks, int K);
// Writes the fragment copy of `blocks` blocks into dst (frag_bytes of device memory, 16-byte aligned):
// block b takes r0(i) = ra·b + oa + i of a and r1(i) = rb·b + ob + i of b (a, b 4-bit, same K, K % 64 == 0).
Status frag_pack(const QW& a, const QW& b, int ra, int oa, int rb, int ob, int blocks, void* dst, FragW* out, Stream s);

// qgemm's items mode (a.items set; swiglu or plain, 4-bit experts) on fragment copies: w of the routed
// experts (gate+up blocks for swiglu, down blocks otherwise), sh of the shared expert. Needs K % 256 == 0
// and a tile height of 8 or 16 rows (a.nt ∈ {0, 1, 2}; 0 chooses qgemm's height, capped at 16 rows: an expert
// with more rows runs as several 16-row chunks; a forced taller tile returns an error: xgemm_fits tells before).
bool xgemm_fits(const QGemmArgs& a);
// One layer's four fragment copies (routed gate+up, shared gate+up, routed down, shared down; E experts of
// intermediate size I, hidden H) into dst, frag_expert_bytes(E, I, H) of device memory, in that order.
size_t frag_expert_bytes(int E, int I, int H);
Status frag_pack_experts(const QW& gate, const QW& up, const QW& sh_gate_up, const QW& down, const QW& sh_down, int E,
                         int I, int H, void* dst, FragExperts* out, Stream s);
// The fragment copies of every layer's experts in one device allocation (*mem, owned by the caller), set in
// d.layers[i].frag. None (*mem null) where H or I is no multiple of 256 (xgemm never runs there).
Status frag_experts(DevWeights& d, int E, int I, int H, void** mem, Stream s);
Status xgemm(const QGemmArgs& a, const FragW& w, const FragW& sh, Stream s);

}  // namespace lily::cuda
