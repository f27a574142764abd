// The one model: Qwen3.6-35B-A3B (qwen3_5_moe), forward pass over a backend.
// Model::forward appends tokens to a sequence's state (prefill when several, decode when one)
// and returns the fp32 logits of the last token. Engine code uses only this header.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/draw.h"
#include "io/config.h"

namespace lily {

class Checkpoint;
class Backend;

// What one sequence state takes in memory on a backend (Model::state_memory), as arithmetic: the
// engine's memory plan and its admission count by it, the backends allocate by it. A state is a
// fixed part (DeltaNet states, conv windows, per-state control; one allocation) and K/V caches for
// some number of positions (one allocation), grown on demand up to max_seq (SeqState::reserve).
struct StateMemory {
  size_t fixed = 0;           // bytes of the fixed part
  size_t kv_base = 0;         // bytes of the K/V allocation beyond per_position x positions (padding)
  size_t per_position = 0;    // K and V of every attention layer, one position
  int initial_positions = 0;  // K/V positions a new state starts with (at most its max_seq)
  int position_step = 1;      // K/V capacities are multiples of this (up to max_seq)
  size_t page = 0;            // an allocation of at least this many bytes takes whole pages of it; 0: none
  int kv_elem = 4;            // bytes an element of the K/V caches and conv windows
  int s_elem = 4;             // bytes an element of the DeltaNet states S
  // What an allocation of b bytes takes.
  size_t alloc_bytes(size_t b) const;
  // K/V positions of a state of limit max_seq that has been given room for n_tokens, grown straight
  // to it (SeqState::reserve with upto = n_tokens): the initial positions, or n_tokens rounded up to
  // position_step; never more than max_seq.
  int positions_for(int n_tokens, int max_seq) const;
  // SeqState::bytes() of a state whose K/V caches hold `positions`.
  size_t bytes_at(int positions) const;
  size_t bytes_for(int n_tokens, int max_seq) const { return bytes_at(positions_for(n_tokens, max_seq)); }
  // A copy (SeqState::clone) of a state holding n_tokens: its K/V hold those positions (at least
  // one) rounded up to position_step.
  size_t clone_bytes(int n_tokens, int max_seq) const;
};

// Memory where states live (device memory on a GPU, host memory on the CPU), now.
struct DeviceMemory {
  size_t total = 0;
  size_t free = 0;  // what new allocations may still take
};

// Per-sequence state: KV cache of the attention layers, conv windows and recurrent state of
// the DeltaNet layers, and the number of tokens consumed. Opaque outside the backend.
class SeqState {
 public:
  virtual ~SeqState() = default;
  virtual int n_tokens() const = 0;    // tokens consumed so far (the next token's position)
  virtual int max_seq() const = 0;     // most tokens this state may hold (its KV cache's limit)
  virtual size_t bytes() const = 0;    // memory held
  virtual std::unique_ptr<SeqState> clone() const = 0;  // deep copy (prefix-cache snapshot)
  virtual void reset() = 0;            // back to empty, keeps the allocation
  // Makes room for n_tokens tokens in all (a backend whose cache grows on demand allocates here;
  // nothing else may hold the old buffers). `upto` (>= n_tokens), when given, is the most this
  // sequence will need (its request's prompt + max_tokens): a growing cache grows straight to it,
  // once, and never beyond, so the state takes StateMemory::bytes_for(upto) (the engine admits a
  // request by that); without it the backend grows by its own policy (at least doubling). An
  // error if n_tokens > max_seq() or memory runs out; the state is unchanged then.
  virtual Status reserve(int n_tokens, int upto = 0) {
    (void)upto;
    if (n_tokens > max_seq()) return errorf("the sequence needs {} tokens; its limit (max_seq) is {}", n_tokens, max_seq());
    return Status::ok();
  }
};

// One sequence's part of a serving step (Model::launch): tokens appended to *state at positions
// state->n_tokens()..., and what comes back for the last `outputs` of them: nothing, their logits
// (host fp32 [outputs, vocab] at `logits`), or a token drawn where the logits are for each (*draw →
// drawn[0..outputs); model/draw.h). A decode row feeds one token; a newcomer's prompt segment feeds
// several. The feed and its draw spec need to live only during launch; the outputs are written by
// the step's wait.
//
// Speculative decoding (Model::speculates): a verify feed is a decode row's token followed by draft
// tokens, with outputs == tokens.size() and `rewindable`; each token is computed as a decode row
// (its outputs are what plain decoding would give at that position), and until the state's next
// step Model::rewind may drop the rejected drafts from it.
struct StepFeed {
  SeqState* state = nullptr;
  std::span<const int32_t> tokens;
  float* logits = nullptr;
  const DrawSpec* draw = nullptr;
  Drawn* drawn = nullptr;
  int outputs = 1;         // 1..tokens.size(); more than 1 only where Model::speculates
  bool rewindable = false;  // only where Model::speculates
};

// A lone drawn feed's token on a backend that pipelines (Model::pipelines): the id the previous
// launched step drew for the same state, still where it was drawn (the host need not wait for it).
constexpr int32_t kDrawnToken = -1;

// A launched step (Model::launch), completed by Model::wait. Tickets count up from 1.
using StepTicket = uint64_t;

struct ModelOptions {
  std::string backend = "cpu";  // "cpu" | "cuda"
  int threads = 0;              // cpu: 0 = all cores
  bool verbose = true;          // load progress on stderr
  // Test hook: the CPU backends act as a device with this many bytes for sequence states (a new
  // state, a K/V growth or a clone beyond it fails, as on a full GPU); 0: no limit.
  size_t cpu_state_limit_bytes = 0;
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& dir, const ModelOptions& opts);
  // A model over a backend made elsewhere (tests: a backend over test weights, a fake backend),
  // with the configuration it runs; dir() is `dir`.
  static std::unique_ptr<Model> over(const ModelConfig& cfg, std::unique_ptr<Backend> backend, std::string dir = {});
  ~Model();

  const ModelConfig& config() const;
  const std::string& dir() const;
  const char* backend_name() const;

  Result<std::unique_ptr<SeqState>> new_state(int max_seq);
  // What a state of limit max_seq takes (StateMemory), and the memory states may still take now
  // (CUDA: cudaMemGetInfo; CPU: MemAvailable, or the test hook's limit).
  StateMemory state_memory(int max_seq) const;
  Result<DeviceMemory> device_memory();
  // The one way to run the model: a serving step over feeds (StepFeed; distinct states, ids <
  // vocab, or kDrawnToken where pipelines() allows it), decode rows and prompt segments together,
  // every token-parallel op once over all their tokens where the backend can. Each feed gets what
  // it would get alone. Every state consumes its tokens at launch (room is reserved here); the
  // outputs are in place once wait(ticket) returns, which also waits for the steps launched before.
  // Where pipelines() is true (CUDA), a lone one-token drawn feed returns at once, so the host's work
  // for one token overlaps the next step (the server's single-stream decode); at most two steps are
  // in flight. Elsewhere the step runs at launch.
  Result<StepTicket> launch(std::span<const StepFeed> feeds);
  Status wait(StepTicket ticket);
  bool pipelines() const;
  // Whether the backend takes verify feeds (StepFeed::outputs > 1, rewindable) and rewind.
  bool speculates() const;
  // A verify step's time over a plain decode step's, on this backend: spec_step_cost() once, plus
  // spec_row_cost() per draft row (EngineOptions::spec_row_cost, spec_step_cost).
  double spec_row_cost() const;
  double spec_step_cost() const;
  // The most verify feeds one step may hold (Backend::spec_max_feeds).
  int spec_max_feeds() const;
  // Drops the tokens at positions n_tokens.. from a state whose last step fed it a rewindable feed
  // that started at or before n_tokens: the state is as if only its first n_tokens tokens had been
  // fed. An error (the state unchanged) otherwise, or where the backend does not speculate.
  Status rewind(SeqState& state, int n_tokens);
  // The backend's default prompt segment for a server (Backend::default_prefill_chunk).
  int default_prefill_chunk() const;
  // The backend's default EngineOptions::long_step_tokens (Backend::default_long_step_tokens).
  int default_long_step_tokens() const;
  // Conveniences over launch + wait. step: one step, waited for. forward: `tokens` appended to
  // state, the last one's logits (if non-empty: [vocab] fp32). forward_batch: row b feeds tokens[b]
  // to *states[b], logits [B, vocab]. decode_draw: the same rows, each drawn as spec[b] says into
  // out[b].
  Status step(std::span<const StepFeed> feeds);
  Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits);
  Status forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens, std::span<float> logits);
  Status decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens, std::span<const DrawSpec> spec,
                     std::span<Drawn> out);
  // Greedy decode as the server runs one request: feeds `first`, then each step's draw (argmax,
  // lowest id on ties), n_steps times, with two steps in flight where the backend pipelines;
  // out[i] = the token drawn by step i. avail_s (optional): per step, the seconds from the call until
  // out[i] reached the host.
  Status decode_greedy(SeqState& state, int32_t first, int n_steps, std::vector<int32_t>& out,
                       std::vector<double>* avail_s = nullptr);
  // Readies the backend for serving up to max_rows requests at once, with steps of up to
  // max_rows + step_tokens tokens (Backend::prepare); a server calls it once at start, so no
  // request pays a first-use cost (a graph capture, say).
  Status prepare(int max_rows, int step_tokens = 0);
  // A per-op profile of one decode step of state on stderr (Backend::profile_decode; CUDA only).
  Status profile_decode(SeqState& state);
  // Device copy bandwidth (GB/s) measured now by the backend; 0 for the CPU.
  double copy_bandwidth_gbps();
  std::string hardware() const;

 private:
  Model() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One sequence decoding with up to two steps in flight (Model::launch / wait), each a lone one-token
// feed drawn where its logits are: the server's single-stream decode (Engine) and
// Model::decode_greedy. launch() feeds `token`, or kDrawnToken (the draw of the step launched before
// it, where Model::pipelines()); collect() waits for the oldest step in flight and gives its draw.
// Step i draws into slot i % 2, which step i - 2's collect has emptied.
class DrawPipeline {
 public:
  DrawPipeline(Model& model, SeqState& state) : model_(model), state_(state) {}
  Status launch(int32_t token, const DrawSpec& spec);
  Status collect(Drawn& out);
  int in_flight() const { return int(launched_ - collected_); }

 private:
  Model& model_;
  SeqState& state_;
  Drawn slot_[2];
  StepTicket ticket_[2] = {0, 0};
  uint64_t launched_ = 0, collected_ = 0;
};

}  // namespace lily
