// The strict checkpoint check: the inventory of tensors a qwen3_5_moe MLX checkpoint must hold
// for its config (names, shapes, dtypes, bit widths), and a Checkpoint that has passed it.
// Unknown tensors are errors except vision_tower.* and mtp.*, which are ignored.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace lily {

// One expected tensor. Quantized linears appear as three entries (.weight U32, .scales BF16,
// .biases BF16) with `bits` set on all three.
struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int bits = 0;               // 4 or 8 for quantized parts, 0 otherwise
  bool alt_dtype_bf16 = false;  // F32 tensor that may also be stored as BF16 (A_log)
};

// Full names, e.g. "language_model.model.layers.0.linear_attn.in_proj_qkv.weight".
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// The bit width a quantized module must have: 8 for the router (mlp.gate) and
// shared_expert_gate, 4 for everything else (mlx-lm's quant_predicate).
int expected_bits(const std::string& module);

class Checkpoint {
 public:
  // Opens config.json and the safetensors, and runs the full check. On failure the message
  // names the file, the tensor and the field.
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // A tensor that passed the check (aborts on a name the inventory does not have: a lily bug).
  const TensorView& tensor(const std::string& name) const;
  const SafeTensors& files() const { return *st_; }

 private:
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<SafeTensors> st_;
};

}  // namespace lily
