// Per-sequence state of the CPU backend: KV cache rows appended per position (so the cache
// grows with the sequence instead of preallocating max_seq), conv windows and fp32 DeltaNet state.
// The reference keeps K/V at activation precision (fp32 unless bf16 storage mode is on).
#pragma once
#include <span>
#include <vector>

#include "core/status.h"

#include "core/bf16.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily::cpu {

struct CpuSeqState final : SeqState {
  struct Layer {
    std::vector<float> k, v;     // attention: [n_tokens, n_kv_heads, head_dim], through store()
    std::vector<float> conv;     // GDN: [conv_dim, K-1] pre-conv inputs, oldest first
    std::vector<float> S;        // GDN: [n_v_heads, dk, dv] fp32
  };
  int n = 0;
  int cap = 0;
  std::vector<Layer> layers;

  int n_tokens() const override { return n; }
  int max_seq() const override { return cap; }
  size_t bytes() const override;
  std::unique_ptr<SeqState> clone() const override { return std::make_unique<CpuSeqState>(*this); }
  void reset() override;
};

// A fresh state for cfg with capacity max_seq (shared by the reference and the fast backend).
Result<std::unique_ptr<SeqState>> new_cpu_state(const ModelConfig& cfg, int max_seq);
// Checks a forward call's arguments and returns the CPU state, or an error naming the problem.
Result<CpuSeqState*> check_forward_args(const ModelConfig& cfg, SeqState& state, std::span<const int32_t> tokens,
                                        std::span<float> logits);

}  // namespace lily::cpu
