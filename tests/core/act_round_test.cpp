// round_act (core/act_round.h), the rounding of GEMM activations every CUDA path shares, against its
// definition written out with frexp/nearbyint (11 significant bits, ties to even, any exponent): random
// values over the whole fp32 range, exact ties both ways, carries into the next binade, signs, zeros,
// inf and NaN; and that fp16's range gives the same values as a float → half → float round trip would
// (spot values whose fp16 encoding is known). Then cpu::qmatmul's rounding mode (the reference the CUDA
// op tables use): q·x takes the rounded x and the bias term the unrounded Σx, so it equals a plain
// qmatmul of the rounded x plus bias·(Σx − Σround(x)) per group; off by default.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ref_ops.h"
#include "core/act_round.h"

namespace lily {
namespace {

float round_def(float x) {
  if (!std::isfinite(x) || x == 0.f) return x;
  int e = 0;
  const double m = std::frexp(double(x), &e);  // x = m·2^e, |m| in [0.5, 1)
  const double q = std::nearbyint(std::ldexp(m, 11));  // 11 significant bits, ties to even (default mode)
  return float(std::ldexp(q, e - 11));
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(ActRound, MatchesDefinition) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any;
  int n = 0;
  while (n < 200000) {
    uint32_t u = any(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f) || std::fabs(f) > 1e38f || (f != 0.f && std::fabs(f) < 1e-37f)) continue;
    ASSERT_EQ(bits_of(round_act(f)), bits_of(round_def(f))) << "x = " << f;
    ++n;
  }
}

TEST(ActRound, TiesCarriesAndSpecials) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even → 1; 1 + 3·2^-11 → 1 + 2^-9.
  EXPECT_EQ(round_act(1.f + std::ldexp(1.f, -11)), 1.f);
  EXPECT_EQ(round_act(1.f + 3 * std::ldexp(1.f, -11)), 1.f + std::ldexp(1.f, -9));
  EXPECT_EQ(round_act(-(1.f + std::ldexp(1.f, -11))), -1.f);
  // Just above the tie rounds up.
  EXPECT_EQ(round_act(1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -23)), 1.f + std::ldexp(1.f, -10));
  // The largest 11-bit mantissa below 2 carries into 2.
  EXPECT_EQ(round_act(2.f - std::ldexp(1.f, -12)), 2.f);
  // Values with 11 or fewer significant bits are unchanged.
  for (float v : {0.f, -0.f, 1.f, -3.f, 1024.f, 2047.f, 65504.f, 0.099975586f, std::ldexp(1.f, -30)})
    EXPECT_EQ(bits_of(round_act(v)), bits_of(v)) << v;
  EXPECT_TRUE(std::isinf(round_act(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(round_act(std::numeric_limits<float>::quiet_NaN())));
  // fp16's own values (encodings 0x2E66 = 0.099975586, 0x3555 = 0.33325195): what half(x) gives.
  EXPECT_EQ(round_act(0.1f), 0.099975586f);
  EXPECT_EQ(round_act(1.f / 3.f), 0.33325195f);
  EXPECT_EQ(round_act(3.14159265f), 3.140625f);
}

// A 4-bit weight of `rows` × K with codes, scales and biases from rng (group 64).
struct W4 {
  std::vector<uint32_t> codes;
  std::vector<bf16> sc, bi;
  QWeight w;
  W4(int rows, int K, std::mt19937& rng) : codes(size_t(rows) * K / 8), sc(size_t(rows) * K / 64), bi(sc.size()) {
    std::uniform_int_distribution<uint32_t> any;
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& c : codes) c = any(rng);
    for (auto& s : sc) s = f32_to_bf16(nd(rng));
    for (auto& b : bi) b = f32_to_bf16(nd(rng));
    w.codes = codes.data(), w.scales = sc.data(), w.biases = bi.data(), w.rows = rows, w.cols = K, w.bits = 4;
  }
};

TEST(ActRound, ReferenceQmatmulRoundsProductsOnly) {
  std::mt19937 rng(9);
  const int rows = 24, K = 256, M = 3;
  W4 W(rows, K, rng);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(M) * K), xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng), xr[i] = round_act(x[i]);
  std::vector<float> y_plain(size_t(M) * rows), y_round(y_plain.size()), y_pre(y_plain.size());
  ASSERT_FALSE(cpu::round_gemm_inputs()) << "the reference must stay fp32 by default";
  cpu::qmatmul(W.w, x.data(), M, K, y_plain.data(), rows, false);
  cpu::qmatmul(W.w, xr.data(), M, K, y_pre.data(), rows, false);
  cpu::set_round_gemm_inputs(true);
  cpu::qmatmul(W.w, x.data(), M, K, y_round.data(), rows, false);
  cpu::set_round_gemm_inputs(false);
  double worst = 0, moved = 0;
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < rows; ++r) {
      // Expected: the pre-rounded product plus each group's bias times the rounding of its Σx.
      double want = y_pre[size_t(m) * rows + r];
      for (int g = 0; g < K / 64; ++g) {
        double d = 0;
        for (int c = g * 64; c < (g + 1) * 64; ++c) d += double(x[size_t(m) * K + c]) - double(xr[size_t(m) * K + c]);
        want += double(bf16_to_f32(W.bi[size_t(r) * (K / 64) + g])) * d;
      }
      worst = std::max(worst, std::fabs(double(y_round[size_t(m) * rows + r]) - want));
      moved = std::max(moved, std::fabs(double(y_round[size_t(m) * rows + r]) - double(y_plain[size_t(m) * rows + r])));
    }
  EXPECT_LT(worst, 1e-5) << "rounded-mode qmatmul is not q·round(x) + b·Σx";
  EXPECT_GT(moved, 1e-6) << "the rounding mode changed nothing";
}

}  // namespace
}  // namespace lily
