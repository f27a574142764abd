// The end of a grid-wide GEMV epilogue, shared by gemv_q4.cu and gemv_tc.cu: which block finishes last,
// and the lm_head argmax over the blocks' (value, row) partials (larger value first, then the lower row;
// rows whose value is NaN never entered a partial), which then advances the step control block.
#pragma once
#include <cfloat>
#include <climits>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/moe/dec_topk.cuh"

namespace lily::cuda {

// Last block of the grid? (after every block's writes are fenced). Every thread of the block calls it.
__device__ inline bool grid_last_block(uint32_t* counter, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  return *flag;
}

// Every thread of the last block (nw warps; wbv/wbi: shared [nw]): the best of a.partial's gridDim.x
// (value, row) pairs becomes the step's token: ctl->tok, ctl->last_argmax; pos += 1; the
// counter is reset for the next step. All NaN: token 0.
__device__ inline void argmax_finish(const GemvArgs& a, int nw, float* wbv, int* wbi) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float2* part = static_cast<const float2*>(a.partial);
  float bv = -FLT_MAX;
  int bi = INT_MAX;
  for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
    const float2 pv = __ldcg(part + b);
    if (topk_better(pv.x, __float_as_int(pv.y), bv, bi)) bv = pv.x, bi = __float_as_int(pv.y);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (topk_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __syncthreads();  // wbv/wbi may still be read by the block's own partial
  if (lane == 0) wbv[warp] = bv, wbi[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < nw; ++w)
      if (topk_better(wbv[w], wbi[w], bv, bi)) bv = wbv[w], bi = wbi[w];
    if (bi == INT_MAX) bi = 0;  // all NaN
    StepCtl* c = a.ctl;
    c->tok = bi;
    c->last_argmax = bi;
    c->pos += 1;
    c->counter[1] = 0;
  }
}

}  // namespace lily::cuda
