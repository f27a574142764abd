// Batched GDN decode step, each sequence with its own state through pointer tables, with the fused
// gated RMSNorm (gdn.cu's arithmetic, fp32 window). The arithmetic per row is gdn.cu's, so rows match
// the batch-1 step. The batched attention decode, once in the same file, is attention/batch_attn.cu.
#include <algorithm>

#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/mma_sync.cuh"
#include "backend/cuda/deltanet/delta_rule.cuh"

namespace lily::cuda {
namespace {

// Two kernels. bgdn_prep: per row and head, the short convolution, SiLU, the q/k L2 norms and the
// gates (gdn.cu's arithmetic), and the conv window's shift; into a scratch row [qn | kn | v | {α, β}].
// bgdn_state: the recurrence, persistent blocks (two an SM) walking (row, value head) items, each head's
// fp16 state (dk × dv) streamed through a ring of shared-memory stages by cp.async so the next items'
// states load while this one is computed; thread (kq, col) owns rows 32kq..32kq+31 of column col (the
// partition and summation order of gdn.cu's kernel, so rows match the batch-1 step bit for bit).
// Before (H200, 2026-12-04, one kernel of 4-block clusters per 32-column slice): 18.85 ms of the
// 256-row step, 1.7 TB/s of state traffic (fp32). H100, 2026-12-06, 256 rows at context 256: fp32 state, one
// block an SM: 13.1 ms (2.46 TB/s); fp16 state, two blocks an SM: 7.5 ms (the step 37.93 vs 43.79 ms;
// fp16 with one block an SM: 42.19).
constexpr int kMaxDk = 256, kMaxDv = 256;

__device__ __forceinline__ float softplus(float v) { return v > 20.f ? v : log1pf(expf(v)); }

struct GdnDims {
  int dk, dv, nk, nv, kd, vd, C;
  __device__ GdnDims(const BGdnArgs& a)
      : dk(a.dk), dv(a.dv), nk(a.nk), nv(a.nv), kd(a.nk * a.dk), vd(a.nv * a.dv), C(2 * a.nk * a.dk + a.nv * a.dv) {}
};

// grid (nk + nv, B), max(dk, dv) threads: blocks < nk are key heads (q and k channels), the rest value
// heads (v channels, and the gates by thread 0).
__global__ void __launch_bounds__(kMaxDk) bgdn_prep_kernel(BGdnArgs a) {
  __shared__ float red[32];
  const GdnDims d(a);
  const int t = threadIdx.x, row = blockIdx.y, K = a.K;
  const bool key = int(blockIdx.x) < d.nk;
  const int head = key ? blockIdx.x : blockIdx.x - d.nk;
  const int n = key ? d.dk : d.dv;
  const int pos = a.pos[row], par = pos & 1;
  const uint16_t* w = static_cast<const uint16_t*>(a.conv_w);
  float* win = static_cast<float*>(a.conv[row]);
  auto conv_old = [&](int ch) {
    const float* src = win + (size_t(par) * d.C + ch) * (K - 1);
    float acc = 0.f;
    for (int tt = 0; tt < K - 1; ++tt) acc += bf(w[ch * K + tt]) * src[tt];
    return acc;
  };
  auto conv = [&](int ch, float uc, float acc) {
    acc += bf(w[ch * K + K - 1]) * uc;
    const float* src = win + (size_t(par) * d.C + ch) * (K - 1);
    float* dst = win + (size_t(par ^ 1) * d.C + ch) * (K - 1);
    for (int tt = 0; tt < K - 2; ++tt) dst[tt] = src[tt + 1];
    dst[K - 2] = uc;
    return silu(acc);
  };
  const bool on = t < n;
  const int ch0 = key ? head * d.dk + t : 2 * d.kd + head * d.dv + t, ch1 = d.kd + head * d.dk + t;
  const float old0 = on ? conv_old(ch0) : 0.f, old1 = on && key ? conv_old(ch1) : 0.f;
  pdl_wait();
  pdl_trigger();
  const float* u = a.u + size_t(row) * a.ldu;
  float* out = a.prep + size_t(row) * bgdn_prep_floats(a.nk, a.nv, a.dk, a.dv);
  if (key) {
    const float qv = on ? conv(ch0, u[ch0], old0) : 0.f;
    const float kv = on ? conv(ch1, u[ch1], old1) : 0.f;
    const float sq = block_sum(qv * qv, red);
    const float sk = block_sum(kv * kv, red);
    if (on) {
      out[head * d.dk + t] = qv * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(float(d.dk)));
      out[d.kd + head * d.dk + t] = kv * (1.0f / sqrtf(sk + 1e-6f));
    }
  } else {
    if (on) out[2 * d.kd + head * d.dv + t] = conv(ch0, u[ch0], old0);
    if (t == 0) {
      const float a_h = u[d.C + d.vd + head], b_h = u[d.C + d.vd + d.nv + head];
      const float A = a.A_log[head], dtb = bf(static_cast<const uint16_t*>(a.dt_bias)[head]);
      const float beta = sigmoid(b_h);
      const float g = -expf(A) * softplus(a_h + dtb);
      reinterpret_cast<float2*>(out + 2 * d.kd + d.vd)[head] = make_float2(expf(g), beta);
    }
  }
}

// One item's shared-memory stage: the fp16 state [dk][dv], then qn [dk], kn [dk], v [dv] fp32.
__host__ __device__ constexpr size_t gdn_stage_bytes(int dk, int dv) { return size_t(dk) * dv * 2 + (2 * size_t(dk) + size_t(dv)) * 4; }
constexpr int kGdnSmemBudget = 210 * 1024;
__host__ __device__ constexpr int gdn_stages(int dk, int dv) {
  return int(kGdnSmemBudget / gdn_stage_bytes(dk, dv)) > 3 ? 3 : int(kGdnSmemBudget / gdn_stage_bytes(dk, dv));
}


// Persistent: grid ≤ blocks an SM × SMs, (dk / 32) · dv threads; items (row, value head) = blockIdx.x + j·gridDim.x.
template <int NS> __global__ void __launch_bounds__(1024) bgdn_state_kernel(BGdnArgs a) {
  using ST = __half;
  extern __shared__ __align__(16) unsigned char gsm[];
  __shared__ float part[kMaxDk / 32][kMaxDv], ssw[kMaxDv / 32];
  const GdnDims d(a);
  const int tid = threadIdx.x, nt = blockDim.x, col = tid % d.dv, kq = tid / d.dv, lane = tid & 31, warp = tid >> 5;
  const int nkq = d.dk / 32, ratio = d.nv / d.nk, n_items = a.B * d.nv;
  const size_t stage = gdn_stage_bytes(d.dk, d.dv), pf = bgdn_prep_floats(a.nk, a.nv, a.dk, a.dv);
  const int s16 = d.dk * d.dv * 2 / 16, v16 = (2 * d.dk + d.dv) / 4;  // 16-byte chunks: state, vectors
  const uint32_t sm0 = uint32_t(__cvta_generic_to_shared(gsm));
  auto load = [&](int item, int slot, bool state, bool vecs) {
    if (item >= n_items) return;
    const int row = item / d.nv, h = item % d.nv, kh = h / ratio;
    const uint32_t st = sm0 + uint32_t(slot * stage);
    if (state) {
      const char* S = reinterpret_cast<const char*>(reinterpret_cast<const ST*>(a.S[row]) + size_t(h) * d.dk * d.dv);
      for (int c = tid; c < s16; c += nt) cp16(st + c * 16, S + 16 * c, true);
    }
    if (vecs && tid < v16) {
      const float* p = a.prep + size_t(row) * pf;
      const int dk4 = d.dk / 4;
      const float* src = tid < dk4 ? p + kh * d.dk + 4 * tid
                         : tid < 2 * dk4 ? p + d.kd + kh * d.dk + 4 * (tid - dk4)
                                         : p + 2 * d.kd + h * d.dv + 4 * (tid - 2 * dk4);
      cp16(st + uint32_t(s16) * 16 + tid * 16, src, true);
    }
  };
  const int first = blockIdx.x, step = gridDim.x;
  // Prologue: the first items' states (this kernel alone writes them), then, after the prep kernel,
  // their vectors.
  for (int s = 0; s < NS - 1; ++s) load(first + s * step, s, true, false);
  pdl_wait();
  pdl_trigger();
  for (int s = 0; s < NS - 1; ++s) {
    load(first + s * step, s, false, true);
    cp_commit();
  }
  const float gg = bf(static_cast<const uint16_t*>(a.gnorm)[col]);
  for (int it = 0, item = first; item < n_items; ++it, item += step) {
    const int row = item / d.nv, h = item % d.nv;
    // Early loads of what the tail needs: the gates and z.
    const float2 ab = reinterpret_cast<const float2*>(a.prep + size_t(row) * pf + 2 * d.kd + d.vd)[h];
    const float zz = kq == 0 ? a.u[size_t(row) * a.ldu + d.C + h * d.dv + col] : 0.f;
    cp_wait<NS - 2>();
    __syncthreads();
    load(item + (NS - 1) * step, (it + NS - 1) % NS, true, true);
    cp_commit();
    const ST* st = reinterpret_cast<const ST*>(gsm + size_t(it % NS) * stage);
    const float *qs = reinterpret_cast<const float*>(st + d.dk * d.dv), *ks = qs + d.dk, *vs = ks + d.dk;
    const int i0 = 32 * kq;
    float sv[32];
#pragma unroll
    for (int ii = 0; ii < 32; ++ii) sv[ii] = ld_state(st + (i0 + ii) * d.dv + col);
    const float alpha = ab.x, beta = ab.y;
    part[kq][col] = delta_decay_dot(sv, ks + i0, alpha);
    __syncthreads();
    float rsum = 0.f;
    for (int ww = 0; ww < nkq; ++ww) rsum += part[ww][col];
    const float delta = beta * (vs[col] - rsum);
    ST* Sg = reinterpret_cast<ST*>(a.S[row]) + size_t(h) * d.dk * d.dv;
    const float o = delta_update_read(sv, ks + i0, qs + i0, delta, Sg + size_t(i0) * d.dv + col, d.dv);
    __syncthreads();  // every rsum read before part is reused
    part[kq][col] = o;
    __syncthreads();
    float osum = 0.f;
    if (kq == 0) {
      for (int ww = 0; ww < nkq; ++ww) osum += part[ww][col];
      const float s2 = warp_sum(osum * osum);
      if (lane == 0) ssw[warp] = s2;
    }
    __syncthreads();
    if (kq == 0) {
      float tot = 0.f;
      for (int sl = 0; sl < d.dv / 32; ++sl) tot += ssw[sl];
      const float inv = 1.0f / sqrtf(tot / float(d.dv) + a.eps);
      a.og[size_t(row) * a.ldo + h * d.dv + col] = gg * osum * inv * silu(zz);
    }
  }
  cp_wait<0>();
}

template <int NS> Status launch_state(const BGdnArgs& a, cudaStream_t s) {
  const size_t smem = size_t(NS) * gdn_stage_bytes(a.dk, a.dv);
  const int threads = a.dk / 32 * a.dv;
  // As many blocks as fit on an SM (two at dk = dv = 128): a block computes one item at a time, latency-bound
  // between its syncs and stores. One per instantiation.
  static size_t set = 0;
  static int per_sm = 1;
  if (smem != set) {
    LILY_CU_TRY(cudaFuncSetAttribute(bgdn_state_kernel<NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bgdn_state_kernel<NS>, threads, smem));
    per_sm = std::max(per_sm, 1);
    set = smem;
  }
  const int items = a.B * a.nv, slots = per_sm * sm_count(), grid = items < slots ? items : slots;
  return launch_k("bgdn_state", bgdn_state_kernel<NS>, dim3(grid), dim3(threads), smem, s, a);
}
Status launch_state(const BGdnArgs& a, cudaStream_t s) {
  return gdn_stages(a.dk, a.dv) >= 3 ? launch_state<3>(a, s) : launch_state<2>(a, s);
}

}  // namespace

Status bgdn_step(const BGdnArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.dk % 32 != 0 || a.dk <= 0 || a.dk > kMaxDk || a.dv % 32 != 0 || a.dv <= 0 || a.dv > kMaxDv ||
      a.dk / 32 * a.dv > 1024 || gdn_stages(a.dk, a.dv) < 2)
    return cu_err("bgdn_step: head dims {}x{} unsupported", a.dk, a.dv);
  if (a.nk <= 0 || a.nv % a.nk != 0) return cu_err("bgdn_step: {} value heads not a multiple of {} key heads", a.nv, a.nk);
  if (a.K < 2 || a.K > 8) return cu_err("bgdn_step: conv kernel {} unsupported", a.K);
  if (!a.prep) return cu_err("bgdn_step: no prep scratch (bgdn_prep_floats per row)");
  if (a.B <= 0) return Status::ok();
  LILY_TRY(launch_k("bgdn_prep", bgdn_prep_kernel, dim3(a.nk + a.nv, a.B), dim3(std::max(a.dk, a.dv)), 0, s, a));
  return launch_state(a, s);
}

}  // namespace lily::cuda
