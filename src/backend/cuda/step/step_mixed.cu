// CudaBackend::step: decode rows and prompt segments as one batched step (issue 24). The batched step's
// scratch and enqueue function are batch.cu's (batch_ctx.h); the segments' mixers are the prefill kernels.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/step/batch_ctx.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/step/prefill_ops.h"

namespace lily {
namespace cuda {

// One serving step over decode rows and prompt segments together (issue 24): the segments' tokens
// are rows of the batched step beside the decode rows, so every projection, the router, the experts
// and the lm_head run once over all of them (qgemm, two-pass activations as the batched step); only
// the mixers are per sequence: the batched DeltaNet step and decode attention on the decode rows,
// the prefill kernels (chunked DeltaNet, causal flash attention over the cache) on each segment's
// rows. A step with no segment (or a lone feed, or a shape or state the batched kernels do not take)
// is Backend::step: the captured decode graphs, or the prefill path for a lone prompt.
// A verify feed (speculative decoding: a token and its drafts, an output for each, step/spec.cu) is a
// segment with an output row per token, alone or beside other rows; a rewindable one has its DeltaNet
// states copied aside before the step and its rows' DeltaNet projections saved (spec_begin, spec_save_u).
//
// A long segment (kOwnPrefillRows tokens or more) is compute-bound, and the prefill path's GEMMs run it
// faster than the batched step does beside decode rows (H200, full size: a 2048-token segment with 16
// decode rows took 160 ms as one mixed step, 98 + 10 ms apart; at 512 tokens the two are even, 56 vs 54
// ms; docs/perf/2026-12-05-gpu-verify.md). Such segments run first on the prefill path, single pass
// (prefill_ops.h: kPfSinglePassRows is this bound, so a segment's rounding depends on its length only), as
// few passes as the prefill scratch allows: several newcomers' segments in one pass (prefill_group) give the
// experts several times the rows (~34 an expert for one 1,100-token prompt) and share the fixed costs.
constexpr size_t kOwnPrefillRows = pf::kPfSinglePassRows;

// The long segments of a step (each kOwnPrefillRows tokens or more): consecutive ones in passes that fit
// the prefill scratch (rows and the chunked DeltaNet's WY scratch), at most pf::kMaxAttnSegs a pass; a
// segment that fits no pass with another (longer than the scratch, a shape the prefill kernels do not take,
// a verify feed) runs alone by forward().
Status CudaBackend::prefill_long(std::span<const StepFeed> own) {
  const ModelConfig& c = cfg_;
  auto groupable = [&](const StepFeed& f) {
    const int L = int(f.tokens.size());
    return prefill_shapes_ok(c) && L >= prefill_min() && L <= prefill_chunk_cap() && f.outputs <= 1 && !f.rewindable;
  };
  // The prefill scratch's rows (prefill_group allocates it at this size on first use).
  const int cap = prefill_chunk_cap();
  const size_t wy_cap = pf::gdn_wy_floats(cap, c.linear_num_value_heads);
  std::vector<const StepFeed*> group;
  int rows = 0;
  size_t wy = 0;
  auto flush = [&]() -> Status {
    Status st = group.size() >= 2 ? prefill_group(group) : group.empty() ? Status::ok() : step_segment(*group[0]);
    group.clear(), rows = 0, wy = 0;
    return st;
  };
  for (const StepFeed& f : own) {
    if (!groupable(f)) {
      LILY_TRY(step_segment(f));
      continue;
    }
    const int L = int(f.tokens.size());
    const size_t w = pf::gdn_wy_floats(L, c.linear_num_value_heads);
    if (!group.empty() && (rows + L > cap || wy + w > wy_cap || int(group.size()) == pf::kMaxAttnSegs)) LILY_TRY(flush());
    group.push_back(&f), rows += L, wy += w;
  }
  return flush();
}
// A verify feed of at most this many tokens runs its DeltaNet as that many decode-step launches (the
// batched decode kernel on its row, one token after the other) instead of the chunked prefill form, whose
// fixed cost for a short segment was 1.9 ms of a 7.7 ms verify step of 5 tokens (H100, full size).
constexpr int kRecurrentRows = 16;

bool mixed_step_ok(const ModelConfig& c) {
  return c.linear_value_head_dim <= 256 && prefill_shapes_ok(c);
}

Status CudaBackend::step(std::span<const StepFeed> feeds) {
  if (feeds.size() >= 2 && std::any_of(feeds.begin(), feeds.end(), [](const StepFeed& f) { return f.tokens.size() >= kOwnPrefillRows; })) {
    std::vector<StepFeed> own, rest;
    for (const StepFeed& f : feeds) (f.tokens.size() >= kOwnPrefillRows ? own : rest).push_back(f);
    LILY_TRY(prefill_long(own));
    return rest.empty() ? Status::ok() : step(rest);
  }
  const ModelConfig& c = cfg_;
  int D = 0, R = 0;
  size_t wy_need = 0;  // the segments' chunked-DeltaNet scratch (floats)
  const bool verify = std::any_of(feeds.begin(), feeds.end(), [](const StepFeed& f) { return f.outputs > 1 || f.rewindable; });
  bool any_seg = false, ok = feeds.size() >= 2 || verify;
  for (const StepFeed& f : feeds) {
    auto* st = dynamic_cast<CudaSeqState*>(f.state);
    if (!st || st->be != this) return cu_err("step: a state belongs to another backend");
    const int L = int(f.tokens.size());
    if (st->n + L > st->cap) return cu_err("step: {} + {} tokens exceed the state's room {}", st->n, L, st->cap);
    if (L == 1) ++D;
    else any_seg = true, wy_need += pf::gdn_wy_floats(L, c.linear_num_value_heads);
    R += L;
  }
  ok = ok && any_seg && mixed_step_ok(c);
  if (ok && pf_cap_ == 0) LILY_TRY(pf_alloc(prefill_chunk_cap()));
  // The segments' mixers share the prefill scratch, each at its own rows.
  if (!ok || R - D > pf_cap_ || wy_need > pf::gdn_wy_floats(pf_cap_, c.linear_num_value_heads)) {
    if (verify) return cu_err("step: verify feeds need fp32 states and the mixed step (default numerics, fitting its scratch)");
    return Backend::step(feeds);
  }
  LILY_TRY(batch_alloc(R));
  BatchCtx& x = *batch_;
  const int vd = c.gdn_value_dim(), nhd = c.num_attention_heads * c.head_dim;
  // Row table: decode rows first (feed order), then verify feeds' tokens, then the other segments' (the
  // order is set below); the mixed table: rows that need outputs (out_idx, with the feed and output each
  // serves) and the rows that leave each state's position.
  struct Seg {
    CudaSeqState* st;
    int row0, L;
    int undo;       // its spec_undo_ record (a rewindable feed), else -1
    bool dec_attn;  // a verify feed: its rows take the decode attention with the decode rows
    bool recurrent() const { return dec_attn && L <= kRecurrentRows; }  // DeltaNet: decode steps, token by token
  };
  struct Out {
    const StepFeed* f;
    int j;  // which of the feed's outputs
  };
  std::vector<int> undo;
  LILY_TRY(spec_begin(feeds, x.urows, undo));
  std::vector<Seg> segs;
  std::vector<Out> outs;
  int32_t* oi = x.out_idx(x.mtab_host);
  int32_t* fp = x.fin_pos(x.mtab_host);
  StepCtl** fc = x.fin_ctl(x.mtab_host);
  int r = 0, nfin = 0;
  // Rows: decode rows, then verify feeds (their attention is the decode rows', each row over the cache
  // up to its own position: a few query rows over a long cache are what the split decode kernel is for;
  // the causal flash kernel took 0.63 ms a layer for 5 rows at 4k context on an H100), then segments.
  auto is_verify = [](const StepFeed& f) { return f.tokens.size() > 1 && (f.outputs > 1 || f.rewindable); };
  int Da = 0;
  for (int pass = 0; pass < 3; ++pass)
    for (size_t i = 0; i < feeds.size(); ++i) {
      const StepFeed& f = feeds[i];
      const int L = int(f.tokens.size());
      if (pass != (L == 1 ? 0 : is_verify(f) ? 1 : 2)) continue;
      auto& st = *static_cast<CudaSeqState*>(f.state);
      if (L > 1) segs.push_back({&st, r, L, undo[i], pass == 1});
      if (pass < 2) Da += L;
      for (int j = 0; j < L; ++j, ++r) x.put_row(r, st, f.tokens[size_t(j)], st.n + j);
      fc[nfin] = st.ctl, fp[nfin] = st.n + L - 1, ++nfin;
      if (f.logits || f.draw)
        for (int j = 0; j < f.outputs; ++j) oi[outs.size()] = r - f.outputs + j, outs.push_back({&f, j});
    }
  LILY_CU_TRY(cudaMemcpyAsync(x.tab_dev, x.tab_host, x.tab_bytes, cudaMemcpyHostToDevice, stream_));
  LILY_CU_TRY(cudaMemcpyAsync(x.mtab_dev, x.mtab_host, x.mtab_bytes, cudaMemcpyHostToDevice, stream_));
  // The segments' mixers: the prefill kernels on their rows of x.u, into x.og (DeltaNet) / x.o.
  auto& p = pf_;
  const float eps = c.rms_norm_eps;
  MixedPlan mp;
  mp.D = D, mp.Da = Da, mp.n_out = int(outs.size());
  mp.router = RouterSplit{p.ah, p.al, p.axs};
  // The segments' DeltaNet args of every layer, uploaded once: one launch per kernel and layer covers
  // every segment (pf::gdn_prefill_segments; segment j's scratch rows start at its prompt-row offset,
  // its WY scratch after the previous segments'). Fits the prefill scratch when the step's prompt rows
  // do (checked above).
  const int n_gdn = n_gdn_layers();
  std::vector<size_t> chunked;  // the segments on the chunked form (the others: Seg::recurrent)
  for (size_t j = 0; j < segs.size(); ++j)
    if (!segs[j].recurrent()) chunked.push_back(j);
  const int S = int(chunked.size());
  std::vector<pf::GdnPrefillArgs> gargs(size_t(n_gdn) * size_t(S));
  std::vector<int> gdn_idx(size_t(c.num_hidden_layers), -1);
  size_t longest = 0;
  for (int j = 1; j < S; ++j)
    if (segs[chunked[size_t(j)]].L > segs[chunked[longest]].L) longest = size_t(j);
  for (int i = 0, gi = 0; i < c.num_hidden_layers; ++i) {
    if (d_.layers[size_t(i)].attn) continue;
    gdn_idx[size_t(i)] = gi;
    size_t wy_off = 0;
    for (int j = 0; j < S; ++j) {
      const Seg& sg = segs[chunked[size_t(j)]];
      // Segment j's scratch rows start at its first prompt row (sg.row0 - D); its WY scratch after the
      // previous segments'.
      gargs[size_t(gi) * S + j] = gdn_args(i, *sg.st, sg.st->n, sg.L, x.u + size_t(sg.row0) * x.urows, x.urows,
                                           size_t(sg.row0 - D), x.og + size_t(sg.row0) * vd, p.wy + wy_off);
      wy_off += pf::gdn_wy_floats(sg.L, c.linear_num_value_heads);
    }
    ++gi;
  }
  if (!gargs.empty()) {
    if (x.seg_args_cap < gargs.size()) {
      if (x.seg_args) cudaFree(x.seg_args);
      x.seg_args = nullptr, x.seg_args_cap = 0;
      LILY_CU_TRY(cudaMalloc(&x.seg_args, gargs.size() * sizeof(pf::GdnPrefillArgs)));
      x.seg_args_cap = gargs.size();
    }
    LILY_CU_TRY(cudaMemcpyAsync(x.seg_args, gargs.data(), gargs.size() * sizeof(pf::GdnPrefillArgs), cudaMemcpyHostToDevice, stream_));
  }
  auto* seg_dev = static_cast<pf::GdnPrefillArgs*>(x.seg_args);
  // LILY_BATCH_PROFILE=1: the segments' kernels get a row each in the step's table (host-side args only:
  // the launches read the hook from the longest segment's args).
  x.prof = env_is("LILY_BATCH_PROFILE", "1");
  struct ProfCtx {
    BatchCtx* x;
    cudaStream_t s;
  } pctx{&x, stream_};
  auto prof_cb = +[](void* ctx, const char* what) {
    auto* p = static_cast<ProfCtx*>(ctx);
    p->x->mark(what, p->s);
  };
  if (x.prof)
    for (int gi = 0; gi < n_gdn && S > 0; ++gi) gargs[size_t(gi) * S + longest].prof = prof_cb, gargs[size_t(gi) * S + longest].prof_ctx = &pctx;
  mp.seg_mixers = [&](int i, bool attn) -> Status {
    const DevLayer& Lw = d_.layers[size_t(i)];
    if (!attn) {
      const int gi = gdn_idx[size_t(i)];
      for (const Seg& sg : segs) {
        if (sg.undo >= 0) LILY_TRY(spec_save_u(gi, sg.undo, x.u + size_t(sg.row0) * x.urows));
        if (!sg.recurrent()) continue;
        for (int j = 0; j < sg.L; ++j)  // row row0 + j: its state, position and projections in the row table
          LILY_TRY(bgdn_step(bgdn_args(x, c, Lw, i, size_t(sg.row0 + j), 1), stream_));
      }
      if (S == 0) return Status::ok();
      return pf::gdn_prefill_segments(gargs[size_t(gi) * S + longest], seg_dev + size_t(gi) * S, S, stream_);
    }
    // Every segment's causal attention in one launch per kernel, each with its own q scratch (at its
    // prompt-row offset: the prefill scratch holds the step's prompt rows).
    std::vector<pf::AttnSeg> as;
    for (const Seg& sg : segs) {
      if (sg.dec_attn) continue;
      CudaSeqState& st = *sg.st;
      auto& SL = st.layers[size_t(i)];
      pf::AttnSeg a;
      a.u = x.u + size_t(sg.row0) * x.urows, a.out = x.o + size_t(sg.row0) * nhd, a.kc = SL.kc, a.vc = SL.vc;
      a.qb = static_cast<uint16_t*>(p.qb) + size_t(sg.row0 - D) * nhd * 2, a.M = sg.L, a.pos0 = st.n, a.max_seq = st.cap;
      as.push_back(a);
    }
    if (as.empty()) return Status::ok();
    pf::AttnPrefillArgs a{};
    a.ldu = x.urows, a.q_norm = Lw.q_norm, a.k_norm = Lw.k_norm;
    a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads, a.hd = c.head_dim;
    a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim(), a.theta = c.rope_theta, a.eps = eps;
    if (x.prof) a.prof = prof_cb, a.prof_ctx = &pctx;
    return pf::attn_prefill_segments(a, as.data(), int(as.size()), stream_);
  };
  // LILY_BATCH_PROFILE=1 (x.prof, set above): an event after each op; the third mixed step of each row
  // count prints the table.
  const Marker mk = [&](const char* name) { x.mark(name, stream_); };
  mk("start");
  Status enq = enqueue_tc(x, c, d_, R, stream_, mk, &mp);
  x.prof = false;
  LILY_TRY(enq);
  LILY_TRY(bfinish(x.fin_ctl(x.mtab_dev), x.fin_pos(x.mtab_dev), nfin, stream_));
  // Outputs: rows drawn on the device (the others' specs are unused), logits rows to the host.
  const size_t V = size_t(c.vocab_size);
  bool any_draw = false;
  for (size_t o = 0; o < outs.size(); ++o) {
    const StepFeed& f = *outs[o].f;
    any_draw |= f.draw != nullptr;
    if (f.logits)
      LILY_CU_TRY(cudaMemcpyAsync(f.logits + size_t(outs[o].j) * V, x.logits + o * V, V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  if (any_draw) {
    std::vector<DrawSpec> spec(outs.size());
    std::vector<Drawn> got(outs.size());
    for (size_t o = 0; o < outs.size(); ++o)
      if (outs[o].f->draw) spec[o] = *outs[o].f->draw;
    LILY_TRY(draw_device(x.logits, int(outs.size()), spec, got));
    for (size_t o = 0; o < outs.size(); ++o)
      if (outs[o].f->draw) outs[o].f->drawn[outs[o].j] = got[o];
  }
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  for (const StepFeed& f : feeds) static_cast<CudaSeqState*>(f.state)->n += int(f.tokens.size());
  if (!x.ev.empty() && x.prof_calls[-R] == 2)
    std::fprintf(stderr, "(mixed step: %d decode rows, %zu segments, %d rows in all)\n", D, segs.size(), R);
  end_profile(-R, R);
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
