// Device helpers shared by the decode kernels: bf16 rounding as on the CPU, warp/block
// reductions, the packed-code chunk dot (16-byte chunk = 32 4-bit or 16 8-bit codes), the
// padded shared-memory staging of x that keeps the chunk reads free of bank conflicts, and
// programmatic dependent launch (PDL): kernels issue their weight loads, then wait for the
// previous kernel (griddepcontrol.wait) before touching activations or state.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "backend/cuda/common/ops.h"

namespace lily::cuda {

// errorf for CUDA translation units: nvcc 13 + GCC 12 cannot compile fmt's formatting code, so
// messages are built with iostreams; only plain "{}" placeholders.
inline void cu_fmt(std::string& out, const char* f) { out += f; }
template <typename T, typename... A> void cu_fmt(std::string& out, const char* f, const T& v, const A&... rest) {
  const char* p = std::strstr(f, "{}");
  if (!p) {
    out += f;
    return;
  }
  out.append(f, p);
  std::ostringstream os;
  os << v;
  out += os.str();
  cu_fmt(out, p + 2, rest...);
}
template <typename... A> Status cu_err(const char* f, const A&... a) {
  std::string s;
  cu_fmt(s, f, a...);
  return Status::error(std::move(s));
}

#define LILY_CU_TRY(expr)                                                                    \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess) return cu_err("{}:{}: {}: {}", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
  } while (0)

inline Status launch_status(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cu_err("CUDA launch of {} failed: {}", what, cudaGetErrorString(e));
  return Status::ok();
}

__device__ __forceinline__ float bf(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
__device__ __forceinline__ float bf(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ uint16_t to_bf(float f) {
  __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<uint16_t*>(&h);
}
__device__ __forceinline__ float rbf(float f) { return bf(to_bf(f)); }
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
// The DeltaNet state's element: fp16, loaded to fp32 and rounded to nearest once a store (every kernel
// computes in fp32).
__device__ __forceinline__ float ld_state(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void st_state(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (max) over all threads of the block (blockDim.x multiple of 32, ≤ 1024); red: 32 floats smem.
template <bool MAX> __device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const float t = lane < nw ? red[lane] : MAX ? -INFINITY : 0.0f;
  return MAX ? warp_max(t) : warp_sum(t);
}
__device__ __forceinline__ float block_sum(float v, float* red) { return block_reduce<false>(v, red); }
__device__ __forceinline__ float block_max(float v, float* red) { return block_reduce<true>(v, red); }

// Codes per 16-byte chunk and the padded stride of a chunk's x values in shared memory.
template <int BITS> struct Chunk {
  static constexpr int kCodes = 128 / BITS;       // 32 or 16
  static constexpr int kStride = kCodes + 4;      // floats; conflict-free float4 reads
};
template <int BITS> __device__ __forceinline__ int xs_index(int e) {
  return (e / Chunk<BITS>::kCodes) * Chunk<BITS>::kStride + e % Chunk<BITS>::kCodes;
}

// Exact small-integer → float: byte b of w placed in the mantissa of 2^23, minus 2^23.
__device__ __forceinline__ float byte_f(uint32_t w, int b) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650 | b)) - 8388608.0f;
}

// Σ q·x over one chunk. xc: the chunk's 32 (4-bit) or 16 (8-bit) x values in shared memory.
template <int BITS> __device__ __forceinline__ float chunk_dot(uint4 w, const float* xc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float a0 = 0.f, a1 = 0.f;
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = ws[i] & 0x0F0F0F0Fu, hi = (ws[i] >> 4) & 0x0F0F0F0Fu;
      const float4 xa = *reinterpret_cast<const float4*>(xc + 8 * i);
      const float4 xb = *reinterpret_cast<const float4*>(xc + 8 * i + 4);
      a0 = fmaf(byte_f(lo, 0), xa.x, a0);
      a1 = fmaf(byte_f(hi, 0), xa.y, a1);
      a0 = fmaf(byte_f(lo, 1), xa.z, a0);
      a1 = fmaf(byte_f(hi, 1), xa.w, a1);
      a0 = fmaf(byte_f(lo, 2), xb.x, a0);
      a1 = fmaf(byte_f(hi, 2), xb.y, a1);
      a0 = fmaf(byte_f(lo, 3), xb.z, a0);
      a1 = fmaf(byte_f(hi, 3), xb.w, a1);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 xa = *reinterpret_cast<const float4*>(xc + 4 * i);
      a0 = fmaf(byte_f(ws[i], 0), xa.x, a0);
      a1 = fmaf(byte_f(ws[i], 1), xa.y, a1);
      a0 = fmaf(byte_f(ws[i], 2), xa.z, a0);
      a1 = fmaf(byte_f(ws[i], 3), xa.w, a1);
    }
  }
  return a0 + a1;
}

// Scale·Σqx + bias·Σx of one chunk of row r (chunk c), with group size 64.
template <int BITS> __device__ __forceinline__ float chunk_term(uint4 w, uint32_t sb, const float* xs,
                                                                const float* xcs, int c) {
  const float d = chunk_dot<BITS>(w, xs + c * Chunk<BITS>::kStride);
  return fmaf(__uint_as_float(sb << 16), d, __uint_as_float(sb & 0xFFFF0000u) * xcs[c]);
}
template <int BITS> __device__ __forceinline__ uint32_t load_sb(const QW& w, int r, int c) {
  const int groups = w.cols / 64, chunks_per_group = 64 / Chunk<BITS>::kCodes;
  return __ldg(reinterpret_cast<const uint32_t*>(w.sb) + size_t(r) * groups + c / chunks_per_group);
}
__device__ __forceinline__ uint4 load_chunk(const QW& w, int r, int c, int nch) {
  return __ldg(reinterpret_cast<const uint4*>(w.codes) + size_t(r) * nch + c);
}

// Stage fp32 x [K] (K a multiple of 32) into padded shared memory xs and per-chunk sums xcs
// (whole block). Each thread issues its (up to 8) loads before the first use (L2, not L1: x was
// written by an earlier kernel), so the staging costs one load latency, not K/blockDim of them.
// U values of a row (elements e0 + u·blockDim.x) into xs at xs_index, and each chunk's sum into xcs.
template <int BITS, int U> __device__ __forceinline__ void stage_put(const float (&v)[U], int e0, int K, float* xs, float* xcs) {
  constexpr int CC = Chunk<BITS>::kCodes;
  const int lane = threadIdx.x & 31, nt = blockDim.x;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int e = e0 + u * nt;  // warp-uniform bound: K and nt are multiples of 32
    if (e - lane < K) {
      xs[xs_index<BITS>(e)] = v[u];
      float s = v[u];
#pragma unroll
      for (int o = CC / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane % CC == 0) xcs[e / CC] = s;
    }
  }
}
template <int BITS> __device__ __forceinline__ void stage_plain(const float* __restrict__ x, int K, float* xs, float* xcs) {
  constexpr int U = 8;
  const int nt = blockDim.x;
  for (int e0 = threadIdx.x; e0 < K; e0 += U * nt) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = e0 + u * nt < K ? __ldcg(x + e0 + u * nt) : 0.f;
    stage_put<BITS, U>(v, e0, K, xs, xcs);
  }
}
// stage_plain of rows b < B (x [B][ldx]) at sm + b·rf (then its chunk sums at + nch·kStride), the loads of
// RB rows in flight together (one row at a time waited on a memory round trip per row; RB = 4 spilled in
// bgemv2_kernel, the grouped kernel stages 4 or 8 at once).
template <int BITS, int RB = 2>
__device__ __forceinline__ void stage_plain_rows(const float* __restrict__ x, int ldx, int K, int B, float* sm, int rf) {
  constexpr int U = 8;
  const int nt = blockDim.x, xcs_off = K * BITS / 128 * Chunk<BITS>::kStride;
  for (int e0 = threadIdx.x; e0 < K; e0 += U * nt)
    for (int b0 = 0; b0 < B; b0 += RB) {
      float v[RB][U];
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u)
          v[r][u] = b0 + r < B && e0 + u * nt < K ? __ldcg(x + size_t(b0 + r) * ldx + e0 + u * nt) : 0.f;
#pragma unroll
      for (int r = 0; r < RB; ++r)
        if (b0 + r < B) stage_put<BITS, U>(v[r], e0, K, sm + (b0 + r) * rf, sm + (b0 + r) * rf + xcs_off);
    }
}

// The device's SM count (queried once; 132, the H200's, if the query fails): grids sized per SM.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}

// ---- programmatic dependent launch ------------------------------------------------------------
// Wait until the previous kernel in the stream has completed and its writes are visible (a no-op
// when launched without the PDL attribute). Everything before it may read weights only.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// pdl_wait for a kernel that issues loads of weights (registers) before it, to overlap them with the
// previous kernel. ptxas schedules griddepcontrol.wait (SASS ACQBULK) as early as it can: with only
// independent instructions before it in its basic block it hoists the wait above those loads, so they
// start only after the previous kernel ends. Seen in the SASS of 73da090 (ACQBULK first, then all 44
// LDGs of the add+norm tensor-core GEMV; the pruned L2-prefetch code had been a block boundary between
// them), it cost the batch-1 step 2.13 → 2.32–2.42 ms on one H100. A loop ptxas cannot count is a block
// boundary it does not move the wait across: n is any runtime value ≥ 0 (a shape from the kernel's
// arguments), so the loop never runs.
__device__ __forceinline__ void pdl_wait_after_loads(int n) {
  for (int i = n; i < 0; ++i) asm volatile("nanosleep.u32 1;");
  pdl_wait();
}
// Let the next kernel's blocks be scheduled (they run up to their own pdl_wait). Called right
// after pdl_wait, so at most one kernel prefetches ahead of the running one.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Launches kernel k with the programmatic-stream-serialization attribute (on a created stream), so
// it may start while the previous kernel finishes. Every kernel asks for the same L1/shared split
// (max shared), so a kernel's blocks can be co-resident with its predecessor's (PDL) without the SM
// draining to reconfigure.
// launch_kc: the same with thread-block clusters of cluster_x blocks along x (0 = none).
template <typename... KArgs, typename... Args>
Status launch_kc(const char* what, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                 int cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (cluster_x > 0) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = cluster_x, attr[na].val.clusterDim.y = 1, attr[na].val.clusterDim.z = 1;
    ++na;
  }
  if (s != nullptr) {  // not on the legacy default stream (tests)
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  cudaFuncSetAttribute(reinterpret_cast<const void*>(k), cudaFuncAttributePreferredSharedMemoryCarveout,
                       int(cudaSharedmemCarveoutMaxShared));
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...);
  if (e != cudaSuccess) return cu_err("CUDA launch of {} failed: {}", what, cudaGetErrorString(e));
  return launch_status(what);
}
template <typename... KArgs, typename... Args>
Status launch_k(const char* what, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  return launch_kc(what, k, grid, block, smem, s, 0, std::forward<Args>(args)...);
}

}  // namespace lily::cuda
