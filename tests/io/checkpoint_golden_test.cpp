// The shared golden checkpoint (written by a third-party script with transformers' answers)
// must pass the full checkpoint check.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include "io/checkpoint.h"

namespace lily {
namespace {

TEST(CheckpointGolden, Seed7Passes) {
  const std::string dir = std::string(LILY_SHARED_DIR) + "/data/golden-small-seed7";
  struct stat sb {};
  if (::stat((dir + "/model.safetensors").c_str(), &sb) != 0) GTEST_SKIP() << "golden checkpoint absent: " << dir;
  auto r = Checkpoint::open(dir);
  ASSERT_TRUE(r.is_ok()) << r.message();
  const ModelConfig& c = (*r)->config();
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_FALSE(c.is_exact_qwen36_35b_a3b());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1021, 1020}));
  const TensorView& router = (*r)->tensor("language_model.model.layers.0.mlp.gate.weight");
  EXPECT_EQ(router.dtype, DType::U32);
  EXPECT_EQ(router.shape, (std::vector<int64_t>{16, 64}));  // 8-bit: 256 inputs / 4 per word
  EXPECT_EQ((*r)->tensor("language_model.model.layers.0.linear_attn.A_log").dtype, DType::F32);
  // Every expected tensor is there, nothing else.
  EXPECT_EQ(expected_tensors(c).size(), (*r)->files().tensors().size());
}

}  // namespace
}  // namespace lily
