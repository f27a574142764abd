// Host wrappers of the CUDA prefill kernels (M tokens at once): plain C++ like ops.h, device
// pointers, `stream` a cudaStream_t. Activations are fp32 row-major [M, width] throughout;
// the K/V cache and conv window use the decode layout of CudaSeqState (bf16).
#pragma once
#include <cstdint>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "backend/cuda/common/ops.h"
#include "core/status.h"

namespace lily::cuda::pf {

// ---- tensor-core GEMM over the packed MLX layout (gemm_wg.cu: 4-bit, gemm_q8.cu: 8-bit) ---------------
// y[m, n] = Σ_g s[n,g]·Σ_{k∈g} q[n,k]·x[m,k] + b[n,g]·Σ_{k∈g} x[m,k]   (fp32 accumulation)
// q enters the MMA as exact fp16 integers; x as fp16 hi + lo (~22-bit x, two MMAs a product; one pass
// measured +11–13% prefill but rounds a prompt differently from the same prompt as a segment of the
// mixed step, docs/perf/2026-12-05-gpu-verify.md §5); Σx is taken from the fp32 x. W rows used: row0 +
// [0, n_out) (+ expert·n_out).
// swiglu: y[m, j] = silu(W·x)[j]·(W2·x)[j] with W2 rows row0_2 + j (gate/up of one expert).
// A is the fp32 activation [rows, K] split once by split_rows (every GEMM on that input reads the split).
// Grouped (tiles != null): tile i = {expert, m0, m1, 0}; rows m0..m1 of A (slot order) against
// expert's rows; m0 == m1 marks an unused tile. a_rows (optional) gathers A rows: A row of
// local row i is a_rows[i]. Output row = local row (slot).
struct GemmArgs {
  QW w, w2;
  int row0 = 0, row0_2 = 0, n_out = 0;
  const int32_t* a_rows = nullptr;
  int M = 0;
  float* y = nullptr;
  int ldy = 0;
  // 4-bit single pass only: the output as fp16 bits [rows][ldy] instead of y, each value rounded to nearest,
  // the hi plane split_rows would make of y (the next single-pass GEMM's input, without the fp32 round trip).
  uint16_t* y16 = nullptr;
  bool swiglu = false;
  const int32_t* tiles = nullptr;  // [max_tiles, 4]
  int max_tiles = 0;
  // A split (split_rows, required): fp16 hi/lo planes [rows, K] and Σx [rows, K/64]. gemm() runs 4-bit
  // weights on the Hopper wgmma kernel (gemm_wg.cu), 8-bit ones on the mma.sync pipelined kernel (gemm_q8.cu).
  const uint16_t* ah = nullptr;
  const uint16_t* al = nullptr;
  const float* axs = nullptr;
  // 4-bit: 2 = exact weights times x as hi + lo (reads ah, al, axs); 1 = single pass, fp16(s·q + b)·fp16(x)
  // (reads ah only). The prefill chooses by the chunk's rows (prefill.cu); 8-bit calls are always two pass.
  // Grouped calls: two pass takes a narrow route's tiles (64 rows, class 0), single pass either route's (a wide
  // route's 128-row class-1 tiles too; RouteArgs::wide).
  int terms = 2;
};
// Prefill chunks of at least this many tokens run their 4-bit GEMMs single pass (terms 1, ~1e-3 of a
// logit from the fp32 reference, inside transformers' fp16 envelope), shorter ones two pass. A prompt
// segment this long always runs alone on the prefill path, never as rows of a mixed step (step_mixed.cu's
// kOwnPrefillRows is this), so its rounding never depends on what else the server runs; shorter segments
// beside decode rows run the step's two-pass qgemm/xgemm, the class of the two-pass prefill.
constexpr int kPfSinglePassRows = 1024;
Status gemm(const GemmArgs& a, Stream s);
// hi = fp16(a), lo = fp16(a − hi) (row-compact [M, K]) and xs = Σ a per 64-group [M, K/64]; lo and xs
// only when both are given (lo null: hi alone, what the 4-bit GEMMs read).
Status split_rows(const float* a, int lda, int M, int K, uint16_t* hi, uint16_t* lo, float* xs, Stream s);
#ifdef __CUDACC__
// split_rows' arithmetic for one lane's two values v of a 64-group (lane l holds columns 2l, 2l + 1), shared by
// every producer of a split so they agree bit for bit: hi[o] = fp16(v); when lo, lo[o] = fp16(v − hi) and
// (lane 0) *xs = the group's Σv by a fixed shuffle tree. lo null must be warp-uniform.
__device__ __forceinline__ void split_pair(float2 v, __half* hi, __half* lo, float* xs, size_t o, int lane) {
  const __half2 h = __floats2half2_rn(v.x, v.y);
  *reinterpret_cast<__half2*>(hi + o) = h;
  if (!lo) return;
  const float2 hf = __half22float2(h);
  *reinterpret_cast<__half2*>(lo + o) = __floats2half2_rn(v.x - hf.x, v.y - hf.y);
  float s = v.x + v.y;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  if (lane == 0) *xs = s;
}
#endif
Status gemm_pipe(const GemmArgs& a, Stream s);
Status gemm_wg(const GemmArgs& a, Stream s);
constexpr int kGemmBM = 64;  // rows per tile (grouped tiles must use this)

// ---- row-wise helpers (prefill_elem.cu; the embedding rows: common/ops.h embed_rows) -----------------
// x += mix (when mix); n = x·rsqrt(mean x²+eps)·gain. x, mix, n: fp32 [M, H]; gain bf16 [H]. n is written when
// given; hi (and lo, xs when given) receive n split exactly as split_rows(n, H, M, H, hi, lo, xs) splits it, bit
// for bit, without n's round trip through memory (H a multiple of 64).
Status add_rmsnorm_rows(float* x, const float* mix, const void* gain, int M, int H, float eps, float* n, Stream s,
                        uint16_t* hi = nullptr, uint16_t* lo = nullptr, float* xs = nullptr);

// ---- MoE routing and combine (moe_prefill.cu) ------------------------------------------------
// logits fp32 [M, E + 1] (router rows, then shared gate) → per token top_k ids [M, k] and weights
// [M, k + 1] (renormalized when norm_topk; slot k = sigmoid(shared gate)); softmax in fp32,
// ties by lowest id. Then a counting sort of the M·k (token, j) pairs by expert: slot_tok [S]
// (token of each expert-major slot), slot_of [M, k] (slot of each pair), tiles [max_tiles, 4]
// for gemm with kGemmBM-row tiles. scratch: moe_route_scratch_ints(E) ints.
struct RouteArgs {
  const float* logits = nullptr;
  int M = 0, E = 0, top_k = 0;
  bool norm_topk = true;
  int32_t* topk_ids = nullptr;
  float* topk_w = nullptr;
  int32_t* slot_tok = nullptr;
  int32_t* slot_of = nullptr;
  int32_t* tiles = nullptr;
  int max_tiles = 0;
  int32_t* scratch = nullptr;
  // false: every tile kGemmBM rows ({expert, m0, m1, 0}); true (single-pass GEMMs only): an expert's rows in
  // tiles of 2·kGemmBM ({.., 1}), its last tile of ≤ kGemmBM rows a kGemmBM tile ({.., 0}), so the GEMM runs
  // each class at its own wgmma width (fewer, fuller tiles at ~64–128 rows an expert).
  bool wide = false;
};
Status moe_route(const RouteArgs& a, Stream s);
int moe_route_scratch_ints(int E);
inline int moe_max_tiles(int M, int E, int top_k) {
  const int S = M * top_k;
  return (S + kGemmBM - 1) / kGemmBM + (E < S ? E : S);
}
// out[m, c] = Σ_j w[m,j]·yd[slot_of[m,j], c] + w[m,k]·ys[m, c]   (fp32 [M, H])
Status moe_combine(const float* yd, const float* ys, const int32_t* slot_of, const float* topk_w, int M, int H,
                   int top_k, float* out, Stream s);

// ---- Gated DeltaNet prefill (gdn_prefill.cu) -------------------------------------------------
// u: fp32 [M, ldu] = [qkv (C) | z (vd) | a (nv) | b (nv)] projections. win_in/win_out: fp32
// [C, K-1] conv windows (oldest first) before / after these M tokens (may alias). S: fp16
// [nv, 128, 128]. Outputs: o fp32 [M, nv·128] = w ⊙ rms(o_raw) ⊙ silu(z) (gated norm applied).
struct GdnPrefillArgs {
  const float* u = nullptr;
  int ldu = 0, M = 0;
  const float* win_in = nullptr;
  float* win_out = nullptr;
  const void* conv_w = nullptr;  // bf16 [C, K]
  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* gnorm = nullptr;   // bf16 [128]
  uint16_t* S = nullptr;  // fp16 bits [nv, 128, 128] (read once, written once a call; fp32 arithmetic)
  int nk = 0, nv = 0, K = 4;
  float eps = 1e-6f;
  // scratch: qn, kn fp32 [M, nk·128]; v fp32 [M, nv·128]; g, beta fp32 [M, nv]; o_raw [M, nv·128]
  float *qn = nullptr, *kn = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr, *o_raw = nullptr;
  float* o = nullptr;
  // Instead of o (when set): o as fp16 bits [M, nv·128], each value rounded to nearest, the hi plane split_rows
  // would make of o (the single-pass out_proj's input, without the fp32 round trip).
  uint16_t* o16 = nullptr;
  // Chunked (WY) recurrence scratch, gdn_wy_floats(M, nv) floats (gdn_chunk.cu); required.
  float* wy = nullptr;
  int terms = 3;  // the chunked form's products: 3 (3xTF32, ~fp32) or 1 (single pass, tf32; the long chunks)
  // Profiling: called after each kernel launch with its name (prefill's per-op profile).
  void (*prof)(void* ctx, const char* what) = nullptr;
  void* prof_ctx = nullptr;
};
Status gdn_prefill(const GdnPrefillArgs& a, Stream s);
// gdn_prefill over n_seg independent segments (each its own state, window, rows of u and scratch,
// chunked form: wy set) in one launch per kernel: segs is a device array of their args, longest the
// args of the one with the most tokens (grid sizes; its pointers are not used). Each segment's
// arithmetic is exactly gdn_prefill's on it alone.
Status gdn_prefill_segments(const GdnPrefillArgs& longest, const GdnPrefillArgs* segs, int n_seg, Stream s);
// The recurrence alone in the chunked form (chunk 64, tensor cores, fp32 state): reads qn, kn, v,
// g, beta, updates S, writes o_raw. Called by gdn_prefill.
size_t gdn_wy_floats(int M, int nv);
Status gdn_chunk_scan(const GdnPrefillArgs& a, Stream s);
Status gdn_chunk_scan_segments(const GdnPrefillArgs& longest, const GdnPrefillArgs* segs, int n_seg, Stream s);
#ifdef __CUDACC__
// A kernel's args: its own (one sequence) or its segment's (grid z), from the device array segs.
template <bool kSeg>
__device__ __forceinline__ const GdnPrefillArgs& seg_args(const GdnPrefillArgs& a0, const GdnPrefillArgs* segs) {
  if constexpr (kSeg) return segs[blockIdx.z];
  else return a0;
}
#endif

// ---- attention prefill (attn_prefill.cu) -----------------------------------------------------
// u: fp32 [M, ldu] = [q (nh·qw, per head [q | gate] when qw = 2hd) | k (nkv·hd) | v (nkv·hd)].
// Writes K/V of positions pos0..pos0+M-1 into kc/vc (fp32 [nkv, max_seq, hd]) after k RMSNorm +
// RoPE, then causal GQA flash attention of the M queries over positions 0..pos0+m, output gate
// applied: out fp32 [M, nh·hd]. qb: scratch of 2·M·nh·hd 16-bit elements. terms 3 (split operands, the
// wgmma kernel of attn_wg.cu): q, K, V and P enter the MMAs as bf16 hi + lo, three MMAs per product
// (~16-bit operands), qb = bf16 [2][M, nh, hd] (q hi, q lo); terms 1 (single pass, attn_wg16.cuh, the
// chunks of pf::kPfSinglePassRows tokens and more): each operand rounded once to fp16, one MMA a product,
// qb = fp16 [M, nh, hd].
struct AttnPrefillArgs {
  const float* u = nullptr;
  int ldu = 0, M = 0, pos0 = 0;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  void* kc = nullptr;
  void* vc = nullptr;
  void* qb = nullptr;
  float* out = nullptr;
  // Instead of out (when set): the output as fp16 bits [M][nh·hd], rounded to nearest, the hi plane split_rows
  // would make of it (the single-pass o_proj's input, without the fp32 round trip).
  uint16_t* out16 = nullptr;
  int nh = 0, nkv = 0, hd = 0, qw = 0, rot = 0, max_seq = 0;
  int terms = 3;  // 3: split operands; 1: single pass (fp16)
  double theta = 1e7;
  float eps = 1e-6f;
  void (*prof)(void* ctx, const char* what) = nullptr;  // as GdnPrefillArgs::prof
  void* prof_ctx = nullptr;
};
Status attn_prefill(const AttnPrefillArgs& a, Stream s);
// Several sequences' prompt segments in one launch per kernel (the mixed step's segments: one launch of
// 16 heads × one 128-query tile a segment left most of the GPU idle, ~80 µs a segment and layer at 96
// tokens on an H100). base holds what the segments share (norms, shapes, theta, eps, ldu); each
// AttnSeg its rows' projections u [M][ldu] and output rows out [M][nh·hd], its caches, its own q scratch
// qb (2 planes × M × nh × hd bf16) and positions. ks is set here.
struct AttnSeg {
  const float* u = nullptr;
  float* out = nullptr;
  uint16_t* out16 = nullptr;  // as AttnPrefillArgs::out16
  void* kc = nullptr;
  void* vc = nullptr;
  void* qb = nullptr;
  uint16_t* ks = nullptr;  // this segment's split K/V planes (attn_flash_wg's scratch)
  int M = 0, pos0 = 0, max_seq = 0, Np = 0;
};
constexpr int kMaxAttnSegs = 16;  // segments a launch takes (kernel parameters); more run in groups
struct AttnSegs {
  int n = 0;
  AttnSeg s[kMaxAttnSegs];
};
Status attn_prefill_segments(const AttnPrefillArgs& base, const AttnSeg* segs, int n, Stream s);
#ifdef __CUDACC__
// base with segment sg's own rows, caches, q scratch and positions (what a kernel of one segment reads).
__host__ __device__ inline AttnPrefillArgs seg_attn_args(AttnPrefillArgs base, const AttnSeg& sg) {
  base.u = sg.u, base.out = sg.out, base.out16 = sg.out16, base.kc = sg.kc, base.vc = sg.vc, base.qb = sg.qb, base.M = sg.M, base.pos0 = sg.pos0;
  base.max_seq = sg.max_seq;
  return base;
}
#endif
// The flash step alone on wgmma (after prep wrote q and the segments' K/V):
// converts each segment's cache positions 0..pos0+M into bf16 hi/lo planes (scratch grown on demand), then
// the causal GQA flash attention of every segment, one launch each. Called by attn_prefill_segments.
Status attn_flash_wg(const AttnPrefillArgs& base, AttnSegs& segs, Stream s);

}  // namespace lily::cuda::pf
