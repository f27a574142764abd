// draw_rows: four kernels, so that a row's vocabulary is read by many SMs where it can be.
// (1) Per 4,096-id slice: the argmax of the raw logits (first of ties) and, for a row with a token
// mask or penalties, the edited logits (mask, then penalties with __fdiv_rn/__fmul_rn/__fsub_rn as
// core/sample_math.cpp's apply_draw_penalties) and their argmax. (2) One warp per 256-id block:
// for a temperature draw, the weights exp((l − max)·inv_t) with core/sample_math.cpp's polynomial,
// every product and sum rounded separately (__fmul_rn/__fadd_rn) as the host computes them without
// FMA, and their double sum in the host's order (one lane); for log-probabilities, Σ exp(l − max)
// of the raw logits in double. (3) One block per row with a cut (top-k, min-p, top-p):
// draw_filtered's selections by a radix select over draw_key, each narrowing to a bucket of at
// most 2,048 keys, sorted in shared memory; the weights are draw_fixed integers, so the parallel
// sums equal the host's sorted-order sums exactly. (4) One block per row: the plain walk (thread
// 0 over the block sums and then the ids in order, as draw_inverse_cdf does), log Σ exp and the
// top-k log-probabilities by per-thread lists merged in k rounds of block argmax.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/sampling/draw.h"
#include "core/sample_math.h"

namespace lily::cuda {
namespace {

constexpr int kT = 1024;
constexpr int kBlk = int(kDrawBlock);

// core/sample_math.cpp's exp4, one lane.
__device__ __forceinline__ float exp_host_rn(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 0.0f ? 0.0f : x;
  const float kf = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f), 12582912.0f);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(kf, 0.693359375f)), __fmul_rn(kf, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  const int k = int(kf);
  return __fmul_rn(p, __int_as_float((k + 127) << 23));
}

// (value, id) order of the draw: larger value first, then lower id; NaN never wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0 || !(v == v)) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, id) over NT threads; every thread gets the result. red: 2·32 words of smem.
template <int NT>
__device__ void block_best(float& v, int& i, float* rv, int* ri) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) rv[warp] = v, ri[warp] = i;
  __syncthreads();
  if (warp == 0) {
    v = lane < NT / 32 ? rv[lane] : -FLT_MAX;
    i = lane < NT / 32 ? ri[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (better(ov, oi, v, i)) v = ov, i = oi;
    }
    if (lane == 0) rv[0] = v, ri[0] = i;
  }
  __syncthreads();
  v = rv[0], i = ri[0];
}

// Scratch after the upload area: w [B][V] f32 | edited [B][V] f32 | raw slice argmax pv, pi
// [B][S] | edited slice argmax epv, epi [B][S] | sums, esums [B][nb] f64 | fid [B] i32, each part
// 16-byte aligned.
constexpr int kSlice = 4096;  // ids per block of the max pass
constexpr int kT1 = 256;      // threads of the max and weights passes (8 warps: 8 id blocks each)
struct Scratch {
  float* w;       // temperature weights of the drawn logits
  float* edited;  // logits after the mask and penalties (rows that have them)
  float* pv;      // slice argmax of the raw logits
  int* pi;
  float* epv;  // slice argmax of the edited logits
  int* epi;
  double* sums;   // plain draw: weight sums per kBlk ids
  double* esums;  // log-probabilities: Σ exp(l − max) per kBlk ids
  int* fid;       // the filtered draw's id
};
__host__ __device__ inline size_t align16(size_t x) { return (x + 15) & ~size_t(15); }
inline size_t mask_words(int V) { return size_t((V + 63) / 64); }
inline size_t upload_row_bytes(int V) {
  return align16(size_t(kMaxDrawPenalties) * sizeof(DrawPenalty)) + align16(mask_words(V) * sizeof(uint64_t));
}
inline size_t upload_bytes(int B, int V) { return align16(size_t(B) * sizeof(DrawSpec)) + size_t(B) * upload_row_bytes(V); }
inline Scratch carve(void* base, int B, int V) {
  const int S = (V + kSlice - 1) / kSlice, nb = (V + kBlk - 1) / kBlk;
  char* p = static_cast<char*>(base) + upload_bytes(B, V);
  Scratch s;
  s.w = reinterpret_cast<float*>(p), p += align16(size_t(B) * V * sizeof(float));
  s.edited = reinterpret_cast<float*>(p), p += align16(size_t(B) * V * sizeof(float));
  s.pv = reinterpret_cast<float*>(p), p += align16(size_t(B) * S * sizeof(float));
  s.pi = reinterpret_cast<int*>(p), p += align16(size_t(B) * S * sizeof(int));
  s.epv = reinterpret_cast<float*>(p), p += align16(size_t(B) * S * sizeof(float));
  s.epi = reinterpret_cast<int*>(p), p += align16(size_t(B) * S * sizeof(int));
  s.sums = reinterpret_cast<double*>(p), p += align16(size_t(B) * nb * sizeof(double));
  s.esums = reinterpret_cast<double*>(p), p += align16(size_t(B) * nb * sizeof(double));
  s.fid = reinterpret_cast<int*>(p);
  return s;
}

// The row's argmax (first of ties) from its S slice partials; every thread gets it.
template <int NT>
__device__ int row_best(const float* pv, const int* pi, int S, float* rv, int* ri) {
  float bv = -FLT_MAX;
  int bi = -1;
  for (int j = threadIdx.x; j < S; j += NT)
    if (better(pv[j], pi[j], bv, bi)) bv = pv[j], bi = pi[j];
  block_best<NT>(bv, bi, rv, ri);
  return bi < 0 ? 0 : bi;
}
// The argmax of the logits the row draws from (edited or raw), and of the raw logits.
template <int NT>
__device__ int drawn_best(const DrawSpec& sp, const Scratch& sc, int row, int S, float* rv, int* ri) {
  const size_t o = size_t(row) * S;
  return draw_edits_logits(sp) ? row_best<NT>(sc.epv + o, sc.epi + o, S, rv, ri) : row_best<NT>(sc.pv + o, sc.pi + o, S, rv, ri);
}
template <int NT>
__device__ int raw_best(const Scratch& sc, int row, int S, float* rv, int* ri) {
  const size_t o = size_t(row) * S;
  return row_best<NT>(sc.pv + o, sc.pi + o, S, rv, ri);
}
__device__ __forceinline__ const float* drawn_logits(const float* logits, const DrawSpec& sp, const Scratch& sc, int row,
                                                     int V) {
  return (draw_edits_logits(sp) ? sc.edited : logits) + size_t(row) * V;
}

// (1) grid (S, B): the best (value, id) of each kSlice ids, raw; for rows with a mask or penalties
// also the edited logits of the slice and their best.
__global__ void __launch_bounds__(kT1) draw_max_kernel(const float* __restrict__ logits, int V,
                                                       const DrawSpec* __restrict__ spec, Scratch sc) {
  __shared__ float rv[32];
  __shared__ int ri[32];
  const int row = blockIdx.y, S = gridDim.x, i0 = blockIdx.x * kSlice, i1 = min(V, i0 + kSlice);
  const float* l = logits + size_t(row) * V;
  float bv = -FLT_MAX;
  int bi = -1;
  for (int i = i0 + threadIdx.x; i < i1; i += kT1)
    if (better(l[i], i, bv, bi)) bv = l[i], bi = i;
  block_best<kT1>(bv, bi, rv, ri);
  if (threadIdx.x == 0) sc.pv[size_t(row) * S + blockIdx.x] = bv, sc.pi[size_t(row) * S + blockIdx.x] = bi;
  const DrawSpec sp = spec[row];
  if (!draw_edits_logits(sp)) return;
  float* e = sc.edited + size_t(row) * V;
  for (int i = i0 + threadIdx.x; i < i1; i += kT1) {
    float v = l[i];
    if (sp.allowed) {
      const int word = i >> 6;
      const uint64_t bits = word < sp.n_allowed ? sp.allowed[word] : 0;
      if (!((bits >> (i & 63)) & 1)) v = -INFINITY;
    }
    e[i] = v;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < sp.n_penalties; k += kT1) {  // one entry per token: no two threads meet
    const DrawPenalty p = sp.penalties[k];
    if (p.id < i0 || p.id >= i1) continue;
    float x = e[p.id];
    if (p.flags & kPenaltyRepeat) x = x > 0.0f ? __fdiv_rn(x, sp.repetition) : __fmul_rn(x, sp.repetition);
    if (p.flags & kPenaltySubtract) x = __fsub_rn(x, p.sub);
    e[p.id] = x;
  }
  __syncthreads();
  bv = -FLT_MAX, bi = -1;
  for (int i = i0 + threadIdx.x; i < i1; i += kT1)
    if (better(e[i], i, bv, bi)) bv = e[i], bi = i;
  block_best<kT1>(bv, bi, rv, ri);
  if (threadIdx.x == 0) sc.epv[size_t(row) * S + blockIdx.x] = bv, sc.epi[size_t(row) * S + blockIdx.x] = bi;
}

// (2) grid (ceil(nb / 8), B), one warp per kBlk-id block: the temperature weights of the drawn
// logits and (plain draws) their double sum in the host's order (one lane, as block_sums adds
// them), and for log-probabilities Σ exp(l − max) of the raw logits in double over the block.
__global__ void __launch_bounds__(kT1) draw_weights_kernel(const float* __restrict__ logits, int V, int S,
                                                           const DrawSpec* __restrict__ spec, Scratch sc) {
  __shared__ float rv[32];
  __shared__ int ri[32];
  __shared__ float ws[kT1 / 32][kBlk];
  const int row = blockIdx.y, nb = (V + kBlk - 1) / kBlk;
  const DrawSpec sp = spec[row];
  const bool weights = sp.inv_t > 0.0f, esum = sp.top_logprobs >= 0;
  if (!weights && !esum) return;  // greedy, no log-probabilities
  const float* l = logits + size_t(row) * V;
  const float* dl = drawn_logits(logits, sp, sc, row, V);
  const float mxd = weights ? dl[drawn_best<kT1>(sp, sc, row, S, rv, ri)] : 0.0f;
  const float mxr = esum ? l[raw_best<kT1>(sc, row, S, rv, ri)] : 0.0f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x * (kT1 / 32) + warp;
  if (b >= nb) return;
  const int i0 = b * kBlk, n = min(V, i0 + kBlk) - i0;
  if (weights) {
    float* w = sc.w + size_t(row) * V;
    for (int k = lane; k < n; k += 32) {
      const float z = __fmul_rn(__fsub_rn(dl[i0 + k], mxd), sp.inv_t);
      const float x = z > -40.0f ? exp_host_rn(z) : 0.0f;
      w[i0 + k] = x;
      ws[warp][k] = x;
    }
    __syncwarp();
    if (lane == 0 && !draw_is_filtered(sp)) {
      const float* x = ws[warp];
      double s = 0.0;
      int k = 0;
      for (; k + 4 <= n; k += 4)
        s = __dadd_rn(s, __dadd_rn(__dadd_rn(double(x[k]), double(x[k + 1])), __dadd_rn(double(x[k + 2]), double(x[k + 3]))));
      for (; k < n; ++k) s = __dadd_rn(s, double(x[k]));
      sc.sums[size_t(row) * nb + b] = s;
    }
  }
  if (esum) {
    double e = 0.0;
    for (int k = lane; k < n; k += 32) e += exp(double(l[i0 + k]) - double(mxr));
    for (int o = 16; o > 0; o >>= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
    if (lane == 0) sc.esums[size_t(row) * nb + b] = e;
  }
}

// ---- (3) the filtered draw ----

constexpr int kGather = 2048;  // keys of a radix bucket sorted in shared memory

struct FilterShared {
  unsigned cnt[256];                   // per digit: members
  unsigned long long whi[256], wlo[256];  // per digit: Σ draw_fixed >> 32, Σ draw_fixed & 0xffffffff
  unsigned long long keys[kGather];
  unsigned long long wts[kGather];
  unsigned long long red_hi[kT / 32], red_lo[kT / 32];
  unsigned long long base_hi, base_lo;  // weight of the set above the current prefix
  unsigned long long sel_key, sel_hi, sel_lo;
  unsigned n_gather, bucket_n;
  int digit, found;
};

__device__ __forceinline__ DrawU128 u128_of(unsigned long long hi, unsigned long long lo) {
  return (DrawU128(hi) << 64) | DrawU128(lo);
}

// The set a selection runs over: candidates (w > 0) with key >= lo_key and, min_p > 0, w >= min_p.
struct FilterSet {
  uint64_t lo_key = 0;
  float min_p = 0.0f;
};
__device__ __forceinline__ bool in_set(float w, uint64_t key, const FilterSet& s) {
  return w > 0.0f && key >= s.lo_key && (!(s.min_p > 0.0f) || w >= s.min_p);
}

struct Selected {
  bool found;
  uint64_t key;
  DrawU128 cum;  // the set's weight (or count) from the best through this key
};

// The first member of `set`, best first (draw_key descending), whose running weight (by_count:
// running count) exceeds T; not found when the whole set weighs <= T. Radix select from the top
// byte of the key, one histogram pass per byte, until the bucket holding the answer has at most
// kGather members: those are gathered, sorted and walked. Block-wide: every thread calls it.
__device__ Selected filter_select(const float* __restrict__ dl, const float* __restrict__ w, int V, const FilterSet& set,
                                  bool by_count, DrawU128 T, FilterShared& sh) {
  const int t = threadIdx.x, lane = t & 31;
  uint64_t prefix = 0;
  int shift = 56;
  if (t == 0) sh.base_hi = 0, sh.base_lo = 0;
  for (;;) {
    const uint64_t above = shift >= 56 ? 0ull : ~0ull << (shift + 8);
    for (int d = t; d < 256; d += kT) sh.cnt[d] = 0, sh.whi[d] = 0, sh.wlo[d] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < V; i0 += kT) {  // the same trip count on every thread: whole warps below
      const int i = i0 + t;
      bool in = false;
      uint64_t key = 0;
      float wv = 0.0f;
      if (i < V) {
        wv = w[i];
        if (wv > 0.0f) {
          key = draw_key(dl[i], i);
          in = in_set(wv, key, set) && (key & above) == (prefix & above);
        }
      }
      const int dig = in ? int((key >> shift) & 255) : -1;
      const uint64_t f = in && !by_count ? draw_fixed(wv) : 0;
      unsigned long long hi = f >> 32, lo = f & 0xffffffffull;
      if (__match_any_sync(0xffffffffu, dig) == 0xffffffffu) {  // one digit for the whole warp
        if (in) {
          for (int o = 16; o > 0; o >>= 1) hi += __shfl_xor_sync(0xffffffffu, hi, o), lo += __shfl_xor_sync(0xffffffffu, lo, o);
          if (lane == 0) {
            atomicAdd(&sh.cnt[dig], 32u);
            if (!by_count) atomicAdd(&sh.whi[dig], hi), atomicAdd(&sh.wlo[dig], lo);
          }
        }
      } else if (in) {
        atomicAdd(&sh.cnt[dig], 1u);
        if (!by_count) atomicAdd(&sh.whi[dig], hi), atomicAdd(&sh.wlo[dig], lo);
      }
    }
    __syncthreads();
    if (t == 0) {
      const DrawU128 base = u128_of(sh.base_hi, sh.base_lo), rem = T - base;
      DrawU128 acc = 0;
      int chosen = -1;
      for (int d = 255; d >= 0; --d) {
        const DrawU128 wd = by_count ? DrawU128(sh.cnt[d]) : (DrawU128(sh.whi[d]) << 32) + DrawU128(sh.wlo[d]);
        if (acc + wd > rem) {
          chosen = d;
          break;
        }
        acc += wd;
      }
      sh.digit = chosen;
      if (chosen >= 0) {
        const DrawU128 nb = base + acc;
        sh.base_hi = uint64_t(nb >> 64), sh.base_lo = uint64_t(nb);
        sh.bucket_n = sh.cnt[chosen];
      }
    }
    __syncthreads();
    const int d = sh.digit;
    if (d < 0) return Selected{false, 0, 0};
    prefix |= uint64_t(d) << shift;
    if (sh.bucket_n <= unsigned(kGather)) break;
    shift -= 8;  // keys are unique: the last byte leaves one member
  }
  // Gather the bucket's members, sort them best first, find where the running weight passes T.
  const uint64_t mask = ~0ull << shift;
  if (t == 0) sh.n_gather = 0, sh.found = 0;
  __syncthreads();
  for (int i = t; i < V; i += kT) {
    const float wv = w[i];
    if (!(wv > 0.0f)) continue;
    const uint64_t key = draw_key(dl[i], i);
    if (in_set(wv, key, set) && (key & mask) == (prefix & mask)) sh.keys[atomicAdd(&sh.n_gather, 1u)] = key;
  }
  __syncthreads();
  const int n = int(sh.n_gather);
  int P = 1;
  while (P < n) P <<= 1;
  for (int j = n + t; j < P; j += kT) sh.keys[j] = 0;  // below every key
  __syncthreads();
  for (int k = 2; k <= P; k <<= 1)  // bitonic sort, descending
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = t; i < P; i += kT) {
        const int x = i ^ j;
        if (x > i) {
          const uint64_t a = sh.keys[i], b = sh.keys[x];
          if ((i & k) == 0 ? a < b : a > b) sh.keys[i] = b, sh.keys[x] = a;
        }
      }
      __syncthreads();
    }
  for (int j = t; j < n; j += kT) sh.wts[j] = by_count ? 1ull : draw_fixed(w[draw_key_id(sh.keys[j])]);
  __syncthreads();
  if (t < 32) {
    const DrawU128 base = u128_of(sh.base_hi, sh.base_lo), rem = T - base;
    const int chunk = (n + 31) / 32, j0 = min(n, lane * chunk), j1 = min(n, j0 + chunk);
    DrawU128 s = 0;
    for (int j = j0; j < j1; ++j) s += sh.wts[j];
    DrawU128 incl = s;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long h = __shfl_up_sync(0xffffffffu, (unsigned long long)(incl >> 64), o);
      const unsigned long long lw = __shfl_up_sync(0xffffffffu, (unsigned long long)incl, o);
      if (lane >= o) incl += u128_of(h, lw);
    }
    const DrawU128 excl = incl - s;
    if (excl <= rem && rem < incl) {
      DrawU128 c = excl;
      for (int j = j0; j < j1; ++j) {
        c += sh.wts[j];
        if (c > rem) {
          const DrawU128 cum = base + c;
          sh.sel_key = sh.keys[j], sh.sel_hi = uint64_t(cum >> 64), sh.sel_lo = uint64_t(cum), sh.found = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  const Selected r{sh.found != 0, sh.sel_key, u128_of(sh.sel_hi, sh.sel_lo)};
  __syncthreads();  // sh is reused by the next selection
  return r;
}

// Σ draw_fixed(w) over `set`, exact. Block-wide.
__device__ DrawU128 filter_total(const float* __restrict__ dl, const float* __restrict__ w, int V, const FilterSet& set,
                                 FilterShared& sh) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  unsigned long long hi = 0, lo = 0;
  for (int i = t; i < V; i += kT) {
    const float wv = w[i];
    if (!(wv > 0.0f) || !in_set(wv, draw_key(dl[i], i), set)) continue;
    const uint64_t f = draw_fixed(wv);
    hi += f >> 32, lo += f & 0xffffffffull;
  }
  for (int o = 16; o > 0; o >>= 1) hi += __shfl_xor_sync(0xffffffffu, hi, o), lo += __shfl_xor_sync(0xffffffffu, lo, o);
  if (lane == 0) sh.red_hi[warp] = hi, sh.red_lo[warp] = lo;
  __syncthreads();
  DrawU128 total = 0;
  for (int k = 0; k < kT / 32; ++k) total += (DrawU128(sh.red_hi[k]) << 32) + DrawU128(sh.red_lo[k]);
  __syncthreads();
  return total;
}

// (3) one block per row; rows without a cut return at once. Writes the drawn id to sc.fid.
__global__ void __launch_bounds__(kT) draw_filter_kernel(const float* __restrict__ logits, int V, int S,
                                                         const DrawSpec* __restrict__ spec, Scratch sc) {
  __shared__ FilterShared sh;
  __shared__ float rv[32];
  __shared__ int ri[32];
  const int row = blockIdx.x;
  const DrawSpec sp = spec[row];
  if (!draw_is_filtered(sp)) return;
  const float* dl = drawn_logits(logits, sp, sc, row, V);
  const float* w = sc.w + size_t(row) * V;
  const int best = drawn_best<kT>(sp, sc, row, S, rv, ri);
  FilterSet set;
  if (sp.cuts.top_k > 0) {
    const Selected k = filter_select(dl, w, V, set, true, DrawU128(sp.cuts.top_k - 1), sh);
    if (k.found) set.lo_key = k.key;  // not found: no more than top_k candidates
  }
  set.min_p = sp.cuts.min_p;
  DrawU128 total = filter_total(dl, w, V, set, sh);
  int id = best;
  if (total > 0) {
    if (sp.cuts.top_p < 1.0f) {
      const Selected p = filter_select(dl, w, V, set, false, draw_top_p_need(sp.cuts.top_p, total) - 1, sh);
      if (p.found) set.lo_key = p.key, total = p.cum;
    }
    const Selected d = filter_select(dl, w, V, set, false, draw_walk_target(sp.u, total), sh);
    if (d.found) id = draw_key_id(d.key);
  }
  if (threadIdx.x == 0) sc.fid[row] = id;
}

// (4) one block per row: the argmax, the inverse-CDF walk over the block sums and then the ids of
// the block it lands in (one thread, in id order, as draw_inverse_cdf does), or the filtered
// draw's id; log Σ exp and the top-k by per-thread lists merged in k rounds of block argmax.
__global__ void __launch_bounds__(kT) draw_finish_kernel(const float* __restrict__ logits, int V, int S,
                                                         const DrawSpec* __restrict__ spec, Drawn* __restrict__ out,
                                                         Scratch sc) {
  extern __shared__ double sums[];  // [nb]
  __shared__ float rv[32];
  __shared__ int ri[32];
  __shared__ float wb[kBlk];
  __shared__ double walk_u;
  __shared__ int walk_b, walk_found;
  const int row = blockIdx.x, t = threadIdx.x, nb = (V + kBlk - 1) / kBlk;
  const float* l = logits + size_t(row) * V;
  const DrawSpec sp = spec[row];
  const int best = drawn_best<kT>(sp, sc, row, S, rv, ri);
  int id = best;
  if (draw_is_filtered(sp)) {
    id = sc.fid[row];
  } else if (sp.inv_t > 0.0f) {
    const float* w = sc.w + size_t(row) * V;
    for (int b = t; b < nb; b += kT) sums[b] = sc.sums[size_t(row) * nb + b];
    __syncthreads();
    if (t == 0) {
      double total = 0.0;
      for (int b = 0; b < nb; ++b) total = __dadd_rn(total, sums[b]);
      walk_u = __dmul_rn(sp.u, total);
      walk_b = 0;
      walk_found = -1;
    }
    __syncthreads();
    for (;;) {
      // Thread 0 skips the blocks whose sum u covers; everyone stages the weights of the next one.
      if (t == 0) {
        int b = walk_b;
        double u = walk_u;
        while (b < nb && u >= sums[b] && b + 1 < nb) u = __dsub_rn(u, sums[b]), ++b;
        walk_b = b, walk_u = u;
      }
      __syncthreads();
      const int b = walk_b;
      if (b >= nb) break;
      const int i0 = b * kBlk, n = min(V, i0 + kBlk) - i0;
      if (t < n) wb[t] = w[i0 + t];
      __syncthreads();
      if (t == 0) {
        double u = walk_u;
        for (int k = 0; k < n; ++k) {
          u = __dsub_rn(u, double(wb[k]));
          if (u < 0.0 && wb[k] > 0.0f) {
            walk_found = i0 + k;
            break;
          }
        }
        walk_u = u;
        walk_b = walk_found >= 0 ? nb : b + 1;
      }
      __syncthreads();
    }
    id = walk_found < 0 ? best : walk_found;
  }
  Drawn* o = out + row;
  if (t == 0) o->id = id, o->n_top = 0, o->logprob = 0.0f;
  if (sp.top_logprobs < 0) return;
  const float mx = l[raw_best<kT>(sc, row, S, rv, ri)];
  if (t == 0) {
    double s = 0.0;
    for (int b = 0; b < nb; ++b) s += sc.esums[size_t(row) * nb + b];
    walk_u = double(mx) + log(s);
  }
  __syncthreads();
  const double log_z = walk_u;
  if (t == 0) o->logprob = float(double(l[id]) - log_z);
  const int k = min(sp.top_logprobs, kMaxDrawTop);
  if (k == 0) return;
  float tv[kMaxDrawTop];
  int ti[kMaxDrawTop];
  int n = 0;
  for (int i = t; i < V; i += kT) {  // ids ascend: an equal value never displaces an earlier one
    const float v = l[i];
    if (!(v == v)) continue;
    if (n == k && !(v > tv[k - 1])) continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && v > tv[j - 1]) tv[j] = tv[j - 1], ti[j] = ti[j - 1], --j;
    tv[j] = v, ti[j] = i;
  }
  int head = 0;
  for (int r = 0; r < k; ++r) {
    float v = head < n ? tv[head] : -FLT_MAX;
    int i = head < n ? ti[head] : -1;
    block_best<kT>(v, i, rv, ri);
    if (i < 0) break;
    if (head < n && ti[head] == i) ++head;
    if (t == 0) {
      o->top_id[r] = i;
      o->top_logprob[r] = float(double(l[i]) - log_z);
      o->n_top = r + 1;
    }
  }
}

}  // namespace

size_t draw_upload_bytes(int B, int V) { return upload_bytes(B, V); }

size_t draw_scratch_bytes(int B, int V) {
  const size_t S = size_t((V + kSlice - 1) / kSlice), nb = size_t((V + kBlk - 1) / kBlk);
  return upload_bytes(B, V) + 2 * align16(size_t(B) * V * sizeof(float)) + 2 * align16(size_t(B) * S * sizeof(float)) +
         2 * align16(size_t(B) * S * sizeof(int)) + 2 * align16(size_t(B) * nb * sizeof(double)) +
         align16(size_t(B) * sizeof(int));
}

Status pack_draw_specs(std::span<const DrawSpec> spec, int V, const void* device_at, std::vector<unsigned char>& image) {
  const size_t B = spec.size(), words = mask_words(V);
  size_t off = align16(B * sizeof(DrawSpec)), size = off;  // the exact size: no fill of unused bytes
  for (const DrawSpec& s : spec) {
    if (s.n_penalties > 0) size += align16(size_t(std::min(s.n_penalties, kMaxDrawPenalties)) * sizeof(DrawPenalty));
    if (s.allowed) size += align16(std::min(size_t(std::max(s.n_allowed, 0)), words) * sizeof(uint64_t));
  }
  image.resize(size);
  const auto* dev = static_cast<const unsigned char*>(device_at);
  for (size_t b = 0; b < B; ++b) {
    DrawSpec s = spec[b];
    if (!(s.inv_t >= 0.0f) || !(s.u >= 0.0 && s.u < 1.0) || s.top_logprobs > kMaxDrawTop || s.cuts.top_k < 0 ||
        s.n_penalties < 0 || s.n_penalties > kMaxDrawPenalties || s.n_allowed < 0 ||
        (s.n_penalties > 0 && !s.penalties))
      return cu_err("draw: bad spec for row {} (inv_t {}, u {}, top_logprobs {}, top_k {}, {} penalties)", b, s.inv_t,
                    s.u, s.top_logprobs, s.cuts.top_k, s.n_penalties);
    if (s.n_penalties > 0) {
      const size_t n = size_t(s.n_penalties) * sizeof(DrawPenalty);
      std::memcpy(image.data() + off, s.penalties, n);
      s.penalties = reinterpret_cast<const DrawPenalty*>(dev + off);
      off += align16(n);
    } else {
      s.penalties = nullptr;
    }
    if (s.allowed) {  // words past the vocabulary's never matter
      s.n_allowed = int(std::min(size_t(s.n_allowed), words));
      const size_t n = size_t(s.n_allowed) * sizeof(uint64_t);
      std::memcpy(image.data() + off, s.allowed, n);
      s.allowed = reinterpret_cast<const uint64_t*>(dev + off);
      off += align16(n);
    }
    std::memcpy(image.data() + b * sizeof(DrawSpec), &s, sizeof s);
  }
  return Status::ok();
}

Status draw_rows(const float* logits, int B, int V, const DrawSpec* spec, Drawn* out, void* scratch, void* stream) {
  if (B <= 0) return Status::ok();
  if (V <= 0 || V > (1 << 24)) return cu_err("draw_rows: vocabulary {} out of range", V);
  if (B > 65535) return cu_err("draw_rows: {} rows is more than one launch takes", B);
  const int S = (V + kSlice - 1) / kSlice, nb = (V + kBlk - 1) / kBlk;
  const size_t smem = size_t(nb) * sizeof(double);
  if (smem > 200 * 1024) return cu_err("draw_rows: vocabulary {} too large for the block sums", V);
  static size_t attr = 0;
  if (smem > 40 * 1024 && smem > attr) {
    LILY_CU_TRY(cudaFuncSetAttribute(draw_finish_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  const Scratch sc = carve(scratch, B, V);
  auto st = static_cast<cudaStream_t>(stream);
  draw_max_kernel<<<dim3(unsigned(S), unsigned(B)), kT1, 0, st>>>(logits, V, spec, sc);
  LILY_TRY(launch_status("draw_max_kernel"));
  draw_weights_kernel<<<dim3(unsigned((nb + kT1 / 32 - 1) / (kT1 / 32)), unsigned(B)), kT1, 0, st>>>(logits, V, S, spec, sc);
  LILY_TRY(launch_status("draw_weights_kernel"));
  draw_filter_kernel<<<B, kT, 0, st>>>(logits, V, S, spec, sc);
  LILY_TRY(launch_status("draw_filter_kernel"));
  draw_finish_kernel<<<B, kT, smem, st>>>(logits, V, S, spec, out, sc);
  return launch_status("draw_finish_kernel");
}

}  // namespace lily::cuda
