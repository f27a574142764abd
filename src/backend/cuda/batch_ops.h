// Host wrappers of the batched decode kernels (issue 7): B sequences decode one token each, every
// weight read once per step for all rows. Each kernel's per-row arithmetic is a copy of the batch-1
// decode kernel's (same chunk order, same reductions), so a row's result is bit-identical to the
// sequence decoded alone. Per-row state comes from device pointer tables (one per layer), so one
// captured CUDA graph per batch size serves any set of sequences. Pointers are device pointers.
#pragma once
#include <cstdint>

#include "backend/cuda/ops.h"
#include "core/status.h"

namespace lily::cuda {

// Rows of a batched GEMV staged in shared memory at once (the host splits B into groups of this).
int bgemv_group_rows(const QW& w);

// y[b·ldy + r] = Σ_c scale·Σq·x_b + bias·Σx_b for every row r of w and b < B, x fp32 [B][ldx]
// (plain input). B ≤ bgemv_group_rows(w). Per (b, r) the same sums as gemv() with Pro::kPlain.
Status bgemv(const QW& w, const float* x, int ldx, float* y, int ldy, int B, Stream s);

// Per row b (B blocks): r = in_b + mix_b (mix may be null); res_out_b = r; n_out_b = rms(r)·gain
// (the gemv kAddNorm staging's arithmetic). All fp32 [B][H], gain bf16 [H]; H ≤ 4096.
Status badd_norm(const float* in, const float* mix, const void* gain, int H, float eps, float* res_out, float* n_out,
                 int B, Stream s);

// Router epilogue per row: logits fp32 [B][ld] (E routed + 1 shared-gate); ids [B][top_k],
// w [B][top_k + 1] (renormalized weights, then sigmoid of the shared gate when has_shared).
Status brouter_topk(const float* logits, int ld, int E, int top_k, bool norm_topk, bool has_shared, int32_t* ids,
                    float* w, int B, Stream s);

// Embedding rows: x[b] (fp32 [H]) = dequantized row tok[b].
Status bembed(const QW& e, const int32_t* tok, float* x, int B, Stream s);

// ctl[b]->pos = pos[b] + 1 (the state's control block follows the batched step).
Status bfinish(StepCtl* const* ctl, const int32_t* pos, int B, Stream s);

// MoE per row: gate+up+SwiGLU (x [B][H] → act [B][k·I + Is]) and down + combine + shared
// (act → out [B][H]); ids [B][k], w [B][k+1]. Blocks of the same weight tile for all rows run
// together, so an expert chosen by several rows is read from DRAM about once.
struct BMoeArgs {
  QW gate, up, down, sh_gate_up, sh_down;
  const int32_t* topk_ids = nullptr;
  const float* topk_w = nullptr;
  int top_k = 8, H = 0, I = 0, Is = 0, B = 0;
  const float* x = nullptr;
  float* act = nullptr;
  float* out = nullptr;
};
Status bmoe_gate_up(const BMoeArgs& a, Stream s);
Status bmoe_down(const BMoeArgs& a, Stream s);

// GDN decode step per row (fused gated norm), fp32 windows and state: row b reads u [b][ldu],
// conv[b] ([2, C, K-1] fp32), S[b] ([nv, dk, dv] fp32), pos[b]; writes og [b][nv·dv].
struct BGdnArgs {
  const float* u = nullptr;
  int ldu = 0;
  const void* conv_w = nullptr;
  void* const* conv = nullptr;  // [B] device table
  float* const* S = nullptr;    // [B]
  const int32_t* pos = nullptr; // [B]
  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* gnorm = nullptr;
  float* og = nullptr;
  int ldo = 0;
  int nk = 0, nv = 0, dk = 128, dv = 128, K = 4, B = 0;
  float eps = 1e-6f;
};
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


// ---- tensor-core path (batch_tc.cu, batch_tc_aux.cu; LILY_BATCH_TC=0 keeps the kernels above) ----
// Not bit-identical to the batch-1 GEMV, but batch invariant: each row's arithmetic depends only on
// that row and the weights (fixed k order and k split per matrix, no cross-row reductions).
//
// Packed activation rows (the GEMM's B operand): per row r of K fp32 values (K a multiple of 64),
// P uint32 [R][K/64][16][4]: per 64-group, MMA k-step s and lane quad t, the fp16 pairs b0, b1 of
// x·2^e rounded to fp16 (hi), then of the remainders (lo); XS float [R][K/64][2] = {Σx (fp32), 2^-e}.
// e per group puts its largest |x| just below 2^15, so hi + lo keeps ~22 bits of every x.
Status bpack(const float* x, int ldx, int K, int R, uint32_t* P, float* XS, Stream s);

// Per row b (B blocks): r = in_b + mix_b, where mix_b is mix (plain, [B][H]) or, when yd is set, the MoE
// combine Σ_j tw[b][j]·yd[b·k + j] + tw[b][k]·yd[B·k + b] (slot order, then the shared expert);
// res_out = r (if set); n = rms(r)·gain → n_out (fp32, if set) and packed into P / XS.
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
  uint32_t* P = nullptr;
  float* XS = nullptr;
  // Instead of P: n packed for qgemm (gemm/qgemm.h: fp16 [B][H], XS [B][H/64][2]; X16lo the two-pass
  // remainders, or null).
  uint16_t* X16 = nullptr;
  uint16_t* X16lo = nullptr;
  // Optional: n also limb-packed (blimb_pack's layout and bits, K = H) for the int8 experts.
  uint8_t* L = nullptr;
  float* XG = nullptr;
  float* IS = nullptr;
};
Status bnorm_pack(const BNormArgs& a, Stream s);
// out[b] = the MoE combine of bnorm_pack (tests).
Status bmoe_combine(const float* yd, const float* tw, int top_k, int H, int B, float* out, Stream s);

// Expert-major routing on the device (one block): from ids [B][k], the active experts in ascending id
// (items int32 [n][4] = {expert, rows, offset, chunks before}), then the shared expert {E, B, B·k, ...};
// rowb/ent [B·k + B]: per entry in item order, the token row b and the entry index (b·k + slot, or
// B·k + b for the shared expert), rows of one expert in (b, slot) order. n_items[0] = active + 1,
// n_items[1] = Σ ⌈rows/8⌉ over the items (8-row chunks; items[i][3] is the prefix of that sum).
// items must hold (min(B·k, E) + 1)·4 ints. E ≤ 1024; a row's k ids must be distinct (top-k).
Status broute(const int32_t* ids, int B, int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb,
              int32_t* ent, Stream s);
// brouter_topk (same arithmetic: ids [B][k], w [B][k+1] from logits [B][ld]) and broute in one launch.
Status broute_topk(const float* logits, int ld, bool norm_topk, bool has_shared, int32_t* ids, float* w, int B,
                   int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb, int32_t* ent, Stream s);

// Skinny tensor-core GEMM (swap AB). Dense (items null): y[b·ldy + r] = w_r · x_b for r < w.rows,
// b < B, x packed rows b. Items (expert-major MoE, after broute): block row y = item; routed expert e
// uses rows [e·n_out, +n_out) of w (and of w2 when swiglu), the shared expert (e == E) rows
// [0, n_out_sh) of sh (swiglu: gate rows [0, n_out_sh), up rows [n_out_sh, 2·n_out_sh)); the item's
// entries j read packed row xrow[off + j] and write y row yrow[off + j] (swiglu: silu(gate)·up).
struct BtcArgs {
  QW w, w2, sh;
  const uint32_t* P = nullptr;
  const float* XS = nullptr;
  float* y = nullptr;
  int ldy = 0;
  int B = 0;        // dense rows
  int n_out = 0;    // items: rows per routed expert
  int n_out_sh = 0; // items: shared expert rows
  bool swiglu = false;
  const int32_t* items = nullptr;
  const int32_t* n_items = nullptr;
  int max_items = 0, E = 0;
  const int32_t* xrow = nullptr;
  const int32_t* yrow = nullptr;
  // Kernel: 1 = the persistent staged kernel (batch_tc_stream.cu: experts, and dense 4-bit matrices of
  // ≥ 8192 rows), 2 = that also for every dense 4-bit matrix (tests), 0 = the block kernels
  // (batch_tc.cu), -1 = LILY_BTC_STREAM (0 = block kernels; 1 = stream; -1 = the default: stream for
  // the experts from LILY_BTC_SMIN = 16 rows and for dense matrices from LILY_BTC_SMIN_DENSE = 32).
  // Both give bit-identical results. The stream kernel needs 4-bit weights and, in items mode,
  // n_out == n_out_sh; otherwise the block kernel runs.
  int stream = -1;
  int max_ent = 0;  // items: bound on the entries (xrow / yrow length); the stream kernel needs it
  int ks = 0;       // set by btc_gemm: the block kernel's k split, which the stream kernel reproduces
  // Stream kernel, swiglu: also write each output row packed (bpack's layout and bits, K = n_out) into
  // Pout / XSout at row yrow[..] (btc_packs_out says whether btc_gemm will; else run bpack after).
  uint32_t* Pout = nullptr;
  float* XSout = nullptr;
};
Status btc_gemm(const BtcArgs& a, Stream s);
// The persistent expert kernel (items mode only; called by btc_gemm).
Status btc_stream(const BtcArgs& a, Stream s);
bool btc_stream_ok(const BtcArgs& a);
// Whether btc_gemm(a) runs the stream kernel (then, with swiglu and Pout set, it packs its output).
bool btc_uses_stream(const BtcArgs& a);

// ---- int8 tensor-core experts (batch_moe_i8.cu; used by the batched step with LILY_BTC_I8=1) ----
// Limb-packed activation rows (tc_dot.cuh's layout, one record per row): L uint8 [R][K/64][256] (4 signed
// 7-bit limbs of x·S per value, S a power of two per row), XG float [R][K/64] = Σx·S per group,
// IS float [R] = 1/S. 27 bits below the row's largest |x|. K a multiple of 64.
Status blimb_pack(const float* x, int ldx, int K, int R, uint8_t* L, float* XG, float* IS, Stream s);

// Expert-major MoE GEMM over the routing table of broute (items mode of BtcArgs, same weights and
// entry maps), inputs limb-packed: gate+up+SwiGLU (swiglu; K ≤ 2048) or down (K ≤ 512). Block rows are
// 8-entry chunks (items[i][3], n_items[1]); max_chunks bounds them (≥ max_items + ⌈entries / 8⌉).
// Batch invariant (exact integer sums, fixed fold order per output element); not bit-identical to
// btc_gemm (more precise: 27-bit activations instead of fp16 hi + lo).
struct BI8Args {
  QW w, w2, sh;
  const uint8_t* L = nullptr;
  const float* XG = nullptr;
  const float* IS = nullptr;
  float* y = nullptr;
  int ldy = 0;
  int n_out = 0, n_out_sh = 0;
  bool swiglu = false;
  const int32_t* items = nullptr;
  const int32_t* n_items = nullptr;
  int max_chunks = 0, E = 0;
  const int32_t* xrow = nullptr;
  const int32_t* yrow = nullptr;
};
bool bi8_ok(const BI8Args& a);
Status bi8_moe(const BI8Args& a, Stream s);

}  // namespace lily::cuda
