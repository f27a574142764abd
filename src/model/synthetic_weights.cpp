// Synthetic weights: every tensor draws from its own splitmix64 stream (seed, tensor index),
// chunked so generation parallelizes and stays reproducible for any thread count.
#include "model/synthetic_weights.h"

#include <cmath>

#include "core/thread_pool.h"

namespace lily {
namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float unif(uint64_t& s) { return float(splitmix(s) >> 40) * (1.0f / 16777216.0f); }  // [0,1)

struct Gen {
  SyntheticWeights* sw;
  uint64_t seed;
  uint64_t tensor = 0;

  template <typename T> T* alloc(size_t n) {
    sw->blobs.emplace_back(n * sizeof(T));
    return reinterpret_cast<T*>(sw->blobs.back().data());
  }
  // Fills n elements in chunks of 64K from per-chunk streams.
  template <typename F> void fill(size_t n, F f) {
    const uint64_t t = tensor++;
    const size_t chunk = 65536, nc = (n + chunk - 1) / chunk;
    ThreadPool::global().parallel_for(nc, 1, [&](size_t c0, size_t c1) {
      for (size_t c = c0; c < c1; ++c) {
        uint64_t s = seed * 0x100000001B3ull ^ (t << 32) ^ c;
        splitmix(s);
        for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) f(i, s);
      }
    });
  }
  // A quantized [rows, cols] linear whose output has std ≈ gain for unit-variance inputs.
  QWeight q(int rows, int cols, int bits, float gain) {
    QWeight w;
    w.rows = rows, w.cols = cols, w.bits = bits, w.group_size = 64;
    const size_t nw = size_t(rows) * cols * bits / 32, ng = size_t(rows) * cols / 64;
    uint32_t* codes = alloc<uint32_t>(nw);
    bf16* sc = alloc<bf16>(ng);
    bf16* bi = alloc<bf16>(ng);
    fill(nw, [&](size_t i, uint64_t& s) { codes[i] = uint32_t(splitmix(s)); });
    const float levels = float((1 << bits) - 1);
    const float qstd = levels / std::sqrt(12.0f);
    const float s0 = gain / (qstd * std::sqrt(float(cols)));
    fill(ng, [&](size_t i, uint64_t& s) {
      const float scale = s0 * (0.5f + unif(s));
      sc[i] = f32_to_bf16(scale);
      bi[i] = f32_to_bf16(-scale * (levels * 0.5f + (unif(s) - 0.5f)));
    });
    w.codes = codes, w.scales = sc, w.biases = bi;
    return w;
  }
  const bf16* vec(size_t n, float mean, float spread) {
    bf16* v = alloc<bf16>(n);
    fill(n, [&](size_t i, uint64_t& s) { v[i] = f32_to_bf16(mean + spread * (2.0f * unif(s) - 1.0f)); });
    return v;
  }
};

}  // namespace

Result<ModelConfig> synthetic_config(const std::string& preset) {
  ModelConfig c;
  if (preset == "qwen3.6-35b-a3b") {
    c.hidden_size = 2048, c.num_hidden_layers = 40, c.vocab_size = 248320;
    c.num_attention_heads = 16, c.num_key_value_heads = 2, c.head_dim = 256;
    c.linear_num_key_heads = 16, c.linear_num_value_heads = 32;
    c.num_experts = 256, c.num_experts_per_tok = 8, c.moe_intermediate_size = 512;
    c.shared_expert_intermediate_size = 512;
  } else if (preset == "tiny") {
    c.hidden_size = 256, c.num_hidden_layers = 4, c.vocab_size = 4096;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
    c.linear_num_key_heads = 2, c.linear_num_value_heads = 4;
    c.num_experts = 16, c.num_experts_per_tok = 4, c.moe_intermediate_size = 256;
    c.shared_expert_intermediate_size = 256;
  } else {
    return errorf("unknown synthetic preset '{}' (tiny, qwen3.6-35b-a3b)", preset);
  }
  c.linear_key_head_dim = 128, c.linear_value_head_dim = 128, c.linear_conv_kernel_dim = 4;
  c.norm_topk_prob = true, c.attn_output_gate = true, c.rms_norm_eps = 1e-6f, c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25f, c.max_position_embeddings = 262144, c.tie_word_embeddings = false;
  c.is_full_attention.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) c.is_full_attention[i] = i % 4 == 3;
  c.eos_token_ids = {c.vocab_size - 2, c.vocab_size - 1};
  c.quant = {64, 4};
  return c;
}

std::unique_ptr<SyntheticWeights> make_synthetic_weights(const ModelConfig& c, uint64_t seed) {
  auto sw = std::make_unique<SyntheticWeights>();
  sw->blobs.reserve(64 + 40 * size_t(c.num_hidden_layers));
  Gen g{sw.get(), seed};
  ModelWeights& w = sw->w;
  w.cfg = c;
  const int H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  w.embed = g.q(c.vocab_size, H, 4, 1.0f * std::sqrt(float(H)));  // rows of unit-ish values
  w.lm_head = g.q(c.vocab_size, H, 4, 4.0f);
  w.final_norm = g.vec(H, 1.0f, 0.2f);
  w.layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = w.layers[i];
    L.full_attention = c.is_full_attention[i];
    L.input_norm = g.vec(H, 1.0f, 0.2f);
    L.post_norm = g.vec(H, 1.0f, 0.2f);
    if (L.full_attention) {
      const int nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
      L.attn.q_proj = g.q(nh * 2 * hd, H, 4, 1.0f);
      L.attn.k_proj = g.q(nkv * hd, H, 4, 1.0f);
      L.attn.v_proj = g.q(nkv * hd, H, 4, 1.0f);
      L.attn.o_proj = g.q(H, nh * hd, 4, 0.5f);
      L.attn.q_norm = g.vec(hd, 1.0f, 0.2f);
      L.attn.k_norm = g.vec(hd, 1.0f, 0.2f);
    } else {
      const int C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
      GdnWeights& G = L.gdn;
      G.in_proj_qkv = g.q(C, H, 4, 1.0f);
      G.in_proj_z = g.q(vd, H, 4, 1.0f);
      G.in_proj_b = g.q(nv, H, 4, 1.0f);
      G.in_proj_a = g.q(nv, H, 4, 1.0f);
      G.out_proj = g.q(H, vd, 4, 0.5f);
      G.conv1d = g.vec(size_t(C) * c.linear_conv_kernel_dim, 0.0f, 0.6f);
      G.A_log.resize(nv);
      for (int h = 0; h < nv; ++h) G.A_log[h] = std::log(1.0f + 15.0f * float(h) / float(nv));
      G.dt_bias = g.vec(nv, 0.0f, 1.0f);
      G.norm = g.vec(c.linear_value_head_dim, 1.0f, 0.2f);
    }
    MoeWeights& M = L.moe;
    M.router = g.q(E, H, 8, 2.0f);
    M.experts_gate = g.q(E * I, H, 4, 1.0f);
    M.experts_up = g.q(E * I, H, 4, 1.0f);
    M.experts_down = g.q(E * H, I, 4, 0.5f);
    M.shared_gate = g.q(Is, H, 4, 1.0f);
    M.shared_up = g.q(Is, H, 4, 1.0f);
    M.shared_down = g.q(H, Is, 4, 0.5f);
    M.shared_expert_gate = g.q(1, H, 8, 1.0f);
  }
  return sw;
}

}  // namespace lily
