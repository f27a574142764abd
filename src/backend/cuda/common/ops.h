// common/: what every op family shares: this header (the base types QW, StepCtl, Stream and the
// host wrappers of the decode kernels), common.cuh (device helpers), dev_weights.h and upload.cu (the
// weights in one device arena), tc_dot.cuh and wgmma_util.cuh (tensor-core primitives of gemm/, moe/ and
// attention/), and the row kernels: embed.cu, norm.cu (one token), prefill_elem.cu (M tokens): embedding
// rows dequantized to fp32 as the CPU reference does (s·q + b, unfused), add + RMSNorm in fp32 (gain bf16).
//
// Host wrappers of the CUDA decode kernels: plain C++ (no CUDA types), so tests and the backend
// share one way to launch each op. Pointers are device pointers; `stream` is a cudaStream_t.
// Activations are fp32 (as the CPU reference keeps them); weights stay packed. The K/V cache and
// the conv window are fp32.
// Quantized weights use the device layout made at upload: codes as on disk, scale and bias
// interleaved per group ([rows][groups] of {scale, bias} bf16 pairs), group size 64.
#pragma once
#include <cstdint>

#include "core/status.h"

namespace lily::cuda {

using Stream = void*;  // cudaStream_t

struct QW {
  const uint32_t* codes = nullptr;  // [rows, cols*bits/32] u32
  const uint16_t* sb = nullptr;     // [rows, cols/64, 2] bf16 (scale, bias)
  int rows = 0, cols = 0, bits = 4;
};
// A 4-bit matrix's copy in the MMA's fragment order (moe/xgemm.h says which rows form a block).
struct FragW {
  const uint32_t* codes = nullptr;  // [blocks][K/64][32 lanes][4] u32
  const uint32_t* sb = nullptr;     // [blocks][K/64][8][2] u32
  int blocks = 0, K = 0;
};
// A layer's experts in fragment order: routed and shared gate+up, routed and shared down.
struct FragExperts {
  FragW gu, sgu, dn, sdn;
};

// Per-sequence control block in device memory: the step reads pos/tok here and the last
// kernel of a step writes the next tok and advances pos, so the host never feeds the loop.
struct StepCtl {
  int32_t pos = 0;           // position of the token being fed
  int32_t tok = 0;           // token being fed
  uint32_t counter[16] = {};  // last-block-done counters (each reset by its last block)
  int32_t last_argmax = 0;   // argmax of the last lm_head
  float last_lse = 0;        // logsumexp of the last lm_head
};

// How a GEMV stages its input vector (x, K values, fp32) in shared memory.
enum class Pro : int {
  kPlain = 0,      // x = in (fp32 [K])
  kAddNorm = 1,    // r = in + mix (mix may be null); x = rms(r)·gain. Block 0 writes r to res_out
                   // (fp32 [K]) and, if n_out, x to n_out.
  kGatedNorm = 2,  // x[h,d] = gain[d]·o·rsqrt(mean_d o²+eps)·silu(z[h,d]); in = o, z = z (fp32)
};
enum class Epi : int {
  kNone = 0,
  kTopK = 1,    // router: y fp32 [E+1] logits (row E = shared-expert gate); last block writes topk
  kArgmax = 2,  // lm_head: y fp32 logits; last block writes ctl->tok, ctl->last_argmax, ctl->pos++
};

// K (= w.cols) must be a multiple of 64 (the group size): ≤ 4096 at 4 bits, ≤ 2048 at 8 bits.
struct GemvArgs {
  QW w;
  Pro pro = Pro::kPlain;
  const float* in = nullptr;   // fp32 [K]
  const float* mix = nullptr;  // fp32 [K] or null
  const void* gain = nullptr;  // bf16 [K] (add-norm) or [gn_dv] (gated norm)
  float* res_out = nullptr;    // fp32 [K]
  float* n_out = nullptr;      // fp32 [K] or null
  const float* z = nullptr;    // fp32 [K] (gated norm)
  int gn_dv = 128;             // gated-norm head width (multiple of 32, K/gn_dv ≤ 64 heads)
  float eps = 1e-6f;
  float* y = nullptr;          // fp32 [rows]
  Epi epi = Epi::kNone;
  StepCtl* ctl = nullptr;     // epilogues
  // kTopK
  int n_experts = 0, top_k = 0;
  int32_t* topk_ids = nullptr;  // [top_k]
  float* topk_w = nullptr;      // [top_k + 1]: renormalized weights, then sigmoid(shared gate)
  bool norm_topk = true;
  // kArgmax
  void* partial = nullptr;      // scratch: [grid] (value, index) pairs
  int max_blocks = 0;           // grid cap (0 = default)
  // Tensor-core kernel where it applies (gemv_tc.cu; the decode step sets this). Unset: the CUDA-core
  // kernels, whose sums the batched GEMVs (batch_gemv.cu) repeat bit for bit.
  bool tc = false;
};
Status gemv(const GemvArgs& a, Stream s);
// Grid cap of gemv (the kArgmax scratch needs this many (value, index) pairs).
int gemv_argmax_max_blocks();

// x (fp32 [H]) = scale·q + bias of row ctl->tok (or of `token` when ctl is null).
Status embed_row(const QW& e, const StepCtl* ctl, int token, float* x, Stream s);
// x[m] (fp32 [M][H]) = the dequantized embedding row of tok[m] (device), m < M: the prefill and the batched step.
Status embed_rows(const QW& e, const int32_t* tok, int M, float* x, Stream s);

// Standalone residual add + RMSNorm: r = x + mix; n = rms(r)·gain (fp32; gain bf16). (H ≤ 8192)
Status add_rmsnorm(const float* x, const float* mix, const void* gain, int H, float eps, float* r_out, float* n_out,
                   Stream s);

// MoE decode. gate_up: act = silu(g_k·x)·(u_k·x) for the top_k routed experts (ids on the
// device; act[j·I, (j+1)·I)) and the shared expert (its [gate|up] rows; act[top_k·I, +Is)).
// I and Is multiples of 32, H a multiple of 64 (≤ 4096), top_k ≤ 16.
struct MoeArgs {
  QW gate, up, down;          // stacked experts: gate/up [E*I, H], down [E*H, I]
  QW sh_gate_up, sh_down;     // shared: [2*Is, H], [H, Is]
  const int32_t* topk_ids = nullptr;
  const float* topk_w = nullptr;  // [top_k + 1]
  int top_k = 8, H = 0, I = 0, Is = 0;  // Is = 0: same as I
  const float* x = nullptr;   // fp32 [H] normed input
  float* act = nullptr;       // fp32 [top_k·I + Is]
  float* out = nullptr;       // fp32 [H] = Σ w_k·(down_k·act_k) + σ·(sdown·act_s)
  // Routing in the consumers (when logits is set; topk_ids/topk_w are then not read): the router
  // GEMV only writes logits fp32 [n_experts + 1] (row E = shared-expert gate), and every gate_up
  // block of a routed slot (after its wait) and every down block (before its wait: the router is
  // two kernels back) computes the top-k itself: softmax, top_k by (p desc, id asc), renormalized
  // when norm_topk, σ(shared gate). n_experts ≤ 256. down's block 0 writes ids_out/w_out if set.
  const float* logits = nullptr;
  int n_experts = 0;
  bool norm_topk = true;
  int32_t* ids_out = nullptr;  // [top_k] or null
  float* w_out = nullptr;      // [top_k + 1] or null
  // The tensor-core down kernel where it applies (moe_tc.cu; the decode step sets this; gate+up stays on
  // moe.cu's kernel). Unset: moe.cu's kernels (the CUDA-core reference of the tensor-core one's tests).
  bool tc = false;
};
Status moe_gate_up(const MoeArgs& a, Stream s);
Status moe_down_combine(const MoeArgs& a, Stream s);


// Whole GDN decode step. u: fp32 [C + vd + 2·nv] = [qkv | z | a | b] projections of this token;
// conv: fp32 [2, C, K-1] double-buffered window (read parity pos&1, write the other);
// S: fp16 [nv, dk, dv]; o: fp32 [nv, dv] readout before the gated norm.
// dk, dv multiples of 32 (dk ≤ 256).
struct GdnArgs {
  const float* u = nullptr;
  const void* conv_w = nullptr;  // bf16 [C, K]
  float* conv = nullptr;
  uint16_t* S = nullptr;         // fp16 bits [nv, dk, dv] (computed in fp32, rounded once a store)
  const float* A_log = nullptr;  // [nv]
  const void* dt_bias = nullptr; // bf16 [nv]
  float* o = nullptr;
  const StepCtl* ctl = nullptr;
  int pos = -1;                  // when ctl is null
  int nk = 0, nv = 0, dk = 128, dv = 128, K = 4;
  // Gated RMSNorm fused at the end (off when og is null; needs dv ≤ 256): the dv/32 blocks of a
  // head form a thread-block cluster and share its sum of squares through distributed shared
  // memory. og fp32 [nv, dv] = gain[d]·o·rsqrt(mean_d o² + eps)·silu(z[h, d]); z fp32 [nv·dv]
  // (the z projection), gnorm bf16 [dv]. The same summation order as the GEMV's kGatedNorm staging.
  const float* z = nullptr;
  const void* gnorm = nullptr;
  float* og = nullptr;
  float eps = 1e-6f;
};
Status gdn_step(const GdnArgs& a, Stream s);

// Attention decode. prep: q (fp32 [nh, hd]) = rope(rms(q_raw)·qn); K/V of pos written to the
// fp32 caches [nkv, max_seq, hd] after k norm + rope. qkv = fp32
// [nh*qw + 2*nkv*hd] with per-head [q | gate] (qw = 2hd) or plain q (qw = hd). decode: split-K
// flash decoding over 0..pos, then the last block per kv head merges splits, applies
// sigmoid(gate), writes out fp32 [nh, hd]. hd ∈ {64, 128, 256}; group nh/nkv ∈ {1,2,3,4,6,8}.
struct AttnArgs {
  const float* qkv = nullptr;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float* q = nullptr;
  void* kc = nullptr;  // fp32
  void* vc = nullptr;
  float* out = nullptr;
  float* partial = nullptr;  // [nkv, n_split, group, hd + 2]
  StepCtl* ctl = nullptr;
  int pos = -1;              // when ctl is null (prep only; decode needs ctl for counters)
  int nh = 0, nkv = 0, hd = 0, qw = 0, rot = 0, max_seq = 0, n_split = 64;
  int min_per_split = 64;    // positions per split at least (short contexts use fewer splits)
  double theta = 1e7;
  float eps = 1e-6f;
};
Status attn_prep(const AttnArgs& a, Stream s);
Status attn_decode(const AttnArgs& a, Stream s);
int attn_max_splits();
// Raises the dynamic shared-memory limits of the attention kernels (call once, outside capture).
Status attn_init();

// ctl->pos += 1 (the step without logits).
Status bump_pos(StepCtl* ctl, Stream s);

}  // namespace lily::cuda
