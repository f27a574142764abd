// The CUDA backend's classes, shared by its translation units: cuda_backend.cu (init, state,
// graph-captured decode step), prefill.cu (M > 1 tokens), upload.cu (weights).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/dev_weights.h"
#include "backend/cuda/ops.h"

namespace lily {
namespace cuda {

using clock_type = std::chrono::steady_clock;

template <typename T> T* dalloc(size_t n, std::vector<void*>& owned) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T) + 16) != cudaSuccess) return nullptr;
  cudaMemset(p, 0, n * sizeof(T) + 16);
  owned.push_back(p);
  return static_cast<T*>(p);
}

class CudaBackend;

struct CudaSeqState final : SeqState {
  struct Layer {
    uint16_t* kc = nullptr;  // [nkv, max_seq, hd] bf16
    uint16_t* vc = nullptr;
    uint16_t* conv = nullptr;  // [2, C, K-1] bf16
    float* S = nullptr;        // [nv, dk, dv] fp32
    size_t kv_bytes = 0, conv_bytes = 0, S_bytes = 0;
  };
  CudaBackend* be = nullptr;
  int n = 0, cap = 0;
  std::vector<Layer> layers;
  StepCtl* ctl = nullptr;
  int32_t* tok_host = nullptr;  // [cap + 2] host-mapped, written by the step's argmax
  int32_t* tok_dev = nullptr;   // device alias of tok_host
  std::vector<void*> owned;
  cudaGraphExec_t g_full = nullptr, g_nolog = nullptr;

  ~CudaSeqState() override {
    if (g_full) cudaGraphExecDestroy(g_full);
    if (g_nolog) cudaGraphExecDestroy(g_nolog);
    for (void* p : owned) cudaFree(p);
    if (tok_host) cudaFreeHost(tok_host);
  }
  int n_tokens() const override { return n; }
  int max_seq() const override { return cap; }
  size_t bytes() const override {
    size_t b = 0;
    for (auto& l : layers) b += 2 * l.kv_bytes + l.conv_bytes + l.S_bytes;
    return b;
  }
  std::unique_ptr<SeqState> clone() const override;
  void reset() override {
    n = 0;
    for (auto& l : layers) {
      if (l.conv) cudaMemset(l.conv, 0, l.conv_bytes);
      if (l.S) cudaMemset(l.S, 0, l.S_bytes);
    }
    cudaMemset(ctl, 0, sizeof(StepCtl));
    cudaDeviceSynchronize();
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelWeights& w, bool verbose) : w_(w), cfg_(w.cfg), verbose_(verbose) {}
  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (void* p : owned_) cudaFree(p);
    if (arena_) cudaFree(arena_);
    for (auto& e : ev_)
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }
  int vocab_size() const override { return cfg_.vocab_size; }
  std::string hardware() const override { return hw_; }

  Status init() {
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0)
      return cu_err("no CUDA device: {} (use --backend cpu)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cudaDeviceProp prop{};
    LILY_CU_TRY(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) return cu_err("CUDA device {} is sm_{}{}; this build targets sm_90a (H100/H200)", prop.name, prop.major, prop.minor);
    char hw[256];
    std::snprintf(hw, sizeof hw, "%s (%d SMs, %.0f GiB)", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    hw_ = hw;
    LILY_TRY(check_shapes());
    LILY_CU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (auto& ev : ev_) LILY_CU_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync));
    LILY_TRY(attn_init());
    LILY_TRY(upload_weights(w_, verbose_, &arena_, d_, &upload_gbps_));
    return alloc_scratch();
  }

  Result<std::unique_ptr<SeqState>> new_state(int max_seq) override {
    if (max_seq <= 0) return cu_err("max_seq must be positive, got {}", max_seq);
    auto st = std::make_unique<CudaSeqState>();
    st->be = this;
    st->cap = max_seq;
    st->layers.resize(cfg_.num_hidden_layers);
    const int nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim, C = cfg_.gdn_conv_dim();
    const int K = cfg_.linear_conv_kernel_dim, nv = cfg_.linear_num_value_heads;
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      auto& l = st->layers[i];
      if (cfg_.is_full_attention[i]) {
        l.kv_bytes = size_t(nkv) * max_seq * hd * 2;
        l.kc = dalloc<uint16_t>(l.kv_bytes / 2, st->owned);
        l.vc = dalloc<uint16_t>(l.kv_bytes / 2, st->owned);
        if (!l.kc || !l.vc) return cu_err("cuda: out of device memory for a KV cache of {} positions", max_seq);
      } else {
        l.conv_bytes = size_t(2) * C * (K - 1) * 2;
        l.S_bytes = size_t(nv) * cfg_.linear_key_head_dim * cfg_.linear_value_head_dim * 4;
        l.conv = dalloc<uint16_t>(l.conv_bytes / 2, st->owned);
        l.S = dalloc<float>(l.S_bytes / 4, st->owned);
        if (!l.conv || !l.S) return cu_err("cuda: out of device memory for the DeltaNet state");
      }
    }
    st->ctl = dalloc<StepCtl>(1, st->owned);
    if (!st->ctl) return cu_err("cuda: out of device memory");
    LILY_CU_TRY(cudaHostAlloc(&st->tok_host, size_t(max_seq + 2) * 4, cudaHostAllocMapped));
    LILY_CU_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&st->tok_dev), st->tok_host, 0));
    LILY_CU_TRY(cudaDeviceSynchronize());
    return std::unique_ptr<SeqState>(std::move(st));
  }

  Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) override {
    auto* st = dynamic_cast<CudaSeqState*>(&state);
    if (!st || st->be != this) return cu_err("cuda backend: state belongs to another backend");
    const int M = int(tokens.size());
    if (M == 0) return cu_err("forward: no tokens");
    if (st->n + M > st->cap) return cu_err("forward: {} + {} tokens exceed the state's max_seq {}", st->n, M, st->cap);
    for (int32_t t : tokens)
      if (t < 0 || t >= cfg_.vocab_size) return cu_err("forward: token id {} outside the vocabulary [0, {})", t, cfg_.vocab_size);
    if (!logits.empty() && int(logits.size()) != cfg_.vocab_size)
      return cu_err("forward: logits span has {} entries, vocab is {}", logits.size(), cfg_.vocab_size);
    return prefill(*st, tokens, logits);
  }

  Status decode_greedy(SeqState& state, int32_t first, int n_steps, std::vector<int32_t>& out,
                       std::vector<double>* avail_s) override {
    auto* st = dynamic_cast<CudaSeqState*>(&state);
    if (!st || st->be != this) return cu_err("cuda backend: state belongs to another backend");
    out.clear();
    if (avail_s) avail_s->clear();
    if (n_steps <= 0) return Status::ok();
    if (first < 0 || first >= cfg_.vocab_size) return cu_err("decode_greedy: token {} out of range", first);
    if (st->n + n_steps > st->cap) return cu_err("decode_greedy: {} + {} steps exceed max_seq {}", st->n, n_steps, st->cap);
    LILY_TRY(ensure_graphs(*st));
    const auto t0 = clock_type::now();
    *pinned_tok_ = first;
    LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, pinned_tok_, 4, cudaMemcpyHostToDevice, stream_));
    const int pos0 = st->n;
    volatile int32_t* th = st->tok_host;
    auto collect = [&](int i) -> Status {
      LILY_CU_TRY(cudaEventSynchronize(ev_[i % 2]));
      out.push_back(int32_t(th[pos0 + i]));
      if (avail_s) avail_s->push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      return Status::ok();
    };
    // Depth 2: step i+1 is launched before the host waits for step i's token.
    for (int i = 0; i < n_steps; ++i) {
      LILY_CU_TRY(cudaGraphLaunch(st->g_full, stream_));
      LILY_CU_TRY(cudaEventRecord(ev_[i % 2], stream_));
      if (i >= 1) LILY_TRY(collect(i - 1));
    }
    LILY_TRY(collect(n_steps - 1));
    st->n += n_steps;
    const char* prof = std::getenv("LILY_CUDA_PROFILE");
    if (prof && *prof == '1' && n_steps >= 16 && st->n < st->cap) LILY_TRY(profile_step(*st));
    return Status::ok();
  }

  double copy_bandwidth_gbps() override {
    const size_t n = size_t(2) << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n) != cudaSuccess) return 0;
    if (cudaMalloc(&b, n) != cudaSuccess) {
      cudaFree(a);
      return 0;
    }
    cudaMemset(a, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream_);
    cudaEventRecord(e0, stream_);
    const int reps = 10;
    for (int i = 0; i < reps; ++i) cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, n, cudaMemcpyDeviceToDevice, stream_);
    cudaEventRecord(e1, stream_);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return 2.0 * n * reps / (ms * 1e-3) / 1e9;
  }

  // Appends M >= 1 validated tokens to st (advancing st.n) and, if logits is non-empty, writes
  // the last token's logits. Defined in prefill.cu.
  Status prefill(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits);
  // Enqueue one decode step on `s` (used by the graph capture; also callable directly).
  Status enqueue_step(CudaSeqState& st, cudaStream_t s, bool with_logits);
  // One un-captured step with an event after every op; prints the time per op kind (stderr).
  Status profile_step(CudaSeqState& st);

 private:
  Status check_shapes() const {
    const ModelConfig& c = cfg_;
    if (c.linear_key_head_dim != 128 || c.linear_value_head_dim != 128) return cu_err("cuda: GDN head dims must be 128");
    if (c.moe_intermediate_size != c.shared_expert_intermediate_size)
      return cu_err("cuda: shared expert width {} must equal the expert width {}", c.shared_expert_intermediate_size, c.moe_intermediate_size);
    if (c.num_experts_per_tok > 8) return cu_err("cuda: top-k {} > 8 unsupported", c.num_experts_per_tok);
    if (c.hidden_size % 256 != 0) return cu_err("cuda: hidden size {} must be a multiple of 256", c.hidden_size);
    if (c.quant.group_size != 64) return cu_err("cuda: group size {} unsupported (64 only)", c.quant.group_size);
    return Status::ok();
  }

  Status alloc_scratch() {
    const ModelConfig& c = cfg_;
    const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
    const int qrows = c.num_attention_heads * (c.attn_output_gate ? 2 : 1) * c.head_dim + 2 * c.num_key_value_heads * c.head_dim;
    const size_t urows = std::max<size_t>(size_t(C) + vd + 2 * nv, qrows);
    for (int i = 0; i < 2; ++i) xres_[i] = dalloc<uint16_t>(H, owned_);
    mix_ = dalloc<uint16_t>(H, owned_);
    hn_ = dalloc<uint16_t>(H, owned_);
    u_ = dalloc<uint16_t>(urows, owned_);
    o_ = dalloc<uint16_t>(std::max(vd, c.num_attention_heads * c.head_dim), owned_);
    q_ = dalloc<uint16_t>(size_t(c.num_attention_heads) * c.head_dim, owned_);
    rl_ = dalloc<float>(c.num_experts + 1, owned_);
    topk_ids_ = dalloc<int32_t>(8, owned_);
    topk_w_ = dalloc<float>(9, owned_);
    act_ = dalloc<uint16_t>(size_t(c.num_experts_per_tok + 1) * c.moe_intermediate_size, owned_);
    logits_ = dalloc<float>(c.vocab_size, owned_);
    am_partial_ = dalloc<float>(2 * size_t(gemv_argmax_max_blocks()), owned_);
    const int G = c.num_attention_heads / std::max(1, c.num_key_value_heads);
    attn_partial_ = dalloc<float>(size_t(c.num_key_value_heads) * attn_max_splits() * G * (c.head_dim + 2), owned_);
    if (!attn_partial_ || !am_partial_ || !logits_) return cu_err("cuda: out of device memory for scratch");
    LILY_CU_TRY(cudaHostAlloc(&pinned_tok_, 16, cudaHostAllocDefault));
    return Status::ok();
  }

  Status ensure_graphs(CudaSeqState& st) {
    if (st.g_full && st.g_nolog) return Status::ok();
    for (int full = 0; full < 2; ++full) {
      cudaGraph_t g = nullptr;
      LILY_CU_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      Status s = enqueue_step(st, stream_, full == 1);
      cudaError_t e = cudaStreamEndCapture(stream_, &g);
      if (!s) return s;
      if (e != cudaSuccess) return cu_err("cuda: graph capture failed: {}", cudaGetErrorString(e));
      cudaGraphExec_t ex = nullptr;
      LILY_CU_TRY(cudaGraphInstantiate(&ex, g, 0));
      cudaGraphDestroy(g);
      (full ? st.g_full : st.g_nolog) = ex;
    }
    // Upload the graphs once so the first replay is not slower than the rest.
    LILY_CU_TRY(cudaGraphUpload(st.g_full, stream_));
    LILY_CU_TRY(cudaGraphUpload(st.g_nolog, stream_));
    return Status::ok();
  }

  const ModelWeights& w_;
  const ModelConfig& cfg_;
  bool verbose_;
  std::string hw_;
  void* arena_ = nullptr;
  DevWeights d_;
  double upload_gbps_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_[2] = {};
  std::vector<void*> owned_;
  uint16_t *xres_[2] = {}, *mix_ = nullptr, *hn_ = nullptr, *u_ = nullptr, *o_ = nullptr, *q_ = nullptr, *act_ = nullptr;
  float *rl_ = nullptr, *topk_w_ = nullptr, *logits_ = nullptr, *am_partial_ = nullptr, *attn_partial_ = nullptr;
  int32_t* topk_ids_ = nullptr;
  int32_t* feed_ = nullptr;
  int feed_cap_ = 0;
  int32_t* pinned_tok_ = nullptr;
  std::vector<std::pair<const char*, cudaEvent_t>>* prof_ = nullptr;
  void mark(const char* what, cudaStream_t s) {
    if (!prof_) return;
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    prof_->push_back({what, e});
  }
};

}  // namespace cuda
}  // namespace lily
