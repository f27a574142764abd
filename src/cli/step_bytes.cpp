// See step_bytes.h.
#include "cli/step_bytes.h"

#include <cmath>

namespace lily::cli {

double qbytes(double rows, double cols, int bits) { return rows * (cols * bits / 8.0 + cols / 64.0 * 4.0); }

double step_bytes(const ModelConfig& c, double ctx, const StateMemory& sm, int rows) {
  const double kv_es = sm.kv_elem;
  const double H = c.hidden_size, C = c.gdn_conv_dim(), nv = c.linear_num_value_heads, B = rows;
  const double E = c.num_experts, k = c.num_experts_per_tok;
  const double experts = rows == 1 ? k : E * (1.0 - std::pow(1.0 - k / E, B));  // distinct per layer
  const double q4 = qbytes(1, 1, 4), q8 = qbytes(1, 1, 8);  // bytes a weight element (codes + scale and bias)
  double b = B * qbytes(1, H, 4) + qbytes(c.vocab_size, H, 4) + 2 * H;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerElems w = layer_elems(c, i);
    b += 4 * H + w.mixer * q4 + w.router * q8 + experts * w.expert * q4 + w.shared * q4;
    if (c.is_full_attention[i]) {
      b += B * 2 * c.num_key_value_heads * c.head_dim * kv_es * (ctx + 1);  // K and V read (and the new row written)
    } else {
      b += C * c.linear_conv_kernel_dim * 2;  // the conv weights (bf16)
      b += B * 2 * nv * c.linear_key_head_dim * c.linear_value_head_dim * sm.s_elem;  // state read + write
      b += B * 2 * C * (c.linear_conv_kernel_dim - 1) * kv_es;
    }
  }
  return b;
}

}  // namespace lily::cli
