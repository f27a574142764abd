// Tensor-core 4-bit GEMV (gemv_tc.cu): which GemvArgs it takes (LILY_GEMV_TC bit 1 = add-norm
// prologue, 2 = plain, 4 = lm_head argmax; K 2048 or 4096, 4-bit, 16-byte aligned activations), and its launch.
#pragma once
#include "backend/cuda/common/ops.h"

namespace lily::cuda {
int gemv_tc_mode(const GemvArgs& a);  // LILY_GEMV_TC if set, else 7 when a.tc, else 0
bool gemv_tc_eligible(const GemvArgs& a);
Status gemv_tc(const GemvArgs& a, Stream s);
}  // namespace lily::cuda
