// The checkpoint check: builds the tensor inventory a config implies (model-spec §1.2) and
// verifies the safetensors against it — presence, dtype, shape and, for quantized linears, the
// bit width read from the packed width. Anything unknown (besides vision/MTP) is an error.
#include "io/checkpoint.h"

#include <set>

#include <spdlog/spdlog.h>

namespace lily {

namespace {

const std::string kP = "language_model.model.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool ignored(const std::string& name) {
  return name.rfind("vision_tower.", 0) == 0 || name.rfind("mtp.", 0) == 0 ||
         name.rfind("language_model.mtp.", 0) == 0 || name.rfind("model.visual", 0) == 0;
}

struct Builder {
  const ModelConfig& cfg;
  std::vector<ExpectedTensor> out;

  void plain(const std::string& name, DType dt, std::vector<int64_t> shape) {
    out.push_back({name, dt, std::move(shape), 0, false});
  }
  // A quantized linear `module` [lead..., out, in]: .weight U32 [..., out, in*bits/32],
  // .scales/.biases BF16 [..., out, in/group].
  void quant(const std::string& module, std::vector<int64_t> lead, int64_t n_out, int64_t n_in) {
    int bits = expected_bits(module);
    int group = cfg.quant_for(module).group_size;
    auto shape = [&](int64_t last) {
      std::vector<int64_t> s = lead;
      s.push_back(n_out);
      s.push_back(last);
      return s;
    };
    out.push_back({module + ".weight", DType::U32, shape(n_in * bits / 32), bits, false});
    out.push_back({module + ".scales", DType::BF16, shape(n_in / group), bits, false});
    out.push_back({module + ".biases", DType::BF16, shape(n_in / group), bits, false});
  }
};

// The module path ("...in_proj_qkv") of a quantized part, "" when `name` is not one.
std::string quant_module(const ExpectedTensor& e) {
  if (e.bits == 0) return "";
  for (const char* suf : {".weight", ".scales", ".biases"})
    if (ends_with(e.name, suf)) return e.name.substr(0, e.name.size() - std::string(suf).size());
  return "";
}

}  // namespace

int expected_bits(const std::string& module) {
  return (ends_with(module, "mlp.gate") || ends_with(module, "shared_expert_gate")) ? 8 : 4;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  Builder b{c, {}};
  const int64_t H = c.hidden_size, V = c.vocab_size;
  b.quant(kP + "embed_tokens", {}, V, H);
  b.quant("language_model.lm_head", {}, V, H);
  b.plain(kP + "norm.weight", DType::BF16, {H});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = kP + "layers." + std::to_string(i) + ".";
    b.plain(L + "input_layernorm.weight", DType::BF16, {H});
    b.plain(L + "post_attention_layernorm.weight", DType::BF16, {H});
    if (c.is_full_attention[size_t(i)]) {
      const std::string A = L + "self_attn.";
      const int64_t q_out = int64_t(c.num_attention_heads) * c.head_dim * (c.attn_output_gate ? 2 : 1);
      const int64_t kv_out = int64_t(c.num_key_value_heads) * c.head_dim;
      b.quant(A + "q_proj", {}, q_out, H);
      b.quant(A + "k_proj", {}, kv_out, H);
      b.quant(A + "v_proj", {}, kv_out, H);
      b.quant(A + "o_proj", {}, H, int64_t(c.num_attention_heads) * c.head_dim);
      b.plain(A + "q_norm.weight", DType::BF16, {c.head_dim});
      b.plain(A + "k_norm.weight", DType::BF16, {c.head_dim});
    } else {
      const std::string G = L + "linear_attn.";
      const int64_t nv = c.linear_num_value_heads;
      b.quant(G + "in_proj_qkv", {}, c.gdn_conv_dim(), H);
      b.quant(G + "in_proj_z", {}, c.gdn_value_dim(), H);
      b.quant(G + "in_proj_b", {}, nv, H);
      b.quant(G + "in_proj_a", {}, nv, H);
      b.plain(G + "conv1d.weight", DType::BF16, {c.gdn_conv_dim(), c.linear_conv_kernel_dim, 1});
      b.out.push_back({G + "A_log", DType::F32, {nv}, 0, /*alt_dtype_bf16=*/true});
      b.plain(G + "dt_bias", DType::BF16, {nv});
      b.plain(G + "norm.weight", DType::BF16, {c.linear_value_head_dim});
      b.quant(G + "out_proj", {}, H, c.gdn_value_dim());
    }
    const std::string M = L + "mlp.";
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
    b.quant(M + "gate", {}, E, H);
    b.quant(M + "switch_mlp.gate_proj", {E}, I, H);
    b.quant(M + "switch_mlp.up_proj", {E}, I, H);
    b.quant(M + "switch_mlp.down_proj", {E}, H, I);
    b.quant(M + "shared_expert.gate_proj", {}, S, H);
    b.quant(M + "shared_expert.up_proj", {}, S, H);
    b.quant(M + "shared_expert.down_proj", {}, H, S);
    b.quant(M + "shared_expert_gate", {}, 1, H);
  }
  return b.out;
}

namespace {

// Checks a quantized module's packed width: bits = 32*packed_cols/in_features must be 4 or 8,
// match expected_bits and the config's override, and the scales must hold in/group groups.
Status check_quant_bits(const ModelConfig& cfg, const std::string& module, const ExpectedTensor& w_exp,
                        const TensorView& w, const TensorView* scales, const std::string& file) {
  const int group = cfg.quant_for(module).group_size;
  const int64_t n_groups_exp = w_exp.shape.back() * 32 / w_exp.bits / group;  // = in / group
  const int64_t n_in = n_groups_exp * group;
  const int64_t packed = w.shape.back();
  if (packed * 32 % n_in != 0)
    return errorf("{}: tensor '{}.weight': shape: packed width {} is not a whole number of bits per weight for {} "
                  "input features",
                  file, module, packed, n_in);
  const int64_t bits = packed * 32 / n_in;
  if (bits != 4 && bits != 8)
    return errorf("{}: tensor '{}.weight': bits: packed width {} for {} input features means {} bits; only 4 and 8 "
                  "are supported",
                  file, module, packed, n_in, bits);
  if (bits != w_exp.bits)
    return errorf("{}: tensor '{}.weight': bits: {}-bit, expected {}-bit for this module", file, module, bits,
                  w_exp.bits);
  auto ov = cfg.quant_overrides.find(module);
  if (ov != cfg.quant_overrides.end() && ov->second.bits != bits)
    return errorf("{}: tensor '{}.weight': bits: {}-bit, but config.json quantization.{} says {}-bit", file, module,
                  bits, module, ov->second.bits);
  if (scales && !scales->shape.empty() && scales->shape.back() != n_groups_exp)
    return errorf("{}: tensor '{}.scales': shape: {} groups per row, expected {} ({} inputs / group_size {})", file,
                  module, scales->shape.back(), n_groups_exp, n_in, group);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  auto ck = std::unique_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  LILY_ASSIGN_OR_RETURN(ck->config_, load_config(dir));
  LILY_ASSIGN_OR_RETURN(ck->st_, SafeTensors::open_dir(dir));
  const ModelConfig& cfg = ck->config_;
  const SafeTensors& st = *ck->st_;

  // Where a missing tensor should have been: the index when sharded, else the one file.
  std::string where = dir + "/model.safetensors";
  if (!st.tensors().empty() && st.tensors().begin()->second.file != where) where = dir + "/model.safetensors.index.json";

  std::vector<ExpectedTensor> exp = expected_tensors(cfg);
  std::set<std::string> names;
  for (const auto& e : exp) {
    names.insert(e.name);
    const TensorView* t = st.find(e.name);
    if (!t)
      return errorf("{}: tensor '{}' is missing (expected {} {})", where, e.name, dtype_name(e.dtype),
                    shape_str(e.shape));
    bool dtype_ok = t->dtype == e.dtype || (e.alt_dtype_bf16 && t->dtype == DType::BF16);
    if (!dtype_ok)
      return errorf("{}: tensor '{}': dtype: {}, expected {}{}", t->file, e.name, dtype_name(t->dtype),
                    dtype_name(e.dtype), e.alt_dtype_bf16 ? " or BF16" : "");
    std::string module = quant_module(e);
    bool lead_ok = t->shape.size() == e.shape.size() &&
                   std::equal(e.shape.begin(), e.shape.end() - 1, t->shape.begin());
    if (!module.empty() && ends_with(e.name, ".weight") && lead_ok)
      LILY_TRY(check_quant_bits(cfg, module, e, *t, st.find(module + ".scales"), t->file));
    if (t->shape != e.shape)
      return errorf("{}: tensor '{}': shape: {}, expected {}", t->file, e.name, shape_str(t->shape),
                    shape_str(e.shape));
  }
  for (const auto& [name, t] : st.tensors()) {
    if (names.count(name) || ignored(name)) continue;
    return errorf("{}: tensor '{}': unknown tensor (not part of a qwen3_5_moe text model with this config)", t.file,
                  name);
  }
  const size_t bytes = st.total_bytes();
  if (cfg.is_exact_qwen36_35b_a3b()) {
    spdlog::info("checkpoint {}: exact Qwen3.6-35B-A3B shape, {} tensors, {:.2f} GB", dir, exp.size(), bytes / 1e9);
  } else {
    spdlog::info(
        "checkpoint {}: qwen3_5_moe family but NOT the exact Qwen3.6-35B-A3B shape (hidden {}, {} layers, {} experts "
        "top-{}, vocab {}), {} tensors, {:.2f} GB",
        dir, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok, cfg.vocab_size,
        exp.size(), bytes / 1e9);
  }
  return ck;
}

const TensorView& Checkpoint::tensor(const std::string& name) const {
  const TensorView* t = st_->find(name);
  if (!t) std::fprintf(stderr, "lily bug: Checkpoint::tensor('%s'): no such tensor\n", name.c_str());
  LILY_CHECK(t != nullptr);
  return *t;
}

}  // namespace lily
