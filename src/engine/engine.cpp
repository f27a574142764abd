// Engine: see engine.h. The worker loop is the scheduler: admit, drop cancelled, plan the step's
// prompt segments and decode rows, run them as one Model::step, repeat. Everything that touches model states or the prefix
// cache runs on the worker thread; submit() and the stats are the only shared parts.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
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
  smem_ = model.state_memory(opts_.max_seq);
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
    const int free_slots = mem_blocked_ ? 0 : std::max(0, opts_.max_batch - running_.load());
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
    std::vector<char> too_big;  // needs more state memory than the whole budget
    std::vector<std::unique_ptr<SeqState>> freed;  // evicted for room: freed after the lock (a GPU free synchronises)
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !active_.empty(); });
      if (stopping_) break;
      // A request with forks (n > 1) takes a slot per choice, and memory for each choice's state.
      size_t slots = active_.size(), pending = 0;
      std::vector<uint64_t> kept;  // cached states this round's admitted requests continue from
      bool blocked = false;
      while (!queue_.empty() && (slots == 0 || slots + 1 + queue_.front()->forks.size() <= size_t(opts_.max_batch))) {
        // (A request cancelled while it waited needs nothing: the step drops it at once.)
        const GenRequest& head = *queue_.front();
        const size_t need = opts_.memory_budget_bytes > 0 && !head.cancelled ? projected_bytes(head) : 0;
        bool big = false;
        size_t reused = 0;
        if (need > 0 && !make_room(pending + need, &freed, &head, &kept, &reused)) {
          if (!active_.empty() || !admitted.empty()) {  // running requests will leave and free theirs
            blocked = true;
            if (waited_ != queue_.front()) waited_ = queue_.front(), stats_.memory_waits++;
            break;
          }
          big = true;
        }
        if (!big) pending += need - reused;
        slots += 1 + queue_.front()->forks.size();
        too_big.push_back(big);
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (!blocked) waited_.reset();
      mem_blocked_ = blocked;
      running_ = int(active_.size() + admitted.size());
    }
    freed.clear();
    for (size_t i = 0; i < admitted.size(); ++i) {
      auto& r = admitted[i];
      auto s = std::make_unique<Sequence>(r, tok_, stop_ids_, stats_);
      if (r->prompt.empty() || int(r->prompt.size()) + std::max(r->max_tokens, 1) > opts_.max_seq + 1) {
        s->finish(FinishReason::kError, "", "request does not fit the context");
      } else if (too_big[i]) {
        stats_.state_failures++;
        s->finish(FinishReason::kError, "",
                  fmt::format("the request's states need {} bytes; the memory budget is {}", projected_bytes(*r),
                              opts_.memory_budget_bytes),
                  true);
      } else if (opts_.memory_budget_bytes > 0 && !r->cancelled) {
        s->mem_own = bytes_of(*r);
        for (auto& f : r->forks) s->mem_forks += bytes_of(*f);
      }
      active_.push_back(std::move(s));
    }
    publish_memory();
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

size_t Engine::bytes_of(const GenRequest& r) const {
  const int n = std::min(opts_.max_seq, int(r.prompt.size()) + std::max(r.max_tokens, 1));
  return smem_.bytes_for(n, opts_.max_seq);
}

size_t Engine::projected_bytes(const GenRequest& r) const {
  size_t b = bytes_of(r);
  for (const auto& f : r.forks) b += bytes_of(*f);
  return b;
}

size_t Engine::running_bytes(bool reserved) const {
  size_t b = 0;
  auto add = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished()) return;  // its state has gone back (or never came)
    const size_t held = s->has_state() ? s->entry().state->bytes() : 0;
    b += reserved ? std::max(s->mem_own, held) + s->mem_forks : held;
  };
  for (const auto& s : active_) add(s);
  for (const auto& s : forked_) add(s);
  return b;
}

size_t Engine::idle_bytes() const {
  size_t b = cache_.bytes();
  for (const auto& st : spare_) b += st->bytes();
  return b;
}

bool Engine::drop_one_idle(std::vector<std::unique_ptr<SeqState>>* freed, std::span<const uint64_t> keep) {
  std::unique_ptr<SeqState> st;
  if (!spare_.empty()) {
    st = std::move(spare_.back());
    spare_.pop_back();
  } else if (auto e = cache_.take_lru(keep)) {
    st = std::move(e->state);
  } else {
    return false;
  }
  if (freed) freed->push_back(std::move(st));
  return true;
}

bool Engine::make_room(size_t need, std::vector<std::unique_ptr<SeqState>>* freed, const GenRequest* for_req,
                       std::vector<uint64_t>* kept, size_t* reused) {
  if (reused) *reused = 0;
  const size_t budget = opts_.memory_budget_bytes;
  if (budget == 0) return true;
  const size_t running = running_bytes(true);
  std::vector<uint64_t> keep = kept ? *kept : std::vector<uint64_t>();
  // The entry the request continues from (a shared head is copied, not taken: no credit, but kept).
  // (No credit for an entry an earlier admission of this round continues from: it takes the state.)
  const CacheEntry* e = for_req ? cache_.peek(for_req->prompt, for_req->cache_key) : nullptr;
  if (e && std::find(keep.begin(), keep.end(), e->id) != keep.end()) e = nullptr;
  if (e) {
    const size_t own = e->shared ? 0 : std::min({need, projected_bytes(*for_req), e->state->bytes()});
    keep.push_back(e->id);
    bool fits = true;
    while (fits && running + idle_bytes() + need - own > budget) fits = drop_one_idle(freed, keep);
    if (fits) {
      if (kept) kept->push_back(keep.back());
      if (reused) *reused = own;
      return true;
    }
    keep.pop_back();
  }
  while (running + idle_bytes() + need > budget)
    if (!drop_one_idle(freed, keep)) return false;
  return true;
}

Status Engine::grow(Sequence& s, int n_tokens) {
  SeqState& st = s.state();
  const int upto = std::min(st.max_seq(), std::max(n_tokens, s.max_positions()));
  for (;;) {
    Status r = st.reserve(n_tokens, upto);
    // Out of memory: what the prefix cache and the spare states hold goes first (a later
    // request may miss the cache; this one would fail).
    if (r || n_tokens > st.max_seq() || !drop_one_idle(nullptr)) return r;
  }
}

void Engine::fail_memory(Sequence& s, const std::string& why) {
  spdlog::warn("a request's state cannot get its memory: {}", why);
  stats_.state_failures++;
  s.finish(FinishReason::kError, "", why, true);
  retire(s, false);
}

void Engine::publish_memory() {
  stats_.mem_reserved = running_bytes(true);
  stats_.mem_running = running_bytes(false);
  stats_.mem_cached = cache_.bytes();
  size_t spare = 0;
  for (const auto& st : spare_) spare += st->bytes();
  stats_.mem_spare = spare;
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
  const std::vector<Segment> segs = plan_segments();
  drop_finished();
  const std::vector<Sequence*> rows = decode_rows();
  const auto t_plan = clk::now();
  step_ms_ = {};
  size_t seg_tokens = 0;
  for (const Segment& g : segs) seg_tokens += g.tokens.size();
  // A lone request keeps two steps in flight unless its next step should verify drafts (a verify
  // step's next feed depends on what it accepted).
  const bool lone = segs.empty() && rows.size() == 1 && active_.size() == 1;
  const std::vector<int32_t> lone_drafts = lone ? drafts_of(*rows[0]) : std::vector<int32_t>{};
  const bool piped = lone && rows[0]->pipelinable() && model_.pipelines() && !wants_verify(*rows[0], lone_drafts);
  if (piped)
    decode_pipelined(*rows[0]);
  else if (!segs.empty() || !rows.empty())
    run_step(segs, rows, lone ? &lone_drafts : nullptr);
  adopt_forks();
  drop_finished();
  publish_memory();
  // LILY_ENGINE_TRACE=1: one line per step on stderr (a lone request's pipelined run of batch-1 steps is
  // one line of its own kind, so that the slowest "steps" are steps).
  const double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
  if (trace_ && piped)
    std::fprintf(stderr, "engine pipelined run: %llu batch-1 steps, %.1f ms, %zu active\n",
                 (unsigned long long)(stats_.decode_rows - rows0), ms, active_.size());
  else if (trace_) {
    const double plan = std::chrono::duration<double, std::milli>(t_plan - t0).count();
    const StepTimes& h = step_ms_;
    std::fprintf(stderr,
                 "engine step: %zu segments (%zu tokens), %llu decode rows, %.1f ms, %zu active; host ms: plan %.2f, feeds "
                 "%.2f, segments %.2f, rows %.2f, after %.2f\n",
                 segs.size(), seg_tokens, (unsigned long long)(stats_.decode_rows - rows0), ms, active_.size(), plan, h.feeds,
                 h.segs, h.rows, ms - plan - h.feeds - h.model - h.segs - h.rows);
  }
  if (segs.empty()) {
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
    if (opts_.memory_budget_bytes > 0) {  // its share of what s set aside
      q->mem_own = std::min(s.mem_forks, bytes_of(*f));
      s.mem_forks -= q->mem_own;
    }
    std::unique_ptr<SeqState> st;
    while (s.has_state() && !(st = s.state().clone()) && drop_one_idle(nullptr)) {
    }
    if (!st) {
      stats_.state_failures++;
      q->finish(FinishReason::kError, "", "no memory for another choice's state", true);
      continue;
    }
    CacheEntry e;
    e.state = std::move(st);
    q->attach(std::move(e), int(f->prompt.size()));
    std::vector<float> l = logits;
    if (q->on_logits(l)) forked_.push_back(std::move(q));
    else retire(*q, true);
  }
  s.mem_forks = 0;
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
  cache_put(s.release(ok));
}

void Engine::cache_put(CacheEntry e) {
  for (auto& st : cache_.put(std::move(e)))
    if (st && spare_.size() < size_t(opts_.max_batch)) spare_.push_back(std::move(st));
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
  if (!spare_.empty()) {  // a state the cache let go
    e.state = std::move(spare_.back());
    spare_.pop_back();
    e.state->reset();
    return e;
  }
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

std::vector<Engine::Segment> Engine::plan_segments() {
  // Oldest request first, one segment each (EngineOptions: segments are fixed by the prompt, never by
  // this budget): the step's first segment always, a later one while the step's prompt tokens stay
  // within step_tokens (long_step_tokens after a first segment longer than step_tokens).
  std::vector<Segment> segs;
  size_t used = 0;
  const size_t step = size_t(std::max(1, opts_.step_tokens));
  size_t budget = step;
  for (auto& q : active_) {
    Sequence* s = q.get();
    using Phase = Sequence::Phase;
    if (s->phase() != Phase::kWaiting && s->phase() != Phase::kPrefill) continue;
    if (s->phase() == Phase::kWaiting) {
      int n_cached = 0;
      const auto tc = std::chrono::steady_clock::now();
      auto e = checkout(s->req(), n_cached);
      if (trace_)
        std::fprintf(stderr, "engine: checkout %.1f ms (cached %d tokens)\n",
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc).count(), n_cached);
      if (!e) {
        // No memory for another state: wait for a running request to leave, unless none runs.
        bool others = !segs.empty();
        for (auto& d : active_) others |= d->has_state() && !d->finished();
        if (others) break;
        stats_.state_failures++;
        s->finish(FinishReason::kError, "", e.message(), true);
        continue;
      }
      s->attach(std::move(e).value(), n_cached);
      stats_.prompt_tokens += s->req().prompt.size();
    }
    // A few tokens left (after a snapshot cut, say): fed by decode steps, one a step, beside the
    // others, instead of a segment of their own.
    if (s->prompt_left() <= size_t(std::max(0, opts_.decode_tail)) && !s->snapshot_ahead()) {
      s->feed_tail_in_decode();
      continue;
    }
    auto chunk = s->next_segment(size_t(opts_.prefill_chunk));
    // After a long first segment (over step_tokens), only long ones join, within long_step_tokens.
    if (!segs.empty() && (used + chunk.size() > budget || (budget > step && chunk.size() <= step))) break;
    // Room for the segment (a K/V cache grows here, to the request's projection): a request whose
    // state cannot grow ends alone; the others go on.
    if (Status g = grow(*s, s->state().n_tokens() + int(chunk.size())); !g) {
      fail_memory(*s, g.message());
      continue;
    }
    if (segs.empty() && chunk.size() > step) budget = std::max(step, size_t(std::max(0, opts_.long_step_tokens)));
    used += chunk.size();
    segs.push_back({s, chunk, chunk.size() == s->prompt_left()});
  }
  return segs;
}

std::vector<Sequence*> Engine::decode_rows() {
  std::vector<Sequence*> rows;
  for (auto& s : active_) {
    if (!s->decoding()) continue;
    // Room for this step's token first (a K/V cache grows here, to the request's projection): a
    // row that cannot grow (memory exhausted) ends with that error alone; the others decode on.
    if (Status r = grow(*s, s->state().n_tokens() + 1); !r) {
      fail_memory(*s, r.message());
      continue;
    }
    rows.push_back(s.get());
  }
  return rows;
}

void Engine::run_step(const std::vector<Segment>& segs, const std::vector<Sequence*>& rows,
                      const std::vector<int32_t>* drafts0) {
  using clk = std::chrono::steady_clock;
  const auto tr0 = clk::now();
  auto ms_since = [](clk::time_point a) { return std::chrono::duration<double, std::milli>(clk::now() - a).count(); };
  const size_t V = size_t(model_.config().vocab_size), B = rows.size(), S = segs.size();
  // Rows whose requests need nothing but the raw logits are drawn by the backend where the logits
  // are (a GPU returns a few bytes per row); a step with any other row takes whole logits rows.
  // A row that speculates (EngineOptions::spec_draft) feeds its token and its drafts, and gets an
  // output for each: row b's outputs are out0[b] .. out0[b] + in[b].size() - 1.
  std::vector<std::vector<int32_t>> in(B);
  std::vector<char> silent(B);  // rows feeding a prompt tail token: nothing drawn, nothing delivered
  std::vector<int> pos0(B);     // each row's position before the step (a rewind's base)
  std::vector<int32_t> shadow(B, -1);  // the first of drafts not fed: checked against the token drawn
  const bool spec = opts_.spec_draft > 0 && model_.speculates();
  const double row_cost = spec_row_cost(), step_cost = spec_step_cost();
  int verify_left = spec ? model_.spec_max_feeds() : 0;  // verify feeds the step may still take
  for (size_t b = 0; b < B; ++b) {
    Sequence* s = rows[b];
    in[b] = {s->next_token()}, silent[b] = s->silent_step(), pos0[b] = s->state().n_tokens();
    if (!spec || silent[b] || !s->speculable() || verify_left == 0) continue;
    std::vector<int32_t> d = b == 0 && drafts0 ? *drafts0 : drafts_of(*s);
    if (d.empty()) continue;
    const int32_t first_draft = d[0];
    d.resize(size_t(s->spec_len(int(d.size()), row_cost, step_cost)));
    if (d.empty()) {
      shadow[b] = first_draft;
      continue;
    }
    // Room for them within the request's projection (drafts stop before its last token); none if the
    // state cannot grow now.
    if (!grow(*s, pos0[b] + 1 + int(d.size()))) continue;
    in[b].insert(in[b].end(), d.begin(), d.end());
    --verify_left;
    stats_.spec_rows++, stats_.spec_drafted += d.size();
  }
  bool all_drawable = true;
  for (size_t b = 0; b < B && all_drawable; ++b) all_drawable = silent[b] || rows[b]->device_drawable();
  std::vector<size_t> out0(B);
  size_t n_out = 0;
  for (size_t b = 0; b < B; ++b) out0[b] = n_out, n_out += in[b].size();
  size_t n_logits = all_drawable ? 0 : n_out;
  // A segment that ends its prompt: its first reply token drawn by the backend where the logits are when
  // the request allows (as a decode row's: the mixed CUDA step draws it on the device instead of sending
  // a vocabulary row to the host to sample), else its logits row to the host.
  std::vector<size_t> seg_row(S, SIZE_MAX);  // logits row of a segment that ends its prompt (not drawn)
  std::vector<DrawSpec> seg_spec(S);
  std::vector<Drawn> seg_drawn(S);
  std::vector<char> seg_draws(S, 0);
  for (size_t i = 0; i < S; ++i) {
    if (!segs[i].last) continue;
    if ((seg_draws[i] = segs[i].seq->device_drawable())) seg_spec[i] = segs[i].seq->device_spec();
    else seg_row[i] = n_logits++;
  }
  if (logits_.size() < n_logits * V) logits_.resize(n_logits * V);
  std::vector<DrawSpec> spec_of(B);
  std::vector<Drawn> drawn(n_out);
  std::vector<StepFeed> feeds;
  feeds.reserve(S + B);
  for (size_t i = 0; i < S; ++i) {
    StepFeed f;
    f.state = &segs[i].seq->state(), f.tokens = segs[i].tokens;
    if (seg_draws[i]) f.draw = &seg_spec[i], f.drawn = &seg_drawn[i];
    else if (segs[i].last) f.logits = logits_.data() + seg_row[i] * V;
    feeds.push_back(f);
  }
  for (size_t b = 0; b < B; ++b) {
    StepFeed f;
    f.state = &rows[b]->state(), f.tokens = in[b];
    f.outputs = int(in[b].size()), f.rewindable = in[b].size() > 1;
    if (!all_drawable) {
      f.logits = logits_.data() + out0[b] * V;
    } else if (!silent[b]) {
      spec_of[b] = rows[b]->device_spec();  // greedy and unpenalised where it speculates: one spec for every output
      f.draw = &spec_of[b], f.drawn = &drawn[out0[b]];
    }
    feeds.push_back(f);
  }
  const auto t0 = clk::now();
  step_ms_.feeds = ms_since(tr0);
  if (opts_.prefill_delay_ms > 0 && S > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts_.prefill_delay_ms * int(S)));
  Status st = model_.step(feeds);
  step_ms_.model = ms_since(t0);
  if (trace_ && S > 0) std::fprintf(stderr, "engine: step of %zu segments + %zu rows %.1f ms\n", S, B, step_ms_.model);
  const auto t_segs = clk::now();
  if (B > 0) stats_.decode_steps++, stats_.decode_rows += B;
  if (!st) {
    spdlog::error("step of {} segments and {} rows failed: {}", S, B, st.message());
    for (const Segment& g : segs) {
      g.seq->finish(FinishReason::kError, "", st.message());
      retire(*g.seq, false);
    }
    for (Sequence* s : rows) {
      s->finish(FinishReason::kError, "", st.message());
      retire(*s, false);
    }
    return;
  }
  // Segments: fed; a copy of the state where a later prompt will branch; the first reply token.
  for (size_t i = 0; i < S; ++i) {
    Sequence* s = segs[i].seq;
    s->fed(segs[i].tokens);
    if (auto snap = s->at_snapshot(); snap != Sequence::Snapshot::kNone &&
                                      !(snap == Sequence::Snapshot::kShared && cache_.holds(s->entry().tokens))) {
      CacheEntry c;
      c.tokens = s->entry().tokens;
      // Only when it fits the memory budget (after older cached states): a snapshot is an optimisation.
      const auto tc = clk::now();
      if (make_room(smem_.clone_bytes(s->state().n_tokens(), opts_.max_seq))) c.state = s->state().clone();
      if (trace_)
        std::fprintf(stderr, "engine: snapshot of %d tokens %.1f ms\n", s->state().n_tokens(),
                     std::chrono::duration<double, std::milli>(clk::now() - tc).count());
      c.key = snap == Sequence::Snapshot::kShared ? std::string() : s->req().cache_key;
      c.shared = snap == Sequence::Snapshot::kShared;
      if (c.state) cache_put(std::move(c));
    }
    if (!segs[i].last) continue;
    GenToken t = seg_draws[i] ? s->take_drawn(seg_drawn[i]) : s->choose(std::span<float>(logits_.data() + seg_row[i] * V, V));
    if (!s->deliver(std::move(t))) retire(*s, true);
  }
  step_ms_.segs = ms_since(t_segs);
  const auto t_rows = clk::now();
  // Decode rows. Sampling reads a whole vocabulary row per sequence: host rows' first outputs are
  // sampled in parallel (each touches only its own sampler), then delivered in order on this thread.
  auto take = [&](size_t b, size_t o) {
    return all_drawable ? rows[b]->take_drawn(drawn[out0[b] + o])
                        : rows[b]->choose(std::span<float>(logits_.data() + (out0[b] + o) * V, V));
  };
  std::vector<GenToken> first(B);
  if (all_drawable) {
    for (size_t b = 0; b < B; ++b)
      if (!silent[b]) first[b] = take(b, 0);
  } else {
    auto choose = [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b)
        if (!silent[b]) first[b] = take(b, 0);
    };
    if (B >= 2 && ThreadPool::global().size() > 1) ThreadPool::global().parallel_for(B, 1, choose);
    else choose(0, B);
  }
  for (size_t b = 0; b < B; ++b) {
    Sequence* s = rows[b];
    if (silent[b]) {
      s->fed(std::span<const int32_t>(&in[b][0], 1));
      continue;
    }
    // Output o is the token after in[b][o]: delivered while each draft matches what was drawn before
    // it (so every delivered token is the one plain decoding draws), up to the first mismatch, which
    // is delivered too and becomes the next token. The state keeps the fed tokens that were verified.
    size_t o = 0;
    bool alive = true, missed = false;
    for (GenToken t = std::move(first[b]);; t = take(b, o)) {
      const int32_t id = t.id;
      if (o == 0 && shadow[b] >= 0) s->spec_observe(id == shadow[b] ? 1 : 0, id != shadow[b]);
      s->fed(std::span<const int32_t>(&in[b][o], 1));
      alive = s->deliver(std::move(t));
      if (!alive || o + 1 == in[b].size()) break;
      if ((missed = id != in[b][o + 1])) break;
      ++o;
      stats_.spec_accepted++;  // counted before the next token's event, so a reply's last event sees every count
    }
    if (in[b].size() > 1) {
      s->spec_observe(int(o), missed);
      if (o + 1 < in[b].size())
        if (Status r = model_.rewind(s->state(), pos0[b] + int(o) + 1); !r) {
          spdlog::error("rewinding a verify step failed: {}", r.message());
          if (alive) s->finish(FinishReason::kError, "", r.message());
          retire(*s, false);
          continue;
        }
    }
    if (!alive) retire(*s, true);
  }
  step_ms_.rows = ms_since(t_rows);
}

// One request alone, its tokens drawn on the device: step N+1 is launched with the token step N
// drew (still on the device) before the host waits for step N, so the host's work for a token
// (delivery, detokenizing, the HTTP write) overlaps the next step instead of adding to it. Runs
// until the request ends, is cancelled, or another request waits to be admitted; then the step in
// flight is collected and the normal loop resumes. Tokens and seeds are those of decode_all: each
// step takes one uniform from the request's generator, in order.
std::vector<int32_t> Engine::drafts_of(Sequence& s) const {
  if (opts_.spec_draft <= 0 || !model_.speculates() || !s.speculable()) return {};
  const int max_len = std::min(opts_.spec_draft, s.tokens_left() - 1);
  if (max_len <= 0) return {};
  std::vector<int32_t> d = opts_.spec_drafter ? opts_.spec_drafter(s.entry().tokens, s.next_token(), max_len)
                                              : s.draft(max_len, opts_.spec_ngram);
  if (d.size() > size_t(max_len)) d.resize(size_t(max_len));
  return d;
}
double Engine::spec_row_cost() const { return opts_.spec_row_cost > 0 ? opts_.spec_row_cost : model_.spec_row_cost(); }
double Engine::spec_step_cost() const { return opts_.spec_step_cost >= 0 ? opts_.spec_step_cost : model_.spec_step_cost(); }
bool Engine::wants_verify(Sequence& s, const std::vector<int32_t>& d) const {
  return !d.empty() && s.spec_len(int(d.size()), spec_row_cost(), spec_step_cost()) > 0;
}

void Engine::decode_pipelined(Sequence& s) {
  bool oom = false;  // the state could not grow
  auto fail = [&](const Status& st) {
    if (oom) return fail_memory(s, st.message());
    spdlog::error("pipelined decode step failed: {}", st.message());
    s.finish(FinishReason::kError, "", st.message());
    retire(s, false);
  };
  // Room for the launched step's token (a K/V cache grows here, to the request's projection), then the
  // launch.
  DrawPipeline steps(model_, s.state());
  auto launch = [&](int32_t token) -> Status {
    if (Status g = grow(s, s.state().n_tokens() + 1); !g) {
      oom = true;
      return g;
    }
    return steps.launch(token, s.device_spec());
  };
  auto collect = [&](Drawn& d) { return steps.collect(d); };
  int32_t in = s.next_token();  // the input of the oldest step in flight
  if (Status st = launch(in); !st) return fail(st);
  // Speculative decoding (EngineOptions::spec_draft): after each token, the drafts that would follow the
  // token in flight; their first is checked against what that step draws (the request's acceptance
  // estimate), and once verifying them pays, no step is launched ahead: the next one verifies (run_step).
  int32_t shadow = -1;
  bool verify_next = false;
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
    // A queue that waits for memory waits for this request to end: no reason to stop.
    const bool ahead = s.tokens_left() > 1 && !s.req().cancelled && (queue_depth() == 0 || mem_blocked_) && s.pipelinable() &&
                       !verify_next;
    Status launched_ok = ahead ? launch(kDrawnToken) : Status::ok();
    Drawn d;
    Status st = collect(d);
    stats_.decode_steps++;
    stats_.decode_rows++;
    if (!st || !launched_ok) {
      Drawn extra;
      if (ahead && launched_ok) (void)collect(extra);  // leave nothing in flight
      return fail(st ? launched_ok : st);
    }
    s.fed(std::span<const int32_t>(&in, 1));
    if (shadow >= 0) s.spec_observe(d.id == shadow ? 1 : 0, d.id != shadow), shadow = -1;
    const bool alive = s.deliver(s.take_drawn(d));
    if (!ahead) {
      if (!alive) retire(s, true);
      return;
    }
    in = d.id;  // what the step launched ahead fed
    if (!alive) {
      Drawn extra;
      Status last = collect(extra);
      if (last) s.fed(std::span<const int32_t>(&in, 1));  // the state holds it: keep the cache entry true
      retire(s, last.is_ok());
      return;
    }
    if (const std::vector<int32_t> dr = drafts_of(s); !dr.empty()) {
      shadow = dr[0];
      verify_next = s.spec_len(int(dr.size()), spec_row_cost(), spec_step_cost()) > 0;
    }
  }
}

}  // namespace lily
