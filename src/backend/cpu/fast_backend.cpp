// The fast CPU forward pass of qwen3_5_moe (model-spec §1.4): the reference's structure and storage
// points (store()), with every projection on the quantized kernels through run_qjobs, the MoE reading
// only the routed experts (expert-major slots, one job list per stage), DeltaNet prefill in the
// chunked (WY) form (fast_gdn.h) and decode in the fused two-pass recurrent step per head and
// token, and attention on the vector helpers. Activations,
// the K/V cache and the DeltaNet state stay fp32 (the numerics finding in docs/helpers-common.md).
#include "backend/cpu/fast_backend.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_state.h"
#include "backend/cpu/fast_gdn.h"
#include "backend/cpu/fast_membw.h"
#include "backend/cpu/fast_mmap.h"
#include "backend/cpu/fast_ops.h"
#include "backend/cpu/fast_profile.h"
#include "backend/cpu/ref_ops.h"
#include "core/thread_pool.h"

namespace lily {
namespace cpu {
namespace {

using fast::PreparedX;
using fast::QJob;

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
void store_all(float* p, size_t n) {
  if (bf16_storage())
    for (size_t i = 0; i < n; ++i) p[i] = store(p[i]);
}

// x += y at a storage point of the residual stream (one bf16_storage() test, not one per element).
void add_stored(std::vector<float>& x, const std::vector<float>& y) {
  if (bf16_storage())
    for (size_t j = 0; j < x.size(); ++j) x[j] = store(x[j] + y[j]);
  else
    for (size_t j = 0; j < x.size(); ++j) x[j] += y[j];
}

// A job over all rows of w for activation rows ids[0..n).
QJob job(const QWeight& w, const PreparedX& x, const float* xf, int ldxf, const int32_t* ids, int n, float* y, int ldy) {
  QJob j;
  j.w = &w, j.x = &x, j.xf = xf, j.ldxf = ldxf, j.ids = ids, j.n = n, j.y = y, j.ldy = ldy;
  return j;
}

double job_bytes(std::span<const QJob> jobs) {
  double b = 0;
  for (const auto& j : jobs) b += j.n ? double(j.w->nbytes()) : 0.0;
  return b;
}

void run(Op op, std::span<const QJob> jobs) {
  ProfileScope p(op, job_bytes(jobs));
  fast::run_qjobs(jobs);
}

class FastCpuBackend final : public CpuStatesBackend {
 public:
  using CpuStatesBackend::CpuStatesBackend;
  const char* name() const override { return "cpu"; }
  std::string hardware() const override {
    return fmt::format("cpu ({} threads, kernels {})", ThreadPool::global().size(), fast::kernels().name);
  }

  // `lily bench` compares decode GB/s with this: the read bandwidth of all pool threads, measured once.
  double copy_bandwidth_gbps() override {
    if (read_gbps_ <= 0) read_gbps_ = fast::measure_read_gbps(1.0);
    return read_gbps_;
  }

 protected:  // the parts Backend::launch runs
  Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) override {
    LILY_ASSIGN_OR_RETURN(CpuSeqState* st, check_forward_args(cfg_, state, tokens, logits));
    const int M = int(tokens.size());
    gemm_ = M > 1;    // prefill: fp32 GEMM for the 4-bit jobs
    prep_ = M <= 64;  // int16 activations too, for jobs of ≤ 2 tokens (experts of a short prompt)
    const Seg seg{st, 0, M, st->n};
    return run_rows({&seg, 1}, tokens, logits, /*all_logits=*/false);
  }

  // A serving step: each prompt segment by forward() (the prefill path), then the decode rows and
  // verify feeds as one decode pass: every projection and expert runs once over their rows with the
  // int16 matvec of decode, which computes each row as it does alone (a row's result depends neither
  // on the batch nor on whether it came as a decode row or in a verify feed); conv, DeltaNet (the
  // recurrent step, token by token) and attention per sequence on its own state.
  Status step(std::span<const StepFeed> feeds) override {
    std::vector<const StepFeed*> rows;
    for (const StepFeed& f : feeds) {
      if (f.tokens.size() >= 2 && f.outputs == 1 && !f.rewindable) LILY_TRY(step_segment(f));
      else rows.push_back(&f);
    }
    if (rows.empty()) return Status::ok();
    std::vector<Seg> segs;
    std::vector<int32_t> toks;
    for (const StepFeed* f : rows) {
      LILY_ASSIGN_OR_RETURN(CpuSeqState* st, check_forward_args(cfg_, *f->state, f->tokens, {}));
      segs.push_back(Seg{st, int(toks.size()), int(f->tokens.size()), st->n, f->rewindable});
      toks.insert(toks.end(), f->tokens.begin(), f->tokens.end());
    }
    const size_t V = size_t(cfg_.vocab_size), M = toks.size();
    std::vector<float> logits(M * V);
    gemm_ = false, prep_ = true;
    LILY_TRY(run_rows(segs, toks, logits, /*all_logits=*/true));
    // Outputs: the last `outputs` rows of each feed, copied or drawn on the host.
    std::vector<HostDraw> draws;
    for (size_t i = 0; i < rows.size(); ++i) {
      const StepFeed* f = rows[i];
      for (int o = 0; o < f->outputs; ++o) {
        const float* row = logits.data() + size_t(segs[i].row0 + segs[i].len - f->outputs + o) * V;
        if (f->logits) std::copy(row, row + V, f->logits + size_t(o) * V);
        else if (f->draw) draws.push_back({row, f->draw, &f->drawn[o]});
      }
    }
    draw_on_host(draws, V);
    return Status::ok();
  }

  bool speculates() const override { return true; }
  // The decode kernels are compute-bound on few cores: the full-size checkpoint's batched step (lily
  // bench-batch, 2 threads, AVX-512 VNNI, 2026-12-05) took 92 / 162 / 369 ms at 1 / 2 / 5 rows, each
  // extra row ~0.75 of a step. More cores make a row cheaper; the engine's choice errs on the safe side.
  double spec_row_cost() const override { return 0.75; }

  // Back to n tokens after a rewindable step (Undo in cpu_state.h): each DeltaNet layer's state and
  // conv window from before the step, advanced through the kept rows' saved inputs by the same
  // recurrent step (so the state is bit for bit what feeding only those rows gives); the K/V caches
  // cut to n positions.
  Status rewind(SeqState& state, int n) override {
    auto* st = dynamic_cast<CpuSeqState*>(&state);
    if (!st) return errorf("rewind: the state belongs to another backend");
    CpuSeqState::Undo& u = st->undo;
    if (u.pos0 < 0 || st->n != u.pos0 + u.len || n < u.pos0 || n > st->n)
      return errorf("rewind: to {} tokens, but the state's last step was not a rewindable one ending at {} (it holds {})", n,
                    u.pos0 < 0 ? -1 : u.pos0 + u.len, st->n);
    const int keep = n - u.pos0, K = cfg_.linear_conv_kernel_dim, C = cfg_.gdn_conv_dim();
    const int nk = cfg_.linear_num_key_heads, nv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim, ratio = nv / nk;
    const fast::KernelTable& kt = fast::kernels();
    for (size_t li = 0; li < st->layers.size(); ++li) {
      CpuSeqState::Layer& L = st->layers[li];
      if (L.attention) {
        L.k.resize(size_t(n) * st->kv_row), L.v.resize(size_t(n) * st->kv_row);
        continue;
      }
      const CpuSeqState::Undo::Layer& U = u.layers[li];
      L.S = U.S;
      fast::parallel_dynamic(nv, [&](int hh) {
        std::vector<float> o(static_cast<size_t>(dv));
        float* Sh = L.S.data() + size_t(hh) * dk * dv;
        const int kh = hh / ratio;
        for (int t = 0; t < keep; ++t)
          kt.gdn_step(Sh, &U.q[(size_t(t) * nk + kh) * dk], &U.k[(size_t(t) * nk + kh) * dk], &U.v[(size_t(t) * nv + hh) * dv],
                      U.alpha[size_t(t) * nv + hh], U.beta[size_t(t) * nv + hh], o.data(), dk, dv, dv);
      });
      // Window [C, K-1], oldest first: the last K-1 of (the old window, the kept rows' inputs).
      for (int c = 0; c < C; ++c)
        for (int j = 0; j < K - 1; ++j) {
          const int at = keep + j;  // index into (old window ++ kept rows), of length K-1 + keep
          L.conv[size_t(c) * (K - 1) + j] = at < K - 1 ? U.conv[size_t(c) * (K - 1) + at] : U.u[size_t(at - (K - 1)) * C + c];
        }
    }
    st->n = n;
    u.pos0 = -1;
    return Status::ok();
  }

 private:
  // Rows [row0, row0 + len) of a forward belong to one sequence, at positions pos0, pos0 + 1, ….
  struct Seg {
    CpuSeqState* st;
    int row0, len, pos0;
    bool undo = false;  // a rewindable feed: DeltaNet by the recurrent step, its inputs kept (CpuSeqState::Undo)
  };

  // The forward pass over M rows made of segments (one segment: a prefill or decode of one
  // sequence; many of length 1: a batched decode step). logits: the last row's, or every row's.
  Status run_rows(std::span<const Seg> segs, std::span<const int32_t> tokens, std::span<float> logits, bool all_logits) {
    const int M = int(tokens.size());

    const int H = cfg_.hidden_size;
    ensure_iota(std::max(M * cfg_.num_experts_per_tok, M));
    for (const Seg& sg : segs) {  // a step forgets the state's last undo; a rewindable one keeps its own
      CpuSeqState::Undo& u = sg.st->undo;
      u.pos0 = sg.undo ? sg.pos0 : -1, u.len = sg.len;
      if (sg.undo) u.layers.resize(size_t(cfg_.num_hidden_layers));
    }
    std::vector<float> x(size_t(M) * H), h(size_t(M) * H), mix(size_t(M) * H);
    {
      ProfileScope p(Op::kEmbed, double(M) * w_.embed.nbytes() / w_.embed.rows);
      embed_rows(w_.embed, tokens, x.data());
    }
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      const LayerWeights& L = w_.layers[i];
      norm_and_prepare(x.data(), M, L.input_norm, h.data());
      if (L.full_attention)
        attention(L.attn, i, segs, M, h.data(), mix.data());
      else
        gdn(L.gdn, i, segs, M, h.data(), mix.data());
      add_stored(x, mix);
      norm_and_prepare(x.data(), M, L.post_norm, h.data());
      moe(L.moe, M, h.data(), mix.data());
      add_stored(x, mix);
    }
    for (const Seg& sg : segs) sg.st->n += sg.len;
    if (!logits.empty()) {
      const int r0 = all_logits ? 0 : M - 1, n = M - r0;
      std::vector<float> last(size_t(n) * H);
      rmsnorm(x.data() + size_t(r0) * H, n, H, w_.final_norm, cfg_.rms_norm_eps, last.data());
      fast::prepare_x(last.data(), n, H, H, px_);
      const QJob j = job(w_.lm_head, px_, last.data(), H, iota_.data(), n, logits.data(), cfg_.vocab_size);
      run(Op::kLmHead, {&j, 1});
    }
    return Status::ok();
  }

  // A job of this forward: the int16 matvec at decode, the fp32 GEMM (no PreparedX) at prefill.
  QJob qj(const QWeight& w, const PreparedX& x, const float* xf, int ldxf, const int32_t* ids, int n, float* y, int ldy) {
    QJob j = job(w, x, xf, ldxf, ids, n, y, ldy);
    // The GEMM dequantizes each weight once per job: for 1–2 tokens the int16 matvec is faster (4×
    // at one token), so short prompts keep it for their thinly routed experts.
    if (gemm_ && !(prep_ && n <= 2)) j.x = nullptr;
    return j;
  }

  void ensure_iota(int n) {
    if (int(iota_.size()) < n) {
      iota_.resize(size_t(n));
      std::iota(iota_.begin(), iota_.end(), 0);
    }
  }

  // h = RMS(x)·gain, then px_ = int16 form of h for the 4-bit projections.
  void norm_and_prepare(const float* x, int M, const bf16* gain, float* h) {
    ProfileScope p(Op::kNorm, 0);
    fast::rmsnorm(x, M, cfg_.hidden_size, gain, cfg_.rms_norm_eps, h);
    if (prep_) fast::prepare_x(h, M, cfg_.hidden_size, cfg_.hidden_size, px_);
  }

  // Gated full attention (model-spec §1.4.1) of layer li for M rows; each segment's rows attend
  // to their own sequence's cache, causally.
  void attention(const AttnWeights& A, int li, std::span<const Seg> segs, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
    const int hd = cfg_.head_dim, qw = A.q_proj.rows / nh;
    std::vector<float> qg(size_t(M) * A.q_proj.rows), k(size_t(M) * nkv * hd), v(size_t(M) * nkv * hd);
    {
      const QJob jobs[] = {qj(A.q_proj, px_, h, H, iota_.data(), M, qg.data(), A.q_proj.rows),
                           qj(A.k_proj, px_, h, H, iota_.data(), M, k.data(), nkv * hd),
                           qj(A.v_proj, px_, h, H, iota_.data(), M, v.data(), nkv * hd)};
      run(Op::kMixerProj, jobs);
    }
    store_all(qg.data(), qg.size()), store_all(k.data(), k.size()), store_all(v.data(), v.size());
    ProfileScope prof(Op::kAttention, 0);
    // Row m: its sequence's layer state and position.
    std::vector<CpuSeqState::Layer*> row_S(static_cast<size_t>(M));
    std::vector<int> row_pos(static_cast<size_t>(M));
    for (const Seg& sg : segs)
      for (int r = 0; r < sg.len; ++r) row_S[size_t(sg.row0 + r)] = &sg.st->layers[size_t(li)], row_pos[size_t(sg.row0 + r)] = sg.pos0 + r;
    std::vector<float> q(size_t(M) * nh * hd);
    for (int m = 0; m < M; ++m) {
      const int pos = row_pos[size_t(m)];
      for (int hh = 0; hh < nh; ++hh)
        rmsnorm(&qg[(size_t(m) * nh + hh) * qw], 1, hd, A.q_norm, cfg_.rms_norm_eps, &q[(size_t(m) * nh + hh) * hd]);
      rmsnorm(&k[size_t(m) * nkv * hd], nkv, hd, A.k_norm, cfg_.rms_norm_eps, &k[size_t(m) * nkv * hd]);
      rope_neox(&q[size_t(m) * nh * hd], nh, hd, cfg_.rotary_dim(), pos, cfg_.rope_theta);
      rope_neox(&k[size_t(m) * nkv * hd], nkv, hd, cfg_.rotary_dim(), pos, cfg_.rope_theta);
    }
    store_all(q.data(), q.size());
    for (const Seg& sg : segs) {
      CpuSeqState::Layer& S = sg.st->layers[size_t(li)];
      const size_t at = size_t(sg.pos0) * nkv * hd, n = size_t(sg.len) * nkv * hd, from = size_t(sg.row0) * nkv * hd;
      S.k.resize(at + n);
      S.v.resize(at + n);
      for (size_t j = 0; j < n; ++j) {
        S.k[at + j] = store(k[from + j]);
        S.v[at + j] = store(v[from + j]);
      }
    }
    std::vector<float> o(size_t(M) * nh * hd);
    const float scale = 1.0f / std::sqrt(float(hd));
    const int group = nh / nkv;
    const fast::KernelTable& kt = fast::kernels();
    // One item a (row, KV head): its group of query heads read each cached K and V row once.
    fast::parallel_dynamic(M * nkv, [&](int a) {
      const int m = a / nkv, kvh = a % nkv, n_ctx = row_pos[size_t(m)] + 1;
      const CpuSeqState::Layer& S = *row_S[size_t(m)];
      thread_local std::vector<float> p;
      if (p.size() < size_t(group) * n_ctx) p.resize(size_t(group) * n_ctx);
      const size_t h0 = size_t(m) * nh + size_t(kvh) * group;  // the group's first query head of row m
      kt.attend(&q[h0 * hd], group, hd, &S.k[size_t(kvh) * hd], &S.v[size_t(kvh) * hd], nkv * hd, n_ctx, scale, p.data(),
                &o[h0 * hd]);
      for (int g = 0; g < group; ++g) {
        float* ov = &o[(h0 + g) * hd];
        const float* gate = qw == 2 * hd ? &qg[(h0 + g) * qw + hd] : nullptr;
        for (int d = 0; d < hd; ++d) {
          const float val = store(ov[d]);
          ov[d] = gate ? store(val * sigmoid(gate[d])) : val;
        }
      }
    });
    prof.stop();
    if (prep_) fast::prepare_x(o.data(), M, nh * hd, nh * hd, pmix_);
    const QJob j = qj(A.o_proj, pmix_, o.data(), nh * hd, iota_.data(), M, out, H);
    run(Op::kOutProj, {&j, 1});
    store_all(out, size_t(M) * H);
  }

  // Gated DeltaNet (model-spec §1.4.2) of layer li for M rows: the chunked form for a prefill
  // segment, the recurrent step for decode rows; conv window and state per segment.
  void gdn(const GdnWeights& G, int li, std::span<const Seg> segs, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, C = cfg_.gdn_conv_dim(), kd = cfg_.gdn_key_dim(), vd = cfg_.gdn_value_dim();
    const int nk = cfg_.linear_num_key_heads, nv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    std::vector<float> u(size_t(M) * C), z(size_t(M) * vd), b(size_t(M) * nv), a(size_t(M) * nv);
    {
      const QJob jobs[] = {qj(G.in_proj_qkv, px_, h, H, iota_.data(), M, u.data(), C),
                           qj(G.in_proj_z, px_, h, H, iota_.data(), M, z.data(), vd),
                           qj(G.in_proj_b, px_, h, H, iota_.data(), M, b.data(), nv),
                           qj(G.in_proj_a, px_, h, H, iota_.data(), M, a.data(), nv)};
      run(Op::kMixerProj, jobs);
    }
    store_all(u.data(), u.size()), store_all(z.data(), z.size());
    store_all(b.data(), b.size()), store_all(a.data(), a.size());
    ProfileScope prof(Op::kGdn, 0);
    std::vector<float> c(size_t(M) * C);
    for (const Seg& sg : segs)
      if (sg.undo) {
        CpuSeqState::Undo::Layer& U = sg.st->undo.layers[size_t(li)];
        U.conv = sg.st->layers[size_t(li)].conv;
        U.S = sg.st->layers[size_t(li)].S;
        U.u.assign(u.begin() + ptrdiff_t(sg.row0) * C, u.begin() + ptrdiff_t(sg.row0 + sg.len) * C);
      }
    for (const Seg& sg : segs)
      fast::conv_silu(u.data() + size_t(sg.row0) * C, sg.len, C, C, cfg_.linear_conv_kernel_dim, G.conv1d,
                sg.st->layers[size_t(li)].conv.data(), c.data() + size_t(sg.row0) * C);
    std::vector<float> q(size_t(M) * kd), k(size_t(M) * kd), v(size_t(M) * vd);
    gdn_split_qkv(GdnDims{nk, nv, dk, dv}, M, c.data(), q.data(), k.data(), v.data());
    std::vector<float> g(size_t(M) * nv), beta(size_t(M) * nv);
    gdn_gates(M, nv, a.data(), b.data(), G.A_log.data(), G.dt_bias, g.data(), beta.data());
    for (const Seg& sg : segs)
      if (sg.undo) {
        CpuSeqState::Undo::Layer& U = sg.st->undo.layers[size_t(li)];
        const size_t r0 = size_t(sg.row0), r1 = r0 + size_t(sg.len);
        U.q.assign(q.begin() + ptrdiff_t(r0 * kd), q.begin() + ptrdiff_t(r1 * kd));
        U.k.assign(k.begin() + ptrdiff_t(r0 * kd), k.begin() + ptrdiff_t(r1 * kd));
        U.v.assign(v.begin() + ptrdiff_t(r0 * vd), v.begin() + ptrdiff_t(r1 * vd));
        U.beta.assign(beta.begin() + ptrdiff_t(r0 * nv), beta.begin() + ptrdiff_t(r1 * nv));
        U.alpha.resize((r1 - r0) * nv);
        for (size_t j = 0; j < U.alpha.size(); ++j) U.alpha[j] = std::exp(g[r0 * nv + j]);
      }
    std::vector<float> o(size_t(M) * vd);
    const GdnDims dims{nk, nv, dk, dv};
    // A prefill (segment of ≥ 2 rows): the chunked (WY) form, chunk 64, key heads over the pool
    // (fast_gdn.h). Decode rows: the fused recurrent step.
    std::vector<const Seg*> step_segs;
    for (const Seg& sg : segs) {
      if (sg.len >= 2 && !sg.undo && gemm_ && fast::gdn_chunked_ok(dims)) {
        const size_t r = size_t(sg.row0);
        fast::gdn_chunked(dims, sg.len, &q[r * kd], &k[r * kd], &v[r * vd], &g[r * nv], &beta[r * nv],
                          sg.st->layers[size_t(li)].S.data(), &o[r * vd]);
      } else {
        step_segs.push_back(&sg);
      }
    }
    const int ratio = nv / nk;
    const fast::KernelTable& kt = fast::kernels();
    // Columns of a head's state evolve independently: for several tokens, blocks of 64 columns
    // (128×64 fp32 = 32 KiB, L1) run through the segment's tokens; a decode row takes whole heads
    // (two threads on the two halves of one head's rows ran 3.5x slower: 14 vs 4 ms per token).
    bool multi = false;
    for (const Seg* sg : step_segs) multi = multi || sg->len > 1;
    const int cb = multi && dv % 64 == 0 ? 64 : dv, nb = dv / cb;
    fast::parallel_dynamic(int(step_segs.size()) * nv * nb, [&](int item) {
      const Seg& sg = *step_segs[size_t(item / (nv * nb))];
      item %= nv * nb;
      const int hh = item / nb, j0 = (item % nb) * cb;
      float* Sh = sg.st->layers[size_t(li)].S.data() + size_t(hh) * dk * dv + j0;
      const int kh = hh / ratio;
      for (int t = sg.row0; t < sg.row0 + sg.len; ++t)
        kt.gdn_step(Sh, &q[(size_t(t) * nk + kh) * dk], &k[(size_t(t) * nk + kh) * dk], &v[(size_t(t) * nv + hh) * dv + j0],
                    std::exp(g[size_t(t) * nv + hh]), beta[size_t(t) * nv + hh], &o[(size_t(t) * nv + hh) * dv + j0], dk, cb,
                    dv);
    });
    fast::gated_norm(o.data(), z.data(), G.norm, M * nv, dv, cfg_.rms_norm_eps);
    prof.stop();
    if (prep_) fast::prepare_x(o.data(), M, vd, vd, pmix_);
    const QJob j = qj(G.out_proj, pmix_, o.data(), vd, iota_.data(), M, out, H);
    run(Op::kOutProj, {&j, 1});
    store_all(out, size_t(M) * H);
  }

  // Sparse MoE + sigmoid-gated shared expert (model-spec §1.4.3); px_ holds h in int16 form.
  void moe(const MoeWeights& W, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, E = cfg_.num_experts, topk = cfg_.num_experts_per_tok;
    const int I = cfg_.moe_intermediate_size, Is = cfg_.shared_expert_intermediate_size;
    std::vector<float> rl(size_t(M) * E), sgl(size_t(M) * Is), sul(size_t(M) * Is), sg(M);
    {
      const QJob jobs[] = {qj(W.router, px_, h, H, iota_.data(), M, rl.data(), E),
                           qj(W.shared_expert_gate, px_, h, H, iota_.data(), M, sg.data(), 1),
                           qj(W.shared_gate, px_, h, H, iota_.data(), M, sgl.data(), Is),
                           qj(W.shared_up, px_, h, H, iota_.data(), M, sul.data(), Is)};
      run(Op::kMoeRouterShared, jobs);
    }
    // Route: the reference's route_topk.
    std::vector<int> count(E, 0);
    std::vector<int> sel(size_t(M) * topk);
    std::vector<float> selw(size_t(M) * topk);
    for (int m = 0; m < M; ++m) {
      route_topk(&rl[size_t(m) * E], E, topk, cfg_.norm_topk_prob, &sel[size_t(m) * topk], &selw[size_t(m) * topk]);
      for (int j = 0; j < topk; ++j) ++count[sel[size_t(m) * topk + j]];
    }
    // Expert-major slots: slot s of expert e holds (token, weight); tokens ascending per expert.
    const int n_slots = M * topk;
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; ++e) off[e + 1] = off[e] + count[e];
    std::vector<int32_t> slot_tok(n_slots);
    std::vector<float> slot_w(n_slots);
    {
      std::vector<int> fill(off.begin(), off.end() - 1);
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < topk; ++j) {
          const int e = sel[size_t(m) * topk + j], s = fill[e]++;
          slot_tok[s] = m, slot_w[s] = selw[size_t(m) * topk + j];
        }
    }
    std::vector<QWeight> eg, eu, ed;
    std::vector<int> experts;
    for (int e = 0; e < E; ++e)
      if (count[e]) {
        experts.push_back(e);
        eg.push_back(W.experts_gate.rows_slice(e * I, I));
        eu.push_back(W.experts_up.rows_slice(e * I, I));
        ed.push_back(W.experts_down.rows_slice(e * H, H));
      }
    std::vector<float> gl(size_t(n_slots) * I), ul(size_t(n_slots) * I);
    {
      std::vector<QJob> jobs;
      for (size_t k = 0; k < experts.size(); ++k) {
        const int e = experts[k];
        jobs.push_back(qj(eg[k], px_, h, H, &slot_tok[off[e]], count[e], &gl[size_t(off[e]) * I], I));
        jobs.push_back(qj(eu[k], px_, h, H, &slot_tok[off[e]], count[e], &ul[size_t(off[e]) * I], I));
      }
      run(Op::kMoeGateUp, jobs);
    }
    {
      ProfileScope p(Op::kMoeAct, 0);
      fast::silu_mul(gl.data(), ul.data(), gl.size());
      fast::silu_mul(sgl.data(), sul.data(), sgl.size());
      if (prep_) {
        fast::prepare_x(gl.data(), n_slots, I, I, pact_);
        fast::prepare_x(sgl.data(), M, Is, Is, pmix_);
      }
    }
    std::vector<float> y(size_t(n_slots) * H), sy(size_t(M) * H);
    {
      std::vector<QJob> jobs;
      for (size_t k = 0; k < experts.size(); ++k) {
        const int e = experts[k];
        jobs.push_back(qj(ed[k], pact_, &gl[0], I, &iota_[off[e]], count[e], &y[size_t(off[e]) * H], H));
      }
      jobs.push_back(qj(W.shared_down, pmix_, sgl.data(), Is, iota_.data(), M, sy.data(), H));
      run(Op::kMoeDown, jobs);
    }
    ProfileScope pc(Op::kMoeAct, 0);
    store_all(y.data(), y.size()), store_all(sy.data(), sy.size());
    const fast::KernelTable& kt = fast::kernels();
    std::fill(out, out + size_t(M) * H, 0.0f);
    for (int s = 0; s < n_slots; ++s) kt.axpy(out + size_t(slot_tok[s]) * H, slot_w[s], &y[size_t(s) * H], H);
    for (int m = 0; m < M; ++m) kt.axpy(out + size_t(m) * H, sigmoid(sg[m]), &sy[size_t(m) * H], H);
    store_all(out, size_t(M) * H);
  }

  std::vector<int32_t> iota_;
  PreparedX px_, pmix_, pact_;  // int16 forms of h, of a mixer/shared-expert input, of expert inputs (decode)
  double read_gbps_ = 0;
  bool prep_ = true;            // this forward prepares int16 activations (decode, prompts ≤ 64 tokens)
  bool gemm_ = false;           // this forward is a prefill (M > 1): 4-bit jobs run the fp32 GEMM
};

Status check_weight(const QWeight& w, const char* what, int layer) {
  if (w.bits != 4 && w.bits != 8)
    return errorf("fast cpu backend: {} of layer {} is {}-bit; the fast kernels take 4 and 8 bits (use --backend cpu-ref)",
                  what, layer, w.bits);
  if (w.group_size != fast::kGroup || w.cols % fast::kGroup != 0 || w.cols / fast::kGroup > 256)
    return errorf("fast cpu backend: {} of layer {} has group size {} and {} columns; the fast kernels take group size 64 "
                  "and up to 16384 columns (use --backend cpu-ref)", what, layer, w.group_size, w.cols);
  return Status::ok();
}

// MemTotal and MemAvailable from /proc/meminfo in bytes (0 if unreadable).
std::pair<size_t, size_t> meminfo() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t v = 0, total = 0, avail = 0;
  std::string unit;
  while (f >> key >> v >> unit) {
    if (key == "MemTotal:") total = v * 1024;
    if (key == "MemAvailable:") avail = v * 1024;
  }
  return {total, avail};
}

}  // namespace
}  // namespace cpu

// f summed over a layer's mixer projections (attention or DeltaNet), all used by every token.
template <typename F>
static size_t mixer_sum(const LayerWeights& L, F f) {
  if (L.full_attention) return f(L.attn.q_proj) + f(L.attn.k_proj) + f(L.attn.v_proj) + f(L.attn.o_proj);
  return f(L.gdn.in_proj_qkv) + f(L.gdn.in_proj_z) + f(L.gdn.in_proj_a) + f(L.gdn.in_proj_b) + f(L.gdn.out_proj);
}

// f summed over the weights one token uses outside the embedding and lm_head: every layer's mixer
// projections, router, shared expert and its gate, and top-k routed experts (k/E of the stacked experts).
template <typename F>
static size_t token_sum(const ModelWeights& w, F f) {
  const ModelConfig& c = w.cfg;
  size_t n = 0;
  for (const auto& L : w.layers) {
    const MoeWeights& m = L.moe;
    const size_t per_expert = (f(m.experts_gate) + f(m.experts_up) + f(m.experts_down)) / size_t(std::max(1, c.num_experts));
    n += mixer_sum(L, f) + f(m.router) + f(m.shared_gate) + f(m.shared_up) + f(m.shared_down) + f(m.shared_expert_gate) +
         per_expert * size_t(c.num_experts_per_tok);
  }
  return n;
}

static size_t nbytes(const QWeight& q) { return q.nbytes(); }
static size_t elems(const QWeight& q) { return size_t(q.rows) * size_t(q.cols); }

size_t model_weight_bytes(const ModelWeights& w) {
  size_t b = w.embed.nbytes() + w.lm_head.nbytes();
  for (const auto& L : w.layers) {
    const MoeWeights& m = L.moe;
    b += mixer_sum(L, nbytes) + m.router.nbytes() + m.experts_gate.nbytes() + m.experts_up.nbytes() +
         m.experts_down.nbytes() + m.shared_gate.nbytes() + m.shared_up.nbytes() + m.shared_down.nbytes() +
         m.shared_expert_gate.nbytes();
  }
  return b;
}

size_t decode_bytes_per_token(const ModelWeights& w) {
  return w.lm_head.nbytes() + w.embed.nbytes() / size_t(std::max(1, w.embed.rows)) + token_sum(w, nbytes);
}

size_t macs_per_token(const ModelWeights& w) { return token_sum(w, elems); }

Result<std::unique_ptr<Backend>> make_fast_cpu_backend(const ModelWeights& w, size_t state_limit_bytes) {
  using cpu::check_weight;
  LILY_TRY(check_weight(w.lm_head, "lm_head", -1));
  for (int i = 0; i < int(w.layers.size()); ++i) {
    const LayerWeights& L = w.layers[i];
    const std::pair<const QWeight*, const char*> ws[] = {
        {&L.moe.router, "mlp.gate"}, {&L.moe.experts_gate, "switch_mlp.gate_proj"},
        {&L.moe.experts_up, "switch_mlp.up_proj"}, {&L.moe.experts_down, "switch_mlp.down_proj"},
        {&L.moe.shared_gate, "shared_expert.gate_proj"}, {&L.moe.shared_up, "shared_expert.up_proj"},
        {&L.moe.shared_down, "shared_expert.down_proj"}, {&L.moe.shared_expert_gate, "shared_expert_gate"},
        {L.full_attention ? &L.attn.q_proj : &L.gdn.in_proj_qkv, L.full_attention ? "q_proj" : "in_proj_qkv"},
        {L.full_attention ? &L.attn.k_proj : &L.gdn.in_proj_z, L.full_attention ? "k_proj" : "in_proj_z"},
        {L.full_attention ? &L.attn.v_proj : &L.gdn.in_proj_a, L.full_attention ? "v_proj" : "in_proj_a"},
        {L.full_attention ? &L.attn.o_proj : &L.gdn.in_proj_b, L.full_attention ? "o_proj" : "in_proj_b"},
        {L.full_attention ? &L.attn.o_proj : &L.gdn.out_proj, L.full_attention ? "o_proj" : "out_proj"}};
    for (const auto& [q, name] : ws) LILY_TRY(check_weight(*q, name, i));
  }
  // A prefill allocates tens of MB of activations per layer (MoE outputs alone: 8·M·H floats). With
  // glibc's defaults those come from fresh mmaps or a trimmed heap, so every layer paid page faults
  // and zeroing again (a fifth of prefill time in a profile). Keep freed memory in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // 2 MiB folios and PMD mappings for the weights as they enter the page cache (fast_mmap.h).
  const auto regions = cpu::fast::weight_regions(w);
  cpu::fast::advise_huge_pages(regions);
  // Weights are used in place from the mmap; a decode token touches ~1/10 of them, a long prefill all.
  const auto [total, avail] = cpu::meminfo();
  const size_t need = model_weight_bytes(w);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (total && need > total)
    spdlog::warn("cpu backend: the weights are {:.1f} GiB but this machine has {:.1f} GiB of RAM: they cannot all stay "
                 "in the page cache, so tokens will wait on the disk (expect well under 1 tok/s)",
                 need / gib, total / gib);
  else if (avail && need > avail)
    spdlog::warn("cpu backend: the weights are {:.1f} GiB and {:.1f} GiB of RAM is available now: until other processes "
                 "release memory, parts of the checkpoint will be re-read from disk", need / gib, avail / gib);
  else if (const double s = cpu::fast::populate_weights(regions); s >= 0) {  // fits: read it all now, not during requests
    spdlog::info("cpu backend: weights ({:.1f} GiB) read into memory in {:.1f} s", need / gib, s);
    const auto rf = cpu::fast::refault_small_folios(regions);
    if (rf.tried)
      spdlog::info("cpu backend: the page cache held the weights in small pages ({:.1f} GB in 2 MiB pages): re-read "
                   "in {:.1f} s, now {:.1f} GB in 2 MiB pages", rf.pmd_before / 1e9, rf.seconds, rf.pmd_after / 1e9);
  }
  return std::unique_ptr<Backend>(std::make_unique<cpu::FastCpuBackend>(w, state_limit_bytes));
}

}  // namespace lily
