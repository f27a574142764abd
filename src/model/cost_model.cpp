// See cost_model.h.
#include "model/cost_model.h"

namespace lily {

LayerElems layer_elems(const ModelConfig& c, int i) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  LayerElems e;
  if (c.is_full_attention[size_t(i)]) {
    const double qd = double(c.num_attention_heads) * c.head_dim, kvd = double(c.num_key_value_heads) * c.head_dim;
    e.mixer = (qd * (c.attn_output_gate ? 2 : 1) + 2 * kvd) * H + H * qd;
  } else {
    const double vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
    e.mixer = (c.gdn_conv_dim() + vd + 2 * nv) * H + H * vd;  // [qkv | z | a | b], out_proj
  }
  e.router = (double(c.num_experts) + 1) * H;
  e.expert = 3 * I * H;
  e.shared = 3 * Is * H;
  return e;
}

double token_weight_flops(const ModelConfig& c) {
  double e = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerElems l = layer_elems(c, i);
    e += l.mixer + l.router + c.num_experts_per_tok * l.expert + l.shared;
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
