// Model: checkpoint → weight views → backend. The forward pass itself lives in the backend
// (cpu: src/backend/cpu/cpu_backend.cpp, the reference; cuda: src/backend/cuda/).
#include <algorithm>
#include "model/model.h"

#include <spdlog/spdlog.h>

#include "backend/backend.h"
#include "backend/cpu/fast_backend.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/logits.h"
#include "model/weights.h"

#include <chrono>

namespace lily {

struct Model::Impl {
  std::unique_ptr<Checkpoint> ckpt;  // (none for Model::over)
  ModelWeights weights;
  ModelConfig cfg;
  std::string dir;
  std::unique_ptr<Backend> backend;
};

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelOptions& opts) {
  auto impl = std::make_unique<Impl>();
  LILY_ASSIGN_OR_RETURN(impl->ckpt, Checkpoint::open(dir));
  LILY_ASSIGN_OR_RETURN(impl->weights, ModelWeights::from_checkpoint(*impl->ckpt));
  impl->cfg = impl->weights.cfg;
  impl->dir = impl->ckpt->dir();
  if (opts.threads > 0) ThreadPool::set_global_threads(opts.threads);
  if (opts.backend == "cpu") {  // the fast kernels (src/backend/cpu/fast_*)
    LILY_ASSIGN_OR_RETURN(impl->backend, make_fast_cpu_backend(impl->weights, opts.cpu_state_limit_bytes));
  } else if (opts.backend == "cpu-ref") {  // the scalar reference the tests trust
    LILY_ASSIGN_OR_RETURN(impl->backend, make_cpu_backend(impl->weights, opts.cpu_state_limit_bytes));
  } else if (opts.backend == "cuda") {
    LILY_ASSIGN_OR_RETURN(impl->backend, make_cuda_backend(impl->weights, opts.verbose));
  } else {
    return errorf("unknown backend '{}' (expected cpu, cpu-ref or cuda)", opts.backend);
  }
  std::unique_ptr<Model> m(new Model());
  m->impl_ = std::move(impl);
  return m;
}

std::unique_ptr<Model> Model::over(const ModelConfig& cfg, std::unique_ptr<Backend> backend, std::string dir) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->dir = std::move(dir);
  impl->backend = std::move(backend);
  std::unique_ptr<Model> m(new Model());
  m->impl_ = std::move(impl);
  return m;
}

const ModelConfig& Model::config() const { return impl_->cfg; }
const std::string& Model::dir() const { return impl_->dir; }
const char* Model::backend_name() const { return impl_->backend->name(); }

Result<std::unique_ptr<SeqState>> Model::new_state(int max_seq) { return impl_->backend->new_state(max_seq); }
StateMemory Model::state_memory(int max_seq) const { return impl_->backend->state_memory(max_seq); }
Result<DeviceMemory> Model::device_memory() { return impl_->backend->device_memory(); }
bool Model::pipelines() const { return impl_->backend->pipelines(); }
bool Model::speculates() const { return impl_->backend->speculates(); }
double Model::spec_row_cost() const { return impl_->backend->spec_row_cost(); }
double Model::spec_step_cost() const { return impl_->backend->spec_step_cost(); }
int Model::spec_max_feeds() const { return impl_->backend->spec_max_feeds(); }
Status Model::rewind(SeqState& state, int n_tokens) {
  if (n_tokens < 0 || n_tokens > state.n_tokens())
    return errorf("rewind: to {} tokens, the state holds {}", n_tokens, state.n_tokens());
  if (n_tokens == state.n_tokens()) return Status::ok();
  return impl_->backend->rewind(state, n_tokens);
}
int Model::default_prefill_chunk() const { return impl_->backend->default_prefill_chunk(); }
int Model::default_long_step_tokens() const { return impl_->backend->default_long_step_tokens(); }
Status Model::wait(StepTicket ticket) { return impl_->backend->wait(ticket); }
double Model::copy_bandwidth_gbps() { return impl_->backend->copy_bandwidth_gbps(); }
std::string Model::hardware() const { return impl_->backend->hardware(); }
Status Model::profile_decode(SeqState& state) { return impl_->backend->profile_decode(state); }

Status Model::prepare(int max_rows, int step_tokens) {
  if (max_rows < 1 || step_tokens < 0) return errorf("prepare: {} rows, {} step tokens", max_rows, step_tokens);
  return impl_->backend->prepare(max_rows, step_tokens);
}

// A draw spec a backend can take: a temperature's inverse ≥ 0, a uniform in [0, 1), at most kMaxDrawTop
// alternatives.
static bool spec_ok(const DrawSpec& d) {
  return d.inv_t >= 0.0f && d.u >= 0.0 && d.u < 1.0 && d.top_logprobs <= kMaxDrawTop;
}

Result<StepTicket> Model::launch(std::span<const StepFeed> feeds) {
  const int V = config().vocab_size;
  if (feeds.empty()) return errorf("launch: no feeds");
  for (size_t i = 0; i < feeds.size(); ++i) {
    const StepFeed& f = feeds[i];
    if (!f.state || f.tokens.empty()) return errorf("launch: feed {} has no state or no tokens", i);
    if (f.draw && (!f.drawn || f.logits)) return errorf("launch: feed {} asks for a draw without a Drawn, or for logits too", i);
    if (f.drawn && !f.draw) return errorf("launch: feed {} has a Drawn but no draw spec", i);
    if (f.outputs < 1 || size_t(f.outputs) > f.tokens.size())
      return errorf("launch: feed {} asks for {} outputs of {} tokens", i, f.outputs, f.tokens.size());
    if ((f.outputs > 1 || f.rewindable) && !speculates())
      return errorf("launch: feed {} is a verify feed (outputs {}, rewindable {}); backend {} does not speculate", i,
                    f.outputs, f.rewindable, backend_name());
    if (f.draw && !spec_ok(*f.draw))
      return errorf("launch: feed {} has a bad draw spec (inv_t {}, u {}, top_logprobs {})", i, f.draw->inv_t, f.draw->u,
                    f.draw->top_logprobs);
    for (int32_t t : f.tokens) {
      if (t == kDrawnToken && feeds.size() == 1 && f.tokens.size() == 1 && f.draw && pipelines()) continue;
      if (t < 0 || t >= V)
        return errorf("launch: feed {} has token {} outside the vocabulary{}", i, t,
                      t == kDrawnToken ? " (kDrawnToken: only a lone drawn one-token feed, where the backend pipelines)" : "");
    }
    for (size_t j = 0; j < i; ++j)
      if (feeds[j].state == f.state) return errorf("launch: feeds {} and {} share one state", j, i);
  }
  const auto n_verify = std::count_if(feeds.begin(), feeds.end(), [](const StepFeed& f) { return f.outputs > 1 || f.rewindable; });
  if (n_verify > spec_max_feeds())
    return errorf("launch: {} verify feeds; backend {} takes at most {} a step", n_verify, backend_name(), spec_max_feeds());
  for (const StepFeed& f : feeds) LILY_TRY(f.state->reserve(f.state->n_tokens() + int(f.tokens.size())));
  return impl_->backend->launch(feeds);
}

Status Model::step(std::span<const StepFeed> feeds) {
  LILY_ASSIGN_OR_RETURN(StepTicket t, launch(feeds));
  return wait(t);
}

Status Model::forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) {
  if (!logits.empty() && logits.size() != size_t(config().vocab_size))
    return errorf("forward: logits must hold {} entries, not {}", config().vocab_size, logits.size());
  StepFeed f;
  f.state = &state, f.tokens = tokens, f.logits = logits.empty() ? nullptr : logits.data();
  return step(std::span<const StepFeed>(&f, 1));
}

Status Model::forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                            std::span<float> logits) {
  const size_t B = states.size(), V = size_t(config().vocab_size);
  if (tokens.size() != B) return errorf("forward_batch: {} states but {} tokens", B, tokens.size());
  if (logits.size() != B * V) return errorf("forward_batch: logits must hold {} rows of {}", B, V);
  if (B == 0) return Status::ok();
  std::vector<StepFeed> feeds(B);
  for (size_t b = 0; b < B; ++b)
    feeds[b].state = states[b], feeds[b].tokens = tokens.subspan(b, 1), feeds[b].logits = logits.data() + b * V;
  return step(feeds);
}

Status Model::decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                          std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const size_t B = states.size();
  if (tokens.size() != B || spec.size() != B || out.size() != B)
    return errorf("decode_draw: {} states, {} tokens, {} specs, {} outputs", B, tokens.size(), spec.size(), out.size());
  if (B == 0) return Status::ok();
  std::vector<StepFeed> feeds(B);
  for (size_t b = 0; b < B; ++b)
    feeds[b].state = states[b], feeds[b].tokens = tokens.subspan(b, 1), feeds[b].draw = &spec[b], feeds[b].drawn = &out[b];
  return step(feeds);
}

Status DrawPipeline::launch(int32_t token, const DrawSpec& spec) {
  if (in_flight() >= 2) return errorf("DrawPipeline: two steps are already in flight");
  const int k = int(launched_ % 2);
  StepFeed f;
  f.state = &state_, f.tokens = std::span<const int32_t>(&token, 1), f.draw = &spec, f.drawn = &slot_[k];
  LILY_ASSIGN_OR_RETURN(ticket_[k], model_.launch(std::span<const StepFeed>(&f, 1)));
  ++launched_;
  return Status::ok();
}

Status DrawPipeline::collect(Drawn& out) {
  if (in_flight() == 0) return errorf("DrawPipeline: no step in flight");
  const int k = int(collected_++ % 2);  // a failed step is not collected twice
  LILY_TRY(model_.wait(ticket_[k]));
  out = slot_[k];
  return Status::ok();
}

Status Model::decode_greedy(SeqState& state, int32_t first, int n_steps, std::vector<int32_t>& out,
                            std::vector<double>* avail_s) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  out.clear();
  if (avail_s) avail_s->clear();
  if (n_steps <= 0) return Status::ok();
  if (first < 0 || first >= config().vocab_size) return errorf("decode_greedy: token {} outside the vocabulary", first);
  const DrawSpec greedy{};  // inv_t 0: argmax, lowest id on ties
  const bool pipe = pipelines();
  DrawPipeline steps(*this, state);
  LILY_TRY(steps.launch(first, greedy));
  for (int i = 0; i < n_steps; ++i) {
    const bool ahead = pipe && i + 1 < n_steps;
    Status launched = ahead ? steps.launch(kDrawnToken, greedy) : Status::ok();
    Drawn d;
    Status st = steps.collect(d);
    if (!st || !launched) {
      Drawn extra;
      if (ahead && launched) (void)steps.collect(extra);  // leave nothing in flight
      return st ? launched : st;
    }
    out.push_back(d.id);
    if (avail_s) avail_s->push_back(std::chrono::duration<double>(clock::now() - t0).count());
    if (!pipe && i + 1 < n_steps) LILY_TRY(steps.launch(d.id, greedy));
  }
  return Status::ok();
}

}  // namespace lily
