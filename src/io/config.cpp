// config.json parsing for the MLX qwen3_5_moe wrapper. Strict: every field the model uses is
// type- and range-checked, and the dimensions are checked against each other, so code further
// down can trust them. Each error names the file and the JSON path of the field.
#include "io/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/json_depth.h"

namespace lily {

using json = nlohmann::json;

namespace {

// Short rendering of a JSON value for error messages.
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads fields of one JSON object, prefixing errors with "<file>: <path>.<key>".
struct Reader {
  const json& obj;
  std::string file;
  std::string path;  // "" for the root, "text_config" etc.

  std::string field(const std::string& key) const { return path.empty() ? key : path + "." + key; }
  Status err(const std::string& key, const std::string& what) const {
    return errorf("{}: {}: {}", file, field(key), what);
  }
  bool has(const std::string& key) const { return obj.contains(key) && !obj.at(key).is_null(); }

  Status positive_int(const std::string& key, int& out) const {
    if (!has(key)) return err(key, "missing (expected a positive integer)");
    const json& v = obj.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t(1) << 30))
      return err(key, "expected a positive integer, got " + show(v));
    out = int(v.get<int64_t>());
    return Status::ok();
  }
  Status optional_positive_int(const std::string& key, int& out) const {
    return has(key) ? positive_int(key, out) : Status::ok();
  }
  Status optional_bool(const std::string& key, bool& out) const {
    if (!has(key)) return Status::ok();
    const json& v = obj.at(key);
    if (!v.is_boolean()) return err(key, "expected true or false, got " + show(v));
    out = v.get<bool>();
    return Status::ok();
  }
  Status positive_number(const std::string& key, double& out) const {
    const json& v = obj.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      return err(key, "expected a positive number, got " + show(v));
    out = v.get<double>();
    return Status::ok();
  }
  Status object(const std::string& key, const json*& out) const {
    if (!has(key)) return err(key, "missing (expected an object)");
    if (!obj.at(key).is_object()) return err(key, "expected an object, got " + show(obj.at(key)));
    out = &obj.at(key);
    return Status::ok();
  }
};

// eos_token_id: an integer or a non-empty list of integers.
Status parse_eos(const Reader& r, const std::string& key, std::vector<int>& out) {
  const json& v = r.obj.at(key);
  auto one = [&](const json& e) -> bool {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) return false;
    out.push_back(int(e.get<int64_t>()));
    return true;
  };
  out.clear();
  if (v.is_array()) {
    if (v.empty()) return r.err(key, "expected a non-empty list of token ids, got []");
    for (const auto& e : v)
      if (!one(e)) return r.err(key, "expected token ids (non-negative integers), got " + show(v));
    return Status::ok();
  }
  if (!one(v)) return r.err(key, "expected a token id or a list of token ids, got " + show(v));
  return Status::ok();
}

Status parse_quant_spec(const Reader& r, const std::string& key, const json& v, QuantSpec& q) {
  Reader qr{v, r.file, r.field(key)};
  LILY_TRY(qr.positive_int("group_size", q.group_size));
  LILY_TRY(qr.positive_int("bits", q.bits));
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
    return qr.err("group_size", fmt::format("expected 32, 64 or 128, got {}", q.group_size));
  if (q.bits != 4 && q.bits != 8) return qr.err("bits", fmt::format("expected 4 or 8, got {}", q.bits));
  if (qr.has("mode") && !(v.at("mode").is_string() && v.at("mode").get<std::string>() == "affine"))
    return qr.err("mode", "expected \"affine\", got " + show(v.at("mode")));
  return Status::ok();
}

// "quantization": {group_size, bits, mode, "<module path>": {group_size, bits}, ...}
Status parse_quantization(const Reader& root, ModelConfig& c) {
  const json* qj = nullptr;
  LILY_TRY(root.object("quantization", qj));
  LILY_TRY(parse_quant_spec(root, "quantization", *qj, c.quant));
  Reader qr{*qj, root.file, "quantization"};
  for (const auto& [key, v] : qj->items()) {
    if (key == "group_size" || key == "bits" || key == "mode") continue;
    bool ours = key.rfind("language_model.", 0) == 0;
    if (v.is_object()) {
      QuantSpec s;
      LILY_TRY(parse_quant_spec(qr, key, v, s));
      if (ours) c.quant_overrides[key] = s;
    } else if (ours && !v.is_boolean()) {
      return qr.err(key, "expected an object {group_size, bits} (or a boolean), got " + show(v));
    }
    // Booleans (mlx-lm's "quantize this module or not") are not read: the checkpoint check
    // derives each module's bit width from its packed width. Keys outside the text model
    // (vision tower) do not concern us.
  }
  return Status::ok();
}

Status parse_layer_types(const Reader& t, ModelConfig& c) {
  int n = c.num_hidden_layers;
  c.is_full_attention.assign(size_t(n), false);
  if (t.has("layer_types")) {
    const json& lt = t.obj.at("layer_types");
    if (!lt.is_array()) return t.err("layer_types", "expected a list, got " + show(lt));
    if (int64_t(lt.size()) != n)
      return t.err("layer_types", fmt::format("has {} entries, expected num_hidden_layers = {}", lt.size(), n));
    for (int i = 0; i < n; ++i) {
      const json& e = lt[size_t(i)];
      std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "linear_attention" && s != "full_attention")
        return t.err(fmt::format("layer_types[{}]", i),
                     "expected \"linear_attention\" or \"full_attention\", got " + show(e));
      c.is_full_attention[size_t(i)] = s == "full_attention";
    }
    return Status::ok();
  }
  int interval = 0;
  if (!t.has("full_attention_interval"))
    return t.err("layer_types", "missing (and no full_attention_interval to derive it from)");
  LILY_TRY(t.positive_int("full_attention_interval", interval));
  for (int i = 0; i < n; ++i) c.is_full_attention[size_t(i)] = (i + 1) % interval == 0;
  return Status::ok();
}

// rope_parameters {rope_theta, partial_rotary_factor}, or legacy keys directly in text_config.
Status parse_rope(const Reader& t, ModelConfig& c) {
  const json* rp = nullptr;
  if (t.has("rope_parameters")) LILY_TRY(t.object("rope_parameters", rp));
  Reader rr = rp ? Reader{*rp, t.file, t.field("rope_parameters")} : t;
  const Reader* theta_src = rr.has("rope_theta") ? &rr : (t.has("rope_theta") ? &t : nullptr);
  if (!theta_src) return rr.err("rope_theta", "missing (expected a positive number)");
  LILY_TRY(theta_src->positive_number("rope_theta", c.rope_theta));
  const Reader* prf_src = rr.has("partial_rotary_factor") ? &rr : (t.has("partial_rotary_factor") ? &t : nullptr);
  if (prf_src) {
    double f = 0;
    LILY_TRY(prf_src->positive_number("partial_rotary_factor", f));
    if (f > 1.0) return prf_src->err("partial_rotary_factor", fmt::format("expected a value in (0, 1], got {}", f));
    c.partial_rotary_factor = float(f);
    int rd = c.rotary_dim();
    if (rd <= 0 || rd % 2 != 0 || double(rd) != c.head_dim * f)
      return prf_src->err("partial_rotary_factor",
                          fmt::format("head_dim {} x {} = {} is not a positive even integer", c.head_dim, f,
                                      c.head_dim * f));
  }
  if (rp && rr.has("rope_type")) {
    const json& v = rp->at("rope_type");
    if (!v.is_string() || v.get<std::string>() != "default")
      return rr.err("rope_type", "expected \"default\", got " + show(v));
  }
  return Status::ok();
}

Status check_divisible(const Reader& t, const std::string& key, int64_t a, int64_t b, const std::string& what) {
  if (b == 0 || a % b != 0) return t.err(key, fmt::format("{} = {} is not divisible by {}", what, a, b));
  return Status::ok();
}

constexpr int kMaxLayers = 1024;
constexpr int64_t kMaxWidth = int64_t(1) << 28;  // so that 2 x key width + value width fits an int

Status check_width(const Reader& t, const std::string& key, int64_t a, int64_t b) {
  if (a * b > kMaxWidth) return t.err(key, fmt::format("{} x {} = {} is wider than lily supports ({})", a, b, a * b, kMaxWidth));
  return Status::ok();
}

Status parse_text_config(const Reader& t, ModelConfig& c) {
  LILY_TRY(t.positive_int("hidden_size", c.hidden_size));
  LILY_TRY(t.positive_int("num_hidden_layers", c.num_hidden_layers));
  LILY_TRY(t.positive_int("vocab_size", c.vocab_size));
  LILY_TRY(t.positive_int("num_attention_heads", c.num_attention_heads));
  LILY_TRY(t.positive_int("num_key_value_heads", c.num_key_value_heads));
  LILY_TRY(t.positive_int("head_dim", c.head_dim));
  LILY_TRY(t.positive_int("linear_num_key_heads", c.linear_num_key_heads));
  LILY_TRY(t.positive_int("linear_num_value_heads", c.linear_num_value_heads));
  LILY_TRY(t.positive_int("linear_key_head_dim", c.linear_key_head_dim));
  LILY_TRY(t.positive_int("linear_value_head_dim", c.linear_value_head_dim));
  LILY_TRY(t.positive_int("linear_conv_kernel_dim", c.linear_conv_kernel_dim));
  LILY_TRY(t.positive_int("num_experts", c.num_experts));
  LILY_TRY(t.positive_int("num_experts_per_tok", c.num_experts_per_tok));
  LILY_TRY(t.positive_int("moe_intermediate_size", c.moe_intermediate_size));
  LILY_TRY(t.positive_int("shared_expert_intermediate_size", c.shared_expert_intermediate_size));
  LILY_TRY(t.optional_positive_int("max_position_embeddings", c.max_position_embeddings));
  LILY_TRY(t.optional_bool("norm_topk_prob", c.norm_topk_prob));
  LILY_TRY(t.optional_bool("attn_output_gate", c.attn_output_gate));
  LILY_TRY(t.optional_bool("tie_word_embeddings", c.tie_word_embeddings));
  if (t.has("rms_norm_eps")) {
    double eps = 0;
    LILY_TRY(t.positive_number("rms_norm_eps", eps));
    if (eps >= 1.0) return t.err("rms_norm_eps", fmt::format("expected a small positive number, got {}", eps));
    c.rms_norm_eps = float(eps);
  }
  if (c.tie_word_embeddings) return t.err("tie_word_embeddings", "true is not supported (lm_head must be its own weight)");
  if (t.has("hidden_act") && t.obj.at("hidden_act") != "silu")
    return t.err("hidden_act", "expected \"silu\", got " + show(t.obj.at("hidden_act")));
  if (t.has("mlp_only_layers") && !(t.obj.at("mlp_only_layers").is_array() && t.obj.at("mlp_only_layers").empty()))
    return t.err("mlp_only_layers", "expected [] (every layer is MoE), got " + show(t.obj.at("mlp_only_layers")));
  if (t.has("decoder_sparse_step") && t.obj.at("decoder_sparse_step") != 1)
    return t.err("decoder_sparse_step", "expected 1, got " + show(t.obj.at("decoder_sparse_step")));
  if (t.has("attention_bias") && t.obj.at("attention_bias") != false)
    return t.err("attention_bias", "expected false, got " + show(t.obj.at("attention_bias")));

  // Bounds that keep derived sizes in int and the tensor inventory small (the real model has 40
  // layers and widths of a few thousand); past them a hostile config overflowed or exhausted memory.
  if (c.num_hidden_layers > kMaxLayers)
    return t.err("num_hidden_layers", fmt::format("{} is more than lily supports ({})", c.num_hidden_layers, kMaxLayers));
  LILY_TRY(check_width(t, "num_attention_heads x head_dim", c.num_attention_heads, c.head_dim));
  LILY_TRY(check_width(t, "linear_num_key_heads x linear_key_head_dim", c.linear_num_key_heads, c.linear_key_head_dim));
  LILY_TRY(check_width(t, "linear_num_value_heads x linear_value_head_dim", c.linear_num_value_heads,
                       c.linear_value_head_dim));
  LILY_TRY(check_divisible(t, "num_attention_heads", c.num_attention_heads, c.num_key_value_heads,
                           "num_attention_heads (by num_key_value_heads)"));
  LILY_TRY(check_divisible(t, "linear_num_value_heads", c.linear_num_value_heads, c.linear_num_key_heads,
                           "linear_num_value_heads (by linear_num_key_heads)"));
  if (c.num_experts_per_tok > c.num_experts)
    return t.err("num_experts_per_tok",
                 fmt::format("{} exceeds num_experts = {}", c.num_experts_per_tok, c.num_experts));
  LILY_TRY(parse_layer_types(t, c));
  return parse_rope(t, c);
}

// Every quantized linear's input width must split into whole groups.
Status check_group_divisibility(const std::string& file, const ModelConfig& c) {
  struct In {
    const char* field;
    int64_t dim;
  };
  const In ins[] = {
      {"text_config.hidden_size", c.hidden_size},
      {"text_config.num_attention_heads x head_dim", int64_t(c.num_attention_heads) * c.head_dim},
      {"text_config.linear_num_value_heads x linear_value_head_dim", c.gdn_value_dim()},
      {"text_config.moe_intermediate_size", c.moe_intermediate_size},
      {"text_config.shared_expert_intermediate_size", c.shared_expert_intermediate_size},
  };
  for (const auto& in : ins) {
    if (in.dim % c.quant.group_size != 0)
      return errorf("{}: {}: {} is not divisible by quantization.group_size = {}", file, in.field, in.dim,
                    c.quant.group_size);
  }
  for (const auto& [path, q] : c.quant_overrides) {
    // An override's module reads hidden_size except the down-type projections. (A group wider
    // than a down projection's input once gave scales of width 0 and a division by zero in the
    // checkpoint check.)
    In in = ins[0];
    if (path.ends_with("shared_expert.down_proj")) in = ins[4];
    else if (path.ends_with("down_proj")) in = ins[3];
    else if (path.ends_with("o_proj")) in = ins[1];
    else if (path.ends_with("out_proj")) in = ins[2];
    if (in.dim % q.group_size != 0)
      return errorf("{}: quantization.{}.group_size: {} = {} is not divisible by {}", file, path, in.field, in.dim,
                    q.group_size);
  }
  return Status::ok();
}

}  // namespace

int ModelConfig::n_full_attention() const {
  int n = 0;
  for (bool f : is_full_attention) n += f;
  return n;
}

bool ModelConfig::is_exact_qwen36_35b_a3b() const {
  if (int(is_full_attention.size()) != num_hidden_layers) return false;
  for (int i = 0; i < num_hidden_layers; ++i)
    if (is_full_attention[size_t(i)] != (i % 4 == 3)) return false;
  for (const auto& [path, q] : quant_overrides)
    if (q.group_size != 64) return false;
  return hidden_size == 2048 && num_hidden_layers == 40 && vocab_size == 248320 && num_attention_heads == 16 &&
         num_key_value_heads == 2 && head_dim == 256 && linear_num_key_heads == 16 &&
         linear_num_value_heads == 32 && linear_key_head_dim == 128 && linear_value_head_dim == 128 &&
         linear_conv_kernel_dim == 4 && num_experts == 256 && num_experts_per_tok == 8 &&
         moe_intermediate_size == 512 && shared_expert_intermediate_size == 512 && attn_output_gate &&
         !tie_word_embeddings && partial_rotary_factor == 0.25f && quant.group_size == 64 && quant.bits == 4;
}

QuantSpec ModelConfig::quant_for(const std::string& module) const {
  auto it = quant_overrides.find(module);
  return it == quant_overrides.end() ? quant : it->second;
}

Result<ModelConfig> parse_config_json(const std::string& text, const std::string& file) {
  // config.json nests 3 levels; deep nesting would overflow the stack when a field is shown.
  constexpr size_t kMaxDepth = 32;
  if (json_nesting_depth(text) > kMaxDepth) return errorf("{}: nests deeper than {} levels", file, kMaxDepth);
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return errorf("{}: not valid JSON", file);
  if (!root.is_object()) return errorf("{}: expected a JSON object at the top level", file);
  Reader r{root, file, ""};
  if (!r.has("model_type")) return r.err("model_type", "missing (expected \"qwen3_5_moe\")");
  if (root.at("model_type") != "qwen3_5_moe")
    return r.err("model_type", "expected \"qwen3_5_moe\", got " + show(root.at("model_type")));

  ModelConfig c;
  const json* tc = nullptr;
  LILY_TRY(r.object("text_config", tc));
  Reader t{*tc, file, "text_config"};
  LILY_TRY(parse_text_config(t, c));
  LILY_TRY(r.optional_bool("tie_word_embeddings", c.tie_word_embeddings));
  if (c.tie_word_embeddings) return r.err("tie_word_embeddings", "true is not supported");

  if (r.has("eos_token_id")) {
    LILY_TRY(parse_eos(r, "eos_token_id", c.eos_token_ids));
  } else if (t.has("eos_token_id")) {
    LILY_TRY(parse_eos(t, "eos_token_id", c.eos_token_ids));
  } else {
    return r.err("eos_token_id", "missing (neither at the top level nor in text_config)");
  }
  for (int id : c.eos_token_ids)
    if (id >= c.vocab_size)
      return r.err("eos_token_id", fmt::format("token id {} is not below vocab_size = {}", id, c.vocab_size));

  LILY_TRY(parse_quantization(r, c));
  LILY_TRY(check_group_divisibility(file, c));
  return c;
}

Result<ModelConfig> load_config(const std::string& checkpoint_dir) {
  std::string path = checkpoint_dir + "/config.json";
  auto text = read_file(path);
  if (!text) return errorf("{} (is --model a checkpoint directory?)", text.message());
  return parse_config_json(*text, path);
}

}  // namespace lily
