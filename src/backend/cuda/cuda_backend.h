// The CUDA backend's classes, shared by its translation units: cuda_backend.cu (init, state,
// graph-captured decode step), step/prefill.cu (M > 1 tokens), common/upload.cu (weights).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda_state_layout.h"
#include "backend/cuda/common/dev_weights.h"
#include "backend/cuda/moe/xgemm.h"
#include "backend/cuda/common/ops.h"

namespace lily {
namespace cuda {
namespace pf {
struct GdnPrefillArgs;
}

using clock_type = std::chrono::steady_clock;

template <typename T> T* dalloc(size_t n, std::vector<void*>& owned) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T) + 16) != cudaSuccess) return nullptr;
  cudaMemset(p, 0, n * sizeof(T) + 16);
  owned.push_back(p);
  return static_cast<T*>(p);
}

class CudaBackend;

// Device memory of sequence states, stream-ordered (cuda_state.cu): a state's two allocations come from
// a memory pool of its own on the backend's stream (cudaMallocFromPoolAsync), and a freed state's blocks
// stay in the pool (up to 1 GiB) for the next one: a new state, a snapshot (clone) or a K/V growth costs no cudaMalloc,
// no cudaFree and no device-wide synchronization, and every clear and copy of a state runs on that
// stream, ordered with the steps that read and write it. Shared by the backend and its states; a state
// freed after its backend (stream null) frees synchronously.
struct StatePool {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  Status init(cudaStream_t s);
  // bytes of device memory, ordered on `stream`; null when the device has no room even after the
  // pool's idle blocks went back to it.
  void* alloc(size_t bytes);
  void free(void* p);
  ~StatePool();
};

// Shapes the prefill kernels (step/prefill.cu) support: the real model and the tiny/small presets.
bool prefill_shapes_ok(const ModelConfig& c);
struct BatchCtx;  // batched decode scratch, row table and graphs per batch size (step/batch.cu)
void destroy_batch_ctx(BatchCtx* b);
// The profiles' per-op table (stderr): events recorded after each op (ev[i] closes op ev[i].first, ev[0] the
// start), summed by op name in first-seen order: the title, then | op | launches | total ms | share | rows.
// Destroys the events; returns the total ms (the caller writes the total row).
double print_op_rows(std::vector<std::pair<const char*, cudaEvent_t>>& ev, const std::string& title);

struct CudaSeqState final : SeqState {
  // K/V cache and conv window in fp32 (a 16-bit cache measured outside the precision budget:
  // docs/perf/2026-12-06-kv-f16.md).
  struct Layer {
    float* kc = nullptr;  // [nkv, cap, hd]
    float* vc = nullptr;
    float* conv = nullptr;  // [2, C, K-1]
    uint16_t* S = nullptr;     // fp16 bits [nv, dk, dv]
    size_t kv_bytes = 0, conv_bytes = 0, S_bytes = 0;
  };
  CudaBackend* be = nullptr;
  // The two allocations the buffers above point into (cuda_state_layout.h), both in `owned`.
  void* fixed_arena = nullptr;  // conv windows and S of every DeltaNet layer, the StepCtl
  void* kv_arena = nullptr;     // K and V of every attention layer, cap positions each
  CudaStateLayout lay;          // their layout, and what bytes() counts by (as StateMemory)
  StateMemory mem;
  int n = 0;
  int cap = 0;    // positions allocated in each K/V cache: the kernels' stride ([nkv, cap, hd])
  int limit = 0;  // max_seq: the most positions reserve() will grow to
  int nkv = 0, hd = 0;  // K/V cache shape per layer: [nkv, cap, hd]
  std::vector<Layer> layers;
  StepCtl* ctl = nullptr;
  std::shared_ptr<StatePool> pool;  // where the arenas come from and go back to
  std::vector<void*> owned;
  cudaGraphExec_t g_full = nullptr, g_nolog = nullptr;

  ~CudaSeqState() override {
    if (g_full) cudaGraphExecDestroy(g_full);  // an exec still in flight is freed when it completes
    if (g_nolog) cudaGraphExecDestroy(g_nolog);
    for (void* p : owned) pool->free(p);
  }
  int n_tokens() const override { return n; }
  int max_seq() const override { return limit; }
  // Grows every K/V cache to hold n_tokens (straight to `upto` when given, else at least doubling;
  // up to limit), copying the n positions held and dropping the captured decode graphs (their
  // pointers are stale); ensure_graphs captures them again. cuda_state.cu.
  Status reserve(int n_tokens, int upto = 0) override;
  // Device bytes held, 2 MiB pages included (cuda_state_layout.h).
  size_t bytes() const override { return mem.bytes_at(cap); }
  // A snapshot: the fixed arena in one copy, each K/V cache's n positions, on the backend's stream (after the
  // steps that wrote this state, before any later one). cuda_state.cu.
  std::unique_ptr<SeqState> clone() const override;
  // Back to empty: the fixed arena (conv windows, S, StepCtl) cleared on the stream; the K/V positions past
  // n are never read. Keeps the allocations and the captured decode graphs.
  void reset() override {
    n = 0;
    cudaMemsetAsync(fixed_arena, 0, lay.fixed_arena(), pool->stream);
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelWeights& w, bool verbose) : w_(w), cfg_(w.cfg), verbose_(verbose) {}
  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_);
    destroy_batch_ctx(batch_);
    for (void* p : owned_) cudaFree(p);
    if (arena_) cudaFree(arena_);
    for (auto& e : ev_)
      if (e) cudaEventDestroy(e);
    for (auto& e : pipe_ev_)
      if (e) cudaEventDestroy(e);
    if (pipe_spec_h_) cudaFreeHost(pipe_spec_h_);
    if (pipe_out_h_) cudaFreeHost(pipe_out_h_);
    if (pipe_tok_h_) cudaFreeHost(pipe_tok_h_);
    state_pool_->stream = nullptr;  // states that outlive the backend free synchronously
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
    char hw[sizeof prop.name + 64];  // the name (up to 255 chars) and the rest
    std::snprintf(hw, sizeof hw, "%s (%d SMs, %.0f GiB)", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    hw_ = hw;
    LILY_TRY(check_shapes());
    LILY_CU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LILY_TRY(state_pool_->init(stream_));
    for (auto& ev : ev_) LILY_CU_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync));
    LILY_TRY(attn_init());
    LILY_TRY(upload_weights(w_, verbose_, &arena_, d_, &upload_gbps_));
    LILY_TRY(frag_copies());
    return alloc_scratch();
  }

  // A fresh state that may hold max_seq tokens. K/V caches start small and grow on demand
  // (CudaSeqState::reserve); conv windows and DeltaNet states are fixed-size. cuda_state.cu.
  Result<std::unique_ptr<SeqState>> new_state(int max_seq) override;
  // new_state with K/V caches of cap0 positions to start (clone sizes a snapshot to what it holds), its
  // fixed arena cleared unless clear_fixed is false (clone overwrites all of it).
  Result<std::unique_ptr<SeqState>> make_state(int max_seq, int cap0, bool clear_fixed = true);
  // What a state takes (cuda_state_layout.h, with today's LILY_CUDA_KV_INITIAL),
  // and the device's free memory (cudaMemGetInfo). cuda_state.cu.
  StateMemory state_memory(int max_seq) const override;
  Result<DeviceMemory> device_memory() override;

  // Scratch for max_rows + step_tokens rows and the step graph of every batch size up to max_rows
  // (step/batch.cu).
  Status prepare(int max_rows, int step_tokens) override;
  // Backend::launch (draw_backend.cu): a lone one-token feed drawn without a mask or penalties is
  // launched on the batch-1 decode graph and returns at once (launch_draw; its token may be
  // kDrawnToken); any other step first collects the steps in flight, then runs at once (step()).
  Result<StepTicket> launch(std::span<const StepFeed> feeds) override;
  Status wait(StepTicket ticket) override;
  bool pipelines() const override { return true; }
  // Speculative decoding (step/spec.cu): verify feeds run as segments of the mixed step, an output per
  // token; rewind restores the DeltaNet states copied aside before the step and re-runs the DeltaNet
  // recurrence over the kept tokens. At most kSpecFeeds verify feeds a step (each copies its ~63 MB of
  // DeltaNet state aside at full size).
  static constexpr int kSpecFeeds = 8;
  bool speculates() const override;  // when the mixed step takes the model
  int spec_max_feeds() const override { return kSpecFeeds; }
  double spec_row_cost() const override;
  double spec_step_cost() const override;
  Status rewind(SeqState& state, int n_tokens) override;
  // 4096, the prefill scratch's rows: on an H100 an 8k / 32k prompt prefills at 36.1k / 30.3k tok/s in
  // 4096-token segments against 32.0k / 27.8k in 2048-token ones (the experts get 128 rows each instead of
  // 64), and a step with one is no longer than one with long_step_tokens of shorter long segments (~120 ms;
  // docs/perf/2026-12-07-prefill-group.md).
  int default_prefill_chunk() const override { return 4096; }
  // Long segments share a prefill pass up to the prefill scratch's rows (CudaBackend::prefill_long).
  int default_long_step_tokens() const override { return prefill_chunk_cap(); }
  // One un-captured decode step of state with events between ops, then per-op-kind graphs
  // (cuda_backend.cu); the state consumes one token.
  Status profile_decode(SeqState& state) override;

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

 protected:  // the parts of a step (Backend)
  Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) override {
    auto st = appendable(state, tokens, "forward");
    if (!st) return st.status();
    if (!logits.empty() && int(logits.size()) != cfg_.vocab_size)
      return cu_err("forward: logits span has {} entries, vocab is {}", logits.size(), cfg_.vocab_size);
    return prefill(**st, tokens, logits);
  }
  // state as this backend's, with room for tokens (≥ 1, every id in the vocabulary) after its st.n, grown to
  // it; else an error that names `who`.
  Result<CudaSeqState*> appendable(SeqState& state, std::span<const int32_t> tokens, const char* who) {
    auto* st = dynamic_cast<CudaSeqState*>(&state);
    if (!st || st->be != this) return cu_err("{}: state belongs to another backend", who);
    const int M = int(tokens.size());
    if (M == 0) return cu_err("{}: no tokens", who);
    LILY_TRY(st->reserve(st->n + M));
    if (st->n + M > st->cap) return cu_err("{}: {} + {} tokens exceed the state's max_seq {}", who, st->n, M, st->limit);
    for (int32_t t : tokens)
      if (t < 0 || t >= cfg_.vocab_size) return cu_err("{}: token id {} outside the vocabulary [0, {})", who, t, cfg_.vocab_size);
    return st;
  }

  // Decode rows and prompt segments as one batched step (step/step_mixed.cu); what it does not take goes
  // to Backend::step (the decode graph, the batched decode step, the prefill path).
  Status step(std::span<const StepFeed> feeds) override;
  // One decode step for B sequences, weights read once for all rows (step/batch.cu).
  Status forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                       std::span<float> logits) override;
  // One decode step drawing each row's next token on the device (draw_backend.cu): one row
  // replays the decode graph, then sampling/draw.cu's kernel reads the logits where they are.
  Status decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                     std::span<const DrawSpec> spec, std::span<Drawn> out) override;

 public:
  // Appends M >= 1 validated tokens to st (advancing st.n) and, if logits is non-empty, writes
  // the last token's logits. Defined in step/prefill.cu.
  Status prefill(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits);
  // 2..pf::kMaxAttnSegs prompt segments of single-pass length (pf::kPfSinglePassRows tokens or more each, their
  // tokens within the prefill scratch) as one prefill pass: each sequence's state, logits or host draw exactly
  // as its forward() alone gives them. Validates like forward().
  Status prefill_group(std::span<const StepFeed* const> feeds);
  // A step's long segments (step/step_mixed.cu): in groups of prefill_group where they fit, else alone.
  Status prefill_long(std::span<const StepFeed> own);
  // Feeds tokens one decode-graph replay each (no host sync in between); logits of the last.
  Status replay_tokens(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits);
  // Enqueue one decode step on `s` (used by the graph capture; also callable directly).
  Status enqueue_step(CudaSeqState& st, cudaStream_t s, bool with_logits);
  // One un-captured step with an event after every op; prints the time per op kind (stderr).
  Status profile_step(CudaSeqState& st);

 private:
  // What the decode kernels support (the ops re-check at launch); anything else is refused here
  // with the field named.
  Status check_shapes() const {
    const ModelConfig& c = cfg_;
    if (c.quant.group_size != 64) return cu_err("cuda: group size {} unsupported (64 only)", c.quant.group_size);
    if (c.hidden_size % 64 != 0 || c.hidden_size > 2048)
      return cu_err("cuda: hidden_size {} unsupported (a multiple of 64, ≤ 2048: the 8-bit router GEMV)", c.hidden_size);
    const int dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
    if (dk % 32 != 0 || dk > 256 || dv % 32 != 0)
      return cu_err("cuda: GDN head dims {}x{} unsupported (multiples of 32, key dim ≤ 256)", dk, dv);
    if (c.gdn_value_dim() > 4096 || c.gdn_value_dim() / dv > 64)
      return cu_err("cuda: GDN value dim {} unsupported (≤ 4096, ≤ 64 heads)", c.gdn_value_dim());
    if (c.moe_intermediate_size % 64 != 0 || c.shared_expert_intermediate_size % 64 != 0)
      return cu_err("cuda: expert widths {} / {} must be multiples of 64 (the down projection's group)", c.moe_intermediate_size, c.shared_expert_intermediate_size);
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > 16)
      return cu_err("cuda: num_experts_per_tok {} unsupported (1..16)", c.num_experts_per_tok);
    if (c.num_experts > c.hidden_size) return cu_err("cuda: {} experts > hidden_size {} (router top-k scratch)", c.num_experts, c.hidden_size);
    const int hd = c.head_dim, G = c.num_attention_heads / std::max(1, c.num_key_value_heads);
    if (hd != 64 && hd != 128 && hd != 256) return cu_err("cuda: head_dim {} unsupported (64, 128, 256)", hd);
    if (c.num_attention_heads % std::max(1, c.num_key_value_heads) != 0 || G > 8 || G == 5 || G == 7 || c.num_key_value_heads > 14)
      return cu_err("cuda: {} heads / {} kv heads unsupported (group 1, 2, 3, 4, 6 or 8; ≤ 14 kv heads)", c.num_attention_heads, c.num_key_value_heads);
    if (size_t(c.num_attention_heads) * hd > 4096) return cu_err("cuda: attention output width {} > 4096", c.num_attention_heads * hd);
    return Status::ok();
  }

  // The experts' fragment-order copies (moe/xgemm.h) that the batched step's expert GEMMs read: +18.1 GB on
  // the full model. Made where the device keeps at least a tenth of its memory (and 8 GiB) free after them
  // for states, K/V and scratch; else the step's experts go through qgemm on the upload's layout.
  Status frag_copies() {
    const ModelConfig& c = cfg_;
    const size_t need = frag_expert_bytes(c.num_experts, c.moe_intermediate_size, c.hidden_size) * d_.layers.size();
    size_t free_b = 0, total_b = 0;
    LILY_CU_TRY(cudaMemGetInfo(&free_b, &total_b));
    const size_t keep = std::max<size_t>(size_t(8) << 30, total_b / 10);
    if (need + keep > free_b) {
      if (verbose_)
        std::fprintf(stderr, "cuda: no fragment copies of the experts (%.1f GB; %.1f GB free): the batched step reads "
                             "them through qgemm\n", need / 1e9, free_b / 1e9);
      return Status::ok();
    }
    void* mem = nullptr;
    LILY_TRY(frag_experts(d_, c.num_experts, c.moe_intermediate_size, c.hidden_size, &mem, stream_));
    if (mem) owned_.push_back(mem);
    if (mem && verbose_) std::fprintf(stderr, "cuda: fragment copies of the experts: %.2f GB\n", need / 1e9);
    return Status::ok();
  }

  Status alloc_scratch() {
    const ModelConfig& c = cfg_;
    const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim(), nv = c.linear_num_value_heads;
    const int qrows = c.num_attention_heads * (c.attn_output_gate ? 2 : 1) * c.head_dim + 2 * c.num_key_value_heads * c.head_dim;
    const size_t urows = std::max<size_t>(size_t(C) + vd + 2 * nv, qrows);
    for (int i = 0; i < 2; ++i) xres_[i] = dalloc<float>(H, owned_);
    mix_ = dalloc<float>(H, owned_);
    hn_ = dalloc<float>(H, owned_);
    u_ = dalloc<float>(urows, owned_);
    o_ = dalloc<float>(std::max(vd, c.num_attention_heads * c.head_dim), owned_);
    og_ = dalloc<float>(vd, owned_);
    q_ = dalloc<float>(size_t(c.num_attention_heads) * c.head_dim, owned_);
    rl_ = dalloc<float>(c.num_experts + 1, owned_);
    topk_ids_ = dalloc<int32_t>(c.num_experts_per_tok, owned_);
    topk_w_ = dalloc<float>(c.num_experts_per_tok + 1, owned_);
    act_ = dalloc<float>(size_t(c.num_experts_per_tok) * c.moe_intermediate_size + c.shared_expert_intermediate_size, owned_);
    logits_ = dalloc<float>(c.vocab_size, owned_);
    am_partial_ = dalloc<float>(2 * size_t(gemv_argmax_max_blocks()), owned_);
    const int G = c.num_attention_heads / std::max(1, c.num_key_value_heads);
    attn_partial_ = dalloc<float>(size_t(c.num_key_value_heads) * attn_max_splits() * G * (c.head_dim + 2), owned_);
    if (!attn_partial_ || !am_partial_ || !logits_) return cu_err("cuda: out of device memory for scratch");
    LILY_CU_TRY(cudaHostAlloc(&pinned_tok_, 16, cudaHostAllocDefault));
    return Status::ok();
  }

  // The state's two decode graphs (with and without the lm_head), captured at its first batch-1 step: a
  // fresh state's or a snapshot's (reset keeps them). LILY_ENGINE_TRACE=1 prints what that took.
  Status ensure_graphs(CudaSeqState& st) {
    if (st.g_full && st.g_nolog) return Status::ok();
    const auto t0 = clock_type::now();
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
    if (trace_graphs_)
      std::fprintf(stderr, "cuda: decode graphs of a state captured in %.1f ms\n",
                   std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
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
  std::shared_ptr<StatePool> state_pool_ = std::make_shared<StatePool>();
  const bool trace_graphs_ = [] { const char* e = std::getenv("LILY_ENGINE_TRACE"); return e && *e == '1'; }();
  cudaEvent_t ev_[2] = {};
  std::vector<void*> owned_;
  // Decode activations, fp32: residual (ping-pong), FFN/mixer output, normed input, projections
  // [qkv|z|a|b] or [q|k|v], mixer readout, attention q, MoE intermediate [k·I + Is], gated readout.
  float *xres_[2] = {}, *mix_ = nullptr, *hn_ = nullptr, *u_ = nullptr, *o_ = nullptr, *q_ = nullptr, *act_ = nullptr;
  float* og_ = nullptr;  // GDN readout after the fused gated RMSNorm (fp32 [nv·dv])
  // Set by step/prefill.cu once its kernels read and write fp32 K/V caches and conv windows; until
  // then fp32 states (the default) are prefilled by replaying the decode graph.
  float *rl_ = nullptr, *topk_w_ = nullptr, *logits_ = nullptr, *am_partial_ = nullptr, *attn_partial_ = nullptr;
  int32_t* topk_ids_ = nullptr;
  int32_t* feed_ = nullptr;
  int feed_cap_ = 0;
  int32_t* pinned_tok_ = nullptr;
  // decode_draw (draw_backend.cu): device specs and results for up to draw_cap_ rows, weights scratch.
  DrawSpec* draw_spec_ = nullptr;
  Drawn* draw_out_ = nullptr;
  void* draw_scratch_ = nullptr;
  int draw_cap_ = 0;
  Status ensure_draw(int B);  // draw_spec_ / draw_out_ / draw_scratch_ for B rows
  // Depth-2 pipeline (draw_backend.cu): launch_draw enqueues the decode graph, the draw, a device
  // copy of the drawn id into the state's step input (token < 0: the input is the previous step's
  // draw, already there) and the record's copy to pinned memory; collect_draw waits on the oldest
  // step's event. Two slots (rows 0 and 1 of draw_spec_ / draw_out_), pinned copies, one event each;
  // steps launched and collected so far; the state of the last launch. Then launch()'s tickets: each
  // in-flight step's ticket and where its draw goes, oldest first, and the statuses of steps that ran
  // at launch, until waited for.
  Status launch_draw(CudaSeqState& st, int32_t token, const DrawSpec& spec);
  Status collect_draw(Drawn& out);
  DrawSpec* pipe_spec_h_ = nullptr;
  Drawn* pipe_out_h_ = nullptr;
  int32_t* pipe_tok_h_ = nullptr;
  cudaEvent_t pipe_ev_[2] = {};
  uint64_t pipe_launched_ = 0, pipe_collected_ = 0;
  const CudaSeqState* pipe_last_ = nullptr;
  struct InFlight {
    StepTicket ticket;
    Drawn* out;
  };
  std::vector<InFlight> in_flight_;
  RanSteps done_;
  StepTicket tickets_ = 0;
  // Collects the steps in flight launched up to `upto`, in launch order, each draw into its Drawn and
  // each status into done_ (for wait); returns the first failure.
  Status collect_in_flight(StepTicket upto);
  // Speculative decoding (step/spec.cu). A verify feed of the last step: its state, the state's tokens
  // before the step, its length, its first row among the step's verify rows (spec_u_), its slot in
  // spec_snap_ (the copy of the state's DeltaNet states and conv windows: the fixed arena up to its
  // StepCtl). spec_u_: the step's DeltaNet projections u of the verify rows, [n_gdn][spec_rows_][spec_ldu_].
  struct SpecUndo {
    const CudaSeqState* st;
    int n0, L, row0, slot;
  };
  std::vector<SpecUndo> spec_undo_;
  char* spec_snap_ = nullptr;
  size_t spec_snap_cap_ = 0;  // bytes
  float* spec_u_ = nullptr;
  size_t spec_u_cap_ = 0;  // floats
  int spec_rows_ = 0, spec_ldu_ = 0;
  // Before a mixed step: forgets the last step's verify feeds, copies aside each rewindable feed's
  // DeltaNet states and records it; undo[j] = its record's index for feeds[j] (-1: not rewindable).
  Status spec_begin(std::span<const StepFeed> feeds, int ldu, std::vector<int>& undo);
  // In the step, DeltaNet layer gi (of the DeltaNet layers): the rows of record r, at u (stride spec_ldu_), saved.
  Status spec_save_u(int gi, int r, const float* u);
  // Prefill scratch (step/prefill.cu), allocated on first use for chunks of up to pf_cap_ tokens.
  struct PfScratch {
    int32_t *tok = nullptr, *topk_ids = nullptr, *slot_tok = nullptr, *slot_of = nullptr, *tiles = nullptr, *rscratch = nullptr;
    float *x = nullptr, *hn = nullptr, *mix = nullptr, *u = nullptr, *qn = nullptr, *kn = nullptr, *v = nullptr;
    float *g = nullptr, *beta = nullptr, *o_raw = nullptr, *o = nullptr, *rl = nullptr, *topk_w = nullptr;
    float *act = nullptr, *yd = nullptr, *sact = nullptr, *sy = nullptr;
    uint16_t* qb = nullptr;
    uint16_t *ah = nullptr, *al = nullptr;  // GEMM A split into fp16 hi/lo planes (step/prefill.cu)
    uint16_t* sact16 = nullptr;  // single pass: the shared expert's SwiGLU output as fp16 [chunk][shared I]
    float* axs = nullptr;
    float* wy = nullptr;  // chunked DeltaNet WY scratch (gdn_chunk.cu)
    pf::GdnPrefillArgs* seg_args = nullptr;  // a pass's segments' DeltaNet args [DeltaNet layers][kMaxAttnSegs]
    int32_t* pos_host = nullptr;  // pinned [kMaxAttnSegs]: positions for the control blocks
    int tok_cap = 0, max_tiles = 0;
  } pf_;
  int pf_cap_ = 0;
  Status pf_alloc(int chunk);
  // The prefill DeltaNet arguments (pf::gdn_prefill) of layer i for M tokens of st from position pos0, their
  // projections at u [M][ldu]: the layer's weights, the state's S and its conv windows (double-buffered by
  // position parity); the prefill scratch from its row pr on, the readout o [M][value dim], the WY scratch wy.
  pf::GdnPrefillArgs gdn_args(int i, CudaSeqState& st, int pos0, int M, const float* u, int ldu, size_t pr, float* o,
                              float* wy) const;
  int n_gdn_layers() const;  // the DeltaNet layers
  int prefill_chunk_cap() const;  // the prefill scratch's chunk (LILY_PREFILL_CHUNK, default 4096)
  int prefill_min() const;  // prompts shorter than this replay the decode graph (LILY_PREFILL_MIN, default 8)
  BatchCtx* batch_ = nullptr;  // step/batch.cu
  Status batch_alloc(int B);
  // forward_batch, or (spec given) decode_draw's rows drawn on the device (step/batch.cu).
  Status batch_step(std::span<SeqState* const> states, std::span<const int32_t> tokens, std::span<float> logits,
                    std::span<const DrawSpec> spec, std::span<Drawn> out);
  // Draws B rows of device logits [B][V] as spec says into out (host), synchronising (draw_backend.cu).
  Status draw_device(const float* logits, int B, std::span<const DrawSpec> spec, std::span<Drawn> out);
  Status enqueue_batch(int B, cudaStream_t s);
  Status batch_graph(int B, cudaGraphExec_t& out);  // the step graph of B rows (captured once)
  // The batched step's MoE block for a prefill chunk of M rows (step/batch.cu): moe_rows_ok(M) says
  // whether it applies (short chunks, the batch scratch holds M rows).
  bool moe_rows_ok(int M);
  Status moe_rows(const DevLayer& L, const float* hn, int M, float* mix, cudaStream_t s);
  void print_profile(int B);
  void end_profile(int key, int B);  // after a profiled step: print on the third of its kind, free the events
  // One prefill pass (step/prefill.cu): segments' tokens one after the other in pf_.tok, each appended at its
  // state's st->n (not advanced); logits (host [vocab], or null) of each one's last token.
  struct PfSeg {
    CudaSeqState* st;
    int M;
    float* logits;
  };
  Status pf_pass(std::span<const PfSeg> segs);
  // After the passes: each segment's sequence advanced by its M tokens, here and in its control block (the
  // position the decode graph reads); waits for the stream.
  Status pf_commit(std::span<const PfSeg> segs);
  std::vector<std::pair<const char*, cudaEvent_t>>* prof_ = nullptr;
  // Profiling: enqueue only the ops named only_ (per-op graphs); bytes each op reads, by name.
  const char* only_ = nullptr;
  std::vector<std::pair<std::string, double>>* prof_bytes_ = nullptr;
  Status profile_graphs(CudaSeqState& st);
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
