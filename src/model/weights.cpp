// Builds ModelWeights views from a checked Checkpoint (names per model-spec §1.2).
#include "model/weights.h"

#include <cstring>

#include "io/checkpoint.h"

namespace lily {

QWeight QWeight::rows_slice(int r0, int n) const {
  LILY_CHECK(r0 >= 0 && n >= 0 && r0 + n <= rows);
  QWeight q = *this;
  q.codes = codes + size_t(r0) * words_per_row();
  q.scales = scales + size_t(r0) * groups_per_row();
  q.biases = biases + size_t(r0) * groups_per_row();
  q.rows = n;
  return q;
}

namespace {

const bf16* bf16_ptr(const Checkpoint& c, const std::string& name) {
  return reinterpret_cast<const bf16*>(c.tensor(name).data);
}

// A quantized linear from its three tensors. Stacked [E, out, words] tensors become one
// [E*out, in] weight whose experts are row slices.
QWeight qweight(const Checkpoint& c, const std::string& module, int group_size) {
  const TensorView& w = c.tensor(module + ".weight");
  const TensorView& s = c.tensor(module + ".scales");
  QWeight q;
  q.codes = reinterpret_cast<const uint32_t*>(w.data);
  q.scales = reinterpret_cast<const bf16*>(s.data);
  q.biases = reinterpret_cast<const bf16*>(c.tensor(module + ".biases").data);
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < w.shape.size(); ++i) rows *= w.shape[i];
  int64_t words = w.shape.back();
  int64_t groups = s.shape.back();
  q.rows = int(rows);
  q.group_size = group_size;
  q.cols = int(groups * group_size);
  q.bits = int(words * 32 / q.cols);
  return q;
}

}  // namespace

Result<ModelWeights> ModelWeights::from_checkpoint(const Checkpoint& c) {
  ModelWeights mw;
  mw.cfg = c.config();
  const ModelConfig& cfg = mw.cfg;
  const int gs = cfg.quant.group_size;
  const std::string P = "language_model.model.";
  mw.embed = qweight(c, P + "embed_tokens", gs);  // gs: the default; overrides checked equal at load
  mw.lm_head = qweight(c, "language_model.lm_head", gs);
  mw.final_norm = bf16_ptr(c, P + "norm.weight");
  mw.layers.resize(cfg.num_hidden_layers);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    LayerWeights& L = mw.layers[i];
    const std::string p = P + "layers." + std::to_string(i) + ".";
    L.full_attention = cfg.is_full_attention[i];
    L.input_norm = bf16_ptr(c, p + "input_layernorm.weight");
    L.post_norm = bf16_ptr(c, p + "post_attention_layernorm.weight");
    if (L.full_attention) {
      const std::string a = p + "self_attn.";
      L.attn.q_proj = qweight(c, a + "q_proj", gs);
      L.attn.k_proj = qweight(c, a + "k_proj", gs);
      L.attn.v_proj = qweight(c, a + "v_proj", gs);
      L.attn.o_proj = qweight(c, a + "o_proj", gs);
      L.attn.q_norm = bf16_ptr(c, a + "q_norm.weight");
      L.attn.k_norm = bf16_ptr(c, a + "k_norm.weight");
    } else {
      const std::string g = p + "linear_attn.";
      L.gdn.in_proj_qkv = qweight(c, g + "in_proj_qkv", gs);
      L.gdn.in_proj_z = qweight(c, g + "in_proj_z", gs);
      L.gdn.in_proj_b = qweight(c, g + "in_proj_b", gs);
      L.gdn.in_proj_a = qweight(c, g + "in_proj_a", gs);
      L.gdn.out_proj = qweight(c, g + "out_proj", gs);
      L.gdn.conv1d = bf16_ptr(c, g + "conv1d.weight");
      L.gdn.dt_bias = bf16_ptr(c, g + "dt_bias");
      L.gdn.norm = bf16_ptr(c, g + "norm.weight");
      const TensorView& al = c.tensor(g + "A_log");
      L.gdn.A_log.resize(cfg.linear_num_value_heads);
      for (int h = 0; h < cfg.linear_num_value_heads; ++h) {
        if (al.dtype == DType::F32) {
          std::memcpy(&L.gdn.A_log[h], al.data + 4 * h, 4);
        } else {
          bf16 v;
          std::memcpy(&v.bits, al.data + 2 * h, 2);
          L.gdn.A_log[h] = bf16_to_f32(v);
        }
      }
    }
    const std::string m = p + "mlp.";
    L.moe.router = qweight(c, m + "gate", gs);
    L.moe.experts_gate = qweight(c, m + "switch_mlp.gate_proj", gs);
    L.moe.experts_up = qweight(c, m + "switch_mlp.up_proj", gs);
    L.moe.experts_down = qweight(c, m + "switch_mlp.down_proj", gs);
    L.moe.shared_gate = qweight(c, m + "shared_expert.gate_proj", gs);
    L.moe.shared_up = qweight(c, m + "shared_expert.up_proj", gs);
    L.moe.shared_down = qweight(c, m + "shared_expert.down_proj", gs);
    L.moe.shared_expert_gate = qweight(c, m + "shared_expert_gate", gs);
  }
  return mw;
}

}  // namespace lily
