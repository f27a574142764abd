// The CUDA backend: weights uploaded once (mmap → pinned staging → device, with the fused
// concatenations [qkv|z|a|b], [q|k|v], router|shared-gate, shared [gate|up]); per-sequence state
// on the device; the decode step captured once per state as a CUDA graph whose input token and
// position live in device memory, so step N+1 is launched before the host reads token N.
// Prefill (M > 1) replays the step per token for now (the fast prefill is a separate issue).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cstdio>

#include "backend/backend.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/ops.h"

namespace lily {
namespace cuda {
namespace {

using clock_type = std::chrono::steady_clock;

// Streams host bytes into one device arena through two pinned staging buffers. A dry run
// (dev == nullptr) only counts bytes so the arena can be allocated once.
class Uploader {
 public:
  static constexpr size_t kChunk = size_t(64) << 20;
  Uploader(char* dev, size_t total, bool verbose) : dev_(dev), total_(total), verbose_(verbose) {}
  Status init() {
    if (!dev_) return Status::ok();
    LILY_CU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
      LILY_CU_TRY(cudaHostAlloc(&pin_[i], kChunk, cudaHostAllocDefault));
      LILY_CU_TRY(cudaEventCreateWithFlags(&ev_[i], cudaEventDisableTiming));
    }
    t0_ = clock_type::now();
    return Status::ok();
  }
  ~Uploader() {
    if (!dev_) return;
    cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      if (pin_[i]) cudaFreeHost(pin_[i]);
      if (ev_[i]) cudaEventDestroy(ev_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }
  size_t offset() const { return off_; }
  // Pads to `align` and returns the device address of the next byte.
  void* align(size_t a) {
    static const char zeros[256] = {};
    const size_t pad = (a - off_ % a) % a;
    write(zeros, pad);
    return dev_ ? dev_ + off_ : nullptr;
  }
  void write(const void* src, size_t n) {
    if (!dev_) {
      off_ += n;
      return;
    }
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
      const size_t take = std::min(n, kChunk - fill_);
      std::memcpy(pin_[cur_] + fill_, p, take);
      fill_ += take, p += take, n -= take, off_ += take;
      if (fill_ == kChunk) flush();
    }
  }
  Status finish() {
    if (!dev_) return Status::ok();
    flush();
    LILY_CU_TRY(cudaStreamSynchronize(stream_));
    const double s = std::chrono::duration<double>(clock_type::now() - t0_).count();
    if (verbose_)
      std::fprintf(stderr, "\rcuda: uploaded %.2f GB of weights in %.2f s (%.2f GB/s)          \n", off_ / 1e9, s,
                 off_ / 1e9 / s);
    gbps_ = off_ / 1e9 / s;
    return Status::ok();
  }
  double gbps() const { return gbps_; }

 private:
  void flush() {
    if (fill_ == 0) return;
    cudaMemcpyAsync(dev_ + (off_ - fill_), pin_[cur_], fill_, cudaMemcpyHostToDevice, stream_);
    cudaEventRecord(ev_[cur_], stream_);
    cur_ ^= 1;
    cudaEventSynchronize(ev_[cur_]);  // the other buffer's copy is done: reuse it
    fill_ = 0;
    if (verbose_ && off_ / (size_t(1) << 30) != last_report_) {
      last_report_ = off_ / (size_t(1) << 30);
      const double s = std::chrono::duration<double>(clock_type::now() - t0_).count();
      std::fprintf(stderr, "\rcuda: uploading weights %.1f / %.1f GB (%.2f GB/s)", off_ / 1e9, total_ / 1e9,
                 off_ / 1e9 / s);
    }
  }
  char* dev_;
  size_t total_, off_ = 0, fill_ = 0, last_report_ = 0;
  bool verbose_;
  cudaStream_t stream_ = nullptr;
  char* pin_[2] = {};
  cudaEvent_t ev_[2] = {};
  int cur_ = 0;
  clock_type::time_point t0_;
  double gbps_ = 0;
};

// Concatenates quantized weights row-wise into one device weight (codes, then interleaved
// scale/bias pairs).
QW put_q(Uploader& up, std::initializer_list<const QWeight*> parts) {
  QW q;
  q.cols = (*parts.begin())->cols;
  q.bits = (*parts.begin())->bits;
  for (const QWeight* p : parts) q.rows += p->rows;
  q.codes = static_cast<const uint32_t*>(up.align(256));
  for (const QWeight* p : parts) up.write(p->codes, size_t(p->rows) * p->words_per_row() * 4);
  q.sb = static_cast<const uint16_t*>(up.align(256));
  std::vector<uint16_t> buf;
  for (const QWeight* p : parts) {
    const size_t n = size_t(p->rows) * p->groups_per_row();
    const size_t step = size_t(1) << 20;
    for (size_t i0 = 0; i0 < n; i0 += step) {
      const size_t m = std::min(step, n - i0);
      buf.resize(2 * m);
      for (size_t i = 0; i < m; ++i) buf[2 * i] = p->scales[i0 + i].bits, buf[2 * i + 1] = p->biases[i0 + i].bits;
      up.write(buf.data(), buf.size() * 2);
    }
  }
  return q;
}
const void* put_raw(Uploader& up, const void* src, size_t n) {
  void* d = up.align(256);
  up.write(src, n);
  return d;
}

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
};

struct DevWeights {
  QW embed, lm_head;
  const void* final_norm = nullptr;
  std::vector<DevLayer> layers;
};

void put_all(Uploader& up, const ModelWeights& w, DevWeights& d) {
  const ModelConfig& c = w.cfg;
  d.embed = put_q(up, {&w.embed});
  d.final_norm = put_raw(up, w.final_norm, size_t(c.hidden_size) * 2);
  d.layers.resize(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    DevLayer& D = d.layers[i];
    D.attn = L.full_attention;
    D.in_norm = put_raw(up, L.input_norm, size_t(c.hidden_size) * 2);
    D.post_norm = put_raw(up, L.post_norm, size_t(c.hidden_size) * 2);
    if (L.full_attention) {
      D.qkv = put_q(up, {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj});
      D.o_proj = put_q(up, {&L.attn.o_proj});
      D.q_norm = put_raw(up, L.attn.q_norm, size_t(c.head_dim) * 2);
      D.k_norm = put_raw(up, L.attn.k_norm, size_t(c.head_dim) * 2);
    } else {
      const GdnWeights& G = L.gdn;
      D.in_proj = put_q(up, {&G.in_proj_qkv, &G.in_proj_z, &G.in_proj_a, &G.in_proj_b});
      D.out_proj = put_q(up, {&G.out_proj});
      D.conv_w = put_raw(up, G.conv1d, size_t(c.gdn_conv_dim()) * c.linear_conv_kernel_dim * 2);
      D.A_log = static_cast<const float*>(put_raw(up, G.A_log.data(), G.A_log.size() * 4));
      D.dt_bias = put_raw(up, G.dt_bias, size_t(c.linear_num_value_heads) * 2);
      D.gnorm = put_raw(up, G.norm, size_t(c.linear_value_head_dim) * 2);
    }
    const MoeWeights& M = L.moe;
    D.router = put_q(up, {&M.router, &M.shared_expert_gate});
    D.gate = put_q(up, {&M.experts_gate});
    D.up = put_q(up, {&M.experts_up});
    D.down = put_q(up, {&M.experts_down});
    D.sh_gate_up = put_q(up, {&M.shared_gate, &M.shared_up});
    D.sh_down = put_q(up, {&M.shared_down});
  }
  d.lm_head = put_q(up, {&w.lm_head});
}

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
    // Weights: dry run for the size, one arena, then the real upload.
    Uploader dry(nullptr, 0, false);
    DevWeights tmp;
    put_all(dry, w_, tmp);
    const size_t total = dry.offset() + 256;
    LILY_CU_TRY(cudaMalloc(&arena_, total));
    Uploader up(static_cast<char*>(arena_), total, verbose_);
    LILY_TRY(up.init());
    put_all(up, w_, d_);
    LILY_TRY(up.finish());
    upload_gbps_ = up.gbps();
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
    LILY_TRY(ensure_graphs(*st));
    if (M > feed_cap_) {
      if (feed_) cudaFree(feed_);
      feed_cap_ = std::max(M, 4096);
      LILY_CU_TRY(cudaMalloc(&feed_, size_t(feed_cap_) * 4));
    }
    LILY_CU_TRY(cudaMemcpyAsync(feed_, tokens.data(), size_t(M) * 4, cudaMemcpyHostToDevice, stream_));
    for (int i = 0; i < M; ++i) {
      LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, feed_ + i, 4, cudaMemcpyDeviceToDevice, stream_));
      const bool full = i == M - 1 && !logits.empty();
      LILY_CU_TRY(cudaGraphLaunch(full ? st->g_full : st->g_nolog, stream_));
    }
    if (!logits.empty())
      LILY_CU_TRY(cudaMemcpyAsync(logits.data(), logits_, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
    LILY_CU_TRY(cudaStreamSynchronize(stream_));
    st->n += M;
    return Status::ok();
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

Status CudaBackend::enqueue_step(CudaSeqState& st, cudaStream_t s, bool with_logits) {
  const ModelConfig& c = cfg_;
  const int H = c.hidden_size, C = c.gdn_conv_dim(), vd = c.gdn_value_dim();
  mark("start", s);
  LILY_TRY(embed_row(d_.embed, st.ctl, 0, xres_[0], s));
  mark("embed", s);
  int p = 0;
  const void* mix = nullptr;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const DevLayer& L = d_.layers[i];
    auto& SL = st.layers[i];
    GemvArgs in{};
    in.pro = Pro::kAddNorm, in.in = xres_[p], in.mix = mix, in.gain = L.in_norm, in.res_out = xres_[p ^ 1];
    in.eps = c.rms_norm_eps, in.y = u_;
    if (!L.attn) {
      in.w = L.in_proj;
      LILY_TRY(gemv(in, s));
      mark("gdn: add+norm+[qkv|z|a|b] gemv", s);
      GdnArgs g{};
      g.u = u_, g.conv_w = L.conv_w, g.conv = SL.conv, g.S = SL.S, g.A_log = L.A_log, g.dt_bias = L.dt_bias;
      g.o = o_, g.ctl = st.ctl, g.nk = c.linear_num_key_heads, g.nv = c.linear_num_value_heads;
      g.dk = c.linear_key_head_dim, g.dv = c.linear_value_head_dim, g.K = c.linear_conv_kernel_dim;
      LILY_TRY(gdn_step(g, s));
      mark("gdn: step (conv..readout)", s);
      GemvArgs out{};
      out.w = L.out_proj, out.pro = Pro::kGatedNorm, out.in = o_, out.z = u_ + C, out.gain = L.gnorm;
      out.gn_dv = c.linear_value_head_dim, out.eps = c.rms_norm_eps, out.y = mix_;
      LILY_TRY(gemv(out, s));
      mark("gdn: gated norm+out_proj gemv", s);
    } else {
      in.w = L.qkv;
      LILY_TRY(gemv(in, s));
      mark("attn: add+norm+[q|k|v] gemv", s);
      AttnArgs a{};
      a.qkv = u_, a.q_norm = L.q_norm, a.k_norm = L.k_norm, a.q = q_, a.kc = SL.kc, a.vc = SL.vc, a.out = o_;
      a.partial = attn_partial_, a.ctl = st.ctl, a.nh = c.num_attention_heads, a.nkv = c.num_key_value_heads;
      a.hd = c.head_dim, a.qw = (c.attn_output_gate ? 2 : 1) * c.head_dim, a.rot = c.rotary_dim();
      a.max_seq = st.cap, a.n_split = attn_max_splits(), a.theta = c.rope_theta, a.eps = c.rms_norm_eps;
      LILY_TRY(attn_prep(a, s));
      mark("attn: qk norm+rope+cache", s);
      LILY_TRY(attn_decode(a, s));
      mark("attn: split-K decode+gate", s);
      GemvArgs out{};
      out.w = L.o_proj, out.pro = Pro::kPlain, out.in = o_, out.y = mix_;
      LILY_TRY(gemv(out, s));
      mark("attn: o_proj gemv", s);
    }
    p ^= 1;
    GemvArgs r{};
    r.w = L.router, r.pro = Pro::kAddNorm, r.in = xres_[p], r.mix = mix_, r.gain = L.post_norm;
    r.res_out = xres_[p ^ 1], r.n_out = hn_, r.eps = c.rms_norm_eps, r.y = rl_, r.y_f32 = true;
    r.epi = Epi::kTopK, r.ctl = st.ctl, r.n_experts = c.num_experts, r.top_k = c.num_experts_per_tok;
    r.topk_ids = topk_ids_, r.topk_w = topk_w_, r.norm_topk = c.norm_topk_prob;
    LILY_TRY(gemv(r, s));
    mark("moe: add+norm+router q8+top-k", s);
    p ^= 1;
    MoeArgs m{};
    m.gate = L.gate, m.up = L.up, m.down = L.down, m.sh_gate_up = L.sh_gate_up, m.sh_down = L.sh_down;
    m.topk_ids = topk_ids_, m.topk_w = topk_w_, m.top_k = c.num_experts_per_tok, m.H = H;
    m.I = c.moe_intermediate_size, m.x = hn_, m.act = act_, m.out = mix_;
    LILY_TRY(moe_gate_up(m, s));
    mark("moe: gate+up+swiglu (8+shared)", s);
    LILY_TRY(moe_down_combine(m, s));
    mark("moe: down+combine+shared", s);
    mix = mix_;
  }
  (void)vd;
  if (!with_logits) return bump_pos(st.ctl, s);
  GemvArgs lm{};
  lm.w = d_.lm_head, lm.pro = Pro::kAddNorm, lm.in = xres_[p], lm.mix = mix_, lm.gain = d_.final_norm;
  lm.eps = c.rms_norm_eps, lm.y = logits_, lm.y_f32 = true, lm.epi = Epi::kArgmax, lm.ctl = st.ctl;
  lm.tok_out = st.tok_dev, lm.partial = am_partial_;
  LILY_TRY(gemv(lm, s));
  mark("lm_head gemv+argmax", s);
  return Status::ok();
}

Status CudaBackend::profile_step(CudaSeqState& st) {
  std::vector<std::pair<const char*, cudaEvent_t>> ev;
  prof_ = &ev;
  Status s = enqueue_step(st, stream_, true);
  prof_ = nullptr;
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  st.n += 1;
  if (!s) return s;
  std::vector<std::pair<std::string, std::pair<double, int>>> agg;
  double total = 0;
  for (size_t i = 1; i < ev.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[i - 1].second, ev[i].second);
    total += ms;
    auto it = std::find_if(agg.begin(), agg.end(), [&](auto& a) { return a.first == ev[i].first; });
    if (it == agg.end()) agg.push_back({ev[i].first, {ms, 1}});
    else it->second.first += ms, it->second.second += 1;
  }
  for (auto& e : ev) cudaEventDestroy(e.second);
  std::fprintf(stderr, "cuda profile (one un-captured step at pos %d, events between ops; includes launch gaps):\n", st.n - 1);
  std::fprintf(stderr, "| op | launches | total ms | share |\n|---|---:|---:|---:|\n");
  for (auto& a : agg)
    std::fprintf(stderr, "| %s | %d | %.3f | %.1f%% |\n", a.first.c_str(), a.second.second, a.second.first, 100 * a.second.first / total);
  std::fprintf(stderr, "| total | | %.3f | |\n", total);
  return Status::ok();
}

std::unique_ptr<SeqState> CudaSeqState::clone() const {
  auto r = be->new_state(cap);
  if (!r) return nullptr;
  auto st = std::unique_ptr<CudaSeqState>(static_cast<CudaSeqState*>(std::move(r).value().release()));
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& a = layers[i];
    auto& b = st->layers[i];
    if (a.kc) {
      cudaMemcpy(b.kc, a.kc, a.kv_bytes, cudaMemcpyDeviceToDevice);
      cudaMemcpy(b.vc, a.vc, a.kv_bytes, cudaMemcpyDeviceToDevice);
    }
    if (a.conv) cudaMemcpy(b.conv, a.conv, a.conv_bytes, cudaMemcpyDeviceToDevice);
    if (a.S) cudaMemcpy(b.S, a.S, a.S_bytes, cudaMemcpyDeviceToDevice);
  }
  cudaMemcpy(st->ctl, ctl, sizeof(StepCtl), cudaMemcpyDeviceToDevice);
  st->n = n;
  return st;
}

}  // namespace
}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose) {
  auto be = std::make_unique<cuda::CudaBackend>(weights, verbose);
  LILY_TRY(be->init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace lily
