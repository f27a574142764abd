// The whole Gated DeltaNet decode step in one kernel: conv + SiLU (double-buffered window), L2
// norms, gates, decay + delta update + readout over the fp32 state. One block per (value head,
// 32-column slice): 4 slices per head so 128 blocks share the 2 MiB/layer state traffic. The
// gated RMSNorm runs in the out_proj GEMV's input staging (needs the whole head).
#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kD = 128, kSlice = 32, kThreads = 128;

__device__ __forceinline__ float softplus(float v) { return v > 20.f ? v : log1pf(expf(v)); }

__global__ void __launch_bounds__(kThreads) gdn_step_kernel(GdnArgs a) {
  __shared__ float qs[kD], ks[kD], vs[kSlice], red[32], rs[4][kSlice], os[4][kSlice];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int h = blockIdx.x / (kD / kSlice), slice = blockIdx.x % (kD / kSlice);
  const int pos = a.ctl ? a.ctl->pos : a.pos, par = pos & 1;
  const int ratio = a.nv / a.nk, kh = h / ratio, kd = a.nk * kD, vd = a.nv * kD, C = 2 * kd + vd, K = a.K;
  const int col = slice * kSlice + lane, i0 = warp * 32;

  // Prefetch this thread's 32 state values: rows i0.., column col (coalesced across the warp).
  float* Sh = a.S + size_t(h) * kD * kD;
  float sv[32];
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) sv[ii] = Sh[(i0 + ii) * kD + col];

  const uint16_t* u = static_cast<const uint16_t*>(a.u);
  const uint16_t* w = static_cast<const uint16_t*>(a.conv_w);
  uint16_t* win = static_cast<uint16_t*>(a.conv);
  auto conv = [&](int ch, bool write) {
    const uint16_t* src = win + (size_t(par) * C + ch) * (K - 1);
    float acc = 0.f;
    for (int tt = 0; tt < K - 1; ++tt) acc += bf(w[ch * K + tt]) * bf(src[tt]);
    acc += bf(w[ch * K + K - 1]) * bf(u[ch]);
    if (write) {
      uint16_t* dst = win + (size_t(par ^ 1) * C + ch) * (K - 1);
      for (int tt = 0; tt < K - 2; ++tt) dst[tt] = src[tt + 1];
      dst[K - 2] = u[ch];
    }
    return rbf(silu(acc));
  };
  const bool writer_qk = (h % ratio == 0) && slice == 0;
  const float qv = conv(kh * kD + t, writer_qk);
  const float kv = conv(kd + kh * kD + t, writer_qk);
  if (t < kSlice) vs[t] = conv(2 * kd + h * kD + slice * kSlice + t, true);
  const float sq = block_sum(qv * qv, red);
  const float sk = block_sum(kv * kv, red);
  qs[t] = qv * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(float(kD)));
  ks[t] = kv * (1.0f / sqrtf(sk + 1e-6f));
  const float a_h = bf(u[C + vd + h]), b_h = bf(u[C + vd + a.nv + h]);
  const float beta = sigmoid(b_h);
  const float g = -expf(a.A_log[h]) * softplus(a_h + bf(static_cast<const uint16_t*>(a.dt_bias)[h]));
  const float alpha = expf(g);
  __syncthreads();

  float r = 0.f;
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) {
    sv[ii] *= alpha;
    r += sv[ii] * ks[i0 + ii];
  }
  rs[warp][lane] = r;
  __syncthreads();
  const float delta = beta * (vs[lane] - (rs[0][lane] + rs[1][lane] + rs[2][lane] + rs[3][lane]));
  float o = 0.f;
#pragma unroll
  for (int ii = 0; ii < 32; ++ii) {
    sv[ii] += ks[i0 + ii] * delta;
    o += sv[ii] * qs[i0 + ii];
    Sh[(i0 + ii) * kD + col] = sv[ii];
  }
  os[warp][lane] = o;
  __syncthreads();
  if (warp == 0)
    static_cast<uint16_t*>(a.o)[h * kD + col] = to_bf(os[0][lane] + os[1][lane] + os[2][lane] + os[3][lane]);
}

}  // namespace

Status gdn_step(const GdnArgs& a, Stream s) {
  if (a.dk != kD || a.dv != kD) return cu_err("gdn_step: head dims {}x{} unsupported (128x128 only)", a.dk, a.dv);
  if (a.nk <= 0 || a.nv % a.nk != 0) return cu_err("gdn_step: {} value heads not a multiple of {} key heads", a.nv, a.nk);
  if (a.K < 2 || a.K > 8) return cu_err("gdn_step: conv kernel {} unsupported", a.K);
  if (!a.ctl && a.pos < 0) return cu_err("gdn_step: no position");
  gdn_step_kernel<<<a.nv * (kD / kSlice), kThreads, 0, static_cast<cudaStream_t>(s)>>>(a);
  return launch_status("gdn_step");
}

}  // namespace lily::cuda
