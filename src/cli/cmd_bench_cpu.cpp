// `lily bench-cpu --model DIR`: Lily's bench contract on the CPU backends (prompt token
// i = ((i·2654435761) mod 2^32) mod vocab; a warm-up state of the same shape; timed prefill to the
// first token; 64 timed greedy decode steps; JSON with tok/s, per-step times, an FNV-1a digest of the
// generated ids and GB/s), plus what a CPU needs to judge it: the memory read bandwidth measured in
// the same run and a per-op breakdown of the decode steps with achieved GB/s.
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/fast_backend.h"
#include "backend/cpu/fast_membw.h"
#include "backend/cpu/fast_mmap.h"
#include "backend/cpu/fast_ops.h"
#include "backend/cpu/fast_profile.h"
#include "cli/command.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/logits.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily::cli {
namespace {

using clock_type = std::chrono::steady_clock;
double secs(clock_type::time_point a, clock_type::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Args {
  std::string model, backend = "cpu", json_out;
  int prompt_len = 256, decode = 64, threads = 0;
  double bw_gib = 2.0;
};

// CPU seconds (user + system) of this process so far.
double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// System load average over the last minute (-1 if unreadable).
double loadavg1() {
  double l[3];
  return getloadavg(l, 3) >= 1 ? l[0] : -1.0;
}

uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : ids)
    for (int b = 0; b < 4; ++b) h = (h ^ ((uint32_t(id) >> (8 * b)) & 0xFF)) * 1099511628211ull;
  return h;
}

int run(const Args& a) {
  ModelOptions mo;
  mo.backend = a.backend;
  mo.threads = a.threads;
  mo.verbose = false;
  const auto tl = clock_type::now();
  auto model = Model::load(a.model, mo);
  if (!model.is_ok()) return std::fprintf(stderr, "lily bench-cpu: %s\n", model.message().c_str()), 1;
  Model& m = **model;
  const double load_s = secs(tl, clock_type::now());
  // Analytic bytes per decode token, from a second (zero-copy) view of the same files.
  // And the FLOPs of a prefill's weight products: 2 per weight element a token multiplies, plus the
  // last token's lm_head.
  size_t bytes_tok = 0, bytes_all = 0, macs_tok = 0, macs_head = 0;
  if (auto ck = Checkpoint::open(a.model); ck.is_ok())
    if (auto w = ModelWeights::from_checkpoint(**ck); w.is_ok()) {
      bytes_tok = decode_bytes_per_token(*w), bytes_all = model_weight_bytes(*w), macs_tok = macs_per_token(*w);
      macs_head = size_t(w->lm_head.rows) * size_t(w->lm_head.cols);
    }
  const int V = m.config().vocab_size;
  std::vector<int32_t> prompt(size_t(a.prompt_len));
  for (int i = 0; i < a.prompt_len; ++i) prompt[i] = int32_t((uint64_t(i) * 2654435761ull % (1ull << 32)) % uint64_t(V));
  const int cap = a.prompt_len + a.decode + 2;
  std::vector<float> logits(static_cast<size_t>(V));

  fmt::print(stderr, "bench-cpu: {} threads, kernels {}, measuring memory bandwidth and the FMA peak...\n",
             ThreadPool::global().size(), cpu::fast::kernels().name);
  const double bw = cpu::fast::measure_read_gbps(a.bw_gib);
  const double fma_peak = cpu::fast::measure_fma_gflops();

  // Warm-up: same prompt shape, prefill + one decode step (touches the dense weights and sizes scratch).
  {
    auto st = m.new_state(cap);
    if (!st.is_ok()) return std::fprintf(stderr, "lily bench-cpu: %s\n", st.message().c_str()), 1;
    Status s = m.forward(**st, prompt, logits);
    int32_t t = argmax(logits);
    if (s.is_ok()) s = m.forward(**st, std::span<const int32_t>(&t, 1), logits);
    if (!s.is_ok()) return std::fprintf(stderr, "lily bench-cpu: %s\n", s.message().c_str()), 1;
  }
  auto st = m.new_state(cap);
  cpu::profile_reset();
  cpu::profile_enable(true);
  const double load_before = loadavg1();
  const double c0 = process_cpu_s();
  const auto t0 = clock_type::now();
  Status s = m.forward(**st, prompt, logits);
  int32_t tok = argmax(logits);
  const double prefill_s = secs(t0, clock_type::now());
  const double prefill_cpu_s = process_cpu_s() - c0;
  if (!s.is_ok()) return std::fprintf(stderr, "lily bench-cpu: %s\n", s.message().c_str()), 1;
  const auto prof_prefill = cpu::profile_snapshot();

  cpu::profile_reset();
  cpu::profile_enable(true);
  std::vector<int32_t> ids{tok};
  std::vector<double> step_s;
  const double c1 = process_cpu_s();
  const auto d0 = clock_type::now();
  auto prev = d0;
  for (int i = 0; i < a.decode; ++i) {
    s = m.forward(**st, std::span<const int32_t>(&tok, 1), logits);
    if (!s.is_ok()) return std::fprintf(stderr, "lily bench-cpu: %s\n", s.message().c_str()), 1;
    tok = argmax(logits);
    ids.push_back(tok);
    const auto now = clock_type::now();
    step_s.push_back(secs(prev, now));
    prev = now;
  }
  const double decode_s = secs(d0, prev);
  const double decode_cpu_s = process_cpu_s() - c1;
  const int nthreads = ThreadPool::global().size();
  // Share of the pool's cores this process actually got (other work on a shared machine lowers it).
  const double prefill_share = prefill_cpu_s / (prefill_s * nthreads), decode_share = decode_cpu_s / (decode_s * nthreads);
  cpu::profile_enable(false);
  const auto prof = cpu::profile_snapshot();

  const double dec_tps = a.decode / decode_s, pre_tps = a.prompt_len / prefill_s;
  std::vector<double> sorted = step_s;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json j;
  j["backend"] = m.backend_name();
  j["kernels"] = a.backend == "cpu" ? cpu::fast::kernels().name : "reference";
  j["threads"] = ThreadPool::global().size();
  j["model"] = a.model;
  j["load_s"] = load_s;
  j["prompt_len"] = a.prompt_len;
  j["prefill_s"] = prefill_s;
  j["prefill_cpu_share"] = prefill_share;
  j["decode_cpu_share"] = decode_share;
  j["loadavg1_before"] = load_before;
  j["loadavg1_after"] = loadavg1();
  j["prefill_tok_s"] = pre_tps;
  j["decode_steps"] = a.decode;
  j["decode_s"] = decode_s;
  j["decode_tok_s"] = dec_tps;
  j["decode_step_s"] = step_s;
  j["decode_step_median_s"] = sorted[sorted.size() / 2];
  j["token_ids"] = ids;
  j["digest_fnv1a64"] = fmt::format("{:016x}", fnv1a(ids));
  j["weights_bytes"] = bytes_all;
  j["decode_bytes_per_token"] = bytes_tok;
  j["decode_gb_s"] = bytes_tok * dec_tps / 1e9;
  j["mem_read_gb_s"] = bw;
  j["file_pmd_mapped_bytes"] = cpu::fast::file_pmd_mapped_bytes();
  j["decode_bw_fraction"] = bw > 0 ? bytes_tok * dec_tps / 1e9 / bw : 0.0;
  const double pre_gflops = 2.0 * double(macs_tok * size_t(a.prompt_len) + macs_head) / prefill_s / 1e9;
  j["prefill_gflop_per_token"] = 2.0 * double(macs_tok) / 1e9;
  j["prefill_gflop_s"] = pre_gflops;
  j["fma_peak_gflop_s"] = fma_peak;
  j["prefill_fma_fraction"] = fma_peak > 0 ? pre_gflops / fma_peak : 0.0;
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& o : prof) {
    if (!o.calls) continue;
    ops.push_back({{"op", o.name},
                   {"ms_per_token", 1e3 * o.seconds / a.decode},
                   {"share", o.seconds / decode_s},
                   {"mb_per_token", o.bytes / a.decode / 1e6},
                   {"gb_s", o.seconds > 0 ? o.bytes / o.seconds / 1e9 : 0.0}});
  }
  j["decode_ops"] = ops;
  nlohmann::json pops = nlohmann::json::array();
  for (const auto& o : prof_prefill)
    if (o.calls)
      pops.push_back({{"op", o.name}, {"s", o.seconds}, {"share", o.seconds / prefill_s}, {"gb", o.bytes / 1e9},
                      {"gb_s", o.seconds > 0 ? o.bytes / o.seconds / 1e9 : 0.0}});
  j["prefill_ops"] = pops;

  fmt::print("load average (1 min) {:.2f} before, {:.2f} after; CPU share of the {} threads: prefill {:.0f}%, decode {:.0f}% "
             "(below ~95%: other processes took cores; the numbers are then low)\n",
             load_before, loadavg1(), nthreads, 100 * prefill_share, 100 * decode_share);
  fmt::print("prefill {} tokens: {:.3f} s = {:.2f} tok/s; {:.2f} GFLOP/token of weight products -> {:.1f} GFLOP/s = {:.0f}% "
             "of the {:.1f} GFLOP/s fp32 FMA peak measured now\n",
             a.prompt_len, prefill_s, pre_tps, 2.0 * double(macs_tok) / 1e9, pre_gflops, 100.0 * pre_gflops / std::max(fma_peak, 1e-9),
             fma_peak);
  fmt::print("decode {} steps: {:.3f} s = {:.2f} tok/s (median step {:.1f} ms); {:.2f} GB/token -> {:.1f} GB/s = {:.0f}% "
             "of the {:.1f} GB/s read bandwidth measured now\n",
             a.decode, decode_s, dec_tps, 1e3 * sorted[sorted.size() / 2], bytes_tok / 1e9, bytes_tok * dec_tps / 1e9,
             100.0 * bytes_tok * dec_tps / 1e9 / std::max(bw, 1e-9), bw);
  fmt::print("decode per op (ms/token, share, MB/token, GB/s):\n");
  for (const auto& o : ops)
    fmt::print("  {:<28} {:8.2f} {:5.1f}% {:9.1f} {:7.1f}\n", o["op"].get<std::string>(), o["ms_per_token"].get<double>(),
               100 * o["share"].get<double>(), o["mb_per_token"].get<double>(), o["gb_s"].get<double>());
  fmt::print("prefill per op (s, share, GB read, GB/s):\n");
  for (const auto& o : pops)
    fmt::print("  {:<28} {:8.3f} {:5.1f}% {:9.2f} {:7.1f}\n", o["op"].get<std::string>(), o["s"].get<double>(),
               100 * o["share"].get<double>(), o["gb"].get<double>(), o["gb_s"].get<double>());
  fmt::print("weights mapped with 2 MiB pages: {:.2f} GB\n", cpu::fast::file_pmd_mapped_bytes() / 1e9);
  fmt::print("digest {}\n", j["digest_fnv1a64"].get<std::string>());
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    f << j.dump(2) << "\n";
  } else {
    fmt::print("{}\n", j.dump());
  }
  return 0;
}

Registrar reg("bench-cpu", "CPU benchmark: prefill and 64 decode steps, per-op GB/s against measured memory bandwidth",
              [](CLI::App& app) {
                auto a = std::make_shared<Args>();
                app.add_option("--model", a->model, "checkpoint directory")->required();
                app.add_option("--backend", a->backend, "cpu | cpu-ref")->check(CLI::IsMember({"cpu", "cpu-ref"}));
                app.add_option("--prompt-len", a->prompt_len, "prompt tokens (default 256)");
                app.add_option("--decode", a->decode, "timed decode steps (default 64)");
                app.add_option("--threads", a->threads, "threads (0 = all cores)");
                app.add_option("--json", a->json_out, "write the JSON report here instead of stdout");
                app.add_option("--bw-gib", a->bw_gib, "buffer for the bandwidth measurement, GiB (default 2)");
                return [a]() { return run(*a); };
              });

}  // namespace
}  // namespace lily::cli
