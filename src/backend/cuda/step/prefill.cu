// Prefill on the CUDA backend: M tokens appended to a sequence, processed in chunks (default
// 4096 tokens, LILY_PREFILL_CHUNK) with scratch bounded by the chunk: per layer tensor-core GEMMs
// over the packed weights (gemm_wg.cu, gemm_q8.cu), the DeltaNet recurrence in one launch (gdn_prefill.cu) or
// causal flash attention over the cache (attn_prefill.cu), and MoE routed on the device
// (moe_prefill.cu). Activations stay fp32; the state written (K/V cache, conv window, S, the step
// control block's pos) is the decode graph's, so decode continues seamlessly. A few tokens
// (M < LILY_PREFILL_MIN, default 8; LILY_PREFILL_MIN=1000000 bypasses these kernels) or an
// unsupported shape replay the decode graph instead: on the H200 a prefill forward costs about
// 15 ms + 0.22 ms per token at small M (engine trace, 2026-12-03) and a decode step 2.2 ms, so
// below about 8 tokens the decode graph is faster.
#include <climits>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/step/prefill_ops.h"

namespace lily {
namespace cuda {

namespace {
int env_int(const char* name, int def, int lo, int hi) {
  const char* e = std::getenv(name);
  if (!e || !*e) return def;
  const int v = std::atoi(e);
  return v >= lo && v <= hi ? v : def;
}

// The 4-bit GEMMs', the attention's and the chunked DeltaNet's terms of a chunk of M tokens: 1 (single pass) from pf::kPfSinglePassRows
// rows on, or from LILY_PF_SINGLE_MIN (a test hook: the goldens and tiny models at short lengths through the
// single-pass kernels).
int pf_terms(int M) {
  static const int from = env_int("LILY_PF_SINGLE_MIN", pf::kPfSinglePassRows, 1, INT_MAX);
  return M >= from ? 1 : 2;
}

// Per-op time table of one profiled prefill (events recorded by mark()).
void print_pf_profile(std::vector<std::pair<const char*, cudaEvent_t>>& ev, int M) {
  const double total = print_op_rows(ev, "cuda prefill profile, " + std::to_string(M) + " tokens:");
  std::fprintf(stderr, "| total | | %.3f | (%.0f tok/s) |\n", total, M / (total * 1e-3));
}
}  // namespace

Status CudaBackend::pf_alloc(int chunk) {
  if (chunk <= pf_cap_) return Status::ok();
  if (pf_cap_ > 0) return cu_err("cuda prefill: scratch already sized for {} tokens", pf_cap_);
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
  const int kd = c.gdn_key_dim(), E = c.num_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int qrows = c.num_attention_heads * (c.attn_output_gate ? 2 : 1) * c.head_dim + 2 * c.num_key_value_heads * c.head_dim;
  const size_t M = size_t(chunk), urows = std::max<size_t>(size_t(C) + vd + 2 * nv, qrows);
  const size_t wide = std::max<size_t>(vd, size_t(c.num_attention_heads) * c.head_dim);
  auto& p = pf_;
  p.tok = dalloc<int32_t>(M, owned_);
  p.x = dalloc<float>(M * H, owned_);
  p.hn = dalloc<float>(M * H, owned_);
  p.mix = dalloc<float>(M * H, owned_);
  p.u = dalloc<float>(M * urows, owned_);
  p.qn = dalloc<float>(M * kd, owned_);
  p.kn = dalloc<float>(M * kd, owned_);
  p.v = dalloc<float>(M * vd, owned_);
  p.g = dalloc<float>(M * nv, owned_);
  p.beta = dalloc<float>(M * nv, owned_);
  p.o_raw = dalloc<float>(M * wide, owned_);
  p.o = dalloc<float>(M * wide, owned_);
  const size_t split_el = std::max({M * H, M * wide, M * k * I, M * size_t(c.shared_expert_intermediate_size)});
  p.ah = dalloc<uint16_t>(split_el, owned_);
  p.al = dalloc<uint16_t>(split_el, owned_);
  p.axs = dalloc<float>(split_el / 64, owned_);
  p.qb = dalloc<uint16_t>(2 * M * size_t(c.num_attention_heads) * c.head_dim, owned_);  // q hi, lo
  p.rl = dalloc<float>(M * (E + 1), owned_);
  p.topk_ids = dalloc<int32_t>(M * k, owned_);
  p.topk_w = dalloc<float>(M * (k + 1), owned_);
  p.slot_tok = dalloc<int32_t>(M * k, owned_);
  p.slot_of = dalloc<int32_t>(M * k, owned_);
  p.max_tiles = pf::moe_max_tiles(chunk, E, k);
  p.tiles = dalloc<int32_t>(size_t(p.max_tiles) * 4, owned_);
  p.rscratch = dalloc<int32_t>(pf::moe_route_scratch_ints(E), owned_);
  p.act = dalloc<float>(M * k * I, owned_);
  p.yd = dalloc<float>(M * k * H, owned_);
  p.sact = dalloc<float>(M * c.shared_expert_intermediate_size, owned_);
  p.sact16 = dalloc<uint16_t>(M * c.shared_expert_intermediate_size, owned_);
  p.sy = dalloc<float>(M * H, owned_);
  p.wy = dalloc<float>(pf::gdn_wy_floats(chunk, nv), owned_);
  p.seg_args = dalloc<pf::GdnPrefillArgs>(size_t(n_gdn_layers()) * pf::kMaxAttnSegs, owned_);
  if (!p.sy || !p.wy || !p.yd || !p.act || !p.u || !p.ah || !p.al || !p.axs || !p.seg_args || !p.sact16)
    return cu_err("cuda prefill: out of device memory for a {}-token chunk", chunk);
  LILY_CU_TRY(cudaHostAlloc(&p.pos_host, pf::kMaxAttnSegs * sizeof(int32_t), cudaHostAllocDefault));
  pf_cap_ = chunk;
  return Status::ok();
}

pf::GdnPrefillArgs CudaBackend::gdn_args(int i, CudaSeqState& st, int pos0, int M, const float* u, int ldu, size_t pr,
                                         float* o, float* wy) const {
  const ModelConfig& c = cfg_;
  const DevLayer& L = d_.layers[size_t(i)];
  auto& SL = st.layers[size_t(i)];
  const auto& p = pf_;
  pf::GdnPrefillArgs g{};
  g.u = u, g.ldu = ldu, g.M = M;
  // Conv window: fp32 [2, C, K-1] double-buffered by position parity.
  const size_t wn = size_t(c.gdn_conv_dim()) * (c.linear_conv_kernel_dim - 1);
  g.win_in = SL.conv + size_t(pos0 & 1) * wn, g.win_out = SL.conv + size_t((pos0 + M) & 1) * wn;
  g.conv_w = L.conv_w, g.A_log = L.A_log, g.dt_bias = L.dt_bias, g.gnorm = L.gnorm, g.S = SL.S;
  g.nk = c.linear_num_key_heads, g.nv = c.linear_num_value_heads, g.K = c.linear_conv_kernel_dim, g.eps = c.rms_norm_eps;
  const size_t kd = size_t(c.gdn_key_dim()), vd = size_t(c.gdn_value_dim()), nv = size_t(c.linear_num_value_heads);
  g.qn = p.qn + pr * kd, g.kn = p.kn + pr * kd, g.v = p.v + pr * vd, g.g = p.g + pr * nv, g.beta = p.beta + pr * nv;
  g.o_raw = p.o_raw + pr * vd, g.o = o, g.wy = wy;
  return g;
}

int CudaBackend::n_gdn_layers() const {
  return int(std::count_if(d_.layers.begin(), d_.layers.end(), [](const DevLayer& l) { return !l.attn; }));
}

// One prefill pass over segments (PfSeg): segment j's tokens are rows row_j .. row_j + M_j of pf_.tok (the
// segments' rows one after the other), appended to its sequence at st->n (advanced by the caller). Every
// token-parallel op (norms, GEMMs, router, experts) runs once over all rows; the mixers once per kernel for
// all segments (gdn_prefill_segments, attn_prefill_segments). A row's arithmetic is that of its segment
// alone: the GEMMs, the router and the MoE treat rows independently (same k order whatever the tile), and a
// segments launch of the mixers computes each segment exactly as alone. The segments share one terms
// (pf_terms of each one's length), so a prompt's rounding depends on its own segments only.
Status CudaBackend::pf_pass(std::span<const PfSeg> segs) {
  const ModelConfig& c = cfg_;
  auto& p = pf_;
  cudaStream_t s = stream_;
  const int H = c.hidden_size, vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
  const int E = c.num_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const float eps = c.rms_norm_eps;
  const int n_seg = int(segs.size());
  if (n_seg < 1 || n_seg > pf::kMaxAttnSegs) return cu_err("cuda prefill: {} segments in a pass (1..{})", n_seg, pf::kMaxAttnSegs);
  int M = 0;
  size_t wy_need = 0;
  std::vector<int> row0(size_t(n_seg) + 1);
  for (int j = 0; j < n_seg; ++j) {
    if (segs[size_t(j)].M <= 0 || pf_terms(segs[size_t(j)].M) != pf_terms(segs[0].M))
      return cu_err("cuda prefill: a pass's segments share one precision ({} and {} tokens)", segs[0].M, segs[size_t(j)].M);
    row0[size_t(j)] = M, M += segs[size_t(j)].M, wy_need += pf::gdn_wy_floats(segs[size_t(j)].M, nv);
  }
  row0[size_t(n_seg)] = M;
  if (M > pf_cap_ || wy_need > pf::gdn_wy_floats(pf_cap_, nv)) return cu_err("cuda prefill: a pass of {} rows exceeds the scratch ({})", M, pf_cap_);
  // Each GEMM input is split once (p.ah, and where read p.al/axs), then read by every GEMM on that input
  // (e.g. router, expert gate/up and shared gate/up all read one split of hn). The 4-bit GEMMs run the
  // Hopper wgmma kernel (gemm_wg.cu): single pass from kPfSinglePassRows rows on (the fp16 plane only),
  // two pass below (hi + lo planes and group sums); the 8-bit router the mma.sync pipe kernel (gemm_q8.cu),
  // two pass always (its input's split is full). The producers write the splits themselves, bit for bit what
  // split_rows would make: the norms always; at single pass also the DeltaNet readout, the attention output
  // and the SwiGLU GEMMs (fp16 outputs), so split_rows runs only on the two-pass chunks' o and act.
  const int terms = pf_terms(segs[0].M);
  // A short chunk runs its MoE on the batched step's expert kernels (moe_rows); a pass of several segments
  // has single-pass ones only (CudaBackend::step), so M is far above that kernel's rows.
  const bool small_moe = moe_rows_ok(M);
  auto split = [&](const float* a, int lda, int rows, int K, bool full = false) -> Status {
    full = full || terms == 2;
    LILY_TRY(pf::split_rows(a, lda, rows, K, p.ah, full ? p.al : nullptr, full ? p.axs : nullptr, s));
    mark("gemm A split (fp16 hi/lo + sums)", s);
    return Status::ok();
  };
  // x += add, then RMSNorm straight into the split the next GEMMs read (add_rmsnorm_rows writes it bit for bit as
  // split_rows would; no fp32 round trip of the normed rows).
  auto norm_split = [&](const float* add, const void* gain, bool full) -> Status {
    full = full || terms == 2;
    LILY_TRY(pf::add_rmsnorm_rows(p.x, add, gain, M, H, eps, nullptr, s, p.ah, full ? p.al : nullptr, full ? p.axs : nullptr));
    mark("add+rmsnorm (+ A split)", s);
    return Status::ok();
  };
  auto with_split = [&](pf::GemmArgs& g) {
    g.ah = p.ah, g.al = p.al, g.axs = p.axs, g.terms = terms;
  };
  // y [m, ldy] = w · (the last split's m rows).
  auto gemm = [&](const QW& w, int m, float* y, int ldy) {
    pf::GemmArgs g{};
    g.w = w, g.n_out = w.rows, g.M = m, g.y = y, g.ldy = ldy;
    with_split(g);
    return pf::gemm(g, s);
  };
  // Sub-kernel marks of the DeltaNet and attention groups (profiling only; mark() is a no-op otherwise).
  auto prof_cb = +[](void* ctx, const char* what) {
    auto* be = static_cast<CudaBackend*>(ctx);
    be->mark(what, be->stream_);
  };
  // The segments' DeltaNet args of every layer (a pass of several: one device array, uploaded once); segment
  // j's scratch rows start at its row, its WY scratch after the previous segments'.
  const int n_gdn = n_gdn_layers();
  std::vector<pf::GdnPrefillArgs> gargs(size_t(n_gdn) * size_t(n_seg));
  int longest = 0;
  for (int j = 1; j < n_seg; ++j)
    if (segs[size_t(j)].M > segs[size_t(longest)].M) longest = j;
  for (int i = 0, gi = 0; i < c.num_hidden_layers; ++i) {
    if (d_.layers[size_t(i)].attn) continue;
    const int ldu = d_.layers[size_t(i)].in_proj.rows;
    size_t wy_off = 0;
    for (int j = 0; j < n_seg; ++j) {
      const PfSeg& sg = segs[size_t(j)];
      const size_t r = size_t(row0[size_t(j)]);
      pf::GdnPrefillArgs& g = gargs[size_t(gi) * n_seg + j];
      g = gdn_args(i, *sg.st, sg.st->n, sg.M, p.u + r * ldu, ldu, r, p.o + r * vd, p.wy + wy_off);
      g.terms = terms == 1 ? 1 : 3;
      // Single pass: the readout straight to fp16 in the split plane the out_proj GEMM reads (in_proj has read
      // the input's split there by then).
      if (terms == 1) g.o16 = p.ah + r * vd;
      wy_off += pf::gdn_wy_floats(sg.M, nv);
    }
    ++gi;
  }
  if (n_seg > 1)
    LILY_CU_TRY(cudaMemcpyAsync(p.seg_args, gargs.data(), gargs.size() * sizeof(pf::GdnPrefillArgs), cudaMemcpyHostToDevice, s));
  LILY_TRY(embed_rows(d_.embed, p.tok, M, p.x, s));
  mark("embed rows", s);
  const float* mix = nullptr;
  for (int i = 0, gi = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d_.layers[i];
    LILY_TRY(norm_split(mix, L.in_norm, false));
    if (!L.attn) {
      const int ldu = L.in_proj.rows;
      LILY_TRY(gemm(L.in_proj, M, p.u, ldu));
      mark("gdn: [qkv|z|a|b] gemm", s);
      pf::GdnPrefillArgs& g = gargs[size_t(gi) * n_seg + longest];
      g.prof = prof_cb, g.prof_ctx = this;
      if (n_seg == 1) LILY_TRY(pf::gdn_prefill(g, s));
      else LILY_TRY(pf::gdn_prefill_segments(g, static_cast<const pf::GdnPrefillArgs*>(p.seg_args) + size_t(gi) * n_seg, n_seg, s));
      ++gi;
      if (terms != 1) LILY_TRY(split(p.o, vd, M, vd));
      LILY_TRY(gemm(L.out_proj, M, p.mix, H));
      mark("gdn: out_proj gemm", s);
    } else {
      const int ldu = L.qkv.rows;
      LILY_TRY(gemm(L.qkv, M, p.u, ldu));
      mark("attn: [q|k|v] gemm", s);
      const int od = c.num_attention_heads * c.head_dim;
      pf::AttnPrefillArgs a{};
      a.ldu = ldu, a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads;
      a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim();
      a.theta = c.rope_theta, a.eps = eps, a.terms = terms == 1 ? 1 : 3;
      a.prof = prof_cb, a.prof_ctx = this;
      // Each segment its rows of u and out, its caches and its q scratch (at its row: qb holds two planes a row).
      pf::AttnSeg as[pf::kMaxAttnSegs];
      for (int j = 0; j < n_seg; ++j) {
        const PfSeg& sg = segs[size_t(j)];
        const size_t r = size_t(row0[size_t(j)]);
        auto& SL = sg.st->layers[size_t(i)];
        as[j].u = p.u + r * ldu, as[j].out = p.o + r * od, as[j].kc = SL.kc, as[j].vc = SL.vc;
        if (terms == 1) as[j].out16 = p.ah + r * od;  // single pass: straight into o_proj's input plane
        as[j].qb = p.qb + r * od * 2, as[j].M = sg.M, as[j].pos0 = sg.st->n, as[j].max_seq = sg.st->cap;
      }
      LILY_TRY(pf::attn_prefill_segments(a, as, n_seg, s));
      if (terms != 1) LILY_TRY(split(p.o, od, M, od));
      LILY_TRY(gemm(L.o_proj, M, p.mix, H));
      mark("attn: o_proj gemm", s);
    }
    if (small_moe) {  // a short chunk: the batched step's expert-major MoE (batch.cu), on the fp32 normed rows
      LILY_TRY(pf::add_rmsnorm_rows(p.x, p.mix, L.post_norm, M, H, eps, p.hn, s));
      mark("add+rmsnorm", s);
      LILY_TRY(moe_rows(L, p.hn, M, p.mix, s));
      mark("moe: batched-step experts (short chunk)", s);
      mix = p.mix;
      continue;
    }
    // MoE: router (8-bit, + shared gate row) → device routing → grouped gate/up+SwiGLU → down.
    LILY_TRY(norm_split(p.mix, L.post_norm, true));  // router, expert gate/up and shared gate/up read this split
    LILY_TRY(gemm(L.router, M, p.rl, E + 1));
    mark("moe: router gemm (q8)", s);
    pf::RouteArgs r{};
    r.logits = p.rl, r.M = M, r.E = E, r.top_k = k, r.norm_topk = c.norm_topk_prob, r.topk_ids = p.topk_ids;
    r.topk_w = p.topk_w, r.slot_tok = p.slot_tok, r.slot_of = p.slot_of, r.tiles = p.tiles;
    r.max_tiles = pf::moe_max_tiles(M, E, k), r.scratch = p.rscratch, r.wide = terms == 1;
    LILY_TRY(pf::moe_route(r, s));
    mark("moe: top-k+sort+tiles", s);
    // Single pass: the SwiGLU outputs straight to fp16 (GemmArgs::y16), the planes the down GEMMs read: act's in
    // the router's lo plane (free once the route is made), sact's in its own. Two pass: fp32, split below.
    uint16_t* act16 = terms == 1 ? p.al : nullptr;
    uint16_t* sact16 = terms == 1 ? p.sact16 : nullptr;
    pf::GemmArgs gu{};
    gu.w = L.gate, gu.w2 = L.up, gu.n_out = I, gu.a_rows = p.slot_tok, gu.y = p.act, gu.y16 = act16, gu.ldy = I;
    gu.swiglu = true, gu.tiles = p.tiles, gu.max_tiles = r.max_tiles;
    with_split(gu);
    LILY_TRY(pf::gemm(gu, s));
    mark("moe: grouped gate+up+swiglu", s);
    pf::GemmArgs dn{};
    dn.w = L.down, dn.n_out = H, dn.y = p.yd, dn.ldy = H, dn.tiles = p.tiles;
    dn.max_tiles = r.max_tiles;
    with_split(dn);
    // The shared expert's gate/up reads hn's split before act's split replaces it.
    const int Is = c.shared_expert_intermediate_size;
    pf::GemmArgs sg{};
    sg.w = L.sh_gate_up, sg.w2 = L.sh_gate_up, sg.row0 = 0, sg.row0_2 = Is, sg.n_out = Is;
    sg.M = M, sg.y = p.sact, sg.y16 = sact16, sg.ldy = Is, sg.swiglu = true;
    with_split(sg);
    LILY_TRY(pf::gemm(sg, s));
    mark("moe: shared expert gemms", s);
    if (act16) dn.ah = act16;
    else LILY_TRY(split(p.act, I, M * k, I));
    LILY_TRY(pf::gemm(dn, s));
    mark("moe: grouped down", s);
    pf::GemmArgs sd{};
    sd.w = L.sh_down, sd.n_out = H, sd.M = M, sd.y = p.sy, sd.ldy = H;
    with_split(sd);
    if (sact16) sd.ah = sact16;
    else LILY_TRY(split(p.sact, Is, M, Is));
    LILY_TRY(pf::gemm(sd, s));
    mark("moe: shared expert gemms", s);
    LILY_TRY(pf::moe_combine(p.yd, p.sy, p.slot_of, p.topk_w, M, H, k, p.mix, s));
    mark("moe: combine", s);
    mix = p.mix;
  }
  for (int j = 0; j < n_seg; ++j) {
    if (!segs[size_t(j)].logits) continue;
    // The segment's last row's final add + norm and the lm_head (fp32 logits): the decode step's GEMV (its
    // tensor-core kernel where it applies), so the logits of a prompt's last token are those the decode graph
    // gives; then to the host (stream order: the next segment's GEMV writes logits_ after the copy).
    const size_t off = size_t(row0[size_t(j) + 1] - 1) * H;
    GemvArgs lm{};
    lm.w = d_.lm_head, lm.pro = Pro::kAddNorm, lm.in = p.x + off, lm.mix = p.mix + off, lm.gain = d_.final_norm;
    lm.eps = eps, lm.y = logits_, lm.tc = true;
    LILY_TRY(gemv(lm, s));
    mark("final norm+lm_head", s);
    LILY_CU_TRY(cudaMemcpyAsync(segs[size_t(j)].logits, logits_, size_t(c.vocab_size) * 4, cudaMemcpyDeviceToHost, s));
  }
  return Status::ok();
}

// Shapes the prefill kernels support (the real model and the tiny/small presets); anything else
// (e.g. the wide-seed23 golden's 32-dim DeltaNet heads) is prefilled by replaying the decode graph.
bool prefill_shapes_ok(const ModelConfig& c) {
  const int hd = c.head_dim, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  return c.linear_key_head_dim == 128 && c.linear_value_head_dim == 128 && nk > 0 && nv % nk == 0 && nv <= 128 &&
         (hd == 64 || hd == 128 || hd == 256) && c.rotary_dim() > 0 && c.rotary_dim() <= hd && c.rotary_dim() % 2 == 0 &&
         c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0 && c.num_experts <= 1024 &&
         c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= 8 && c.hidden_size % 64 == 0 &&
         c.moe_intermediate_size % 64 == 0 && c.shared_expert_intermediate_size % 64 == 0 &&
         c.linear_conv_kernel_dim >= 2 && c.linear_conv_kernel_dim <= 9 && c.quant.group_size == 64;
}

int CudaBackend::prefill_chunk_cap() const { return env_int("LILY_PREFILL_CHUNK", 4096, 64, 1 << 16); }
int CudaBackend::prefill_min() const { return env_int("LILY_PREFILL_MIN", 8, 1, 1 << 20); }

Status CudaBackend::prefill(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits) {
  const int M = int(tokens.size());
  if (M >= prefill_min() && prefill_shapes_ok(cfg_)) {
    const int chunk_env = prefill_chunk_cap();
    if (pf_cap_ == 0) LILY_TRY(pf_alloc(chunk_env));  // bounded by the chunk, not the prompt
    // LILY_PREFILL_PROFILE=1: events between ops, a per-op table on stderr (adds small gaps) for
    // prompts of 1,024 tokens and more; =2: for every prefill forward (the short ones a server
    // interleaves: where their fixed cost goes).
    std::vector<std::pair<const char*, cudaEvent_t>> ev;
    const int prof_mode = env_int("LILY_PREFILL_PROFILE", 0, 0, 2);
    const bool prof = prof_mode == 2 || (prof_mode == 1 && M >= 1024);
    if (prof) prof_ = &ev, mark("start", stream_);
    const int cs = std::min(chunk_env, pf_cap_);
    const int n0 = st.n;
    for (int t0 = 0; t0 < M; t0 += cs) {
      const int n = std::min(cs, M - t0);
      if (t0 > 0) LILY_CU_TRY(cudaStreamSynchronize(stream_));  // pf_.tok is reused per chunk
      LILY_CU_TRY(cudaMemcpyAsync(pf_.tok, tokens.data() + t0, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
      const PfSeg seg{&st, n, t0 + n == M && !logits.empty() ? logits.data() : nullptr};
      Status r = pf_pass({&seg, 1});
      if (!r) {
        st.n = n0;
        return r;
      }
      st.n += n;  // a pass appends at st.n
    }
    st.n = n0;
    if (prof) {
      prof_ = nullptr;
      LILY_CU_TRY(cudaStreamSynchronize(stream_));
      print_pf_profile(ev, M);
    }
    const PfSeg all{&st, M, nullptr};
    return pf_commit({&all, 1});
  }
  return replay_tokens(st, tokens, logits);
}

Status CudaBackend::pf_commit(std::span<const PfSeg> segs) {
  LILY_CU_TRY(cudaStreamSynchronize(stream_));  // pos_host is rewritten here
  for (size_t j = 0; j < segs.size(); ++j) {
    pf_.pos_host[j] = segs[j].st->n + segs[j].M;
    LILY_CU_TRY(cudaMemcpyAsync(&segs[j].st->ctl->pos, pf_.pos_host + j, 4, cudaMemcpyHostToDevice, stream_));
  }
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  for (const PfSeg& sg : segs) sg.st->n += sg.M;
  return Status::ok();
}

Status CudaBackend::prefill_group(std::span<const StepFeed* const> feeds) {
  const int n_seg = int(feeds.size());
  if (n_seg < 2 || n_seg > pf::kMaxAttnSegs) return cu_err("prefill_group: {} feeds (2..{})", n_seg, pf::kMaxAttnSegs);
  if (pf_cap_ == 0) LILY_TRY(pf_alloc(prefill_chunk_cap()));
  const size_t V = size_t(cfg_.vocab_size);
  std::vector<int32_t> toks;
  std::vector<PfSeg> segs(static_cast<size_t>(n_seg));
  std::vector<std::vector<float>> drawn_logits(static_cast<size_t>(n_seg));  // a draw's logits (drawn here, as Backend::step_segment)
  for (int j = 0; j < n_seg; ++j) {
    const StepFeed& f = *feeds[size_t(j)];
    auto st = appendable(*f.state, f.tokens, "prefill_group");
    if (!st) return st.status();
    toks.insert(toks.end(), f.tokens.begin(), f.tokens.end());
    float* out = f.logits;
    if (f.draw) drawn_logits[size_t(j)].resize(V), out = drawn_logits[size_t(j)].data();
    segs[size_t(j)] = {*st, int(f.tokens.size()), out};
  }
  if (int(toks.size()) > pf_cap_) return cu_err("prefill_group: {} tokens exceed the prefill scratch ({})", toks.size(), pf_cap_);
  LILY_CU_TRY(cudaMemcpyAsync(pf_.tok, toks.data(), toks.size() * 4, cudaMemcpyHostToDevice, stream_));
  LILY_TRY(pf_pass(segs));
  LILY_TRY(pf_commit(segs));
  std::vector<HostDraw> draws;
  for (int j = 0; j < n_seg; ++j)
    if (const StepFeed& f = *feeds[size_t(j)]; f.draw) draws.push_back({drawn_logits[size_t(j)].data(), f.draw, f.drawn});
  draw_on_host(draws, V);
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
