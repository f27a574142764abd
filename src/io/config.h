// config.json of an MLX qwen3_5_moe checkpoint: the multimodal wrapper with text_config,
// top-level eos_token_id and quantization (with per-module overrides). Every dimension the
// model uses comes from here, so small checkpoints of the family load through the same code.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace lily {

struct QuantSpec {
  int group_size = 64;
  int bits = 4;
};

struct ModelConfig {
  // text_config
  int hidden_size = 0;            // H
  int num_hidden_layers = 0;      // L
  int vocab_size = 0;
  int num_attention_heads = 0;    // query heads
  int num_key_value_heads = 0;
  int head_dim = 0;
  int linear_num_key_heads = 0;   // GDN q/k heads
  int linear_num_value_heads = 0; // GDN v heads
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  bool attn_output_gate = true;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 1e7;
  float partial_rotary_factor = 0.25f;
  int max_position_embeddings = 262144;
  bool tie_word_embeddings = false;
  std::vector<bool> is_full_attention;  // [L] layer_types[i] == "full_attention"
  std::vector<int> eos_token_ids;       // top-level list wins over text_config's scalar
  // quantization
  QuantSpec quant;                                   // default for quantized linears
  std::map<std::string, QuantSpec> quant_overrides;  // by module path, e.g. "...mlp.gate"

  // Derived.
  int rotary_dim() const { return int(head_dim * partial_rotary_factor); }
  int gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }      // q and k width
  int gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }  // v and z width
  int gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int n_full_attention() const;
  // True when every dimension equals the real Qwen3.6-35B-A3B.
  bool is_exact_qwen36_35b_a3b() const;
  // The quant spec a module path (without .weight) declares: override or default.
  QuantSpec quant_for(const std::string& module) const;
};

// Parses and validates (types, ranges, dimensions consistent with each other). Errors name the
// file and the field.
Result<ModelConfig> parse_config_json(const std::string& text, const std::string& path_for_errors);
Result<ModelConfig> load_config(const std::string& checkpoint_dir);

}  // namespace lily
