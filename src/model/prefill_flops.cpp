// See prefill_flops.h.
#include "model/prefill_flops.h"

namespace lily {

double token_weight_flops(const ModelConfig& c) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const double E = c.num_experts, k = c.num_experts_per_tok;
  const double qd = double(c.num_attention_heads) * c.head_dim, kvd = double(c.num_key_value_heads) * c.head_dim;
  const double kd = c.gdn_key_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
  double e = 0;  // weight elements
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_full_attention[size_t(i)]) e += (qd * (c.attn_output_gate ? 2 : 1) + 2 * kvd) * H + H * qd;
    else e += (2 * kd + 2 * vd + 2 * nv) * H + H * vd;  // [qkv | z | a | b], out_proj
    e += (E + 1) * H + 3 * Is * H + k * 3 * I * H;  // router + shared gate, shared expert, routed experts
  }
  return 2 * e;
}

double prefill_flops(const ModelConfig& c, double P, double past) {
  if (P <= 0) return 0;
  double attn_layers = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) attn_layers += c.is_full_attention[size_t(i)] ? 1 : 0;
  // Σ over the P queries of the keys each sees: past + 1, …, past + P.
  const double pairs = P * past + P * (P + 1) / 2;
  const double attn = attn_layers * 4.0 * c.num_attention_heads * c.head_dim * pairs;
  return P * token_weight_flops(c) + attn + 2.0 * double(c.vocab_size) * c.hidden_size;
}

}  // namespace lily
