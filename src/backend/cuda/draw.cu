// draw_rows: three kernels, so that a row's vocabulary is read by many SMs, not one. (1) argmax per
// 4,096-id slice, first of ties; (2) one warp per 256-id block: for a temperature draw, the weights
// exp((l − max)·inv_t) with core/sample_math.cpp's polynomial, every product and sum rounded
// separately (__fmul_rn/__fadd_rn) as the host computes them without FMA, and their double sum in
// the host's order (one lane); for log-probabilities, Σ exp(l − max) in double; (3) one block per
// row: thread 0 walks the block sums and then the ids in order, as draw_inverse_cdf does; log Σ exp
// and the top-k by per-thread lists merged in k rounds of block argmax.
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

// Block-wide best (value, id) over NT threads; every thread gets the result. red: 2·32 words of smem.
template <int NT>
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
    v = lane < NT / 32 ? rv[lane] : -FLT_MAX;
    i = lane < NT / 32 ? ri[lane] : -1;
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

// Scratch per draw: w [B][V] f32 | part_v [B][S] f32 | part_i [B][S] i32 | sums [B][nb] f64 |
// esums [B][nb] f64, each part 16-byte aligned.
constexpr int kSlice = 4096;  // ids per block of the max pass
constexpr int kT1 = 256;      // threads of the max and weights passes (8 warps: 8 id blocks each)
struct Scratch {
  float* w;
  float* pv;
  int* pi;
  double* sums;
  double* esums;
};
__host__ __device__ inline size_t align16(size_t x) { return (x + 15) & ~size_t(15); }
__host__ __device__ inline Scratch carve(void* base, int B, int V) {
  const int S = (V + kSlice - 1) / kSlice, nb = (V + kBlk - 1) / kBlk;
  char* p = static_cast<char*>(base);
  Scratch s;
  s.w = reinterpret_cast<float*>(p), p += align16(size_t(B) * V * sizeof(float));
  s.pv = reinterpret_cast<float*>(p), p += align16(size_t(B) * S * sizeof(float));
  s.pi = reinterpret_cast<int*>(p), p += align16(size_t(B) * S * sizeof(int));
  s.sums = reinterpret_cast<double*>(p), p += align16(size_t(B) * nb * sizeof(double));
  s.esums = reinterpret_cast<double*>(p);
  return s;
}

// The row's argmax (first of ties) from its S slice partials; every thread gets it.
template <int NT>
__device__ int row_best(const float* pv, const int* pi, int S, float* rv, int* ri) {
  float bv = -FLT_MAX;
  int bi = -1;
  for (int j = threadIdx.x; j < S; j += NT)
    if (better(pv[j], pi[j], bv, bi)) bv = pv[j], bi = pi[j];
  block_best<NT>(bv, bi, rv, ri);
  return bi < 0 ? 0 : bi;
}

// (1) grid (S, B): the best (value, id) of each kSlice ids.
__global__ void __launch_bounds__(kT1) draw_max_kernel(const float* __restrict__ logits, int V, Scratch sc) {
  __shared__ float rv[32];
  __shared__ int ri[32];
  const int row = blockIdx.y, S = gridDim.x, i0 = blockIdx.x * kSlice, i1 = min(V, i0 + kSlice);
  const float* l = logits + size_t(row) * V;
  float bv = -FLT_MAX;
  int bi = -1;
  for (int i = i0 + threadIdx.x; i < i1; i += kT1)
    if (better(l[i], i, bv, bi)) bv = l[i], bi = i;
  block_best<kT1>(bv, bi, rv, ri);
  if (threadIdx.x == 0) sc.pv[size_t(row) * S + blockIdx.x] = bv, sc.pi[size_t(row) * S + blockIdx.x] = bi;
}

// (2) grid (ceil(nb / 8), B), one warp per kBlk-id block: the temperature weights and their double
// sum in the host's order (one lane, as block_sums adds them), and for log-probabilities
// Σ exp(l − max) in double over the block.
__global__ void __launch_bounds__(kT1) draw_weights_kernel(const float* __restrict__ logits, int V, int S,
                                                           const DrawSpec* __restrict__ spec, Scratch sc) {
  __shared__ float rv[32];
  __shared__ int ri[32];
  __shared__ float ws[kT1 / 32][kBlk];
  const int row = blockIdx.y, nb = (V + kBlk - 1) / kBlk;
  const DrawSpec sp = spec[row];
  if (!(sp.inv_t > 0.0f) && sp.top_logprobs < 0) return;  // greedy, no log-probabilities
  const float* l = logits + size_t(row) * V;
  const float mx = l[row_best<kT1>(sc.pv + size_t(row) * S, sc.pi + size_t(row) * S, S, rv, ri)];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x * (kT1 / 32) + warp;
  if (b >= nb) return;
  const int i0 = b * kBlk, n = min(V, i0 + kBlk) - i0;
  if (sp.inv_t > 0.0f) {
    float* w = sc.w + size_t(row) * V;
    for (int k = lane; k < n; k += 32) {
      const float z = __fmul_rn(__fsub_rn(l[i0 + k], mx), sp.inv_t);
      const float x = z > -40.0f ? exp_host_rn(z) : 0.0f;
      w[i0 + k] = x;
      ws[warp][k] = x;
    }
    __syncwarp();
    if (lane == 0) {
      const float* x = ws[warp];
      double s = 0.0;
      int k = 0;
      for (; k + 4 <= n; k += 4)
        s = __dadd_rn(s, __dadd_rn(__dadd_rn(double(x[k]), double(x[k + 1])), __dadd_rn(double(x[k + 2]), double(x[k + 3]))));
      for (; k < n; ++k) s = __dadd_rn(s, double(x[k]));
      sc.sums[size_t(row) * nb + b] = s;
    }
  }
  if (sp.top_logprobs >= 0) {
    double e = 0.0;
    for (int k = lane; k < n; k += 32) e += exp(double(l[i0 + k]) - double(mx));
    for (int o = 16; o > 0; o >>= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
    if (lane == 0) sc.esums[size_t(row) * nb + b] = e;
  }
}

// (3) one block per row: the argmax, the inverse-CDF walk over the block sums and then the ids of
// the block it lands in (one thread, in id order, as draw_inverse_cdf does), log Σ exp and the
// top-k by per-thread lists merged in k rounds of block argmax.
__global__ void __launch_bounds__(kT) draw_finish_kernel(const float* __restrict__ logits, int V, int S,
                                                         const DrawSpec* __restrict__ spec, Drawn* __restrict__ out,
                                                         Scratch sc) {
  extern __shared__ double sums[];  // [nb]
  __shared__ float rv[32];
  __shared__ int ri[32];
  __shared__ float wb[kBlk];
  __shared__ double walk_u;
  __shared__ int walk_b, walk_found;
  const int row = blockIdx.x, t = threadIdx.x, nb = (V + kBlk - 1) / kBlk;
  const float* l = logits + size_t(row) * V;
  const DrawSpec sp = spec[row];
  const int best = row_best<kT>(sc.pv + size_t(row) * S, sc.pi + size_t(row) * S, S, rv, ri);
  const float mx = l[best];
  int id = best;
  if (sp.inv_t > 0.0f) {
    const float* w = sc.w + size_t(row) * V;
    for (int b = t; b < nb; b += kT) sums[b] = sc.sums[size_t(row) * nb + b];
    __syncthreads();
    if (t == 0) {
      double total = 0.0;
      for (int b = 0; b < nb; ++b) total = __dadd_rn(total, sums[b]);
      walk_u = __dmul_rn(sp.u, total);
      walk_b = 0;
      walk_found = -1;
    }
    __syncthreads();
    for (;;) {
      // Thread 0 skips the blocks whose sum u covers; everyone stages the weights of the next one.
      if (t == 0) {
        int b = walk_b;
        double u = walk_u;
        while (b < nb && u >= sums[b] && b + 1 < nb) u = __dsub_rn(u, sums[b]), ++b;
        walk_b = b, walk_u = u;
      }
      __syncthreads();
      const int b = walk_b;
      if (b >= nb) break;
      const int i0 = b * kBlk, n = min(V, i0 + kBlk) - i0;
      if (t < n) wb[t] = w[i0 + t];
      __syncthreads();
      if (t == 0) {
        double u = walk_u;
        for (int k = 0; k < n; ++k) {
          u = __dsub_rn(u, double(wb[k]));
          if (u < 0.0 && wb[k] > 0.0f) {
            walk_found = i0 + k;
            break;
          }
        }
        walk_u = u;
        walk_b = walk_found >= 0 ? nb : b + 1;
      }
      __syncthreads();
    }
    id = walk_found < 0 ? best : walk_found;
  }
  Drawn* o = out + row;
  if (t == 0) o->id = id, o->n_top = 0, o->logprob = 0.0f;
  if (sp.top_logprobs < 0) return;
  if (t == 0) {
    double s = 0.0;
    for (int b = 0; b < nb; ++b) s += sc.esums[size_t(row) * nb + b];
    walk_u = double(mx) + log(s);
  }
  __syncthreads();
  const double log_z = walk_u;
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
    block_best<kT>(v, i, rv, ri);
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

size_t draw_scratch_bytes(int B, int V) {
  const size_t S = size_t((V + kSlice - 1) / kSlice), nb = size_t((V + kBlk - 1) / kBlk);
  return align16(size_t(B) * V * sizeof(float)) + align16(size_t(B) * S * sizeof(float)) +
         align16(size_t(B) * S * sizeof(int)) + 2 * align16(size_t(B) * nb * sizeof(double));
}

Status draw_rows(const float* logits, int B, int V, const DrawSpec* spec, Drawn* out, void* scratch, void* stream) {
  if (B <= 0) return Status::ok();
  if (V <= 0 || V > (1 << 24)) return cu_err("draw_rows: vocabulary {} out of range", V);
  if (B > 65535) return cu_err("draw_rows: {} rows is more than one launch takes", B);
  const int S = (V + kSlice - 1) / kSlice, nb = (V + kBlk - 1) / kBlk;
  const size_t smem = size_t(nb) * sizeof(double);
  if (smem > 200 * 1024) return cu_err("draw_rows: vocabulary {} too large for the block sums", V);
  static size_t attr = 0;
  if (smem > 40 * 1024 && smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(draw_finish_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  const Scratch sc = carve(scratch, B, V);
  auto st = static_cast<cudaStream_t>(stream);
  draw_max_kernel<<<dim3(unsigned(S), unsigned(B)), kT1, 0, st>>>(logits, V, sc);
  LILY_TRY(launch_status("draw_max_kernel"));
  draw_weights_kernel<<<dim3(unsigned((nb + kT1 / 32 - 1) / (kT1 / 32)), unsigned(B)), kT1, 0, st>>>(logits, V, S, spec, sc);
  LILY_TRY(launch_status("draw_weights_kernel"));
  draw_finish_kernel<<<B, kT, smem, st>>>(logits, V, S, spec, out, sc);
  return launch_status("draw_finish_kernel");
}

}  // namespace lily::cuda
