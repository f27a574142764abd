// The CPU reference forward pass of qwen3_5_moe (model-spec §1.4), over the ops in ref_ops.h.
// Prefill runs M tokens at once (DeltaNet in the chunked form, chunk 64); decode is M = 1
// (DeltaNet recurrent form). Storage points go through store() (ref_ops.h): fp32 by default,
// bf16 exactly where model-spec §1.5 stores bf16 in LILY_CPU_STORAGE=bf16 mode.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_state.h"
#include "backend/cpu/ref_ops.h"
#include "core/thread_pool.h"

namespace lily {
namespace cpu {

bool StateMeter::charge(size_t b) {
  size_t cur = used.load();
  do {
    if (limit > 0 && cur + b > limit) return false;
  } while (!used.compare_exchange_weak(cur, cur + b));
  return true;
}

size_t CpuSeqState::bytes() const {
  size_t b = 0;
  for (const auto& l : layers)
    b += (l.k.capacity() + l.v.capacity()) * sizeof(float) + l.conv.size() * 4 + l.S.size() * 4;
  return b;
}

int CpuSeqState::kv_positions() const {
  size_t p = size_t(cap);
  if (kv_row == 0) return cap;
  for (const auto& l : layers)
    if (l.attention) p = std::min({p, l.k.capacity() / kv_row, l.v.capacity() / kv_row});
  return int(p);
}

Status CpuSeqState::reserve(int n_tokens, int upto) {
  if (n_tokens > cap) return errorf("the sequence needs {} tokens; its limit (max_seq) is {}", n_tokens, cap);
  const int have = kv_positions();
  if (n_tokens <= have) return Status::ok();
  const int want = std::min(cap, upto > 0 ? std::max(n_tokens, upto) : std::max(n_tokens, 2 * have));
  const size_t floats = size_t(want) * kv_row;
  size_t grow = 0;  // bytes the new capacities add
  for (const auto& l : layers)
    if (l.attention) grow += (floats - std::min(floats, l.k.capacity()) + floats - std::min(floats, l.v.capacity())) * 4;
  if (meter && !meter->charge(grow))
    return errorf("out of memory for a K/V cache of {} positions ({} more bytes; the states' limit is {} bytes, {} in use)",
                  want, grow, meter->limit, meter->used.load());
  try {
    for (auto& l : layers)
      if (l.attention) l.k.reserve(floats), l.v.reserve(floats);
  } catch (const std::bad_alloc&) {
    if (meter) meter->refund(grow);
    return errorf("out of host memory growing a K/V cache to {} positions", want);
  }
  charged += grow;
  return Status::ok();
}

std::unique_ptr<SeqState> CpuSeqState::clone() const {
  auto c = std::make_unique<CpuSeqState>();
  c->n = n, c->cap = cap, c->kv_row = kv_row;
  try {
    c->layers.resize(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& a = layers[i];
      Layer& b = c->layers[i];
      b.k.assign(a.k.begin(), a.k.begin() + ptrdiff_t(std::min(a.k.size(), size_t(n) * kv_row)));
      b.v.assign(a.v.begin(), a.v.begin() + ptrdiff_t(std::min(a.v.size(), size_t(n) * kv_row)));
      b.attention = a.attention;
      b.conv = a.conv;
      b.S = a.S;
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  if (meter && !meter->charge(c->bytes())) return nullptr;
  c->meter = meter;
  c->charged = c->bytes();
  return c;
}

void CpuSeqState::reset() {
  n = 0;
  undo.pos0 = -1;
  for (auto& l : layers) {
    l.k.clear();
    l.v.clear();
    std::fill(l.conv.begin(), l.conv.end(), 0.0f);
    std::fill(l.S.begin(), l.S.end(), 0.0f);
  }
}

StateMemory cpu_state_memory(const ModelConfig& cfg) {
  StateMemory m;
  const size_t conv = size_t(cfg.gdn_conv_dim()) * (cfg.linear_conv_kernel_dim - 1);
  const size_t S = size_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim;
  for (int i = 0; i < cfg.num_hidden_layers; ++i)
    if (cfg.is_full_attention[i]) m.per_position += 2 * size_t(cfg.num_key_value_heads) * cfg.head_dim * sizeof(float);
    else m.fixed += (conv + S) * sizeof(float);
  return m;  // kv_base 0, initial_positions 0, position_step 1, page 0: vectors of exactly the reserved size
}

Result<std::unique_ptr<SeqState>> new_cpu_state(const ModelConfig& cfg, int max_seq, std::shared_ptr<StateMeter> meter) {
  if (max_seq <= 0) return errorf("max_seq must be positive, got {}", max_seq);
  const size_t fixed = cpu_state_memory(cfg).fixed;
  if (meter && !meter->charge(fixed))
    return errorf("out of memory for a new sequence state ({} bytes; the states' limit is {} bytes, {} in use)", fixed,
                  meter->limit, meter->used.load());
  auto st = std::make_unique<CpuSeqState>();
  st->meter = meter;
  st->charged = fixed;
  st->cap = max_seq;
  st->kv_row = size_t(cfg.num_key_value_heads) * cfg.head_dim;
  st->layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    auto& l = st->layers[i];
    l.attention = cfg.is_full_attention[i];
    if (l.attention) continue;
    l.conv.assign(size_t(cfg.gdn_conv_dim()) * (cfg.linear_conv_kernel_dim - 1), 0.0f);
    l.S.assign(size_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim, 0.0f);
  }
  return std::unique_ptr<SeqState>(std::move(st));
}

Result<DeviceMemory> cpu_device_memory(const StateMeter& meter) {
  if (meter.limit == 0) return host_memory();
  const size_t used = meter.used.load();
  return DeviceMemory{meter.limit, meter.limit - std::min(meter.limit, used)};
}

Result<CpuSeqState*> check_forward_args(const ModelConfig& cfg, SeqState& state, std::span<const int32_t> tokens,
                                        std::span<float> logits) {
  auto* st = dynamic_cast<CpuSeqState*>(&state);
  if (!st) return errorf("cpu backend: state belongs to another backend");
  const int M = int(tokens.size());
  if (M == 0) return errorf("forward: no tokens");
  if (st->n + M > st->cap) return errorf("forward: {} + {} tokens exceed the state's max_seq {}", st->n, M, st->cap);
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg.vocab_size) return errorf("forward: token id {} outside the vocabulary [0, {})", t, cfg.vocab_size);
  if (!logits.empty() && int(logits.size()) != cfg.vocab_size)
    return errorf("forward: logits span has {} entries, vocab is {}", logits.size(), cfg.vocab_size);
  return st;
}

namespace {

float silu(float v) { return v / (1.0f + std::exp(-v)); }
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

class CpuBackend final : public CpuStatesBackend {
 public:
  using CpuStatesBackend::CpuStatesBackend;
  const char* name() const override { return "cpu-ref"; }

 protected:  // the parts Backend::launch runs
  Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) override {
    LILY_ASSIGN_OR_RETURN(CpuSeqState* st, check_forward_args(cfg_, state, tokens, logits));
    const int M = int(tokens.size());

    const int H = cfg_.hidden_size;
    std::vector<float> x(size_t(M) * H), h(size_t(M) * H), mix(size_t(M) * H);
    embed_rows(w_.embed, tokens, x.data());
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      const LayerWeights& L = w_.layers[i];
      rmsnorm(x.data(), M, H, L.input_norm, cfg_.rms_norm_eps, h.data());
      if (L.full_attention)
        attention(L.attn, st->layers[i], st->n, M, h.data(), mix.data());
      else
        gdn(L.gdn, st->layers[i], M, h.data(), mix.data());
      for (size_t j = 0; j < x.size(); ++j) x[j] = store(x[j] + mix[j]);
      rmsnorm(x.data(), M, H, L.post_norm, cfg_.rms_norm_eps, h.data());
      moe(L.moe, M, h.data(), mix.data());
      for (size_t j = 0; j < x.size(); ++j) x[j] = store(x[j] + mix[j]);
    }
    st->n += M;
    if (!logits.empty()) {
      std::vector<float> last(H);
      rmsnorm(x.data() + size_t(M - 1) * H, 1, H, w_.final_norm, cfg_.rms_norm_eps, last.data());
      qmatmul(w_.lm_head, last.data(), 1, H, logits.data(), cfg_.vocab_size, /*round=*/false);
    }
    return Status::ok();
  }

 private:
  // Gated full attention (model-spec §1.4.1) for M tokens at positions pos0..pos0+M-1.
  void attention(const AttnWeights& A, CpuSeqState::Layer& S, int pos0, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
    const int hd = cfg_.head_dim, qw = A.q_proj.rows / nh;  // per-head width of q_proj: hd or 2·hd
    std::vector<float> qg(size_t(M) * A.q_proj.rows), k(size_t(M) * nkv * hd), v(size_t(M) * nkv * hd);
    qmatmul(A.q_proj, h, M, H, qg.data(), A.q_proj.rows, true);
    qmatmul(A.k_proj, h, M, H, k.data(), nkv * hd, true);
    qmatmul(A.v_proj, h, M, H, v.data(), nkv * hd, true);
    std::vector<float> q(size_t(M) * nh * hd);
    for (int m = 0; m < M; ++m) {
      for (int hh = 0; hh < nh; ++hh)
        rmsnorm(&qg[(size_t(m) * nh + hh) * qw], 1, hd, A.q_norm, cfg_.rms_norm_eps, &q[(size_t(m) * nh + hh) * hd]);
      rmsnorm(&k[size_t(m) * nkv * hd], nkv, hd, A.k_norm, cfg_.rms_norm_eps, &k[size_t(m) * nkv * hd]);
      rope_neox(&q[size_t(m) * nh * hd], nh, hd, cfg_.rotary_dim(), pos0 + m, cfg_.rope_theta);
      rope_neox(&k[size_t(m) * nkv * hd], nkv, hd, cfg_.rotary_dim(), pos0 + m, cfg_.rope_theta);
    }
    for (auto& f : q) f = store(f);
    S.k.resize(size_t(pos0 + M) * nkv * hd);
    S.v.resize(size_t(pos0 + M) * nkv * hd);
    for (size_t j = 0; j < size_t(M) * nkv * hd; ++j) {
      S.k[size_t(pos0) * nkv * hd + j] = store(k[j]);
      S.v[size_t(pos0) * nkv * hd + j] = store(v[j]);
    }
    std::vector<float> o(size_t(M) * nh * hd);
    const float scale = 1.0f / std::sqrt(float(hd));
    const int group = nh / nkv;
    ThreadPool::global().parallel_for(size_t(M) * nh, 1, [&](size_t a0, size_t a1) {
      std::vector<float> p(pos0 + M);
      for (size_t a = a0; a < a1; ++a) {
        const int m = int(a / nh), hh = int(a % nh), kvh = hh / group, n_ctx = pos0 + m + 1;
        const float* qv = &q[(size_t(m) * nh + hh) * hd];
        float mx = -INFINITY;
        for (int t = 0; t < n_ctx; ++t) {
          const float* kt = &S.k[(size_t(t) * nkv + kvh) * hd];
          float s = 0;
          for (int d = 0; d < hd; ++d) s += qv[d] * kt[d];
          p[t] = s * scale;
          mx = std::max(mx, p[t]);
        }
        float sum = 0;
        for (int t = 0; t < n_ctx; ++t) sum += (p[t] = std::exp(p[t] - mx));
        float* ov = &o[(size_t(m) * nh + hh) * hd];
        std::fill(ov, ov + hd, 0.0f);
        for (int t = 0; t < n_ctx; ++t) {
          const float* vt = &S.v[(size_t(t) * nkv + kvh) * hd];
          const float pt = p[t] / sum;
          for (int d = 0; d < hd; ++d) ov[d] += pt * vt[d];
        }
        // Output gate: the second half of this head's q_proj row (when attn_output_gate).
        const float* gate = qw == 2 * hd ? &qg[(size_t(m) * nh + hh) * qw + hd] : nullptr;
        for (int d = 0; d < hd; ++d) {
          float val = store(ov[d]);
          ov[d] = gate ? store(val * sigmoid(gate[d])) : val;
        }
      }
    });
    qmatmul(A.o_proj, o.data(), M, nh * hd, out, H, true);
  }

  // Gated DeltaNet (model-spec §1.4.2) for M tokens.
  void gdn(const GdnWeights& G, CpuSeqState::Layer& S, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, C = cfg_.gdn_conv_dim(), kd = cfg_.gdn_key_dim(), vd = cfg_.gdn_value_dim();
    const int nk = cfg_.linear_num_key_heads, nv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    std::vector<float> u(size_t(M) * C), z(size_t(M) * vd), b(size_t(M) * nv), a(size_t(M) * nv);
    qmatmul(G.in_proj_qkv, h, M, H, u.data(), C, true);
    qmatmul(G.in_proj_z, h, M, H, z.data(), vd, true);
    qmatmul(G.in_proj_b, h, M, H, b.data(), nv, true);
    qmatmul(G.in_proj_a, h, M, H, a.data(), nv, true);
    std::vector<float> c(size_t(M) * C);
    conv_silu(u.data(), M, C, C, cfg_.linear_conv_kernel_dim, G.conv1d, S.conv.data(), c.data());
    std::vector<float> q(size_t(M) * kd), k(size_t(M) * kd), v(size_t(M) * vd);
    const GdnDims dims{nk, nv, dk, dv};
    gdn_split_qkv(dims, M, c.data(), q.data(), k.data(), v.data());
    std::vector<float> g(size_t(M) * nv), beta(size_t(M) * nv);
    gdn_gates(M, nv, a.data(), b.data(), G.A_log.data(), G.dt_bias, g.data(), beta.data());
    std::vector<float> o(size_t(M) * vd);
    if (M == 1)
      gdn_recurrent(dims, M, q.data(), k.data(), v.data(), g.data(), beta.data(), S.S.data(), o.data());
    else
      gdn_chunked(dims, M, 64, q.data(), k.data(), v.data(), g.data(), beta.data(), S.S.data(), o.data());
    // Gated RMSNorm per v-head with the plain gain, times SiLU(z).
    for (int m = 0; m < M; ++m)
      for (int hh = 0; hh < nv; ++hh) {
        float* oh = &o[(size_t(m) * nv + hh) * dv];
        const float* zh = &z[(size_t(m) * nv + hh) * dv];
        float ss = 0;
        for (int d = 0; d < dv; ++d) {
          oh[d] = store(oh[d]);
          ss += oh[d] * oh[d];
        }
        const float inv = 1.0f / std::sqrt(ss / dv + cfg_.rms_norm_eps);
        for (int d = 0; d < dv; ++d) oh[d] = store(bf16_to_f32(G.norm[d]) * oh[d] * inv * silu(zh[d]));
      }
    qmatmul(G.out_proj, o.data(), M, vd, out, H, true);
  }

  // Sparse MoE + sigmoid-gated shared expert (model-spec §1.4.3) for M tokens.
  void moe(const MoeWeights& W, int M, const float* h, float* out) {
    const int H = cfg_.hidden_size, E = cfg_.num_experts, topk = cfg_.num_experts_per_tok;
    const int I = cfg_.moe_intermediate_size, Is = cfg_.shared_expert_intermediate_size;
    std::vector<float> rl(size_t(M) * E);
    qmatmul(W.router, h, M, H, rl.data(), E, false);
    // Route: softmax in fp32, top-k (ties → lowest id), renormalized over the k chosen.
    std::vector<std::vector<std::pair<int, float>>> rows_of(E);  // expert → (token, weight)
    std::vector<int> ids(topk);
    std::vector<float> w(topk);
    for (int m = 0; m < M; ++m) {
      route_topk(&rl[size_t(m) * E], E, topk, cfg_.norm_topk_prob, ids.data(), w.data());
      for (int j = 0; j < topk; ++j) rows_of[ids[j]].push_back({m, w[j]});
    }
    std::vector<float> acc(size_t(M) * H, 0.0f);
    for (int e = 0; e < E; ++e) {
      const auto& rows = rows_of[e];
      if (rows.empty()) continue;
      const int n = int(rows.size());
      std::vector<float> xe(size_t(n) * H), act(size_t(n) * I), up(size_t(n) * I), y(size_t(n) * H);
      for (int r = 0; r < n; ++r) std::copy(h + size_t(rows[r].first) * H, h + size_t(rows[r].first + 1) * H, &xe[size_t(r) * H]);
      swiglu(W.experts_gate.rows_slice(e * I, I), W.experts_up.rows_slice(e * I, I), xe.data(), n, act.data(), up.data());
      qmatmul(W.experts_down.rows_slice(e * H, H), act.data(), n, I, y.data(), H, true);
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < H; ++c) acc[size_t(rows[r].first) * H + c] += rows[r].second * y[size_t(r) * H + c];
    }
    std::vector<float> sact(size_t(M) * Is), sup(size_t(M) * Is), sy(size_t(M) * H), sg(M);
    swiglu(W.shared_gate, W.shared_up, h, M, sact.data(), sup.data());
    qmatmul(W.shared_down, sact.data(), M, Is, sy.data(), H, true);
    qmatmul(W.shared_expert_gate, h, M, H, sg.data(), 1, false);
    for (int m = 0; m < M; ++m) {
      const float sigma = sigmoid(sg[m]);
      for (int c = 0; c < H; ++c) out[size_t(m) * H + c] = store(acc[size_t(m) * H + c] + sigma * sy[size_t(m) * H + c]);
    }
  }

  // act = bf16(SiLU(gate·x) ⊙ up·x), both projections rounded to bf16 first. tmp: scratch like act.
  void swiglu(const QWeight& gate, const QWeight& up, const float* x, int n, float* act, float* tmp) {
    const int H = cfg_.hidden_size, I = gate.rows;
    qmatmul(gate, x, n, H, act, I, true);
    qmatmul(up, x, n, H, tmp, I, true);
    for (size_t j = 0; j < size_t(n) * I; ++j) act[j] = store(silu(act[j]) * tmp[j]);
  }
};

}  // namespace
}  // namespace cpu

Result<std::unique_ptr<Backend>> make_cpu_backend(const ModelWeights& weights, size_t state_limit_bytes) {
  return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(weights, state_limit_bytes));
}

}  // namespace lily
