// The fast CPU backend (`--backend cpu`): the reference forward pass of cpu_backend.cpp with its
// matmuls, DeltaNet steps and attention on the SIMD kernels of fast_kernels.h. The reference
// stays reachable as `--backend cpu-ref` (make_cpu_backend in backend.h).
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace lily {

// weights must outlive the backend. Refuses quantization the fast kernels do not take (group
// size other than 64, bit widths other than 4 and 8) by name. state_limit_bytes: as make_cpu_backend's.
Result<std::unique_ptr<Backend>> make_fast_cpu_backend(const ModelWeights& weights, size_t state_limit_bytes = 0);

// Bytes of every weight tensor of the model (what one pass over all experts reads).
size_t model_weight_bytes(const ModelWeights& w);
// Bytes one decode token reads: dense weights, the top-k routed experts and the lm_head row set.
size_t decode_bytes_per_token(const ModelWeights& w);
// Weight elements one token multiplies outside the lm_head (each a multiply-add): the mixer projections,
// router, shared expert and its gate, and the top-k routed experts. A prefill of M tokens does
// 2·M·this FLOPs of weight products plus one lm_head row set (attention scores are not counted).
size_t macs_per_token(const ModelWeights& w);

}  // namespace lily
