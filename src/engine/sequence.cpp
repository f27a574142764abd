// Sequence: see sequence.h. The reply logic (forced/injected tokens, stop ids and strings,
// max_tokens) is what the engine applied per request before it batched requests.
#include "engine/sequence.h"

#include <algorithm>

namespace lily {

Sequence::Sequence(std::shared_ptr<GenRequest> req, const Tokenizer& tok, const std::vector<int32_t>& stop_ids,
                   EngineStats& stats)
    : req_(std::move(req)),
      stop_ids_(stop_ids),
      stats_(stats),
      sampler_(req_->sampling, req_->prompt),
      text_(tok),
      stops_(req_->stop) {
  pending_.assign(req_->forced_prefix.begin(), req_->forced_prefix.end());
  forced_ = !req_->forced_output.empty();
  if (forced_) pending_.assign(req_->forced_output.begin(), req_->forced_output.end());
  usage_.prompt_tokens = int(req_->prompt.size());
}

void Sequence::attach(CacheEntry e, int n_cached) {
  entry_ = std::move(e);
  entry_.tokens.assign(req_->prompt.begin(), req_->prompt.begin() + n_cached);
  usage_.cached_tokens = n_cached;
  if (phase_ == Phase::kWaiting) phase_ = prompt_left() == 0 ? Phase::kDecode : Phase::kPrefill;
}

void Sequence::fed(std::span<const int32_t> tokens) {
  if (prompt_left() == 0) reply_fed_ += tokens.size();
  entry_.tokens.insert(entry_.tokens.end(), tokens.begin(), tokens.end());
  if ((phase_ == Phase::kPrefill || phase_ == Phase::kTail) && prompt_left() == 0) phase_ = Phase::kDecode;
}

std::span<const int32_t> Sequence::next_segment(size_t seg_len) const {
  const size_t done = prompt_fed(), q = std::max<size_t>(seg_len, 1);
  size_t len = std::min(prompt_left(), (done / q + 1) * q - done);
  // A remainder of at most q/8 after the cut joins this segment: a segment of its own would cost a
  // whole forward's fixed time (on an H100 25 ms for a 9-token tail after 8,192 tokens).
  if (prompt_left() - len <= q / kTailJoin) len = prompt_left();
  for (int snap : {req_->snapshot_at, req_->shared_prefix_at})
    if (snap > 0 && size_t(snap) > done && size_t(snap) < done + len) len = size_t(snap) - done;
  return std::span<const int32_t>(req_->prompt.data() + done, len);
}

bool Sequence::snapshot_ahead() const {
  const int fed = int(prompt_fed());
  return req_->snapshot_at > fed || req_->shared_prefix_at > fed;
}

Sequence::Snapshot Sequence::at_snapshot() const {
  if (reply_fed_ != 0) return Snapshot::kNone;
  auto due = [&](int at) { return at > usage_.cached_tokens && entry_.tokens.size() == size_t(at); };
  if (due(req_->shared_prefix_at)) return Snapshot::kShared;  // also serves as the turn snapshot
  if (due(req_->snapshot_at)) return Snapshot::kTurn;
  return Snapshot::kNone;
}

void Sequence::finish(FinishReason why, std::string text, std::string error, bool out_of_memory) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  GenEvent ev;
  ev.text = std::move(text);
  ev.done = true;
  ev.finish = why;
  ev.error = std::move(error);
  ev.out_of_memory = out_of_memory;
  ev.usage = usage_;
  ev.stop_string = stop_string_;
  if (req_->on_event) req_->on_event(std::move(ev));
}

CacheEntry Sequence::release(bool ok) {
  CacheEntry e = std::move(entry_);
  entry_ = CacheEntry{};
  if (!ok && e.state) {
    e.tokens.clear();
    e.state->reset();
  }
  e.key = req_->cache_key;
  return e;
}

GenToken Sequence::choose(std::span<float> logits) {
  GenToken tok;
  vocab_ = logits.size();
  if (fork_pending()) {  // the first reply token: the other choices start from these logits too
    fork_logits_.assign(logits.begin(), logits.end());
    forked_ = true;
  }
  TokenConstraint* c = req_->constraint.get();
  if (!pending_.empty()) {
    tok.id = pending_.front();
    pending_.pop_front();
    if (req_->sampling.top_logprobs >= 0) {
      SampleResult r;
      compute_logprobs(logits, tok.id, req_->sampling.top_logprobs, r);
      tok.logprob = r.logprob;
      tok.top = std::move(r.top);
    }
    sampler_.accept(tok.id);
  } else {
    std::span<const uint64_t> allowed;
    if (c && c->constrains(tokens_left())) {
      mask_.assign((logits.size() + 63) / 64, 0);
      c->mask(tokens_left(), mask_);
      allowed = mask_;
    }
    SampleResult r = sampler_.sample(logits, allowed);
    tok.id = r.id;
    tok.logprob = r.logprob;
    tok.top = std::move(r.top);
    sampled(r.id);
  }
  if (c) c->accept(tok.id);
  return tok;
}

void Sequence::sampled(int32_t id) {
  if (!injected_ && req_->inject_after && id == *req_->inject_after) {
    pending_.assign(req_->inject_tokens.begin(), req_->inject_tokens.end());
    injected_ = true;
  }
}

DrawSpec Sequence::device_spec() {
  if (!constrained()) return sampler_.device_spec();
  mask_.assign((vocab_ + 63) / 64, 0);  // as choose() does
  req_->constraint->mask(tokens_left(), mask_);
  return sampler_.device_spec(mask_);
}

GenToken Sequence::take_drawn(const Drawn& d) {
  GenToken tok;
  tok.id = d.id;
  if (req_->sampling.top_logprobs >= 0) {
    tok.logprob = d.logprob;
    for (int i = 0; i < d.n_top; ++i) tok.top.push_back({d.top_id[i], d.top_logprob[i]});
  }
  sampler_.accept(d.id);
  if (req_->constraint) req_->constraint->accept(d.id);
  sampled(d.id);
  return tok;
}

bool Sequence::on_logits(std::span<float> logits) { return deliver(choose(logits)); }

bool Sequence::deliver(GenToken tok) {
  auto emit = [&](GenEvent&& ev) {
    if (req_->on_event) req_->on_event(std::move(ev));
  };
  usage_.completion_tokens++;
  stats_.completion_tokens++;
  const int32_t id = tok.id;
  GenEvent ev;
  ev.tokens.push_back(std::move(tok));
  if (!req_->ignore_eos && std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    emit(std::move(ev));
    std::string rest = stops_.push(text_.flush()).text + stops_.flush();
    finish(FinishReason::kStop, std::move(rest));
    return false;
  }
  auto out = stops_.push(text_.push(id));
  ev.text = std::move(out.text);
  emit(std::move(ev));
  if (out.stopped) {
    stop_string_ = std::move(out.matched);
    finish(FinishReason::kStop);
    return false;
  }
  const bool forced_done = forced_ && pending_.empty();
  if (usage_.completion_tokens >= req_->max_tokens || forced_done) {
    auto tail = stops_.push(text_.flush());
    std::string rest = tail.text + (tail.stopped ? "" : stops_.flush());
    finish(forced_done && usage_.completion_tokens < req_->max_tokens ? FinishReason::kStop : FinishReason::kLength,
           std::move(rest));
    return false;
  }
  next_ = id;
  return true;
}

std::vector<int32_t> Sequence::draft(int max_len, int max_ngram) {
  if (phase_ != Phase::kDecode) return {};
  return lookup_.draft(entry_.tokens, next_, max_len, max_ngram);
}

int Sequence::spec_len(int avail, double row_cost, double step_cost) const {
  const double a = spec_hits_ / (spec_hits_ + spec_misses_);
  int best = 0;
  double best_gain = 1.02, tokens = 1.0, p = 1.0;
  for (int k = 1; k <= avail; ++k) {
    p *= a, tokens += p;
    if (const double g = tokens / (1.0 + step_cost + row_cost * k); g > best_gain) best = k, best_gain = g;
  }
  return best;
}

}  // namespace lily
