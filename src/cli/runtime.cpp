// load_runtime: see runtime.h.
#include "cli/runtime.h"

#include <chrono>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include "engine/memory_plan.h"
#include "io/synth.h"

namespace lily::cli {

namespace {
constexpr int kCudaDefaultParallel = 256;  // issue 24: many users on one H200
constexpr int kCpuDefaultParallel = 8;
}  // namespace

void add_runtime_options(CLI::App& app, RuntimeArgs& a) {
  app.add_option("--model", a.model_dir, "checkpoint directory (default: the built-in demo checkpoint, random weights)");
  app.add_option("--backend", a.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--max-seq", a.max_seq, "context length per sequence, tokens (default min(8192, model max))");
  app.add_option("--threads", a.threads, "CPU threads (0 = all cores)");
  app.add_option("--max-queue", a.max_queue, "requests that may wait for the engine before 503");
  app.add_option("--parallel", a.parallel,
                 "requests decoded together (continuous batching; default 256 on cuda, 8 on cpu, lowered to what fits in "
                 "memory at --max-seq); more wait in the queue");
  app.add_option("--state-mb", a.state_mb,
                 "memory for sequence states (running requests, prefix cache, spares), MiB (0: what is free after the "
                 "weights and scratch, less headroom); requests wait when it is taken");
  app.add_option("--prefill-chunk", a.prefill_chunk, "prompts are cut every this many tokens of position (a remainder of at most an eighth of it joins the segment before; also at snapshot points), each segment fed whole by one step; the cut never depends on load, so neither do a request's tokens (default: the backend's, CUDA 4096, CPU 512)");
  app.add_option("--step-tokens", a.step_tokens, "prompt tokens a step may carry beside the decoding requests' (the first segment always runs; more while they fit): bounds a step's time and so the running streams' inter-token latency");
  app.add_option("--long-step-tokens", a.long_step_tokens, "after a first segment longer than --step-tokens, more such long segments join the step while its prompt tokens stay within this (CUDA: one prefill pass for them all); 0: a long segment runs in a step of its own (default: the backend's, CUDA 4096, CPU 0)");
  app.add_option("--spec-draft", a.spec_draft,
                 "speculative decoding by prompt lookup: a greedy request whose last tokens occurred before in its prompt or "
                 "reply also feeds up to this many of the tokens that followed, verified in the same step; the reply is "
                 "the one plain decoding gives (0: off; backends that rewind a state only: cpu)");
  app.add_option("--spec-ngram", a.spec_ngram, "the longest n-gram of the last tokens that --spec-draft looks up (down to 2)")
      ->check(CLI::Range(2, 8));
  app.add_option("--max-cached", a.max_cached, "conversations whose model state is kept for reuse");
  app.add_option("--cache-mb", a.cache_mb, "memory budget of the cached states, MiB");
  app.add_option("--max-tokens-default", a.max_tokens_default,
                 "completion tokens for a request that gives no max_tokens, capped by the context (0: up to the context)");
  app.add_option("--cache-shared-min", a.cache_shared_min,
                 "a system prompt (with tools) of at least this many tokens is snapshotted once and shared by every request that starts with it");
}

std::unique_ptr<Runtime> load_runtime(const RuntimeArgs& a) {
  auto rt = std::make_unique<Runtime>();
  rt->dir = a.model_dir;
  if (rt->dir.empty()) {
    fmt::print(stderr, "lily: no --model given: using the built-in demo checkpoint (RANDOM weights: the API and "
                       "tokenizer are real, the answers are noise)\n");
    auto d = ensure_demo_checkpoint();
    if (!d) {
      fmt::print(stderr, "error: cannot create the demo checkpoint: {}\n", d.message());
      return nullptr;
    }
    rt->dir = d.value();
  }
  rt->synthetic = is_synthetic_checkpoint(rt->dir);
  if (rt->synthetic && !a.model_dir.empty())
    fmt::print(stderr, "lily: {} is a synthetic checkpoint: its weights are random\n", rt->dir);
  ModelOptions mo;
  mo.backend = a.backend;
  mo.threads = a.threads;
  mo.verbose = true;
  auto model = Model::load(rt->dir, mo);
  if (!model) {
    fmt::print(stderr, "error: {}\n", model.message());
    return nullptr;
  }
  rt->model = std::move(model).value();
  auto tok_dir = checkpoint_tokenizer_dir(rt->dir);
  if (!tok_dir) {
    fmt::print(stderr, "error: tokenizer: {}\n", tok_dir.message());
    return nullptr;
  }
  auto tok = Tokenizer::load_dir(*tok_dir);
  if (!tok) {
    fmt::print(stderr, "error: tokenizer: {}\n", tok.message());
    return nullptr;
  }
  rt->tok = std::move(tok).value();
  auto tmpl = ChatTemplate::load_dir(*tok_dir);
  if (tmpl) rt->tmpl = std::make_unique<ChatTemplate>(std::move(tmpl).value());
  else fmt::print(stderr, "lily: warning: no chat template ({}); /v1/chat/completions will fail\n", tmpl.message());

  const int model_max = rt->model->config().max_position_embeddings;
  EngineOptions eo;
  eo.max_seq = a.max_seq > 0 ? std::min(a.max_seq, model_max) : std::min(8192, model_max);
  eo.max_queue = std::max(1, a.max_queue);
  // --parallel's default: a GPU serves many at once (the memory plan lowers it to what fits).
  const bool parallel_default = a.parallel <= 0;
  eo.max_batch = parallel_default ? (a.backend == "cuda" ? kCudaDefaultParallel : kCpuDefaultParallel) : a.parallel;
  eo.step_tokens = std::max(1, a.step_tokens);
  eo.prefill_chunk = a.prefill_chunk > 0 ? a.prefill_chunk : rt->model->default_prefill_chunk();
  eo.long_step_tokens = a.long_step_tokens >= 0 ? a.long_step_tokens : rt->model->default_long_step_tokens();
  eo.spec_draft = std::max(0, a.spec_draft);
  eo.spec_ngram = a.spec_ngram;
  if (eo.spec_draft > 0 && !rt->model->speculates())
    fmt::print(stderr, "lily: warning: --spec-draft {}: the {} backend cannot rewind a state; decoding without drafts\n",
               eo.spec_draft, rt->model->backend_name());
  eo.max_cached_states = std::max(1, a.max_cached);
  eo.cache_budget_bytes = size_t(std::max(1, a.cache_mb)) << 20;
  eo.shared_prefix_min = std::max(1, a.cache_shared_min);
  {  // first-use costs (every batch size's step graph, say) paid now, not by the first requests
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = rt->model->prepare(eo.max_batch, eo.step_tokens); !st)
      fmt::print(stderr, "lily: warning: backend not prepared ({}); the first steps of each kind prepare on use\n",
                 st.message());
    else if (const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); s > 0.05)
      fmt::print(stderr, "lily: steps of up to {} rows prepared in {:.2f} s\n", eo.max_batch, s);
  }
  // The memory plan, from what is free now that the weights are loaded and the scratch prepared.
  if (auto dm = rt->model->device_memory(); !dm) {
    spdlog::warn("memory: cannot read the free memory ({}): requests are admitted without a memory budget", dm.message());
  } else {
    MemoryPlanInput in;
    in.state = rt->model->state_memory(eo.max_seq);
    in.device = dm.value();
    in.max_seq = eo.max_seq;
    in.parallel = eo.max_batch;
    in.parallel_is_default = parallel_default;
    in.cache_budget = eo.cache_budget_bytes;
    in.budget_limit = size_t(std::max(0, a.state_mb)) << 20;
    auto plan = plan_memory(in);
    if (!plan) {
      fmt::print(stderr, "error: {}\n", plan.message());
      return nullptr;
    }
    for (const auto& line : plan->summary()) spdlog::info("{}", line);
    for (const auto& note : plan->notes) spdlog::warn("memory: {}", note);
    eo.max_batch = plan->parallel;
    eo.cache_budget_bytes = plan->cache_budget;
    eo.memory_budget_bytes = plan->budget;
  }
  rt->engine = std::make_unique<Engine>(*rt->model, *rt->tok, eo);

  ServiceOptions so;
  so.model_names.push_back("Qwen3.6-35B-A3B");
  std::string base = std::filesystem::path(rt->dir).lexically_normal().filename().string();
  if (base.empty()) base = std::filesystem::path(rt->dir).lexically_normal().parent_path().filename().string();
  if (!base.empty() && base != so.model_names[0]) so.model_names.push_back(base);
  so.test_hooks = a.test_hooks;
  so.defaults = load_sampling_defaults(rt->dir);
  so.default_max_tokens = std::max(0, a.max_tokens_default);
  rt->service = std::make_unique<CompletionService>(*rt->engine, *rt->tok, rt->tmpl.get(), so);
  return rt;
}

}  // namespace lily::cli
