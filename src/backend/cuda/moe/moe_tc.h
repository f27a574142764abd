// Tensor-core MoE decode expert kernels (moe_tc.cu): which MoeArgs they take (LILY_MOE_TC bit 1 =
// gate+up at H 2048, bit 2 = down for k·I + Is ≤ 4608 with I, Is multiples of 64) and their launches.
#pragma once
#include "backend/cuda/common/ops.h"

namespace lily::cuda {
int moe_tc_mode(const MoeArgs& a);  // LILY_MOE_TC if set, else 2 (down only) when a.tc, else 0
bool moe_gate_up_tc_ok(const MoeArgs& a);  // a with Is resolved (shared width)
bool moe_down_tc_ok(const MoeArgs& a);
Status moe_gate_up_tc(const MoeArgs& a, Stream s);
Status moe_down_tc(const MoeArgs& a, Stream s);
}  // namespace lily::cuda
