// The fast DeltaNet prefill (fast_gdn.h) against the scalar sequential reference
// (ref_ops::gdn_recurrent, conv_silu, the gated norm formula of model-spec §1.4.2), on every
// instruction set this CPU runs, at lengths around the chunk boundaries (1, 2, 63, 64, 65, 127, 128,
// 129, 300), from a zero and a non-zero state, and continuing a prefill from the state it left.
// Stated tolerances (fp32, different summation order and the WY algebra):
//   chunked DeltaNet outputs and state: |Δ| ≤ 2e-5·(1 + |ref|) (measured 1.9e-6, printed);
//   conv + SiLU, gated norm, SwiGLU, RMSNorm: |Δ| ≤ 2e-6·(1 + |ref|) (vector expf within a few ulp);
//   attention of a query group: |Δ| ≤ 1e-5·(1 + |ref|) (fp32 dot products of head_dim terms).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cpu/fast_gdn.h"
#include "backend/cpu/fast_ops.h"
#include "backend/cpu/ref_ops.h"
#include "gdn_inputs.h"

namespace lily::cpu::fast {
namespace {

// max |a − b| / (1 + |b|) over the arrays.
float max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / (1.0f + std::fabs(b[i])));
  return m;
}

// The kernels' contract is fp32 storage (bf16 storage takes the reference paths): pin it, whatever
// LILY_CPU_STORAGE says, and restore it afterwards.
class FastGdn : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    bf16_ = bf16_storage();
    set_bf16_storage(false);
    ASSERT_TRUE(select_isa(GetParam())) << GetParam();
  }
  void TearDown() override {
    select_isa(available_isas().front());
    set_bf16_storage(bf16_);
  }
  bool bf16_ = false;
};

// Real head dims (128), 2 key heads x 2 value heads each.
const GdnDims kDims{2, 4, 128, 128};
constexpr float kTol = 2e-5f;

TEST_P(FastGdn, ChunkedMatchesRecurrentAcrossChunkBoundaries) {
  float worst = 0;
  for (float g_min : {-0.5f, -8.0f})
    for (int M : {1, 2, 63, 64, 65, 127, 128, 129, 300})
      for (bool zero_state : {true, false}) {
        SCOPED_TRACE(fmt::format("M {} zero_state {} g_min {}", M, zero_state, g_min));
        const GdnInputs in = make_inputs(kDims, M, 100 + M, g_min, zero_state);
        std::vector<float> S1 = in.S0, S2 = in.S0, o1(size_t(M) * kDims.n_v_heads * kDims.dv), o2(o1.size(), -1.0f);
        gdn_recurrent(kDims, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S1.data(), o1.data());
        fast::gdn_chunked(kDims, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S2.data(),
                          o2.data());
        const float eo = max_rel(o2, o1), es = max_rel(S2, S1);
        worst = std::max({worst, eo, es});
        ASSERT_LE(eo, kTol) << "outputs";
        ASSERT_LE(es, kTol) << "state";
      }
  fmt::print("[cpu-gdn] {}: chunked vs recurrent, max |Δ|/(1+|ref|) = {:.2e}\n", GetParam(), worst);
}

// A prefill that continues from the state (and conv window) an earlier prefill left.
TEST_P(FastGdn, ChunkedContinuesFromState) {
  const int M1 = 100, M2 = 65, M = M1 + M2;
  const GdnInputs in = make_inputs(kDims, M, 7, -1.0f, false);
  std::vector<float> S1 = in.S0, S2 = in.S0, o1(size_t(M) * kDims.n_v_heads * kDims.dv), o2(o1.size(), -1.0f);
  gdn_recurrent(kDims, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S1.data(), o1.data());
  const size_t qk = size_t(kDims.n_k_heads) * kDims.dk, vv = size_t(kDims.n_v_heads) * kDims.dv, gg = kDims.n_v_heads;
  fast::gdn_chunked(kDims, M1, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S2.data(), o2.data());
  fast::gdn_chunked(kDims, M2, in.q.data() + M1 * qk, in.k.data() + M1 * qk, in.v.data() + M1 * vv, in.g.data() + M1 * gg,
                    in.beta.data() + M1 * gg, S2.data(), o2.data() + M1 * vv);
  EXPECT_LE(max_rel(o2, o1), kTol);
  EXPECT_LE(max_rel(S2, S1), kTol);
}

// Value heads per key head other than 2, and dims of 64.
TEST_P(FastGdn, ChunkedOtherShapes) {
  for (const GdnDims d : {GdnDims{1, 3, 64, 128}, GdnDims{2, 2, 128, 64}, GdnDims{1, 1, 64, 64}}) {
    SCOPED_TRACE(fmt::format("dims {} {} {} {}", d.n_k_heads, d.n_v_heads, d.dk, d.dv));
    ASSERT_TRUE(gdn_chunked_ok(d));
    const int M = 97;
    const GdnInputs in = make_inputs(d, M, 3, -2.0f, false);
    std::vector<float> S1 = in.S0, S2 = in.S0, o1(size_t(M) * d.n_v_heads * d.dv), o2(o1.size(), -1.0f);
    gdn_recurrent(d, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S1.data(), o1.data());
    fast::gdn_chunked(d, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S2.data(), o2.data());
    EXPECT_LE(max_rel(o2, o1), kTol);
    EXPECT_LE(max_rel(S2, S1), kTol);
  }
  EXPECT_FALSE(gdn_chunked_ok(GdnDims{2, 4, 16, 8}));
}

TEST_P(FastGdn, Conv4SiluMatchesReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0, 1);
  for (int C : {200, 8192}) {
    std::vector<bf16> w(size_t(C) * 4);
    for (auto& x : w) x = f32_to_bf16(0.5f * n01(rng));
    std::vector<float> win1(size_t(C) * 3), win2;
    for (auto& x : win1) x = n01(rng);
    win2 = win1;
    for (int M : {1, 1, 5, 1, 70}) {  // calls in a row: the window carries over (one token: the decode path)
      SCOPED_TRACE(fmt::format("C {} M {}", C, M));
      const int ldu = C + 32;
      std::vector<float> u(size_t(M) * ldu);
      for (auto& x : u) x = 3.0f * n01(rng);
      std::vector<float> o1(size_t(M) * C), o2(o1.size(), -1.0f);
      conv_silu(u.data(), M, ldu, C, 4, w.data(), win1.data(), o1.data());
      fast::conv4_silu(u.data(), M, ldu, C, w.data(), win2.data(), o2.data());
      ASSERT_LE(max_rel(o2, o1), 2e-6f);
      ASSERT_EQ(win1, win2);
    }
  }
}

TEST_P(FastGdn, GatedNormMatchesFormula) {
  std::mt19937 rng(9);
  std::normal_distribution<float> n01(0, 1);
  const int rows = 131, dv = 128;
  std::vector<float> o(size_t(rows) * dv), z(o.size());
  std::vector<bf16> w(dv);
  for (auto& x : o) x = n01(rng);
  for (auto& x : z) x = 4.0f * n01(rng);
  for (auto& x : w) x = f32_to_bf16(1.0f + 0.3f * n01(rng));
  std::vector<float> ref(o.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int d = 0; d < dv; ++d) ss += double(o[size_t(r) * dv + d]) * o[size_t(r) * dv + d];
    const double inv = 1.0 / std::sqrt(ss / dv + 1e-6);
    for (int d = 0; d < dv; ++d) {
      const double zz = z[size_t(r) * dv + d];
      ref[size_t(r) * dv + d] = float(bf16_to_f32(w[d]) * o[size_t(r) * dv + d] * inv * zz / (1.0 + std::exp(-zz)));
    }
  }
  fast::gated_norm(o.data(), z.data(), w.data(), rows, dv, 1e-6f);
  EXPECT_LE(max_rel(o, ref), 2e-6f);
}

TEST_P(FastGdn, SiluMulMatchesFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n01(0, 1);
  const size_t n = 40000 + 3;  // several pool items and a tail past a multiple of 16
  std::vector<float> g(n), u(n), ref(n);
  for (auto& x : g) x = 6.0f * n01(rng);
  for (auto& x : u) x = n01(rng);
  for (size_t i = 0; i < n; ++i) ref[i] = float(double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i]);
  fast::silu_mul(g.data(), u.data(), n);
  EXPECT_LE(max_rel(g, ref), 2e-6f);
}

TEST_P(FastGdn, RmsnormMatchesReference) {
  std::mt19937 rng(13);
  std::normal_distribution<float> n01(0, 1);
  for (int n : {2048, 200}) {  // 200: not a multiple of 16, the reference path
    const int M = 37;
    std::vector<float> x(size_t(M) * n), o1(x.size()), o2(x.size(), -1.0f);
    std::vector<bf16> gain(static_cast<size_t>(n));
    for (auto& v : x) v = 3.0f * n01(rng);
    for (auto& v : gain) v = f32_to_bf16(1.0f + 0.2f * n01(rng));
    rmsnorm(x.data(), M, n, gain.data(), 1e-6f, o1.data());
    fast::rmsnorm(x.data(), M, n, gain.data(), 1e-6f, o2.data());
    EXPECT_LE(max_rel(o2, o1), 2e-6f) << "n " << n;
  }
}

// The attention of one query row for a group of query heads sharing a KV head (KernelTable::attend) against
// softmax attention in double: G 1-8 (3: a partial block of four), head dims 16 / 24 / 64 / 256 (16: P·V row by
// row, not the GEMM; 24: plain loops where the width is 16), 1-300 positions, K/V rows strided as in the cache. |Δ| ≤ 1e-5·(1 + |ref|): the scores
// are fp32 dot products of hd terms (|q_c·k_c| up to ~10 here), one chain in the scalar table (measured
// 2.3e-6 there at hd 256, printed), W chains in the vector ones.
TEST_P(FastGdn, AttendMatchesSoftmaxAttention) {
  std::mt19937 rng(17);
  std::normal_distribution<float> n01(0, 1);
  float worst = 0;
  for (int G : {1, 3, 8})
    for (int hd : {16, 24, 64, 256})
      for (int n : {1, 5, 17, 300}) {
        const int ld = 2 * hd;  // two KV heads a position; this one is the second
        std::vector<float> q(size_t(G) * hd), kv(size_t(n) * ld * 2), out(size_t(G) * hd, -1.0f), ref(out.size());
        std::vector<float> p(size_t(G) * n);
        for (auto& x : q) x = n01(rng);
        for (auto& x : kv) x = 2.0f * n01(rng);
        const float* k = kv.data() + hd;
        const float* v = kv.data() + size_t(n) * ld + hd;
        const float scale = 1.0f / std::sqrt(float(hd));
        for (int g = 0; g < G; ++g) {
          std::vector<double> s(static_cast<size_t>(n));
          double mx = -1e300, sum = 0;
          for (int t = 0; t < n; ++t) {
            double d = 0;
            for (int c = 0; c < hd; ++c) d += double(q[size_t(g) * hd + c]) * k[size_t(t) * ld + c];
            s[size_t(t)] = d * scale;
            mx = std::max(mx, s[size_t(t)]);
          }
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (int c = 0; c < hd; ++c) {
            double o = 0;
            for (int t = 0; t < n; ++t) o += s[size_t(t)] / sum * v[size_t(t) * ld + c];
            ref[size_t(g) * hd + c] = float(o);
          }
        }
        kernels().attend(q.data(), G, hd, k, v, ld, n, scale, p.data(), out.data());
        const float err = max_rel(out, ref);
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-5f) << fmt::format("G {} hd {} n {}", G, hd, n);
      }
  std::printf("attend (%s): max |d|/(1+|ref|) %.3g\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Isa, FastGdn, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace lily::cpu::fast
