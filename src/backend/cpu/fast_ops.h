// Drivers of the fast CPU kernels: run-time choice of the instruction set, and quantized-matmul
// jobs spread over the global thread pool. A job list is cut into tasks of whole row blocks
// (every task reads a contiguous range of weight rows once, for all its activation rows), and the
// tasks are taken dynamically, so uneven jobs (8 experts and a shared expert) still fill the pool.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/fast_kernels.h"

namespace lily::cpu::fast {

// The table in use: LILY_CPU_ISA=scalar|avx2|avx512 if set (an unavailable one is refused, falling
// back to the best available with a warning), else the best the CPU supports.
const KernelTable& kernels();
// Names of the tables this CPU can run, best first (tests run every one).
std::vector<std::string> available_isas();
// Selects a table by name for the whole process; false if unavailable.
bool select_isa(const std::string& name);

void run_qjobs(std::span<const QJob> jobs);

// Runs fn(i) for i in [0, n) over the pool, items taken dynamically.
void parallel_dynamic(int n, const std::function<void(int)>& fn);

}  // namespace lily::cpu::fast
