// Gated DeltaNet prefill over M tokens: (1) conv + SiLU over the chunk with the carried window,
// q/k L2 norms and q scale, gates (one block per 16 tokens and 128-channel head for kernel width 4,
// other widths: one block per token and head); (2) the new conv window (fp32, decode layout); (3) the
// delta-rule recurrence in the chunked WY form on tensor cores (gdn_chunk.cu, scratch a.wy); (4) the
// gated RMSNorm with SiLU(z), giving the out_proj input. The token-by-token scan that (3) replaced took
// 134.5 ms at 8k against 18.2 + 34.9 ms (H200, docs/perf/2026-12-03-cuda-prefill-2.md, since removed
// from the tree: git show 0a3ed3e:docs/perf/2026-12-03-cuda-prefill-2.md) and is gone.
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

constexpr int kD = 128;

__device__ __forceinline__ float softplus(float v) { return v > 20.f ? v : log1pf(expf(v)); }

template <bool kSeg>
__global__ void __launch_bounds__(kD) prep_kernel(GdnPrefillArgs a0, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  if (int(blockIdx.x) >= a.M) return;
  __shared__ float red[32];
  const int m = blockIdx.x, hb = blockIdx.y, d = threadIdx.x, K = a.K, W = K - 1;
  const int kd = a.nk * kD, vd = a.nv * kD, C = 2 * kd + vd;
  const int ch = hb * kD + d;
  const uint16_t* w = static_cast<const uint16_t*>(a.conv_w);
  const float* win = a.win_in;
  float acc = 0.f;
  for (int tau = 0; tau < K; ++tau) {
    const int tm = m - W + tau;
    const float val = tm >= 0 ? a.u[size_t(tm) * a.ldu + ch] : win[size_t(ch) * W + W + tm];
    acc += bf(w[ch * K + tau]) * val;
  }
  const float c = silu(acc);
  if (hb < 2 * a.nk) {
    const float ss = block_sum(c * c, red);
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    if (hb < a.nk)
      a.qn[size_t(m) * kd + hb * kD + d] = c * inv * (1.0f / sqrtf(float(kD)));
    else
      a.kn[size_t(m) * kd + (hb - a.nk) * kD + d] = c * inv;
  } else {
    a.v[size_t(m) * vd + (hb - 2 * a.nk) * kD + d] = c;
  }
  if (hb == 0 && d < a.nv) {
    const float av = a.u[size_t(m) * a.ldu + C + vd + d], bv = a.u[size_t(m) * a.ldu + C + vd + a.nv + d];
    a.beta[size_t(m) * a.nv + d] = 1.0f / (1.0f + expf(-bv));
    const float x = av + bf(static_cast<const uint16_t*>(a.dt_bias)[d]);
    a.g[size_t(m) * a.nv + d] = -expf(a.A_log[d]) * softplus(x);
  }
}

// prep_kernel for kernel width 4 over kPT tokens per block: each thread keeps its channel's
// inputs for tokens m0−3 .. m0+kPT−1 in registers (one load per token instead of four), and the
// per-token L2 sums of a q/k head reduce kPT tokens at once.
constexpr int kPT = 16;
template <bool kSeg>
__global__ void __launch_bounds__(kD) prep4_kernel(GdnPrefillArgs a0, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  if (int(blockIdx.x) * kPT >= a.M) return;
  __shared__ float red[kD / 32][kPT];
  const int m0 = blockIdx.x * kPT, hb = blockIdx.y, d = threadIdx.x, lane = d & 31, warp = d >> 5;
  const int kd = a.nk * kD, vd = a.nv * kD, C = 2 * kd + vd, ch = hb * kD + d, n = min(kPT, a.M - m0);
  const uint16_t* w = static_cast<const uint16_t*>(a.conv_w);
  const float* win = a.win_in;
  float x[kPT + 3];
#pragma unroll
  for (int j = 0; j < kPT + 3; ++j) {
    const int tm = m0 - 3 + j;
    float val = 0.f;
    if (tm < 0) val = win[size_t(ch) * 3 + 3 + tm];
    else if (tm < a.M) val = a.u[size_t(tm) * a.ldu + ch];
    x[j] = val;
  }
  const float w0 = bf(w[ch * 4]), w1 = bf(w[ch * 4 + 1]), w2 = bf(w[ch * 4 + 2]), w3 = bf(w[ch * 4 + 3]);
  float c[kPT];
#pragma unroll
  for (int i = 0; i < kPT; ++i) {
    float acc = 0.f;
    acc += w0 * x[i];
    acc += w1 * x[i + 1];
    acc += w2 * x[i + 2];
    acc += w3 * x[i + 3];
    c[i] = silu(acc);
  }
  if (hb < 2 * a.nk) {
    float ss[kPT];
#pragma unroll
    for (int i = 0; i < kPT; ++i) ss[i] = warp_sum(c[i] * c[i]);
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < kPT; ++i) red[warp][i] = ss[i];
    __syncthreads();
    float* dst = hb < a.nk ? a.qn + hb * kD + d : a.kn + (hb - a.nk) * kD + d;
    const float scale = hb < a.nk ? 1.0f / sqrtf(float(kD)) : 1.0f;
#pragma unroll
    for (int i = 0; i < kPT; ++i) {
      const float tot = (red[0][i] + red[1][i]) + (red[2][i] + red[3][i]);
      if (i < n) dst[size_t(m0 + i) * kd] = c[i] * (1.0f / sqrtf(tot + 1e-6f)) * scale;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPT; ++i)
      if (i < n) a.v[size_t(m0 + i) * vd + (hb - 2 * a.nk) * kD + d] = c[i];
  }
  if (hb == 0 && d < a.nv) {
    for (int i = 0; i < n; ++i) {
      const int m = m0 + i;
      const float av = a.u[size_t(m) * a.ldu + C + vd + d], bv = a.u[size_t(m) * a.ldu + C + vd + a.nv + d];
      a.beta[size_t(m) * a.nv + d] = 1.0f / (1.0f + expf(-bv));
      const float xx = av + bf(static_cast<const uint16_t*>(a.dt_bias)[d]);
      a.g[size_t(m) * a.nv + d] = -expf(a.A_log[d]) * softplus(xx);
    }
  }
}

template <bool kSeg>
__global__ void window_kernel(GdnPrefillArgs a0, int C, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= C) return;
  const int W = a.K - 1;
  float vals[8];
  for (int tau = 0; tau < W; ++tau) {
    const int tm = a.M - W + tau;
    vals[tau] = tm >= 0 ? a.u[size_t(tm) * a.ldu + ch] : a.win_in[size_t(ch) * W + W + tm];
  }
  for (int tau = 0; tau < W; ++tau) a.win_out[size_t(ch) * W + tau] = vals[tau];
}

// One block per token, one warp per head (looping): o = gain ⊙ o_raw·rsqrt(mean o²+eps) ⊙ silu(z), fp32 or (o16)
// rounded to fp16.
template <bool kSeg>
__global__ void gated_norm_kernel(GdnPrefillArgs a0, int C, const GdnPrefillArgs* segs) {
  const GdnPrefillArgs a = seg_args<kSeg>(a0, segs);
  if (int(blockIdx.x) >= a.M) return;
  const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int vd = a.nv * kD;
  const uint16_t* gain = static_cast<const uint16_t*>(a.gnorm);
  for (int h = warp; h < a.nv; h += nw) {
    const float* o = a.o_raw + size_t(m) * vd + h * kD;
    float v[4], ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = o[lane + 32 * j], ss += v[j] * v[j];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(kD) + a.eps);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int d = lane + 32 * j;
      const float z = a.u[size_t(m) * a.ldu + C + h * kD + d];
      const float val = bf(gain[d]) * v[j] * inv * silu(z);
      if (a.o16) a.o16[size_t(m) * vd + h * kD + d] = __half_as_ushort(__float2half_rn(val));
      else a.o[size_t(m) * vd + h * kD + d] = val;
    }
  }
}

}  // namespace

// One sequence (segs null) or n_seg segments (segs: their args on the device; a: the longest's, for
// the grids).
static Status prefill_launch(const GdnPrefillArgs& a, const GdnPrefillArgs* segs, int n_seg, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!a.wy) return cu_err("pf::gdn_prefill: the chunked form's scratch (wy) is required");
  if (a.nk <= 0 || a.nv % a.nk != 0 || a.nv > kD) return cu_err("pf::gdn_prefill: {} value / {} key heads unsupported", a.nv, a.nk);
  if (a.K < 2 || a.K > 9) return cu_err("pf::gdn_prefill: conv kernel {} unsupported", a.K);
  if (a.M <= 0 || n_seg <= 0) return Status::ok();
  const int C = 2 * a.nk * kD + a.nv * kD;
  auto prof = [&](const char* what) {
    if (a.prof) a.prof(a.prof_ctx, what);
  };
  const unsigned z = unsigned(n_seg);
  if (a.K == 4 && kD % 32 == 0 && kD / 32 == 4) {
    const dim3 g((a.M + kPT - 1) / kPT, 2 * a.nk + a.nv, z);
    if (segs) prep4_kernel<true><<<g, kD, 0, s>>>(a, segs);
    else prep4_kernel<false><<<g, kD, 0, s>>>(a, nullptr);
  } else {
    const dim3 g(a.M, 2 * a.nk + a.nv, z);
    if (segs) prep_kernel<true><<<g, kD, 0, s>>>(a, segs);
    else prep_kernel<false><<<g, kD, 0, s>>>(a, nullptr);
  }
  LILY_TRY(launch_status("pf::gdn_prep"));
  prof("gdn: conv+L2+gates (prep)");
  if (segs) window_kernel<true><<<dim3((C + 255) / 256, 1, z), 256, 0, s>>>(a, C, segs);
  else window_kernel<false><<<(C + 255) / 256, 256, 0, s>>>(a, C, nullptr);
  LILY_TRY(launch_status("pf::gdn_window"));
  prof("gdn: conv window");
  LILY_TRY(segs ? gdn_chunk_scan_segments(a, segs, n_seg, stream) : gdn_chunk_scan(a, stream));
  if (segs) gated_norm_kernel<true><<<dim3(a.M, 1, z), 256, 0, s>>>(a, C, segs);
  else gated_norm_kernel<false><<<a.M, 256, 0, s>>>(a, C, nullptr);
  LILY_TRY(launch_status("pf::gdn_gated_norm"));
  prof("gdn: gated norm");
  return Status::ok();
}

Status gdn_prefill(const GdnPrefillArgs& a, Stream stream) { return prefill_launch(a, nullptr, 1, stream); }

Status gdn_prefill_segments(const GdnPrefillArgs& longest, const GdnPrefillArgs* segs, int n_seg, Stream stream) {
  return prefill_launch(longest, segs, n_seg, stream);
}

}  // namespace lily::cuda::pf
