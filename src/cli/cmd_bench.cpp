// `lily bench`: Lily's measurement contract for one backend, timed on the path the server runs: one
// request through the engine (its prompt cut into --prefill-chunk segments as `lily serve` cuts it,
// its greedy tokens drawn as the server draws them: CUDA's depth-2 pipelined decode), without HTTP.
// Prompt token i = ((i·2654435761) mod 2^32) mod vocab; an exact-shape warm-up request (the same
// lengths, a different prompt, so nothing is served from the prefix cache); then one timed request:
// prefill = until its first token is delivered, then exactly 64 decode steps, each timed to its
// token's delivery. JSON: tok/s, per-step times, FNV-1a digest of the generated ids, achieved GB/s
// (bytes a step must read) vs measured copy bandwidth.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <span>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/fast_profile.h"
#include "cli/bench_report.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/step_bytes.h"
#include "engine/engine.h"
#include "io/synth.h"
#include "model/model.h"
#include "model/cost_model.h"
#include "text/tokenizer.h"

namespace lily::cli {
namespace {

constexpr int kDecodeSteps = 64;

struct BenchArgs {
  ModelArgs m{.backend = "cuda"};
  ReportArgs report;
  std::string contexts = "256,1024,4096,16384,32768,65536,131072";
  int max_seq = 0;
  int prefill_chunk = 0;  // as `lily serve --prefill-chunk` (0: the backend's default)
  bool profile = false;  // a per-op table of one decode step after each context (CUDA)
  int spec_draft = 0;    // also time speculative decoding with this many drafts a step (EngineOptions::spec_draft)
};

// One request through the engine, greedy and past the model's stop tokens: the seconds from submit
// until each token's delivery, and the tokens.
struct Timed {
  std::vector<double> at_s;
  std::vector<int32_t> ids;
  std::string error;
};

// Drafts for --spec-draft, from the plain run's reply `ids` after `prompt`: at reply position m (the
// pending token), the reply's next tokens, all of them right (the best case: a reply that quotes its
// context) or, with wrong_first, the first of them wrong (the worst: every step verifies drafts and
// keeps none).
EngineOptions::Drafter oracle(std::vector<int32_t> prompt, std::vector<int32_t> ids, int vocab, bool wrong_first) {
  return [prompt = std::move(prompt), ids = std::move(ids), vocab, wrong_first](std::span<const int32_t> fed, int32_t,
                                                                                 int max_len) {
    std::vector<int32_t> d;
    if (fed.size() < prompt.size()) return d;
    for (size_t i = fed.size() - prompt.size() + 1; i < ids.size() && int(d.size()) < max_len; ++i) d.push_back(ids[i]);
    if (wrong_first && !d.empty()) d[0] = (d[0] + 1) % vocab;
    return d;
  };
}

Timed run_request(Engine& engine, std::vector<int32_t> prompt, int max_tokens, const std::function<void()>& on_first) {
  auto req = std::make_shared<GenRequest>();
  req->prompt = std::move(prompt);
  req->max_tokens = max_tokens;
  req->sampling.temperature = 0.0f;
  req->ignore_eos = true;
  Timed t;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const auto t0 = std::chrono::steady_clock::now();
  req->on_event = [&](GenEvent&& ev) {  // on the engine thread
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const GenToken& g : ev.tokens) {
      t.at_s.push_back(s);
      t.ids.push_back(g.id);
      if (t.ids.size() == 1 && on_first) on_first();
    }
    if (!ev.done) return;
    std::lock_guard<std::mutex> lk(mu);
    if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kCancelled)
      t.error = ev.error.empty() ? finish_reason_name(ev.finish) : ev.error;
    done = true;
    cv.notify_all();
  };
  if (!engine.submit(req)) return Timed{{}, {}, "the engine refused the request"};
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done; });
  if (t.error.empty() && int(t.ids.size()) != max_tokens)
    t.error = fmt::format("{} tokens instead of {}", t.ids.size(), max_tokens);
  return t;
}

uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (uint32_t(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  return h;
}

std::vector<int32_t> bench_prompt(int n, int vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = int32_t((uint64_t(uint32_t(uint64_t(i) * 2654435761ull))) % uint64_t(vocab));
  return p;
}

int run_bench(const BenchArgs& a) {
  const auto loaded = load_model(a.m, true);
  if (!loaded) return 1;
  Model& model = *loaded;
  const ModelConfig& cfg = model.config();
  auto tok_dir = checkpoint_tokenizer_dir(a.m.dir);
  auto tok = tok_dir ? Tokenizer::load_dir(*tok_dir) : Result<std::unique_ptr<Tokenizer>>(tok_dir.status());
  if (!tok) {
    std::fprintf(stderr, "error: tokenizer: %s\n", tok.message().c_str());
    return 1;
  }
  std::vector<int> ctxs;
  {
    std::stringstream ss(a.contexts);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const int n = std::atoi(item.c_str());
      if (n <= 0) {
        std::fprintf(stderr, "error: --contexts: '%s' is not a positive length\n", item.c_str());
        return 2;
      }
      if (a.max_seq > 0 && n + kDecodeSteps + 2 > a.max_seq) {
        std::fprintf(stderr, "bench: skipping context %d (over --max-seq %d)\n", n, a.max_seq);
        continue;
      }
      ctxs.push_back(n);
    }
  }
  const double copy = model.copy_bandwidth_gbps();
  const StateMemory sm = model.state_memory(1);  // the element sizes of its states (the byte floor)
  nlohmann::json out = report_head(model, a.report);
  out["decode_steps"] = kDecodeSteps;
  out["copy_gbps"] = copy;
  out["kv_bytes_per_element"] = sm.kv_elem;
  out["state_bytes_per_element"] = sm.s_elem;
  out["results"] = nlohmann::json::array();
  std::fprintf(stderr, "bench: %s on %s; copy bandwidth %.0f GB/s\n", model.backend_name(), model.hardware().c_str(), copy);
  // Prefill TFLOP/s: the model's FLOPs of the prompt (model/cost_model.h: weight products, causal attention,
  // the last token's lm_head) over the time to the first token.
  std::fprintf(stderr, "| context | prefill tok/s | prefill TFLOP/s | decode tok/s | ms/step (median) | GB/s | vs copy | digest |\n"
                       "|---:|---:|---:|---:|---:|---:|---:|---|\n");
  int longest = 0;
  for (int P : ctxs) longest = std::max(longest, P);
  EngineOptions eo;  // one request at a time, cut and drawn as `lily serve` does
  eo.max_batch = 1;
  eo.max_seq = longest + kDecodeSteps + 2;
  eo.prefill_chunk = a.prefill_chunk > 0 ? a.prefill_chunk : model.default_prefill_chunk();
  out["prefill_chunk"] = eo.prefill_chunk;
  eo.max_cached_states = 1;
  eo.cache_budget_bytes = 1;  // no second state: the timed request reuses the warm-up's
  if (Status st = model.prepare(eo.max_batch, eo.step_tokens); !st)
    std::fprintf(stderr, "bench: warning: backend not prepared (%s)\n", st.message().c_str());
  Engine engine(model, **tok, eo);
  for (int P : ctxs) {
    const auto prompt = bench_prompt(P, cfg.vocab_size);
    auto warm_prompt = prompt;  // the same lengths, another first token: no prefix-cache hit
    warm_prompt[0] = (warm_prompt[0] + 1) % cfg.vocab_size;
    if (Timed w = run_request(engine, warm_prompt, kDecodeSteps + 1, nullptr); !w.error.empty()) {
      std::fprintf(stderr, "error: warm-up at context %d: %s\n", P, w.error.c_str());
      return 1;
    }
    // CPU backends: per-op time and weight bytes of the timed decode steps (fast_profile.h), from the
    // first token's delivery on (the engine thread, between steps).
    const bool cpu = std::string(model.backend_name()).rfind("cpu", 0) == 0;
    cpu::profile_enable(false);
    Timed t = run_request(engine, prompt, kDecodeSteps + 1, [&] {
      cpu::profile_reset();
      cpu::profile_enable(cpu);
    });
    cpu::profile_enable(false);
    if (!t.error.empty()) {
      std::fprintf(stderr, "error: context %d: %s\n", P, t.error.c_str());
      return 1;
    }
    if (a.profile) {  // one decode step of a state holding this prompt, op by op (CUDA)
      auto st = model.new_state(P + 2);
      Status s = st ? Status::ok() : st.status();
      if (s) s = model.forward(**st, prompt, {});
      if (s) s = model.profile_decode(**st);
      if (!s) std::fprintf(stderr, "bench: no profile: %s\n", s.message().c_str());
    }
    const double prefill_s = t.at_s[0];
    const double decode_s = t.at_s.back() - t.at_s[0];
    std::vector<double> steps_ms;
    for (size_t i = 1; i < t.at_s.size(); ++i) steps_ms.push_back(1e3 * (t.at_s[i] - t.at_s[i - 1]));
    std::vector<double> sorted = steps_ms;
    std::sort(sorted.begin(), sorted.end());
    const std::vector<int32_t>& gen = t.ids;
    double bytes = 0;
    for (int i = 0; i < kDecodeSteps; ++i) bytes += step_bytes(cfg, P + i, sm);
    const double gbps = bytes / decode_s / 1e9;
    char digest[32];
    std::snprintf(digest, sizeof digest, "%016llx", (unsigned long long)fnv1a(gen));
    nlohmann::json r;
    r["context"] = P;
    r["prefill_s"] = prefill_s;
    r["prefill_tok_s"] = P / prefill_s;
    const double pf_tflops = prefill_flops(cfg, P) / prefill_s / 1e12;
    r["prefill_tflop_s"] = pf_tflops;
    r["decode_s"] = decode_s;
    r["decode_tok_s"] = kDecodeSteps / decode_s;
    r["step_ms"] = steps_ms;
    r["generated_ids"] = gen;
    r["fnv1a64"] = digest;
    r["bytes_per_step"] = bytes / kDecodeSteps;
    r["achieved_gbps"] = gbps;
    r["ratio_to_copy"] = copy > 0 ? nlohmann::json(gbps / copy) : nlohmann::json(nullptr);
    if (cpu) {
      nlohmann::json ops = nlohmann::json::array();
      for (const auto& o : cpu::profile_snapshot())
        if (o.calls) {
          const double gbps_op = o.seconds > 0 ? o.bytes / o.seconds / 1e9 : 0.0;
          ops.push_back({{"op", o.name}, {"ms_per_step", 1e3 * o.seconds / kDecodeSteps}, {"share", o.seconds / decode_s},
                         {"mb_per_step", o.bytes / kDecodeSteps / 1e6}, {"gb_s", gbps_op},
                         {"ratio_to_copy", copy > 0 ? nlohmann::json(gbps_op / copy) : nlohmann::json(nullptr)}});
          std::fprintf(stderr, "|   %s | %.2f ms/step | %.0f%% | %.1f MB | %.1f GB/s |\n", o.name.c_str(),
                       1e3 * o.seconds / kDecodeSteps, 100 * o.seconds / decode_s, o.bytes / kDecodeSteps / 1e6, gbps_op);
        }
      r["decode_ops"] = ops;
    }
    std::fprintf(stderr, "| %d | %.1f | %.2f | %.1f | %.3f | %.0f | %s | %s |\n", P, P / prefill_s, pf_tflops, kDecodeSteps / decode_s,
                 sorted[sorted.size() / 2], gbps, copy > 0 ? std::to_string(gbps / copy).substr(0, 5).c_str() : "-", digest);
    // --spec-draft: the same request with drafts from this reply, all right and all wrong (the bounds of
    // speculative decoding's speed on this backend); the tokens must be the plain run's.
    if (a.spec_draft > 0) {
      if (!model.speculates()) {
        std::fprintf(stderr, "bench: --spec-draft: backend %s does not speculate\n", model.backend_name());
        return 1;
      }
      nlohmann::json sj = nlohmann::json::array();
      for (bool wrong : {false, true}) {
        EngineOptions so = eo;
        so.spec_draft = a.spec_draft;
        so.spec_drafter = oracle(prompt, gen, cfg.vocab_size, wrong);
        Engine spec(model, **tok, so);
        (void)run_request(spec, warm_prompt, kDecodeSteps + 1, nullptr);  // the same state allocation warm
        const uint64_t drafted0 = spec.stats().spec_drafted, accepted0 = spec.stats().spec_accepted,
                       steps0 = spec.stats().decode_steps;
        Timed s = run_request(spec, prompt, kDecodeSteps + 1, nullptr);
        if (!s.error.empty()) {
          std::fprintf(stderr, "error: --spec-draft at context %d: %s\n", P, s.error.c_str());
          return 1;
        }
        const double ds = s.at_s.back() - s.at_s[0];
        const uint64_t drafted = spec.stats().spec_drafted - drafted0, accepted = spec.stats().spec_accepted - accepted0,
                       steps = spec.stats().decode_steps - steps0;
        const bool same = s.ids == gen;
        sj.push_back({{"drafts", wrong ? "first wrong" : "right"}, {"decode_tok_s", kDecodeSteps / ds}, {"drafted", drafted},
                      {"accepted", accepted}, {"decode_steps", steps}, {"same_tokens", same}});
        // A step's time against plain decoding's, and what each verified draft row added to it (the
        // backend's spec_row_cost is this, measured with all-right drafts).
        const double step_ms = steps ? 1e3 * ds / double(steps) : 0.0, plain_ms = 1e3 * decode_s / kDecodeSteps;
        const double per_step = steps ? double(drafted) / double(steps) : 0.0;
        const double row_cost = per_step > 0 ? (step_ms / plain_ms - 1.0) / per_step : 0.0;
        sj.back()["step_ms"] = step_ms, sj.back()["row_cost"] = row_cost;
        std::fprintf(stderr,
                     "|   spec %d drafts, %s | | %.1f | | | %llu of %llu drafts accepted, %llu steps; %.3f ms a step (plain %.3f), "
                     "%.2f drafts a step: %.3f of a step per draft row | %s |\n",
                     a.spec_draft, wrong ? "first wrong" : "all right", kDecodeSteps / ds, (unsigned long long)accepted,
                     (unsigned long long)drafted, (unsigned long long)steps, step_ms, plain_ms, per_step, row_cost,
                     same ? "same tokens" : "TOKENS DIFFER");
        if (!same) {
          std::fprintf(stderr, "error: --spec-draft at context %d: the tokens differ from plain decoding\n", P);
          return 1;
        }
      }
      r["spec"] = sj;
    }
    out["results"].push_back(r);
  }
  print_report(out, a.report);
  return 0;
}

Registrar reg("bench", "Benchmark (Lily's contract): one request through the engine per context, timed prefill + 64 greedy decode steps, JSON out",
              [](CLI::App& app) -> RunFn {
                auto a = std::make_shared<BenchArgs>();
                add_model_option(app, a->m);
                add_backend_option(app, a->m, "cuda, cpu or cpu-ref");
                app.add_option("--contexts", a->contexts, "Comma-separated prompt lengths (the sweep)");
                app.add_option("--max-seq", a->max_seq, "Skip contexts that do not fit (prompt + 64 + 2)");
                add_threads_option(app, a->m);
                add_report_options(app, a->report);
                app.add_option("--prefill-chunk", a->prefill_chunk,
                               "prompt segment length, as lily serve's (the prompt is fed as the server feeds it; default the backend's)");
                app.add_flag("--profile", a->profile, "after each context, a per-op table of one decode step on stderr (CUDA)");
                app.add_option("--spec-draft", a->spec_draft,
                               "also time speculative decoding with this many drafts a step, taken from the plain run's reply: "
                               "all right (the best case) and the first wrong (the worst); the tokens must be the plain run's");
                return [a] { return run_bench(*a); };
              });

}  // namespace
}  // namespace lily::cli
