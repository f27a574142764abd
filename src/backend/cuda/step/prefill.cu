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
  p.sy = dalloc<float>(M * H, owned_);
  p.wy = dalloc<float>(pf::gdn_wy_floats(chunk, nv), owned_);
  if (!p.sy || !p.wy || !p.yd || !p.act || !p.u || !p.ah || !p.al || !p.axs) return cu_err("cuda prefill: out of device memory for a {}-token chunk", chunk);
  LILY_CU_TRY(cudaHostAlloc(&p.pos_host, 16, cudaHostAllocDefault));
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

// One chunk: tokens t0..t0+M of the prompt (already in pf_.tok), state position st.n + t0.
Status CudaBackend::pf_chunk(CudaSeqState& st, int t0, int M, bool last, bool want_logits) {
  const ModelConfig& c = cfg_;
  auto& p = pf_;
  cudaStream_t s = stream_;
  const int H = c.hidden_size, vd = c.gdn_value_dim();
  const int E = c.num_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int pos0 = st.n + t0;
  const float eps = c.rms_norm_eps;
  // Each GEMM input is split once (p.ah, and where read p.al/axs), then read by every GEMM on that input
  // (e.g. router, expert gate/up and shared gate/up all read one split of hn). The 4-bit GEMMs run the
  // Hopper wgmma kernel (gemm_wg.cu): single pass from kPfSinglePassRows rows on (the fp16 plane only),
  // two pass below (hi + lo planes and group sums); the 8-bit router the mma.sync pipe kernel (gemm_q8.cu),
  // two pass always (its input's split is full).
  const int terms = pf_terms(M);
  // A short chunk runs its MoE on the batched step's expert kernels (moe_rows).
  const bool small_moe = moe_rows_ok(M);
  auto split = [&](const float* a, int lda, int rows, int K, bool full = false) -> Status {
    full = full || terms == 2;
    LILY_TRY(pf::split_rows(a, lda, rows, K, p.ah, full ? p.al : nullptr, full ? p.axs : nullptr, s));
    mark("gemm A split (fp16 hi/lo + sums)", s);
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
  LILY_TRY(embed_rows(d_.embed, p.tok + t0, M, p.x, s));
  mark("embed rows", s);
  const float* mix = nullptr;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d_.layers[i];
    auto& SL = st.layers[i];
    LILY_TRY(pf::add_rmsnorm_rows(p.x, mix, L.in_norm, M, H, eps, p.hn, s));
    mark("add+rmsnorm", s);
    if (!L.attn) {
      const int ldu = L.in_proj.rows;
      LILY_TRY(split(p.hn, H, M, H));
      LILY_TRY(gemm(L.in_proj, M, p.u, ldu));
      mark("gdn: [qkv|z|a|b] gemm", s);
      pf::GdnPrefillArgs g = gdn_args(i, st, pos0, M, p.u, ldu, 0, p.o, p.wy);
      g.terms = terms == 1 ? 1 : 3;
      g.prof = prof_cb, g.prof_ctx = this;
      LILY_TRY(pf::gdn_prefill(g, s));
      LILY_TRY(split(p.o, vd, M, vd));
      LILY_TRY(gemm(L.out_proj, M, p.mix, H));
      mark("gdn: out_proj gemm", s);
    } else {
      const int ldu = L.qkv.rows;
      LILY_TRY(split(p.hn, H, M, H));
      LILY_TRY(gemm(L.qkv, M, p.u, ldu));
      mark("attn: [q|k|v] gemm", s);
      pf::AttnPrefillArgs a{};
      a.u = p.u, a.ldu = ldu, a.M = M, a.pos0 = pos0, a.q_norm = L.q_norm, a.k_norm = L.k_norm;
      a.kc = SL.kc, a.vc = SL.vc, a.qb = p.qb, a.out = p.o, a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads;
      a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim(), a.max_seq = st.cap;
      a.theta = c.rope_theta, a.eps = eps, a.terms = terms == 1 ? 1 : 3;
      a.prof = prof_cb, a.prof_ctx = this;
      LILY_TRY(pf::attn_prefill(a, s));
      const int od = c.num_attention_heads * c.head_dim;
      LILY_TRY(split(p.o, od, M, od));
      LILY_TRY(gemm(L.o_proj, M, p.mix, H));
      mark("attn: o_proj gemm", s);
    }
    LILY_TRY(pf::add_rmsnorm_rows(p.x, p.mix, L.post_norm, M, H, eps, p.hn, s));
    mark("add+rmsnorm", s);
    if (small_moe) {  // a short chunk: the batched step's expert-major MoE (batch.cu)
      LILY_TRY(moe_rows(L, p.hn, M, p.mix, s));
      mark("moe: batched-step experts (short chunk)", s);
      mix = p.mix;
      continue;
    }
    // MoE: router (8-bit, + shared gate row) → device routing → grouped gate/up+SwiGLU → down.
    LILY_TRY(split(p.hn, H, M, H, true));  // router, expert gate/up and shared gate/up read this split
    LILY_TRY(gemm(L.router, M, p.rl, E + 1));
    mark("moe: router gemm (q8)", s);
    pf::RouteArgs r{};
    r.logits = p.rl, r.M = M, r.E = E, r.top_k = k, r.norm_topk = c.norm_topk_prob, r.topk_ids = p.topk_ids;
    r.topk_w = p.topk_w, r.slot_tok = p.slot_tok, r.slot_of = p.slot_of, r.tiles = p.tiles;
    r.max_tiles = pf::moe_max_tiles(M, E, k), r.scratch = p.rscratch, r.wide = terms == 1;
    LILY_TRY(pf::moe_route(r, s));
    mark("moe: top-k+sort+tiles", s);
    pf::GemmArgs gu{};
    gu.w = L.gate, gu.w2 = L.up, gu.n_out = I, gu.a_rows = p.slot_tok, gu.y = p.act, gu.ldy = I;
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
    sg.M = M, sg.y = p.sact, sg.ldy = Is, sg.swiglu = true;
    with_split(sg);
    LILY_TRY(pf::gemm(sg, s));
    mark("moe: shared expert gemms", s);
    LILY_TRY(split(p.act, I, M * k, I));
    LILY_TRY(pf::gemm(dn, s));
    mark("moe: grouped down", s);
    LILY_TRY(split(p.sact, Is, M, Is));
    LILY_TRY(gemm(L.sh_down, M, p.sy, H));
    mark("moe: shared expert gemms", s);
    LILY_TRY(pf::moe_combine(p.yd, p.sy, p.slot_of, p.topk_w, M, H, k, p.mix, s));
    mark("moe: combine", s);
    mix = p.mix;
  }
  if (last && want_logits) {
    // The last row's final add + norm and the lm_head (fp32 logits): the decode step's GEMV (its tensor-core
    // kernel where it applies), so the logits of a prompt's last token are those the decode graph gives.
    const size_t off = size_t(M - 1) * H;
    GemvArgs lm{};
    lm.w = d_.lm_head, lm.pro = Pro::kAddNorm, lm.in = p.x + off, lm.mix = p.mix + off, lm.gain = d_.final_norm;
    lm.eps = eps, lm.y = logits_, lm.tc = true;
    LILY_TRY(gemv(lm, s));
    mark("final norm+lm_head", s);
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

Status CudaBackend::prefill(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits) {
  const int M = int(tokens.size());
  const int min_m = env_int("LILY_PREFILL_MIN", 8, 1, 1 << 20);
  if (M >= min_m && prefill_shapes_ok(cfg_)) {
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
    LILY_CU_TRY(cudaMemcpyAsync(pf_.tok, tokens.data(), size_t(std::min(M, pf_cap_)) * 4, cudaMemcpyHostToDevice, stream_));
    for (int t0 = 0; t0 < M; t0 += cs) {
      const int n = std::min(cs, M - t0);
      if (t0 > 0) {
        LILY_CU_TRY(cudaStreamSynchronize(stream_));  // pf_.tok is reused per chunk
        LILY_CU_TRY(cudaMemcpyAsync(pf_.tok, tokens.data() + t0, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
      }
      LILY_TRY(pf_chunk(st, 0, n, t0 + n == M, !logits.empty()));
      st.n += n;  // pf_chunk positions are relative to st.n
    }
    st.n -= M;
    if (prof) {
      prof_ = nullptr;
      LILY_CU_TRY(cudaStreamSynchronize(stream_));
      print_pf_profile(ev, M);
    }
    // The decode graph reads the position from the control block.
    LILY_CU_TRY(cudaStreamSynchronize(stream_));
    *pf_.pos_host = st.n + M;
    LILY_CU_TRY(cudaMemcpyAsync(&st.ctl->pos, pf_.pos_host, 4, cudaMemcpyHostToDevice, stream_));
    if (!logits.empty())
      LILY_CU_TRY(cudaMemcpyAsync(logits.data(), logits_, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
    LILY_CU_TRY(cudaStreamSynchronize(stream_));
    st.n += M;
    return Status::ok();
  }
  return replay_tokens(st, tokens, logits);
}

}  // namespace cuda
}  // namespace lily
