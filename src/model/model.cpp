// Model: checkpoint → weight views → backend. The forward pass itself lives in the backend
// (cpu: src/backend/cpu/cpu_backend.cpp, the reference; cuda: src/backend/cuda/).
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
  std::unique_ptr<Checkpoint> ckpt;
  ModelWeights weights;
  std::unique_ptr<Backend> backend;
};

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelOptions& opts) {
  auto impl = std::make_unique<Impl>();
  LILY_ASSIGN_OR_RETURN(impl->ckpt, Checkpoint::open(dir));
  LILY_ASSIGN_OR_RETURN(impl->weights, ModelWeights::from_checkpoint(*impl->ckpt));
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

const ModelConfig& Model::config() const { return impl_->weights.cfg; }
const std::string& Model::dir() const { return impl_->ckpt->dir(); }
const char* Model::backend_name() const { return impl_->backend->name(); }

Result<std::unique_ptr<SeqState>> Model::new_state(int max_seq) { return impl_->backend->new_state(max_seq); }
StateMemory Model::state_memory(int max_seq) const { return impl_->backend->state_memory(max_seq); }
Result<DeviceMemory> Model::device_memory() { return impl_->backend->device_memory(); }

Status Model::forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) {
  LILY_TRY(state.reserve(state.n_tokens() + int(tokens.size())));
  return impl_->backend->forward(state, tokens, logits);
}

}  // namespace lily

namespace lily {

// A draw spec a backend can take: a temperature's inverse ≥ 0, a uniform in [0, 1), at most kMaxDrawTop
// alternatives.
static bool spec_ok(const DrawSpec& d) {
  return d.inv_t >= 0.0f && d.u >= 0.0 && d.u < 1.0 && d.top_logprobs <= kMaxDrawTop;
}

Status Model::forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                            std::span<float> logits) {
  if (states.size() != tokens.size()) return errorf("forward_batch: {} states but {} tokens", states.size(), tokens.size());
  if (logits.size() != states.size() * size_t(config().vocab_size))
    return errorf("forward_batch: logits must hold {} rows of {}", states.size(), config().vocab_size);
  for (size_t i = 0; i < states.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (states[i] == states[j]) return errorf("forward_batch: rows {} and {} share one state", j, i);
  for (SeqState* st : states) LILY_TRY(st->reserve(st->n_tokens() + 1));
  return impl_->backend->forward_batch(states, tokens, logits);
}

Status Model::prepare(int max_rows, int step_tokens) {
  if (max_rows < 1 || step_tokens < 0) return errorf("prepare: {} rows, {} step tokens", max_rows, step_tokens);
  return impl_->backend->prepare(max_rows, step_tokens);
}

Status Model::step(std::span<const StepFeed> feeds) {
  const int V = config().vocab_size;
  for (size_t i = 0; i < feeds.size(); ++i) {
    const StepFeed& f = feeds[i];
    if (!f.state || f.tokens.empty()) return errorf("step: feed {} has no state or no tokens", i);
    if (f.draw && (!f.drawn || f.logits)) return errorf("step: feed {} asks for a draw without a Drawn, or for logits too", i);
    if (f.draw && !spec_ok(*f.draw))
      return errorf("step: feed {} has a bad draw spec (inv_t {}, u {}, top_logprobs {})", i, f.draw->inv_t, f.draw->u,
                    f.draw->top_logprobs);
    for (int32_t t : f.tokens)
      if (t < 0 || t >= V) return errorf("step: feed {} has token {} outside the vocabulary", i, t);
    for (size_t j = 0; j < i; ++j)
      if (feeds[j].state == f.state) return errorf("step: feeds {} and {} share one state", j, i);
  }
  for (const StepFeed& f : feeds) LILY_TRY(f.state->reserve(f.state->n_tokens() + int(f.tokens.size())));
  return impl_->backend->step(feeds);
}

Status Model::decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                          std::span<const DrawSpec> spec, std::span<Drawn> out) {
  if (states.size() != tokens.size() || spec.size() != states.size() || out.size() != states.size())
    return errorf("decode_draw: {} states, {} tokens, {} specs, {} outputs", states.size(), tokens.size(), spec.size(),
                  out.size());
  for (size_t i = 0; i < states.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (states[i] == states[j]) return errorf("decode_draw: rows {} and {} share one state", j, i);
  for (const auto& d : spec)
    if (!spec_ok(d))
      return errorf("decode_draw: bad spec (inv_t {}, u {}, top_logprobs {})", d.inv_t, d.u, d.top_logprobs);
  for (SeqState* st : states) LILY_TRY(st->reserve(st->n_tokens() + 1));
  return impl_->backend->decode_draw(states, tokens, spec, out);
}

Status Model::decode_greedy(SeqState& state, int32_t first, int n_steps, std::vector<int32_t>& out,
                            std::vector<double>* avail_s) {
  if (n_steps > 0) LILY_TRY(state.reserve(state.n_tokens() + n_steps));
  if (impl_->backend->vocab_size() > 0) return impl_->backend->decode_greedy(state, first, n_steps, out, avail_s);
  // A backend without its own loop or vocab size: forward + argmax here.
  const auto t0 = std::chrono::steady_clock::now();
  out.clear();
  if (avail_s) avail_s->clear();
  std::vector<float> logits(size_t(config().vocab_size));
  int32_t tok = first;
  for (int i = 0; i < n_steps; ++i) {
    LILY_TRY(forward(state, std::span<const int32_t>(&tok, 1), logits));
    tok = argmax(logits);
    out.push_back(tok);
    if (avail_s) avail_s->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Status::ok();
}
bool Model::pipelined_draw() const { return impl_->backend->pipelined_draw(); }
Status Model::launch_draw(SeqState& state, int32_t token, const DrawSpec& spec) {
  if (token >= config().vocab_size) return errorf("launch_draw: token {} outside the vocabulary", token);
  if (!spec_ok(spec))
    return errorf("launch_draw: bad spec (inv_t {}, u {}, top_logprobs {})", spec.inv_t, spec.u, spec.top_logprobs);
  LILY_TRY(state.reserve(state.n_tokens() + 1));
  return impl_->backend->launch_draw(state, token, spec);
}
Status Model::collect_draw(Drawn& out) { return impl_->backend->collect_draw(out); }
double Model::copy_bandwidth_gbps() { return impl_->backend->copy_bandwidth_gbps(); }
std::string Model::hardware() const { return impl_->backend->hardware(); }

}  // namespace lily
