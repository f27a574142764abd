// Every fast CPU kernel against the reference ops (ref_ops.h) on seeded random inputs, on every
// instruction set this CPU can run (scalar, AVX2, AVX-512 VNNI), real and edge shapes.
// Stated tolerances:
//   4-bit matmul: the analytic bound of the two-term int16 activation form, Σ_g |s_g|·Σ_c q_c·max|x_g|/(32767·131068),
//                 plus 1e-5 of Σ|terms| for fp32 summation order;
//   8-bit matmul, dot, axpy: 1e-5 of Σ|terms| (fp32 order only);
//   DeltaNet step: 1e-4·(1 + |ref|) on outputs and state after 40 steps.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cpu/fast_ops.h"
#include "backend/cpu/ref_ops.h"

namespace lily::cpu::fast {
namespace {

// A random MLX affine weight that owns its storage.
struct RandQ {
  std::vector<uint32_t> codes;
  std::vector<bf16> scales, biases;
  QWeight w;
  RandQ(int rows, int cols, int bits, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> u32;
    std::normal_distribution<float> n01(0, 1);
    w.rows = rows, w.cols = cols, w.bits = bits, w.group_size = 64;
    codes.resize(size_t(rows) * w.words_per_row());
    for (auto& c : codes) c = u32(rng);
    scales.resize(size_t(rows) * w.groups_per_row());
    biases.resize(scales.size());
    for (auto& s : scales) s = f32_to_bf16(0.02f * n01(rng));
    for (auto& b : biases) b = f32_to_bf16(0.05f * n01(rng));
    w.codes = codes.data(), w.scales = scales.data(), w.biases = biases.data();
  }
};

std::vector<float> rand_x(int M, int K, uint32_t seed, bool edges) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0, 1);
  std::vector<float> x(size_t(M) * K);
  for (auto& v : x) v = n01(rng);
  if (edges && K >= 128) {
    for (int m = 0; m < M; ++m) {
      std::fill(&x[size_t(m) * K], &x[size_t(m) * K + 64], 0.0f);  // an all-zero group (dx = 0)
      x[size_t(m) * K + 64 + (m % 64)] = 3000.0f;                    // an outlier dominating its group
      x[size_t(m) * K + 65] = -1e-7f;
    }
  }
  return x;
}

// Per (m, r): Σ|terms| and the int16-step bound of the 4-bit path.
void bounds(const QWeight& w, const float* x, int M, std::vector<float>& mag, std::vector<float>& qbound) {
  const int G = w.groups_per_row();
  mag.assign(size_t(M) * w.rows, 0.0f);
  qbound.assign(mag.size(), 0.0f);
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < w.rows; ++r)
      for (int g = 0; g < G; ++g) {
        const float s = std::fabs(bf16_to_f32(w.scales[size_t(r) * G + g]));
        const float b = std::fabs(bf16_to_f32(w.biases[size_t(r) * G + g]));
        float mx = 0, qs = 0, t = 0, xs = 0;
        for (int c = g * 64; c < (g + 1) * 64; ++c) {
          const float xv = x[size_t(m) * w.cols + c];
          mx = std::max(mx, std::fabs(xv));
          qs += float(w.code(r, c));
          t += float(w.code(r, c)) * std::fabs(xv);
          xs += std::fabs(xv);
        }
        mag[size_t(m) * w.rows + r] += s * t + b * xs;
        qbound[size_t(m) * w.rows + r] += s * qs * mx / (32767.0f * 131068.0f);
      }
}

class FastKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(select_isa(GetParam())) << GetParam(); }
  void TearDown() override { select_isa(available_isas().front()); }
};

// y = W x through run_qjobs with a gather of activation rows, vs ref qmatmul on the gathered rows.
// gemm: the job carries no PreparedX, so 4-bit weights take the fp32 GEMM (fast_gemm.h).
void check_matmul(int rows, int K, int bits, int M, bool gather, bool edges, uint32_t seed, bool gemm = false) {
  SCOPED_TRACE(fmt::format("rows {} K {} bits {} M {} gather {} edges {} gemm {}", rows, K, bits, M, gather, edges, gemm));
  RandQ q(rows, K, bits, seed);
  const int Mx = gather ? M + 3 : M;  // the source holds more rows than are read
  std::vector<float> xsrc = rand_x(Mx, K, seed + 1, edges);
  std::vector<int32_t> ids(M);
  std::iota(ids.begin(), ids.end(), 0);
  if (gather)
    for (int i = 0; i < M; ++i) ids[i] = (Mx - 1 - i * 2 + 4 * Mx) % Mx;
  std::vector<float> xg(size_t(M) * K);
  for (int i = 0; i < M; ++i) std::copy_n(&xsrc[size_t(ids[i]) * K], K, &xg[size_t(i) * K]);
  std::vector<float> ref(size_t(M) * rows), got(size_t(M) * rows, NAN);
  qmatmul(q.w, xg.data(), M, K, ref.data(), rows, false);
  PreparedX px;
  prepare_x(xsrc.data(), Mx, K, K, px);
  QJob j;
  j.w = &q.w, j.x = gemm ? nullptr : &px, j.xf = xsrc.data(), j.ldxf = K, j.ids = ids.data(), j.n = M, j.y = got.data(), j.ldy = rows;
  run_qjobs({&j, 1});
  std::vector<float> mag, qb;
  bounds(q.w, xg.data(), M, mag, qb);
  for (size_t i = 0; i < ref.size(); ++i) {
    const float tol = (bits == 4 && !gemm ? 1.01f * qb[i] : 0.0f) + 1e-5f * mag[i] + 1e-6f;
    ASSERT_NEAR(got[i], ref[i], tol) << "first bad index " << i << " (token " << i / rows << ", row " << i % rows << ")";
  }
}

TEST_P(FastKernels, Q4MatmulRealShapes) {
  check_matmul(8192, 2048, 4, 1, false, false, 1);   // in_proj_qkv / q_proj, decode
  check_matmul(2048, 4096, 4, 1, false, false, 2);   // out_proj / o_proj
  check_matmul(512, 2048, 4, 9, true, false, 3);     // expert gate/up, gathered tokens
  check_matmul(2048, 512, 4, 5, false, false, 4);    // expert down
  check_matmul(256, 2048, 4, 70, false, true, 5);    // prefill tile, past the 64-token block
}

TEST_P(FastKernels, Q4MatmulEdgeShapes) {
  for (int rows : {1, 2, 3, 5, 17, 33})
    for (int K : {64, 128, 320})
      for (int M : {1, 2, 3, 4, 5, 8})
        check_matmul(rows, K, 4, M, M > 2, K >= 128, uint32_t(rows * 100 + K + M));
}

// The prefill GEMM: fp32 activations, so only the fp32 summation order is allowed to differ.
TEST_P(FastKernels, Q4GemmRealShapes) {
  check_matmul(8192, 2048, 4, 37, false, true, 21, true);  // in_proj_qkv, prefill (3 token blocks + a remainder)
  check_matmul(2048, 4096, 4, 13, false, false, 22, true); // out_proj
  check_matmul(512, 2048, 4, 9, true, false, 23, true);    // expert gate/up, gathered tokens
  check_matmul(2048, 512, 4, 25, true, true, 24, true);    // expert down
  check_matmul(32, 2048, 4, 256, false, false, 25, true);  // in_proj_a/b at a 256-token prefill
}

// Few-token jobs (the routed experts) take the thin AVX-512 kernel (≤ 12 tokens):
// k blocks of 512 with parked partial sums (K = 576, 2048), row pairs and 32-row groups with tails.
TEST_P(FastKernels, Q4GemmThinShapes) {
  for (int rows : {1, 33, 70})
    for (int K : {576, 2048})
      for (int M : {1, 3, 8, 10, 12})
        check_matmul(rows, K, 4, M, M > 2, true, uint32_t(rows * 1000 + K + M), true);
}

TEST_P(FastKernels, Q4GemmEdgeShapes) {
  for (int rows : {1, 2, 3, 5, 15, 16, 17, 31, 33, 47, 64})
    for (int K : {64, 128, 320})
      for (int M : {1, 2, 3, 5, 6, 7, 11, 12, 13, 25})
        check_matmul(rows, K, 4, M, M > 2, K >= 128, uint32_t(rows * 100 + K + M), true);
}

TEST_P(FastKernels, Q8Matmul) {
  check_matmul(256, 2048, 8, 1, false, false, 11);  // router
  check_matmul(1, 2048, 8, 3, true, false, 12);     // shared_expert_gate
  for (int rows : {1, 7, 40})
    for (int K : {64, 320})
      for (int M : {1, 4}) check_matmul(rows, K, 8, M, true, true, uint32_t(rows + K + M));
}

TEST_P(FastKernels, DotAndAxpy) {
  const KernelTable& k = kernels();
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0, 1);
  for (int n : {0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 256}) {
    std::vector<float> a(n), b(n), y(n), y2;
    for (int i = 0; i < n; ++i) a[i] = n01(rng), b[i] = n01(rng), y[i] = n01(rng);
    double ref = 0, mag = 0;
    for (int i = 0; i < n; ++i) ref += double(a[i]) * b[i], mag += std::fabs(double(a[i]) * b[i]);
    EXPECT_NEAR(k.dot(a.data(), b.data(), n), ref, 1e-5 * mag + 1e-6) << "n " << n;
    y2 = y;
    k.axpy(y.data(), 0.75f, a.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(y[i], y2[i] + 0.75f * a[i], 1e-5f * (std::fabs(y2[i]) + std::fabs(a[i]))) << n;
  }
}

// gdn_step per head and token against ref gdn_recurrent: outputs each step and the final state.
TEST_P(FastKernels, GdnStepMatchesRecurrent) {
  const KernelTable& k = kernels();
  for (GdnDims d : {GdnDims{2, 4, 128, 128}, GdnDims{1, 2, 32, 64}, GdnDims{1, 1, 16, 24}, GdnDims{2, 2, 8, 80}}) {
    SCOPED_TRACE(fmt::format("dk {} dv {}", d.dk, d.dv));
    const int M = 40;
    std::mt19937 rng(d.dk * 7 + d.dv);
    std::normal_distribution<float> n01(0, 1);
    std::uniform_real_distribution<float> u01(0, 1);
    auto unit = [&](int heads, int dim, float scale) {
      std::vector<float> x(size_t(M) * heads * dim);
      for (int t = 0; t < M * heads; ++t) {
        float ss = 0;
        for (int i = 0; i < dim; ++i) ss += (x[t * dim + i] = n01(rng)) * x[t * dim + i];
        for (int i = 0; i < dim; ++i) x[t * dim + i] *= scale / std::sqrt(ss);
      }
      return x;
    };
    auto q = unit(d.n_k_heads, d.dk, 1.0f / std::sqrt(float(d.dk))), kk = unit(d.n_k_heads, d.dk, 1.0f);
    std::vector<float> v(size_t(M) * d.n_v_heads * d.dv), g(size_t(M) * d.n_v_heads), beta(g.size());
    for (auto& x : v) x = n01(rng);
    for (auto& x : g) x = -0.5f * u01(rng);
    for (auto& x : beta) x = u01(rng);
    std::vector<float> S1(size_t(d.n_v_heads) * d.dk * d.dv);
    for (auto& x : S1) x = 0.1f * n01(rng);
    std::vector<float> S2 = S1, S0 = S1, o1(v.size()), o2(v.size());
    gdn_recurrent(d, M, q.data(), kk.data(), v.data(), g.data(), beta.data(), S1.data(), o1.data());
    const int ratio = d.n_v_heads / d.n_k_heads;
    for (int h = 0; h < d.n_v_heads; ++h)
      for (int t = 0; t < M; ++t)
        k.gdn_step(&S2[size_t(h) * d.dk * d.dv], &q[(size_t(t) * d.n_k_heads + h / ratio) * d.dk],
                   &kk[(size_t(t) * d.n_k_heads + h / ratio) * d.dk], &v[(size_t(t) * d.n_v_heads + h) * d.dv],
                   std::exp(g[size_t(t) * d.n_v_heads + h]), beta[size_t(t) * d.n_v_heads + h],
                   &o2[(size_t(t) * d.n_v_heads + h) * d.dv], d.dk, d.dv, d.dv);
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o2[i], o1[i], 1e-4f * (1 + std::fabs(o1[i]))) << "out " << i;
    for (size_t i = 0; i < S1.size(); ++i) ASSERT_NEAR(S2[i], S1[i], 1e-4f * (1 + std::fabs(S1[i]))) << "state " << i;
    // Column blocks (as the prefill runs them): each block of `cb` columns through all M tokens.
    for (int cb : {8, 16, d.dv / 2}) {
      if (cb <= 0 || d.dv % cb != 0) continue;
      std::vector<float> S3 = S0, o3(v.size());
      for (int h = 0; h < d.n_v_heads; ++h)
        for (int j0 = 0; j0 < d.dv; j0 += cb)
          for (int t = 0; t < M; ++t)
            k.gdn_step(&S3[size_t(h) * d.dk * d.dv + j0], &q[(size_t(t) * d.n_k_heads + h / ratio) * d.dk],
                       &kk[(size_t(t) * d.n_k_heads + h / ratio) * d.dk], &v[(size_t(t) * d.n_v_heads + h) * d.dv + j0],
                       std::exp(g[size_t(t) * d.n_v_heads + h]), beta[size_t(t) * d.n_v_heads + h],
                       &o3[(size_t(t) * d.n_v_heads + h) * d.dv + j0], d.dk, cb, d.dv);
      for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o3[i], o1[i], 1e-4f * (1 + std::fabs(o1[i]))) << "cb " << cb << " out " << i;
      for (size_t i = 0; i < S1.size(); ++i) ASSERT_NEAR(S3[i], S1[i], 1e-4f * (1 + std::fabs(S1[i]))) << "cb " << cb << " state " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, FastKernels, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(FastKernelsIsa, DetectionListsScalarLast) {
  const auto v = available_isas();
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.back(), "scalar");
  EXPECT_FALSE(select_isa("no-such-isa"));
  fmt::print("[cpu-fast] instruction sets on this CPU: {}\n", fmt::join(v, ", "));
}

}  // namespace
}  // namespace lily::cpu::fast
