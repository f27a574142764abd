// Weight views of one qwen3_5_moe checkpoint: pointers into the mmap'd safetensors (zero
// copy), grouped per layer. A QWeight is one MLX affine-quantized linear.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/status.h"
#include "io/config.h"

namespace lily {

class Checkpoint;

// y = W x with W [rows, cols] stored as MLX affine codes: element (r, c) is
// scale[r][c/gs] * q(r, c) + bias[r][c/gs], q packed low bits first along c in u32 words.
struct QWeight {
  const uint32_t* codes = nullptr;  // [rows, cols*bits/32] u32
  const bf16* scales = nullptr;     // [rows, cols/group_size] bf16
  const bf16* biases = nullptr;     // [rows, cols/group_size] bf16
  int rows = 0, cols = 0, bits = 4, group_size = 64;

  int words_per_row() const { return cols * bits / 32; }
  int groups_per_row() const { return cols / group_size; }
  // Rows [r0, r0+n) as their own weight (an expert of a stacked tensor, or a part of a fused one).
  QWeight rows_slice(int r0, int n) const;
  // Code q(r, c) in [0, 2^bits).
  uint32_t code(int r, int c) const {
    int per_word = 32 / bits;
    uint32_t w = codes[size_t(r) * words_per_row() + c / per_word];
    return (w >> ((c % per_word) * bits)) & ((1u << bits) - 1);
  }
  size_t nbytes() const { return size_t(rows) * (words_per_row() * 4 + groups_per_row() * 4); }
};

struct GdnWeights {
  QWeight in_proj_qkv;  // [conv_dim, H]: q | k | v channels
  QWeight in_proj_z;    // [value_dim, H]
  QWeight in_proj_b;    // [n_v_heads, H]
  QWeight in_proj_a;    // [n_v_heads, H]
  QWeight out_proj;     // [H, value_dim]
  const bf16* conv1d = nullptr;  // [conv_dim, K, 1] bf16; tap K-1 multiplies the newest input
  std::vector<float> A_log;      // [n_v_heads] (F32 or BF16 on disk)
  const bf16* dt_bias = nullptr; // [n_v_heads]
  const bf16* norm = nullptr;    // [value_head_dim] plain gain (not 1+w)
};

struct AttnWeights {
  QWeight q_proj;  // [n_heads * 2 * head_dim, H]: per head [q | gate]
  QWeight k_proj;  // [n_kv_heads * head_dim, H]
  QWeight v_proj;  // [n_kv_heads * head_dim, H]
  QWeight o_proj;  // [H, n_heads * head_dim]
  const bf16* q_norm = nullptr;  // [head_dim] stored gain 1+w
  const bf16* k_norm = nullptr;  // [head_dim]
};

struct MoeWeights {
  QWeight router;        // [E, H] 8-bit
  QWeight experts_gate;  // [E * I, H] stacked; expert e = rows [e*I, (e+1)*I)
  QWeight experts_up;    // [E * I, H]
  QWeight experts_down;  // [E * H, I]
  QWeight shared_gate;   // [Is, H]
  QWeight shared_up;     // [Is, H]
  QWeight shared_down;   // [H, Is]
  QWeight shared_expert_gate;  // [1, H] 8-bit
};

struct LayerWeights {
  bool full_attention = false;
  const bf16* input_norm = nullptr;  // [H] stored gain 1+w
  const bf16* post_norm = nullptr;   // [H]
  GdnWeights gdn;    // when !full_attention
  AttnWeights attn;  // when full_attention
  MoeWeights moe;
};

struct ModelWeights {
  ModelConfig cfg;
  QWeight embed;    // [vocab, H]
  QWeight lm_head;  // [vocab, H]
  const bf16* final_norm = nullptr;  // [H]
  std::vector<LayerWeights> layers;

  // Builds the views from a checkpoint that passed the strict check.
  static Result<ModelWeights> from_checkpoint(const Checkpoint& ckpt);
};

}  // namespace lily
