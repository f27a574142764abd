// CUDA per-sequence state: allocation, on-demand growth of the K/V caches, and clone (the prefix
// cache's snapshot). A state is two device allocations laid out by cuda_state_layout.h: the fixed
// arena (conv windows, DeltaNet states S, StepCtl) and the K/V arena ([nkv, cap, hd] per attention
// layer, K then V). cap starts at kCudaKvInitial positions (or max_seq if smaller) and grows when a
// step needs more: straight to the request's need when the engine gives it (reserve's `upto`), else
// at least doubling; so a state holds memory for the positions it uses, not for max_seq, and
// bytes() is exactly what the engine's memory plan counted. Both arenas come from StatePool, and every
// clear and copy runs on the backend's stream (cuda_backend.h): no call here waits for the device.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_state_layout.h"

namespace lily::cuda {
namespace {

// Positions allocated up front: 2,048 x 40 KB (fp32 K+V, 10 layers x 2 heads x 256) = 80 MB at full size.
// LILY_CUDA_KV_INITIAL overrides it (tests use it to cross growth boundaries at small lengths).
int initial_positions() {
  const char* e = std::getenv("LILY_CUDA_KV_INITIAL");
  const int v = e ? std::atoi(e) : 0;
  return v > 0 ? v : kCudaKvInitial;
}

CudaStateLayout layout_of(const ModelConfig& cfg) { return cuda_state_layout(cfg, sizeof(StepCtl), initial_positions()); }

void replace_owned(std::vector<void*>& owned, void* old_p, void* new_p) {
  for (void*& p : owned)
    if (p == old_p) {
      p = new_p;
      return;
    }
  owned.push_back(new_p);
}

// Points every attention layer's K and V into a K/V arena of `cap` positions.
void carve_kv(CudaSeqState& st, const std::vector<bool>& attn, char* arena, int cap) {
  const size_t span = CudaStateLayout::span(st.lay.kv_buffer(cap));
  size_t off = 0;
  for (size_t i = 0; i < st.layers.size(); ++i) {
    if (!attn[i]) continue;
    auto& l = st.layers[i];
    l.kc = reinterpret_cast<float*>(arena + off);
    l.vc = reinterpret_cast<float*>(arena + off + span);
    l.kv_bytes = st.lay.kv_buffer(cap);
    off += 2 * span;
  }
}

// Allocates a zeroed K/V arena of `cap` positions, copying the first `keep` positions of each head
// from the current one (on the stream: after the steps that wrote them); on failure nothing changes.
Status realloc_kv(CudaSeqState& st, int cap, int keep) {
  const size_t row = size_t(st.hd) * CudaStateLayout::kKvElem;  // bytes per position per head
  const size_t bytes = st.lay.kv_arena(cap), span = CudaStateLayout::span(st.lay.kv_buffer(cap));
  const cudaStream_t s = st.pool->stream;
  char* fresh = static_cast<char*>(st.pool->alloc(bytes));
  if (!fresh) return cu_err("cuda: out of device memory growing the K/V caches to {} positions ({:.1f} MB)", cap, bytes / 1e6);
  auto fail = [&](cudaError_t e) {
    st.pool->free(fresh);
    return cu_err("cuda: growing the K/V caches to {} positions: {}", cap, cudaGetErrorString(e));
  };
  if (cudaError_t e = cudaMemsetAsync(fresh, 0, bytes, s); e != cudaSuccess) return fail(e);
  std::vector<bool> attn(st.layers.size());
  size_t off = 0;
  for (size_t i = 0; i < st.layers.size(); ++i) {
    const auto& l = st.layers[i];
    attn[i] = l.kc != nullptr;
    if (!attn[i]) continue;
    if (keep > 0) {  // head h's first `keep` positions: old stride st.cap * row, new stride cap * row
      if (cudaError_t e = cudaMemcpy2DAsync(fresh + off, size_t(cap) * row, l.kc, size_t(st.cap) * row, size_t(keep) * row,
                                            st.nkv, cudaMemcpyDeviceToDevice, s);
          e != cudaSuccess)
        return fail(e);
      if (cudaError_t e = cudaMemcpy2DAsync(fresh + off + span, size_t(cap) * row, l.vc, size_t(st.cap) * row,
                                            size_t(keep) * row, st.nkv, cudaMemcpyDeviceToDevice, s);
          e != cudaSuccess)
        return fail(e);
    }
    off += 2 * span;
  }
  replace_owned(st.owned, st.kv_arena, fresh);
  st.pool->free(st.kv_arena);  // after the copies above, and any step still reading it, on the stream
  st.kv_arena = fresh;
  carve_kv(st, attn, fresh, cap);
  st.cap = cap;
  return Status::ok();
}

int round_positions(int n) { return (n + kCudaKvStep - 1) / kCudaKvStep * kCudaKvStep; }

}  // namespace

Status StatePool::init(cudaStream_t s) {
  int dev = 0;
  LILY_CU_TRY(cudaGetDevice(&dev));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  LILY_CU_TRY(cudaMemPoolCreate(&pool, &props));
  // Up to 1 GiB of freed blocks stays in the pool for the next states (~7 fresh full-size ones); beyond that,
  // the device gets them back at the next synchronization, so other allocations never find the memory plan's
  // headroom (at least 1 GiB, engine/memory_plan.cpp) held by idle state blocks.
  uint64_t keep = uint64_t(1) << 30;
  LILY_CU_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  stream = s;
  return Status::ok();
}

void* StatePool::alloc(size_t bytes) {
  void* p = nullptr;
  if (!stream) return cudaMalloc(&p, bytes) == cudaSuccess ? p : (cudaGetLastError(), nullptr);
  if (cudaMallocFromPoolAsync(&p, bytes, pool, stream) == cudaSuccess) return p;
  cudaGetLastError();
  // The pool's idle blocks (freed states of other sizes) back to the device, then once more.
  cudaStreamSynchronize(stream);
  cudaMemPoolTrimTo(pool, 0);
  if (cudaMallocFromPoolAsync(&p, bytes, pool, stream) == cudaSuccess) return p;
  cudaGetLastError();
  return nullptr;
}

void StatePool::free(void* p) {
  if (!p) return;
  if (stream) cudaFreeAsync(p, stream);
  else cudaFree(p);
}

StatePool::~StatePool() {
  if (pool) cudaMemPoolDestroy(pool);  // released once its last block is freed
}

Result<std::unique_ptr<SeqState>> CudaBackend::new_state(int max_seq) {
  if (max_seq <= 0) return cu_err("max_seq must be positive, got {}", max_seq);
  return make_state(max_seq, std::min(max_seq, initial_positions()));
}

StateMemory CudaBackend::state_memory(int) const { return layout_of(cfg_).memory(); }

Result<DeviceMemory> CudaBackend::device_memory() {
  size_t free = 0, total = 0;
  LILY_CU_TRY(cudaMemGetInfo(&free, &total));
  return DeviceMemory{total, free};
}

Result<std::unique_ptr<SeqState>> CudaBackend::make_state(int max_seq, int cap0, bool clear_fixed) {
  if (max_seq <= 0 || cap0 <= 0 || cap0 > max_seq)
    return cu_err("make_state: bad sizes (max_seq {}, initial positions {})", max_seq, cap0);
  auto st = std::make_unique<CudaSeqState>();
  st->be = this;
  st->limit = max_seq;
  st->lay = layout_of(cfg_);
  st->mem = st->lay.memory();
  const CudaStateLayout& lay = st->lay;
  st->layers.resize(cfg_.num_hidden_layers);
  st->nkv = cfg_.num_key_value_heads, st->hd = cfg_.head_dim;
  st->pool = state_pool_;
  const size_t fixed = lay.fixed_arena(), kv = lay.kv_arena(cap0);
  char* fa = static_cast<char*>(state_pool_->alloc(fixed));
  if (!fa) return cu_err("cuda: out of device memory for a sequence state ({:.1f} MB of DeltaNet states)", fixed / 1e6);
  st->owned.push_back(fa);  // freed by ~CudaSeqState from here on
  st->fixed_arena = fa;
  char* ka = static_cast<char*>(state_pool_->alloc(kv));
  if (!ka)
    return cu_err("cuda: out of device memory for the K/V caches of a sequence state ({} positions, {:.1f} MB)", cap0,
                  kv / 1e6);
  st->owned.push_back(ka);
  st->kv_arena = ka;
  // Cleared on the stream, before any step that uses the state: the fixed arena (a clone copies all of it
  // instead) and the K/V caches, whose positions past n start zeroed as they always have.
  if (clear_fixed) LILY_CU_TRY(cudaMemsetAsync(fa, 0, fixed, stream_));
  LILY_CU_TRY(cudaMemsetAsync(ka, 0, kv, stream_));
  std::vector<bool> attn(size_t(cfg_.num_hidden_layers));
  size_t off = 0;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    attn[size_t(i)] = cfg_.is_full_attention[i];
    if (attn[size_t(i)]) continue;
    auto& l = st->layers[size_t(i)];
    l.conv_bytes = lay.conv_bytes;
    l.S_bytes = lay.S_bytes;
    l.conv = reinterpret_cast<float*>(fa + off);
    off += CudaStateLayout::span(lay.conv_bytes);
    l.S = reinterpret_cast<uint16_t*>(fa + off);
    off += CudaStateLayout::span(lay.S_bytes);
  }
  st->ctl = reinterpret_cast<StepCtl*>(fa + off);
  carve_kv(*st, attn, ka, cap0);
  st->cap = cap0;
  return std::unique_ptr<SeqState>(std::move(st));
}

Status CudaSeqState::reserve(int n_tokens, int upto) {
  if (n_tokens > limit)
    return cu_err("the sequence needs {} tokens; its limit (max_seq) is {}", n_tokens, limit);
  if (n_tokens <= cap) return Status::ok();
  const int grown = std::min(limit, round_positions(upto > 0 ? std::max(n_tokens, upto) : std::max(n_tokens, 2 * cap)));
  // A step in flight (the pipelined decode's) still uses the old caches: the copy and the free are ordered
  // after it on the stream, and its graph is freed when it completes.
  LILY_TRY(realloc_kv(*this, grown, n));
  if (g_full) cudaGraphExecDestroy(g_full);
  if (g_nolog) cudaGraphExecDestroy(g_nolog);
  g_full = g_nolog = nullptr;
  return Status::ok();
}

// A snapshot holds the positions in use (rounded up to 16), not the source's capacity. Both states have
// one layout (cuda_state_layout.h), so the fixed arena (every layer's conv window and S, then the StepCtl)
// is one copy.
std::unique_ptr<SeqState> CudaSeqState::clone() const {
  auto r = be->make_state(limit, std::min(limit, round_positions(std::max(n, 1))), /*clear_fixed=*/false);
  if (!r) return nullptr;
  auto st = std::unique_ptr<CudaSeqState>(static_cast<CudaSeqState*>(std::move(r).value().release()));
  const cudaStream_t s = pool->stream;
  if (cudaMemcpyAsync(st->fixed_arena, fixed_arena, lay.fixed_arena(), cudaMemcpyDeviceToDevice, s) != cudaSuccess)
    return nullptr;
  const size_t row = size_t(hd) * CudaStateLayout::kKvElem;  // bytes per position per head
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& a = layers[i];
    auto& b = st->layers[i];
    if (a.kc && n > 0) {  // head h's first n positions; strides cap (source) and st->cap
      if (cudaMemcpy2DAsync(b.kc, size_t(st->cap) * row, a.kc, size_t(cap) * row, size_t(n) * row, nkv,
                            cudaMemcpyDeviceToDevice, s) != cudaSuccess ||
          cudaMemcpy2DAsync(b.vc, size_t(st->cap) * row, a.vc, size_t(cap) * row, size_t(n) * row, nkv,
                            cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return nullptr;
    }
  }
  st->n = n;
  return st;
}

}  // namespace lily::cuda
