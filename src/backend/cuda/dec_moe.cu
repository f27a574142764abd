// The MoE block of a decode step as one persistent kernel (grid = resident blocks, two device-wide
// barriers instead of two kernel boundaries): add+RMSNorm → router logits + shared expert gate/up
// | barrier | top-k in every block → routed gate/up+SwiGLU, with the down rows already loading |
// barrier | down + combine. Same arithmetic order as the router GEMV + moe_gate_up + moe_down.
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/dec_topk.cuh"

namespace lily::cuda {
namespace {

constexpr int kT = kTopkThreads, kW = kTopkWarps;  // 256 threads: block_router_topk's block
constexpr int kUx = 8;                             // x elements per thread: H ≤ 2048
constexpr int kMaxItems = 288;                     // down chunks per row (P ≤ 9 per lane)

// Device-wide barrier over all blocks of the grid (all resident): arrival count + generation
// (the CUTLASS-style release/acquire pattern, no full fences). Thread 0 of each block reads the
// generation g0 once after the PDL wait; barrier i waits for g0 + i. The last block to arrive resets
// the count and releases the next generation. One object per device: fused launches are ordered
// by the stream, and each passes its PDL wait (its predecessor, and so the previous fused launch,
// complete) before it reads the generation.
struct GridBar {
  unsigned count, gen;
};
__device__ GridBar g_bar;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void grid_sync(GridBar* b, unsigned target, bool wait = true) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(&b->count) : "memory");
    if (old == gridDim.x - 1) {
      asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(&b->count) : "memory");
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&b->gen) : "memory");
    } else if (wait) {
      while (int(ld_acquire(&b->gen) - target) < 0) {
      }
    }
  }
  __syncthreads();
}

// x value e into the padded chunk layout of BITS-bit codes, and its chunk sum (the GEMV's put_x).
template <int BITS> __device__ __forceinline__ void put(int e, float x, float* xs, float* xcs) {
  constexpr int CC = Chunk<BITS>::kCodes;
  xs[xs_index<BITS>(e)] = x;
  float s = x;
#pragma unroll
  for (int o = CC / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) % CC == 0) xcs[e / CC] = s;
}

struct Smem {  // float offsets into the dynamic shared memory
  int xcs4, xs8, xcs8, acs, red, sc, ids, tw, total;
  __host__ __device__ Smem(int H, int n_items) {
    const int nch4 = H / 32, nch8 = H / 16;
    xcs4 = nch4 * Chunk<4>::kStride, xs8 = (xcs4 + nch4 + 3) & ~3, xcs8 = xs8 + nch8 * Chunk<8>::kStride;  // float4 reads
    acs = n_items * Chunk<4>::kStride;  // phase 3 reuses the x region for act
    const int region = xcs8 + nch8 > acs + n_items ? xcs8 + nch8 : acs + n_items;
    red = region, sc = red + 32, ids = sc + kTopkScratch, tw = ids + 16, total = tw + 17;
  }
};

// Warp gw of NW: phase 1 takes shared row gw (gw < Is) or router row gw − Is (< E + 1); phase 2
// routed (slot, row) pairs q = gw, gw + NW, ... (q = slot·I + row, also act's index); phase 3 output
// rows gw, gw + NW, ... P: down chunks per lane (n_items ≤ 32·P).
template <int P, int MINB> __global__ void __launch_bounds__(kT, MINB) moe_fused_kernel(MoeFusedArgs a, int trig, int dbg) {
  extern __shared__ float sm[];
  const MoeArgs& m = a.m;
  const int H = m.H, I = m.I, Is = m.Is, k = m.top_k, E = m.n_experts;
  const int nch4 = H / 32, nch8 = H / 16, CHr = I / 32, CHs = Is / 32, n_items = k * CHr + CHs;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int gw = blockIdx.x * kW + warp, NW = gridDim.x * kW;
  constexpr int S8 = Chunk<8>::kStride;
  const Smem L(H, n_items);
  float *xs4 = sm, *xcs4 = sm + L.xcs4, *xs8 = sm + L.xs8, *xcs8 = sm + L.xcs8;
  float *as = sm, *acs = sm + L.acs, *red = sm + L.red, *sc = sm + L.sc;
  int* ids = reinterpret_cast<int*>(sm + L.ids);
  float* tw = sm + L.tw;

  // ---- before the wait: weights only (norm gain, this warp's shared-expert or router row)
  float gn[kUx];
#pragma unroll
  for (int u = 0; u < kUx; ++u) {
    const int e = t + u * kT;
    gn[u] = e < H ? bf(__ldg(static_cast<const uint16_t*>(a.gain) + e)) : 0.f;
  }
  const bool p1_sh = gw < Is, p1_rt = !p1_sh && gw < Is + E + 1;
  uint4 w1[4];
  uint32_t s1[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w1[i] = make_uint4(0, 0, 0, 0), s1[i] = 0;
  if (p1_sh) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = lane + 32 * i;
      if (c < nch4) {
        w1[i] = load_chunk(m.sh_gate_up, gw, c, nch4), s1[i] = load_sb<4>(m.sh_gate_up, gw, c);
        w1[2 + i] = load_chunk(m.sh_gate_up, Is + gw, c, nch4), s1[2 + i] = load_sb<4>(m.sh_gate_up, Is + gw, c);
      }
    }
  } else if (p1_rt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = lane + 32 * i;
      if (c < nch8) w1[i] = load_chunk(a.router, gw - Is, c, nch8), s1[i] = load_sb<8>(a.router, gw - Is, c);
    }
  }
  pdl_wait();
  const unsigned g0 = threadIdx.x == 0 ? ld_relaxed(&g_bar.gen) : 0u;  // generation before barrier 1

  // ---- r = in + mix, x = rms(r)·gain (the GEMV's kAddNorm staging order), into both layouts
  {
    float v[kUx];
#pragma unroll
    for (int u = 0; u < kUx; ++u) {
      const int e = t + u * kT;
      v[u] = e < H ? __ldcg(a.in + e) : 0.f;
    }
    if (a.mix) {
#pragma unroll
      for (int u = 0; u < kUx; ++u) {
        const int e = t + u * kT;
        if (e < H) v[u] += __ldcg(a.mix + e);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kUx; ++u) ss += v[u] * v[u];
    if (blockIdx.x == 0 && a.res_out) {
#pragma unroll
      for (int u = 0; u < kUx; ++u)
        if (t + u * kT < H) a.res_out[t + u * kT] = v[u];
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(H) + a.eps);
    float* n_out = blockIdx.x == 0 ? a.n_out : nullptr;
#pragma unroll
    for (int u = 0; u < kUx; ++u) {
      const int e = t + u * kT;
      if (e - lane < H) {  // warp-uniform (H a multiple of 64)
        const float x = v[u] * inv * gn[u];
        if (n_out) n_out[e] = x;
        put<4>(e, x, xs4, xcs4);
        put<8>(e, x, xs8, xcs8);
      }
    }
  }
  __syncthreads();

  // ---- phase 1: shared expert act, router logits
  if (p1_sh) {
    float ag = 0.f, au = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = lane + 32 * i;
      if (c < nch4) {
        ag += chunk_term<4>(w1[i], s1[i], xs4, xcs4, c);
        au += chunk_term<4>(w1[2 + i], s1[2 + i], xs4, xcs4, c);
      }
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0) m.act[k * I + gw] = silu(ag) * au;
  } else if (p1_rt) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = lane + 32 * i;
      if (c < nch8) {
        const float d = chunk_dot<8>(w1[i], xs8 + c * S8);
        acc += fmaf(__uint_as_float(s1[i] << 16), d, __uint_as_float(s1[i] & 0xFFFF0000u) * xcs8[c]);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) a.logits[gw - Is] = acc;
  }
  grid_sync(&g_bar, g0 + 1, !(dbg & 1));
  if (trig <= 1) pdl_trigger();  // every block is resident now: the next kernel may take what is left

  // ---- top-k (every block, from the logits in L2)
  {
    if (dbg & 2) {  // timing only: fixed experts, no logits read, no top-k
      if (t < k) ids[t] = t;
      if (t <= k) tw[t] = 1.0f / k;
      __syncthreads();
    } else {
      const float lv = t < E ? __ldcg(a.logits + t) : -INFINITY;
      block_router_topk(lv, __ldcg(a.logits + E), E, k, m.norm_topk, sc, ids, tw);
    }
    if (blockIdx.x == 0 && t <= k) {
      if (m.ids_out && t < k) m.ids_out[t] = ids[t];
      if (m.w_out) m.w_out[t] = tw[t];
    }
  }

  // ---- phase 2: routed gate/up + SwiGLU, two pairs per round; then this warp's first down row is
  // loaded (needed only after the next barrier, so its latency overlaps the barrier)
  uint4 dw[P];
  uint32_t dsb[P];
  auto load_down = [&](int row) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int it = lane + 32 * p;
      dw[p] = make_uint4(0, 0, 0, 0), dsb[p] = 0;
      if (it < n_items) {
        if (it < k * CHr) {
          const int j = it / CHr, c = it % CHr, r = ids[j] * H + row;
          dw[p] = load_chunk(m.down, r, c, CHr), dsb[p] = load_sb<4>(m.down, r, c);
        } else {
          const int c = it - k * CHr;
          dw[p] = load_chunk(m.sh_down, row, c, CHs), dsb[p] = load_sb<4>(m.sh_down, row, c);
        }
      }
    }
  };
  const int nq = k * I;
  auto gate_up_round = [&](int q0) {
    uint4 g[2][2], u[2][2];
    uint32_t sg[2][2], su[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int q = q0 + j * NW;
      const int row = q < nq ? ids[q / I] * I + q % I : 0;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = lane + 32 * i;
        if (q < nq && c < nch4) {
          g[j][i] = load_chunk(m.gate, row, c, nch4), sg[j][i] = load_sb<4>(m.gate, row, c);
          u[j][i] = load_chunk(m.up, row, c, nch4), su[j][i] = load_sb<4>(m.up, row, c);
        } else {
          g[j][i] = u[j][i] = make_uint4(0, 0, 0, 0), sg[j][i] = su[j][i] = 0;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int q = q0 + j * NW;
      if (q >= nq) continue;
      float ag = 0.f, au = 0.f;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = lane + 32 * i;
        if (c < nch4) {
          ag += chunk_term<4>(g[j][i], sg[j][i], xs4, xcs4, c);
          au += chunk_term<4>(u[j][i], su[j][i], xs4, xcs4, c);
        }
      }
      ag = warp_sum(ag);
      au = warp_sum(au);
      if (lane == 0) m.act[q] = silu(ag) * au;
    }
  };
  for (int q0 = gw; q0 < nq; q0 += 2 * NW) gate_up_round(q0);
  if (gw < H) load_down(gw);  // in flight across the barrier
  grid_sync(&g_bar, g0 + 2, !(dbg & 1));
  if (trig == 2) pdl_trigger();

  // ---- phase 3: act (all slots) staged once per block by cp.async straight into the padded chunk
  // layout (16-byte pieces, L2 only: written by other blocks), no registers held; then the chunk
  // sums, one warp per chunk in put()'s shuffle order; down + combine
  {
    const int n4 = (k * I + Is) / 4;
    for (int i = t; i < n4; i += kT) {
      const int e = 4 * i;
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(as + xs_index<4>(e)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(m.act + e) : "memory");
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    for (int c = warp; c < n_items; c += kW) {
      float sv = as[c * Chunk<4>::kStride + lane];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sv += __shfl_xor_sync(0xffffffffu, sv, o);
      if (lane == 0) acs[c] = sv;
    }
  }
  __syncthreads();
  auto down_row = [&](int row) {
    float y = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int it = lane + 32 * p;
      if (it < n_items) {
        const float wt = it < k * CHr ? tw[it / CHr] : tw[k];
        y = fmaf(wt, chunk_term<4>(dw[p], dsb[p], as, acs, it), y);
      }
    }
    y = warp_sum(y);
    if (lane == 0) m.out[row] = y;
  };
  if (gw < H) down_row(gw);
  for (int row = gw + NW; row < H; row += NW) {
    load_down(row);
    down_row(row);
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 132;
  }();
  return n;
}
// Blocks per SM of the fused kernel (LILY_MOE_FUSED_BPS, default 2; at most what is resident).
int fused_bps() {
  static const int v = [] {
    const char* e = std::getenv("LILY_MOE_FUSED_BPS");
    const int n = e && *e ? std::atoi(e) : 2;
    return n >= 1 && n <= 8 ? n : 2;
  }();
  return v;
}
// Register cap of the kernel as blocks of 256 per SM (LILY_MOE_FUSED_MINB: 3, the default, = 80
// registers, so 2 fused blocks leave 3/8 of the register file to the kernels before and after it
// (PDL overlap); 4 = 64 registers (spills), 2 = 128 (the whole file, no overlap)).
int fused_minb() {
  static const int v = [] {
    const char* e = std::getenv("LILY_MOE_FUSED_MINB");
    return e && (e[0] == '2' || e[0] == '4') ? e[0] - '0' : 3;
  }();
  return v;
}
int items_of(const MoeArgs& m, int Is) { return m.top_k * (m.I / 32) + Is / 32; }

// The barrier after which the next kernel may launch (PDL): 1, or 2 with LILY_MOE_FUSED_TRIG=2 (A/B).
int fused_trigger() {
  static const int v = [] {
    const char* e = std::getenv("LILY_MOE_FUSED_TRIG");
    return e && e[0] == '2' ? 2 : 1;
  }();
  return v;
}
// LILY_MOE_FUSED_DBG (timing decomposition only, results wrong): 1 = the barriers do not wait,
// 2 = fixed experts 0..k-1 instead of the top-k, 3 = both.
int fused_dbg() {
  static const int v = [] {
    const char* e = std::getenv("LILY_MOE_FUSED_DBG");
    return e && *e ? std::atoi(e) & 3 : 0;
  }();
  return v;
}
template <int P, int MINB> Status launch_fused(const MoeFusedArgs& a, cudaStream_t s) {
  auto kern = moe_fused_kernel<P, MINB>;
  const size_t smem = size_t(Smem(a.m.H, items_of(a.m, a.m.Is)).total) * sizeof(float);
  if (smem > 48 * 1024) LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  LILY_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, kT, smem));
  if (occ < 1) return cu_err("moe_fused: no block fits on an SM ({} B shared)", smem);
  const int nb = sm_count() * (occ < fused_bps() ? occ : fused_bps());
  if (nb * kW < a.m.Is + a.m.n_experts + 1) return cu_err("moe_fused: {} warps < shared rows + router rows", nb * kW);
  // Every block must be resident at once (device-wide barriers): nb ≤ SMs × occupancy.
  return launch_k("moe_fused", kern, dim3(nb), dim3(kT), smem, s, a, fused_trigger(), fused_dbg());
}

}  // namespace

bool moe_fused_supported(const MoeFusedArgs& a) {
  const MoeArgs& m = a.m;
  const int Is = m.Is > 0 ? m.Is : m.I, E = m.n_experts, k = m.top_k;
  return m.H > 0 && m.H % 64 == 0 && m.H <= kUx * kT && a.router.bits == 8 && a.router.cols == m.H &&
         a.router.rows == E + 1 && k >= 1 && k <= 16 && k <= E && E <= kT && m.I > 0 && m.I % 32 == 0 &&
         Is % 32 == 0 && m.sh_gate_up.rows == 2 * Is && m.sh_gate_up.cols == m.H && m.sh_down.cols == Is &&
         m.down.cols == m.I && m.gate.cols == m.H && items_of(m, Is) <= kMaxItems &&
         Is + E + 1 <= sm_count() * kW && a.in && a.gain && a.logits && m.act && m.out;
}

Status moe_fused(const MoeFusedArgs& a0, Stream stream) {
  MoeFusedArgs a = a0;
  if (a.m.Is <= 0) a.m.Is = a.m.I;
  if (!moe_fused_supported(a)) return cu_err("moe_fused: shapes unsupported (H={} I={} Is={} E={} k={})", a.m.H, a.m.I, a.m.Is, a.m.n_experts, a.m.top_k);
  auto s = static_cast<cudaStream_t>(stream);
  if (items_of(a.m, a.m.Is) > 160) return launch_fused<9, 2>(a, s);
  if (fused_minb() == 2) return launch_fused<5, 2>(a, s);
  if (fused_minb() == 4) return launch_fused<5, 4>(a, s);
  return launch_fused<5, 3>(a, s);
}

}  // namespace lily::cuda
