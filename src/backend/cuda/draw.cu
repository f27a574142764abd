// draw_rows: one block of 1024 threads per row. (1) argmax, first of ties; (2) for a temperature
// draw, the weights exp((l − max)·inv_t) with core/sample_math.cpp's polynomial, every product and
// sum rounded separately (__fmul_rn/__fadd_rn) as the host computes them without FMA; (3) their
// double sums per 256-id block in the host's order, each block by one thread; (4) thread 0 walks
// the blocks and then the ids in order, as draw_inverse_cdf does; (5) if asked, log Σ exp in
// double and the top-k by per-thread lists merged in k rounds of block argmax.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/draw.h"
#include "core/sample_math.h"

namespace lily::cuda {
namespace {

constexpr int kT = 1024;
constexpr int kBlk = int(kDrawBlock);

// core/sample_math.cpp's exp4, one lane.
__device__ __forceinline__ float exp_host_rn(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 0.0f ? 0.0f : x;
  const float kf = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f), 12582912.0f);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(kf, 0.693359375f)), __fmul_rn(kf, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  const int k = int(kf);
  return __fmul_rn(p, __int_as_float((k + 127) << 23));
}

// (value, id) order of the draw: larger value first, then lower id; NaN never wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0 || !(v == v)) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, id); every thread gets the result. red: 2·32 words of smem.
__device__ void block_best(float& v, int& i, float* rv, int* ri) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) rv[warp] = v, ri[warp] = i;
  __syncthreads();
  if (warp == 0) {
    v = lane < kT / 32 ? rv[lane] : -FLT_MAX;
    i = lane < kT / 32 ? ri[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (better(ov, oi, v, i)) v = ov, i = oi;
    }
    if (lane == 0) rv[0] = v, ri[0] = i;
  }
  __syncthreads();
  v = rv[0], i = ri[0];
}

__device__ double block_dsum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kT / 32 ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

__global__ void __launch_bounds__(kT) draw_kernel(const float* __restrict__ logits, int V, const DrawSpec* __restrict__ spec,
                                                  Drawn* __restrict__ out, float* __restrict__ wscratch) {
  extern __shared__ double sums[];  // [nb]
  __shared__ float rv[32];
  __shared__ int ri[32];
  __shared__ double rd[32];
  const int row = blockIdx.x, t = threadIdx.x;
  const float* l = logits + size_t(row) * V;
  float* w = wscratch + size_t(row) * V;
  const DrawSpec sp = spec[row];
  // (1) argmax, first of ties.
  float bv = -FLT_MAX;
  int bi = -1;
  for (int i = t; i < V; i += kT)
    if (better(l[i], i, bv, bi)) bv = l[i], bi = i;
  block_best(bv, bi, rv, ri);
  const int best = bi < 0 ? 0 : bi;
  const float mx = l[best];
  int id = best;
  if (sp.inv_t > 0.0f) {
    // (2) weights, (3) block sums in the host's order.
    for (int i = t; i < V; i += kT) {
      const float z = __fmul_rn(__fsub_rn(l[i], mx), sp.inv_t);
      w[i] = z > -40.0f ? exp_host_rn(z) : 0.0f;
    }
    __syncthreads();
    const int nb = (V + kBlk - 1) / kBlk;
    for (int b = t; b < nb; b += kT) {
      const int i0 = b * kBlk, i1 = min(V, i0 + kBlk);
      double s = 0.0;
      int i = i0;
      for (; i + 4 <= i1; i += 4)
        s = __dadd_rn(s, __dadd_rn(__dadd_rn(double(w[i]), double(w[i + 1])), __dadd_rn(double(w[i + 2]), double(w[i + 3]))));
      for (; i < i1; ++i) s = __dadd_rn(s, double(w[i]));
      sums[b] = s;
    }
    __syncthreads();
    // (4) the walk, on one thread.
    if (t == 0) {
      double total = 0.0;
      for (int b = 0; b < nb; ++b) total = __dadd_rn(total, sums[b]);
      double u = __dmul_rn(sp.u, total);
      int found = -1;
      for (int b = 0; b < nb && found < 0; ++b) {
        if (u >= sums[b] && b + 1 < nb) {
          u = __dsub_rn(u, sums[b]);
          continue;
        }
        for (int i = b * kBlk; i < min(V, b * kBlk + kBlk); ++i) {
          u = __dsub_rn(u, double(w[i]));
          if (u < 0.0 && w[i] > 0.0f) {
            found = i;
            break;
          }
        }
      }
      ri[0] = found < 0 ? best : found;
    }
    __syncthreads();
    id = ri[0];
    __syncthreads();
  }
  Drawn* o = out + row;
  if (t == 0) o->id = id, o->n_top = 0, o->logprob = 0.0f;
  if (sp.top_logprobs < 0) return;
  // (5) log Σ exp in double, then the top-k.
  double s = 0.0;
  for (int i = t; i < V; i += kT) s += exp(double(l[i]) - double(mx));
  const double log_z = double(mx) + log(block_dsum(s, rd));
  if (t == 0) o->logprob = float(double(l[id]) - log_z);
  const int k = min(sp.top_logprobs, kMaxDrawTop);
  if (k == 0) return;
  float tv[kMaxDrawTop];
  int ti[kMaxDrawTop];
  int n = 0;
  for (int i = t; i < V; i += kT) {  // ids ascend: an equal value never displaces an earlier one
    const float v = l[i];
    if (!(v == v)) continue;
    if (n == k && !(v > tv[k - 1])) continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && v > tv[j - 1]) tv[j] = tv[j - 1], ti[j] = ti[j - 1], --j;
    tv[j] = v, ti[j] = i;
  }
  int head = 0;
  for (int r = 0; r < k; ++r) {
    float v = head < n ? tv[head] : -FLT_MAX;
    int i = head < n ? ti[head] : -1;
    block_best(v, i, rv, ri);
    if (i < 0) break;
    if (head < n && ti[head] == i) ++head;
    if (t == 0) {
      o->top_id[r] = i;
      o->top_logprob[r] = float(double(l[i]) - log_z);
      o->n_top = r + 1;
    }
  }
}

}  // namespace

size_t draw_scratch_bytes(int B, int V) { return size_t(B) * size_t(V) * sizeof(float); }

Status draw_rows(const float* logits, int B, int V, const DrawSpec* spec, Drawn* out, void* scratch, void* stream) {
  if (B <= 0) return Status::ok();
  if (V <= 0 || V > (1 << 24)) return cu_err("draw_rows: vocabulary {} out of range", V);
  const size_t smem = size_t((V + kBlk - 1) / kBlk) * sizeof(double);
  if (smem > 200 * 1024) return cu_err("draw_rows: vocabulary {} too large for the block sums", V);
  static size_t attr = 0;
  if (smem > 48 * 1024 && smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(draw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  draw_kernel<<<B, kT, smem, static_cast<cudaStream_t>(stream)>>>(logits, V, spec, out, static_cast<float*>(scratch));
  return launch_status("draw_kernel");
}

}  // namespace lily::cuda
