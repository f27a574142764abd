// See step_bytes.h.
#include "cli/step_bytes.h"

#include <cmath>

namespace lily::cli {

double qbytes(double rows, double cols, int bits) { return rows * (cols * bits / 8.0 + cols / 64.0 * 4.0); }

double step_bytes(const ModelConfig& c, double ctx, const StateMemory& sm, int rows) {
  const double kv_es = sm.kv_elem;
  const double H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const double C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads, B = rows;
  const double E = c.num_experts, k = c.num_experts_per_tok;
  const double experts = rows == 1 ? k : E * (1.0 - std::pow(1.0 - k / E, B));  // distinct per layer
  double b = B * qbytes(1, H, 4) + qbytes(c.vocab_size, H, 4) + 2 * H;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    b += 4 * H;
    if (c.is_full_attention[i]) {
      const double nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
      b += qbytes(nh * hd * (c.attn_output_gate ? 2 : 1) + 2 * nkv * hd, H, 4) + qbytes(H, nh * hd, 4);
      b += B * 2 * nkv * hd * kv_es * (ctx + 1);  // K and V read (and the new row written)
    } else {
      b += qbytes(C + vd + 2 * nv, H, 4) + qbytes(H, vd, 4) + C * c.linear_conv_kernel_dim * 2;
      b += B * 2 * nv * c.linear_key_head_dim * c.linear_value_head_dim * sm.s_elem;  // state read + write
      b += B * 2 * C * (c.linear_conv_kernel_dim - 1) * kv_es;
    }
    b += qbytes(c.num_experts + 1, H, 8);
    b += experts * (2 * qbytes(I, H, 4) + qbytes(H, I, 4));
    b += 2 * qbytes(Is, H, 4) + qbytes(H, Is, 4);
  }
  return b;
}

}  // namespace lily::cli
