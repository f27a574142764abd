// The backend interface: a backend owns its copy (or view) of the weights and the per-sequence
// state, and runs the forward pass. The CPU backend is the reference; the CUDA backend captures
// the decode step as a graph. Model (src/model/model.h) picks one at load.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/draw.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily {

// Statuses of steps that ran at launch, kept until waited for (the default launch/wait; CUDA's steps
// that do not pipeline, and pipelined ones collected by a later launch). It keeps the last four: two
// pipelined steps collected by a later step, that step, and one more.
class RanSteps {
 public:
  void add(StepTicket t, Status st) {
    v_.emplace_back(t, std::move(st));
    if (v_.size() > 4) v_.erase(v_.begin());
  }
  // Step t's status, forgetting it and every step before it; nullopt when t is not kept.
  std::optional<Status> take(StepTicket t) {
    for (size_t i = 0; i < v_.size(); ++i)
      if (v_[i].first == t) {
        Status st = std::move(v_[i].second);
        v_.erase(v_.begin(), v_.begin() + std::ptrdiff_t(i) + 1);
        return st;
      }
    return std::nullopt;
  }

 private:
  std::vector<std::pair<StepTicket, Status>> v_;
};

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
  // The one way to run the model. A serving step over `feeds` (model.h StepFeed: decode rows and
  // prompt segments of distinct states, each with its output: none, logits, or a draw), which
  // Model::launch has checked and given room for their tokens. Every state consumes its tokens at
  // launch; the outputs (logits, drawn) are in place once wait(ticket) returns, which also waits
  // for every step launched before it. A backend that pipelines (pipelines(): CUDA) returns at once
  // for a lone one-token feed drawn on the device, and takes kDrawnToken as that feed's token: the
  // id the previous launched step drew for the same state, still where it was drawn. At most two
  // steps are in flight. Default: the step runs now (step()); wait() returns its status.
  virtual Result<StepTicket> launch(std::span<const StepFeed> feeds);
  virtual Status wait(StepTicket ticket);
  virtual bool pipelines() const { return false; }
  // Verify feeds (StepFeed::outputs > 1, rewindable; Model::launch refuses them elsewhere) and
  // rewind (Model::rewind, which has checked 0 <= n_tokens < state.n_tokens()). Default: neither.
  virtual bool speculates() const { return false; }
  // What a verify step costs, as a fraction of a one-token decode step's time: spec_step_cost() once
  // (a step that verifies any drafts), plus spec_row_cost() for each draft row (the engine verifies only
  // drafts that pay for that). Default: 1 a row, nothing fixed.
  virtual double spec_row_cost() const { return 1.0; }
  virtual double spec_step_cost() const { return 0.0; }
  // The most verify feeds one step may hold (the engine verifies drafts on at most that many rows a
  // step). Default: no limit.
  virtual int spec_max_feeds() const { return 1 << 30; }
  virtual Status rewind(SeqState& state, int n_tokens);
  // A server's default prompt segment, in tokens (EngineOptions::prefill_chunk): a segment's time
  // bounds the running streams' inter-token latency, its length the prefill rate. CPU: 512 (a
  // 512-token segment of the full-size model takes seconds already).
  virtual int default_prefill_chunk() const { return 512; }
  // A server's default EngineOptions::long_step_tokens: prompt tokens of long segments one step may carry.
  // 0 (here, CPU): a long segment has a step of its own (the CPU prefills each segment alone anyway).
  virtual int default_long_step_tokens() const { return 0; }
  // Readies the backend for a server decoding up to max_rows requests at once, with steps of up to
  // max_rows + step_tokens tokens, so that no request pays a first-use cost (CUDA: the batch scratch
  // sized once, the step graph of every batch size 2..max_rows captured, then a throwaway prefill,
  // decode and draw for the kernels' and the batch-1 graph's first use). Default: nothing to do.
  virtual Status prepare(int max_rows, int step_tokens) {
    (void)max_rows, (void)step_tokens;
    return Status::ok();
  }
  // A per-op table of one decode step of `state` on stderr (lily bench --profile); the state
  // consumes one token. Default: not supported (an error).
  virtual Status profile_decode(SeqState& state);
  // Device-to-device copy bandwidth measured now (GB/s, read + write), 0 where not meaningful.
  virtual double copy_bandwidth_gbps() { return 0.0; }
  // Vocabulary size of the model (the logits' length); 0 if the backend does not say.
  virtual int vocab_size() const { return 0; }
  // One line naming the hardware the backend runs on.
  virtual std::string hardware() const { return "cpu"; }

 protected:
  // What the default launch() runs, each backend's own parts. forward: appends tokens to state;
  // logits (if non-empty, [vocab] fp32) of the last token.
  virtual Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) = 0;
  // One decode step for several sequences: row b feeds tokens[b] to *states[b] (distinct states)
  // and writes that token's logits to logits[b*vocab, (b+1)*vocab) (fp32). Each row's result is
  // what forward() gives for that sequence alone (batch invariance). Default: one forward() per
  // row; backends override it to read each weight once for all rows.
  virtual Status forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                               std::span<float> logits);
  // One decode step for rows as forward_batch, each row's next token drawn as spec[b] says
  // (model/draw.h) where the logits are. Default: forward (one row) or forward_batch into host
  // logits, then draw_row on the host. CUDA draws on the device.
  virtual Status decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                             std::span<const DrawSpec> spec, std::span<Drawn> out);
  // One serving step, run now. Default: each prompt segment (a feed of several tokens) by
  // forward(), then the one-token feeds as one decode_draw() (all of them drawn or silent) or
  // forward_batch() step. CUDA runs the segments and the decode rows as one step (cuda/step/step_mixed.cu).
  virtual Status step(std::span<const StepFeed> feeds);
  // A prompt segment of step(): forward(), then the last token's logits copied or drawn on the host.
  Status step_segment(const StepFeed& f);

 private:
  // The default launch()/wait(): steps run at launch, their statuses kept until waited for.
  StepTicket launched_ = 0;
  RanSteps ran_;
};

// The host's memory (MemTotal, MemAvailable of /proc/meminfo).
Result<DeviceMemory> host_memory();

// A row drawn on the host (draw_row): its logits [vocab] fp32, its spec, where the token goes.
struct HostDraw {
  const float* logits;
  const DrawSpec* spec;
  Drawn* out;
};
// Every row's draw, rows in parallel on the global pool (each reads its own 1 MB row).
void draw_on_host(std::span<const HostDraw> rows, size_t vocab);

// weights must outlive the backend. state_limit_bytes (a test hook, ModelOptions::cpu_state_limit_bytes):
// the states' memory limit, as a small device's; 0: none.
Result<std::unique_ptr<Backend>> make_cpu_backend(const ModelWeights& weights, size_t state_limit_bytes = 0);
// Defined by the CUDA backend when it is compiled in; otherwise returns a clear error.
Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose);

}  // namespace lily
