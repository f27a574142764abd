// Vocabulary-wide loops of the sampler, written so GCC vectorizes them (vector extensions, no
// -ffast-math): argmax, exp of shifted logits, and the k best ids in one pass. Each returns
// exactly what the plain scalar definition returns (exp to ~2 ulp of float). Also the definition
// of every draw (penalties, the plain and the filtered draw), which the CUDA draw kernels
// (src/backend/cuda/sampling/draw.cu) implement op for op: the small integer helpers below are compiled
// for both.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#if defined(__CUDACC__)
#define LILY_HD __host__ __device__
#else
#define LILY_HD
#endif

namespace lily {

// The first index of the largest value (NaNs never win); 0 for an empty or all-NaN span.
int32_t argmax_fast(std::span<const float> x);
// out[i] = exp(z[i]) for z[i] in [-87, 0] (float; larger |z| flush towards 0, z > 0 is clamped
// to 0). Max relative error ~2e-7.
void exp_nonpositive(const float* z, float* out, size_t n);
// Softmax weights of a logits row at temperature 1/inv_t: out[i] = exp((x[i] - mx)·inv_t), and 0
// where that exponent is <= cutoff (e.g. -40: negligible tokens never drawn).
void softmax_weights(std::span<const float> x, float mx, float inv_t, float cutoff, float* out);
// sums[b] = Σ w[b·block, min(n, (b+1)·block)) in double, summed in a fixed order.
void block_sums(const float* w, size_t n, size_t block, double* sums);
// log Σ exp(x) in double (max-shifted, summed in id order).
double log_sum_exp(std::span<const float> x);

// The temperature draw by inverse CDF, the definition the host sampler and the CUDA draw kernel
// (src/backend/cuda/sampling/draw.cu) both implement op for op, so a row draws the same id on either:
// weights w_i = exp((l_i − l_max)·inv_t) by softmax_weights (zero at or below e^-40), sums in
// double per kDrawBlock ids (block_sums), total = Σ sums in id order; then the first id, in id
// order, with w_i > 0 where the running sum passes u·total (u in [0, 1)). Rounding past the end
// returns the argmax. `w` and `sums` are scratch.
constexpr size_t kDrawBlock = 256;
int32_t draw_inverse_cdf(std::span<const float> logits, int32_t argmax_id, float inv_t, double u, std::vector<float>& w,
                         std::vector<double>& sums);
// The k largest entries' ids, largest first, ties to the lower id (k <= x.size()).
std::vector<int32_t> top_k_ids(std::span<const float> x, int k);

// Sets the logits of tokens not in `allowed` (bit id % 64 of word id / 64; words past its end
// allow nothing) to -infinity.
void apply_token_mask(std::span<float> logits, std::span<const uint64_t> allowed);

// Penalties on one token's logit, in this order: the repetition penalty (HF/CTRL: l > 0 ? l / r :
// l · r) if kPenaltyRepeat, then l − sub if kPenaltySubtract, where the sampler computes sub =
// presence + frequency · count once (so host and device subtract the same float). One entry per
// token; ids outside the row are ignored.
struct DrawPenalty {
  int32_t id = 0;
  uint32_t flags = 0;
  float sub = 0.0f;
};
constexpr uint32_t kPenaltyRepeat = 1, kPenaltySubtract = 2;
void apply_draw_penalties(std::span<float> logits, std::span<const DrawPenalty> pen, float repetition);

// The filtered draw (top-k, min-p, top-p), defined so that its result does not depend on the
// order in which anything is summed: a device reduces in parallel and draws the same id.
//  1. Candidates: the ids with a weight w_i > 0 from softmax_weights (cutoff -40, as the plain
//     draw), ordered best first by draw_key (logit descending, the lower id on ties).
//  2. top_k > 0: the top_k first candidates. min_p > 0: then those with w_i >= min_p (the best
//     has weight 1).
//  3. Weights as integers, draw_fixed(w_i) = w_i · 2^63 truncated (exact for w_i >= 2^-40; every
//     candidate has at least 39), summed exactly in 128 bits.
//  4. top_p < 1: the shortest best-first prefix whose weight reaches draw_top_p_need (top_p of
//     the total, rounded up); the total becomes that prefix's.
//  5. The first id, best first, whose running weight exceeds draw_walk_target(u, total).
// No candidate (a NaN or infinite best logit): argmax_id. `w` and `keys` are scratch.
struct DrawCuts {
  int top_k = 0;        // 0 = off
  float top_p = 1.0f;   // 1 = off
  float min_p = 0.0f;   // 0 = off
};
int32_t draw_filtered(std::span<const float> logits, int32_t argmax_id, float inv_t, const DrawCuts& cuts, double u,
                      std::vector<float>& w, std::vector<uint64_t>& keys);

using DrawU128 = unsigned __int128;

// Orders candidates: a larger key is a larger logit, or the same logit (-0 = +0) and a lower id.
LILY_HD inline uint64_t draw_key(float l, int32_t id) {
  if (l == 0.0f) l = 0.0f;
  uint32_t b;
#if defined(__CUDA_ARCH__)
  b = __float_as_uint(l);
#else
  std::memcpy(&b, &l, sizeof b);
#endif
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(b) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(id));
}
LILY_HD inline int32_t draw_key_id(uint64_t key) { return int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu)); }
LILY_HD inline uint64_t draw_fixed(float w) { return uint64_t(double(w) * 0x1p63); }
// ceil(top_p · total), top_p in [0, 1] taken as a 32-bit fraction (truncated), at least 1.
LILY_HD inline DrawU128 draw_top_p_need(float top_p, DrawU128 total) {
  const uint64_t tp = top_p > 0.0f ? uint64_t(double(top_p < 1.0f ? top_p : 1.0f) * 0x1p32) : 0;
  const DrawU128 need = (DrawU128(tp) * total + 0xFFFFFFFFu) >> 32;
  return need > 0 ? need : DrawU128(1);
}
// floor(u · total) for u in [0, 1) taken to 53 bits (total < 2^88: the product needs 141 bits).
LILY_HD inline DrawU128 draw_walk_target(double u, DrawU128 total) {
  const uint64_t m = uint64_t(u * 0x1p53), hi = uint64_t(total >> 64), lo = uint64_t(total);
  return ((DrawU128(m) * hi) << 11) + ((DrawU128(m) * lo) >> 53);
}

}  // namespace lily
