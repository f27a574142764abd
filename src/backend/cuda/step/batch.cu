// CudaBackend::forward_batch: one decode step for B sequences (issue 7). The step is the decode
// graph's sequence of ops with every projection, the router, the experts and the lm_head applied to
// all B rows by the qgemm family (gemm/qgemm.h) and the mixers per row on each row's own state
// (deltanet/batch_gdn.cu, attention/batch_attn.cu).
// Per-row state pointers, positions and tokens live in one device table uploaded per step (one
// H2D copy), so the step is captured once per batch size as a CUDA graph and replayed for any set
// of sequences. Each row's result depends only on that row (batch invariant); with qgemm's two-pass
// activations it stays within ~1e-5 of what forward() gives the sequence alone. Rows fall back to
// the per-row loop where the batched kernels do not apply (DeltaNet heads wider than
// 256). B = 1 runs forward() (the batch-1 graph).
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "backend/cuda/step/batch_ctx.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm/qgemm.h"
#include "backend/cuda/moe/xgemm.h"
#include "backend/cuda/step/prefill_ops.h"

namespace lily {
namespace cuda {


void destroy_batch_ctx(BatchCtx* b) { delete b; }

bool env_is(const char* name, const char* val) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, val) == 0;
}
namespace {
bool graphs_on() { return !env_is("LILY_BATCH_GRAPH", "0"); }
// qgemm's activations go in two passes (fp16 hi + lo, ~22 bits: the batch-1 step's precision class, so a
// row batched stays within ~1e-5 of the row decoded alone). One pass measured +7..16% at 16..256 rows
// (H200, docs/perf/2026-12-04-serving-step.md) but moves a row's logits ~1e-3 from the same row alone
// (docs/perf/2026-12-05-gpu-single-pass.md), against "identical to the same request alone".
// From this many rows, top-k runs per row over the grid (brouter_topk) before the one-block routing
// table (broute); below it one launch does both (broute_topk: its 32 warps take the rows in turn).
// H200, 2026-12-04 (bench-batch, qgemm step): 16 rows 1,740 vs 1,746 tok/s (fused / split), 64 rows
// 2,886 vs 2,979, 256 rows 4,636 vs 4,900.
constexpr int kRouteSplitRows = 32;
bool route_split(int B) { return B >= kRouteSplitRows; }
}  // namespace

Status CudaBackend::batch_alloc(int B) {
  if (!batch_) batch_ = new BatchCtx();
  BatchCtx& x = *batch_;
  if (B <= x.cap) return Status::ok();
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  x.release();
  int cap = 8;
  while (cap < B) cap *= 2;
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
  const int qrows = c.num_attention_heads * (c.attn_output_gate ? 2 : 1) * c.head_dim + 2 * c.num_key_value_heads * c.head_dim;
  x.urows = std::max(C + vd + 2 * nv, qrows);
  const size_t Bc = size_t(cap), Is = size_t(c.shared_expert_intermediate_size);
  for (int i = 0; i < 2; ++i) x.xres[i] = dalloc<float>(Bc * H, x.owned);
  x.mix = dalloc<float>(Bc * H, x.owned);
  x.xn = dalloc<float>(Bc * H, x.owned);
  x.u = dalloc<float>(Bc * x.urows, x.owned);
  x.og = dalloc<float>(Bc * vd, x.owned);
  x.o = dalloc<float>(Bc * c.num_attention_heads * c.head_dim, x.owned);
  x.q = dalloc<float>(Bc * c.num_attention_heads * c.head_dim, x.owned);
  x.gprep = dalloc<float>(Bc * bgdn_prep_floats(c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                                                 c.linear_value_head_dim), x.owned);
  x.rl = dalloc<float>(Bc * (c.num_experts + 1), x.owned);
  x.topk_ids = dalloc<int32_t>(Bc * c.num_experts_per_tok, x.owned);
  x.topk_w = dalloc<float>(Bc * (c.num_experts_per_tok + 1), x.owned);
  x.logits = dalloc<float>(Bc * c.vocab_size, x.owned);
  x.partial = dalloc<float>(Bc * battn_partial_floats(c.num_attention_heads, c.num_key_value_heads, c.head_dim, attn_max_splits()), x.owned);
  {
    const size_t kmax = std::max<size_t>({size_t(H), size_t(vd), size_t(c.num_attention_heads) * c.head_dim});
    const size_t nent = Bc * (c.num_experts_per_tok + 1), I = size_t(c.moe_intermediate_size);
    x.XS_a = dalloc<float>(Bc * kmax / 32, x.owned);
    x.XS_b = dalloc<float>(nent * I / 32, x.owned);
    x.yd = dalloc<float>(nent * H, x.owned);
    x.items = dalloc<int32_t>(size_t(c.num_experts + 2) * 4, x.owned);
    x.n_items = dalloc<int32_t>(4, x.owned);
    x.rowb = dalloc<int32_t>(nent, x.owned);
    x.ent = dalloc<int32_t>(nent, x.owned);
    x.X_a = dalloc<uint16_t>(Bc * kmax, x.owned);
    x.X_b = dalloc<uint16_t>(nent * I, x.owned);
    x.Xl_a = dalloc<uint16_t>(Bc * kmax, x.owned);
    x.Xl_b = dalloc<uint16_t>(nent * I, x.owned);
    const bool sh_apart = Is != I;
    if (sh_apart) {
      x.act = dalloc<float>(Bc * 2 * Is, x.owned);
      x.X_s = dalloc<uint16_t>(Bc * Is, x.owned);
      x.Xl_s = dalloc<uint16_t>(Bc * Is, x.owned);
      x.XS_s = dalloc<float>(Bc * Is / 32, x.owned);
    }
    size_t wsf = 0, nc = 0;
    const int qkv_rows = qrows, in_rows = C + vd + 2 * nv;
    for (auto [r, k] : {std::pair{in_rows, H}, {H, vd}, {qkv_rows, H}, {H, c.num_attention_heads * c.head_dim},
                        {c.vocab_size, H}, {2 * int(Is), H}, {H, int(Is)}}) {
      wsf = std::max(wsf, qgemm_ws_floats(r, k, cap));
      nc = std::max(nc, qgemm_counters(r, k, cap));
    }
    x.ws = dalloc<float>(std::max<size_t>(wsf, 1), x.owned);
    x.cnt = dalloc<int32_t>(std::max<size_t>(nc, 1), x.owned);
    if (x.cnt) cudaMemset(x.cnt, 0, std::max<size_t>(nc, 1) * sizeof(int32_t));
    if (!x.yd || !x.ent || !x.XS_a || !x.XS_b || !x.X_a || !x.X_b || !x.Xl_a || !x.Xl_b || !x.ws || !x.cnt ||
        (sh_apart && (!x.act || !x.X_s || !x.Xl_s || !x.XS_s))) {
      x.release();
      return cu_err("cuda forward_batch: out of device memory for {} rows", cap);
    }
  }
  x.L = c.num_hidden_layers;
  x.ptr_off = (3 * Bc * 4 + 15) & ~size_t(15);
  x.tab_bytes = x.ptr_off + (1 + 2 * size_t(x.L)) * Bc * sizeof(void*);
  x.tab_dev = dalloc<char>(x.tab_bytes, x.owned);
  x.mtab_ptr_off = (2 * Bc * 4 + 15) & ~size_t(15);
  x.mtab_bytes = x.mtab_ptr_off + Bc * sizeof(void*);
  x.mtab_dev = dalloc<char>(x.mtab_bytes, x.owned);
  x.Gx = dalloc<uint16_t>(Bc * H, x.owned);
  x.Gxl = dalloc<uint16_t>(Bc * H, x.owned);
  x.Gxs = dalloc<float>(Bc * H / 32, x.owned);
  if (!x.tab_dev || !x.partial || !x.logits || !x.mtab_dev || !x.Gx || !x.Gxl || !x.Gxs || !x.gprep) {
    x.release();
    return cu_err("cuda forward_batch: out of device memory for {} rows", cap);
  }
  LILY_CU_TRY(cudaHostAlloc(&x.tab_host, x.tab_bytes, cudaHostAllocDefault));
  std::memset(x.tab_host, 0, x.tab_bytes);
  LILY_CU_TRY(cudaHostAlloc(&x.mtab_host, x.mtab_bytes, cudaHostAllocDefault));
  std::memset(x.mtab_host, 0, x.mtab_bytes);
  x.cap = cap;
  return Status::ok();
}

BGdnArgs bgdn_args(const BatchCtx& x, const ModelConfig& c, const DevLayer& L, int i, size_t r0, int B) {
  const int vd = c.gdn_value_dim();
  BGdnArgs g{};
  g.u = x.u + r0 * x.urows, g.ldu = x.urows, g.conv_w = L.conv_w, g.conv = x.p0(i) + r0;
  g.S = reinterpret_cast<uint16_t* const*>(x.p1(i)) + r0, g.pos = x.pos() + r0, g.A_log = L.A_log, g.dt_bias = L.dt_bias;
  g.gnorm = L.gnorm, g.og = x.og + r0 * size_t(vd), g.ldo = vd;
  g.nk = c.linear_num_key_heads, g.nv = c.linear_num_value_heads, g.dk = c.linear_key_head_dim;
  g.dv = c.linear_value_head_dim, g.prep = x.gprep, g.K = c.linear_conv_kernel_dim, g.B = B, g.eps = c.rms_norm_eps;
  return g;
}

// The MoE block of the qgemm step on B rows packed in x.X_a (+ x.Xl_a) / x.XS_a, the same rows fp32 in hn
// [B][H]: router, routing table, gate+up+SwiGLU (packed for down by its epilogue) and down, expert-major,
// into x.yd [B·k + B][H] with the weights in x.topk_w (the combine is the caller's: folded into the next
// add + norm, or bmoe_combine). The router of rows [0, exact) is bgemv_grouped on hn (each row's logits
// bit-identical to the decode GEMV's: decode and verify rows route as they would alone); the other rows
// (prompt rows) take the prefill's router GEMM (8-bit pipe kernel on hn split into fp16 hi/lo in the
// prefill scratch rs): ~8× faster a row than the grouped GEMV, and the precision class of a prompt
// prefilled alone.
template <typename Mk>
static Status moe_tc(BatchCtx& x, const ModelConfig& c, const DevLayer& L, const float* hn, int B, int exact,
                     const RouterSplit& rs, cudaStream_t s, Mk&& mk) {
  const int H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  uint16_t* la = x.Xl_a;
  uint16_t* lb = x.Xl_b;
  if (exact > 0) LILY_TRY(bgemv_grouped(L.router, hn, H, x.rl, E + 1, exact, s));
  if (exact < B) {
    if (!rs.ah) return cu_err("cuda step: prompt rows' router needs the prefill scratch");
    const int M = B - exact;
    LILY_TRY(pf::split_rows(hn + size_t(exact) * H, H, M, H, rs.ah, rs.al, rs.axs, s));
    pf::GemmArgs g{};
    g.w = L.router, g.n_out = L.router.rows, g.M = M;
    g.y = x.rl + size_t(exact) * (E + 1), g.ldy = E + 1, g.ah = rs.ah, g.al = rs.al, g.axs = rs.axs;
    LILY_TRY(pf::gemm(g, s));
  }
  mk("router");
  // The shared expert is the routing table's last item at the routed experts' width; at another width it
  // runs apart as two dense GEMMs over the B rows (gate+up into act, SwiGLU packed, down into yd's shared
  // rows B·k + b), so the combine is the same.
  const int Is = c.shared_expert_intermediate_size;
  const bool sh_item = Is == I;
  if (route_split(B)) {
    LILY_TRY(brouter_topk(x.rl, E + 1, E, k, c.norm_topk_prob, L.router.rows > E, x.topk_ids, x.topk_w, B, s));
    LILY_TRY(broute(x.topk_ids, B, k, E, x.items, x.n_items, x.rowb, x.ent, sh_item, s));
  } else {
    LILY_TRY(broute_topk(x.rl, E + 1, c.norm_topk_prob, L.router.rows > E, x.topk_ids, x.topk_w, B, k, E, x.items,
                         x.n_items, x.rowb, x.ent, sh_item, s));
  }
  mk("top-k + route");
  QGemmArgs m{};
  m.w = L.gate, m.w2 = L.up, m.sh = sh_item ? L.sh_gate_up : QW{}, m.x = x.X_a, m.xs = x.XS_a, m.xlo = la, m.ldx = H;
  m.swiglu = true, m.yx = x.X_b, m.yxs = x.XS_b, m.yxlo = lb, m.n_out = I, m.items = x.items, m.n_items = x.n_items;
  m.max_items = std::min(B * k, E) + 1, m.E = E, m.xrow = x.rowb, m.yrow = x.ent, m.ent_hint = B * k;
  // The experts' fragment copies where made (CudaBackend::frag_copies) and the rows fit their tiles.
  LILY_TRY(L.frag.gu.codes && xgemm_fits(m) ? xgemm(m, L.frag.gu, L.frag.sgu, s) : qgemm(m, s));
  QGemmArgs g{};  // the shared expert apart: dense
  if (!sh_item) {
    g.w = L.sh_gate_up, g.x = x.X_a, g.xs = x.XS_a, g.xlo = la, g.ldx = H, g.M = B, g.y = x.act, g.ldy = 2 * Is;
    g.ws = x.ws, g.cnt = x.cnt;
    LILY_TRY(qgemm(g, s));
    LILY_TRY(xpack16_swiglu(x.act, 2 * Is, Is, B, x.X_s, x.XS_s, x.Xl_s, s));
  }
  mk("moe gate+up (experts)");
  m.w = L.down, m.w2 = QW{}, m.sh = sh_item ? L.sh_down : QW{}, m.x = x.X_b, m.xs = x.XS_b, m.xlo = lb, m.ldx = I;
  m.swiglu = false, m.yx = nullptr, m.yxs = nullptr, m.yxlo = nullptr, m.y = x.yd, m.ldy = H, m.n_out = H, m.xrow = x.ent;
  LILY_TRY(L.frag.dn.codes && xgemm_fits(m) ? xgemm(m, L.frag.dn, L.frag.sdn, s) : qgemm(m, s));
  if (!sh_item) {
    g.w = L.sh_down, g.x = x.X_s, g.xs = x.XS_s, g.xlo = x.Xl_s, g.ldx = Is, g.y = x.yd + size_t(B) * k * H;
    g.ldy = H;
    LILY_TRY(qgemm(g, s));
  }
  mk("moe down (experts)");
  return Status::ok();
}


// The step on the qgemm path: every projection, the router, the experts and the lm_head through
// qgemm on packed inputs; MoE expert-major (routing table on the device); the MoE combine folded into
// the next add + norm. Mixers as the exact path. B rows in all; a mixed step (mp) runs the batched
// mixers on its decode rows only and the lm_head on its n_out rows.
Status enqueue_tc(BatchCtx& x, const ModelConfig& c, const DevWeights& d, int B, cudaStream_t s, const Marker& mk,
                  const MixedPlan* mp) {
  const int Bd = mp ? mp->D : B;  // rows on the batched (decode) mixers
  const int Ba = mp && mp->Da >= 0 ? mp->Da : Bd;  // rows on the batched decode attention
  const int H = c.hidden_size, vd = c.gdn_value_dim(), k = c.num_experts_per_tok;
  const int nhd = c.num_attention_heads * c.head_dim;
  const float eps = c.rms_norm_eps;
  uint16_t* la = x.Xl_a;
  auto dense = [&](const QW& w, float* y, int ldy) {
    QGemmArgs g{};
    g.w = w, g.x = x.X_a, g.xs = x.XS_a, g.xlo = la, g.ldx = w.cols, g.M = B, g.y = y, g.ldy = ldy, g.ws = x.ws, g.cnt = x.cnt;
    return qgemm(g, s);
  };
  // add + norm (+ the previous layer's MoE combine when moe) → packed X_a.
  auto norm = [&](const float* in, const float* mix, bool moe, const void* gain, float* res_out, float* n_out = nullptr) {
    BNormArgs n{};
    n.in = in, n.mix = moe ? nullptr : mix, n.yd = moe ? x.yd : nullptr, n.tw = x.topk_w, n.top_k = k;
    n.gain = gain, n.H = H, n.B = B, n.eps = eps, n.res_out = res_out, n.n_out = n_out, n.XS = x.XS_a, n.X16 = x.X_a;
    n.X16lo = la;
    return bnorm_pack(n, s);
  };
  LILY_TRY(embed_rows(d.embed, x.tok(), B, x.xres[0], s));
  mk("embed");
  int p = 0;
  bool moe_pending = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d.layers[size_t(i)];
    LILY_TRY(norm(x.xres[p], nullptr, moe_pending, L.in_norm, x.xres[p ^ 1]));
    mk("add+norm+pack");
    if (!L.attn) {
      LILY_TRY(dense(L.in_proj, x.u, x.urows));
      mk("gdn in_proj gemm");
      if (Bd > 0) LILY_TRY(bgdn_step(bgdn_args(x, c, L, i, 0, Bd), s));
      mk("gdn step");
      if (mp) {
        LILY_TRY(mp->seg_mixers(i, false));
        mk("gdn segments (prefill kernels)");
      }
      LILY_TRY(xpack16(x.og, vd, vd, B, x.X_a, x.XS_a, la, s));
      mk("pack");
      LILY_TRY(dense(L.out_proj, x.mix, H));
      mk("gdn out_proj gemm");
    } else {
      LILY_TRY(dense(L.qkv, x.u, x.urows));
      mk("attn qkv gemm");
      BAttnArgs a{};
      a.qkv = x.u, a.ldqkv = x.urows, a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.q = x.q, a.kc = x.p0(i), a.vc = x.p1(i);
      a.cap = x.caps(), a.pos = x.pos(), a.out = x.o, a.partial = x.partial, a.nh = c.num_attention_heads;
      a.nkv = c.num_key_value_heads, a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim;
      a.rot = c.rotary_dim(), a.n_split = attn_max_splits(), a.B = Ba;
      a.theta = c.rope_theta, a.eps = eps;
      if (Ba > 0) LILY_TRY(battn(a, s));
      mk("attn prep+decode+merge");
      if (mp) {
        LILY_TRY(mp->seg_mixers(i, true));
        mk("attn segments (prefill kernels)");
      }
      LILY_TRY(xpack16(x.o, nhd, nhd, B, x.X_a, x.XS_a, la, s));
      mk("pack");
      LILY_TRY(dense(L.o_proj, x.mix, H));
      mk("attn o_proj gemm");
    }
    p ^= 1;
    LILY_TRY(norm(x.xres[p], x.mix, false, L.post_norm, x.xres[p ^ 1], x.xn));
    mk("add+norm+pack");
    LILY_TRY(moe_tc(x, c, L, x.xn, B, mp ? Ba : B, mp ? mp->router : RouterSplit{}, s, mk));
    p ^= 1;
    moe_pending = true;
  }
  LILY_TRY(norm(x.xres[p], nullptr, moe_pending, d.final_norm, nullptr));
  if (!mp) {
    LILY_TRY(dense(d.lm_head, x.logits, c.vocab_size));
    mk("final norm+lm_head");
    return Status::ok();
  }
  // The rows that need logits, gathered (packed) for the lm_head.
  const int32_t* idx = x.out_idx(x.mtab_dev);
  LILY_TRY(brow_gather(x.X_a, size_t(H) * 2, idx, mp->n_out, x.Gx, s));
  LILY_TRY(brow_gather(la, size_t(H) * 2, idx, mp->n_out, x.Gxl, s));
  LILY_TRY(brow_gather(x.XS_a, size_t(H / 64) * 2 * sizeof(float), idx, mp->n_out, x.Gxs, s));
  QGemmArgs g{};
  g.w = d.lm_head, g.x = x.Gx, g.xs = x.Gxs, g.xlo = x.Gxl, g.ldx = H, g.M = mp->n_out, g.y = x.logits;
  g.ldy = c.vocab_size, g.ws = x.ws, g.cnt = x.cnt;
  if (mp->n_out > 0) LILY_TRY(qgemm(g, s));
  mk("final norm+lm_head");
  return Status::ok();
}

Status CudaBackend::enqueue_batch(int B, cudaStream_t s) {
  BatchCtx& x = *batch_;
  const Marker mk = [&](const char* name) { x.mark(name, s); };
  mk("start");
  LILY_TRY(enqueue_tc(x, cfg_, d_, B, s, mk, nullptr));
  return bfinish(x.ctl(), x.pos(), B, s);
}

// After a profiled step (events recorded): the table on the third step of this kind (key: the batch size,
// or minus the rows of a mixed step), then the events go.
void CudaBackend::end_profile(int key, int B) {
  BatchCtx& x = *batch_;
  if (x.ev.empty()) return;
  if (++x.prof_calls[key] == 3) print_profile(B);
  for (auto& e : x.ev) cudaEventDestroy(e.second);
  x.ev.clear();
}

void CudaBackend::print_profile(int B) {
  const double total = print_op_rows(
      batch_->ev, "cuda forward_batch profile, B = " + std::to_string(B) + " (one un-captured step, events between ops):");
  std::fprintf(stderr, "| total | | %.3f | |\n", total);
}

// Prompt chunks of up to this many tokens run their MoE through the batched step's expert kernels
// (moe_rows); longer ones take the prefill's 64-row-tile grouped GEMMs. At ~100 tokens the tiles hold
// ~3 rows each and the grouped GEMMs take ~19 of a chunk's ~34 ms; the expert-major 8-row chunks read
// each routed expert once per 8 rows. Prefill tok/s on the H200 (2026-12-03, grouped → batched):
// 16 tokens 744 → 1,063, 96: 2,812 → 3,938, 128: 3,610 → 4,903, 256: 6,660 → 6,975.
constexpr int kPfSmallMoeMax = 256;

bool CudaBackend::moe_rows_ok(int M) {
  if (M > kPfSmallMoeMax) return false;
  // The batch scratch holds M rows: (re)allocated here while no step graph is captured; never regrown
  // under captured graphs (prepare sizes it for both).
  if (batch_ && batch_->cap >= M) return true;
  if (batch_ && !batch_->graphs.empty()) return false;
  return batch_alloc(M).is_ok();
}

// The batched step's MoE block over M rows of normed input hn [M][H] fp32, combined into mix [M][H]
// (moe_rows_ok(M) first). The prefill's short chunks use it.
Status CudaBackend::moe_rows(const DevLayer& L, const float* hn, int M, float* mix, cudaStream_t s) {
  const ModelConfig& c = cfg_;
  BatchCtx& x = *batch_;
  const int H = c.hidden_size;
  LILY_TRY(xpack16(hn, H, H, M, x.X_a, x.XS_a, x.Xl_a, s));
  LILY_TRY(moe_tc(x, c, L, hn, M, 0, RouterSplit{pf_.ah, pf_.al, pf_.axs}, s, [](const char*) {}));
  return bmoe_combine(x.yd, x.topk_w, c.num_experts_per_tok, H, M, mix, s);
}

// The step graph of B rows, captured the first time B is seen (it reads the rows from the row
// table, so one graph serves any set of B states).
Status CudaBackend::batch_graph(int B, cudaGraphExec_t& out) {
  BatchCtx& x = *batch_;
  auto it = x.graphs.find(B);
  if (it == x.graphs.end()) {
    cudaGraph_t g = nullptr;
    LILY_CU_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status s = enqueue_batch(B, stream_);
    cudaError_t e = cudaStreamEndCapture(stream_, &g);
    if (!s) {
      if (g) cudaGraphDestroy(g);
      return s;
    }
    if (e != cudaSuccess) return cu_err("cuda forward_batch: graph capture failed: {}", cudaGetErrorString(e));
    cudaGraphExec_t ex = nullptr;
    e = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return cu_err("cuda forward_batch: graph instantiation failed: {}", cudaGetErrorString(e));
    it = x.graphs.emplace(B, ex).first;
  }
  out = it->second;
  return Status::ok();
}

// Sizes the batch scratch (for mixed steps of max_rows + step_tokens rows, and the prefill's short
// chunks) and the draw buffers for max_rows once and captures the step graph of every batch size 2..max_rows (B = 1 is the batch-1 graph), so
// that a batch growing to a size not seen before costs no capture (tens of ms) in the middle of
// serving. Then a throwaway 16-token prefill, two decode steps and one pipelined draw: the first
// request's TTFT no longer includes the kernels' first use and the batch-1 graph's capture (~50 ms).
Status CudaBackend::prepare(int max_rows, int step_tokens) {
  if (max_rows >= 2 && cfg_.linear_value_head_dim <= 256 && graphs_on()) {
    LILY_TRY(batch_alloc(std::max(max_rows + step_tokens, kPfSmallMoeMax)));
    LILY_TRY(ensure_draw(max_rows));
    for (int B = 2; B <= max_rows; ++B) {
      cudaGraphExec_t ex = nullptr;
      LILY_TRY(batch_graph(B, ex));
    }
  }
  auto st = new_state(64);
  if (!st) return st.status();
  std::vector<int32_t> toks(16);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i) % cfg_.vocab_size;
  std::vector<float> logits(size_t(cfg_.vocab_size));
  LILY_TRY(forward(**st, toks, logits));
  for (int i = 0; i < 2; ++i) LILY_TRY(forward(**st, std::span<const int32_t>(toks.data(), 1), logits));
  Drawn d;
  LILY_TRY(launch_draw(static_cast<CudaSeqState&>(**st), toks[1], DrawSpec{}));
  return collect_draw(d);
}

Status CudaBackend::forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                                  std::span<float> logits) {
  return batch_step(states, tokens, logits, {}, {});
}

// One batched step; the rows' logits go to `logits` (host), or, when `spec` is given, each row's
// token is drawn on the device (draw_backend.cu) and only `out` comes back (decode_draw has checked
// that spec and out hold B rows).
Status CudaBackend::batch_step(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                               std::span<float> logits, std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const int B = int(states.size());
  const size_t V = size_t(cfg_.vocab_size);
  const bool draw = !spec.empty();
  if (tokens.size() != states.size()) return cu_err("forward_batch: {} states but {} tokens", B, tokens.size());
  if (B == 0) return Status::ok();
  if (!draw && logits.size() != size_t(B) * V) return cu_err("forward_batch: logits must hold {} rows of {}", B, V);
  std::vector<CudaSeqState*> seqs(static_cast<size_t>(B));
  bool batched = B >= 2 && cfg_.linear_value_head_dim <= 256;
  for (int b = 0; b < B; ++b) {
    seqs[size_t(b)] = dynamic_cast<CudaSeqState*>(states[size_t(b)]);
    CudaSeqState* r = seqs[size_t(b)];
    if (!r || r->be != this) return cu_err("forward_batch: row {}'s state belongs to another backend", b);
    if (r->n + 1 > r->cap) return cu_err("forward_batch: row {} is full ({} of max_seq {})", b, r->n, r->cap);
    if (tokens[size_t(b)] < 0 || tokens[size_t(b)] >= cfg_.vocab_size)
      return cu_err("forward_batch: row {}'s token {} outside the vocabulary", b, tokens[size_t(b)]);
    for (int j = 0; j < b; ++j)
      if (seqs[size_t(j)] == r) return cu_err("forward_batch: rows {} and {} share one state", j, b);
  }
  if (!batched) return draw ? Backend::decode_draw(states, tokens, spec, out) : Backend::forward_batch(states, tokens, logits);
  LILY_TRY(batch_alloc(B));
  BatchCtx& x = *batch_;
  // Row table on the host (pinned), then one copy to the device.
  for (int b = 0; b < B; ++b) x.put_row(b, *seqs[size_t(b)], tokens[size_t(b)], seqs[size_t(b)]->n);
  LILY_CU_TRY(cudaMemcpyAsync(x.tab_dev, x.tab_host, x.tab_bytes, cudaMemcpyHostToDevice, stream_));
  x.prof = env_is("LILY_BATCH_PROFILE", "1");
  if (x.prof) {
    Status ps = enqueue_batch(B, stream_);
    x.prof = false;
    LILY_TRY(ps);
  } else if (graphs_on()) {
    cudaGraphExec_t ex = nullptr;
    LILY_TRY(batch_graph(B, ex));
    LILY_CU_TRY(cudaGraphLaunch(ex, stream_));
  } else {
    LILY_TRY(enqueue_batch(B, stream_));
  }
  // Logits to the host: straight into the caller's (pageable) span.
  if (draw) {
    LILY_TRY(draw_device(x.logits, B, spec, out));
  } else {
    LILY_CU_TRY(cudaMemcpyAsync(logits.data(), x.logits, size_t(B) * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    LILY_CU_TRY(cudaStreamSynchronize(stream_));
  }
  for (CudaSeqState* r : seqs) r->n += 1;
  end_profile(B, B);
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
