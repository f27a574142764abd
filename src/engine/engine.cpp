// Engine: see engine.h. The worker loop is the scheduler: admit, drop cancelled, one prefill
// chunk, one batched decode step, repeat. Everything that touches model states or the prefix
// cache runs on the worker thread; submit() and the stats are the only shared parts.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "core/thread_pool.h"
#include "engine/sequence.h"

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
  opts_.max_batch = std::max(1, opts_.max_batch);
  opts_.prefill_chunk = std::max(1, opts_.prefill_chunk);
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
  if (req->shared_prefix_at < opts_.shared_prefix_min || req->shared_prefix_at > int(req->prompt.size()))
    req->shared_prefix_at = -1;  // too short to be worth a cache entry
  {
    std::lock_guard<std::mutex> lk(mu_);
    // max_queue counts requests waiting beyond the free slots: ones the worker is about to admit
    // (submitted together to an idle engine, say) do not fill the waiting room.
    const int free_slots = std::max(0, opts_.max_batch - running_.load());
    if (stopping_ || int(queue_.size()) >= opts_.max_queue + free_slots) return false;
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
    std::vector<std::shared_ptr<GenRequest>> admitted;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !active_.empty(); });
      if (stopping_) break;
      // A request with forks (n > 1) takes a slot per choice.
      size_t slots = active_.size();
      while (!queue_.empty() && (slots == 0 || slots + 1 + queue_.front()->forks.size() <= size_t(opts_.max_batch))) {
        slots += 1 + queue_.front()->forks.size();
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      running_ = int(active_.size() + admitted.size());
    }
    for (auto& r : admitted) {
      auto s = std::make_unique<Sequence>(r, tok_, stop_ids_, stats_);
      if (r->prompt.empty() || int(r->prompt.size()) + std::max(r->max_tokens, 1) > opts_.max_seq + 1)
        s->finish(FinishReason::kError, "", "request does not fit the context");
      active_.push_back(std::move(s));
    }
    step();
    running_ = int(active_.size());
  }
  // Shutting down: whatever is still running ends as cancelled.
  for (auto& s : active_) {
    s->finish(FinishReason::kCancelled);
    retire(*s, true);
  }
  active_.clear();
  running_ = 0;
}

void Engine::step() {
  for (auto& s : active_)
    if (!s->finished() && s->req().cancelled) {
      s->finish(FinishReason::kCancelled);
      retire(*s, true);
    }
  drop_finished();
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  const uint64_t rows0 = stats_.decode_rows;
  const bool prefilled = prefill_some();
  adopt_forks();
  drop_finished();
  const auto t1 = clk::now();
  decode_all();
  adopt_forks();
  drop_finished();
  if (trace_)  // LILY_ENGINE_TRACE=1: one line per step on stderr
    std::fprintf(stderr, "engine step: prefill %.1f ms, decode %llu rows %.1f ms, %zu active\n",
                 std::chrono::duration<double, std::milli>(t1 - t0).count(),
                 (unsigned long long)(stats_.decode_rows - rows0), std::chrono::duration<double, std::milli>(clk::now() - t1).count(),
                 active_.size());
  if (!prefilled) {
    int delay = 0;
    for (auto& s : active_) delay = std::max(delay, s->req().step_delay_ms);
    if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
}

void Engine::drop_finished() {
  active_.erase(std::remove_if(active_.begin(), active_.end(), [](auto& s) { return s->finished(); }), active_.end());
}

void Engine::make_forks(Sequence& s) {
  const std::vector<float> logits = s.take_fork_logits();
  for (auto& f : s.req().forks) {
    auto q = std::make_unique<Sequence>(f, tok_, stop_ids_, stats_);
    std::unique_ptr<SeqState> st = s.has_state() ? s.state().clone() : nullptr;
    if (!st) {
      q->finish(FinishReason::kError, "", "no memory for another choice's state");
      continue;
    }
    CacheEntry e;
    e.state = std::move(st);
    q->attach(std::move(e), int(f->prompt.size()));
    std::vector<float> l = logits;
    if (q->on_logits(l)) forked_.push_back(std::move(q));
    else retire(*q, true);
  }
}

void Engine::adopt_forks() {
  for (size_t i = 0; i < active_.size(); ++i)
    if (active_[i]->fork_ready()) make_forks(*active_[i]);
  for (auto& q : forked_) active_.push_back(std::move(q));
  forked_.clear();
}

void Engine::retire(Sequence& s, bool ok) {
  if (s.fork_ready()) make_forks(s);  // its first token ended it: the forks start from its state first
  if (!s.has_state()) return;
  cache_.put(s.release(ok));
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

bool Engine::prefill_some() {
  using clk = std::chrono::steady_clock;
  bool others_decoding = false;
  for (auto& q : active_) others_decoding |= q->decoding();
  // Oldest request first, one segment each (EngineOptions: segments are fixed by the prompt, never by
  // this budget). While others decode (their inter-token latency is one decode step plus this), the
  // step's first segment always runs and a later one only if its predicted time fits what is left of
  // interleave_ms; otherwise segments until prefill_chunk tokens are used.
  const double time_budget = opts_.interleave_ms * 1e-3;
  double spent = 0;
  size_t used = 0;
  bool did = false;
  for (auto& q : active_) {
    // A request that finished its prompt in this step decodes in it too: the rest is interleaved.
    if (!others_decoding && did)
      for (auto& d : active_)
        if (d->decoding()) {
          others_decoding = true;
          break;
        }
    Sequence* s = q.get();
    if (s->finished() || s->decoding()) continue;
    if (did && !others_decoding && used >= size_t(opts_.prefill_chunk)) break;
    if (!s->has_state()) {
      int n_cached = 0;
      const auto tc = std::chrono::steady_clock::now();
      auto e = checkout(s->req(), n_cached);
      if (trace_)
        std::fprintf(stderr, "engine: checkout %.1f ms (cached %d tokens)\n",
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc).count(), n_cached);
      if (!e) {
        // No memory for another state: wait for a running request to leave, unless none runs.
        if (others_decoding || did) break;
        s->finish(FinishReason::kError, "", e.message());
        continue;
      }
      s->attach(std::move(e).value(), n_cached);
      stats_.prompt_tokens += s->req().prompt.size();
    }
    // A few tokens left (after a snapshot cut, say): fed by decode steps, one a step, beside the
    // others, instead of a forward of their own.
    if (s->prompt_left() <= size_t(std::max(0, opts_.decode_tail)) && !s->snapshot_ahead()) {
      s->feed_tail_in_decode();
      continue;
    }
    auto chunk = s->next_segment(size_t(opts_.prefill_chunk));
    if (did) {  // a later segment of this step: only within the budget
      if (others_decoding && (opts_.interleave_ms <= 0 || !prefill_cost_.known() ||
                              prefill_cost_.predict(chunk.size()) > time_budget - spent))
        break;
      if (!others_decoding && used + chunk.size() > size_t(opts_.prefill_chunk)) break;
    }
    used += chunk.size();
    did = true;
    const bool last = chunk.size() == s->prompt_left();
    std::span<float> out = last ? std::span<float>(logits_.data(), size_t(model_.config().vocab_size)) : std::span<float>();
    const auto t0 = clk::now();
    if (opts_.prefill_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts_.prefill_delay_ms));
    Status st = model_.forward(s->state(), chunk, out);
    const double took = std::chrono::duration<double>(clk::now() - t0).count();
    spent += took;
    if (st) prefill_cost_.add(chunk.size(), took);
    if (trace_)
      std::fprintf(stderr, "engine: prefill chunk %zu tokens %.1f ms (model %.1f ms + %.3f ms/token)\n", chunk.size(),
                   took * 1e3, prefill_cost_.fixed() * 1e3, prefill_cost_.per_token() * 1e3);
    if (!st) {
      s->finish(FinishReason::kError, "", st.message());
      retire(*s, false);
      continue;
    }
    s->fed(chunk);
    // A copy of the state where a later prompt will branch (one per shared head).
    if (auto snap = s->at_snapshot(); snap != Sequence::Snapshot::kNone &&
                                      !(snap == Sequence::Snapshot::kShared && cache_.holds(s->entry().tokens))) {
      CacheEntry c;
      c.tokens = s->entry().tokens;
      c.state = s->state().clone();
      c.key = snap == Sequence::Snapshot::kShared ? std::string() : s->req().cache_key;
      c.shared = snap == Sequence::Snapshot::kShared;
      if (c.state) cache_.put(std::move(c));
    }
    if (last && !s->on_logits(out)) retire(*s, true);
  }
  return did;
}

void Engine::decode_all() {
  std::vector<Sequence*> rows;
  for (auto& s : active_) {
    if (!s->decoding()) continue;
    // Room for this step's token first (a CUDA K/V cache grows here): a row that cannot grow
    // (device memory exhausted) ends with that error alone; the others decode on.
    if (Status r = s->state().reserve(s->state().n_tokens() + 1); !r) {
      spdlog::warn("sequence cannot grow its state: {}", r.message());
      s->finish(FinishReason::kError, "", r.message());
      retire(*s, false);
      continue;
    }
    rows.push_back(s.get());
  }
  if (rows.empty()) return;
  // Rows whose requests need nothing but the raw logits are drawn by the backend where the logits
  // are (a GPU returns a few bytes per row); a step with any other row takes whole logits rows.
  static const bool host_only = [] {
    const char* e = std::getenv("LILY_HOST_SAMPLING");
    return e && *e == '1';
  }();
  static const bool pipeline = [] {
    const char* e = std::getenv("LILY_ENGINE_PIPELINE");
    return !(e && *e == '0');
  }();
  if (pipeline && !host_only && rows.size() == 1 && active_.size() == 1 && rows[0]->pipelinable() &&
      model_.pipelined_draw())
    return decode_pipelined(*rows[0]);
  const size_t V = size_t(model_.config().vocab_size), B = rows.size();
  std::vector<SeqState*> states(B);
  std::vector<int32_t> toks(B);
  std::vector<char> silent(B);  // rows feeding a prompt tail token: nothing drawn, nothing delivered
  for (size_t b = 0; b < B; ++b)
    states[b] = &rows[b]->state(), toks[b] = rows[b]->next_token(), silent[b] = rows[b]->silent_step();
  bool all_drawable = !host_only;
  for (size_t b = 0; b < B && all_drawable; ++b) all_drawable = silent[b] || rows[b]->device_drawable();
  std::vector<GenToken> chosen(B);
  Status st = Status::ok();
  if (all_drawable) {
    std::vector<DrawSpec> spec(B);
    std::vector<Drawn> drawn(B);
    for (size_t b = 0; b < B; ++b) spec[b] = silent[b] ? DrawSpec{} : rows[b]->device_spec();
    st = model_.decode_draw(states, toks, spec, drawn);
    if (st)
      for (size_t b = 0; b < B; ++b)
        if (!silent[b]) chosen[b] = rows[b]->take_drawn(drawn[b]);
  } else {
    if (logits_.size() < B * V) logits_.resize(B * V);
    std::span<float> all(logits_.data(), B * V);
    st = B == 1 ? model_.forward(*states[0], toks, all) : model_.forward_batch(states, toks, all);
    // Sampling reads a whole vocabulary row per sequence: the rows are sampled in parallel (each
    // touches only its own sampler), then delivered in order on this thread.
    auto choose = [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b)
        if (!silent[b]) chosen[b] = rows[b]->choose(all.subspan(b * V, V));
    };
    if (st && B >= 2 && ThreadPool::global().size() > 1) ThreadPool::global().parallel_for(B, 1, choose);
    else if (st) choose(0, B);
  }
  stats_.decode_steps++;
  stats_.decode_rows += B;
  if (!st) {
    spdlog::error("decode step of {} rows failed: {}", B, st.message());
    for (Sequence* s : rows) {
      s->finish(FinishReason::kError, "", st.message());
      retire(*s, false);
    }
    return;
  }
  for (size_t b = 0; b < B; ++b) {
    Sequence* s = rows[b];
    s->fed(std::span<const int32_t>(&toks[b], 1));
    if (!silent[b] && !s->deliver(std::move(chosen[b]))) retire(*s, true);
  }
}

// One request alone, its tokens drawn on the device: step N+1 is launched with the token step N
// drew (still on the device) before the host waits for step N, so the host's work for a token
// (delivery, detokenizing, the HTTP write) overlaps the next step instead of adding to it. Runs
// until the request ends, is cancelled, or another request waits to be admitted; then the step in
// flight is collected and the normal loop resumes. Tokens and seeds are those of decode_all: each
// step takes one uniform from the request's generator, in order.
void Engine::decode_pipelined(Sequence& s) {
  auto fail = [&](const Status& st) {
    spdlog::error("pipelined decode step failed: {}", st.message());
    s.finish(FinishReason::kError, "", st.message());
    retire(s, false);
  };
  int32_t in = s.next_token();  // the input of the oldest step in flight
  if (Status st = model_.launch_draw(s.state(), in, s.device_spec()); !st) return fail(st);
  struct Trace {  // LILY_ENGINE_TRACE=1: one line per pipelined run
    bool on;
    const EngineStats& st;
    uint64_t steps0;
    std::chrono::steady_clock::time_point t0;
    ~Trace() {
      if (!on) return;
      const uint64_t n = st.decode_steps - steps0;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "engine: pipelined %llu steps in %.1f ms (%.3f ms/step)\n", (unsigned long long)n, ms,
                   n ? ms / double(n) : 0.0);
    }
  } trace{trace_, stats_, stats_.decode_steps, std::chrono::steady_clock::now()};
  for (;;) {
    // Launch the next step now if the request may need it. It can still stop at the token in
    // flight: then the extra step's draw is dropped, and its input (that token) stays in the state.
    const bool ahead = s.tokens_left() > 1 && !s.req().cancelled && queue_depth() == 0 && s.pipelinable();
    Status launched = ahead ? model_.launch_draw(s.state(), -1, s.device_spec()) : Status::ok();
    Drawn d;
    Status st = model_.collect_draw(d);
    stats_.decode_steps++;
    stats_.decode_rows++;
    if (!st || !launched) {
      Drawn extra;
      if (ahead && launched) (void)model_.collect_draw(extra);  // leave nothing in flight
      return fail(st ? launched : st);
    }
    s.fed(std::span<const int32_t>(&in, 1));
    const bool alive = s.deliver(s.take_drawn(d));
    if (!ahead) {
      if (!alive) retire(s, true);
      return;
    }
    in = d.id;  // what the step launched ahead fed
    if (!alive) {
      Drawn extra;
      Status last = model_.collect_draw(extra);
      if (last) s.fed(std::span<const int32_t>(&in, 1));  // the state holds it: keep the cache entry true
      retire(s, last.is_ok());
      return;
    }
  }
}

}  // namespace lily
