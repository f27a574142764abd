// xgemm: the batched step's expert GEMMs (qgemm's items mode, gemm/qgemm.h) on expert weights laid out
// in the wgmma A fragment order, so each warp streams its weights from HBM straight into registers: no
// shared-memory staging of weights, one 16-byte load per lane per 64-group. Why:
// docs/perf/2026-12-05-qgemm-experts.md (qgemm's expert tiles are issue-bound) and 2026-12-06-kv-f16.md
// (the mma.sync form of this kernel bound by shared-memory reads of the activations). Same per-group
// partial sums and epilogue as qgemm; the tensor cores group k differently, so a row's results agree with
// qgemm's items mode to fp32 rounding (1e-6·Σ|terms|) and are bit-identical at every row count and tile
// height of xgemm.
//
// Fragment layout of a 4-bit MLX matrix (FragW): blocks of 16 weight rows, each block's K/64 groups in
// order, each group 512 bytes: lane L = 4·gq + t holds, for the block's rows r0(gq) and r1(gq), two words
// {r0 lo, r0 hi, r1 lo, r1 hi}: "lo" carries code words 0..3 of the row's 8 in the group, "hi" words 4..7,
// word w's nibbles t and t + 4 at bits 4(w & 3) and 16 + 4(w & 3) (the A fragments of the group's four
// k-steps: k-step s takes words 2s and 2s + 1); and per group 8 × {sb(r0), sb(r1)} (bf16 scale | bias
// words). Which rows form a block:
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
// and a tile height of 8, 16, 32 or 64 rows (a.nt ∈ {0, 1, 2, 4, 8}; 0 chooses as qgemm does).
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
