// The memory plan of a server, computed once at start from the backend's numbers: how much of the
// memory where states live (the GPU's after the weights are loaded and the scratch is prepared; the
// host's on the CPU) goes to sequence states, what one state takes at --max-seq, how many running
// requests fit at full context beside the prefix cache, and what that means for --parallel. The
// engine then admits requests by their projected state within `budget`
// (EngineOptions::memory_budget_bytes). Pure arithmetic: tested against hand-computed sizes.
//
// The rules (docs/server.md, "Memory"):
//   headroom  = min(free / 4, max(1 GiB, total / 32)): kept free for what grows after the plan
//               (scratch of a longer prompt segment, re-captured graphs, allocator pages);
//   budget    = free - headroom, or --state-mb if smaller: running, cached and spare states;
//   state_max = one state at --max-seq; if it does not fit the budget the server does not start;
//   fit       = budget / state_max: requests that run at once at full context;
//   --parallel: the default is lowered to `fit`; an explicit value above it is kept (a warning says
//               that requests then wait in the queue when the running ones hold the memory);
//   the prefix cache keeps up to --cache-mb (at most the budget) of what running requests leave: it
//               is evicted before a request waits, so it takes no room from them.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace lily {

struct MemoryPlanInput {
  StateMemory state;                 // Model::state_memory(max_seq)
  DeviceMemory device;               // Model::device_memory() after load and Model::prepare
  int max_seq = 0;
  int parallel = 0;                  // --parallel, or the backend's default
  bool parallel_is_default = true;   // no --parallel given: lowered to what fits
  size_t cache_budget = 0;           // --cache-mb, bytes
  size_t budget_limit = 0;           // --state-mb, bytes (0: none)
};

struct MemoryPlan {
  DeviceMemory device;
  StateMemory state;
  size_t headroom = 0;      // kept free
  size_t budget = 0;        // for sequence states: running + cached + spare
  size_t state_new = 0;     // a new state (its initial K/V positions)
  size_t state_max = 0;     // one state at max_seq
  int max_seq = 0;
  int parallel = 0;         // --parallel after the plan
  size_t cache_budget = 0;  // prefix cache budget after the plan
  int fit_at_max_seq = 0;   // states at max_seq that fit the budget
  std::vector<std::string> notes;  // what the plan changed or warns about, one line each
  // The plan in a few readable lines for the log (without the notes).
  std::vector<std::string> summary() const;
};

// An error (the server should not start) when one state at max_seq does not fit the budget.
Result<MemoryPlan> plan_memory(const MemoryPlanInput& in);

// "1.5 GiB", "70.0 MiB", "40.0 KiB", "512 B".
std::string format_bytes(size_t b);

}  // namespace lily
