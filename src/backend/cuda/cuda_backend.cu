// The CUDA backend: weights uploaded once (mmap → pinned staging → device, with the fused
// concatenations [qkv|z|a|b], [q|k|v], router|shared-gate, shared [gate|up]); per-sequence state
// on the device; the decode step captured once per state as a CUDA graph whose input token and
// position live in device memory, so step N+1 is launched before the host reads token N.
// Activations are fp32 throughout the step (the CPU reference's precision); kernels launch with
// programmatic dependent launch so each one's weight loads overlap its predecessor.
// Prefill (M > 1 tokens) lives in prefill.cu, the weight upload in upload.cu.
#include "backend/cuda/cuda_backend.h"

#include <cstring>
#include <functional>

namespace lily {
namespace cuda {

namespace {
// Bytes of a device quantized weight (codes + interleaved scale/bias), whole or `rows` of it.
double qbytes(const QW& w, double rows = -1) {
  return (rows < 0 ? w.rows : rows) * (double(w.cols) * w.bits / 8 + double(w.cols) / 64 * 4);
}
// Boundary probe for the profiler: waits for its predecessor (PDL), lets the next one launch, and
// does nothing else.
__global__ void empty_pdl_kernel() {
  pdl_wait();
  pdl_trigger();
}
}  // namespace

Status CudaBackend::enqueue_step(CudaSeqState& st, cudaStream_t s, bool with_logits) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, C = c.gdn_conv_dim();
  const double es = CudaStateLayout::kKvElem;
  // One op: launched unless profiling another op kind; marked (event) and its bytes counted when profiling.
  auto op = [&](const char* name, double bytes, auto&& launch) -> Status {
    if (only_ && std::strcmp(only_, name) != 0) return Status::ok();
    LILY_TRY(launch());
    mark(name, s);
    if (prof_bytes_) {
      auto it = std::find_if(prof_bytes_->begin(), prof_bytes_->end(), [&](auto& e) { return e.first == name; });
      if (it == prof_bytes_->end()) prof_bytes_->push_back({name, bytes});
      else it->second += bytes;
    }
    return Status::ok();
  };
  // No L2 prefetch of later kernels' weights: measured on the H200 (a997e1e, 256 context) 380 / 376 / 243
  // tok/s against 389 without (the GEMVs' own pre-wait loads already overlap their predecessor).
  // Router top-k in the MoE kernels: the router GEMV writes only logits and every gate_up block of a routed
  // slot and every down block computes the top-k itself; the router's last block does it where E > 256.
  const bool topk_here = c.num_experts <= 256;
  mark("start", s);
  LILY_TRY(op("embed", qbytes(d_.embed, 1), [&] { return embed_row(d_.embed, st.ctl, 0, xres_[0], s); }));
  int p = 0;
  const float* mix = nullptr;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d_.layers[i];
    auto& SL = st.layers[i];
    GemvArgs in{};
    in.pro = Pro::kAddNorm, in.in = xres_[p], in.mix = mix, in.gain = L.in_norm, in.res_out = xres_[p ^ 1];
    in.eps = c.rms_norm_eps, in.y = u_, in.tc = true;
    if (!L.attn) {
      in.w = L.in_proj;
      LILY_TRY(op("gdn: add+norm+[qkv|z|a|b] gemv", qbytes(L.in_proj), [&] { return gemv(in, s); }));
      GdnArgs g{};
      g.u = u_, g.conv_w = L.conv_w, g.conv = SL.conv, g.S = SL.S, g.A_log = L.A_log, g.dt_bias = L.dt_bias;
      g.o = o_, g.ctl = st.ctl, g.nk = c.linear_num_key_heads, g.nv = c.linear_num_value_heads;
      g.dk = c.linear_key_head_dim, g.dv = c.linear_value_head_dim, g.K = c.linear_conv_kernel_dim;
      // The gated RMSNorm at the end of the GDN step kernel (clusters; dv ≤ 256), out_proj staging a plain
      // input; wider heads keep it in out_proj's staging. H200, 2026-12-03: 440.0 tok/s at 256 against 386.1
      // with the norm in out_proj's staging (docs/perf/2026-12-03-cuda-decode-2.md, since removed from the
      // tree: git show 2d7ef65:docs/perf/2026-12-03-cuda-decode-2.md).
      const bool fuse_gn = g.dv <= 256;
      if (fuse_gn) g.z = u_ + C, g.gnorm = L.gnorm, g.og = og_, g.eps = c.rms_norm_eps;
      const double gb = 2.0 * SL.S_bytes + 1.5 * SL.conv_bytes + double(C) * g.K * 2;
      LILY_TRY(op(fuse_gn ? "gdn: step (conv..readout+gated norm)" : "gdn: step (conv..readout)", gb,
                  [&] { return gdn_step(g, s); }));
      GemvArgs out{};
      out.w = L.out_proj, out.y = mix_, out.tc = true;
      if (fuse_gn) {
        out.pro = Pro::kPlain, out.in = og_;
      } else {
        out.pro = Pro::kGatedNorm, out.in = o_, out.z = u_ + C, out.gain = L.gnorm;
        out.gn_dv = c.linear_value_head_dim, out.eps = c.rms_norm_eps;
      }
      LILY_TRY(op(fuse_gn ? "gdn: out_proj gemv" : "gdn: gated norm+out_proj gemv", qbytes(L.out_proj),
                  [&] { return gemv(out, s); }));
    } else {
      in.w = L.qkv;
      LILY_TRY(op("attn: add+norm+[q|k|v] gemv", qbytes(L.qkv), [&] { return gemv(in, s); }));
      AttnArgs a{};
      a.qkv = u_, a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.q = q_, a.kc = SL.kc, a.vc = SL.vc, a.out = o_;
      a.partial = attn_partial_, a.ctl = st.ctl, a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads;
      a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim();
      a.max_seq = st.cap, a.n_split = attn_max_splits(), a.theta = c.rope_theta, a.eps = c.rms_norm_eps;
      LILY_TRY(op("attn: qk norm+rope+cache", 0, [&] { return attn_prep(a, s); }));
      const double kvb = 2.0 * a.nkv * a.hd * es * (st.n + 1);
      LILY_TRY(op("attn: split-K decode+gate", kvb, [&] { return attn_decode(a, s); }));
      GemvArgs out{};
      out.w = L.o_proj, out.pro = Pro::kPlain, out.in = o_, out.y = mix_, out.tc = true;
      LILY_TRY(op("attn: o_proj gemv", qbytes(L.o_proj), [&] { return gemv(out, s); }));
    }
    p ^= 1;
    GemvArgs r{};
    r.w = L.router, r.pro = Pro::kAddNorm, r.in = xres_[p], r.mix = mix_, r.gain = L.post_norm;
    r.res_out = xres_[p ^ 1], r.n_out = hn_, r.eps = c.rms_norm_eps, r.y = rl_;
    r.epi = Epi::kTopK, r.ctl = st.ctl, r.n_experts = c.num_experts, r.top_k = c.num_experts_per_tok;
    r.topk_ids = topk_ids_, r.topk_w = topk_w_, r.norm_topk = c.norm_topk_prob;
    if (topk_here) r.epi = Epi::kNone;
    MoeArgs m{};
    m.gate = L.gate, m.up = L.up, m.down = L.down, m.sh_gate_up = L.sh_gate_up, m.sh_down = L.sh_down;
    m.topk_ids = topk_ids_, m.topk_w = topk_w_, m.top_k = c.num_experts_per_tok, m.H = H;
    m.I = c.moe_intermediate_size, m.Is = c.shared_expert_intermediate_size, m.x = hn_, m.act = act_, m.out = mix_;
    m.tc = true;  // the tensor-core down kernel where it applies (moe_tc.cu)
    if (topk_here) m.logits = rl_, m.n_experts = c.num_experts, m.norm_topk = c.norm_topk_prob;
    LILY_TRY(op(topk_here ? "moe: add+norm+router q8" : "moe: add+norm+router q8+top-k", qbytes(L.router),
                [&] { return gemv(r, s); }));
    p ^= 1;
    const double k = m.top_k;
    LILY_TRY(op("moe: gate+up+swiglu (k+shared)", 2 * k * qbytes(L.gate, m.I) + qbytes(L.sh_gate_up),
                [&] { return moe_gate_up(m, s); }));
    LILY_TRY(op("moe: down+combine+shared", k * qbytes(L.down, H) + qbytes(L.sh_down), [&] { return moe_down_combine(m, s); }));
    mix = mix_;
  }
  if (!with_logits) return only_ ? Status::ok() : bump_pos(st.ctl, s);
  GemvArgs lm{};
  lm.w = d_.lm_head, lm.pro = Pro::kAddNorm, lm.in = xres_[p], lm.mix = mix_, lm.gain = d_.final_norm;
  lm.eps = c.rms_norm_eps, lm.y = logits_, lm.epi = Epi::kArgmax, lm.ctl = st.ctl;
  lm.partial = am_partial_, lm.tc = true;
  return op("lm_head gemv+argmax", qbytes(d_.lm_head), [&] { return gemv(lm, s); });
}

// Per-op time inside a CUDA graph (with PDL, as in the decode loop): for each op kind, a graph of
// only that kind's launches in step order, replayed 3 times (the step control block restored after
// each so the position does not move); plus the whole step the same way. Prints a table with the
// bytes each kind reads and the rate (stderr).
Status CudaBackend::profile_graphs(CudaSeqState& st) {
  std::vector<std::pair<std::string, double>> names;
  {
    prof_bytes_ = &names;
    Status s0 = Status::ok();
    // Capture (not run) once to collect the op names and bytes.
    cudaGraph_t g = nullptr;
    LILY_CU_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    s0 = enqueue_step(st, stream_, true);
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    prof_bytes_ = nullptr;
    LILY_TRY(s0);
  }
  StepCtl* backup = nullptr;
  LILY_CU_TRY(cudaMalloc(&backup, sizeof(StepCtl)));
  LILY_CU_TRY(cudaMemcpyAsync(backup, st.ctl, sizeof(StepCtl), cudaMemcpyDeviceToDevice, stream_));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  // What `enqueue` launches, captured as one graph: ms a replay (the mean of 3 after a warm-up; `reset`, if
  // set, is enqueued after each).
  auto time_captured = [&](const std::function<Status()>& enqueue, bool reset, double* ms_out) -> Status {
    cudaGraph_t g = nullptr;
    LILY_CU_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status s1 = enqueue();
    cudaError_t ce = cudaStreamEndCapture(stream_, &g);
    LILY_TRY(s1);
    if (ce != cudaSuccess) return cu_err("profile: capture failed: {}", cudaGetErrorString(ce));
    cudaGraphExec_t ex = nullptr;
    LILY_CU_TRY(cudaGraphInstantiate(&ex, g, 0));
    cudaGraphDestroy(g);
    double tot = 0;
    for (int r = 0; r < 4; ++r) {
      LILY_CU_TRY(cudaEventRecord(e0, stream_));
      LILY_CU_TRY(cudaGraphLaunch(ex, stream_));
      LILY_CU_TRY(cudaEventRecord(e1, stream_));
      if (reset) LILY_CU_TRY(cudaMemcpyAsync(st.ctl, backup, sizeof(StepCtl), cudaMemcpyDeviceToDevice, stream_));
      LILY_CU_TRY(cudaStreamSynchronize(stream_));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (r > 0) tot += ms;  // first replay warms up
    }
    cudaGraphExecDestroy(ex);
    *ms_out = tot / 3;
    return Status::ok();
  };
  // The step (or only the ops named `only`), its control block restored after each replay.
  auto time_graph = [&](const char* only, double* ms_out) -> Status {
    auto step = [&]() -> Status {
      only_ = only;
      Status s1 = enqueue_step(st, stream_, true);
      only_ = nullptr;
      return s1;
    };
    return time_captured(step, true, ms_out);
  };
  double full_ms = 0;
  Status s = time_graph(nullptr, &full_ms);
  std::fprintf(stderr, "cuda graph profile at pos %d (per-op graphs with PDL, 3 replays; bytes read per step; floor at 4.1 TB/s):\n", st.n);
  std::fprintf(stderr, "| op | ms/step | share of sum | MB/step | GB/s | floor ms |\n|---|---:|---:|---:|---:|---:|\n");
  double sum = 0;
  std::vector<double> t(names.size());
  for (size_t i = 0; s && i < names.size(); ++i) {
    s = time_graph(names[i].first.c_str(), &t[i]);
    sum += t[i];
  }
  for (size_t i = 0; s && i < names.size(); ++i)
    std::fprintf(stderr, "| %s | %.3f | %.1f%% | %.1f | %.0f | %.3f |\n", names[i].first.c_str(), t[i], 100 * t[i] / sum,
                 names[i].second / 1e6, names[i].second / (t[i] * 1e-3) / 1e9, names[i].second / 4.1e12 * 1e3);
  double bytes = 0;
  for (auto& n : names) bytes += n.second;
  if (s)
    std::fprintf(stderr, "| sum of op graphs | %.3f | | %.1f | %.0f | %.3f |\n| whole step graph | %.3f | | | %.0f | |\n", sum,
                 bytes / 1e6, bytes / (sum * 1e-3) / 1e9, bytes / 4.1e12 * 1e3, full_ms, bytes / (full_ms * 1e-3) / 1e9);
  // Cost of a kernel boundary alone: graphs of 100 empty PDL kernels at several grid sizes.
  for (int blocks : {1, 132, 528, 1056}) {
    if (!s) break;
    auto empties = [&]() -> Status {
      Status s1 = Status::ok();
      for (int i = 0; i < 100 && s1; ++i) s1 = launch_k("empty", empty_pdl_kernel, dim3(blocks), dim3(256), 0, stream_);
      return s1;
    };
    double ms = 0;
    s = time_captured(empties, false, &ms);
    if (s)
      std::fprintf(stderr, "| empty PDL kernel, %d blocks x 256 threads | %.2f us per kernel (100 in a graph) |\n", blocks,
                   ms / 100 * 1e3);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaFree(backup);
  return s;
}

Status CudaBackend::replay_tokens(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits) {
  const int M = int(tokens.size());
  LILY_TRY(ensure_graphs(st));
  if (M > feed_cap_) {
    if (feed_) cudaFree(feed_);
    feed_cap_ = std::max(M, 4096);
    LILY_CU_TRY(cudaMalloc(&feed_, size_t(feed_cap_) * 4));
  }
  LILY_CU_TRY(cudaMemcpyAsync(feed_, tokens.data(), size_t(M) * 4, cudaMemcpyHostToDevice, stream_));
  for (int i = 0; i < M; ++i) {
    LILY_CU_TRY(cudaMemcpyAsync(&st.ctl->tok, feed_ + i, 4, cudaMemcpyDeviceToDevice, stream_));
    const bool full = i == M - 1 && !logits.empty();
    LILY_CU_TRY(cudaGraphLaunch(full ? st.g_full : st.g_nolog, stream_));
  }
  if (!logits.empty())
    LILY_CU_TRY(cudaMemcpyAsync(logits.data(), logits_, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  st.n += M;
  return Status::ok();
}

Status CudaBackend::profile_decode(SeqState& state) {
  auto* st = dynamic_cast<CudaSeqState*>(&state);
  if (!st || st->be != this) return cu_err("profile_decode: the state belongs to another backend");
  LILY_TRY(collect_in_flight(tickets_));
  LILY_TRY(st->reserve(st->n + 2));
  if (st->n + 2 > st->cap) return cu_err("profile_decode: the state needs room for two more tokens");
  *pinned_tok_ = 0;  // the profiled step's input
  LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, pinned_tok_, 4, cudaMemcpyHostToDevice, stream_));
  LILY_TRY(profile_step(*st));
  return profile_graphs(*st);
}

Status CudaBackend::profile_step(CudaSeqState& st) {
  std::vector<std::pair<const char*, cudaEvent_t>> ev;
  prof_ = &ev;
  Status s = enqueue_step(st, stream_, true);
  prof_ = nullptr;
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  st.n += 1;
  if (!s) {
    for (auto& e : ev) cudaEventDestroy(e.second);
    return s;
  }
  const double total = print_op_rows(
      ev, "cuda profile (one un-captured step at pos " + std::to_string(st.n - 1) + ", events between ops; includes launch gaps):");
  std::fprintf(stderr, "| total | | %.3f | |\n", total);
  return Status::ok();
}

double print_op_rows(std::vector<std::pair<const char*, cudaEvent_t>>& ev, const std::string& title) {
  std::vector<std::pair<std::string, std::pair<double, int>>> agg;  // op → {ms, launches}
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
  ev.clear();
  std::fprintf(stderr, "%s\n| op | launches | total ms | share |\n|---|---:|---:|---:|\n", title.c_str());
  for (auto& a : agg)
    std::fprintf(stderr, "| %s | %d | %.3f | %.1f%% |\n", a.first.c_str(), a.second.second, a.second.first, 100 * a.second.first / total);
  return total;
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose) {
  auto be = std::make_unique<cuda::CudaBackend>(weights, verbose);
  LILY_TRY(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace lily
