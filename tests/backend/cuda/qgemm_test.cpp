// qgemm and xpack16 (src/backend/cuda/gemm/qgemm.h) against a double-precision CPU reference computed
// from the same packed fp16 rows (the kernel's only rounding point besides its fp32 sums), on seeded
// random inputs: 4- and 8-bit, K with a half stage (5 groups), matrices with a partial last tile,
// split and unsplit k, rows on both sides of every tile height (1..130), every forced tile height,
// and the expert-major MoE (gate+up+SwiGLU packed for down, down per entry) on routings from broute, by
// qgemm and, where K allows, by xgemm (moe/xgemm.h) on fragment copies of the same experts (against the
// same reference, and equal to qgemm's outputs bit for bit).
// Tolerance per output: 1e-5 · Σ|terms| (fp32 sums over K ≤ 4096; a wrong k order or fragment is
// O(Σ|terms|)). Batch invariance: a row's outputs are bit-identical at every row count and tile
// height of one kernel (the mma.sync tiles, or the dense wgmma tile from qgemm_wg_rows(N, K) rows), and the
// two kernels agree within 1e-6 · Σ|terms|. One table row per check; skips loudly without a GPU. LILY_QGEMM_BENCH=1 adds timings.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef LILY_HAVE_CUDA
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/gemm/qgemm.h"
#include "backend/cuda/moe/xgemm.h"
#include "device_util.h"

namespace lily::testcuda {
namespace {

struct Packed {
  std::vector<uint16_t> X;  // [R][K]
  std::vector<float> XS;    // [R][K/64][2]
  int R = 0, K = 0;
  std::vector<double> xd;   // X (+ Xlo) decoded, in k order
  Packed(std::vector<uint16_t> X_, std::vector<float> XS_, int R_, int K_, const std::vector<uint16_t>* lo = nullptr)
      : X(std::move(X_)), XS(std::move(XS_)), R(R_), K(K_) {
    xd.resize(X.size());
    for (int r = 0; r < R; ++r)  // value k of a row sits at qgemm_xpos(k)
      for (int k = 0; k < K; ++k) {
        const size_t i = size_t(r) * K + cuda::qgemm_xpos(k);
        xd[size_t(r) * K + k] = double(f_of_half(X[i])) + (lo ? double(f_of_half((*lo)[i])) : 0.0);
      }
  }
  double x(int r, int k) const { return xd[size_t(r) * K + k]; }
  double sum(int r, int g) const { return XS[(size_t(r) * (K / 64) + g) * 2]; }
  double inv(int r, int g) const { return XS[(size_t(r) * (K / 64) + g) * 2 + 1]; }
};

// Packs x [R][K] on the device (hi + lo); checks the packing rule on the host (e, fp16 rounding of x·2^e
// and of the remainder, Σx).
Packed pack(const std::vector<float>& x, int R, int K, D<uint16_t>& dX, D<float>& dXS, int& bad, D<uint16_t>& dXlo) {
  D<float> dx(x);
  EXPECT_TRUE(cuda::xpack16(dx.p, K, K, R, dX.p, dXS.p, dXlo.p, nullptr).is_ok());
  const std::vector<uint16_t> lo = dXlo.get();
  Packed p{dX.get(), dXS.get(), R, K, &lo};
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < K / 64; ++g) {
      float m = 0.f;
      double s = 0, sa = 0;
      for (int k = 64 * g; k < 64 * g + 64; ++k) m = std::max(m, std::fabs(x[size_t(r) * K + k])), s += x[size_t(r) * K + k], sa += std::fabs(x[size_t(r) * K + k]);
      int E = 0;
      std::frexp(m, &E);
      const int e = m > 0.f ? 15 - E : 0;
      if (p.inv(r, g) != std::ldexp(1.0, -e) || std::fabs(p.sum(r, g) - s) > 1e-6 * sa + 1e-30) ++bad;
      for (int k = 64 * g; k < 64 * g + 64; ++k) {
        const double want = std::ldexp(double(x[size_t(r) * K + k]), e), got = p.x(r, k);
        // half an ulp at [2^14, 2^15) of the fp16 remainder
        if (std::fabs(got - want) > std::ldexp(1.0, 14 - 22) * 1.0001) ++bad;
      }
    }
  return p;
}

// Σ_g scale·2^-e·Σ q·x16 + bias·Σx for weight row wr and packed row pr; *abs: Σ|terms|.
double ref_dot(const QMat& w, int wr, const Packed& p, int pr, double* abs) {
  double y = 0, a = 0;
  for (int g = 0; g < w.cols / 64; ++g) {
    double d = 0, da = 0;
    for (int k = 64 * g; k < 64 * g + 64; ++k) {
      const double t = double(w.code(wr, k)) * p.x(pr, k);
      d += t, da += std::fabs(t);
    }
    const double s = double(w.scale(wr, g)) * p.inv(pr, g), b = w.bias(wr, g);
    y += s * d + b * p.sum(pr, g);
    a += std::fabs(s) * da + std::fabs(b * p.sum(pr, g));
  }
  *abs = a;
  return y;
}

void table(const char* op, const std::string& shape, const std::string& rows, double err, bool ok) {
  std::printf("[qgemm] | %s | %s | %s | max err/tol %.3g | %s |\n", op, shape.c_str(), rows.c_str(), err, ok ? "ok" : "FAIL");
}

struct DenseCase {
  int N, K, bits;
};

TEST(CudaQgemm, PackMatchesRule) {
  LILY_REQUIRE_GPU();
  for (int K : {64, 320, 2048}) {
    const int R = 7;
    auto x = randv(size_t(R) * K, 3.f);
    for (int k = 0; k < 64; ++k) x[k] *= 1e-6f;  // a group of tiny values
    for (int k = 64; k < 128 && k < K; ++k) x[size_t(K) + k] = 0.f;  // an all-zero group
    x[size_t(2) * K + 5] = 3e4f;  // one large value
    D<uint16_t> dX(size_t(R) * K), dXlo(size_t(R) * K);
    D<float> dXS(size_t(R) * K / 64 * 2);
    int bad = 0;
    pack(x, R, K, dX, dXS, bad, dXlo);
    table("xpack16", "K=" + std::to_string(K), "R=7 two-pass", bad, bad == 0);
    EXPECT_EQ(bad, 0) << "xpack16 differs from the packing rule at K=" << K;
  }
}

TEST(CudaQgemm, DenseMatchesCpuAndIsBatchInvariant) {
  LILY_REQUIRE_GPU();
  const DenseCase cases[] = {{300, 320, 4}, {640, 64, 4}, {2048, 4096, 4}, {257, 2048, 8}, {1000, 2048, 4}, {129, 192, 8}};
  const int Ms[] = {1, 5, 8, 9, 16, 17, 33, 64, 65, 128, 130};
  const int kMaxM = 130;
  for (const DenseCase& c : cases) {
    QMat w(c.N, c.K, c.bits);
    auto x = randv(size_t(kMaxM) * c.K);
    D<uint16_t> dX(size_t(kMaxM) * c.K), dXlo(size_t(kMaxM) * c.K);
    D<float> dXS(size_t(kMaxM) * c.K / 64 * 2);
    int bad = 0;
    const Packed p = pack(x, kMaxM, c.K, dX, dXS, bad, dXlo);
    ASSERT_EQ(bad, 0);
    // Reference for all rows.
    std::vector<double> ref(size_t(kMaxM) * c.N), tol(size_t(kMaxM) * c.N);
    for (int m = 0; m < kMaxM; ++m)
      for (int n = 0; n < c.N; ++n) {
        double a = 0;
        ref[size_t(m) * c.N + n] = ref_dot(w, n, p, m, &a);
        tol[size_t(m) * c.N + n] = 1e-5 * a + 1e-12;
      }
    D<float> ws(cuda::qgemm_ws_floats(c.N, c.K, kMaxM));
    D<int32_t> cnt(cuda::qgemm_counters(c.N, c.K, kMaxM));
    const std::string shape = std::to_string(c.N) + "x" + std::to_string(c.K) + " q" + std::to_string(c.bits) +
                              " split " + std::to_string(cuda::qgemm_splits(c.N, c.K)) + (" two-pass");
    auto run = [&](int M, int nt, int kernel = 0) {
      D<float> y(size_t(M) * c.N);
      cuda::QGemmArgs a{};
      a.w = w.q, a.x = dX.p, a.xs = dXS.p, a.xlo = dXlo.p, a.ldx = c.K, a.M = M, a.y = y.p,
      a.ldy = c.N, a.ws = ws.p, a.cnt = cnt.p, a.nt = nt, a.kernel = kernel;
      const Status st = cuda::qgemm(a, nullptr);
      EXPECT_TRUE(st.is_ok()) << st.message();
      if (!st.is_ok()) return std::vector<float>{};
      auto got = y.get();
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      return got;
    };
    // Every run must give these rows bit for bit: the mma.sync tiles' (forced tile heights, fewer rows
    // than qgemm_wg_rows(N, K), 8-bit) or the wgmma tile's (4-bit from qgemm_wg_rows(N, K) rows).
    const std::vector<float> base = run(kMaxM, 0, 1);
    const bool has_wg = c.bits == 4;
    const std::vector<float> base_wg = has_wg ? run(kMaxM, 0, 2) : base;
    if (has_wg) {  // the two kernels agree to fp32 rounding (their tensor-core sums group k differently)
      double worst = 0;
      for (size_t i = 0; i < base.size(); ++i) worst = std::max(worst, std::fabs(double(base_wg[i]) - base[i]) / (1e-6 * tol[i] / 1e-5));
      table("dense wgmma vs mma.sync", shape, "M=130", worst, worst <= 1.0);
      EXPECT_LE(worst, 1.0) << shape << ": the wgmma tile differs from the mma.sync tiles by more than 1e-6·Σ|terms|";
    }
    for (int nt : {0, 1, 2, 4, 8}) {
      for (int M : Ms) {
        if (nt != 0 && M != 9 && M != 64 && M != 130) continue;
        const bool wg = has_wg && nt == 0 && M >= cuda::qgemm_wg_rows(c.N, c.K);
        const std::vector<float>& want = wg ? base_wg : base;
        const auto got = run(M, nt);
        if (got.empty()) return;
        double worst = 0;
        size_t first = size_t(-1);
        float d = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double r = std::fabs(double(got[i]) - ref[i]) / tol[i];
          if (!(r <= 1.0) && first == size_t(-1)) first = i;
          worst = std::max(worst, r != r ? 1e30 : r);
          d = std::max(d, std::fabs(got[i] - want[i]));
        }
        const std::string rows = "M=" + std::to_string(M) + " nt=" + (nt ? std::to_string(nt) : "auto") + (wg ? " wgmma" : "");
        table("dense vs cpu", shape, rows, worst, first == size_t(-1));
        table("dense invariance", shape, rows, d, d == 0.f);
        EXPECT_EQ(first, size_t(-1)) << shape << " " << rows << ": first bad output row " << (first / c.N) << " col "
                                     << (first % c.N) << " got " << got[first] << " want " << ref[first];
        EXPECT_EQ(d, 0.f) << shape << " " << rows << ": rows differ from the same rows at M=130";
      }
    }
  }
}

// A routing of B rows over E experts (k distinct per row), as broute lays it out.
struct Routing {
  int B, k, E;
  std::vector<int32_t> ids;
  D<int32_t> dids, items, n_items, rowb, ent;
  Routing(int B_, int k_, int E_, int skew)
      : B(B_), k(k_), E(E_), ids(gen(B_, k_, E_, skew)), dids(ids), items(size_t(std::min(B_ * k_, E_) + 1) * 4),
        n_items(4), rowb(size_t(B_) * (k_ + 1)), ent(size_t(B_) * (k_ + 1)) {
    EXPECT_TRUE(cuda::broute(dids.p, B, k, E, items.p, n_items.p, rowb.p, ent.p, true, nullptr).is_ok());
  }
  // skew > 0: row b prefers experts 0..skew-1 (many rows per expert, as at large B).
  static std::vector<int32_t> gen(int B, int k, int E, int skew) {
    std::vector<int32_t> v;
    for (int b = 0; b < B; ++b) {
      std::vector<int32_t> row;
      while (int(row.size()) < k) {
        const int e = skew > 0 && rng()() % 2 ? int(rng()() % std::min(skew, E)) : int(rng()() % E);
        if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
      }
      v.insert(v.end(), row.begin(), row.end());
    }
    return v;
  }
  int expert(int entry) const { return entry < B * k ? ids[size_t(entry)] : E; }
  int row(int entry) const { return entry < B * k ? entry / k : entry - B * k; }
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }

struct MoeCase {
  int H, I, E, k;
};

TEST(CudaQgemm, MoeMatchesCpuAndIsBatchInvariant) {
  LILY_REQUIRE_GPU();
  const MoeCase cases[] = {{320, 128, 16, 4}, {256, 64, 8, 2}, {1024, 512, 32, 4}, {2048, 512, 256, 8}};
  for (const MoeCase& c : cases) {
    QMat gate(c.E * c.I, c.H, 4), up(c.E * c.I, c.H, 4), down(c.E * c.H, c.I, 4);
    QMat shgu(2 * c.I, c.H, 4), shd(c.H, c.I, 4);
    const int kMaxB = c.H >= 2048 ? 64 : 40;
    auto x = randv(size_t(kMaxB) * c.H);
    D<uint16_t> dX(size_t(kMaxB) * c.H), dXlo(size_t(kMaxB) * c.H);
    D<float> dXS(size_t(kMaxB) * c.H / 64 * 2);
    int bad = 0;
    const Packed p = pack(x, kMaxB, c.H, dX, dXS, bad, dXlo);
    ASSERT_EQ(bad, 0);
    const std::string shape = "H" + std::to_string(c.H) + " I" + std::to_string(c.I) + " E" + std::to_string(c.E) + " k" +
                              std::to_string(c.k) + (" two-pass");
    // xgemm (moe/xgemm.h) where K allows (gate+up K = H, down K = I, both multiples of 256): its fragment
    // copies of the experts, made once per case.
    const bool xcase = c.H % 256 == 0 && c.I % 256 == 0;
    cuda::FragExperts fx;
    D<uint8_t> fr(xcase ? cuda::frag_expert_bytes(c.E, c.I, c.H) : 1);
    if (xcase) {
      ASSERT_TRUE(cuda::frag_pack_experts(gate.q, up.q, shgu.q, down.q, shd.q, c.E, c.I, c.H, fr.p, &fx, nullptr).is_ok());
    }
    // Rows 0..2 keep their routing at every B (the routing's first rows are drawn first from a reset seed).
    std::vector<float> base_act, base_y;  // rows 0..2's entries at the first B
    for (int B : {3, 1, 17, kMaxB}) {
      for (int skew : {0, 4}) {
        if (skew && B != kMaxB) continue;
        rng().seed(99);
        Routing rt(B, c.k, c.E, skew);
        const int nent = B * c.k + B;
        // Reference act per entry (independent of the tile height).
        std::vector<double> ref_act(size_t(nent) * c.I);
        for (int en = 0; en < nent; ++en) {
          const int e = rt.expert(en), r = rt.row(en);
          const QMat& gw = e == c.E ? shgu : gate;
          const QMat& uw = e == c.E ? shgu : up;
          for (int o = 0; o < c.I; ++o) {
            double t;
            const double gv = ref_dot(gw, e == c.E ? o : e * c.I + o, p, r, &t);
            const double uv = ref_dot(uw, e == c.E ? c.I + o : e * c.I + o, p, r, &t);
            ref_act[size_t(en) * c.I + o] = silu(gv) * uv;
          }
        }
        std::vector<uint16_t> q_act;  // qgemm's packed act and y at nt = 0, for xgemm's exact check
        std::vector<float> q_y;
        for (int kern : {0, 1})
        for (int nt : {0, 1, 2, 4, 8}) {
          if (nt && B != kMaxB) continue;
          if (kern == 1 && (!xcase || nt > 4)) continue;
          D<uint16_t> act(size_t(nent) * c.I), actlo(size_t(nent) * c.I);
          D<float> acts(size_t(nent) * c.I / 64 * 2);
          D<float> y(size_t(nent) * c.H);
          cuda::QGemmArgs a{};
          a.w = gate.q, a.w2 = up.q, a.sh = shgu.q, a.x = dX.p, a.xs = dXS.p, a.ldx = c.H, a.swiglu = true, a.yx = act.p,
          a.yxs = acts.p, a.n_out = c.I, a.xlo = dXlo.p, a.yxlo = actlo.p, a.items = rt.items.p, a.n_items = rt.n_items.p, a.max_items = std::min(B * c.k, c.E) + 1,
          a.E = c.E, a.xrow = rt.rowb.p, a.yrow = rt.ent.p, a.ent_hint = B * c.k, a.nt = nt;
          if (kern == 1 && !cuda::xgemm_fits(a)) continue;
          Status st = kern == 0 ? cuda::qgemm(a, nullptr) : cuda::xgemm(a, fx.gu, fx.sgu, nullptr);
          ASSERT_TRUE(st.is_ok()) << st.message();
          cuda::QGemmArgs d = a;
          d.w = down.q, d.w2 = {}, d.sh = shd.q, d.x = act.p, d.xs = acts.p, d.ldx = c.I, d.swiglu = false, d.yx = nullptr,
          d.yxs = nullptr, d.yxlo = nullptr, d.xlo = actlo.p, d.y = y.p, d.ldy = c.H, d.n_out = c.H,
          d.xrow = rt.ent.p;
          st = kern == 0 ? cuda::qgemm(d, nullptr) : cuda::xgemm(d, fx.dn, fx.sdn, nullptr);
          ASSERT_TRUE(st.is_ok()) << st.message();
          const std::vector<uint16_t> lo_host = actlo.get();
          Packed pa{act.get(), acts.get(), nent, c.I, &lo_host};
          const auto gy = y.get();
          ASSERT_EQ(cudaGetLastError(), cudaSuccess);
          // gate+up+SwiGLU vs the reference, per entry and output (fp16 rounding of the packed act
          // dominates: half an ulp of the group's largest |act|, 2^-11 of it, with margin 2^-10).
          double worst_a = 0, worst_s = 0, worst_y = 0;
          int fails = 0;
          for (int en = 0; en < nent; ++en) {
            const int e = rt.expert(en);
            const double* av = &ref_act[size_t(en) * c.I];
            for (int g = 0; g < c.I / 64; ++g) {
              double gm = 0, s = 0, sa = 0;
              for (int o = 64 * g; o < 64 * g + 64; ++o) gm = std::max(gm, std::fabs(av[o])), s += av[o], sa += std::fabs(av[o]);
              const double ts = 1e-4 * sa + 1e-12;
              worst_s = std::max(worst_s, std::fabs(pa.sum(en, g) - s) / ts);
              fails += !(std::fabs(pa.sum(en, g) - s) <= ts);
              for (int o = 64 * g; o < 64 * g + 64; ++o) {
                // one pass: half an fp16 ulp of the group max, with margin; two passes: the remainder's
                const double got = pa.x(en, o) * pa.inv(en, g),
                             tol = std::ldexp(gm, -16) + 1e-5 * std::fabs(av[o]) + 1e-12;
                const double r2 = std::fabs(got - av[o]) / tol;
                worst_a = std::max(worst_a, r2 != r2 ? 1e30 : r2);
                fails += !(r2 <= 1.0);
              }
            }
            // down from the kernel's own packed act.
            const QMat& dw = e == c.E ? shd : down;
            for (int n = 0; n < c.H; ++n) {
              double t;
              const double want = ref_dot(dw, e == c.E ? n : e * c.H + n, pa, en, &t);
              const double r2 = std::fabs(double(gy[size_t(en) * c.H + n]) - want) / (1e-5 * t + 1e-12);
              worst_y = std::max(worst_y, r2 != r2 ? 1e30 : r2);
              fails += !(r2 <= 1.0);
            }
          }
          const std::string rows = std::string(kern ? "xgemm " : "") + "B=" + std::to_string(B) + (skew ? " skewed" : "") +
                                   " nt=" + (nt ? std::to_string(nt) : "auto");
          if (nt == 0 && kern == 0) q_act = pa.X, q_y = gy;
          if (nt == 0 && kern == 1) {  // the same arithmetic as qgemm's: equal bit for bit
            float dq = 0;
            for (size_t i = 0; i < q_y.size() && i < gy.size(); ++i) dq = std::max(dq, std::fabs(gy[i] - q_y[i]));
            const bool same = pa.X == q_act && dq == 0.f;
            table("moe xgemm = qgemm", shape, rows, dq, same);
            EXPECT_TRUE(same) << shape << " " << rows << ": xgemm differs from qgemm (y by " << dq << ")";
          }
          table("moe gate+up", shape, rows, std::max(worst_a, worst_s), worst_a <= 1 && worst_s <= 1);
          table("moe down", shape, rows, worst_y, worst_y <= 1);
          EXPECT_EQ(fails, 0) << shape << " " << rows;
          // Invariance: rows 0..2's entries (routed b·k + j, shared B·k + b) as at the first B.
          std::vector<float> ra, ry;
          for (int b = 0; b < std::min(B, 3); ++b)
            for (int j = 0; j <= c.k; ++j) {
              const int en = j < c.k ? b * c.k + j : B * c.k + b;
              for (int o = 0; o < c.I; ++o) ra.push_back(float(pa.x(en, o) * pa.inv(en, o / 64)));
              for (int n = 0; n < c.H; ++n) ry.push_back(gy[size_t(en) * c.H + n]);
            }
          if (base_act.empty()) base_act = ra, base_y = ry;
          float dv = 0;
          for (size_t i = 0; i < std::min(ra.size(), base_act.size()); ++i) dv = std::max(dv, std::fabs(ra[i] - base_act[i]));
          for (size_t i = 0; i < std::min(ry.size(), base_y.size()); ++i) dv = std::max(dv, std::fabs(ry[i] - base_y[i]));
          if (!skew) {
            table("moe invariance", shape, rows, dv, dv == 0.f);
            EXPECT_EQ(dv, 0.f) << shape << " " << rows << ": rows 0..2 differ from B=3";
          }
        }
      }
    }
  }
}

// Timings at the real shapes (LILY_QGEMM_BENCH=1): µs per call and the unique weight bytes' rate.
TEST(CudaQgemm, Bench) {
  LILY_REQUIRE_GPU();
  const char* mode = std::getenv("LILY_QGEMM_BENCH");
  if (!mode) GTEST_SKIP() << "set LILY_QGEMM_BENCH=1 to time qgemm (=small: the dense projections at 1-64 rows only)";
  const bool small = std::string(mode) == "small";
  GraphTimer timer;
  auto time_us = [&](auto&& f) { return timer.us(f); };
  const int H = 2048, I = 512, E = 256, k = 8;
  struct Dn {
    const char* name;
    int N, K, bits;
  } dense[] = {{"gdn in_proj", 12352, 2048, 4}, {"gdn out_proj", 2048, 4096, 4}, {"attn qkv", 9216, 2048, 4},
               {"router", 257, 2048, 8}, {"lm_head", 248320, 2048, 4}};
  const int Bd[] = {1, 16, 32, 64, 128, 256, 736};  // dense: up to a mixed step's rows
  D<uint16_t> dX(size_t(736) * 4096 * 9), dXlo(size_t(736) * 4096 * 9);
  D<float> dXS(size_t(736) * 4096 / 64 * 2 * 9);
  std::printf("[qgemm-bench] | op | rows | us | GB/s (weights once) | TFLOP/s |\n");
  for (const Dn& c : dense) {
    if (small && c.N > 100000) continue;
    QMat w(c.N, c.K, c.bits);
    D<float> y(size_t(736) * c.N);
    D<float> ws(cuda::qgemm_ws_floats(c.N, c.K, 736));
    D<int32_t> cnt(cuda::qgemm_counters(c.N, c.K, 736));
    const double bytes = double(c.N) * c.K * c.bits / 8 + double(c.N) * c.K / 64 * 4;
      for (int B : Bd)
        for (int kernel : {1, 2, 3, 4}) {  // 3, 4: mma.sync with the tile forced to 16 / 32 rows
          if (kernel == 2 && c.bits != 4) continue;
          if (small && (B > 64 || kernel == 2)) continue;
          if (kernel >= 3 && (B < 32 || B > 256)) continue;
          cuda::QGemmArgs a{};
          a.w = w.q, a.x = dX.p, a.xs = dXS.p, a.xlo = dXlo.p, a.ldx = c.K, a.M = B, a.y = y.p,
          a.ldy = c.N, a.ws = ws.p, a.cnt = cnt.p, a.kernel = kernel <= 2 ? kernel : 1, a.nt = kernel == 3 ? 2 : kernel == 4 ? 4 : 0;
          const double us = time_us([&](cudaStream_t t) { (void)cuda::qgemm(a, t); });
          std::printf("[qgemm-bench] | %s %dx%d q%d%s %s | %d | %.1f | %.0f | %.1f |\n", c.name, c.N, c.K, c.bits,
                      " two-pass", kernel == 2 ? "wgmma" : kernel == 3 ? "mma.sync nt=2" : kernel == 4 ? "mma.sync nt=4" : "mma.sync", B, us,
                      bytes / us * 1e-3, 2.0 * B * c.N * c.K / us * 1e-6);
        }
  }
  if (small) return;
  QMat gate(E * I, H, 4), up(E * I, H, 4), down(E * H, I, 4), shgu(2 * I, H, 4), shd(H, I, 4);
  const int Bm[] = {1, 16, 64, 256, 736};  // 736: a mixed step's rows (256 decode + 480 prompt)
  // xgemm's fragment copies of the same experts.
  cuda::FragExperts fx;
  D<uint8_t> fr(cuda::frag_expert_bytes(E, I, H));
  ASSERT_TRUE(cuda::frag_pack_experts(gate.q, up.q, shgu.q, down.q, shd.q, E, I, H, fr.p, &fx, nullptr).is_ok());
  for (int B : Bm)
  for (int nt : {0, 2, 4, 8}) {
    if (nt && B < 64) continue;
    rng().seed(5);
    Routing rt(B, k, E, 0);
    const int nent = B * k + B;
    const auto items = rt.items.get();
    const int n_items = rt.n_items.get()[0];
    D<uint16_t> act(size_t(nent) * I), actlo(size_t(nent) * I);
    D<float> acts(size_t(nent) * I / 64 * 2);
    D<float> y(size_t(nent) * H);
    cuda::QGemmArgs a{};
    a.xlo = dXlo.p, a.yxlo = actlo.p;
    a.w = gate.q, a.w2 = up.q, a.sh = shgu.q, a.x = dX.p, a.xs = dXS.p, a.ldx = H, a.swiglu = true, a.yx = act.p, a.yxs = acts.p,
    a.n_out = I, a.items = rt.items.p, a.n_items = rt.n_items.p, a.max_items = std::min(B * k, E) + 1, a.E = E,
    a.xrow = rt.rowb.p, a.yrow = rt.ent.p, a.ent_hint = B * k, a.nt = nt;
    cuda::QGemmArgs d = a;
    d.w = down.q, d.w2 = {}, d.sh = shd.q, d.x = act.p, d.xs = acts.p, d.ldx = I, d.swiglu = false, d.yx = nullptr, d.yxs = nullptr,
    d.y = y.p, d.ldy = H, d.n_out = H, d.xrow = rt.ent.p, d.xlo = actlo.p, d.yxlo = nullptr;
    const double gu_bytes = (n_items) * (2.0 * I * H / 2 + 2.0 * I * H / 64 * 4), dn_bytes = (n_items) * (double(I) * H / 2 + double(I) * H / 64 * 4);
    const double us_gu = time_us([&](cudaStream_t t) { (void)cuda::qgemm(a, t); });
    const double us_dn = time_us([&](cudaStream_t t) { (void)cuda::qgemm(d, t); });
    const char* tp = " two-pass";
    std::printf("[qgemm-bench] | moe gate+up%s (%d experts) nt=%d | %d | %.1f | %.0f |\n", tp, n_items, nt, B, us_gu, gu_bytes / us_gu * 1e-3);
    std::printf("[qgemm-bench] | moe down%s (%d experts) nt=%d | %d | %.1f | %.0f |\n", tp, n_items, nt, B, us_dn, dn_bytes / us_dn * 1e-3);
    if (cuda::xgemm_fits(a) && cuda::xgemm_fits(d)) {
      const double xs_gu = time_us([&](cudaStream_t t) { (void)cuda::xgemm(a, fx.gu, fx.sgu, t); });
      const double xs_dn = time_us([&](cudaStream_t t) { (void)cuda::xgemm(d, fx.dn, fx.sdn, t); });
      std::printf("[qgemm-bench] | xgemm gate+up%s (%d experts) nt=%d | %d | %.1f | %.0f |\n", tp, n_items, nt, B, xs_gu, gu_bytes / xs_gu * 1e-3);
      std::printf("[qgemm-bench] | xgemm down%s (%d experts) nt=%d | %d | %.1f | %.0f |\n", tp, n_items, nt, B, xs_dn, dn_bytes / xs_dn * 1e-3);
    }
    (void)items;
  }
}

}  // namespace
}  // namespace lily::testcuda

#else
TEST(CudaQgemm, NeedsCuda) { GTEST_SKIP() << "lily was built without the CUDA backend (no nvcc): qgemm tests skipped"; }
#endif
