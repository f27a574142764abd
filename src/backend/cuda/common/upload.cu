// Weight upload for the CUDA backend: streams the mmap'd checkpoint through two pinned staging
// buffers into one device arena, concatenating fused projections and interleaving scale/bias.
// The host side (page faults of the mmap + memcpy into pinned memory) is the bottleneck, so large
// copies and the scale/bias interleave run on the thread pool.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/dev_weights.h"
#include "core/thread_pool.h"

namespace lily {
namespace cuda {
namespace {

using clock_type = std::chrono::steady_clock;

// memcpy, split over the thread pool when large.
void par_copy(char* dst, const char* src, size_t n) {
  if (n < (size_t(4) << 20)) {
    std::memcpy(dst, src, n);
    return;
  }
  ThreadPool::global().parallel_for(n, size_t(1) << 20, [&](size_t a, size_t b) { std::memcpy(dst + a, src + a, b - a); });
}

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
  bool dry() const { return !dev_; }
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
      par_copy(pin_[cur_] + fill_, p, take);
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
    if (up.dry()) {  // sizes only
      up.write(nullptr, n * 4);
      continue;
    }
    const size_t step = size_t(4) << 20;
    for (size_t i0 = 0; i0 < n; i0 += step) {
      const size_t m = std::min(step, n - i0);
      buf.resize(2 * m);
      auto fill = [&](size_t a, size_t b) {
        for (size_t i = a; i < b; ++i) buf[2 * i] = p->scales[i0 + i].bits, buf[2 * i + 1] = p->biases[i0 + i].bits;
      };
      if (m >= (size_t(1) << 18))
        ThreadPool::global().parallel_for(m, size_t(1) << 16, fill);
      else
        fill(0, m);
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

}  // namespace

Status upload_weights(const ModelWeights& w, bool verbose, void** arena, DevWeights& d, double* gbps) {
  // Dry run for the size, one arena, then the real upload.
  Uploader dry(nullptr, 0, false);
  DevWeights tmp;
  put_all(dry, w, tmp);
  const size_t total = dry.offset() + 256;
  LILY_CU_TRY(cudaMalloc(arena, total));
  Uploader up(static_cast<char*>(*arena), total, verbose);
  LILY_TRY(up.init());
  put_all(up, w, d);
  LILY_TRY(up.finish());
  *gbps = up.gbps();
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
