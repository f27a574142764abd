// The CUDA backend: weights uploaded once (mmap → pinned staging → device, with the fused
// concatenations [qkv|z|a|b], [q|k|v], router|shared-gate, shared [gate|up]); per-sequence state
// on the device; the decode step captured once per state as a CUDA graph whose input token and
// position live in device memory, so step N+1 is launched before the host reads token N.
// Prefill (M > 1 tokens) lives in prefill.cu, the weight upload in upload.cu.
#include "backend/cuda/cuda_backend.h"

namespace lily {
namespace cuda {

Status CudaBackend::enqueue_step(CudaSeqState& st, cudaStream_t s, bool with_logits) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim();
  mark("start", s);
  LILY_TRY(embed_row(d_.embed, st.ctl, 0, xres_[0], s));
  mark("embed", s);
  int p = 0;
  const void* mix = nullptr;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d_.layers[i];
    auto& SL = st.layers[i];
    GemvArgs in{};
    in.pro = Pro::kAddNorm, in.in = xres_[p], in.mix = mix, in.gain = L.in_norm, in.res_out = xres_[p ^ 1];
    in.eps = c.rms_norm_eps, in.y = u_;
    if (!L.attn) {
      in.w = L.in_proj;
      LILY_TRY(gemv(in, s));
      mark("gdn: add+norm+[qkv|z|a|b] gemv", s);
      GdnArgs g{};
      g.u = u_, g.conv_w = L.conv_w, g.conv = SL.conv, g.S = SL.S, g.A_log = L.A_log, g.dt_bias = L.dt_bias;
      g.o = o_, g.ctl = st.ctl, g.nk = c.linear_num_key_heads, g.nv = c.linear_num_value_heads;
      g.dk = c.linear_key_head_dim, g.dv = c.linear_value_head_dim, g.K = c.linear_conv_kernel_dim;
      LILY_TRY(gdn_step(g, s));
      mark("gdn: step (conv..readout)", s);
      GemvArgs out{};
      out.w = L.out_proj, out.pro = Pro::kGatedNorm, out.in = o_, out.z = u_ + C, out.gain = L.gnorm;
      out.gn_dv = c.linear_value_head_dim, out.eps = c.rms_norm_eps, out.y = mix_;
      LILY_TRY(gemv(out, s));
      mark("gdn: gated norm+out_proj gemv", s);
    } else {
      in.w = L.qkv;
      LILY_TRY(gemv(in, s));
      mark("attn: add+norm+[q|k|v] gemv", s);
      AttnArgs a{};
      a.qkv = u_, a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.q = q_, a.kc = SL.kc, a.vc = SL.vc, a.out = o_;
      a.partial = attn_partial_, a.ctl = st.ctl, a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads;
      a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim();
      a.max_seq = st.cap, a.n_split = attn_max_splits(), a.theta = c.rope_theta, a.eps = c.rms_norm_eps;
      LILY_TRY(attn_prep(a, s));
      mark("attn: qk norm+rope+cache", s);
      LILY_TRY(attn_decode(a, s));
      mark("attn: split-K decode+gate", s);
      GemvArgs out{};
      out.w = L.o_proj, out.pro = Pro::kPlain, out.in = o_, out.y = mix_;
      LILY_TRY(gemv(out, s));
      mark("attn: o_proj gemv", s);
    }
    p ^= 1;
    GemvArgs r{};
    r.w = L.router, r.pro = Pro::kAddNorm, r.in = xres_[p], r.mix = mix_, r.gain = L.post_norm;
    r.res_out = xres_[p ^ 1], r.n_out = hn_, r.eps = c.rms_norm_eps, r.y = rl_, r.y_f32 = true;
    r.epi = Epi::kTopK, r.ctl = st.ctl, r.n_experts = c.num_experts, r.top_k = c.num_experts_per_tok;
    r.topk_ids = topk_ids_, r.topk_w = topk_w_, r.norm_topk = c.norm_topk_prob;
    LILY_TRY(gemv(r, s));
    mark("moe: add+norm+router q8+top-k", s);
    p ^= 1;
    MoeArgs m{};
    m.gate = L.gate, m.up = L.up, m.down = L.down, m.sh_gate_up = L.sh_gate_up, m.sh_down = L.sh_down;
    m.topk_ids = topk_ids_, m.topk_w = topk_w_, m.top_k = c.num_experts_per_tok, m.H = H;
    m.I = c.moe_intermediate_size, m.x = hn_, m.act = act_, m.out = mix_;
    LILY_TRY(moe_gate_up(m, s));
    mark("moe: gate+up+swiglu (8+shared)", s);
    LILY_TRY(moe_down_combine(m, s));
    mark("moe: down+combine+shared", s);
    mix = mix_;
  }
  (void)vd;
  if (!with_logits) return bump_pos(st.ctl, s);
  GemvArgs lm{};
  lm.w = d_.lm_head, lm.pro = Pro::kAddNorm, lm.in = xres_[p], lm.mix = mix_, lm.gain = d_.final_norm;
  lm.eps = c.rms_norm_eps, lm.y = logits_, lm.y_f32 = true, lm.epi = Epi::kArgmax, lm.ctl = st.ctl;
  lm.tok_out = st.tok_dev, lm.partial = am_partial_;
  LILY_TRY(gemv(lm, s));
  mark("lm_head gemv+argmax", s);
  return Status::ok();
}

Status CudaBackend::profile_step(CudaSeqState& st) {
  std::vector<std::pair<const char*, cudaEvent_t>> ev;
  prof_ = &ev;
  Status s = enqueue_step(st, stream_, true);
  prof_ = nullptr;
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  st.n += 1;
  if (!s) return s;
  std::vector<std::pair<std::string, std::pair<double, int>>> agg;
  double total = 0;
  for (size_t i = 1; i < ev.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[i - 1].second, ev[i].second);
    total += ms;
    auto it = std::find_if(agg.begin(), agg.end(), [&](auto& a) { return a.first == ev[i].first; });
    if (it == agg.end()) agg.push_back({ev[i].first, {ms, 1}});
    else it->second.first += ms, it->second.second += 1;
  }
  for (auto& e : ev) cudaEventDestroy(e.second);
  std::fprintf(stderr, "cuda profile (one un-captured step at pos %d, events between ops; includes launch gaps):\n", st.n - 1);
  std::fprintf(stderr, "| op | launches | total ms | share |\n|---|---:|---:|---:|\n");
  for (auto& a : agg)
    std::fprintf(stderr, "| %s | %d | %.3f | %.1f%% |\n", a.first.c_str(), a.second.second, a.second.first, 100 * a.second.first / total);
  std::fprintf(stderr, "| total | | %.3f | |\n", total);
  return Status::ok();
}

std::unique_ptr<SeqState> CudaSeqState::clone() const {
  auto r = be->new_state(cap);
  if (!r) return nullptr;
  auto st = std::unique_ptr<CudaSeqState>(static_cast<CudaSeqState*>(std::move(r).value().release()));
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& a = layers[i];
    auto& b = st->layers[i];
    if (a.kc) {
      cudaMemcpy(b.kc, a.kc, a.kv_bytes, cudaMemcpyDeviceToDevice);
      cudaMemcpy(b.vc, a.vc, a.kv_bytes, cudaMemcpyDeviceToDevice);
    }
    if (a.conv) cudaMemcpy(b.conv, a.conv, a.conv_bytes, cudaMemcpyDeviceToDevice);
    if (a.S) cudaMemcpy(b.S, a.S, a.S_bytes, cudaMemcpyDeviceToDevice);
  }
  cudaMemcpy(st->ctl, ctl, sizeof(StepCtl), cudaMemcpyDeviceToDevice);
  st->n = n;
  return st;
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose) {
  auto be = std::make_unique<cuda::CudaBackend>(weights, verbose);
  LILY_TRY(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace lily
