// CUDA per-sequence state: allocation, on-demand growth of the K/V caches, and clone (the prefix
// cache's snapshot). K/V caches are [nkv, cap, hd] per attention layer; cap starts at
// kInitialPositions (or max_seq if smaller) and at least doubles when a step needs more, so a
// state holds memory for the positions it uses, not for max_seq.
#include "backend/cuda/cuda_backend.h"

namespace lily::cuda {
namespace {

// Positions allocated up front: 2,048 x 40 KB (fp32 K+V, 10 layers x 2 heads x 256) = 80 MB at full size.
// LILY_CUDA_KV_INITIAL overrides it (tests use it to cross growth boundaries at small lengths).
int initial_positions() {
  const char* e = std::getenv("LILY_CUDA_KV_INITIAL");
  const int v = e ? std::atoi(e) : 0;
  return v > 0 ? v : 2048;
}

void replace_owned(std::vector<void*>& owned, void* old_p, void* new_p) {
  for (void*& p : owned)
    if (p == old_p) {
      p = new_p;
      return;
    }
  owned.push_back(new_p);
}

// Allocates (zeroed) K/V caches of `cap` positions for every attention layer of st, copying the
// first `keep` positions of each head from the current ones; on failure nothing changes.
Status realloc_kv(CudaSeqState& st, int cap, int keep) {
  const size_t es = st.f32 ? 4 : 2;
  const size_t row = size_t(st.hd) * es;  // bytes per position per head
  const size_t bytes = size_t(st.nkv) * cap * row;
  struct Fresh { void* k; void* v; };
  std::vector<Fresh> fresh(st.layers.size(), Fresh{nullptr, nullptr});
  auto release = [&]() {
    for (auto& f : fresh) {
      if (f.k) cudaFree(f.k);
      if (f.v) cudaFree(f.v);
    }
  };
  for (size_t i = 0; i < st.layers.size(); ++i) {
    const auto& l = st.layers[i];
    if (!l.kc) continue;
    if (cudaMalloc(&fresh[i].k, bytes + 16) != cudaSuccess || cudaMalloc(&fresh[i].v, bytes + 16) != cudaSuccess) {
      cudaGetLastError();
      release();
      return cu_err("cuda: out of device memory growing a KV cache to {} positions ({:.1f} MB per layer)", cap,
                    2.0 * bytes / 1e6);
    }
    LILY_CU_TRY(cudaMemset(fresh[i].k, 0, bytes + 16));
    LILY_CU_TRY(cudaMemset(fresh[i].v, 0, bytes + 16));
    if (keep > 0) {
      // Head h's first `keep` positions: old stride st.cap * row, new stride cap * row.
      LILY_CU_TRY(cudaMemcpy2D(fresh[i].k, size_t(cap) * row, l.kc, size_t(st.cap) * row, size_t(keep) * row, st.nkv,
                               cudaMemcpyDeviceToDevice));
      LILY_CU_TRY(cudaMemcpy2D(fresh[i].v, size_t(cap) * row, l.vc, size_t(st.cap) * row, size_t(keep) * row, st.nkv,
                               cudaMemcpyDeviceToDevice));
    }
  }
  for (size_t i = 0; i < st.layers.size(); ++i) {
    auto& l = st.layers[i];
    if (!fresh[i].k) continue;
    replace_owned(st.owned, l.kc, fresh[i].k);
    replace_owned(st.owned, l.vc, fresh[i].v);
    cudaFree(l.kc);
    cudaFree(l.vc);
    l.kc = static_cast<uint16_t*>(fresh[i].k);
    l.vc = static_cast<uint16_t*>(fresh[i].v);
    l.kv_bytes = bytes;
  }
  st.cap = cap;
  return Status::ok();
}

int round_positions(int n) { return (n + 15) / 16 * 16; }

}  // namespace

Result<std::unique_ptr<SeqState>> CudaBackend::new_state(int max_seq) {
  if (max_seq <= 0) return cu_err("max_seq must be positive, got {}", max_seq);
  return make_state(max_seq, std::min(max_seq, initial_positions()));
}

Result<std::unique_ptr<SeqState>> CudaBackend::make_state(int max_seq, int cap0) {
  if (max_seq <= 0 || cap0 <= 0 || cap0 > max_seq)
    return cu_err("make_state: bad sizes (max_seq {}, initial positions {})", max_seq, cap0);
  auto st = std::make_unique<CudaSeqState>();
  st->be = this;
  st->limit = max_seq;
  {
    const char* kv = std::getenv("LILY_CUDA_KV");
    st->f32 = !(kv && std::strcmp(kv, "bf16") == 0);
  }
  const size_t es = st->f32 ? 4 : 2;
  st->layers.resize(cfg_.num_hidden_layers);
  st->nkv = cfg_.num_key_value_heads, st->hd = cfg_.head_dim;
  const int C = cfg_.gdn_conv_dim(), K = cfg_.linear_conv_kernel_dim, nv = cfg_.linear_num_value_heads;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    auto& l = st->layers[i];
    if (cfg_.is_full_attention[i]) {
      l.kv_bytes = size_t(st->nkv) * cap0 * st->hd * es;
      l.kc = dalloc<uint16_t>(l.kv_bytes / 2, st->owned);
      l.vc = dalloc<uint16_t>(l.kv_bytes / 2, st->owned);
      if (!l.kc || !l.vc) return cu_err("cuda: out of device memory for a KV cache of {} positions", cap0);
    } else {
      l.conv_bytes = size_t(2) * C * (K - 1) * es;
      l.S_bytes = size_t(nv) * cfg_.linear_key_head_dim * cfg_.linear_value_head_dim * 4;
      l.conv = dalloc<uint16_t>(l.conv_bytes / 2, st->owned);
      l.S = dalloc<float>(l.S_bytes / 4, st->owned);
      if (!l.conv || !l.S) return cu_err("cuda: out of device memory for the DeltaNet state");
    }
  }
  st->cap = cap0;
  st->ctl = dalloc<StepCtl>(1, st->owned);
  if (!st->ctl) return cu_err("cuda: out of device memory");
  LILY_CU_TRY(cudaHostAlloc(&st->tok_host, size_t(max_seq + 2) * 4, cudaHostAllocMapped));
  LILY_CU_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&st->tok_dev), st->tok_host, 0));
  LILY_CU_TRY(cudaDeviceSynchronize());
  return std::unique_ptr<SeqState>(std::move(st));
}

Status CudaSeqState::reserve(int n_tokens) {
  if (n_tokens > limit)
    return cu_err("the sequence needs {} tokens; its limit (max_seq) is {}", n_tokens, limit);
  if (n_tokens <= cap) return Status::ok();
  const int grown = std::min(limit, round_positions(std::max(n_tokens, 2 * cap)));
  LILY_CU_TRY(cudaDeviceSynchronize());  // no step in flight may still use the old caches
  LILY_TRY(realloc_kv(*this, grown, n));
  if (g_full) cudaGraphExecDestroy(g_full);
  if (g_nolog) cudaGraphExecDestroy(g_nolog);
  g_full = g_nolog = nullptr;
  return Status::ok();
}

// A snapshot holds the positions in use (rounded up to 16), not the source's capacity.
std::unique_ptr<SeqState> CudaSeqState::clone() const {
  {
    const char* kv = std::getenv("LILY_CUDA_KV");
    if (f32 == (kv && std::strcmp(kv, "bf16") == 0)) return nullptr;  // the dtype knob changed since
  }
  auto r = be->make_state(limit, std::min(limit, round_positions(std::max(n, 1))));
  if (!r) return nullptr;
  auto st = std::unique_ptr<CudaSeqState>(static_cast<CudaSeqState*>(std::move(r).value().release()));
  const size_t row = size_t(hd) * (f32 ? 4 : 2);  // bytes per position per head
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& a = layers[i];
    auto& b = st->layers[i];
    if (a.kc && n > 0) {  // head h's first n positions; strides cap (source) and st->cap
      if (cudaMemcpy2D(b.kc, size_t(st->cap) * row, a.kc, size_t(cap) * row, size_t(n) * row, nkv,
                       cudaMemcpyDeviceToDevice) != cudaSuccess ||
          cudaMemcpy2D(b.vc, size_t(st->cap) * row, a.vc, size_t(cap) * row, size_t(n) * row, nkv,
                       cudaMemcpyDeviceToDevice) != cudaSuccess)
        return nullptr;
    }
    if (a.conv) cudaMemcpy(b.conv, a.conv, a.conv_bytes, cudaMemcpyDeviceToDevice);
    if (a.S) cudaMemcpy(b.S, a.S, a.S_bytes, cudaMemcpyDeviceToDevice);
  }
  cudaMemcpy(st->ctl, ctl, sizeof(StepCtl), cudaMemcpyDeviceToDevice);
  st->n = n;
  return st;
}

}  // namespace lily::cuda
