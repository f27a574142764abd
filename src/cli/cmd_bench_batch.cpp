// `lily bench-batch`: batched decode throughput of one backend (issue 7's scaling table). For each
// batch size B: B sequences, each prefilled with its own prompt of --context tokens (token i of
// sequence s = (((i + 7919·s)·2654435761) mod 2^32) mod vocab, so rows route to different
// experts), one untimed warm-up step, then --steps timed Model::decode_draw steps (the server's step:
// each row's greedy token drawn where its logits are) feeding each row its token. JSON: per B the
// aggregate tok/s, per-stream tok/s, median step time and the speed-up over B = 1.
// --prompt-tokens N: every timed step also feeds newcomers' prompts as a server's step does
// (Model::step): ⌈N / --segment⌉ fresh sequences, a segment of --segment tokens each, their logits
// to the host; the table then gives the prompt tokens per second the step carried beside the rows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/bench_report.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/step_bytes.h"
#include "model/logits.h"
#include "model/model.h"
#include "core/thread_pool.h"

namespace lily::cli {
namespace {

struct BenchBatchArgs {
  ModelArgs m;
  ReportArgs report;
  std::string batches = "1,2,4,8,16";
  int context = 256, steps = 16;
  int prompt_tokens = 0, segment = 96;  // newcomers' prompt tokens per step, in segments of this length
  bool check = false;  // compare the warm-up step's rows with forward() on clones of the states
};

Result<std::vector<int>> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int n = std::atoi(item.c_str());
    if (n <= 0 || n > 4096) return errorf("--batches: '{}' is not a batch size in [1, 4096]", item);
    v.push_back(n);
  }
  if (v.empty()) return errorf("--batches: empty list");
  return v;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

int run_bench_batch(const BenchBatchArgs& a) {
  auto bs = parse_list(a.batches);
  if (!bs) return fail(bs.message());
  if (a.context <= 0 || a.steps <= 0) return fail("--context and --steps must be positive");
  if (a.prompt_tokens < 0 || a.segment < 1) return fail("--prompt-tokens must be >= 0 and --segment >= 1");
  const auto loaded = load_model(a.m, true);
  if (!loaded) return 1;
  Model& model = *loaded;
  const int V = model.config().vocab_size;
  nlohmann::json out = report_head(model, a.report);
  out["context"] = a.context;
  out["steps"] = a.steps;
  out["results"] = nlohmann::json::array();
  // The byte floor of each step (cli/step_bytes.h) at the copy bandwidth measured now (0: not measured).
  const double copy = model.copy_bandwidth_gbps();
  const StateMemory sm = model.state_memory(1);  // the element sizes of its states
  out["copy_gbps"] = copy;
  std::fprintf(stderr, "bench-batch: %s on %s, context %d, %d timed steps; copy bandwidth %.0f GB/s\n", model.backend_name(),
               model.hardware().c_str(), a.context, a.steps, copy);
  const int n_seg = (a.prompt_tokens + a.segment - 1) / a.segment;
  out["prompt_tokens"] = a.prompt_tokens, out["segment"] = a.segment;
  if (n_seg > 0)
    std::fprintf(stderr, "each step also feeds %d prompt segments of %d tokens (fresh sequences, logits to the host)\n", n_seg,
                 a.segment);
  std::fprintf(stderr, "| batch | aggregate tok/s | per stream tok/s | ms/step (median) | vs batch 1 | decode_draw ms (median) | floor ms | vs floor |%s\n|---:|---:|---:|---:|---:|---:|---:|---:|%s\n",
               n_seg ? " prompt tok/s |" : "", n_seg ? "---:|" : "");
  using clk = std::chrono::steady_clock;
  double base = 0;
  for (int B : *bs) {
    std::vector<std::unique_ptr<SeqState>> states;
    std::vector<int32_t> next(static_cast<size_t>(B));
    std::vector<float> logits(static_cast<size_t>(V));
    for (int s = 0; s < B; ++s) {
      auto st = model.new_state(a.context + a.steps + 2);
      if (!st) return fail(st.message());
      std::vector<int32_t> p(static_cast<size_t>(a.context));
      for (int i = 0; i < a.context; ++i)
        p[size_t(i)] = int32_t(uint64_t(uint32_t(uint64_t(i + 7919 * s) * 2654435761ull)) % uint64_t(V));
      if (Status r = model.forward(**st, p, logits); !r) return fail(r.message());
      next[size_t(s)] = argmax(logits);
      states.push_back(std::move(*st));
    }
    std::vector<SeqState*> rows;
    for (auto& s : states) rows.push_back(s.get());
    std::vector<float> lb(size_t(B) * size_t(V));
    std::vector<double> ms, fb_ms;  // whole step; the model call alone
    // --check: every row's logits of the warm-up step against forward() on a clone of its state.
    std::vector<std::unique_ptr<SeqState>> clones;
    std::vector<int32_t> fed = next;
    if (a.check)
      for (auto& s : states) {
        clones.push_back(s->clone());
        if (!clones.back()) return fail("--check: state clone failed");
      }
    // Timed steps are the server's: Model::decode_draw, each row's greedy token drawn where its logits
    // are (on CUDA no logits cross PCIe). The --check warm-up step takes whole logits rows instead.
    std::vector<DrawSpec> specs(static_cast<size_t>(B));
    std::vector<Drawn> drawn(static_cast<size_t>(B));
    // Newcomers (--prompt-tokens): fresh states, emptied before each step (outside the timing).
    std::vector<std::unique_ptr<SeqState>> fresh;
    std::vector<std::vector<int32_t>> seg_tok(static_cast<size_t>(n_seg));
    std::vector<float> seg_logits(size_t(n_seg) * size_t(V));
    for (int j = 0; j < n_seg; ++j) {
      auto st = model.new_state(a.segment + 1);
      if (!st) return fail(st.message());
      fresh.push_back(std::move(*st));
      for (int i = 0; i < a.segment; ++i)
        seg_tok[size_t(j)].push_back(int32_t(uint64_t(uint32_t(uint64_t(i + 104729 * (j + 1)) * 2654435761ull)) % uint64_t(V)));
    }
    std::vector<StepFeed> feeds;
    for (int step = 0; step <= a.steps; ++step) {  // step 0: warm-up at the exact shape
      for (auto& f : fresh) f->reset();
      const auto t0 = clk::now();
      const bool logits_step = step == 0 && a.check;
      if (logits_step) {
        if (Status r = model.forward_batch(rows, next, lb); !r) return fail(r.message());
      } else if (n_seg > 0) {
        feeds.clear();
        for (int j = 0; j < n_seg; ++j) {
          StepFeed f;
          f.state = fresh[size_t(j)].get(), f.tokens = seg_tok[size_t(j)], f.logits = seg_logits.data() + size_t(j) * size_t(V);
          feeds.push_back(f);
        }
        for (int b = 0; b < B; ++b) {
          StepFeed f;
          f.state = rows[size_t(b)], f.tokens = {&next[size_t(b)], 1}, f.draw = &specs[size_t(b)], f.drawn = &drawn[size_t(b)];
          feeds.push_back(f);
        }
        if (Status r = model.step(feeds); !r) return fail(r.message());
      } else if (Status r = model.decode_draw(rows, next, specs, drawn); !r) {
        return fail(r.message());
      }
      const auto t1 = clk::now();
      if (logits_step) {  // the host argmax of every row on the thread pool
        ThreadPool::global().parallel_for(size_t(B), 1, [&](size_t b0, size_t b1) {
          for (size_t s = b0; s < b1; ++s) next[s] = argmax(std::span<const float>(lb.data() + s * size_t(V), size_t(V)));
        });
      } else {
        for (int s = 0; s < B; ++s) next[size_t(s)] = drawn[size_t(s)].id;
      }
      if (step > 0) {
        ms.push_back(1e3 * std::chrono::duration<double>(clk::now() - t0).count());
        fb_ms.push_back(1e3 * std::chrono::duration<double>(t1 - t0).count());
      }
      if (step == 0 && a.check) {
        // Per row its largest difference: one row far off with the rest at rounding level is one routing
        // decision flipped by a near-tie (a different expert set), every row off is an arithmetic fault.
        std::vector<double> row_d(size_t(B), 0.0);
        int agree = 0;
        for (int s = 0; s < B; ++s) {
          if (Status r = model.forward(*clones[size_t(s)], {&fed[size_t(s)], 1}, logits); !r) return fail(r.message());
          const float* row = lb.data() + size_t(s) * size_t(V);
          for (int v = 0; v < V; ++v) row_d[size_t(s)] = std::max(row_d[size_t(s)], double(std::fabs(row[v] - logits[size_t(v)])));
          agree += argmax(logits) == next[size_t(s)];
        }
        const int worst = int(std::max_element(row_d.begin(), row_d.end()) - row_d.begin());
        double next_d = 0;
        int over = 0;
        for (int s = 0; s < B; ++s) {
          over += row_d[size_t(s)] > 1e-3;
          if (s != worst) next_d = std::max(next_d, row_d[size_t(s)]);
        }
        std::fprintf(stderr,
                     "check B=%d: max |batched - alone| logit %.3g (row %d; rows over 1e-3: %d; largest of the others %.3g), "
                     "argmax equal %d/%d\n",
                     B, row_d[size_t(worst)], worst, over, next_d, agree, B);
        clones.clear();
      }
    }
    double total = 0;
    for (double x : ms) total += x;
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double agg = B * a.steps / (total / 1e3);
    if (base == 0 && B == 1) base = agg;
    nlohmann::json r;
    r["batch"] = B;
    r["aggregate_tok_s"] = agg;
    r["per_stream_tok_s"] = agg / B;
    r["step_ms_median"] = sorted[sorted.size() / 2];
    r["step_ms"] = ms;
    std::vector<double> fb_sorted = fb_ms;
    std::sort(fb_sorted.begin(), fb_sorted.end());
    r["decode_draw_ms_median"] = fb_sorted[fb_sorted.size() / 2];
    const double floor_ms = copy > 0 ? step_bytes(model.config(), a.context + a.steps / 2.0, sm, B) / (copy * 1e9) * 1e3 : 0.0;
    r["step_bytes"] = step_bytes(model.config(), a.context + a.steps / 2.0, sm, B);
    r["floor_ms"] = floor_ms;
    r["speedup_vs_batch1"] = base > 0 ? nlohmann::json(agg / base) : nlohmann::json(nullptr);
    const double prompt_tps = double(n_seg) * a.segment * a.steps / (total / 1e3);
    if (n_seg > 0) r["prompt_tok_s"] = prompt_tps;
    out["results"].push_back(r);
    std::fprintf(stderr, "| %d | %.1f | %.2f | %.2f | %s | %.2f | %.2f | %.2f |%s\n", B, agg, agg / B, sorted[sorted.size() / 2],
                 base > 0 ? std::to_string(agg / base).substr(0, 5).c_str() : "-", fb_sorted[fb_sorted.size() / 2], floor_ms,
                 floor_ms > 0 ? floor_ms / sorted[sorted.size() / 2] : 0.0,
                 n_seg > 0 ? (" " + std::to_string(int(prompt_tps)) + " |").c_str() : "");
  }
  print_report(out, a.report);
  return 0;
}

Registrar reg("bench-batch", "Batched decode throughput: aggregate tok/s of the server's step (Model::decode_draw, greedy) per batch size, JSON out",
              [](CLI::App& app) -> RunFn {
                auto a = std::make_shared<BenchBatchArgs>();
                add_model_option(app, a->m);
                add_backend_option(app, a->m, "cpu, cpu-ref or cuda");
                app.add_option("--batches", a->batches, "Comma-separated batch sizes");
                app.add_option("--context", a->context, "Prompt length of every sequence");
                app.add_option("--steps", a->steps, "Timed decode steps per batch size");
                add_threads_option(app, a->m);
                add_report_options(app, a->report);
                app.add_option("--prompt-tokens", a->prompt_tokens, "Newcomers' prompt tokens fed beside the rows in every timed step (Model::step)");
                app.add_option("--segment", a->segment, "Length of each newcomer's prompt segment (--prompt-tokens)");
                app.add_flag("--check", a->check, "Compare the warm-up step's rows with forward() alone (max |d|, argmax)");
                return [a] { return run_bench_batch(*a); };
              });

}  // namespace
}  // namespace lily::cli
