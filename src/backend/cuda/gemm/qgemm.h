// gemm/: the quantized matrix products. Weights: MLX 4-bit codes (8-bit for the routers), group 64, a
// bf16 scale and bias per group, never rounded; y = Σ_g scale·Σq·x + bias·Σx with fp32 sums. Entry points:
//   gemv (common/ops.h; gemv_q4.cu, gemv_tc.cu): one fp32 row [K], K ≤ 4096 (4-bit) / 2048 (8-bit),
//     fused add+RMSNorm or gated-norm prologue, router top-k or lm_head argmax epilogue; y fp32 [rows]
//     (also the prefill's lm_head on its last row);
//   pf::gemm (step/prefill_ops.h; gemm_wg.cu, gemm_q8.cu): x [M, K] split once into fp16 hi + lo (~22 bits)
//     → fp32 y [M, N]; dense, SwiGLU or grouped expert tiles;
//   bgemv_grouped (step/batch_ops.h; batch_gemv.cu): B fp32 rows, each bit-identical to gemv (the step's router);
//   qgemm (below; qgemm.cu, qgemm_wg.cu, xpack16.cu; batch_tc_aux.cu packs rows and routes for it).
//
// The quantized GEMM family of the serving step: 4-bit (and the routers' 8-bit) MLX weights times
// fp16 activation rows, for any number of rows, dense or expert-major (MoE). One kernel template
// (qgemm.cu) with tiles chosen by rows: each 128-row weight tile is streamed from HBM through a
// multi-stage cp.async ring once per chunk of up to 64 activation rows, 4-bit codes become exact
// fp16 integers in registers, mma.sync m16n8k16 (weights as the 16-row A operand, 8 rows per n-tile
// as B), fp32 accumulation, and per 64-group y += scale·2^-e·Σq·x16 + bias·Σx.
//
// Precision (../shared/docs/precision.md): weights exact; activations fp16 hi + lo (x·2^e per 64-group,
// so no group overflows or loses its small values to subnormals; ~22 bits, two MMAs a product); fp32 sums.
// One pass measured +7..16% at 16..256 rows but moves a row ~1e-3 from the same row alone (2026-12-05).
// Batch invariance: a row's result depends only on that row and the weights: the k order is fixed,
// the k split of a dense matrix depends only on its shape, and rows never meet in a reduction. So
// any number of rows, any tile height and any routing give a row bit-identical results, with one
// exception: a dense 4-bit call of qgemm_wg_rows(w.rows, w.cols) rows or more runs the wgmma tile (qgemm_wg.cu),
// whose tensor-core sums group the k terms differently; a row's result there is bit-identical at
// every such row count and equal to the mma.sync tiles' to fp32 rounding (two passes: ~1e-7 relative).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cuda/common/ops.h"
#include "core/status.h"

namespace lily::cuda {

// Activation rows (the GEMM's B operand), R rows of K values (K a multiple of 64):
//   X  fp16 [R][K]: x·2^e rounded to fp16, e per 64-group so its largest |x|·2^e lies in [2^14, 2^15),
//      stored in the order of the 4-bit codes' fp16 pairs: value k at qgemm_xpos(k)
//      ([x0,x4,x1,x5,x2,x6,x3,x7] per 8 values);
//   XS float [R][K/64][2] = {Σx (fp32, of the unrounded x), 2^-e};
//   Xlo fp16 [R][K] (optional, same order): the remainders x·2^e − X rounded to fp16, so X + Xlo keeps
//      ~22 bits of every x (the two-pass precision every qgemm call takes).
// xpack16 packs fp32 rows x [R][ldx] (K ≤ ldx) into that form.
Status xpack16(const float* x, int ldx, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s);
// The same of act = silu(gate)·up from rows gu fp32 [R][ld] = [gate K | up K] (ld ≥ 2K).
Status xpack16_swiglu(const float* gu, int ld, int K, int R, uint16_t* X, float* XS, uint16_t* Xlo, Stream s);
// Where value k of a row sits in X.
constexpr int qgemm_xpos(int k) { return (k & ~7) | ((k & 3) << 1) | ((k >> 2) & 1); }

struct QGemmArgs {
  // Dense (items == nullptr): y[m·ldy + n] = w_n · x_m for n < w.rows, m < M.
  // Items (expert-major MoE; the routing table of broute: items int4 [n_items[0]] = {expert, rows,
  // offset, -}, the shared expert last as expert E): routed expert e uses rows [e·n_out, +n_out) of w
  // (and of w2 when swiglu), the shared expert rows [0, n_out) of sh (swiglu: gate rows [0, n_out),
  // up rows [n_out, 2·n_out)); entry j of an item reads activation row xrow[off + j] and writes
  // output row yrow[off + j].
  QW w, w2, sh;
  const uint16_t* x = nullptr;  // fp16 [rows][ldx]
  const float* xs = nullptr;    // [rows][K/64][2]
  const uint16_t* xlo = nullptr;  // the remainders, same layout (required)
  int ldx = 0;                  // fp16 elements per activation row (≥ K, a multiple of 8)
  int M = 0;                    // dense: rows
  // Plain output: y fp32 [rows][ldy].
  float* y = nullptr;
  int ldy = 0;
  // Items, swiglu: act = silu(gate)·up, written packed (the form above, K = n_out) at row yrow[..]
  // of yx fp16 [rows][n_out] / yxs [rows][n_out/64][2]; n_out a multiple of 64.
  bool swiglu = false;
  uint16_t* yx = nullptr;
  float* yxs = nullptr;
  uint16_t* yxlo = nullptr;  // the output remainders (swiglu)
  int n_out = 0;
  const int32_t* items = nullptr;
  const int32_t* n_items = nullptr;
  int max_items = 0;  // bound on n_items[0] (≤ 1024)
  int E = 0;
  const int32_t* xrow = nullptr;
  const int32_t* yrow = nullptr;
  int ent_hint = 0;   // items: routed entries of the step, rows·top_k (chooses the tile height, never the result)
  // Dense k split (when qgemm_splits(w) > 1): partial sums [splits][M][w.rows] fp32 in ws and one
  // arrival counter per (tile, row chunk) in cnt (zero before the first call; each call leaves them
  // zero). Sizes: qgemm_ws_floats / qgemm_counters.
  float* ws = nullptr;
  int32_t* cnt = nullptr;
  int nt = 0;  // tests: force the tile height (8·nt rows; nt ∈ {1, 2, 4, 8}); 0 = chosen by rows
  // Dense 4-bit calls of at least qgemm_wg_rows(w.rows, w.cols) rows (nt unforced) run the wgmma tile (gemm/qgemm_wg.cu), fewer the
  // mma.sync tiles. Tests: 1 forces the mma.sync tiles, 2 the wgmma tile; 0 = chosen by rows.
  int kernel = 0;
};

Status qgemm(const QGemmArgs& a, Stream s);

// Items: the tile height (in 8-row n-tiles: 1, 2, 4 or 8) a call runs, a.nt when forced, else chosen by
// the routed entries per expert (a.ent_hint, a.E); never changes a row's result.
int qgemm_items_nt(const QGemmArgs& a);
// Rows from which a dense 4-bit call of a rows × cols matrix runs the wgmma tile (a function of the shape).
int qgemm_wg_rows(int rows, int cols);
// The dense k split of a matrix (a function of its shape only, never of the rows).
int qgemm_splits(int rows, int cols);
// Workspace a dense call of M rows needs (0 when unsplit) and its counters.
size_t qgemm_ws_floats(int rows, int cols, int M);
size_t qgemm_counters(int rows, int cols, int M);

}  // namespace lily::cuda
