// See sample_math.h. Four-lane GCC vector extensions: SSE2 on the baseline x86-64 build; the
// results do not depend on the lane count.
#include "core/sample_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

// Every product and sum separately rounded (no FMA contraction where the target has FMA), as the
// CUDA draw kernel computes them with __fmul_rn / __fadd_rn.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

namespace lily {
namespace {

typedef float v4f __attribute__((vector_size(16)));  // 4 lanes: SSE2 on the baseline build
typedef int32_t v4i __attribute__((vector_size(16)));

v4f load4(const float* p) {
  v4f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

int32_t argmax_fast(std::span<const float> x) {
  const size_t n = x.size();
  if (n == 0) return 0;
  const float ninf = -std::numeric_limits<float>::infinity();
  // Per lane: the largest value and the first index holding it (strict >: NaN never wins).
  v4f m = v4f{} + ninf;
  v4i mi = v4i{} - 1, iv = v4i{0, 1, 2, 3};
  size_t i = 0;
  for (; i + 4 <= n && i + 4 <= size_t(INT32_MAX); i += 4, iv += 4) {
    const v4f v = load4(x.data() + i);
    const v4i gt = v > m;
    m = gt ? v : m;
    mi = gt ? iv : mi;
  }
  float best = ninf;
  int32_t bi = -1;
  for (int l = 0; l < 4; ++l)
    if (mi[l] >= 0 && (m[l] > best || (m[l] == best && mi[l] < bi))) best = m[l], bi = mi[l];
  for (; i < n; ++i)
    if (x[i] > best) best = x[i], bi = int32_t(i);
  if (bi < 0) {  // all -inf or NaN: the scalar loop keeps index 0 unless a larger value follows
    for (size_t j = 1; j < n; ++j)
      if (x[j] > x[0]) return int32_t(j);
    return 0;
  }
  return bi;
}

namespace {

// exp(x) = 2^k · exp(r), k = round(x / ln 2), r = x − k·ln 2 in [−ln2/2, ln2/2] (ln 2 split in two
// for an exact product), exp(r) by Cephes' degree-6 polynomial. x is clamped to [-87, 0].
inline v4f exp4(v4f x) {
  const v4f lo = v4f{} - 87.0f, zero = v4f{}, log2e = v4f{} + 1.44269504088896341f;
  const v4f shifter = v4f{} + 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const v4f c1 = v4f{} + 0.693359375f, c2 = v4f{} - 2.12194440e-4f;
  x = x < lo ? lo : x;
  x = x > zero ? zero : x;
  const v4f kf = (x * log2e + shifter) - shifter;
  const v4f r = (x - kf * c1) - kf * c2;
  v4f p = v4f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v4i k = __builtin_convertvector(kf, v4i);
  const v4i bits = (k + 127) << 23;  // 2^k, k in [-126, 0]
  v4f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Applies f to x[0, n) four at a time (the tail padded with `pad`), writing out[0, n).
template <typename F> void map4(const float* x, float* out, size_t n, float pad, F f) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const v4f e = f(load4(x + i));
    std::memcpy(out + i, &e, sizeof e);
  }
  if (i < n) {
    float buf[4] = {pad, pad, pad, pad};
    std::memcpy(buf, x + i, (n - i) * sizeof(float));
    const v4f e = f(load4(buf));
    std::memcpy(buf, &e, sizeof e);
    std::memcpy(out + i, buf, (n - i) * sizeof(float));
  }
}

}  // namespace

void exp_nonpositive(const float* z, float* out, size_t n) { map4(z, out, n, 0.0f, exp4); }

void softmax_weights(std::span<const float> x, float mx, float inv_t, float cutoff, float* out) {
  const v4f vmx = v4f{} + mx, vt = v4f{} + inv_t, vcut = v4f{} + cutoff, zero = v4f{};
  map4(x.data(), out, x.size(), mx, [&](v4f l) {
    const v4f z = (l - vmx) * vt;
    return z > vcut ? exp4(z) : zero;
  });
}

void block_sums(const float* w, size_t n, size_t block, double* sums) {
  for (size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block) {
    const size_t i1 = std::min(n, i0 + block);
    double s = 0.0;
    size_t i = i0;
    for (; i + 4 <= i1; i += 4) s += (double(w[i]) + double(w[i + 1])) + (double(w[i + 2]) + double(w[i + 3]));
    for (; i < i1; ++i) s += w[i];
    sums[b] = s;
  }
}

std::vector<int32_t> top_k_ids(std::span<const float> x, int k) {
  k = std::clamp(k, 0, int(x.size()));
  std::vector<int32_t> best;  // sorted, best first
  best.reserve(size_t(k) + 1);
  if (k == 0) return best;
  // A candidate enters only if it beats the current k-th (ids grow, so an equal value loses).
  float kth = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (int(best.size()) == k && !(v > kth)) continue;
    if (v != v) continue;  // NaN
    auto pos = std::upper_bound(best.begin(), best.end(), v, [&](float a, int32_t id) { return a > x[size_t(id)]; });
    best.insert(pos, int32_t(i));
    if (int(best.size()) > k) best.pop_back();
    if (int(best.size()) == k) kth = x[size_t(best.back())];
  }
  return best;
}

double log_sum_exp(std::span<const float> x) {
  if (x.empty()) return -INFINITY;
  const double mx = x[size_t(argmax_fast(x))];
  double sum = 0.0;
  for (float v : x) sum += std::exp(double(v) - mx);
  return mx + std::log(sum);
}

int32_t draw_inverse_cdf(std::span<const float> logits, int32_t argmax_id, float inv_t, double u, std::vector<float>& w,
                         std::vector<double>& sums) {
  const size_t V = logits.size();
  w.resize(V);
  softmax_weights(logits, logits[size_t(argmax_id)], inv_t, -40.0f, w.data());
  const size_t nb = (V + kDrawBlock - 1) / kDrawBlock;
  sums.resize(nb);
  block_sums(w.data(), V, kDrawBlock, sums.data());
  double total = 0.0;
  for (double s : sums) total += s;
  u *= total;
  for (size_t b = 0; b < nb; ++b) {
    if (u >= sums[b] && b + 1 < nb) {
      u -= sums[b];
      continue;
    }
    // Within the block (summed in another order, so u may run past its end by rounding: then
    // the next block continues).
    for (size_t i = b * kDrawBlock; i < std::min(V, b * kDrawBlock + kDrawBlock); ++i) {
      u -= w[i];
      if (u < 0.0 && w[i] > 0.0f) return int32_t(i);
    }
  }
  return argmax_id;
}

void apply_token_mask(std::span<float> logits, std::span<const uint64_t> allowed) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 64 < logits.size(); ++w) {
    const size_t base = w * 64, end = std::min(logits.size(), base + 64);
    const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
    if (bits == 0) {
      std::fill(logits.begin() + long(base), logits.begin() + long(end), ninf);
      continue;
    }
    for (uint64_t off = ~bits; off; off &= off - 1) {  // the disallowed ones only
      const size_t i = base + size_t(__builtin_ctzll(off));
      if (i < end) logits[i] = ninf;
    }
  }
}

void apply_draw_penalties(std::span<float> logits, std::span<const DrawPenalty> pen, float repetition) {
  const int64_t n = int64_t(logits.size());
  for (const DrawPenalty& p : pen) {
    if (p.id < 0 || p.id >= n) continue;
    float& l = logits[size_t(p.id)];
    if (p.flags & kPenaltyRepeat) l = l > 0 ? l / repetition : l * repetition;
    if (p.flags & kPenaltySubtract) l = l - p.sub;
  }
}

int32_t draw_filtered(std::span<const float> logits, int32_t argmax_id, float inv_t, const DrawCuts& cuts, double u,
                      std::vector<float>& w, std::vector<uint64_t>& keys) {
  const size_t V = logits.size();
  w.resize(V);
  softmax_weights(logits, logits[size_t(argmax_id)], inv_t, -40.0f, w.data());
  keys.clear();
  for (size_t i = 0; i < V; ++i)
    if (w[i] > 0.0f) keys.push_back(draw_key(logits[i], int32_t(i)));
  if (keys.empty()) return argmax_id;
  const auto best_first = std::greater<uint64_t>();
  if (cuts.top_k > 0 && size_t(cuts.top_k) < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + (cuts.top_k - 1), keys.end(), best_first);
    keys.resize(size_t(cuts.top_k));
  }
  auto weight = [&](uint64_t key) { return w[size_t(draw_key_id(key))]; };
  if (cuts.min_p > 0.0f)
    keys.erase(std::remove_if(keys.begin(), keys.end(), [&](uint64_t k) { return !(weight(k) >= cuts.min_p); }),
               keys.end());
  std::sort(keys.begin(), keys.end(), best_first);
  size_t n = keys.size();
  DrawU128 total = 0;
  for (uint64_t k : keys) total += draw_fixed(weight(k));
  if (cuts.top_p < 1.0f) {
    const DrawU128 need = draw_top_p_need(cuts.top_p, total);
    DrawU128 cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += draw_fixed(weight(keys[i]));
      if (cum >= need) {
        n = i + 1;
        break;
      }
    }
    total = cum;
  }
  const DrawU128 target = draw_walk_target(u, total);
  DrawU128 cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += draw_fixed(weight(keys[i]));
    if (cum > target) return draw_key_id(keys[i]);
  }
  return draw_key_id(keys[n - 1]);  // not reached: target < total
}

}  // namespace lily
