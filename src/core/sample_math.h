// Vocabulary-wide loops of the sampler, written so GCC vectorizes them (vector extensions, no
// -ffast-math): argmax, exp of shifted logits, and the k best ids in one pass. Each returns
// exactly what the plain scalar definition returns (exp to ~2 ulp of float).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

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
// (src/backend/cuda/draw.cu) both implement op for op, so a row draws the same id on either:
// weights w_i = exp((l_i − l_max)·inv_t) by softmax_weights (zero at or below e^-40), sums in
// double per kDrawBlock ids (block_sums), total = Σ sums in id order; then the first id, in id
// order, with w_i > 0 where the running sum passes u·total (u in [0, 1)). Rounding past the end
// returns the argmax. `w` and `sums` are scratch.
constexpr size_t kDrawBlock = 256;
int32_t draw_inverse_cdf(std::span<const float> logits, int32_t argmax_id, float inv_t, double u, std::vector<float>& w,
                         std::vector<double>& sums);
// The k largest entries' ids, largest first, ties to the lower id (k <= x.size()).
std::vector<int32_t> top_k_ids(std::span<const float> x, int k);

}  // namespace lily
