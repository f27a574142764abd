// The backend interface: a backend owns its copy (or view) of the weights and the per-sequence
// state, and runs the forward pass. The CPU backend is the reference; the CUDA backend captures
// the decode step as a graph. Model (src/model/model.h) picks one at load.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/draw.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Result<std::unique_ptr<SeqState>> new_state(int max_seq) = 0;
  // What a state of limit max_seq takes (model.h's StateMemory): new_state, reserve and clone
  // allocate exactly by it, so SeqState::bytes() == state_memory(max_seq).bytes_at(its K/V positions).
  virtual StateMemory state_memory(int max_seq) const = 0;
  // Memory new states may still take, now. Default: the host's (MemTotal, MemAvailable from
  // /proc/meminfo). CUDA: cudaMemGetInfo.
  virtual Result<DeviceMemory> device_memory();
  // Appends tokens to state; logits (if non-empty, [vocab] fp32) of the last token.
  virtual Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) = 0;
  // One decode step for several sequences: row b feeds tokens[b] to *states[b] (distinct
  // states) and writes that token's logits to logits[b*vocab, (b+1)*vocab) (fp32). Each row's
  // result is what forward() gives for that sequence alone (batch invariance). Default: one
  // forward() per row; backends override it to read each weight once for all rows.
  virtual Status forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                               std::span<float> logits);
  // One decode step for rows as forward_batch, each row's next token drawn as spec[b] says
  // (model/draw.h) where the logits are, instead of returning them. Default: forward (one row) or
  // forward_batch into host logits, then draw_row on the host. CUDA draws on the device.
  virtual Status decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                             std::span<const DrawSpec> spec, std::span<Drawn> out);
  // One serving step (Model::step; the model has checked the feeds and reserved room for their
  // tokens). Default: each prompt segment (a feed of several tokens) by forward(), then the one-token
  // feeds as one decode_draw() (all of them drawn or silent) or forward_batch() step. CUDA runs the
  // segments and the decode rows as one step (batch.cu).
  virtual Status step(std::span<const StepFeed> feeds);
  // Readies the backend for a server decoding up to max_rows requests at once, with steps of up to
  // max_rows + step_tokens tokens, so that no request pays a first-use cost (CUDA: the batch scratch
  // sized once, the step graph of every batch size 2..max_rows captured, then a throwaway prefill,
  // decode and draw for the kernels' and the batch-1 graph's first use). Default: nothing to do.
  virtual Status prepare(int max_rows, int step_tokens) {
    (void)max_rows, (void)step_tokens;
    return Status::ok();
  }
  // Depth-2 pipelined decode of one sequence, where pipelined_draw() is true: launch_draw enqueues
  // one decode_draw step and returns at once, feeding `token`, or when token < 0 the id that the
  // previous launched step (for this state) drew, still where it was drawn; collect_draw waits for
  // the oldest launched step and returns its draw. At most two steps are in flight; the state
  // advances at launch. Defaults: not supported (an error).
  virtual bool pipelined_draw() const { return false; }
  virtual Status launch_draw(SeqState& state, int32_t token, const DrawSpec& spec);
  virtual Status collect_draw(Drawn& out);
  // Greedy decode loop: feeds `first`, then each step's argmax (lowest id on ties), for n_steps
  // steps; out[i] = argmax after step i, so the state consumes first, out[0..n-2]. If `avail_s`
  // is given it receives, per step, the seconds from the call until out[i] was on the host.
  // Default: forward + argmax per step. CUDA overrides it with the depth-2 graph pipeline.
  virtual Status decode_greedy(SeqState& state, int32_t first, int n_steps, std::vector<int32_t>& out,
                               std::vector<double>* avail_s = nullptr);
  // Device-to-device copy bandwidth measured now (GB/s, read + write), 0 where not meaningful.
  virtual double copy_bandwidth_gbps() { return 0.0; }
  // Vocabulary size of the model (the logits' length); 0 if the backend does not say.
  virtual int vocab_size() const { return 0; }
  // One line naming the hardware the backend runs on.
  virtual std::string hardware() const { return "cpu"; }
};

// The host's memory (MemTotal, MemAvailable of /proc/meminfo).
Result<DeviceMemory> host_memory();

// weights must outlive the backend. state_limit_bytes (a test hook, ModelOptions::cpu_state_limit_bytes):
// the states' memory limit, as a small device's; 0: none.
Result<std::unique_ptr<Backend>> make_cpu_backend(const ModelWeights& weights, size_t state_limit_bytes = 0);
// Defined by the CUDA backend when it is compiled in; otherwise returns a clear error.
Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose);

}  // namespace lily
