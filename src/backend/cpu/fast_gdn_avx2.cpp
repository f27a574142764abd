// The DeltaNet prefill kernels of fast_gdn_impl.inc on AVX2 + FMA (8 lanes; GEMM blocks of 4 rows
// x 16 columns, which fit the 16 ymm registers), with a vector expf (fast_vec_avx2.inc).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cpu/fast_gdn_kernels.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx2,fma")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx2.inc"

struct V : Avx2 {
  static constexpr int NV = 2, MR = 4;  // GEMM blocks of 4 rows x 16 columns: 8 + 2 of the 16 ymm
};

#include "backend/cpu/fast_gdn_impl.inc"

}  // namespace

constinit const GdnKernels kGdnAvx2{gdn_chunk_impl, conv4_silu_impl, gated_norm_impl, silu_mul_impl, rmsnorm_impl, attend_impl};

}  // namespace lily::cpu::fast
