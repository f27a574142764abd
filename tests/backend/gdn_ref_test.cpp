// The chunked (WY) DeltaNet form must equal the recurrent form: same outputs and final state,
// across chunk boundaries and from a non-zero initial state.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/ref_ops.h"
#include "gdn_inputs.h"

namespace lily::cpu {
namespace {

// g ∈ [−0.5, 0], a non-zero initial state.
GdnInputs make_inputs(const GdnDims& d, int M, uint32_t seed) { return make_inputs(d, M, seed, -0.5f, false); }

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
