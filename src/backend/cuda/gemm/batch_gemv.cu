// The batched step's router GEMV (4/8-bit, group 64; bgemv_grouped) and its small per-row kernels (router
// top-k, the position update). Each warp keeps R weight rows in registers (loaded once) and
// applies them to every staged input row b, with the per-(b, row) arithmetic of gemv_q4.cu: lane l sums
// chunks l, l+32, ... in that order (fmaf(scale, Σq·x, bias·Σx)), then a butterfly warp sum, so a row's
// logits are bit-identical to the batch-1 GEMV's (decode rows route as they would alone). Inputs are plain
// fp32 rows staged by stage_plain.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/moe/dec_topk.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256, kWarps = 8;
constexpr size_t kSmemCap = 190 * 1024;

// Floats of one staged row [xs | xcs], rounded up to 4 so every row starts 16-byte aligned (float4 reads).
template <int BITS> __host__ __device__ constexpr int row_floats(int K) {
  return ((K * BITS / 128) * Chunk<BITS>::kStride + K * BITS / 128 + 3) / 4 * 4;
}

// The warp's R weight rows from rb (rows past the matrix zero).
template <int BITS, int CPL, int R>
__device__ __forceinline__ void load_rows(const QW& w, int rb, int nch, uint4 (&wv)[R][CPL], uint32_t (&sbv)[R][CPL]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int r = rb + j, c = lane + 32 * i;
      if (r < w.rows && c < nch) {
        wv[j][i] = load_chunk(w, r, c, nch);
        sbv[j][i] = load_sb<BITS>(w, r, c);
      } else {
        wv[j][i] = make_uint4(0, 0, 0, 0);
        sbv[j][i] = 0;
      }
    }
}

// v2 (bgemv_grouped): the same sums with the loops turned so the work per step is shared: per
// 4-byte word of a chunk, the R rows' codes are converted once and applied to NB staged rows (conversion
// amortized over NB), and each x value read from shared memory feeds R weight rows. Per (b, row) the fmaf
// chain is chunk_dot's (a0 over the even, a1 over the odd elements of the chunk, word by word),
// then acc += fmaf(scale, a0 + a1, bias·Σx) chunk by chunk and the butterfly warp sum: bit-identical.
// One weight tile (the warp's R rows from rb, in wv / sbv) against the B staged rows at sm.
template <int BITS, int CPL, int R, int NB>
__device__ __forceinline__ void v2_tile(const uint4 (&wv)[R][CPL], const uint32_t (&sbv)[R][CPL], const float* sm, int rf,
                                        int nch, int B, int rb, int rows, float* y, int ldy) {
  constexpr int CS = Chunk<BITS>::kStride;
  const int lane = threadIdx.x & 31;
  for (int b0 = 0; b0 < B; b0 += NB) {
    float acc[R][NB];
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int bb = 0; bb < NB; ++bb) acc[j][bb] = 0.f;
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int c = lane + 32 * i;
      if (c < nch) {
        float a0[R][NB], a1[R][NB];
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
          for (int bb = 0; bb < NB; ++bb) a0[j][bb] = 0.f, a1[j][bb] = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          constexpr int EPW = 32 / BITS;  // elements per word: 8 or 4
          float f[R][EPW];
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const uint32_t wq = q == 0 ? wv[j][i].x : q == 1 ? wv[j][i].y : q == 2 ? wv[j][i].z : wv[j][i].w;
            if constexpr (BITS == 4) {
              const uint32_t lo = wq & 0x0F0F0F0Fu, hi = (wq >> 4) & 0x0F0F0F0Fu;
#pragma unroll
              for (int t = 0; t < 4; ++t) f[j][2 * t] = byte_f(lo, t), f[j][2 * t + 1] = byte_f(hi, t);
            } else {
#pragma unroll
              for (int t = 0; t < 4; ++t) f[j][t] = byte_f(wq, t);
            }
          }
#pragma unroll
          for (int bb = 0; bb < NB; ++bb) {
            const float* xc = sm + (b0 + bb) * rf + c * CS + q * EPW;
            if constexpr (BITS == 4) {
              const float4 xa = *reinterpret_cast<const float4*>(xc);
              const float4 xb = *reinterpret_cast<const float4*>(xc + 4);
#pragma unroll
              for (int j = 0; j < R; ++j) {
                a0[j][bb] = fmaf(f[j][0], xa.x, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][1], xa.y, a1[j][bb]);
                a0[j][bb] = fmaf(f[j][2], xa.z, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][3], xa.w, a1[j][bb]);
                a0[j][bb] = fmaf(f[j][4], xb.x, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][5], xb.y, a1[j][bb]);
                a0[j][bb] = fmaf(f[j][6], xb.z, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][7], xb.w, a1[j][bb]);
              }
            } else {
              const float4 xa = *reinterpret_cast<const float4*>(xc);
#pragma unroll
              for (int j = 0; j < R; ++j) {
                a0[j][bb] = fmaf(f[j][0], xa.x, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][1], xa.y, a1[j][bb]);
                a0[j][bb] = fmaf(f[j][2], xa.z, a0[j][bb]);
                a1[j][bb] = fmaf(f[j][3], xa.w, a1[j][bb]);
              }
            }
          }
        }
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          const float xsum = sm[(b0 + bb) * rf + nch * CS + c];
#pragma unroll
          for (int j = 0; j < R; ++j) {
            const float d = a0[j][bb] + a1[j][bb];
            acc[j][bb] += fmaf(__uint_as_float(sbv[j][i] << 16), d, __uint_as_float(sbv[j][i] & 0xFFFF0000u) * xsum);
          }
        }
      }
    }
#pragma unroll
    for (int bb = 0; bb < NB; ++bb)
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const float v = warp_sum(acc[j][bb]);
        if (lane == 0 && rb + j < rows && b0 + bb < B) y[size_t(b0 + bb) * ldy + rb + j] = v;
      }
  }
}

// The grouped form: block (g, t) stages the G rows of group g (the loads of NB rows in flight at once) and
// walks the weight tiles t, t + gridDim.y, ..., each tile's weights loaded while the previous one computes.
template <int BITS, int CPL, int R, int NB>
__global__ void __launch_bounds__(kThreads) bgemv_grouped_kernel(QW w, const float* __restrict__ x, int ldx, float* y,
                                                                  int ldy, int B, int G) {
  extern __shared__ float sm[];
  const int K = w.cols, nch = K * BITS / 128, rows = w.rows, rf = row_floats<BITS>(K);
  const int warp = threadIdx.x >> 5;
  x += size_t(blockIdx.x) * G * ldx, y += size_t(blockIdx.x) * G * ldy;
  B = min(G, B - int(blockIdx.x) * G);
  const int rstep = gridDim.y * kWarps * R;
  uint4 wv[R][CPL], wn[R][CPL];
  uint32_t sbv[R][CPL], sn[R][CPL];
  int tb = blockIdx.y * kWarps * R;
  load_rows<BITS, CPL, R>(w, tb + warp * R, nch, wv, sbv);
  pdl_wait();
  pdl_trigger();
  stage_plain_rows<BITS, NB>(x, ldx, K, B, sm, rf);
  __syncthreads();
  for (; tb < rows; tb += rstep) {
    const bool more = tb + rstep < rows;
    if (more) load_rows<BITS, CPL, R>(w, tb + rstep + warp * R, nch, wn, sn);
    v2_tile<BITS, CPL, R, NB>(wv, sbv, sm, rf, nch, B, tb + warp * R, rows, y, ldy);
    if (more) {
#pragma unroll
      for (int j = 0; j < R; ++j)
#pragma unroll
        for (int i = 0; i < CPL; ++i) wv[j][i] = wn[j][i], sbv[j][i] = sn[j][i];
    }
  }
}

// Weight tiles of r rows a warp over w's rows.
int grouped_tiles(const QW& w, int r) { return (w.rows + kWarps * r - 1) / (kWarps * r); }

template <int BITS, int CPL, int R, int NB>
Status launch_grouped(const QW& w, const float* x, int ldx, float* y, int ldy, int B, const GroupedShape& g, cudaStream_t s) {
  auto kern = bgemv_grouped_kernel<BITS, CPL, R, NB>;
  const size_t smem = size_t(g.group) * row_floats<BITS>(w.cols) * sizeof(float);
  if (smem > kSmemCap) return cu_err("bgemv_grouped: {} staged rows of K={} at {} bits exceed the shared memory", g.group, w.cols, BITS);
  static bool attr = false;  // per instantiation
  if (!attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemCap)));
    attr = true;
  }
  const int groups = (B + g.group - 1) / g.group;
  int tiles = g.tiles;
  if (!tiles) {  // as many tiles a block as leave one wave of resident blocks
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kThreads, smem) != cudaSuccess || per_sm < 1) per_sm = 1;
    tiles = std::max(1, std::min(grouped_tiles(w, R), sm_count() * per_sm / groups));
  }
  return launch_k("bgemv_grouped", kern, dim3(groups, tiles), dim3(kThreads), smem, s, w, x, ldx, y, ldy, B, g.group);
}
template <int BITS, int CPL>
Status launch_grouped_rn(const QW& w, const float* x, int ldx, float* y, int ldy, int B, const GroupedShape& g, cudaStream_t s) {
  if (g.r == 1) return g.nb == 4 ? launch_grouped<BITS, CPL, 1, 4>(w, x, ldx, y, ldy, B, g, s) : launch_grouped<BITS, CPL, 1, 8>(w, x, ldx, y, ldy, B, g, s);
  return g.nb == 4 ? launch_grouped<BITS, CPL, 2, 4>(w, x, ldx, y, ldy, B, g, s) : launch_grouped<BITS, CPL, 2, 8>(w, x, ldx, y, ldy, B, g, s);
}

// ---- small per-row kernels ----------------------------------------------------------------------

// gemv_q4.cu's router_topk, one warp per row: softmax over E, top_k argmax rounds (ties → lowest
// id), renormalize; sigmoid of the shared-expert gate logit.
__global__ void brouter_topk_kernel(const float* logits, int ld, int E, int top_k, bool norm_topk, bool has_shared,
                                    int32_t* ids, float* wout) {
  extern __shared__ float p[];
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, b = blockIdx.x;
  const float* l = logits + size_t(b) * ld;
  const WarpTopk r = warp_router_topk(l, E, top_k, p);
  if (lane < top_k) {
    ids[b * top_k + lane] = r.id;
    wout[b * (top_k + 1) + lane] = norm_topk ? r.p / r.tsum : r.p;
  }
  if (lane == 0 && has_shared) wout[b * (top_k + 1) + top_k] = sigmoid(__ldcg(l + E));
}

__global__ void bfinish_kernel(StepCtl* const* ctl, const int32_t* pos, int B) {
  pdl_wait();
  pdl_trigger();
  for (int b = threadIdx.x; b < B; b += blockDim.x) ctl[b]->pos = pos[b] + 1;
}

}  // namespace

Status brouter_topk(const float* logits, int ld, int E, int top_k, bool norm_topk, bool has_shared, int32_t* ids,
                    float* w, int B, Stream s) {
  if (top_k < 1 || top_k > 32 || top_k > E) return cu_err("brouter_topk: k={} E={} unsupported", top_k, E);
  return launch_k("brouter_topk", brouter_topk_kernel, dim3(B), dim3(32), size_t(E) * sizeof(float),
                  static_cast<cudaStream_t>(s), logits, ld, E, top_k, norm_topk, has_shared, ids, w);
}

Status bfinish(StepCtl* const* ctl, const int32_t* pos, int B, Stream s) {
  return launch_k("bfinish", bfinish_kernel, dim3(1), dim3(64), 0, static_cast<cudaStream_t>(s), ctl, pos, B);
}

// By the row count, as CudaBatch.SmallOpsBench measured the router (257 × 2048 8-bit) on an H100
// (2026-12-06, µs at 16 / 64 / 256 / 736 rows): up to 64 rows 4 staged rows a block, one weight row a warp
// and 4 rows a step of its sums (7.4 / 14.8; 119 registers, two blocks an SM: every SM busy); above, 8
// staged rows, 2 weight rows a warp and 8 rows a step (30.2 / 81.6, against 38.5 / 106.1 for the small
// shape: 199 registers and one block an SM, but a fifth fewer instructions a sum). The earlier kernel
// (8 staged rows × 16-row tiles, one tile a block, 154 registers) measured 68 µs a call at 256 rows in the
// step's profile (four waves of one block an SM). Tiles 0: the launch fits one wave.
GroupedShape bgemv_grouped_shape(const QW& w, int B) {
  (void)w;
  return B <= 64 ? GroupedShape{4, 1, 4, 0} : GroupedShape{8, 2, 8, 0};
}

Status bgemv_grouped(const QW& w, const float* x, int ldx, float* y, int ldy, int B, Stream stream, GroupedShape g) {
  auto s = static_cast<cudaStream_t>(stream);
  if (w.bits != 4 && w.bits != 8) return cu_err("bgemv_grouped: {} bits unsupported", w.bits);
  if (w.cols % 64 != 0 || w.cols <= 0 || w.rows <= 0 || B < 1) return cu_err("bgemv_grouped: shape {}x{}, {} rows unsupported", w.rows, w.cols, B);
  const int cpl = (w.cols * w.bits / 128 + 31) / 32;
  if (cpl > 4) return cu_err("bgemv_grouped: K={} too large for {}-bit", w.cols, w.bits);
  if (!g.group) g = bgemv_grouped_shape(w, B);
  if ((g.r != 1 && g.r != 2) || (g.nb != 4 && g.nb != 8) || g.group < g.nb || g.group % g.nb != 0 || g.tiles < 0 ||
      g.tiles > grouped_tiles(w, g.r))
    return cu_err("bgemv_grouped: shape {{group {}, r {}, nb {}, tiles {}}} unsupported", g.group, g.r, g.nb, g.tiles);
  if (w.bits == 4) {
    if (cpl == 1) return launch_grouped_rn<4, 1>(w, x, ldx, y, ldy, B, g, s);
    if (cpl == 2) return launch_grouped_rn<4, 2>(w, x, ldx, y, ldy, B, g, s);
    return launch_grouped_rn<4, 4>(w, x, ldx, y, ldy, B, g, s);
  }
  if (cpl == 1) return launch_grouped_rn<8, 1>(w, x, ldx, y, ldy, B, g, s);
  if (cpl == 2) return launch_grouped_rn<8, 2>(w, x, ldx, y, ldy, B, g, s);
  return launch_grouped_rn<8, 4>(w, x, ldx, y, ldy, B, g, s);
}

}  // namespace lily::cuda
