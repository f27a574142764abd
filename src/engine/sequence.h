// One request inside the engine's running batch: its model state (taken from the prefix cache),
// how much of its prompt has been fed, and the reply side: sampler, detokenizer, stop rules,
// forced and injected tokens, usage. The engine thread owns it; events go to the request's
// callback. A reply feeds every sampled token except the one that ends it, so the state's tokens
// are exactly prompt + reply when it goes back to the cache.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/ngram_lookup.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "engine/token_text.h"

namespace lily {

class Sequence {
 public:
  Sequence(std::shared_ptr<GenRequest> req, const Tokenizer& tok, const std::vector<int32_t>& stop_ids,
           EngineStats& stats);

  GenRequest& req() { return *req_; }
  // Where the request is; the scheduler reads it, the sequence's own calls move it on:
  //   kWaiting --attach--> kPrefill (prompt segments) --feed_tail_in_decode--> kTail --fed--> kDecode
  //   (kPrefill --fed, the prompt in--> kDecode; attach with the whole prompt cached --> kDecode)
  //   any --finish--> kDone (the state, if any, goes back when the engine retires it).
  enum class Phase { kWaiting, kPrefill, kTail, kDecode, kDone };
  Phase phase() const { return phase_; }
  bool finished() const { return phase_ == Phase::kDone; }
  bool has_state() const { return entry_.state != nullptr; }
  // Prompt tokens fed so far, and not yet fed (0 once decoding).
  size_t prompt_fed() const { return entry_.tokens.size() - reply_fed_; }
  size_t prompt_left() const { return req_->prompt.size() - prompt_fed(); }
  // Fed by decode steps, one token a step: the reply, or a short prompt tail (kTail).
  bool decoding() const { return phase_ == Phase::kTail || phase_ == Phase::kDecode; }
  // A short prompt tail goes through decode steps, one token a step, instead of a prefill forward
  // (whose fixed cost, on a GPU, is that of reading nearly every expert). The engine decides.
  void feed_tail_in_decode() {
    if (phase_ == Phase::kPrefill) phase_ = Phase::kTail;
  }
  // Whether a snapshot point (req.snapshot_at, req.shared_prefix_at) lies beyond what has been fed.
  bool snapshot_ahead() const;
  bool feeding_tail() const { return phase_ == Phase::kTail; }
  // Whether the coming decode step only feeds a prompt token: its output is not the reply's (the
  // engine draws nothing for it and delivers nothing).
  bool silent_step() const { return feeding_tail() && prompt_left() > 1; }
  SeqState& state() { return *entry_.state; }
  const CacheEntry& entry() const { return entry_; }

  // Takes ownership of the state the engine found for this request; its first n_cached prompt
  // tokens are already in it.
  void attach(CacheEntry e, int n_cached);
  // Records that `tokens` (the next prompt tokens, or the pending reply token) were fed.
  void fed(std::span<const int32_t> tokens);
  // The prompt's next segment: from the fed position to the next cut point (a multiple of seg_len,
  // a snapshot position, or the prompt's end; a cut that would leave at most seg_len / kTailJoin
  // tokens is skipped). A function of the prompt and the position only.
  static constexpr size_t kTailJoin = 8;
  std::span<const int32_t> next_segment(size_t seg_len) const;
  // Whether the prompt has just been fed up to a snapshot point (the engine then caches a copy):
  // req.snapshot_at (this turn's reply start, for the next turn) or req.shared_prefix_at (the
  // shared head, a branch point for every later prompt starting with it).
  enum class Snapshot { kNone, kTurn, kShared };
  Snapshot at_snapshot() const;
  // Token to feed in the next decode step (valid while decoding()).
  int32_t next_token() const { return feeding_tail() ? req_->prompt[prompt_fed()] : next_; }

  // Logits of the last fed token: choose the next token, emit its event, and either keep going
  // (next_token() set) or finish (the final event emitted). Returns !finished().
  bool on_logits(std::span<float> logits);
  // on_logits in two halves: choose() touches only this sequence's sampler and pending tokens
  // (so the engine runs it for several sequences at once); deliver() emits the event, applies
  // the stop rules and usage (engine thread, one sequence at a time).
  GenToken choose(std::span<float> logits);
  bool deliver(GenToken tok);
  // The other way to the next token: when nothing is pending and the sampler allows it, the
  // backend draws it where the logits are (device_spec() for the step; take_drawn() turns the
  // result into what choose() would have returned, for deliver()). A constrained step's spec
  // carries the constraint's mask, sized as choose() sizes it: from the vocabulary of a logits
  // row this request has seen (its first reply token's, chosen from the prompt's logits).
  bool device_drawable() const {
    return pending_.empty() && sampler_.device_drawable() && (!constrained() || vocab_ > 0) && !fork_pending();
  }
  DrawSpec device_spec();
  GenToken take_drawn(const Drawn& d);
  // Whether the next step may be launched before this one's token reaches the host (the engine's
  // depth-2 pipeline): drawn on the device, no token can be injected after the next draw, and the
  // next draw's spec does not depend on this one's token (penalties).
  bool pipelinable() const { return device_drawable() && !feeding_tail() && draws_independent(); }
  // Whether the next decode step may verify drafts (speculative decoding): a reply token is next, it
  // is greedy with nothing that depends on the drawn tokens (penalties, a constraint, a token to
  // inject, forced tokens, forks), so each verified position is drawn as plain decoding draws it.
  bool speculable() const {
    return phase_ == Phase::kDecode && pending_.empty() && !forced_ && !fork_pending() && sampler_.greedy() &&
           draws_independent();
  }
  // Prompt lookup over prompt + reply and the pending token (NgramLookup; valid while decoding).
  std::vector<int32_t> draft(int max_len, int max_ngram);
  // How many of `avail` drafts to verify this step: the k that maximises the expected tokens a step
  // delivers, 1 + a + … + a^k for a draft token accepted with chance a (this request's estimate),
  // per cost of the step, 1 + step_cost + row_cost·k (over a decode step's time: a verify step's fixed
  // part and each draft row's); 0 when no k gains 2%.
  int spec_len(int avail, double row_cost, double step_cost = 0.0) const;
  // Records the outcome of drafts: `accepted` matched, then one did not (`missed`). The estimate of
  // a decays (weight 0.9 a step), so it follows the reply from quoting to free text and back. Drafts
  // not fed count too: the engine checks their first token against the token drawn.
  void spec_observe(int accepted, bool missed) {
    spec_hits_ = 0.9 * spec_hits_ + accepted, spec_misses_ = 0.9 * spec_misses_ + (missed ? 1.0 : 0.0);
  }
  // n > 1: the logits this request's first reply token was chosen from, kept for its forks (the
  // engine starts them from a copy of the state: Engine::make_forks).
  bool fork_ready() const { return !fork_logits_.empty(); }
  std::vector<float> take_fork_logits() { return std::move(fork_logits_); }
  // Completion tokens this request may still produce.
  int tokens_left() const { return req_->max_tokens - usage_.completion_tokens; }
  // Ends the request now with the final event (text flushed only for kStop/kLength).
  void finish(FinishReason why, std::string text = {}, std::string error = {}, bool out_of_memory = false);
  // The most tokens its state will hold: prompt + max_tokens (the engine's memory projection).
  int max_positions() const { return int(req_->prompt.size()) + std::max(req_->max_tokens, 1); }
  // State memory the engine has set aside for it (EngineOptions::memory_budget_bytes): its own state's
  // projection, and its forks' until they are made.
  size_t mem_own = 0, mem_forks = 0;
  // Hands the state back (for the prefix cache): with its tokens if ok, emptied if not.
  CacheEntry release(bool ok);

 private:
  void sampled(int32_t id);  // after a draw: the test hook that injects tokens
  // Whether the next draw is made as the one before it was, whatever that one's token: no penalties, no
  // constraint, no token to inject after it, no per-step delay (what pipelining and speculation need).
  bool draws_independent() const {
    return !sampler_.penalized() && !req_->constraint && !(req_->inject_after && !injected_) && req_->step_delay_ms == 0;
  }
  bool constrained() const { return req_->constraint && req_->constraint->constrains(tokens_left()); }
  bool fork_pending() const { return !req_->forks.empty() && !forked_; }
  std::shared_ptr<GenRequest> req_;
  const std::vector<int32_t>& stop_ids_;
  EngineStats& stats_;
  CacheEntry entry_;
  size_t reply_fed_ = 0;  // reply tokens already fed (in entry_.tokens beyond the prompt)
  Sampler sampler_;
  TokenText text_;
  StopMatcher stops_;
  std::deque<int32_t> pending_;  // forced prefix, injected tokens, or (test hook) the whole reply
  Phase phase_ = Phase::kWaiting;
  bool forced_ = false, injected_ = false;
  int32_t next_ = -1;
  std::vector<uint64_t> mask_;      // the constraint's allowed tokens for this step
  size_t vocab_ = 0;                // the logits rows' length, once choose() has seen one
  std::vector<float> fork_logits_;  // see fork_ready()
  bool forked_ = false;
  std::string stop_string_;         // the stop string that ended the reply
  NgramLookup lookup_;              // draft()'s index
  double spec_hits_ = 4.0, spec_misses_ = 1.0;  // spec_observe's decayed counts; a starts at 0.8
  GenUsage usage_;
};

}  // namespace lily
