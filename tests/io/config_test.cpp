// config.json parsing: a valid MLX wrapper parses to the right dimensions, and every kind of bad
// field gives an error naming the file and the field (never a crash).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/config.h"

namespace lily {
namespace {

using json = nlohmann::json;

// The real Qwen3.6-35B-A3B config (model-spec §1.1), written out by hand from the spec.
json real_config() {
  json layer_types = json::array();
  for (int i = 0; i < 40; ++i) layer_types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  json tc = {{"model_type", "qwen3_5_moe_text"},
             {"hidden_size", 2048},
             {"num_hidden_layers", 40},
             {"vocab_size", 248320},
             {"num_attention_heads", 16},
             {"num_key_value_heads", 2},
             {"head_dim", 256},
             {"attn_output_gate", true},
             {"linear_num_key_heads", 16},
             {"linear_num_value_heads", 32},
             {"linear_key_head_dim", 128},
             {"linear_value_head_dim", 128},
             {"linear_conv_kernel_dim", 4},
             {"num_experts", 256},
             {"num_experts_per_tok", 8},
             {"moe_intermediate_size", 512},
             {"shared_expert_intermediate_size", 512},
             {"norm_topk_prob", true},
             {"rms_norm_eps", 1e-6},
             {"max_position_embeddings", 262144},
             {"tie_word_embeddings", false},
             {"eos_token_id", 248044},
             {"layer_types", layer_types},
             {"rope_parameters",
              {{"rope_type", "default"},
               {"rope_theta", 1e7},
               {"partial_rotary_factor", 0.25},
               {"mrope_section", {11, 11, 10}},
               {"mrope_interleaved", true}}}};
  json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
  for (int i = 0; i < 40; ++i) {
    q["language_model.model.layers." + std::to_string(i) + ".mlp.gate"] = {{"group_size", 64}, {"bits", 8}};
    q["language_model.model.layers." + std::to_string(i) + ".mlp.shared_expert_gate"] = {{"group_size", 64},
                                                                                        {"bits", 8}};
  }
  return {{"model_type", "qwen3_5_moe"},
          {"eos_token_id", {248046, 248044}},
          {"quantization", q},
          {"quantization_config", q},
          {"text_config", tc},
          {"vision_config", {{"depth", 27}}}};
}

Result<ModelConfig> parse(const json& j) { return parse_config_json(j.dump(), "/ck/config.json"); }

// Expects an error whose message contains every one of `parts`.
void expect_error(const json& j, std::initializer_list<std::string> parts) {
  auto r = parse(j);
  ASSERT_FALSE(r.is_ok()) << "expected an error for " << j.dump().substr(0, 200);
  for (const auto& p : parts) EXPECT_NE(r.message().find(p), std::string::npos) << "message: " << r.message() << "\nmissing: " << p;
  EXPECT_EQ(r.message().rfind("/ck/config.json: ", 0), 0u) << r.message();
}

// Expects the error of expect_error for real_config() with the field at `pointer` (a JSON pointer:
// "/text_config/head_dim") set to `value`.
void expect_error_at(const std::string& pointer, const json& value, std::initializer_list<std::string> parts) {
  json j = real_config();
  j[json::json_pointer(pointer)] = value;
  expect_error(j, parts);
}

TEST(Config, RealConfigParses) {
  auto r = parse(real_config());
  ASSERT_TRUE(r.is_ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.n_full_attention(), 10);
  EXPECT_TRUE(c.is_full_attention[3]);
  EXPECT_FALSE(c.is_full_attention[4]);
  EXPECT_EQ(c.gdn_conv_dim(), 8192);
  EXPECT_EQ(c.gdn_value_dim(), 4096);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248046, 248044}));  // top level wins
  EXPECT_EQ(c.quant.bits, 4);
  EXPECT_EQ(c.quant.group_size, 64);
  EXPECT_EQ(c.quant_for("language_model.model.layers.5.mlp.gate").bits, 8);
  EXPECT_EQ(c.quant_for("language_model.model.layers.5.mlp.shared_expert_gate").bits, 8);
  EXPECT_EQ(c.quant_for("language_model.model.layers.5.mlp.switch_mlp.up_proj").bits, 4);
  EXPECT_TRUE(c.is_exact_qwen36_35b_a3b());
}

TEST(Config, NotExactWhenADimensionDiffers) {
  json j = real_config();
  j["text_config"]["num_experts"] = 128;
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_FALSE(r->is_exact_qwen36_35b_a3b());
}

TEST(Config, EosFallsBackToTextConfigScalar) {
  json j = real_config();
  j.erase("eos_token_id");
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int>{248044}));
}

TEST(Config, LayerTypesDerivedFromInterval) {
  json j = real_config();
  j["text_config"].erase("layer_types");
  j["text_config"]["full_attention_interval"] = 4;
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->n_full_attention(), 10);
  EXPECT_TRUE(r->is_full_attention[39]);
  EXPECT_FALSE(r->is_full_attention[0]);
}

TEST(Config, LegacyTopLevelRopeTheta) {
  json j = real_config();
  j["text_config"].erase("rope_parameters");
  j["text_config"]["rope_theta"] = 5e6;
  j["text_config"]["partial_rotary_factor"] = 0.5;
  auto r = parse(j);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_DOUBLE_EQ(r->rope_theta, 5e6);
  EXPECT_EQ(r->rotary_dim(), 128);
}

TEST(Config, MalformedJson) { expect_error(json(), {"expected a JSON object"}); }

TEST(Config, NotJsonAtAll) {
  auto r = parse_config_json("{\"model_type\": ", "/ck/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("/ck/config.json: not valid JSON"), std::string::npos) << r.message();
}

TEST(Config, WrongModelType) {
  json j = real_config();
  j["model_type"] = "llama";
  expect_error(j, {"model_type", "\"qwen3_5_moe\"", "\"llama\""});
  j.erase("model_type");
  expect_error(j, {"model_type", "missing"});
}

TEST(Config, MissingTextConfig) {
  json j = real_config();
  j.erase("text_config");
  expect_error(j, {"text_config", "missing"});
  j["text_config"] = 3;
  expect_error(j, {"text_config", "expected an object"});
}

TEST(Config, EachIntegerFieldIsChecked) {
  for (const char* f : {"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
                        "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                        "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                        "moe_intermediate_size", "shared_expert_intermediate_size"}) {
    SCOPED_TRACE(f);
    json j = real_config();
    j["text_config"][f] = "abc";
    expect_error(j, {std::string("text_config.") + f + ": expected a positive integer, got \"abc\""});
    j["text_config"][f] = 0;
    expect_error(j, {std::string("text_config.") + f, "positive integer", "got 0"});
    j["text_config"][f] = -4;
    expect_error(j, {std::string("text_config.") + f, "got -4"});
    j["text_config"][f] = 2.5;
    expect_error(j, {std::string("text_config.") + f, "got 2.5"});
    j["text_config"].erase(f);
    expect_error(j, {std::string("text_config.") + f, "missing"});
  }
}

TEST(Config, BoolFields) {
  for (const char* f : {"norm_topk_prob", "attn_output_gate", "tie_word_embeddings"})
    expect_error_at(std::string("/text_config/") + f, "yes", {std::string("text_config.") + f, "expected true or false"});
  expect_error_at("/text_config/tie_word_embeddings", true, {"text_config.tie_word_embeddings", "not supported"});
}

TEST(Config, HeadDivisibility) {
  expect_error_at("/text_config/num_key_value_heads", 3, {"text_config.num_attention_heads", "not divisible"});
  expect_error_at("/text_config/linear_num_key_heads", 5, {"text_config.linear_num_value_heads", "not divisible"});
}

TEST(Config, TopKAboveExperts) {
  expect_error_at("/text_config/num_experts_per_tok", 300, {"text_config.num_experts_per_tok", "exceeds num_experts"});
}

TEST(Config, InDimsDivisibleByGroup) {
  expect_error_at("/text_config/moe_intermediate_size", 500,
                  {"moe_intermediate_size", "not divisible by quantization.group_size"});
  expect_error_at("/text_config/hidden_size", 2000, {"hidden_size", "not divisible"});
}

TEST(Config, LayerTypes) {
  json j = real_config();
  j["text_config"]["layer_types"].erase(0);
  expect_error(j, {"text_config.layer_types", "39 entries", "num_hidden_layers = 40"});
  expect_error_at("/text_config/layer_types/5", "sliding_attention",
                  {"text_config.layer_types[5]", "\"sliding_attention\""});
  expect_error_at("/text_config/layer_types", "all", {"text_config.layer_types", "expected a list"});
  j = real_config();
  j["text_config"].erase("layer_types");
  expect_error(j, {"text_config.layer_types", "missing"});
}

TEST(Config, Rope) {
  expect_error_at("/text_config/rope_parameters/rope_theta", "big",
                  {"text_config.rope_parameters.rope_theta", "positive number"});
  json j = real_config();
  j["text_config"]["rope_parameters"].erase("rope_theta");
  expect_error(j, {"rope_theta", "missing"});
  expect_error_at("/text_config/rope_parameters/partial_rotary_factor", 0.3,  // 256*0.3 = 76.8
                  {"text_config.rope_parameters.partial_rotary_factor", "positive even integer"});
  expect_error_at("/text_config/rope_parameters/partial_rotary_factor", 1.5, {"partial_rotary_factor", "(0, 1]"});
  expect_error_at("/text_config/rope_parameters/rope_type", "yarn", {"rope_parameters.rope_type", "\"yarn\""});
}

TEST(Config, Eos) {
  expect_error_at("/eos_token_id", "x", {"eos_token_id", "token id"});
  expect_error_at("/eos_token_id", json::array(), {"eos_token_id", "non-empty"});
  expect_error_at("/eos_token_id", {1, 300000}, {"eos_token_id", "300000", "vocab_size"});
  json j = real_config();
  j.erase("eos_token_id");
  j["text_config"].erase("eos_token_id");
  expect_error(j, {"eos_token_id", "missing"});
}

TEST(Config, Quantization) {
  json j = real_config();
  j.erase("quantization");
  expect_error(j, {"quantization", "missing"});
  expect_error_at("/quantization/bits", 3, {"quantization.bits", "4 or 8", "got 3"});
  expect_error_at("/quantization/group_size", 48, {"quantization.group_size", "got 48"});
  expect_error_at("/quantization/mode", "mxfp4", {"quantization.mode", "affine"});
  const std::string gate = "language_model.model.layers.0.mlp.gate";
  expect_error_at("/quantization/" + gate, {{"group_size", 64}, {"bits", "eight"}},
                  {"quantization." + gate + ".bits", "\"eight\""});
  expect_error_at("/quantization/" + gate, 8, {"quantization." + gate, "expected an object"});
}

TEST(Config, UnsupportedFamilyOptions) {
  expect_error_at("/text_config/mlp_only_layers", {0}, {"text_config.mlp_only_layers"});
  expect_error_at("/text_config/hidden_act", "gelu", {"text_config.hidden_act", "\"gelu\""});
}

TEST(Config, LoadConfigMissingFile) {
  auto r = load_config("/nonexistent-dir-for-lily-test");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("/nonexistent-dir-for-lily-test/config.json: cannot open"), std::string::npos)
      << r.message();
}

}  // namespace
}  // namespace lily
