// qgemm's dense wgmma tile (qgemm_wg.cu): 128 weight rows × 64 activation rows per block, Hopper
// wgmma, for dense 4-bit calls of many rows. Called by qgemm(); arguments checked there.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/gemm/qgemm.h"

namespace lily::cuda {

struct WgArgs {
  QGemmArgs a;
  int N = 0, K = 0;  // weight rows, columns
  int S = 1;         // k splits (qgemm_splits)
  int C = 0, T = 0;  // 64-row chunks of the activations, 128-row tiles of the weights
};
int qgemm_wg_chunks(int M);
Status qgemm_wg(const WgArgs& g, cudaStream_t s);

}  // namespace lily::cuda
