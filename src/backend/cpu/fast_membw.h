// What this machine allows now, the limits bench-cpu reports its numbers against: memory read
// bandwidth, measured the way a decode step reads weights (every pool thread streams its slice of a
// buffer much larger than the caches), and the fp32 FMA rate of all pool threads (best of 3 passes each).
#pragma once

namespace lily::cpu::fast {

// GB/s (1e9 bytes/s) over a buffer of `gib` GiB (allocated and freed here).
double measure_read_gbps(double gib = 2.0);
// GFLOP/s of fp32 FMAs (2 FLOPs each) on every pool thread at once, register-only chains of the kernel
// table's vector width (KernelTable::fma_flops): the compute peak the prefill GEMM's fp32 arithmetic has.
double measure_fma_gflops();

}  // namespace lily::cpu::fast
