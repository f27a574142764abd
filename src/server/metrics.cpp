// Metrics: see metrics.h.
#include "server/metrics.h"

#include "structured/constraint.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace lily {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  counts_[i]++;
  sum_ += v;
  n_++;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, n_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}) {}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  requests_[{route, status}]++;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(s);
}

void Metrics::observe_itl(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(s);
}

std::string Metrics::render(const Engine& engine) const {
  std::string out;
  const auto& st = engine.stats();
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP lily_requests_total HTTP requests by route and status code.\n# TYPE lily_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    out += fmt::format("lily_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  out += fmt::format("# HELP lily_prompt_tokens_total Prompt tokens of finished requests.\n"
                     "# TYPE lily_prompt_tokens_total counter\nlily_prompt_tokens_total {}\n",
                     st.prompt_tokens.load());
  out += fmt::format("# HELP lily_completion_tokens_total Generated tokens.\n"
                     "# TYPE lily_completion_tokens_total counter\nlily_completion_tokens_total {}\n",
                     st.completion_tokens.load());
  out += "# HELP lily_time_to_first_token_seconds From request arrival to the first generated token.\n"
         "# TYPE lily_time_to_first_token_seconds histogram\n";
  ttft_.render("lily_time_to_first_token_seconds", out);
  out += "# HELP lily_inter_token_latency_seconds Between consecutive generated tokens of a request.\n"
         "# TYPE lily_inter_token_latency_seconds histogram\n";
  itl_.render("lily_inter_token_latency_seconds", out);
  out += fmt::format("# HELP lily_queue_depth Requests waiting for the engine.\n# TYPE lily_queue_depth gauge\n"
                     "lily_queue_depth {}\n",
                     engine.queue_depth());
  out += fmt::format("# HELP lily_requests_running Requests being generated.\n# TYPE lily_requests_running gauge\n"
                     "lily_requests_running {}\n",
                     engine.running());
  out += fmt::format("# HELP lily_decode_steps_total Batched decode steps.\n# TYPE lily_decode_steps_total counter\n"
                     "lily_decode_steps_total {}\n"
                     "# HELP lily_decode_rows_total Sequences advanced by those steps (rows / steps = mean batch).\n"
                     "# TYPE lily_decode_rows_total counter\nlily_decode_rows_total {}\n",
                     st.decode_steps.load(), st.decode_rows.load());
  out += fmt::format("# HELP lily_spec_rows_total Decode rows that verified prompt-lookup drafts (--spec-draft).\n"
                     "# TYPE lily_spec_rows_total counter\nlily_spec_rows_total {}\n"
                     "# HELP lily_spec_draft_tokens_total Draft tokens verified.\n"
                     "# TYPE lily_spec_draft_tokens_total counter\nlily_spec_draft_tokens_total {}\n"
                     "# HELP lily_spec_accepted_tokens_total Draft tokens that matched the drawn token (delivered).\n"
                     "# TYPE lily_spec_accepted_tokens_total counter\nlily_spec_accepted_tokens_total {}\n",
                     st.spec_rows.load(), st.spec_drafted.load(), st.spec_accepted.load());
  {
    // Resident set size of the whole process (Prometheus' standard name), from /proc/self/statm.
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    out += fmt::format("# HELP process_resident_memory_bytes Resident memory of the server process.\n"
                       "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n",
                       resident * ::sysconf(_SC_PAGESIZE));
  }
  out += fmt::format("# HELP lily_prefix_cache_hits_total Requests that continued a cached model state.\n"
                     "# TYPE lily_prefix_cache_hits_total counter\nlily_prefix_cache_hits_total {}\n"
                     "# HELP lily_prefix_cache_misses_total Requests that prefilled from scratch.\n"
                     "# TYPE lily_prefix_cache_misses_total counter\nlily_prefix_cache_misses_total {}\n"
                     "# HELP lily_prefix_cache_tokens_total Prompt tokens served from the cache.\n"
                     "# TYPE lily_prefix_cache_tokens_total counter\nlily_prefix_cache_tokens_total {}\n",
                     st.cache_hits.load(), st.cache_misses.load(), st.cached_tokens.load());
  {
    // State memory: the plan's budget (EngineOptions::memory_budget_bytes, 0: no limit) and how it is used.
    const uint64_t budget = engine.options().memory_budget_bytes, reserved = st.mem_reserved.load(),
                   cached = st.mem_cached.load(), spare = st.mem_spare.load();
    const uint64_t taken = reserved + cached + spare;
    out += fmt::format(
        "# HELP lily_state_memory_budget_bytes Memory for sequence states, running, cached and spare (0: no limit).\n"
        "# TYPE lily_state_memory_budget_bytes gauge\nlily_state_memory_budget_bytes {}\n"
        "# HELP lily_state_memory_max_seq_bytes Memory of one sequence state at --max-seq.\n"
        "# TYPE lily_state_memory_max_seq_bytes gauge\nlily_state_memory_max_seq_bytes {}\n"
        "# HELP lily_state_memory_reserved_bytes Set aside for running requests: each one's state at prompt + max_tokens (what it holds, if more).\n"
        "# TYPE lily_state_memory_reserved_bytes gauge\nlily_state_memory_reserved_bytes {}\n"
        "# HELP lily_state_memory_running_bytes Held by running requests' states now.\n"
        "# TYPE lily_state_memory_running_bytes gauge\nlily_state_memory_running_bytes {}\n"
        "# HELP lily_prefix_cache_bytes Held by the prefix cache's states (evicted when a request needs the memory).\n"
        "# TYPE lily_prefix_cache_bytes gauge\nlily_prefix_cache_bytes {}\n"
        "# HELP lily_state_memory_spare_bytes Held by states kept for reuse (freed when a request needs the memory).\n"
        "# TYPE lily_state_memory_spare_bytes gauge\nlily_state_memory_spare_bytes {}\n"
        "# HELP lily_state_memory_free_bytes Budget neither reserved nor held by cached or spare states (0 without a budget).\n"
        "# TYPE lily_state_memory_free_bytes gauge\nlily_state_memory_free_bytes {}\n"
        "# HELP lily_requests_running_max Requests that may run at once (--parallel after the memory plan).\n"
        "# TYPE lily_requests_running_max gauge\nlily_requests_running_max {}\n"
        "# HELP lily_memory_waits_total Requests that waited in the queue for state memory.\n"
        "# TYPE lily_memory_waits_total counter\nlily_memory_waits_total {}\n"
        "# HELP lily_state_memory_failures_total State allocations or K/V growths that failed (that request ended with a 503).\n"
        "# TYPE lily_state_memory_failures_total counter\nlily_state_memory_failures_total {}\n",
        budget, engine.state_memory().bytes_for(engine.options().max_seq, engine.options().max_seq), reserved,
        st.mem_running.load(), cached, spare, budget > taken ? budget - taken : 0, engine.options().max_batch,
        st.memory_waits.load(), st.state_failures.load());
  }
  const auto& mt = structured::mask_totals();
  out += fmt::format("# HELP lily_structured_masks_total Token masks computed for constrained (structured) outputs.\n"
                     "# TYPE lily_structured_masks_total counter\nlily_structured_masks_total {}\n"
                     "# HELP lily_structured_mask_seconds_total Time spent computing them.\n"
                     "# TYPE lily_structured_mask_seconds_total counter\nlily_structured_mask_seconds_total {:.6f}\n",
                     mt.masks.load(), double(mt.nanoseconds.load()) * 1e-9);
  return out;
}

}  // namespace lily
