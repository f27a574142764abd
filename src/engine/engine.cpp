// Engine: see engine.h. The decode loop feeds every sampled token except the one that ends
// the reply, so a cached state's tokens are exactly prompt + reply, which the next turn's
// prompt extends.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include <spdlog/spdlog.h>

#include "engine/stop_matcher.h"
#include "engine/token_text.h"

namespace lily {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

Engine::Engine(Model& model, const Tokenizer& tok, EngineOptions opts)
    : model_(model), tok_(tok), opts_(opts), cache_(opts.max_cached_states, opts.cache_budget_bytes) {
  stop_ids_ = tok.stop_ids(model.config().eos_token_ids);
  logits_.resize(size_t(model.config().vocab_size));
  thread_ = std::thread([this] { worker(); });
}

Engine::~Engine() {
  std::deque<std::shared_ptr<GenRequest>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (auto& r : left) {
    GenEvent ev;
    ev.done = true;
    ev.finish = FinishReason::kCancelled;
    if (r->on_event) r->on_event(std::move(ev));
  }
  if (thread_.joinable()) thread_.join();
}

int Engine::vocab_size() const { return model_.config().vocab_size; }

bool Engine::submit(std::shared_ptr<GenRequest> req) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || int(queue_.size()) >= opts_.max_queue) return false;
    queue_.push_back(std::move(req));
  }
  cv_.notify_one();
  return true;
}

int Engine::queue_depth() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int(queue_.size());
}

void Engine::worker() {
  for (;;) {
    std::shared_ptr<GenRequest> req;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      req = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run(*req);
    running_ = false;
  }
}

Result<CacheEntry> Engine::checkout(const GenRequest& req, int& n_cached) {
  n_cached = 0;
  if (auto hit = cache_.take(req.prompt, req.cache_key)) {
    n_cached = int(hit->tokens.size());
    stats_.cache_hits++;
    stats_.cached_tokens += uint64_t(n_cached);
    return std::move(*hit);
  }
  stats_.cache_misses++;
  CacheEntry e;
  e.key = req.cache_key;
  // A fresh allocation when it fits beside the cached states, else recycle the oldest one.
  if (cache_.size() > 0 && !cache_.fits(state_bytes_)) {
    auto old = cache_.take_lru();
    e.state = std::move(old->state);
    e.state->reset();
    return e;
  }
  auto fresh = model_.new_state(opts_.max_seq);
  if (!fresh) {  // out of memory, say: recycle a cached state if there is one
    auto old = cache_.take_lru();
    if (!old) return fresh.status();
    e.state = std::move(old->state);
    e.state->reset();
    return e;
  }
  e.state = std::move(fresh).value();
  state_bytes_ = e.state->bytes();
  return e;
}

void Engine::run(GenRequest& req) {
  auto emit = [&](GenEvent&& ev) {
    if (req.on_event) req.on_event(std::move(ev));
  };
  GenUsage usage;
  usage.prompt_tokens = int(req.prompt.size());
  auto finish = [&](FinishReason why, std::string text, std::string error = {}) {
    GenEvent ev;
    ev.text = std::move(text);
    ev.done = true;
    ev.finish = why;
    ev.error = std::move(error);
    ev.usage = usage;
    emit(std::move(ev));
  };
  if (req.cancelled) return finish(FinishReason::kCancelled, "");
  if (req.prompt.empty() || int(req.prompt.size()) + std::max(req.max_tokens, 1) > opts_.max_seq + 1)
    return finish(FinishReason::kError, "", "request does not fit the context");

  int n_cached = 0;
  auto entry_or = checkout(req, n_cached);
  if (!entry_or) return finish(FinishReason::kError, "", entry_or.message());
  CacheEntry entry = std::move(entry_or).value();
  usage.cached_tokens = n_cached;
  stats_.prompt_tokens += req.prompt.size();
  // Whatever happens below, the state goes back to the cache with exactly what it consumed.
  entry.tokens.assign(req.prompt.begin(), req.prompt.begin() + n_cached);
  auto give_back = [&](bool ok) {
    if (!ok) {
      entry.tokens.clear();
      entry.state->reset();
    }
    entry.key = req.cache_key;
    cache_.put(std::move(entry));
  };

  // Prefill the uncached suffix in chunks, so a cancel is seen between chunks.
  const std::span<const int32_t> todo(req.prompt.data() + n_cached, req.prompt.size() - size_t(n_cached));
  for (size_t off = 0, len = 0; off < todo.size(); off += len) {
    if (req.cancelled) {
      give_back(true);
      return finish(FinishReason::kCancelled, "");
    }
    len = std::min(todo.size() - off, size_t(opts_.prefill_chunk));
    const size_t snap = req.snapshot_at > n_cached ? size_t(req.snapshot_at - n_cached) : 0;
    if (snap > off && snap < off + len) len = snap - off;  // a chunk boundary at the snapshot
    auto chunk = todo.subspan(off, len);
    bool last = off + chunk.size() == todo.size();
    Status st = model_.forward(*entry.state, chunk, last ? std::span<float>(logits_) : std::span<float>());
    if (!st) {
      give_back(false);
      return finish(FinishReason::kError, "", st.message());
    }
    entry.tokens.insert(entry.tokens.end(), chunk.begin(), chunk.end());
    if (snap > 0 && off + len == snap) {
      CacheEntry s;
      s.tokens = entry.tokens;
      s.state = entry.state->clone();
      s.key = req.cache_key;
      cache_.put(std::move(s));
    }
  }

  Sampler sampler(req.sampling, req.prompt);
  TokenText text(tok_);
  StopMatcher stops(req.stop);
  // Tokens to output without sampling, in order: the forced prefix, injections, or (test hook)
  // the whole reply.
  std::deque<int32_t> pending(req.forced_prefix.begin(), req.forced_prefix.end());
  const bool forced = !req.forced_output.empty();
  if (forced) pending.assign(req.forced_output.begin(), req.forced_output.end());
  bool injected = false;
  for (;;) {
    if (req.cancelled) {
      give_back(true);
      return finish(FinishReason::kCancelled, "");
    }
    GenToken tok;
    if (!pending.empty()) {
      tok.id = pending.front();
      pending.pop_front();
      if (req.sampling.top_logprobs >= 0) {
        SampleResult r;
        compute_logprobs(logits_, tok.id, req.sampling.top_logprobs, r);
        tok.logprob = r.logprob;
        tok.top = std::move(r.top);
      }
      sampler.accept(tok.id);
    } else {
      SampleResult r = sampler.sample(logits_);
      tok.id = r.id;
      tok.logprob = r.logprob;
      tok.top = std::move(r.top);
      if (!injected && req.inject_after && r.id == *req.inject_after) {
        pending.assign(req.inject_tokens.begin(), req.inject_tokens.end());
        injected = true;
      }
    }
    usage.completion_tokens++;
    stats_.completion_tokens++;
    const int32_t id = tok.id;
    GenEvent ev;
    ev.tokens.push_back(std::move(tok));
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
      emit(std::move(ev));
      give_back(true);
      return finish(FinishReason::kStop, stops.push(text.flush()).text + stops.flush());
    }
    auto out = stops.push(text.push(id));
    ev.text = std::move(out.text);
    emit(std::move(ev));
    if (out.stopped) {
      give_back(true);
      return finish(FinishReason::kStop, "");
    }
    const bool forced_done = forced && pending.empty();
    if (usage.completion_tokens >= req.max_tokens || forced_done) {
      auto tail = stops.push(text.flush());
      std::string rest = tail.text + (tail.stopped ? "" : stops.flush());
      give_back(true);
      return finish(forced_done && usage.completion_tokens < req.max_tokens ? FinishReason::kStop
                                                                            : FinishReason::kLength,
                    std::move(rest));
    }
    if (req.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(req.step_delay_ms));
    const int32_t one[1] = {id};
    Status st = model_.forward(*entry.state, one, logits_);
    if (!st) {
      give_back(false);
      return finish(FinishReason::kError, "", st.message());
    }
    entry.tokens.push_back(id);
  }
}

}  // namespace lily
