// Memory read bandwidth of this machine now, measured the way a decode step reads weights: every
// pool thread streams its slice of a buffer much larger than the caches (best of 3 passes).
#pragma once

namespace lily::cpu::fast {

// GB/s (1e9 bytes/s) over a buffer of `gib` GiB (allocated and freed here).
double measure_read_gbps(double gib = 2.0);

}  // namespace lily::cpu::fast
