// CudaStateLayout: see cuda_state_layout.h.
#include "backend/cuda_state_layout.h"

namespace lily {

StateMemory CudaStateLayout::memory() const {
  StateMemory m;
  m.fixed = fixed_arena();
  m.per_position = 2 * size_t(n_attn) * kv_row;
  // span(cap * kv_row) = cap * kv_row + 256 when kv_row is a multiple of 256; at most + 271 otherwise.
  m.kv_base = 2 * size_t(n_attn) * (kv_row % 256 == 0 ? 256 : 271);
  m.initial_positions = initial_positions;
  m.position_step = kCudaKvStep;
  m.page = kCudaPage;
  m.kv_elem = kKvElem;
  m.s_elem = kSElem;
  return m;
}

CudaStateLayout cuda_state_layout(const ModelConfig& cfg, size_t ctl_bytes, int initial_positions) {
  const size_t es = CudaStateLayout::kKvElem;
  CudaStateLayout l;
  l.conv_bytes = 2 * size_t(cfg.gdn_conv_dim()) * (cfg.linear_conv_kernel_dim - 1) * es;
  l.S_bytes = size_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim * CudaStateLayout::kSElem;
  l.ctl_bytes = ctl_bytes;
  l.kv_row = size_t(cfg.num_key_value_heads) * cfg.head_dim * es;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) (cfg.is_full_attention[i] ? l.n_attn : l.n_gdn)++;
  l.initial_positions = initial_positions > 0 ? initial_positions : kCudaKvInitial;
  return l;
}

}  // namespace lily
