// MoE decode in two kernels, expert ids read on the device: (1) gate+up+SwiGLU for the top-k
// routed experts and the shared expert as one extra slot; (2) down for all slots + the
// score-weighted sum + the sigmoid-gated shared expert, writing the FFN branch output.
#include "backend/cuda/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256, kWarps = 8;

template <int CPL> __global__ void __launch_bounds__(kThreads) gate_up_kernel(MoeArgs a) {
  extern __shared__ float sm[];
  const int H = a.H, I = a.I, nch = H / 32;
  float* xs = sm;
  float* xcs = xs + nch * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = blockIdx.y, r = blockIdx.x * kWarps + warp;
  const QW* wg;
  const QW* wu;
  int rg, ru;
  if (slot < a.top_k) {
    const int e = a.topk_ids[slot];
    wg = &a.gate, wu = &a.up, rg = e * I + r, ru = e * I + r;
  } else {
    wg = &a.sh_gate_up, wu = &a.sh_gate_up, rg = r, ru = I + r;
  }
  uint4 g[CPL], u[CPL];
  uint32_t sg[CPL], su[CPL];
#pragma unroll
  for (int i = 0; i < CPL; ++i) {
    const int c = lane + 32 * i;
    if (r < I && c < nch) {
      g[i] = load_chunk(*wg, rg, c, nch), sg[i] = load_sb<4>(*wg, rg, c);
      u[i] = load_chunk(*wu, ru, c, nch), su[i] = load_sb<4>(*wu, ru, c);
    }
  }
  stage_plain<4>(static_cast<const uint16_t*>(a.x), H, xs, xcs);
  __syncthreads();
  if (r >= I) return;
  float ag = 0.f, au = 0.f;
#pragma unroll
  for (int i = 0; i < CPL; ++i) {
    const int c = lane + 32 * i;
    if (c < nch) {
      ag += chunk_term<4>(g[i], sg[i], xs, xcs, c);
      au += chunk_term<4>(u[i], su[i], xs, xcs, c);
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) static_cast<uint16_t*>(a.act)[slot * I + r] = to_bf(silu(rbf(ag)) * rbf(au));
}

// CH = chunks per down row (I/32); a warp covers 32/CH slots per pass.
template <int CH> __global__ void __launch_bounds__(kThreads) down_kernel(MoeArgs a) {
  extern __shared__ float sm[];
  constexpr int SPP = 32 / CH, kMaxSlots = 9, P = (kMaxSlots + SPP - 1) / SPP;
  const int H = a.H, I = a.I, NS = a.top_k + 1;
  float* xs = sm;
  float* xcs = xs + NS * CH * Chunk<4>::kStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * kWarps + warp, sub = lane / CH, j = lane % CH;
  uint4 w[P];
  uint32_t sb[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int slot = p * SPP + sub;
    w[p] = make_uint4(0, 0, 0, 0), sb[p] = 0;
    if (slot < NS && row < H) {
      if (slot < a.top_k) {
        const int e = a.topk_ids[slot];
        w[p] = load_chunk(a.down, e * H + row, j, CH), sb[p] = load_sb<4>(a.down, e * H + row, j);
      } else {
        w[p] = load_chunk(a.sh_down, row, j, CH), sb[p] = load_sb<4>(a.sh_down, row, j);
      }
    }
  }
  stage_plain<4>(static_cast<const uint16_t*>(a.act), NS * I, xs, xcs);
  __syncthreads();
  if (row >= H) return;
  float routed = 0.f, shared = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int slot = p * SPP + sub;
    float y = slot < NS ? chunk_term<4>(w[p], sb[p], xs, xcs, slot * CH + j) : 0.f;
#pragma unroll
    for (int o = CH / 2; o > 0; o >>= 1) y += __shfl_xor_sync(0xffffffffu, y, o);
    float rc = 0.f, sc = 0.f;
    if (j == 0 && slot < NS) {
      if (slot < a.top_k)
        rc = a.topk_w[slot] * rbf(y);
      else
        sc = a.topk_w[a.top_k] * rbf(y);
    }
    routed += warp_sum(rc);
    shared += warp_sum(sc);
  }
  if (lane == 0) static_cast<uint16_t*>(a.out)[row] = to_bf(routed + shared);
}

}  // namespace

Status moe_gate_up(const MoeArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.H % 256 != 0 || a.H > 4096) return cu_err("moe_gate_up: H={} unsupported", a.H);
  if (a.sh_gate_up.rows != 2 * a.I) return cu_err("moe_gate_up: shared expert width must equal I={}", a.I);
  if (a.top_k < 1 || a.top_k > 8) return cu_err("moe_gate_up: top_k={} unsupported (1..8)", a.top_k);
  const int nch = a.H / 32, cpl = (nch + 31) / 32;
  const size_t smem = size_t(nch * Chunk<4>::kStride + nch) * sizeof(float);
  dim3 grid((a.I + kWarps - 1) / kWarps, a.top_k + 1);
  if (cpl == 1)
    gate_up_kernel<1><<<grid, kThreads, smem, s>>>(a);
  else if (cpl == 2)
    gate_up_kernel<2><<<grid, kThreads, smem, s>>>(a);
  else
    gate_up_kernel<4><<<grid, kThreads, smem, s>>>(a);
  return launch_status("moe_gate_up");
}

Status moe_down_combine(const MoeArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.top_k < 1 || a.top_k > 8) return cu_err("moe_down_combine: top_k={} unsupported (1..8)", a.top_k);
  if (a.sh_down.cols != a.I) return cu_err("moe_down_combine: shared expert width must equal I={}", a.I);
  const int CH = a.I / 32, NS = a.top_k + 1;
  const size_t smem = size_t(NS * CH * Chunk<4>::kStride + NS * CH) * sizeof(float);
  const int grid = (a.H + kWarps - 1) / kWarps;
  switch (CH) {
    case 8: down_kernel<8><<<grid, kThreads, smem, s>>>(a); break;
    case 16: down_kernel<16><<<grid, kThreads, smem, s>>>(a); break;
    case 32: down_kernel<32><<<grid, kThreads, smem, s>>>(a); break;
    default: return cu_err("moe_down_combine: I={} unsupported (256, 512 or 1024)", a.I);
  }
  return launch_status("moe_down_combine");
}

}  // namespace lily::cuda
