// The per-instruction-set DeltaNet prefill kernels (fast_gdn_impl.inc compiled three times), the
// GdnKernels part of the kernel tables of fast_kernels_{scalar,avx2,avx512}.cpp. Constant-initialized,
// so the tables may read them whenever they are built.
#pragma once
#include "backend/cpu/fast_kernels.h"

namespace lily::cpu::fast {

extern const GdnKernels kGdnScalar;  // fast_gdn_scalar.cpp
extern const GdnKernels kGdnAvx2;    // fast_gdn_avx2.cpp
extern const GdnKernels kGdnAvx512;  // fast_gdn_avx512.cpp

}  // namespace lily::cpu::fast
