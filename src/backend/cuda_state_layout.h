// The device memory of one CUDA sequence state, as arithmetic: plain C++ (no CUDA), so the
// CPU-only build tests it, and one definition that cuda_state.cu allocates by and the engine's
// memory plan counts by (CudaBackend::state_memory). A state is two allocations, which
// cuda_state.cu carves into buffers:
//   the fixed arena: per DeltaNet layer its conv window [2, C, K-1] fp32 and its state S [nv, dk, dv]
//     fp16; then the StepCtl;
//   the K/V arena: per attention layer K, then V, each [nkv, cap, hd] fp32.
// Each buffer starts on 256 bytes with at least 16 free bytes after the one before it (the
// kernels' vector tails). cudaMalloc takes allocations of 2 MiB or more in whole 2 MiB pages: one
// allocation per kind, instead of one per buffer (81 at full size, 30 of them 2 MiB + 16 bytes),
// wastes at most a page of each.
#pragma once
#include <cstddef>

#include "io/config.h"
#include "model/model.h"

namespace lily {

inline constexpr size_t kCudaPage = size_t(2) << 20;  // cudaMalloc's granularity for large allocations
inline constexpr int kCudaKvInitial = 2048;            // K/V positions of a new state (LILY_CUDA_KV_INITIAL overrides)
inline constexpr int kCudaKvStep = 16;                 // K/V capacities are multiples of this (up to max_seq)

struct CudaStateLayout {
  size_t conv_bytes = 0;  // one DeltaNet layer's conv window
  size_t S_bytes = 0;     // one DeltaNet layer's state S
  size_t ctl_bytes = 0;   // the StepCtl
  size_t kv_row = 0;      // one position of one K or V buffer: nkv * hd * element size
  static constexpr int kKvElem = 4;  // bytes an element of the K/V caches and conv windows (fp32)
  static constexpr int kSElem = 2;  // bytes an element of S (fp16; every kernel computes in fp32)
  int n_gdn = 0, n_attn = 0;
  int initial_positions = kCudaKvInitial;

  // Bytes a buffer of b bytes takes in its arena (its start to the next buffer's).
  static size_t span(size_t b) { return (b + 16 + 255) / 256 * 256; }
  size_t kv_buffer(int cap) const { return size_t(cap) * kv_row; }  // one K or V buffer
  size_t fixed_arena() const { return size_t(n_gdn) * (span(conv_bytes) + span(S_bytes)) + span(ctl_bytes); }
  size_t kv_arena(int cap) const { return 2 * size_t(n_attn) * span(kv_buffer(cap)); }
  // As StateMemory: exact when kv_row is a multiple of 256 (every preset), an upper bound otherwise.
  StateMemory memory() const;
};

// ctl_bytes: sizeof(StepCtl).
CudaStateLayout cuda_state_layout(const ModelConfig& cfg, size_t ctl_bytes, int initial_positions);

}  // namespace lily
