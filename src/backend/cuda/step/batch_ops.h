// Host wrappers of the batched step's kernels besides its GEMMs (gemm/qgemm.h): B rows, each a sequence's
// token, every weight read once per step for all rows. The router GEMV and the mixers (DeltaNet step,
// decode attention) copy the batch-1 kernels' per-row arithmetic (same chunk order, same reductions), so
// a row routes and mixes as it would alone. Per-row state comes from device pointer tables (one per
// layer), so one captured CUDA graph per batch size serves any set of sequences. Pointers are device
// pointers.
#pragma once
#include <cstdint>

#include "backend/cuda/common/ops.h"
#include "core/status.h"

namespace lily::cuda {

// y[b·ldy + r] = Σ_c scale·Σq·x_b + bias·Σx_b for every row r of w and b < B, x fp32 [B][ldx] (plain
// input), each (b, r) bit-identical to gemv() with Pro::kPlain, for any B ≥ 1 in one launch: blocks of
// `group` staged rows × weight tiles of 8·r rows (r a warp), so each block stages only its group. For
// small matrices at many rows (the router: 257 × 2048 8-bit), where staging every row in each block would
// cost more than the sums. A block walks the tiles t, t + tiles, ... (each tile's weights loaded under the previous one's
// sums; tiles 0: as many a block as leave one wave); nb: rows a warp's sums take at once (conversions
// shared). Every shape gives the same bits; a zero group: bgemv_grouped_shape(w, B). The group must fit
// the shared memory (8 rows: K ≤ 4096 at 4 bits, ≤ 2048 at 8).
struct GroupedShape {
  int group = 0, r = 0, nb = 0, tiles = 0;  // group % nb == 0; r 1 or 2; nb 4 or 8; 0 ≤ tiles ≤ ⌈rows / 8r⌉
};
GroupedShape bgemv_grouped_shape(const QW& w, int B);
Status bgemv_grouped(const QW& w, const float* x, int ldx, float* y, int ldy, int B, Stream s, GroupedShape g = {});

// Router epilogue per row: logits fp32 [B][ld] (E routed + 1 shared-gate); ids [B][top_k],
// w [B][top_k + 1] (renormalized weights, then sigmoid of the shared gate when has_shared).
Status brouter_topk(const float* logits, int ld, int E, int top_k, bool norm_topk, bool has_shared, int32_t* ids,
                    float* w, int B, Stream s);

// ctl[b]->pos = pos[b] + 1 (the state's control block follows the batched step).
Status bfinish(StepCtl* const* ctl, const int32_t* pos, int B, Stream s);

// GDN decode step per row (fused gated norm), fp32 windows, fp16 states: row b reads u [b][ldu],
// conv[b] ([2, C, K-1] fp32), S[b] ([nv, dk, dv] fp16), pos[b]; writes og [b][nv·dv].
struct BGdnArgs {
  const float* u = nullptr;
  int ldu = 0;
  const void* conv_w = nullptr;
  void* const* conv = nullptr;  // [B] device table
  uint16_t* const* S = nullptr; // [B]: fp16 bits [nv, dk, dv]
  const int32_t* pos = nullptr; // [B]
  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* gnorm = nullptr;
  float* og = nullptr;
  int ldo = 0;
  int nk = 0, nv = 0, dk = 128, dv = 128, K = 4, B = 0;
  float eps = 1e-6f;
  float* prep = nullptr;  // scratch [B][bgdn_prep_floats]: per row qn, kn, v and the gates
};
// Floats of one row's prep scratch: [qn nk·dk | kn nk·dk | v nv·dv | {α, β} nv], a multiple of 4.
constexpr size_t bgdn_prep_floats(int nk, int nv, int dk, int dv) {
  return (size_t(2) * nk * dk + size_t(nv) * dv + 2 * size_t(nv) + 3) / 4 * 4;
}
Status bgdn_step(const BGdnArgs& a, Stream s);

// Attention decode per row with fp32 K/V: prep (q/k norm, rope, cache write at pos[b]), split-K
// decode over 0..pos[b] (splits as attn_decode: min(n_split, ⌈n/min_per_split⌉)), merge + gate.
struct BAttnArgs {
  const float* qkv = nullptr;
  int ldqkv = 0;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float* q = nullptr;          // [B][nh·hd]
  void* const* kc = nullptr;   // [B] fp32 [nkv, cap_b, hd]
  void* const* vc = nullptr;
  const int32_t* cap = nullptr;  // [B] max_seq of each row's cache
  const int32_t* pos = nullptr;  // [B]
  float* out = nullptr;        // [B][nh·hd]
  float* partial = nullptr;    // [B][nkv·n_split·G·(hd+2)]
  int nh = 0, nkv = 0, hd = 0, qw = 0, rot = 0, n_split = 128, min_per_split = 64, B = 0;
  double theta = 1e7;
  float eps = 1e-6f;
};
Status battn(const BAttnArgs& a, Stream s);
size_t battn_partial_floats(int nh, int nkv, int hd, int n_split);


// ---- the qgemm step's small kernels (batch_tc_aux.cu) ----
// The step's GEMMs are qgemm (gemm/qgemm.h): not bit-identical to the batch-1 GEMV, but batch
// invariant: each row's arithmetic depends only on that row and the weights.

// Per row b (1 to 8 blocks, a cluster): r = in_b + mix_b, where mix_b is mix (plain, [B][H]) or, when yd is set, the MoE
// combine Σ_j tw[b][j]·yd[b·k + j] + tw[b][k]·yd[B·k + b] (slot order, then the shared expert);
// res_out = r (if set); n = rms(r)·gain → n_out (fp32, if set) and packed for qgemm into X16 / XS
// (X16lo: the two-pass remainders). The sum of squares in one order for any blocks a row.
struct BNormArgs {
  const float* in = nullptr;
  const float* mix = nullptr;
  const float* yd = nullptr;  // [B·k + B][H]
  const float* tw = nullptr;  // [B][k + 1]
  int top_k = 0;
  const void* gain = nullptr;  // bf16 [H]
  int H = 0, B = 0;
  float eps = 1e-6f;
  float* res_out = nullptr;
  float* n_out = nullptr;
  uint16_t* X16 = nullptr;    // fp16 [B][H] (gemm/qgemm.h)
  uint16_t* X16lo = nullptr;  // fp16 [B][H]
  float* XS = nullptr;        // [B][H/64][2]
  int blocks = 0;             // blocks a row (a divisor of bnorm_slices(H)); 0: by B (any gives the same bits)
};
int bnorm_slices(int H);
Status bnorm_pack(const BNormArgs& a, Stream s);
// out[b] = the MoE combine of bnorm_pack (tests).
Status bmoe_combine(const float* yd, const float* tw, int top_k, int H, int B, float* out, Stream s);

// Rows gathered: dst row r (row_bytes, a multiple of 4) = src row idx[r] (device), r < n. The mixed
// step's rows that need logits, packed for the lm_head.
Status brow_gather(const void* src, size_t row_bytes, const int32_t* idx, int n, void* dst, Stream s);

// Expert-major routing on the device (one block): from ids [B][k], the active experts in ascending id
// (items int32 [n][4] = {expert, rows, offset, chunks before}), then the shared expert {E, B, B·k, ...};
// rowb/ent [B·k + B]: per entry in item order, the token row b and the entry index (b·k + slot, or
// B·k + b for the shared expert), rows of one expert in (b, slot) order. n_items[0] = active + 1,
// n_items[1] = Σ ⌈rows/8⌉ over the items (8-row chunks; items[i][3] is the prefix of that sum).
// shared_item false: no shared item (a shared expert of another width than the routed ones runs apart;
// n_items counts the routed items only). items must hold (min(B·k, E) + 1)·4 ints. E ≤ 1024; a row's k
// ids must be distinct (top-k).
Status broute(const int32_t* ids, int B, int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb,
              int32_t* ent, bool shared_item, Stream s);
// brouter_topk (same arithmetic: ids [B][k], w [B][k+1] from logits [B][ld]) and broute in one launch.
Status broute_topk(const float* logits, int ld, bool norm_topk, bool has_shared, int32_t* ids, float* w, int B,
                   int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb, int32_t* ent, bool shared_item,
                   Stream s);

}  // namespace lily::cuda
