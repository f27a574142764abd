// The tensor-core kernels' shared device primitives: cp.async copies into shared memory (16-byte `.cg`,
// 8- and 4-byte `.ca`, a size of 0 zero-fills), their commit and wait, mma.sync m16n8k16 with fp32
// accumulation (f16 operands; A as the four 32-bit registers of the fragment), ldmatrix x4, and the exact fp16 pair of two small integers. Each asm is `volatile` with a memory
// clobber where it orders shared-memory traffic, so the compiler keeps loads after their wait.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace lily::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) { cp16(smem_u32(dst), src, ok); }
__device__ __forceinline__ void cp8(uint32_t dst, const void* src, int bytes) {  // bytes 8, 4 (zero the rest) or 0
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) { cp4(smem_u32(dst), src, ok); }
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// c[4] (fp32, the m16n8 accumulator fragment) += A (16×16, a[4]) · B (16×8, b0 b1).
__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// Two codes q0, q1 < 1024 → the half2 (q0, q1), exact: (1024 + q) − 1024.
__device__ __forceinline__ uint32_t q2h(uint32_t q0, uint32_t q1) {
  const uint32_t pk = q0 | (q1 << 16) | 0x64006400u;
  __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&pk), __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace lily::cuda
