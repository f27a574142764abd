// Tensor-core MoE decode down kernel (moe_tc.cu): which MoeArgs it takes (MoeArgs::tc set: the decode
// step's calls; k·I + Is ≤ 4608 with I, Is multiples of 64) and its launch. gate+up runs on moe.cu's kernel.
#pragma once
#include "backend/cuda/common/ops.h"

namespace lily::cuda {
bool moe_down_tc_ok(const MoeArgs& a);  // a with Is resolved (shared width)
Status moe_down_tc(const MoeArgs& a, Stream s);
}  // namespace lily::cuda
