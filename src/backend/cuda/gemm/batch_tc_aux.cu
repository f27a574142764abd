// The small kernels around the batched step's qgemm calls: the residual add + RMSNorm (+ MoE combine)
// that writes its output packed for qgemm (gemm/pack16.cuh), the combine alone, and the expert-major
// routing table. Every row is computed on its own (no cross-row arithmetic): batch invariant.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/moe/dec_topk.cuh"
#include "backend/cuda/gemm/pack16.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256;


// Σ_j tw[b][j]·yd[b·k + j][e] + tw[b][k]·yd[B·k + b][e], slot order then the shared expert. For k ≤ 8
// every load is issued before the first fma (an unrolled guard loop): the rolled loop waited on one L2
// round trip per entry, 9 in a row per element. Same fmas in the same order either way.
constexpr int kCombineUnroll = 8;
__device__ __forceinline__ float combine(const float* yd, const float* tw, int k, int H, int B, int b, int e) {
  const float* twb = tw + b * (k + 1);
  float m = 0.f;
  if (k <= kCombineUnroll) {
    float w[kCombineUnroll], y[kCombineUnroll];
#pragma unroll
    for (int j = 0; j < kCombineUnroll; ++j)
      if (j < k) w[j] = __ldcg(twb + j), y[j] = __ldcg(yd + size_t(b * k + j) * H + e);
    const float ws = __ldcg(twb + k), ys = __ldcg(yd + size_t(B * k + b) * H + e);
#pragma unroll
    for (int j = 0; j < kCombineUnroll; ++j)
      if (j < k) m = fmaf(w[j], y[j], m);
    return fmaf(ws, ys, m);
  }
  for (int j = 0; j < k; ++j) m = fmaf(__ldcg(twb + j), __ldcg(yd + size_t(b * k + j) * H + e), m);
  return fmaf(__ldcg(twb + k), __ldcg(yd + size_t(B * k + b) * H + e), m);
}

// A row's H values as S slices of n = H/S (S = bnorm_slices(H)), thread t holding elements t + 256u of a
// slice; a row per CS blocks (CS divides S; a cluster when CS > 1), block c owning the SPB = S/CS slices
// from c·SPB. The row's sum of squares has one order whatever CS: each slice's (a thread's values in u
// order, a warp butterfly, the warps in block_sum's order), then the slices in order (other blocks' through
// distributed shared memory), so every CS gives a row the same bits and CS can follow the row count: at 16
// rows a block a row left 116 of 132 SMs idle (H100: ~13 µs a launch, 80 a step), at 256 rows clusters of 8
// ran 2,048 blocks of one element a thread and two cluster barriers each.
template <int U, int SPB> __global__ void __launch_bounds__(kThreads) bnorm_pack_kernel(BNormArgs a, int S) {
  __shared__ float xn[kThreads * U * SPB];
  __shared__ float red[SPB][32];
  __shared__ float part[SPB];
  const int H = a.H, n = H / S, CS = S / SPB, b = blockIdx.x / CS, e0 = (blockIdx.x % CS) * SPB * n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint16_t* gain = static_cast<const uint16_t*>(a.gain);
  float g[SPB][U];
#pragma unroll
  for (int j = 0; j < SPB; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = threadIdx.x + u * kThreads;
      g[j][u] = e < n ? bf(__ldg(gain + e0 + j * n + e)) : 0.f;
    }
  pdl_wait();
  pdl_trigger();
  float v[SPB][U];
#pragma unroll
  for (int j = 0; j < SPB; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = e0 + j * n + threadIdx.x + u * kThreads;
      v[j][u] = 0.f;
      if (threadIdx.x + u * kThreads < n) {
        v[j][u] = __ldcg(a.in + size_t(b) * H + e);
        if (a.yd) v[j][u] += combine(a.yd, a.tw, a.top_k, H, a.B, b, e);
        else if (a.mix) v[j][u] += __ldcg(a.mix + size_t(b) * H + e);
      }
    }
  if (a.res_out) {
#pragma unroll
    for (int j = 0; j < SPB; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (threadIdx.x + u * kThreads < n) a.res_out[size_t(b) * H + e0 + j * n + threadIdx.x + u * kThreads] = v[j][u];
  }
#pragma unroll
  for (int j = 0; j < SPB; ++j) {
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) ss += v[j][u] * v[j][u];
    ss = warp_sum(ss);
    if (lane == 0) red[j][warp] = ss;
  }
  __syncthreads();
  float ss = 0.f;  // the block's slices (block_sum's second stage each), in slice order
#pragma unroll
  for (int j = 0; j < SPB; ++j) {
    const float pj = warp_sum(lane < kThreads / 32 ? red[j][lane] : 0.f);
    if (CS > 1 && threadIdx.x == 0) part[j] = pj;
    ss += pj;
  }
  namespace cg = cooperative_groups;
  if (CS > 1) {  // launch-uniform: every slice of the row, in order
    cg::this_cluster().sync();
    ss = 0.f;
    for (int r = 0; r < CS; ++r) {
      const float* pr = cg::this_cluster().map_shared_rank(part, r);
#pragma unroll
      for (int j = 0; j < SPB; ++j) ss += pr[j];
    }
  }
  const float inv = 1.0f / sqrtf(ss / float(H) + a.eps);
#pragma unroll
  for (int j = 0; j < SPB; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = threadIdx.x + u * kThreads;
      if (e < n) {
        const float y = v[j][u] * inv * g[j][u];
        xn[j * n + e] = y;
        if (a.n_out) a.n_out[size_t(b) * H + e0 + j * n + e] = y;
      }
    }
  __syncthreads();
  pack16_row(xn, SPB * n, a.X16 + size_t(b) * H + e0, a.XS + (size_t(b) * (H / 64) + e0 / 64) * 2,
             a.X16lo + size_t(b) * H + e0);
  if (CS > 1) cg::this_cluster().sync();  // no block leaves while another reads its shared memory
}

__global__ void bcombine_kernel(const float* yd, const float* tw, int k, int H, int B, float* out) {
  pdl_wait();
  pdl_trigger();
  const int b = blockIdx.x;
  for (int e = threadIdx.x; e < H; e += blockDim.x) out[size_t(b) * H + e] = combine(yd, tw, k, H, B, b, e);
}

// The router epilogue of one row by one warp (brouter_topk's arithmetic, warp_router_topk): ids and
// sid (shared memory) get the experts, wout the weights (renormalized when norm_topk) and σ(shared-gate
// logit).
__device__ void topk_row(const float* l, int E, int top_k, bool norm_topk, bool has_shared, float* p, int32_t* ids,
                         float* wout, int32_t* sid) {
  const int lane = threadIdx.x & 31;
  const WarpTopk r = warp_router_topk(l, E, top_k, p);
  if (lane < top_k) {
    ids[lane] = r.id, sid[lane] = r.id;
    wout[lane] = norm_topk ? r.p / r.tsum : r.p;
  }
  if (lane == 0 && has_shared) wout[top_k] = sigmoid(__ldcg(l + E));
}

struct RouteArgs {
  const int32_t* ids = nullptr;  // given ids, or (logits set) computed here into ids_out / w_out
  const float* logits = nullptr;
  int ld = 0;
  bool norm_topk = true, has_shared = true;
  bool shared_item = true;  // the shared expert as the table's last item (false: its width differs, run apart)
  int32_t* ids_out = nullptr;
  float* w_out = nullptr;
  int B = 0, k = 0, E = 0;
  int4* items = nullptr;
  int32_t *n_items = nullptr, *rowb = nullptr, *ent = nullptr;
};

// One block of 1024 threads: (optionally each warp a row's top-k, then) thread e counts expert e's
// entries, block scans give offsets and the rank among active experts, then each active expert lists
// its entries in (b, slot) order.
__global__ void __launch_bounds__(1024) broute_kernel(RouteArgs a) {
  // [B·k] ids (rounded to 4), [E][nw] row masks, [E] offsets, then (logits) 32 warps × E floats
  extern __shared__ int32_t sid[];
  __shared__ int wc[32], wa[32], wh[32];
  const int B = a.B, k = a.k, E = a.E, nw = (B + 31) / 32;
  const int n = B * k, e = threadIdx.x, lane = e & 31, warp = e >> 5;
  uint32_t* mask = reinterpret_cast<uint32_t*>(sid + ((n + 3) & ~3));
  int32_t* offs = reinterpret_cast<int32_t*>(mask + E * nw);
  for (int i = threadIdx.x; i < E * nw; i += blockDim.x) mask[i] = 0u;
  pdl_wait();
  pdl_trigger();
  if (a.logits) {
    float* p = reinterpret_cast<float*>(offs + E) + warp * E;
    for (int b = warp; b < B; b += int(blockDim.x >> 5))
      topk_row(a.logits + size_t(b) * a.ld, E, k, a.norm_topk, a.has_shared, p, a.ids_out + b * k,
               a.w_out + b * (k + 1), sid + b * k);
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) sid[i] = __ldcg(a.ids + i);
  }
  __syncthreads();
  // Expert e's rows as a bit mask (a row's k ids are distinct: one entry per (row, expert)).
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int b = i / k;
    atomicOr(&mask[sid[i] * nw + (b >> 5)], 1u << (b & 31));
  }
  __syncthreads();
  int c = 0;
  if (e < E)
    for (int w = 0; w < nw; ++w) c += __popc(mask[e * nw + w]);
  const int act = c > 0, ch = (c + 7) / 8;  // ch: the expert's 8-row chunks (batch_tc_stream.cu's units)
  int ic = c, ia = act, ih = ch;  // inclusive warp scans
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, ic, o), y = __shfl_up_sync(0xffffffffu, ia, o);
    const int z = __shfl_up_sync(0xffffffffu, ih, o);
    if (lane >= o) ic += x, ia += y, ih += z;
  }
  if (lane == 31) wc[warp] = ic, wa[warp] = ia, wh[warp] = ih;
  __syncthreads();
  int bc = 0, ba = 0, bh = 0, ta = 0, th = 0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) {
    if (w < warp) bc += wc[w], ba += wa[w], bh += wh[w];
    ta += wa[w], th += wh[w];
  }
  const int off = bc + ic - c, rank = ba + ia - act;
  if (e < E) offs[e] = off;
  if (act) a.items[rank] = make_int4(e, c, off, bh + ih - ch);
  if (threadIdx.x == 0) {
    if (a.shared_item) a.items[ta] = make_int4(E, B, n, th);
    a.n_items[0] = ta + (a.shared_item ? 1 : 0);
    a.n_items[1] = th + (a.shared_item ? (B + 7) / 8 : 0);
  }
  __syncthreads();
  // Entry i = (row b, expert x) goes to x's list at its row's rank among x's rows: (b, slot) order.
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int b = i / k, x = sid[i];
    const uint32_t* m = mask + x * nw;
    int r = __popc(m[b >> 5] & ((1u << (b & 31)) - 1u));
    for (int w = 0; w < (b >> 5); ++w) r += __popc(m[w]);
    a.rowb[offs[x] + r] = b, a.ent[offs[x] + r] = i;
  }
  for (int b = threadIdx.x; b < B; b += blockDim.x) a.rowb[n + b] = b, a.ent[n + b] = n + b;
}

Status route_launch(const RouteArgs& a, Stream s) {
  if (a.E < 1 || a.E > 1024 || a.k < 1 || a.k > 32 || a.k > a.E || a.B < 1)
    return cu_err("broute: E={} k={} B={} unsupported", a.E, a.k, a.B);
  size_t smem = size_t((a.B * a.k + 3) & ~3) * sizeof(int32_t) + size_t(a.E) * ((a.B + 31) / 32 + 1) * sizeof(int32_t);
  if (a.logits) smem += size_t(32) * a.E * sizeof(float);
  static size_t attr = 0;
  if (smem > 48 * 1024 && smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(broute_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  if (smem > 200 * 1024) return cu_err("broute: {} entries exceed shared memory", a.B * a.k);
  return launch_k("broute", broute_kernel, dim3(1), dim3(1024), smem, static_cast<cudaStream_t>(s), a);
}

// dst row r = src row idx[r], 32-bit words (one block per row).
__global__ void brow_gather_kernel(const uint32_t* src, int words, const int32_t* idx, uint32_t* dst) {
  pdl_wait();
  pdl_trigger();
  const uint32_t* in = src + size_t(idx[blockIdx.x]) * words;
  uint32_t* out = dst + size_t(blockIdx.x) * words;
  for (int i = threadIdx.x; i < words; i += blockDim.x) out[i] = in[i];
}

}  // namespace

// The slices of a row in bnorm_pack's sum of squares: the most of 8, 4, 2, 1 that split H into whole
// 64-groups.
int bnorm_slices(int H) {
  int s = 8;
  while (s > 1 && H % (64 * s) != 0) s /= 2;
  return s;
}

// Blocks a row: the fewest (of S, S/2, ..., 1) that still give half the SMs a block. CudaBatch.SmallOpsBench
// (H100, 2026-12-06, with the MoE combine, µs at 16 / 64 / 256 / 736 rows): 8 blocks a row 5.0 / 12.1 /
// 22.2 / 64.7, 2: 6.2 / 9.1 / 17.1 / 51.3, 1: 8.5 / 9.5 / 13.1 / 43.2.
static int bnorm_blocks(int H, int B) {
  int cs = bnorm_slices(H);
  while (cs > 1 && 2 * B * (cs / 2) >= sm_count()) cs /= 2;
  return cs;
}

template <int U, int SPB> static Status bnorm_launch(const BNormArgs& a, int S, int cs, cudaStream_t st) {
  return launch_kc("bnorm_pack", bnorm_pack_kernel<U, SPB>, dim3(a.B * cs), dim3(kThreads), 0, st, cs > 1 ? cs : 0, a, S);
}
template <int U> static Status bnorm_spb(const BNormArgs& a, int S, int cs, cudaStream_t st) {
  const int spb = S / cs;
  if (spb == 1) return bnorm_launch<U, 1>(a, S, cs, st);
  if constexpr (U <= 8) if (spb == 2) return bnorm_launch<U, 2>(a, S, cs, st);  // U·SPB ≤ 16: H ≤ 4096
  if constexpr (U <= 4) if (spb == 4) return bnorm_launch<U, 4>(a, S, cs, st);
  if constexpr (U <= 2) if (spb == 8) return bnorm_launch<U, 8>(a, S, cs, st);
  return cu_err("bnorm_pack: {} slices of {} a block unsupported", spb, a.H / S);
}

Status bnorm_pack(const BNormArgs& a, Stream s) {
  if (a.H <= 0 || a.H % 64 != 0 || a.H > 16 * kThreads) return cu_err("bnorm_pack: H={} unsupported", a.H);
  if (!a.X16 || !a.X16lo || !a.XS || a.B < 1 || (a.yd && (!a.tw || a.top_k < 1)))
    return cu_err("bnorm_pack: bad arguments");
  const int S = bnorm_slices(a.H), n = a.H / S;
  const int cs = a.blocks ? a.blocks : bnorm_blocks(a.H, a.B);
  if (cs < 1 || S % cs != 0) return cu_err("bnorm_pack: {} blocks a row do not divide its {} slices", cs, S);
  const auto st = static_cast<cudaStream_t>(s);
  if (n <= kThreads) return bnorm_spb<1>(a, S, cs, st);
  if (n <= 2 * kThreads) return bnorm_spb<2>(a, S, cs, st);
  if (n <= 4 * kThreads) return bnorm_spb<4>(a, S, cs, st);
  if (n <= 8 * kThreads) return bnorm_spb<8>(a, S, cs, st);
  return bnorm_spb<16>(a, S, cs, st);
}

Status bmoe_combine(const float* yd, const float* tw, int top_k, int H, int B, float* out, Stream s) {
  return launch_k("bmoe_combine", bcombine_kernel, dim3(B), dim3(kThreads), 0, static_cast<cudaStream_t>(s), yd, tw,
                  top_k, H, B, out);
}

Status broute(const int32_t* ids, int B, int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb,
              int32_t* ent, bool shared_item, Stream s) {
  RouteArgs a;
  a.ids = ids, a.B = B, a.k = top_k, a.E = E, a.items = reinterpret_cast<int4*>(items), a.n_items = n_items;
  a.rowb = rowb, a.ent = ent, a.shared_item = shared_item;
  return route_launch(a, s);
}

Status broute_topk(const float* logits, int ld, bool norm_topk, bool has_shared, int32_t* ids, float* w, int B,
                   int top_k, int E, int32_t* items, int32_t* n_items, int32_t* rowb, int32_t* ent, bool shared_item,
                   Stream s) {
  RouteArgs a;
  a.logits = logits, a.ld = ld, a.norm_topk = norm_topk, a.has_shared = has_shared, a.ids_out = ids, a.w_out = w;
  a.B = B, a.k = top_k, a.E = E, a.items = reinterpret_cast<int4*>(items), a.n_items = n_items, a.rowb = rowb, a.ent = ent;
  a.shared_item = shared_item;
  return route_launch(a, s);
}

Status brow_gather(const void* src, size_t row_bytes, const int32_t* idx, int n, void* dst, Stream s) {
  if (n <= 0) return Status::ok();
  if (row_bytes % 4 != 0) return cu_err("brow_gather: rows of {} bytes (a multiple of 4 needed)", row_bytes);
  return launch_k("brow_gather", brow_gather_kernel, dim3(n), dim3(kThreads), 0, static_cast<cudaStream_t>(s),
                  static_cast<const uint32_t*>(src), int(row_bytes / 4), idx, static_cast<uint32_t*>(dst));
}

}  // namespace lily::cuda
