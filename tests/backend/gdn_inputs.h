// Random DeltaNet inputs for the CPU DeltaNet tests (cpu_gdn_test, gdn_ref_test): one definition, so both
// draw the same values from a seed.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/ref_ops.h"

namespace lily::cpu {

struct GdnInputs {
  std::vector<float> q, k, v, g, beta, S0;
};

// q, k unit vectors (q scaled by dk^-½, as gdn_split_qkv leaves them), v ~ N(0,1),
// g ∈ [g_min, 0] (log decay), β ∈ (0, 1), S0 ~ 0.1·N(0,1) or zero.
inline GdnInputs make_inputs(const GdnDims& d, int M, uint32_t seed, float g_min, bool zero_state) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  std::uniform_real_distribution<float> u01(0, 1);
  GdnInputs in;
  auto unit = [&](std::vector<float>& x, int heads, int dim, float scale) {
    x.resize(size_t(M) * heads * dim);
    for (size_t t = 0; t < size_t(M) * heads; ++t) {
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
  for (auto& x : in.g) x = g_min * u01(rng);
  for (auto& x : in.beta) x = u01(rng);
  in.S0.assign(size_t(d.n_v_heads) * d.dk * d.dv, 0.0f);
  if (!zero_state)
    for (auto& x : in.S0) x = 0.1f * n01(rng);
  return in;
}
}  // namespace lily::cpu
