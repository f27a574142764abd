// plan_memory: see memory_plan.h.
#include "engine/memory_plan.h"

#include <algorithm>

#include <fmt/format.h>

namespace lily {

std::string format_bytes(size_t b) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  const double d = double(b);
  if (d >= kGiB) return fmt::format("{:.1f} GiB", d / kGiB);
  if (d >= kMiB) return fmt::format("{:.1f} MiB", d / kMiB);
  if (d >= kKiB) return fmt::format("{:.1f} KiB", d / kKiB);
  return fmt::format("{} B", b);
}

Result<MemoryPlan> plan_memory(const MemoryPlanInput& in) {
  if (in.max_seq <= 0 || in.parallel <= 0) return errorf("memory plan: max_seq {} and parallel {} must be positive", in.max_seq, in.parallel);
  MemoryPlan p;
  p.device = in.device;
  p.state = in.state;
  p.max_seq = in.max_seq;
  p.headroom = std::min(in.device.free / 4, std::max(size_t(1) << 30, in.device.total / 32));
  const size_t available = in.device.free - p.headroom;
  p.budget = available;
  if (in.budget_limit > 0) {
    p.budget = std::min(in.budget_limit, available);
    if (in.budget_limit > available)
      p.notes.push_back(fmt::format("--state-mb asks for {} but only {} is free (less {} headroom): using {}",
                                    format_bytes(in.budget_limit), format_bytes(in.device.free), format_bytes(p.headroom),
                                    format_bytes(p.budget)));
  }
  p.state_new = in.state.bytes_for(0, in.max_seq);
  p.state_max = in.state.bytes_for(in.max_seq, in.max_seq);
  if (p.state_max > p.budget)
    return errorf("one sequence state at --max-seq {} takes {}, but only {} is left for states ({} free after the weights "
                  "and scratch, less {} headroom{}): lower --max-seq{}",
                  in.max_seq, format_bytes(p.state_max), format_bytes(p.budget), format_bytes(in.device.free),
                  format_bytes(p.headroom), in.budget_limit > 0 ? ", within --state-mb" : "",
                  in.budget_limit > 0 ? " or raise --state-mb" : "");
  // The prefix cache holds what running requests leave: it is evicted before a request waits, so its
  // budget needs no room of its own (it only cannot exceed the whole budget).
  p.cache_budget = std::min(in.cache_budget, p.budget);
  p.fit_at_max_seq = int(std::min<size_t>(p.budget / p.state_max, size_t(1) << 30));
  p.parallel = in.parallel;
  if (in.parallel > p.fit_at_max_seq) {
    if (in.parallel_is_default) {
      p.parallel = p.fit_at_max_seq;
      p.notes.push_back(fmt::format("--parallel lowered from the default {} to {}: that many states at --max-seq {} ({} each) "
                                    "fit in {}; give --parallel to allow more requests at once (a request waits in the "
                                    "queue while its state does not fit) or lower --max-seq",
                                    in.parallel, p.parallel, in.max_seq, format_bytes(p.state_max), format_bytes(p.budget)));
    } else {
      p.notes.push_back(fmt::format("--parallel {}: only {} requests fit at once at full context (--max-seq {}, {} each, in {}); "
                                    "a request is admitted when its state at prompt + max_tokens fits, else it waits in the queue",
                                    in.parallel, p.fit_at_max_seq, in.max_seq, format_bytes(p.state_max),
                                    format_bytes(p.budget)));
    }
  }
  return p;
}

std::vector<std::string> MemoryPlan::summary() const {
  const size_t running = size_t(parallel) * state_max;
  return {
      fmt::format("memory: {} free of {} after the weights and scratch; {} for sequence states ({} kept free)",
                  format_bytes(device.free), format_bytes(device.total), format_bytes(budget), format_bytes(headroom)),
      fmt::format("memory: a state is {} (DeltaNet states, conv windows) + {} of K/V per position: {} new, {} at --max-seq {}",
                  format_bytes(state.alloc_bytes(state.fixed)), format_bytes(state.per_position), format_bytes(state_new),
                  format_bytes(state_max), max_seq),
      fmt::format("memory: --parallel {} at --max-seq take {} of {} ({} fit); the prefix cache keeps up to {} of what they "
                  "leave (evicted before a request waits)",
                  parallel, format_bytes(running), format_bytes(budget), fit_at_max_seq, format_bytes(cache_budget)),
  };
}

}  // namespace lily
