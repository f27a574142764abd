// Per-sequence state of the CPU backend: KV cache rows appended per position (so the cache
// grows with the sequence instead of preallocating max_seq), conv windows and fp32 DeltaNet state.
// The reference keeps K/V at activation precision (fp32 unless bf16 storage mode is on).
// reserve() grows the K/V caches explicitly (straight to `upto` when the engine gives it), so a
// state holds exactly cpu_state_memory().bytes_at(its K/V positions); a failed allocation is an
// error, not a crash. A StateMeter counts every state's bytes, and with a limit (a test hook) acts
// as a small device whose allocations fail.
#pragma once
#include <atomic>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"

#include "backend/backend.h"
#include "core/bf16.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily::cpu {

// The bytes held by one backend's states, against an optional limit (ModelOptions::cpu_state_limit_bytes).
struct StateMeter {
  size_t limit = 0;  // 0: none
  std::atomic<size_t> used{0};
  bool charge(size_t b);  // false, nothing charged, when it would pass the limit
  void refund(size_t b) { used -= b; }
};

struct CpuSeqState final : SeqState {
  struct Layer {
    bool attention = false;
    std::vector<float> k, v;     // attention: [n_tokens, n_kv_heads, head_dim], through store()
    std::vector<float> conv;     // GDN: [conv_dim, K-1] pre-conv inputs, oldest first
    std::vector<float> S;        // GDN: [n_v_heads, dk, dv] fp32
  };
  // What the fast backend keeps of a rewindable step (StepFeed::rewindable) to drop its tokens again
  // (Backend::rewind): it fed positions pos0 .. pos0 + len - 1; per DeltaNet layer, the state S and
  // conv window before them and each row's pre-conv input u [len, conv_dim] and the recurrent step's
  // inputs (q, k [len, key_dim], v [len, value_dim], decay, beta [len, n_v_heads]). pos0 < 0: nothing
  // to undo (any later step, reset and clone forget it). Held while the state speculates: a DeltaNet
  // state's size (the fixed part) plus ~33 KB per row and layer, outside bytes() and the meter.
  struct Undo {
    struct Layer {
      std::vector<float> S, conv, u, q, k, v, alpha, beta;
    };
    int pos0 = -1, len = 0;
    std::vector<Layer> layers;  // [num_hidden_layers]; attention layers' stay empty
  };
  int n = 0;
  int cap = 0;                   // max_seq
  Undo undo;
  size_t kv_row = 0;             // floats per position in each K or V cache (n_kv_heads * head_dim)
  std::vector<Layer> layers;
  std::shared_ptr<StateMeter> meter;
  size_t charged = 0;            // bytes charged to the meter

  CpuSeqState() = default;
  CpuSeqState(const CpuSeqState&) = delete;
  CpuSeqState& operator=(const CpuSeqState&) = delete;
  ~CpuSeqState() override {
    if (meter) meter->refund(charged);
  }
  int n_tokens() const override { return n; }
  int max_seq() const override { return cap; }
  size_t bytes() const override;
  // Positions every K/V cache has room for without reallocating.
  int kv_positions() const;
  Status reserve(int n_tokens, int upto = 0) override;
  std::unique_ptr<SeqState> clone() const override;  // holds the n positions in use; nullptr without memory
  void reset() override;
};

// What a CPU state takes: the conv windows and S of every DeltaNet layer (fixed), fp32 K and V of
// every attention layer per position; no initial K/V, no rounding.
StateMemory cpu_state_memory(const ModelConfig& cfg);
// A fresh state for cfg with capacity max_seq (shared by the reference and the fast backend),
// charged to `meter`.
Result<std::unique_ptr<SeqState>> new_cpu_state(const ModelConfig& cfg, int max_seq, std::shared_ptr<StateMeter> meter);
// Both CPU backends' device_memory(): the meter's limit and what is left of it, else the host's.
Result<DeviceMemory> cpu_device_memory(const StateMeter& meter);
// Checks a forward call's arguments and returns the CPU state, or an error naming the problem.
Result<CpuSeqState*> check_forward_args(const ModelConfig& cfg, SeqState& state, std::span<const int32_t> tokens,
                                        std::span<float> logits);

// What the two CPU backends (the reference and the fast one) share: the weights they run, and their
// states made, sized and counted as above, with one meter for all of a backend's states.
class CpuStatesBackend : public Backend {
 public:
  CpuStatesBackend(const ModelWeights& w, size_t state_limit) : w_(w), cfg_(w.cfg), meter_(std::make_shared<StateMeter>()) {
    meter_->limit = state_limit;
  }
  int vocab_size() const override { return cfg_.vocab_size; }
  Result<std::unique_ptr<SeqState>> new_state(int max_seq) override { return new_cpu_state(cfg_, max_seq, meter_); }
  StateMemory state_memory(int) const override { return cpu_state_memory(cfg_); }
  Result<DeviceMemory> device_memory() override { return cpu_device_memory(*meter_); }

 protected:
  const ModelWeights& w_;
  const ModelConfig& cfg_;
  std::shared_ptr<StateMeter> meter_;  // every state's bytes (and the test hook's limit)
};

}  // namespace lily::cpu
