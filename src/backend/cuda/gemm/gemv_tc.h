// Tensor-core 4-bit GEMV (gemv_tc.cu): which GemvArgs it takes (GemvArgs::tc set: the decode step's calls;
// add-norm or plain prologue, no epilogue or the lm_head argmax; K 2048 or 4096, 4-bit, 16-byte aligned
// activations), and its launch.
#pragma once
#include "backend/cuda/common/ops.h"

namespace lily::cuda {
bool gemv_tc_eligible(const GemvArgs& a);
Status gemv_tc(const GemvArgs& a, Stream s);
}  // namespace lily::cuda
