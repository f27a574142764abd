// Regression tests for what fuzzing config.json and the checkpoint check found (issue 8). Each
// input is the one committed under tests/fuzz/corpus/, so the fuzzers start from it too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/checkpoint.h"
#include "io/config.h"

namespace lily {
namespace {

std::string corpus_file(const std::string& rel) {
  std::string path = std::string(LILY_SOURCE_DIR) + "/tests/fuzz/corpus/" + rel;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing regression input " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_config_error(const std::string& rel, std::initializer_list<std::string> parts) {
  auto r = parse_config_json(corpus_file(rel), "config.json");
  ASSERT_FALSE(r.is_ok()) << rel << " was accepted";
  for (const auto& p : parts) EXPECT_NE(r.message().find(p), std::string::npos) << r.message() << "\nmissing: " << p;
}

// linear_num_value_heads x linear_value_head_dim = 2^40 overflowed int in gdn_value_dim().
TEST(HostileConfig, WidthProductsDoNotOverflow) {
  expect_config_error("config/regress-gdn-width-overflows-int.json",
                      {"text_config.linear_num_value_heads x linear_value_head_dim", "wider than lily supports"});
}

// 2^30 layers (derived from full_attention_interval) made the tensor inventory exhaust memory.
TEST(HostileConfig, LayerCountIsBounded) {
  expect_config_error("config/regress-billion-layers.json", {"text_config.num_hidden_layers", "1073741824"});
}

// A quantization override with a group wider than a down projection's input: the config was
// accepted, the inventory expected scales of width 0, and the checkpoint check divided by zero.
TEST(HostileConfig, OverrideGroupWiderThanDownProjInput) {
  std::string input = corpus_file("checkpoint/regress-down-proj-group-wider-than-input");
  const std::string sep = "\n#--lily-fuzz-part--#\n";  // tests/fuzz/checkpoint_fuzz.cpp's format
  size_t at = input.find(sep);
  ASSERT_NE(at, std::string::npos);
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("lily-hostile-config-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json", std::ios::binary) << input.substr(0, at);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << input.substr(at + sep.size());
  auto r = Checkpoint::open(dir.string());
  fs::remove_all(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("quantization.language_model.model.layers.0.mlp.switch_mlp.down_proj.group_size"),
            std::string::npos)
      << r.message();
  EXPECT_NE(r.message().find("text_config.moe_intermediate_size = 32 is not divisible by 64"), std::string::npos)
      << r.message();
}

}  // namespace
}  // namespace lily
