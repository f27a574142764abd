// Hopper (sm_90a) warpgroup MMA primitives: the 128-byte-swizzle shared memory descriptor, fences, and the
// wgmma shapes (wgmma_shapes.cuh; the cp.async copies: mma_sync.cuh).
#pragma once
#include <cstdint>

#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/common/wgmma_shapes.cuh"

namespace lily::cuda::pf {

// K-major operand tile with 128-byte rows (64 fp16 of k) in the 128B swizzle: 16-byte chunk c of
// row r lives at r·128 + ((c ^ (r & 7)) << 4); 8-row atoms 1024 bytes apart (SBO), base aligned
// to 1024. Advancing k by 16 elements adds 32 bytes (2 in the address field).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ uint32_t sw128_off(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ void wg_arrive() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across a wgmma wait.
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace lily::cuda::pf
