// Device copy of the model weights: one arena holding every tensor, with the fused concatenations
// [qkv|z|a|b], [q|k|v], router|shared-gate (Q8) and shared [gate|up] (see upload.cu).
#pragma once
#include <vector>

#include "backend/cuda/common/ops.h"
#include "core/status.h"
#include "model/weights.h"

namespace lily {
namespace cuda {

struct DevLayer {
  bool attn = false;
  const void* in_norm = nullptr;
  const void* post_norm = nullptr;
  // GDN
  QW in_proj, out_proj;  // in_proj = [qkv | z | a | b]
  const void* conv_w = nullptr;
  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* gnorm = nullptr;
  // attention
  QW qkv, o_proj;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  // MoE
  QW router;  // [E + 1, H] 8-bit: router rows, then shared_expert_gate
  QW gate, up, down, sh_gate_up, sh_down;
  FragExperts frag;  // the experts in fragment order (moe/xgemm.h), where made (CudaBackend::frag_copies)
};

struct DevWeights {
  QW embed, lm_head;
  const void* final_norm = nullptr;
  std::vector<DevLayer> layers;
};

// Uploads every weight once (mmap → two pinned staging buffers → one device arena, with a progress
// line when verbose). On success *arena owns the device memory and *gbps is the upload rate.
Status upload_weights(const ModelWeights& w, bool verbose, void** arena, DevWeights& d, double* gbps);

}  // namespace cuda
}  // namespace lily
