// The per-token counts `lily bench-cpu` reports its speeds with (fast_backend.h): the weight products one
// token does (macs_per_token: prefill GFLOP/s against the FMA peak) and the bytes one decode token reads
// (decode_bytes_per_token: GB/s against the bandwidth), each against a sum written here from the config's
// shapes (model-spec §1), not from the tensors, on the tiny preset's synthetic weights (in memory).
#include <gtest/gtest.h>

#include "backend/cpu/fast_backend.h"
#include "model/cost_model.h"
#include "model/synthetic_weights.h"

namespace lily {
namespace {

TEST(BenchCounts, PerTokenCountsFollowTheConfig) {
  auto cfg = synthetic_config("tiny");
  ASSERT_TRUE(cfg) << cfg.message();
  const auto sw = make_synthetic_weights(*cfg, 5);
  const ModelWeights& w = sw->w;
  const ModelConfig& c = w.cfg;
  const size_t H = size_t(c.hidden_size), I = size_t(c.moe_intermediate_size), Is = size_t(c.shared_expert_intermediate_size);
  const size_t E = size_t(c.num_experts), k = size_t(c.num_experts_per_tok);
  const size_t qd = size_t(c.num_attention_heads) * size_t(c.head_dim), kvd = size_t(c.num_key_value_heads) * size_t(c.head_dim);
  const size_t kd = size_t(c.gdn_key_dim()), vd = size_t(c.gdn_value_dim()), nv = size_t(c.linear_num_value_heads);
  // Weight elements a token multiplies, and the elements one decode token reads (the routed experts' k).
  size_t macs = 0;
  int n_attn = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_full_attention[size_t(i)]) {
      ++n_attn;
      macs += (qd * (c.attn_output_gate ? 2 : 1) + 2 * kvd) * H + H * qd;  // q(+gate), k, v; o
    } else {
      macs += (2 * kd + vd + vd + 2 * nv) * H + H * vd;  // qkv, z, a, b; out
    }
    macs += E * H + 2 * Is * H + H * Is + H + k * 3 * I * H;  // router, shared gate/up/down, its gate, k experts
  }
  ASSERT_GT(n_attn, 0);
  ASSERT_LT(n_attn, c.num_hidden_layers);
  EXPECT_EQ(macs_per_token(w), macs);
  // Bytes: 4-bit codes (8-bit router and shared-expert gate) plus a bf16 scale and bias a group of 64, every
  // one of those elements, plus the lm_head and one embedding row (4-bit and 8-bit as the preset stores them).
  const size_t router_elems = size_t(c.num_hidden_layers) * (E * H + H);
  auto qbytes = [](size_t elems, int bits) { return elems * size_t(bits) / 8 + elems / 64 * 4; };
  const size_t head = size_t(c.vocab_size) * H;
  const size_t expect_bytes = qbytes(macs - router_elems, 4) + qbytes(router_elems, 8) + qbytes(head, w.lm_head.bits) +
                              qbytes(H, w.embed.bits);
  EXPECT_EQ(decode_bytes_per_token(w), expect_bytes);
}

TEST(BenchCounts, PrefillFlopsFollowTheWeights) {
  for (const char* preset : {"tiny", "qwen3.6-35b-a3b"}) {
    auto cfg = synthetic_config(preset);
    ASSERT_TRUE(cfg) << cfg.message();
    const ModelConfig& c = *cfg;
    if (std::string(preset) == "tiny") {  // the weights' own count (the real preset's weights are 19 GB)
      const auto sw = make_synthetic_weights(c, 5);
      EXPECT_DOUBLE_EQ(token_weight_flops(c), 2.0 * double(macs_per_token(sw->w))) << preset;
    }
    // Attention pairs one by one: a prompt of P after `past` tokens, each query sees past + its index + 1 keys.
    int n_attn = 0;
    for (int i = 0; i < c.num_hidden_layers; ++i) n_attn += c.is_full_attention[size_t(i)] ? 1 : 0;
    for (const auto& [P, past] : {std::pair{1, 0}, std::pair{7, 0}, std::pair{300, 45}}) {
      double pairs = 0;
      for (int q = 0; q < P; ++q) pairs += past + q + 1;
      const double want = P * token_weight_flops(c) + n_attn * 4.0 * c.num_attention_heads * c.head_dim * pairs +
                          2.0 * c.vocab_size * c.hidden_size;
      EXPECT_DOUBLE_EQ(prefill_flops(c, P, past), want) << preset << " P " << P << " past " << past;
    }
    EXPECT_EQ(prefill_flops(c, 0), 0.0);
  }
  // The real shape: ~4.9 GFLOP of weight products a token (docs/perf: "4.87 GFLOP a token").
  auto real = synthetic_config("qwen3.6-35b-a3b");
  ASSERT_TRUE(real);
  EXPECT_NEAR(token_weight_flops(*real) / 1e9, 4.87, 0.05);
}

}  // namespace
}  // namespace lily
