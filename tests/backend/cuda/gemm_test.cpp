// The quantized GEMMs of the prefill and of the batched step (src/backend/cuda/gemm/): CudaPrefill.* checks
// pf::gemm (gemm_wg.cu, gemm_q8.cu) against the CPU reference at every tile edge and
// the real shapes, and times it with LILY_GEMM_BENCH=1 (prefill_util.h says how); CudaBatchTc.* checks
// qgemm dense and the batched step's add+norm+pack (batch_tc_aux.cu) against the CPU reference, and
// qgemm's batch invariance (batch_util.h). qgemm's own arithmetic and tile tests: qgemm_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/gemm/qgemm.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/step/prefill_ops.h"
#include "core/bf16.h"
#include "batch_util.h"
#include "prefill_util.h"

// ---- CudaPrefill: pf::gemm against the CPU reference ------------------------------------------------------
namespace lily::test_prefill {
namespace {

// Rows of a quantized weight, dequantized: ‖w_n‖₂ per row (the single-pass bound below).
std::vector<double> row_norms(const HostQ& W) {
  const QWeight& w = W.w;
  std::vector<double> nn(size_t(w.rows));
  for (int n = 0; n < w.rows; ++n) {
    double s2 = 0;
    for (int k = 0; k < w.cols; ++k) {
      const size_t g = size_t(n) * w.groups_per_row() + k / w.group_size;
      const double v = double(bf16_to_f32(w.scales[g])) * w.code(n, k) + double(bf16_to_f32(w.biases[g]));
      s2 += v * v;
    }
    nn[size_t(n)] = std::sqrt(s2);
  }
  return nn;
}

// A split once (split_rows), as the prefill runs its GEMMs: 4-bit weights on the Hopper wgmma kernel
// (gemm_wg.cu), 8-bit ones on the pipelined mma.sync kernel (gemm_q8.cu). Two pass (terms 2: exact weights,
// x as fp16 hi + lo; both kernels): every result against the fp32 reference at 2e-4. Single pass (terms 1,
// 4-bit: s·q + b and x each rounded once to fp16), from the arithmetic: each product w·x carries two fp16
// roundings (2^-11 relative each) and the fp32 sums at most K·2^-24 of Σ|w·x|, so |y − ref| ≤
// (2^-10 + K·2^-24)·Σ_k |w_k x_k| ≤ that times ‖w_n‖·‖x_m‖ (Cauchy–Schwarz), plus 1e-6 for fp16 subnormals.
// With random signs the errors are ~√K below the bound; a wrong weight, group or row is off by ~|y|, ~√K above it.
void gemm_case(int M, int N, int K, int bits, int terms = 2) {
  HostQ W(N, K, bits);
  DevQ D(W.w);
  auto x = randv(size_t(M) * K);
  std::vector<float> ref(size_t(M) * N);
  cpu::qmatmul(W.w, x.data(), M, K, ref.data(), N, false);
  DBuf<float> dx(x), dy(size_t(M) * N);
  cuda::pf::GemmArgs a{};
  a.w = D.q, a.n_out = N, a.M = M, a.y = dy.p, a.ldy = N, a.terms = terms;
  DevSplit sp(dx.p, K, M, K);
  sp.use(a);
  ASSERT_TRUE(cuda::pf::gemm(a, nullptr).is_ok());
  const std::string shape = dims({M, N, K});
  if (terms == 2) {
    check(fmt::format("gemm q{} x f16 hi+lo{}", bits, bits == 4 ? " wgmma" : " pipe"), shape, dy.down(), ref, 2e-4f, 2e-4f);
    return;
  }
  const auto got = dy.down();
  const auto wn = row_norms(W);
  const double c = std::ldexp(1.0, -10) + K * std::ldexp(1.0, -24);
  double worst = 0, max_err = 0;  // worst = max |err| / bound
  size_t nbad = 0;
  for (int m = 0; m < M; ++m) {
    double xn = 0;
    for (int k = 0; k < K; ++k) xn += double(x[size_t(m) * K + k]) * x[size_t(m) * K + k];
    xn = std::sqrt(xn);
    for (int n = 0; n < N; ++n) {
      const size_t i = size_t(m) * N + n;
      const double err = std::fabs(double(got[i]) - ref[i]), bound = c * wn[size_t(n)] * xn + 1e-6;
      max_err = std::max(max_err, std::isnan(err) ? INFINITY : err);
      worst = std::max(worst, std::isnan(err) ? INFINITY : err / bound);
      if (!(err <= bound)) ++nbad;
    }
  }
  std::printf("| %-24s | %-34s | %10.3e | err/bound %.3f (bound (2^-10+K·2^-24)·‖w‖‖x‖) | %s |\n", "gemm q4 single pass",
              shape.c_str(), max_err, worst, nbad ? "FAIL" : "ok");
  std::fflush(stdout);
  EXPECT_EQ(nbad, 0u) << "gemm q4 " << shape;
  // The fp16 output (GemmArgs::y16): each value the fp32 output rounded to nearest fp16, bit for bit.
  testcuda::DBuf<uint16_t> dy16(size_t(M) * N);
  a.y = nullptr, a.y16 = dy16.p;
  ASSERT_TRUE(cuda::pf::gemm(a, nullptr).is_ok());
  EXPECT_EQ(testcuda::count_not_half_of(dy16.down(), got), 0u) << "gemm q4 single pass, fp16 output " << shape;
}

// pf::add_rmsnorm_rows with the split outputs: x, hi, lo and xs bit for bit those of the norm written to n and then
// split by split_rows (hi alone too), and n against the CPU reference (fp32 sums: 1e-5).
void norm_split_case(int M, int H, bool mix) {
  auto x = randv(size_t(M) * H, 2.f), dm = randv(size_t(M) * H), gain = rand_bf16(size_t(H), 0.2f, 1.f);
  std::vector<float> r = x, ref(size_t(M) * H);
  if (mix)
    for (size_t i = 0; i < r.size(); ++i) r[i] += dm[i];
  const auto gb = as_bf16(gain);
  cpu::rmsnorm(r.data(), M, H, gb.data(), 1e-6f, ref.data());
  DBuf<float> x1(x), x2(x), x3(x), dmix(dm), dn(size_t(M) * H), xs2(size_t(M) * H / 64);
  DBuf<uint16_t> dg(to_bits(gain)), hi2(size_t(M) * H), lo2(size_t(M) * H), hi3(size_t(M) * H);
  const float* mp = mix ? dmix.p : nullptr;
  ASSERT_TRUE(cuda::pf::add_rmsnorm_rows(x1.p, mp, dg.p, M, H, 1e-6f, dn.p, nullptr).is_ok());
  DevSplit sp(dn.p, H, M, H);
  ASSERT_TRUE(cuda::pf::add_rmsnorm_rows(x2.p, mp, dg.p, M, H, 1e-6f, nullptr, nullptr, hi2.p, lo2.p, xs2.p).is_ok());
  ASSERT_TRUE(cuda::pf::add_rmsnorm_rows(x3.p, mp, dg.p, M, H, 1e-6f, nullptr, nullptr, hi3.p).is_ok());
  const std::string shape = dims({M, H});
  check(mix ? "add+rmsnorm rows" : "rmsnorm rows", shape, dn.down(), ref, 1e-5f, 1e-5f);
  auto same = [](const auto& a, const auto& b) {
    size_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0;
    return d;
  };
  const auto xa = x1.down();
  const auto hi = sp.hi.down();
  EXPECT_EQ(same(x2.down(), xa), 0u) << "residual " << shape;
  EXPECT_EQ(same(hi2.down(), hi), 0u) << "hi " << shape;
  EXPECT_EQ(same(lo2.down(), sp.lo.down()), 0u) << "lo " << shape;
  EXPECT_EQ(same(xs2.down(), sp.xs.down()), 0u) << "xs " << shape;
  EXPECT_EQ(same(hi3.down(), hi), 0u) << "hi alone " << shape;
  std::printf("| %-24s | %-34s | fused split: x, hi, lo, xs %s split_rows of n bit for bit |\n", "add+rmsnorm+split",
              shape.c_str(), ::testing::Test::HasFailure() ? "NOT" : "equal to");
}
TEST(CudaPrefill, NormSplit) {
  LILY_PREFILL_REQUIRE_GPU();
  for (int M : {1, 7, 130}) {
    norm_split_case(M, 2048, true);
    norm_split_case(M, 256, false);
  }
  norm_split_case(4097, 64, true);
}
// The pipelined kernel (8-bit): tile edges in M and N, K one and many tiles, the router.
TEST(CudaPrefill, Gemm) {
  LILY_PREFILL_REQUIRE_GPU();
  for (int M : {1, 2, 7, 63, 64, 65, 129}) gemm_case(M, 200, 512, 8);
  gemm_case(65, 257, 2048, 8);     // router + shared gate (8-bit)
  gemm_case(9, 136, 64, 8);        // one k tile, 8-bit
  gemm_case(4097, 256, 256, 8);    // a whole chunk (+1)
}
// The Hopper wgmma kernel (gemm_wg.cu, 2 warpgroups = 128 weight rows per block): every 64-token tile
// edge, weight-row block edges (N = 300 crosses 128 and 256), K one to many tiles, the real shapes.
TEST(CudaPrefill, GemmWgmma) {
  LILY_PREFILL_REQUIRE_GPU();
  for (int terms : {2, 1}) {
    for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 257, 4095, 4096, 4097}) gemm_case(M, 300, 256, 4, terms);
    gemm_case(33, 64, 64, 4, terms);  // one k tile, one partial block
    gemm_case(257, 12352, 2048, 4, terms);  // [qkv|z|a|b]
    gemm_case(130, 2048, 4096, 4, terms);   // out_proj / o_proj
    gemm_case(130, 9216, 2048, 4, terms);   // attention [q|gate|k|v]
    gemm_case(130, 2048, 512, 4, terms);    // down
    gemm_case(4097, 3000, 2048, 4, terms);  // a whole prefill chunk (+1) at the real K
  }
}

// Timing of the quantized GEMM kernels at the real shapes for a 4,096-token chunk (M = 4096;
// grouped: 4096 tokens × top-8 over 256 experts, uniform random routing). Runs only with
// LILY_GEMM_BENCH=1. Per shape: ms per call and model TFLOP/s (2·M·N·K) of the wgmma kernel (the
// 4-bit prefill GEMMs) two pass and single pass (the CPU rows above are the oracle).
struct BenchW {
  DBuf<uint32_t> codes;
  DBuf<uint16_t> sb;
  QW q;
  BenchW(int rows, int cols) : codes(size_t(rows) * cols / 8), sb(size_t(rows) * cols / 64 * 2) {
    std::vector<uint32_t> c(codes.n);
    uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t(rows) * 31 + uint64_t(cols));
    for (auto& v : c) st ^= st << 13, st ^= st >> 7, st ^= st << 17, v = uint32_t(st);
    codes.up(c);
    std::vector<uint16_t> b(sb.n);
    const float s0 = 1.f / (15.f / std::sqrt(12.f) * std::sqrt(float(cols)));
    for (size_t i = 0; i < b.size(); i += 2) {
      const float sc = s0 * (0.5f + randu());
      b[i] = f32_to_bf16(sc).bits, b[i + 1] = f32_to_bf16(-sc * (7.5f + randu() - 0.5f)).bits;
    }
    sb.up(b);
    q.codes = codes.p, q.sb = sb.p, q.rows = rows, q.cols = cols, q.bits = 4;
  }
};

// One row: the shape at two terms (exact weights, x hi + lo; args two) and at one (single pass; args one, which
// for grouped calls carry a wide route's tiles, as the prefill's single-pass chunks route).
void bench_row(const char* name, cuda::pf::GemmArgs two, cuda::pf::GemmArgs one, double flop) {
  std::printf("| %-30s |", name);
  for (int terms : {2, 1}) {
    cuda::pf::GemmArgs a = terms == 2 ? two : one;
    a.terms = terms;
    const float ms = mean_ms(10, [&] { return cuda::pf::gemm(a, nullptr).is_ok(); });
    ASSERT_GE(ms, 0.f) << name << ": a GEMM call failed";
    std::printf(" %8.3f ms %6.1f TF/s |", ms, flop / (ms * 1e-3) / 1e12);
  }
  std::printf("\n");
  std::fflush(stdout);
}
TEST(CudaPrefill, GemmBench) {
  LILY_PREFILL_REQUIRE_GPU();
  const char* e = std::getenv("LILY_GEMM_BENCH");
  if (!e || std::string(e) != "1") GTEST_SKIP() << "set LILY_GEMM_BENCH=1 to time the GEMM kernels";
  const int M = 4096, H = 2048, E = 256, k = 8, I = 512;
  std::printf("| GEMM (M=4096 dense) | two pass | single pass |\n");
  auto dense = [&](const char* name, int N, int K, bool swiglu) {
    BenchW w(swiglu ? 2 * N : N, K);
    auto x = randv(size_t(M) * K);
    DBuf<float> dx(x), dy(size_t(M) * N);
    DevSplit sp(dx.p, K, M, K);
    cuda::pf::GemmArgs a{};
    a.w = w.q, a.w2 = w.q, a.row0_2 = N, a.n_out = N, a.M = M, a.y = dy.p, a.ldy = N, a.swiglu = swiglu;
    sp.use(a);
    bench_row(name, a, a, 2.0 * M * N * K * (swiglu ? 2 : 1));
  };
  dense("gdn in_proj 12352x2048", 12352, 2048, false);
  dense("out_proj/o_proj 2048x4096", 2048, 4096, false);
  dense("attn qkv 9216x2048", 9216, 2048, false);
  dense("shared gate+up 2x512x2048", 512, 2048, true);
  dense("shared down 2048x512", 2048, 512, false);
  // Grouped: random top-8 of 256 per token, expert-major slots; at 4,096 tokens (~128 rows an expert) and at
  // 2,048 (~64, the prefill's segments); two pass in 64-row tiles, single pass in a wide route's 128- and 64-row
  // tiles (as pf::moe_route makes them; 64-row tiles single pass measured 0.589 / 0.359 ms gate+up against
  // 0.479 / 0.305 wide, docs/perf/2026-12-07-attn-single-pass.md).
  for (const int Mg : {4096, 2048}) {
    const int S = Mg * k, T = cuda::pf::moe_max_tiles(Mg, E, k);
    std::vector<std::vector<int>> by_e(E);
    for (int m = 0; m < Mg; ++m) {
      std::vector<int> ids;
      while (int(ids.size()) < k) {
        const int id = int(rng()() % E);
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
      }
      for (int id : ids) by_e[id].push_back(m);
    }
    std::vector<int32_t> slot_tok, narrow, wide;
    for (int ex = 0; ex < E; ++ex) {
      const int o = int(slot_tok.size()), c = int(by_e[ex].size());
      for (int i = 0; i < c; i += 64) narrow.insert(narrow.end(), {ex, o + i, o + std::min(i + 64, c), 0});
      for (int i = 0; i < c; i += 128) {
        const int m1 = o + std::min(i + 128, c);
        wide.insert(wide.end(), {ex, o + i, m1, m1 - (o + i) > 64 ? 1 : 0});
      }
      slot_tok.insert(slot_tok.end(), by_e[ex].begin(), by_e[ex].end());
    }
    narrow.resize(size_t(T) * 4, 0);
    wide.resize(size_t(T) * 4, 0);
    DBuf<int32_t> dslot(slot_tok), dnarrow(narrow), dwide(wide);
    BenchW gate(E * I, H), up(E * I, H), down(E * H, I);
    auto x = randv(size_t(Mg) * H);
    auto act = randv(size_t(S) * I);
    DBuf<float> dx(x), dact_in(act), dact(size_t(S) * I), dyd(size_t(S) * H);
    DevSplit sx(dx.p, H, Mg, H), sa(dact_in.p, I, S, I);
    cuda::pf::GemmArgs gu{};
    gu.w = gate.q, gu.w2 = up.q, gu.n_out = I, gu.a_rows = dslot.p, gu.M = S, gu.y = dact.p, gu.ldy = I;
    gu.swiglu = true, gu.tiles = dnarrow.p, gu.max_tiles = T;
    sx.use(gu);
    cuda::pf::GemmArgs gu_wide = gu;
    gu_wide.tiles = dwide.p;
    bench_row(fmt::format("moe gate+up M={}", Mg).c_str(), gu, gu_wide, 2.0 * S * 2 * I * H);
    cuda::pf::GemmArgs dn{};
    dn.w = down.q, dn.n_out = H, dn.M = S, dn.y = dyd.p, dn.ldy = H, dn.tiles = dnarrow.p, dn.max_tiles = T;
    sa.use(dn);
    cuda::pf::GemmArgs dn_wide = dn;
    dn_wide.tiles = dwide.p;
    bench_row(fmt::format("moe down M={}", Mg).c_str(), dn, dn_wide, 2.0 * S * H * I);
  }
}

}  // namespace
}  // namespace lily::test_prefill

// ---- CudaBatchTc: qgemm and the batched step's norm + pack against the CPU reference ----------------------
namespace lily::test_batch {
namespace {

// Packs x (R rows of K) and runs qgemm dense: y [R][w.rows].
std::vector<float> tc_dense(const QW& w, const std::vector<float>& xh, int R, int kernel = 0) {
  const int K = w.cols;
  D<float> x(xh), y(size_t(R) * w.rows), ws(cuda::qgemm_ws_floats(w.rows, K, R));
  D<int32_t> cnt(cuda::qgemm_counters(w.rows, K, R));
  Packed16 p(size_t(R), K);
  EXPECT_TRUE(cuda::xpack16(x.p, K, K, R, p.X.p, p.XS.p, p.Xlo.p, nullptr).is_ok());
  cuda::QGemmArgs a{};
  a.w = w, a.x = p.X.p, a.xs = p.XS.p, a.xlo = p.Xlo.p, a.ldx = K, a.M = R, a.y = y.p, a.ldy = w.rows;
  a.ws = ws.p, a.cnt = cnt.p, a.kernel = kernel;
  EXPECT_TRUE(cuda::qgemm(a, nullptr).is_ok());
  auto v = y.get();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return v;
}

// qgemm (gemm/qgemm.h) against the model's CPU reference (cpu::qmatmul on fp32 activations), and
// batch invariant (the same source row at B = 64 and at other B / positions: |Δ| = 0).
TEST(CudaBatchTc, GemmMatchesCpuAndIsBatchInvariant) {
  LILY_REQUIRE_GPU();
  cpu::set_bf16_storage(false);
  struct S { int bits, K, rows; };
  for (S s : {S{4, 2048, 12352}, S{4, 4096, 2048}, S{8, 2048, 257}, S{4, 2048, 2000}, S{4, 320, 96}, S{8, 128, 40}, S{4, 64, 17}}) {
    HQ w(s.rows, s.K, s.bits);
    const int R = 64;
    const auto xh = act_rows(R, s.K);
    std::vector<float> ref(size_t(R) * s.rows);
    cpu::qmatmul(w.w, xh.data(), R, s.K, ref.data(), s.rows, false);
    const auto y64 = tc_dense(w.q, xh, R, 1);  // the mma.sync tiles (rows below qgemm_wg_rows())
    const std::string shape = std::to_string(s.bits) + "-bit " + std::to_string(s.rows) + "x" + std::to_string(s.K);
    NormErr ne;
    for (int r = 0; r < R; ++r) ne.add(&y64[size_t(r) * s.rows], &ref[size_t(r) * s.rows], s.rows);
    row("qgemm vs cpu (normwise)", shape, R, float(ne.worst));
    EXPECT_LE(ne.worst, kTolGemm) << shape;
    if (s.bits == 4) {  // the dense wgmma tile (many rows)
      const auto yw = tc_dense(w.q, xh, R, 2);
      NormErr nw;
      for (int r = 0; r < R; ++r) nw.add(&yw[size_t(r) * s.rows], &ref[size_t(r) * s.rows], s.rows);
      row("qgemm wgmma vs cpu (normwise)", shape, R, float(nw.worst));
      EXPECT_LE(nw.worst, kTolGemm) << shape;
    }
    for (int B : kBs) {
      if (B == 64) continue;
      // Batch row b = source row (b·7 + B) mod 64: other positions, other neighbours.
      std::vector<float> xb(size_t(B) * s.K);
      for (int b = 0; b < B; ++b)
        std::copy_n(&xh[size_t((b * 7 + B) % R) * s.K], s.K, &xb[size_t(b) * s.K]);
      const auto yb = tc_dense(w.q, xb, B, 1);
      float inv = 0.f;
      for (int b = 0; b < B; ++b)
        for (int c = 0; c < s.rows; ++c)
          inv = std::max(inv, std::fabs(yb[size_t(b) * s.rows + c] - y64[size_t((b * 7 + B) % R) * s.rows + c]));
      row("qgemm batch invariance", shape, B, inv);
      EXPECT_EQ(inv, 0.f) << shape << " B " << B;
    }
  }
}

// The batched step's add + RMSNorm (+ residual out) against the CPU reference, and its packed output
// equal to xpack16 of the normed rows bit for bit.
TEST(CudaBatchTc, NormPackMatchesCpu) {
  LILY_REQUIRE_GPU();
  cpu::set_bf16_storage(false);
  for (int H : {2048, 256, 1472, 4096}) {  // 1472: 23 groups, one slice; 4096: two values a thread a slice
    const int B = 17;
    const auto in = randv(size_t(B) * H), mix = randv(size_t(B) * H, 0.5f);
    std::vector<bf16> gh(static_cast<size_t>(H));
    std::vector<uint16_t> gb(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i) gh[size_t(i)] = f32_to_bf16(1.f + 0.2f * randn()), gb[size_t(i)] = gh[size_t(i)].bits;
    D<float> din(in), dmix(mix), res(size_t(B) * H), n(size_t(B) * H);
    D<uint16_t> gain(gb);
    Packed16 p1(size_t(B), H), p2(size_t(B), H);
    cuda::BNormArgs a{};
    a.in = din.p, a.mix = dmix.p, a.gain = gain.p, a.H = H, a.B = B, a.res_out = res.p, a.n_out = n.p, a.X16 = p1.X.p;
    a.X16lo = p1.Xlo.p, a.XS = p1.XS.p;
    ASSERT_TRUE(cuda::bnorm_pack(a, nullptr).is_ok());
    ASSERT_TRUE(cuda::xpack16(n.p, H, H, B, p2.X.p, p2.XS.p, p2.Xlo.p, nullptr).is_ok());
    std::vector<float> r(size_t(B) * H), ref(size_t(B) * H);
    for (size_t i = 0; i < r.size(); ++i) r[i] = in[i] + mix[i];
    cpu::rmsnorm(r.data(), B, H, gh.data(), 1e-6f, ref.data());
    const auto got = n.get();
    NormErr ne;
    for (int b = 0; b < B; ++b) ne.add(&got[size_t(b) * H], &ref[size_t(b) * H], H);
    const float e_res = max_diff(res.get(), r);
    const bool same_p = p1.X.get() == p2.X.get() && p1.XS.get() == p2.XS.get() && p1.Xlo.get() == p2.Xlo.get();
    const std::string shape = "H " + std::to_string(H);
    row("add+norm vs cpu (normwise)", shape, B, float(ne.worst));
    row("add+norm residual", shape, B, e_res);
    row("add+norm pack == xpack16(normed)", shape, B, same_p ? 0.f : 1.f);
    EXPECT_LE(ne.worst, 1e-5);  // measured 3.2e-6 on the H200 (the reference sums squares in another order)
    EXPECT_EQ(e_res, 0.f);
    EXPECT_TRUE(same_p);
    // Every count of blocks a row (bnorm_pack picks one by B) gives the same bits.
    for (int cs = 1; cs <= cuda::bnorm_slices(H); cs *= 2) {
      D<float> n2(size_t(B) * H), res2(size_t(B) * H);
      Packed16 p3(size_t(B), H);
      cuda::BNormArgs c = a;
      c.blocks = cs, c.res_out = res2.p, c.n_out = n2.p, c.X16 = p3.X.p, c.X16lo = p3.Xlo.p, c.XS = p3.XS.p;
      ASSERT_TRUE(cuda::bnorm_pack(c, nullptr).is_ok());
      const bool same = n2.get() == got && res2.get() == res.get() && p3.X.get() == p1.X.get() &&
                        p3.XS.get() == p1.XS.get() && p3.Xlo.get() == p1.Xlo.get();
      row(("add+norm, " + std::to_string(cs) + " blocks a row == default").c_str(), shape, B, same ? 0.f : 1.f);
      EXPECT_TRUE(same) << shape << " blocks " << cs;
    }
  }
}

}  // namespace
}  // namespace lily::test_batch
#endif  // LILY_HAVE_CUDA
