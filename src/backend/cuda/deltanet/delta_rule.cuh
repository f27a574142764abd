// The delta rule's per-thread arithmetic, shared by the decode step (gdn.cu) and the batched step
// (batch_gdn.cu) so that a batched row is bit-identical to the same row alone. A thread holds 32 rows
// (i0 .. i0+31) of one column of a head's state S [dk, dv] in sv (fp32, loaded by ld_state); ks and qs
// point at the normalized k and q of those rows (k[i0..], q[i0..]; shared memory).
#pragma once
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {

// S ← α·S on the slice; returns the slice's part of (α·S)ᵀk for this column.
__device__ __forceinline__ float delta_decay_dot(float (&sv)[32], const float* ks, float alpha) {
  float r = 0.f;
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) {
    sv[ii] *= alpha;
    r += sv[ii] * ks[ii];
  }
  return r;
}

// S ← S + k·delta on the slice, each value stored (st_state) at col_base + ii·ld; returns the slice's
// part of Sᵀq for this column.
__device__ __forceinline__ float delta_update_read(float (&sv)[32], const float* ks, const float* qs, float delta,
                                                   __half* col_base, size_t ld) {
  float o = 0.f;
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) {
    sv[ii] += ks[ii] * delta;
    o += sv[ii] * qs[ii];
    st_state(col_base + size_t(ii) * ld, sv[ii]);
  }
  return o;
}

}  // namespace lily::cuda
