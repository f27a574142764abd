// deltanet/: the Gated DeltaNet mixer: short conv + SiLU, q/k L2 norms, gates, the delta-rule
// recurrence over the state S [nv, dk, dv] (fp16, computed in fp32), the gated RMSNorm. Activations and the conv window
// fp32. Entry points: gdn_step (common/ops.h; gdn.cu: one token, u fp32 [C + vd + 2·nv] →
// o, og fp32 [nv·dv]; dk, dv multiples of 32, dk ≤ 256); pf::gdn_prefill, pf::gdn_prefill_segments
// (step/prefill_ops.h; gdn_prefill.cu, gdn_chunk.cu: M tokens, dk = dv = 128, the chunked WY form on
// tensor cores with 3xTF32 products, ~fp32); bgdn_step (step/batch_ops.h; batch_gdn.cu: B rows with
// each bit-identical to gdn_step).
//
// The whole Gated DeltaNet decode step in one kernel: conv + SiLU (double-buffered window), L2
// norms, gates, decay + delta update + readout over the fp16 state (fp32 arithmetic). One block per (value head,
// 32-column slice) with dk threads (one warp per 32 state rows), so the real shapes (dk = dv =
// 128, 32 heads) give 128 blocks sharing the 1 MiB/layer state traffic. Activations and the
// conv window fp32. The gated RMSNorm runs in the out_proj GEMV's input
// staging (needs the whole head).
#include <cooperative_groups.h>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/deltanet/delta_rule.cuh"

namespace lily::cuda {
namespace {

constexpr int kMaxDk = 256, kSlice = 32, kMaxWarps = kMaxDk / 32;

__device__ __forceinline__ float softplus(float v) { return v > 20.f ? v : log1pf(expf(v)); }

__global__ void __launch_bounds__(kMaxDk) gdn_step_kernel(GdnArgs a) {
  __shared__ float qs[kMaxDk], ks[kMaxDk], vs[kSlice], red[32], rs[kMaxWarps][kSlice], os[kMaxWarps][kSlice];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nw = blockDim.x >> 5;
  const int dk = a.dk, dv = a.dv, n_slices = dv / kSlice;
  const int h = blockIdx.x / n_slices, slice = blockIdx.x % n_slices;
  // Before the PDL wait: only what kernels two or more back wrote (the state S and conv window of
  // the previous step, the position) and weights. u (this token's projections) comes after it.
  const int pos = a.ctl ? a.ctl->pos : a.pos, par = pos & 1;
  const int ratio = a.nv / a.nk, kh = h / ratio, kd = a.nk * dk, vd = a.nv * dv, C = 2 * kd + vd, K = a.K;
  const int col = slice * kSlice + lane, i0 = warp * 32;

  // This thread's 32 state values: rows i0.., column col (coalesced across the warp).
  __half* Sh = reinterpret_cast<__half*>(a.S) + size_t(h) * dk * dv;
  float sv[32];
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) sv[ii] = ld_state(Sh + size_t(i0 + ii) * dv + col);

  const float* u = a.u;
  const uint16_t* w = static_cast<const uint16_t*>(a.conv_w);
  float* win = a.conv;
  // Σ over the window (oldest first) of this channel: everything but the newest tap.
  auto conv_old = [&](int ch) {
    const float* src = win + (size_t(par) * C + ch) * (K - 1);
    float acc = 0.f;
    for (int tt = 0; tt < K - 1; ++tt) acc += bf(w[ch * K + tt]) * src[tt];
    return acc;
  };
  const int ch_q = kh * dk + t, ch_k = kd + kh * dk + t, ch_v = 2 * kd + h * dv + slice * kSlice + t;
  const float old_q = conv_old(ch_q), old_k = conv_old(ch_k), old_v = t < kSlice ? conv_old(ch_v) : 0.f;
  const float A = a.A_log[h], dtb = bf(static_cast<const uint16_t*>(a.dt_bias)[h]);
  pdl_wait();
  pdl_trigger();
  auto conv = [&](int ch, float acc, bool write) {
    acc += bf(w[ch * K + K - 1]) * u[ch];
    if (write) {
      const float* src = win + (size_t(par) * C + ch) * (K - 1);
      float* dst = win + (size_t(par ^ 1) * C + ch) * (K - 1);
      for (int tt = 0; tt < K - 2; ++tt) dst[tt] = src[tt + 1];
      dst[K - 2] = u[ch];
    }
    return silu(acc);
  };
  const bool writer_qk = (h % ratio == 0) && slice == 0;
  const float qv = conv(ch_q, old_q, writer_qk);
  const float kv = conv(ch_k, old_k, writer_qk);
  if (t < kSlice) vs[t] = conv(ch_v, old_v, true);
  const float sq = block_sum(qv * qv, red);
  const float sk = block_sum(kv * kv, red);
  qs[t] = qv * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(float(dk)));
  ks[t] = kv * (1.0f / sqrtf(sk + 1e-6f));
  const float a_h = u[C + vd + h], b_h = u[C + vd + a.nv + h];
  const float beta = sigmoid(b_h);
  const float g = -expf(A) * softplus(a_h + dtb);
  const float alpha = expf(g);
  __syncthreads();

  rs[warp][lane] = delta_decay_dot(sv, ks + i0, alpha);
  __syncthreads();
  float rsum = 0.f;
  for (int ww = 0; ww < nw; ++ww) rsum += rs[ww][lane];
  const float delta = beta * (vs[lane] - rsum);
  os[warp][lane] = delta_update_read(sv, ks + i0, qs + i0, delta, Sh + size_t(i0) * dv + col, dv);
  __syncthreads();
  __shared__ float ss_slice;
  float osum = 0.f;
  if (warp == 0) {
    for (int ww = 0; ww < nw; ++ww) osum += os[ww][lane];
    a.o[h * dv + col] = osum;
    if (a.og) {
      const float s2 = warp_sum(osum * osum);
      if (lane == 0) ss_slice = s2;
    }
  }
  if (a.og) {  // kernel-uniform: launched as clusters of n_slices blocks (one head)
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (warp == 0) {
      float tot = 0.f;
      for (int sl = 0; sl < n_slices; ++sl) tot += *cluster.map_shared_rank(&ss_slice, sl);
      const float inv = 1.0f / sqrtf(tot / float(dv) + a.eps);
      const float zz = a.z[h * dv + col];
      const float g = bf(static_cast<const uint16_t*>(a.gnorm)[col]);
      a.og[h * dv + col] = g * osum * inv * silu(zz);
    }
    cluster.sync();  // no block leaves while another reads its shared memory
  }
}

}  // namespace

Status gdn_step(const GdnArgs& a, Stream s) {
  if (a.dk % 32 != 0 || a.dk <= 0 || a.dk > kMaxDk || a.dv % kSlice != 0 || a.dv <= 0)
    return cu_err("gdn_step: head dims {}x{} unsupported (dk a multiple of 32 up to {}, dv a multiple of 32)", a.dk, a.dv, kMaxDk);
  if (a.nk <= 0 || a.nv % a.nk != 0) return cu_err("gdn_step: {} value heads not a multiple of {} key heads", a.nv, a.nk);
  if (a.K < 2 || a.K > 8) return cu_err("gdn_step: conv kernel {} unsupported", a.K);
  if (!a.ctl && a.pos < 0) return cu_err("gdn_step: no position");
  const int n_slices = a.dv / kSlice;
  if (a.og && (n_slices > 8 || !a.z || !a.gnorm)) return cu_err("gdn_step: fused gated norm needs dv ≤ 256, z and gain (dv={})", a.dv);
  const dim3 grid(a.nv * n_slices), block(a.dk);
  auto st = static_cast<cudaStream_t>(s);
  const int cl = a.og ? n_slices : 0;
  return launch_kc("gdn_step", gdn_step_kernel, grid, block, 0, st, cl, a);
}

}  // namespace lily::cuda
