// The engine: turns token requests into generated text. One worker thread runs a continuous
// batch: requests are admitted FIFO at step boundaries (up to max_batch at once, each when its
// projected state fits the memory budget: EngineOptions::memory_budget_bytes); each step is one
// Model::step over every decoding request's next token and newcomers' prompt segments (a bounded
// number of tokens, so the running requests keep flowing), and a finished or cancelled request
// leaves at once. Each request has its own
// sampler and stop rules; states come from and go back to the prefix cache.
#pragma once
#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace lily {

class Sequence;

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop" | "length" | "cancelled" | "error"

struct GenUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // sampled tokens, the stop token included
  int cached_tokens = 0;      // prompt tokens served from the prefix cache
};

struct GenToken {
  int32_t id = 0;
  std::optional<float> logprob;
  std::vector<TokenLogprob> top;
};

// One step's output, delivered on the engine thread. `text` may be empty (held back by the
// detokenizer or a possible stop string). The last event has done = true.
struct GenEvent {
  std::string text;
  std::vector<GenToken> tokens;
  bool done = false;
  FinishReason finish = FinishReason::kStop;
  std::string error;  // for kError: a message for the log, not for clients
  bool out_of_memory = false;  // kError because the state's memory ran out (a retryable 503, not a 500)
  GenUsage usage;     // filled on the last event
  std::string stop_string;  // the stop string that ended the reply ("" if none)
};

struct GenRequest {
  std::vector<int32_t> prompt;  // ids < model vocab, not empty
  int max_tokens = 16;          // >= 1; prompt + max_tokens <= max_seq (checked by the caller)
  SamplingParams sampling;
  std::vector<std::string> stop;        // stop strings (not part of the output)
  std::vector<int32_t> forced_prefix;   // output first without sampling (tool_choice forcing)
  std::optional<int32_t> inject_after;  // when this id is sampled, output inject_tokens next
  std::vector<int32_t> inject_tokens;   // (e.g. a named tool call right after </think>)
  std::vector<int32_t> forced_output;   // test hook: fed instead of sampling, then stop
  bool ignore_eos = false;              // the model's stop tokens do not end the reply (lily bench)
  int step_delay_ms = 0;                // test hook: sleep per decode step
  std::string cache_key;                // prompt_cache_key
  // Also cache a snapshot of the state after this many prompt tokens (-1: none). With thinking
  // on, the next turn drops this turn's think block, so it extends the prompt only up to the
  // start of the reply ("<|im_start|>assistant\n"); the snapshot is what it can reuse.
  int snapshot_at = -1;
  // End of the prompt's shared head (system prompt and tool definitions; -1: none). The engine
  // keeps one snapshot there that every later prompt starting with the same head branches from
  // (a copy per request), when the head has at least EngineOptions::shared_prefix_min tokens.
  int shared_prefix_at = -1;
  // Structured outputs, thinking budgets: which tokens may be chosen (null: any).
  std::unique_ptr<TokenConstraint> constraint;
  // More choices of the same prompt (n > 1): each continues a copy of this request's state once
  // its prompt is in (one prefill for all), starting from the same logits, with its own sampling,
  // constraint and events. They share this request's batch slots on admission.
  std::vector<std::shared_ptr<GenRequest>> forks;
  std::function<void(GenEvent&&)> on_event;
  std::atomic<bool> cancelled{false};   // set by the client side; seen before every step
};

struct EngineOptions {
  int max_seq = 4096;               // state capacity, tokens
  int max_queue = 64;               // waiting requests beyond the running batch
  int max_batch = 8;                // requests decoded together (continuous batching)
  int max_cached_states = 8;        // prefix cache entries (Lily keeps 2)
  size_t cache_budget_bytes = size_t(8) << 30;
  // Memory for every sequence state: running, cached and spare (engine/memory_plan.h computes it at
  // server start; 0: no limit). A queued request is admitted only when its projected state (the
  // backend's StateMemory at prompt + max_tokens, for each of its choices) fits beside the running
  // requests' projections, after evicting cached and spare states; else it waits (FIFO) until
  // running requests leave. A running state grows only up to its projection.
  size_t memory_budget_bytes = 0;
  int shared_prefix_min = 256;      // shortest shared head worth a snapshot, tokens
  // A prompt is cut into segments at fixed points: every prefill_chunk tokens of absolute position
  // (except where that leaves a remainder of at most prefill_chunk / 8, which joins the segment before)
  // and at its snapshot positions. A segment is fed whole by one step, so a prompt's arithmetic (and
  // with it a request's tokens) never depends on load or timing; the scheduler only decides how many
  // segments a step runs.
  int prefill_chunk = 512;          // segment length, tokens (cancel checked between segments)
  int decode_tail = 4;              // a prompt remainder this short is fed by decode steps instead
  // A step is every decoding request's next token plus newcomers' prompt segments, oldest first:
  // the first always, more while their tokens stay within step_tokens (vLLM's
  // max_num_batched_tokens), so a step's time, and the running rows' inter-token latency, is bounded.
  int step_tokens = 512;
  // A step whose first segment is itself longer than step_tokens (a long prompt: a backend may prefill it on
  // its own kernels before the step's other rows, CUDA single pass in one prefill pass) carries more such
  // long segments (no shorter ones) while the step's prompt tokens stay within long_step_tokens: several
  // newcomers' long segments share one prefill pass (their experts get several times the rows), at the cost
  // of a longer step for the running streams. At most step_tokens (0): a long segment runs in a step of its
  // own. A server takes the backend's default (Backend::default_long_step_tokens).
  int long_step_tokens = 0;
  int prefill_delay_ms = 0;         // test hook: sleep this long before every prefill forward (a slow machine)
  // Speculative decoding by prompt lookup, where the model speculates (Model::speculates): a decode
  // row of a greedy request (Sequence::speculable) whose last tokens (an n-gram, n = spec_ngram down
  // to 2) occurred before in its prompt or reply feeds, after its token, up to spec_draft of the
  // tokens that followed (Sequence::draft); the step gives an output for each position, the tokens
  // are delivered while each draft matches the token drawn before it, and the state is rewound to
  // the last verified one. Every delivered token is the one plain decoding draws. 0: off.
  int spec_draft = 0;
  int spec_ngram = 3;
  // A verify step's time over a plain decode step's, spec_step_cost once plus spec_row_cost per draft
  // row: a request verifies only as many of its drafts as pay for themselves at its acceptance so far
  // (Sequence::spec_len). spec_row_cost 0, spec_step_cost < 0: the backend's (Model::spec_row_cost,
  // spec_step_cost).
  double spec_row_cost = 0;
  double spec_step_cost = -1;
  // Drafts from elsewhere (tests, lily bench --spec-draft): a request's drafts (at most max_len) from
  // its fed tokens and the pending one, instead of prompt lookup (which finds nothing in the random
  // replies of a synthetic checkpoint).
  using Drafter = std::function<std::vector<int32_t>(std::span<const int32_t> fed, int32_t next, int max_len)>;
  Drafter spec_drafter;
};

struct EngineStats {
  std::atomic<uint64_t> cache_hits{0}, cache_misses{0}, cached_tokens{0};
  std::atomic<uint64_t> prompt_tokens{0}, completion_tokens{0};
  std::atomic<uint64_t> decode_steps{0}, decode_rows{0};  // batched steps and the rows they carried
  // Speculative decoding: rows that verified drafts, drafts fed, drafts accepted (delivered as drawn).
  std::atomic<uint64_t> spec_rows{0}, spec_drafted{0}, spec_accepted{0};
  // State memory, published by the worker at every step (bytes).
  std::atomic<uint64_t> mem_reserved{0};  // running requests: max(projection, state held), pending forks' projections
  std::atomic<uint64_t> mem_running{0};   // held by running requests' states
  std::atomic<uint64_t> mem_cached{0};    // held by the prefix cache's states
  std::atomic<uint64_t> mem_spare{0};     // held by states kept for reuse
  std::atomic<uint64_t> memory_waits{0};  // requests that waited in the queue for state memory (each once)
  std::atomic<uint64_t> state_failures{0};  // a state's allocation or K/V growth failed: that request ended (503)
};

class Engine {
 public:
  Engine(Model& model, const Tokenizer& tok, EngineOptions opts);
  ~Engine();  // finishes the running step, cancels queued requests, joins the worker
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; false when the queue is full (the caller answers 503).
  bool submit(std::shared_ptr<GenRequest> req);

  int queue_depth() const;    // waiting, not running
  int running() const { return running_.load(); }  // admitted, prefilling or decoding
  bool busy() const { return running_.load() > 0; }
  const EngineOptions& options() const { return opts_; }
  // What a state takes (the model's StateMemory at options().max_seq), and a request's projected
  // state memory: every choice's state at prompt + max_tokens.
  const StateMemory& state_memory() const { return smem_; }
  size_t projected_bytes(const GenRequest& r) const;
  const EngineStats& stats() const { return stats_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int vocab_size() const;

 private:
  void worker();
  struct Segment {                 // a prompt segment of this step
    Sequence* seq;
    std::span<const int32_t> tokens;
    bool last;                     // the prompt's end: its logits choose the first reply token
  };
  void step();                     // one scheduling step over the running batch
  std::vector<Segment> plan_segments();  // the newcomers' segments of this step, within step_tokens
  std::vector<Sequence*> decode_rows();  // the decoding requests, each with room for one more token
  // One Model::step; drafts0: row 0's drafts when the caller looked them up already (a lone request).
  void run_step(const std::vector<Segment>& segs, const std::vector<Sequence*>& rows,
                const std::vector<int32_t>* drafts0 = nullptr);
  void decode_pipelined(Sequence& s);  // one request alone: two device-drawn steps in flight
  // Speculative decoding: s's drafts now (the drafter hook or prompt lookup; empty where s does not
  // speculate), the verify step's costs, and whether s's next step should verify its drafts d.
  std::vector<int32_t> drafts_of(Sequence& s) const;
  double spec_row_cost() const;
  double spec_step_cost() const;
  bool wants_verify(Sequence& s, const std::vector<int32_t>& d) const;
  void retire(Sequence& s, bool ok);  // state back to the cache
  void drop_finished();
  void make_forks(Sequence& s);   // n > 1: the other choices, from s's state after its prompt
  void adopt_forks();             // forks made during a phase join the running batch
  Result<CacheEntry> checkout(const GenRequest& req, int& n_cached);
  // State memory (EngineOptions::memory_budget_bytes). All on the worker thread.
  size_t bytes_of(const GenRequest& r) const;     // one choice's projected state
  size_t running_bytes(bool reserved) const;      // running requests' reservations, or the bytes they hold
  size_t idle_bytes() const;                      // the prefix cache's and the spare states' bytes
  // Frees cached and spare states (spare first, then least recently used) until `need` more bytes fit
  // the budget; false if they cannot. Freed states go to *freed (to be destroyed outside a lock) or die.
  // For a request (`for_req`), the cached state it would continue from is kept while anything else can
  // go, and counted as part of its need (it becomes that request's state; *reused says how many bytes
  // of the need it covers); evicted only as a last resort. `kept`: the entries earlier admissions of the
  // same round continue from, never evicted here; the request's own is added.
  bool make_room(size_t need, std::vector<std::unique_ptr<SeqState>>* freed = nullptr, const GenRequest* for_req = nullptr,
                 std::vector<uint64_t>* kept = nullptr, size_t* reused = nullptr);
  // One spare or cached state (no entry whose id is in `keep`); false if none.
  bool drop_one_idle(std::vector<std::unique_ptr<SeqState>>* freed, std::span<const uint64_t> keep = {});
  // Room for the sequence's state to hold n_tokens (its K/V grown straight to its projection); when
  // the allocation fails, cached and spare states are freed one by one and it is tried again.
  Status grow(Sequence& s, int n_tokens);
  void fail_memory(Sequence& s, const std::string& why);  // the request ends (503), its state goes back
  void publish_memory();

  Model& model_;
  const Tokenizer& tok_;
  EngineOptions opts_;
  std::vector<int32_t> stop_ids_;
  PrefixCache cache_;
  // States the prefix cache let go, kept for the next newcomers (a fresh allocation costs a GPU
  // several ms and a free synchronises it); at most max_batch, the rest are freed.
  std::vector<std::unique_ptr<SeqState>> spare_;
  void cache_put(CacheEntry e);
  EngineStats stats_;
  std::vector<float> logits_;  // [max_batch, vocab] fp32
  std::vector<std::unique_ptr<Sequence>> active_;  // the running batch, oldest first (worker only)
  std::vector<std::unique_ptr<Sequence>> forked_;  // forks made in the current phase (worker only)
  size_t state_bytes_ = 0;     // size of one state, known after the first allocation
  StateMemory smem_;           // the model's StateMemory at max_seq
  std::shared_ptr<GenRequest> waited_;  // the queue's head that waits for memory (counted once)
  std::atomic<bool> mem_blocked_{false};  // the queue's head waits for memory: no slot is about to free up
  const bool trace_ = [] { const char* e = std::getenv("LILY_ENGINE_TRACE"); return e && *e == '1'; }();
  // LILY_ENGINE_TRACE: where the last run_step's host time went, ms (feeds: the rows' drafts and draw specs
  // and the feeds built; segs: the segments' snapshots and first tokens; rows: the rows' tokens delivered).
  struct StepTimes {
    double feeds = 0, model = 0, segs = 0, rows = 0;
  } step_ms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenRequest>> queue_;
  bool stopping_ = false;
  std::atomic<int> running_{0};
  std::thread thread_;
};

}  // namespace lily
