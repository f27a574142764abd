// MoE routing for prefill, all on the device: per-token softmax + top-k over the router logits
// (ties → lowest id, renormalized, shared-expert gate as sigmoid), a counting sort of the
// (token, k) pairs into expert-major slots with 64-row GEMM tiles, or 128- and 64-row ones (RouteArgs::wide;
// capacity ceil(S/64) + min(E, S) either way, so no host readback), and the combine of the routed outputs
// with the shared expert.
#include <cfloat>
#include <climits>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/moe/dec_topk.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

// One warp per token. p: dynamic smem [warps][E].
__global__ void topk_kernel(RouteArgs a, int32_t* counts) {
  extern __shared__ float psm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, E = a.E, k = a.top_k;
  const int m = blockIdx.x * (blockDim.x >> 5) + warp;
  if (m >= a.M) return;
  float* p = psm + warp * E;
  const float* l = a.logits + size_t(m) * (E + 1);
  const WarpTopk r = warp_router_topk(l, E, k, p);
  if (lane < k) {
    a.topk_ids[size_t(m) * k + lane] = r.id;
    a.topk_w[size_t(m) * (k + 1) + lane] = a.norm_topk ? r.p / r.tsum : r.p;
    atomicAdd(&counts[r.id], 1);
  }
  if (lane == 0) a.topk_w[size_t(m) * (k + 1) + k] = sigmoid(l[E]);
}

// One block: offsets (exclusive scan of counts), tile list, fill counters reset.
__global__ void scan_tiles_kernel(RouteArgs a, int32_t* counts, int32_t* offs, int32_t* fill) {
  __shared__ int tile_off[1025], cnt[1024], off_s[1024];
  __shared__ int total_tiles;
  const int E = a.E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = counts[e];
  __syncthreads();
  // An expert's tiles: kGemmBM rows each, or (wide) 2·kGemmBM rows each with a last one of ≤ kGemmBM rows
  // in the narrow class: never more tiles than the narrow count, so moe_max_tiles holds either way.
  const int big = a.wide ? 2 * kGemmBM : kGemmBM;
  auto n_tiles = [&](int c) { return (c + big - 1) / big; };
  if (threadIdx.x == 0) {
    int o = 0, to = 0;
    for (int e = 0; e < E; ++e) {
      off_s[e] = o;
      tile_off[e] = to;
      o += cnt[e];
      to += n_tiles(cnt[e]);
    }
    total_tiles = to;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    fill[e] = 0;
    offs[e] = off_s[e];
    const int c = cnt[e], o = off_s[e], nt = n_tiles(c);
    for (int i = 0; i < nt; ++i) {
      const int m0 = o + i * big, m1 = min(o + (i + 1) * big, o + c);
      const int4 tl = make_int4(e, m0, m1, a.wide && m1 - m0 > kGemmBM ? 1 : 0);
      reinterpret_cast<int4*>(a.tiles)[tile_off[e] + i] = tl;
    }
  }
  for (int i = total_tiles + threadIdx.x; i < a.max_tiles; i += blockDim.x)
    reinterpret_cast<int4*>(a.tiles)[i] = make_int4(0, 0, 0, 0);
}

__global__ void scatter_kernel(RouteArgs a, const int32_t* offs, int32_t* fill) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.M * a.top_k) return;
  const int e = a.topk_ids[i];
  const int slot = offs[e] + atomicAdd(&fill[e], 1);
  a.slot_tok[slot] = i / a.top_k;
  a.slot_of[i] = slot;
}

__global__ void combine_kernel(const float* yd, const float* ys, const int32_t* slot_of, const float* w, int H, int k,
                               float* out) {
  const int m = blockIdx.x;
  __shared__ int slots[8];
  __shared__ float ws[9];
  if (threadIdx.x < k) slots[threadIdx.x] = slot_of[size_t(m) * k + threadIdx.x];
  if (threadIdx.x <= k) ws[threadIdx.x] = w[size_t(m) * (k + 1) + threadIdx.x];
  __syncthreads();
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += ws[j] * yd[size_t(slots[j]) * H + c];
    out[size_t(m) * H + c] = acc + ws[k] * ys[size_t(m) * H + c];
  }
}

}  // namespace

int moe_route_scratch_ints(int E) { return 3 * E; }

Status moe_route(const RouteArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.E <= 0 || a.E > 1024 || a.top_k < 1 || a.top_k > 8 || a.top_k > a.E) return cu_err("pf::moe_route: E={} top_k={} unsupported", a.E, a.top_k);
  if (a.M <= 0) return Status::ok();
  if (a.max_tiles < moe_max_tiles(a.M, a.E, a.top_k)) return cu_err("pf::moe_route: tile capacity {} too small", a.max_tiles);
  int32_t* counts = a.scratch;
  int32_t* offs = a.scratch + a.E;
  int32_t* fill = a.scratch + 2 * a.E;
  LILY_CU_TRY(cudaMemsetAsync(counts, 0, size_t(a.E) * 4, s));
  const int warps = 8;
  topk_kernel<<<(a.M + warps - 1) / warps, warps * 32, size_t(warps) * a.E * sizeof(float), s>>>(a, counts);
  LILY_TRY(launch_status("pf::moe_topk"));
  scan_tiles_kernel<<<1, 256, 0, s>>>(a, counts, offs, fill);
  LILY_TRY(launch_status("pf::moe_scan"));
  const int n = a.M * a.top_k;
  scatter_kernel<<<(n + 255) / 256, 256, 0, s>>>(a, offs, fill);
  return launch_status("pf::moe_scatter");
}

Status moe_combine(const float* yd, const float* ys, const int32_t* slot_of, const float* topk_w, int M, int H,
                   int top_k, float* out, Stream s) {
  if (top_k > 8) return cu_err("pf::moe_combine: top_k {} > 8", top_k);
  if (M <= 0) return Status::ok();
  combine_kernel<<<M, 256, 0, static_cast<cudaStream_t>(s)>>>(yd, ys, slot_of, topk_w, H, top_k, out);
  return launch_status("pf::moe_combine");
}

}  // namespace lily::cuda::pf
