// The chunked (WY) DeltaNet form must equal the recurrent form: same outputs and final state,
// across chunk boundaries and from a non-zero initial state.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/ref_ops.h"

namespace lily::cpu {
namespace {

struct GdnInputs {
  std::vector<float> q, k, v, g, beta, S0;
};

GdnInputs make_inputs(const GdnDims& d, int M, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  std::uniform_real_distribution<float> u01(0, 1);
  GdnInputs in;
  auto unit = [&](std::vector<float>& x, int heads, int dim, float scale) {
    x.resize(size_t(M) * heads * dim);
    for (int t = 0; t < M * heads; ++t) {
      float ss = 0;
      for (int i = 0; i < dim; ++i) ss += (x[t * dim + i] = n01(rng)) * x[t * dim + i];
      for (int i = 0; i < dim; ++i) x[t * dim + i] *= scale / std::sqrt(ss);
    }
  };
  unit(in.q, d.n_k_heads, d.dk, 1.0f / std::sqrt(float(d.dk)));
  unit(in.k, d.n_k_heads, d.dk, 1.0f);
  in.v.resize(size_t(M) * d.n_v_heads * d.dv);
  for (auto& x : in.v) x = n01(rng);
  in.g.resize(size_t(M) * d.n_v_heads);
  in.beta.resize(in.g.size());
  for (auto& x : in.g) x = -0.5f * u01(rng);
  for (auto& x : in.beta) x = u01(rng);
  in.S0.resize(size_t(d.n_v_heads) * d.dk * d.dv);
  for (auto& x : in.S0) x = 0.1f * n01(rng);
  return in;
}

TEST(GdnReference, ChunkedEqualsRecurrent) {
  const GdnDims d{2, 4, 16, 8};
  for (int M : {1, 2, 7, 63, 64, 65, 130}) {
    for (bool zero_state : {true, false}) {
      GdnInputs in = make_inputs(d, M, 1234 + M);
      std::vector<float> S1 = in.S0, S2 = in.S0;
      if (zero_state) std::fill(S1.begin(), S1.end(), 0.0f), std::fill(S2.begin(), S2.end(), 0.0f);
      std::vector<float> o1(size_t(M) * d.n_v_heads * d.dv), o2(o1.size());
      gdn_recurrent(d, M, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S1.data(), o1.data());
      gdn_chunked(d, M, 64, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S2.data(), o2.data());
      for (size_t i = 0; i < o1.size(); ++i)
        ASSERT_NEAR(o1[i], o2[i], 1e-4f + 1e-4f * std::fabs(o1[i])) << "M=" << M << " out index " << i;
      for (size_t i = 0; i < S1.size(); ++i)
        ASSERT_NEAR(S1[i], S2[i], 1e-4f + 1e-4f * std::fabs(S1[i])) << "M=" << M << " state index " << i;
    }
  }
}

TEST(GdnReference, ChunkSizeDoesNotMatter) {
  const GdnDims d{1, 2, 8, 8};
  const int M = 100;
  GdnInputs in = make_inputs(d, M, 7);
  std::vector<float> S1 = in.S0, S2 = in.S0, o1(size_t(M) * d.n_v_heads * d.dv), o2(o1.size());
  gdn_chunked(d, M, 64, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S1.data(), o1.data());
  gdn_chunked(d, M, 16, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), S2.data(), o2.data());
  for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-4f + 1e-4f * std::fabs(o1[i])) << i;
}

}  // namespace
}  // namespace lily::cpu
