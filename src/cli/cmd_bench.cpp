// `lily bench`: Lily's measurement contract for one backend. Prompt token i = ((i·2654435761)
// mod 2^32) mod vocab; an exact-shape warm-up (prefill + 2 decode steps on a throwaway state);
// one timed prefill (until the first token is on the host); exactly 64 timed decode steps on the
// backend's greedy loop (CUDA: depth-2 graph pipeline). JSON: tok/s, per-step times, FNV-1a
// digest of the generated ids, achieved GB/s (bytes a step must read) vs measured copy bandwidth.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/fast_profile.h"
#include "cli/command.h"
#include "cli/step_bytes.h"
#include "model/logits.h"
#include "model/model.h"

namespace lily::cli {
namespace {

constexpr int kDecodeSteps = 64;

struct BenchArgs {
  std::string model, backend = "cuda", contexts = "256,1024,4096,16384,32768,65536,131072", json_out, label;
  int max_seq = 0, threads = 0;
};

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
  ModelOptions mo;
  mo.backend = a.backend;
  mo.threads = a.threads;
  auto model_r = Model::load(a.model, mo);
  if (!model_r) {
    std::fprintf(stderr, "error: %s\n", model_r.message().c_str());
    return 1;
  }
  Model& model = **model_r;
  const ModelConfig& cfg = model.config();
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
  double kv_es = 4;  // fp32 K/V and conv windows (CPU states; CUDA states unless LILY_CUDA_KV=bf16)
  if (std::string(model.backend_name()) == "cuda") {
    const char* kv = std::getenv("LILY_CUDA_KV");
    if (kv && std::string(kv) == "bf16") kv_es = 2;
  }
  nlohmann::json out;
  out["backend"] = model.backend_name();
  out["hardware"] = model.hardware();
  out["model"] = model.dir();
  out["label"] = a.label;
  out["decode_steps"] = kDecodeSteps;
  out["copy_gbps"] = copy;
  out["kv_bytes_per_element"] = kv_es;
  out["results"] = nlohmann::json::array();
  std::fprintf(stderr, "bench: %s on %s; copy bandwidth %.0f GB/s\n", model.backend_name(), model.hardware().c_str(), copy);
  std::fprintf(stderr, "| context | prefill tok/s | decode tok/s | ms/step (median) | GB/s | vs copy | digest |\n|---:|---:|---:|---:|---:|---:|---|\n");
  using clk = std::chrono::steady_clock;
  std::vector<float> logits(cfg.vocab_size);
  for (int P : ctxs) {
    const auto prompt = bench_prompt(P, cfg.vocab_size);
    const int cap = P + kDecodeSteps + 2;
    auto st_r = model.new_state(cap);
    if (!st_r) {
      std::fprintf(stderr, "error: %s\n", st_r.message().c_str());
      return 1;
    }
    SeqState& st = **st_r;
    std::vector<int32_t> ids;
    // Warm-up at the exact shape: prefill, then a decode step and its lookahead.
    Status s = model.forward(st, prompt, logits);
    if (s) s = model.decode_greedy(st, argmax(logits), 2, ids);
    if (!s) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 1;
    }
    st.reset();
    const auto t0 = clk::now();
    s = model.forward(st, prompt, logits);
    const int32_t first = argmax(logits);
    const double prefill_s = std::chrono::duration<double>(clk::now() - t0).count();
    std::vector<double> avail;
    // CPU backends: per-op time and weight bytes of the timed decode steps (fast_profile.h).
    const bool cpu = std::string(model.backend_name()).rfind("cpu", 0) == 0;
    cpu::profile_reset();
    cpu::profile_enable(cpu);
    if (s) s = model.decode_greedy(st, first, kDecodeSteps, ids, &avail);
    cpu::profile_enable(false);
    if (!s) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 1;
    }
    const double decode_s = avail.back();
    std::vector<double> steps_ms;
    for (size_t i = 0; i < avail.size(); ++i) steps_ms.push_back(1e3 * (avail[i] - (i ? avail[i - 1] : 0.0)));
    std::vector<double> sorted = steps_ms;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int32_t> gen{first};
    gen.insert(gen.end(), ids.begin(), ids.end());
    double bytes = 0;
    for (int i = 0; i < kDecodeSteps; ++i) bytes += step_bytes(cfg, P + i, kv_es);
    const double gbps = bytes / decode_s / 1e9;
    char digest[32];
    std::snprintf(digest, sizeof digest, "%016llx", (unsigned long long)fnv1a(gen));
    nlohmann::json r;
    r["context"] = P;
    r["prefill_s"] = prefill_s;
    r["prefill_tok_s"] = P / prefill_s;
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
    out["results"].push_back(r);
    std::fprintf(stderr, "| %d | %.1f | %.1f | %.3f | %.0f | %s | %s |\n", P, P / prefill_s, kDecodeSteps / decode_s,
                 sorted[sorted.size() / 2], gbps, copy > 0 ? std::to_string(gbps / copy).substr(0, 5).c_str() : "-", digest);
  }
  const std::string text = out.dump(1);
  if (!a.json_out.empty()) std::ofstream(a.json_out) << text << "\n";
  std::printf("%s\n", text.c_str());
  return 0;
}

Registrar reg("bench", "Benchmark (Lily's contract): timed prefill + 64 greedy decode steps per context, JSON out",
              [](CLI::App& app) -> RunFn {
                auto a = std::make_shared<BenchArgs>();
                app.add_option("--model", a->model, "Checkpoint directory")->required();
                app.add_option("--backend", a->backend, "cuda, cpu or cpu-ref");
                app.add_option("--contexts", a->contexts, "Comma-separated prompt lengths (the sweep)");
                app.add_option("--max-seq", a->max_seq, "Skip contexts that do not fit (prompt + 64 + 2)");
                app.add_option("--threads", a->threads, "CPU threads (0: all cores)");
                app.add_option("--json", a->json_out, "Also write the JSON to this file");
                app.add_option("--label", a->label, "Free text recorded in the JSON (commit, notes)");
                return [a] { return run_bench(*a); };
              });

}  // namespace
}  // namespace lily::cli
