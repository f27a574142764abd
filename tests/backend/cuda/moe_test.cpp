// The MoE family (src/backend/cuda/moe/, and the router GEMV's top-k epilogue): CudaOps.* checks the
// router top-k and the decode expert kernels (moe.cu, moe_tc.cu) against the CPU reference (ops_util.h);
// CudaPrefill.Moe the prefill's routing, grouped expert GEMMs and combine against the reference
// forward's moe() (prefill_util.h); CudaBatch.* the batched expert kernels against the batch-1 ones, bit
// for bit, and CudaBatchTc.* the qgemm step's expert path against the CPU reference, batch invariant,
// and its routing table (batch_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/gemm/qgemm.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/step/prefill_ops.h"
#include "core/bf16.h"
#include "batch_util.h"
#include "ops_util.h"
#include "prefill_util.h"

// ---- CudaOps: router top-k and the decode expert kernels against the CPU reference ------------------------
namespace lily::test_ops {
namespace {

// Reference routing (as the CPU forward): softmax fp32 over l[0..E), top-k by p (ties → lowest id),
// renormalized when norm; w[k] = σ(l[E]) (the shared-expert gate).
void ref_route(const std::vector<float>& l, int E, int k, bool norm, std::vector<int32_t>& ids, std::vector<float>& w) {
  const float mx = *std::max_element(l.begin(), l.begin() + E);
  std::vector<float> p(E);
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  std::vector<int> idx(E);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float tsum = 0;
  for (int j = 0; j < k; ++j) tsum += p[idx[j]];
  ids.assign(idx.begin(), idx.begin() + k);
  w.resize(k + 1);
  for (int j = 0; j < k; ++j) w[j] = norm ? p[idx[j]] / tsum : p[idx[j]];
  w[k] = 1.0f / (1.0f + std::exp(-l[E]));
}

// ---------------------------------------------------------------- router: Q8 GEMV + top-k
void router_case(int E, int H, int k) {
  HostQ R(E, H, 8, 3.f), SG(1, H, 8, 1.f);
  DevQ D({&R.w, &SG.w});
  auto x = rand_bf16(H);
  std::vector<float> l(E + 1);
  cpu::qmatmul(D.q.rows == E + 1 ? R.w : R.w, x.data(), 1, H, l.data(), E, false);
  cpu::qmatmul(SG.w, x.data(), 1, H, l.data() + E, 1, false);
  std::vector<int32_t> rid;
  std::vector<float> ref_w;
  ref_route(l, E, k, /*norm=*/true, rid, ref_w);
  const std::vector<float> ref_ids(rid.begin(), rid.end());
  DBuf<float> dx(x), dl(E + 1), dw(k + 1);
  DBuf<int32_t> di(k);
  DBuf<cuda::StepCtl> ctl(1);
  cudaMemset(ctl.p, 0, sizeof(cuda::StepCtl));
  cuda::GemvArgs a{};
  a.w = D.q, a.pro = cuda::Pro::kPlain, a.in = dx.p, a.y = dl.p, a.epi = cuda::Epi::kTopK;
  a.ctl = ctl.p, a.n_experts = E, a.top_k = k, a.topk_ids = di.p, a.topk_w = dw.p;
  for (int rep = 0; rep < 2; ++rep) {  // twice: the last-block counter must reset itself
    ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
    const std::string sh = dims({E + 1, H}) + " k" + std::to_string(k) + (rep ? " (replay)" : "");
    check("router q8 logits fp32", sh, dl.down(), l, 1e-3f, 1e-3f);
    auto ids = di.down();
    check("router top-k ids", sh, std::vector<float>(ids.begin(), ids.end()), ref_ids, 0, 0);
    check("router weights+σ(shared)", sh, dw.down(), ref_w, 1e-5f, 1e-4f);
  }
}
TEST(CudaOps, RouterTopK) {
  LILY_OPS_REQUIRE_GPU();
  router_case(256, 2048, 8);
  router_case(16, 256, 4);
  router_case(64, 512, 1);
  router_case(4, 256, 2);   // small-seed11 golden
  router_case(16, 320, 4);  // wide-seed23 golden
}

// ---------------------------------------------------------------- MoE gate_up + down_combine
// MoeArgs::tc of the cases below: unset, moe.cu's kernels; MoeTc sets it (the decode step's calls: the
// tensor-core down kernel where it applies).
bool g_tc = false;

// route: 0 = expert ids and weights given (the router epilogue's path); 1 = routing in the MoE
// kernels from random router logits; 2 = the same with tied logits (lowest id first) and no
// renormalization.
void moe_case(int E, int H, int I, int Is, int k, int route = 0) {
  HostQ G(E * I, H, 4), U(E * I, H, 4), Dn(E * H, I, 4, 0.5f), SG(Is, H, 4), SU(Is, H, 4), SD(H, Is, 4, 0.5f);
  DevQ dG({&G.w}), dU({&U.w}), dD({&Dn.w}), dSGU({&SG.w, &SU.w}), dSD({&SD.w});
  auto x = rand_bf16(H);
  std::vector<int32_t> ids(k);
  std::vector<float> wts(k + 1), logits;
  if (route) {
    logits = rand_bf16(E + 1, 2.f);
    if (route == 2)  // ties: the top logit again at lower ids, and a tied pair further down
      for (int j = 0; j < std::min(k, E / 2); j += 2) logits[j] = *std::max_element(logits.begin(), logits.begin() + E);
    ref_route(logits, E, k, route == 1, ids, wts);
  } else {
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    float s = 0;
    for (int j = 0; j < k; ++j) ids[j] = perm[j], s += (wts[j] = 0.1f + randu());
    for (int j = 0; j < k; ++j) wts[j] /= s;
    wts[k] = 0.3f + 0.4f * randu();
  }
  // reference (as the CPU forward in fp32): act = silu(g·x)·(u·x); y_k = down_k·act_k
  auto swiglu = [&](const QWeight& g, const QWeight& u, std::vector<float>& act) {
    std::vector<float> a(g.rows), b(g.rows);
    cpu::qmatmul(g, x.data(), 1, H, a.data(), g.rows, true);
    cpu::qmatmul(u, x.data(), 1, H, b.data(), u.rows, true);
    act.resize(g.rows);
    for (int i = 0; i < g.rows; ++i) act[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
  };
  std::vector<float> ref_act, acc(H, 0.f), out(H);
  for (int j = 0; j < k; ++j) {
    std::vector<float> act, y(H);
    swiglu(G.w.rows_slice(ids[j] * I, I), U.w.rows_slice(ids[j] * I, I), act);
    ref_act.insert(ref_act.end(), act.begin(), act.end());
    cpu::qmatmul(Dn.w.rows_slice(ids[j] * H, H), act.data(), 1, I, y.data(), H, true);
    for (int c = 0; c < H; ++c) acc[c] += wts[j] * y[c];
  }
  std::vector<float> sact, sy(H);
  swiglu(SG.w, SU.w, sact);
  ref_act.insert(ref_act.end(), sact.begin(), sact.end());
  cpu::qmatmul(SD.w, sact.data(), 1, Is, sy.data(), H, true);
  for (int c = 0; c < H; ++c) out[c] = acc[c] + wts[k] * sy[c];

  DBuf<float> dx(x), dact(size_t(k) * I + Is), dout(H);
  DBuf<int32_t> di(ids);
  DBuf<float> dw(wts), dl(std::max<size_t>(logits.size(), 1));
  cuda::MoeArgs a{};
  a.gate = dG.q, a.up = dU.q, a.down = dD.q, a.sh_gate_up = dSGU.q, a.sh_down = dSD.q;
  a.topk_ids = di.p, a.topk_w = dw.p, a.top_k = k, a.H = H, a.I = I, a.Is = Is, a.x = dx.p, a.act = dact.p, a.out = dout.p;
  a.tc = g_tc;
  if (route) {  // ids/weights buffers poisoned: the kernels must route from the logits
    dl.up(logits);
    cudaMemset(di.p, 0xFF, di.n * 4), cudaMemset(dw.p, 0xFF, dw.n * 4);
    a.logits = dl.p, a.n_experts = E, a.norm_topk = route == 1, a.ids_out = di.p, a.w_out = dw.p;
  }
  ASSERT_TRUE(cuda::moe_gate_up(a, nullptr).is_ok());
  ASSERT_TRUE(cuda::moe_down_combine(a, nullptr).is_ok());
  const std::string sh = "E" + std::to_string(E) + " H" + std::to_string(H) + " I" + std::to_string(I) + " Is" +
                         std::to_string(Is) + " k" + std::to_string(k) +
                         (route == 1 ? " routed here" : route == 2 ? " routed here, ties, no renorm" : "");
  check("moe gate+up+swiglu (k+shared)", sh, dact.down(), ref_act, 1e-4f, 1e-3f);
  check("moe down+combine+σ·shared", sh, dout.down(), out, 1e-4f, 1e-3f);
  if (route) {
    auto gi = di.down();
    check("moe routing: top-k ids (down block 0)", sh, std::vector<float>(gi.begin(), gi.end()),
          std::vector<float>(ids.begin(), ids.end()), 0, 0);
    check("moe routing: weights+σ(shared)", sh, dw.down(), wts, 1e-6f, 1e-5f);
  }
}
TEST(CudaOps, Moe) {
  LILY_OPS_REQUIRE_GPU();
  moe_case(256, 2048, 512, 512, 8);
  moe_case(16, 256, 256, 256, 4);
  moe_case(8, 512, 1024, 1024, 1);
  moe_case(4, 256, 64, 64, 2);     // small-seed11 golden
  moe_case(16, 320, 64, 128, 4);   // wide-seed23 golden: shared width ≠ expert width
  moe_case(16, 256, 128, 128, 4);  // golden-small-seed7
  moe_case(32, 256, 64, 192, 16);  // top-k 16
}
// Routing inside the MoE kernels from the router's logits (the decode default).
TEST(CudaOps, MoeRoutedHere) {
  LILY_OPS_REQUIRE_GPU();
  moe_case(256, 2048, 512, 512, 8, 1);
  moe_case(256, 2048, 512, 512, 8, 2);
  moe_case(256, 256, 64, 64, 10, 1);   // k > warps holding experts: every expert a candidate
  moe_case(200, 256, 64, 64, 8, 1);    // E not a multiple of 32
  moe_case(16, 256, 256, 256, 4, 1);
  moe_case(4, 256, 64, 64, 2, 2);      // small-seed11 golden
  moe_case(16, 320, 64, 128, 4, 1);    // wide-seed23 golden
  moe_case(32, 256, 64, 192, 16, 2);   // top-k 16
  moe_case(8, 256, 64, 64, 8, 1);      // k = E
}

// The expert kernels as the decode step calls them (MoeArgs::tc): down on tensor cores (moe_tc.cu) where
// k·I + Is ≤ 4608 with I, Is multiples of 64 (routing in the kernels or from ids/weights, several k / I /
// Is), gate+up on moe.cu's kernel; other shapes fall back to moe.cu's down.
TEST(CudaOps, MoeTc) {
  LILY_OPS_REQUIRE_GPU();
  g_tc = true;
  g_tag = " tc";
  moe_case(256, 2048, 512, 512, 8, 1);
  moe_case(256, 2048, 512, 512, 8, 2);
  moe_case(256, 2048, 512, 512, 8);
  moe_case(16, 2048, 128, 256, 10, 1);
  moe_case(64, 2048, 64, 192, 16, 2);
  moe_case(200, 2048, 512, 512, 1, 1);
  moe_case(16, 256, 256, 256, 4, 1);   // H 256 (down on tensor cores too)
  moe_case(16, 256, 512, 512, 10, 1);  // fallback: k·I + Is = 5632
  g_tag.clear();
  g_tc = false;
}

}  // namespace
}  // namespace lily::test_ops

// ---- CudaPrefill: the prefill MoE layer against the reference forward -------------------------------------
namespace lily::test_prefill {
namespace {

// As CudaBackend::pf_chunk runs it: the GEMM inputs pre-split, the 4-bit GEMMs on the wgmma kernel, the
// 8-bit router on the pipe kernel.
void moe_case(int M, int H, int E, int k, int I, int terms = 2) {
  HostQ gate(E * I, H, 4), up(E * I, H, 4), down(E * H, I, 4), shgu(2 * I, H, 4), shd(H, I, 4), router(E + 1, H, 8, 3.f);
  DevQ dg(gate.w), du(up.w), dd(down.w), dsgu(shgu.w), dsd(shd.w), dr(router.w);
  auto x = randv(size_t(M) * H);
  // CPU reference (as the reference forward's moe()).
  std::vector<float> rl(size_t(M) * (E + 1));
  cpu::qmatmul(router.w, x.data(), M, H, rl.data(), E + 1, false);
  std::vector<std::vector<int>> ids(M);
  std::vector<std::vector<float>> wts(M);
  std::vector<float> gap(M);
  for (int m = 0; m < M; ++m) {
    const float* l = &rl[size_t(m) * (E + 1)];
    const float mx = *std::max_element(l, l + E);
    std::vector<float> p(E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (auto& v : p) v /= sum;
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float ts = 0;
    for (int j = 0; j < k; ++j) ts += p[idx[j]];
    for (int j = 0; j < k; ++j) ids[m].push_back(idx[j]), wts[m].push_back(p[idx[j]] / ts);
    gap[m] = std::fabs(p[idx[k - 1]] - p[idx[k]]);
  }
  std::vector<float> ref(size_t(M) * H, 0.f);
  for (int m = 0; m < M; ++m) {
    const float* xm = &x[size_t(m) * H];
    std::vector<float> g(I), u(I), y(H), acc(H, 0.f);
    for (int j = 0; j < k; ++j) {
      const int e = ids[m][j];
      cpu::qmatmul(gate.w.rows_slice(e * I, I), xm, 1, H, g.data(), I, false);
      cpu::qmatmul(up.w.rows_slice(e * I, I), xm, 1, H, u.data(), I, false);
      for (int i = 0; i < I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
      cpu::qmatmul(down.w.rows_slice(e * H, H), g.data(), 1, I, y.data(), H, false);
      for (int c = 0; c < H; ++c) acc[c] += wts[m][j] * y[c];
    }
    cpu::qmatmul(shgu.w.rows_slice(0, I), xm, 1, H, g.data(), I, false);
    cpu::qmatmul(shgu.w.rows_slice(I, I), xm, 1, H, u.data(), I, false);
    for (int i = 0; i < I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    cpu::qmatmul(shd.w, g.data(), 1, I, y.data(), H, false);
    const float sig = 1.f / (1.f + std::exp(-rl[size_t(m) * (E + 1) + E]));
    for (int c = 0; c < H; ++c) ref[size_t(m) * H + c] = acc[c] + sig * y[c];
  }
  // GPU, as CudaBackend::pf_chunk runs it.
  const int S = M * k, T = cuda::pf::moe_max_tiles(M, E, k);
  DBuf<float> dx(x), drl(size_t(M) * (E + 1)), dtw(size_t(M) * (k + 1)), dact(size_t(S) * I), dyd(size_t(S) * H);
  DBuf<float> dsact(size_t(M) * I), dsy(size_t(M) * H), dout(size_t(M) * H);
  DBuf<int32_t> dids(static_cast<size_t>(S)), dslot_tok(S), dslot_of(S), dtiles(size_t(T) * 4), dscr(cuda::pf::moe_route_scratch_ints(E));
  cuda::pf::GemmArgs ra{};
  ra.w = dr.q, ra.n_out = E + 1, ra.M = M, ra.y = drl.p, ra.ldy = E + 1;
  DevSplit sx(dx.p, H, M, H);
  sx.use(ra);
  ASSERT_TRUE(cuda::pf::gemm(ra, nullptr).is_ok());
  cuda::pf::RouteArgs r{};
  r.logits = drl.p, r.M = M, r.E = E, r.top_k = k, r.topk_ids = dids.p, r.topk_w = dtw.p, r.slot_tok = dslot_tok.p;
  r.slot_of = dslot_of.p, r.tiles = dtiles.p, r.max_tiles = T, r.scratch = dscr.p, r.wide = terms == 1;
  ASSERT_TRUE(cuda::pf::moe_route(r, nullptr).is_ok());
  cuda::pf::GemmArgs gu{};
  gu.terms = terms;
  gu.w = dg.q, gu.w2 = du.q, gu.n_out = I, gu.a_rows = dslot_tok.p, gu.y = dact.p, gu.ldy = I;
  gu.swiglu = true, gu.tiles = dtiles.p, gu.max_tiles = T;
  sx.use(gu);
  ASSERT_TRUE(cuda::pf::gemm(gu, nullptr).is_ok());
  cuda::pf::GemmArgs dn{};
  dn.terms = terms;
  dn.w = dd.q, dn.n_out = H, dn.y = dyd.p, dn.ldy = H, dn.tiles = dtiles.p, dn.max_tiles = T;
  DevSplit sa(dact.p, I, S, I);
  sa.use(dn);
  ASSERT_TRUE(cuda::pf::gemm(dn, nullptr).is_ok());
  cuda::pf::GemmArgs sg{};
  sg.terms = terms;
  sg.w = dsgu.q, sg.w2 = dsgu.q, sg.row0_2 = I, sg.n_out = I, sg.M = M, sg.y = dsact.p, sg.ldy = I;
  sg.swiglu = true;
  sx.use(sg);
  ASSERT_TRUE(cuda::pf::gemm(sg, nullptr).is_ok());
  cuda::pf::GemmArgs sd{};
  sd.terms = terms;
  sd.w = dsd.q, sd.n_out = H, sd.M = M, sd.y = dsy.p, sd.ldy = H;
  DevSplit ss(dsact.p, I, M, I);
  ss.use(sd);
  ASSERT_TRUE(cuda::pf::gemm(sd, nullptr).is_ok());
  ASSERT_TRUE(cuda::pf::moe_combine(dyd.p, dsy.p, dslot_of.p, dtw.p, M, H, k, dout.p, nullptr).is_ok());
  // Routing: ids must match except at near-ties of the reference (those tokens are skipped).
  auto gid = dids.down();
  std::vector<char> skip(M, 0);
  int flips = 0;
  for (int m = 0; m < M; ++m) {
    std::vector<int> a(gid.begin() + size_t(m) * k, gid.begin() + size_t(m + 1) * k), b = ids[m];
    std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
    if (a != b) {
      skip[m] = 1, ++flips;
      EXPECT_LT(gap[m], 1e-5f) << "token " << m << " routed differently without a near-tie";
    }
  }
  std::printf("| moe routing              | %-34s | %d of %d tokens differ (all near-ties) |\n", dims({M, E, k}).c_str(), flips, M);
  if (terms == 2) {
    check("moe (router..comb.) f16 hi+lo", dims({M, H, E, k, I}), dout.down(), ref, 5e-4f, 1e-3f, &skip, H);
    return;
  }
  // The SwiGLU GEMMs' fp16 outputs (GemmArgs::y16, what the prefill's single pass hands the down GEMMs): the fp32
  // outputs rounded to nearest, bit for bit, on every tile class of the wide route and the dense shared expert.
  for (auto [g, out, rows] : {std::tuple{&gu, &dact, S}, std::tuple{&sg, &dsact, M}}) {
    testcuda::DBuf<uint16_t> h16(size_t(rows) * I);
    g->y = nullptr, g->y16 = h16.p;
    ASSERT_TRUE(cuda::pf::gemm(*g, nullptr).is_ok());
    EXPECT_EQ(testcuda::count_not_half_of(h16.down(), out->down()), 0u)
        << (g == &gu ? "expert" : "shared") << " gate+up fp16 output " << dims({M, H, E, k, I});
  }
  // Single pass (gemm_wg.cu: s·q + b and x rounded once to fp16, 2^-11 relative each, random signs): a GEMM's
  // output is off by ~2^-11.5 of its rms, gate/up → SwiGLU → down → combine by ~1e-3 of the output's rms, the
  // largest of 10^4–10^6 outputs by ~5× that. Bound 1e-2·rms(ref); a wrong expert, row or group is off by
  // ~rms(ref).
  double sq = 0;
  for (float v : ref) sq += double(v) * v;
  const float rms = float(std::sqrt(sq / double(ref.size())));
  check("moe (router..comb.) single", dims({M, H, E, k, I}), dout.down(), ref, 1e-2f * rms, 0.f, &skip, H);
}
TEST(CudaPrefill, Moe) {
  LILY_PREFILL_REQUIRE_GPU();
  for (int terms : {2, 1}) {
    for (int M : {1, 2, 9, 65, 129}) moe_case(M, 256, 16, 4, 256, terms);
    moe_case(300, 2048, 256, 8, 512, terms);  // real shapes
    moe_case(4097, 256, 64, 8, 128, terms);   // many tiles, skewed counts (single pass: 128- and 64-row tiles)
    moe_case(2048, 512, 32, 8, 128, terms);   // ~512 rows an expert: full 128-row tiles and every remainder class
  }
}

}  // namespace
}  // namespace lily::test_prefill

// ---- CudaBatchTc: the batched step's expert kernels ------------------------------------------------------
namespace lily::test_batch {
namespace {

// fp32 values of packed rows (R of K): (hi + lo)·2^-e, in k order.
std::vector<float> unpack16(const std::vector<uint16_t>& X, const std::vector<uint16_t>* lo, const std::vector<float>& XS,
                            size_t R, int K) {
  auto f16 = [](uint16_t h) {
    const uint32_t s = uint32_t(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 0) return (s ? -1.f : 1.f) * std::ldexp(float(m), -24);
    uint32_t u = s | ((e + 112) << 23) | (m << 13);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> v(R * K);
  for (size_t r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) {
      const size_t i = r * K + cuda::qgemm_xpos(k);
      const double x = double(f16(X[i])) + (lo ? double(f16((*lo)[i])) : 0.0);
      v[r * K + k] = float(x * XS[(r * (K / 64) + k / 64) * 2 + 1]);
    }
  return v;
}


// Expert-major MoE as the batched step runs it: pack, route, gate+up+SwiGLU (packed for down), down,
// combine. A shared expert of the routed width I is the routing table's last item; of another width Is it
// runs apart as moe_tc runs it (dense gate+up, xpack16_swiglu, dense down into the shared rows of yd).
struct TcMoe {
  int H, I, E, k, Is;
  HQ gate, up, down, shgu, shd;
  TcMoe(int H_, int I_, int E_, int k_, int Is_)
      : H(H_), I(I_), E(E_), k(k_), Is(Is_), gate(E_ * I_, H_, 4), up(E_ * I_, H_, 4), down(E_ * H_, I_, 4),
        shgu(2 * Is_, H_, 4), shd(H_, Is_, 4) {}
  // out [B][H] and act (unpacked down inputs: [B·k][I] routed entries, then [B][Is] shared) for x [B][H],
  // ids [B][k], tw [B][k+1].
  void run(const std::vector<float>& xh, const std::vector<int32_t>& ids, const std::vector<float>& tw, int B,
           std::vector<float>& out, std::vector<float>& act) {
    const int nent = B * k + B;
    const bool apart = Is != I;
    D<float> x(xh), yd(size_t(nent) * H), dtw(tw), dout(size_t(B) * H), gu(apart ? size_t(B) * 2 * Is : 1);
    D<float> ws(std::max(cuda::qgemm_ws_floats(2 * Is, H, B), cuda::qgemm_ws_floats(H, Is, B)));
    D<int32_t> cnt(std::max(cuda::qgemm_counters(2 * Is, H, B), cuda::qgemm_counters(H, Is, B)));
    Packed16 pa(size_t(B), H), pb(size_t(nent), I), ps(size_t(B), Is);
    D<int32_t> dids(ids), items(size_t(E + 2) * 4), nit(4), rowb(static_cast<size_t>(nent)), ent(static_cast<size_t>(nent));
    ASSERT_TRUE(cuda::xpack16(x.p, H, H, B, pa.X.p, pa.XS.p, pa.Xlo.p, nullptr).is_ok());
    ASSERT_TRUE(cuda::broute(dids.p, B, k, E, items.p, nit.p, rowb.p, ent.p, !apart, nullptr).is_ok());
    cuda::QGemmArgs m{};
    m.w = gate.q, m.w2 = up.q, m.sh = apart ? QW{} : shgu.q, m.x = pa.X.p, m.xs = pa.XS.p, m.xlo = pa.Xlo.p;
    m.ldx = H, m.swiglu = true, m.yx = pb.X.p, m.yxs = pb.XS.p, m.yxlo = pb.Xlo.p, m.n_out = I;
    m.items = items.p, m.n_items = nit.p, m.max_items = std::min(B * k, E) + 1, m.E = E, m.xrow = rowb.p, m.yrow = ent.p;
    m.ent_hint = B * k;
    ASSERT_TRUE(cuda::qgemm(m, nullptr).is_ok());
    cuda::QGemmArgs g{};
    if (apart) {
      g.w = shgu.q, g.x = pa.X.p, g.xs = pa.XS.p, g.xlo = pa.Xlo.p, g.ldx = H, g.M = B, g.y = gu.p;
      g.ldy = 2 * Is, g.ws = ws.p, g.cnt = cnt.p;
      ASSERT_TRUE(cuda::qgemm(g, nullptr).is_ok());
      ASSERT_TRUE(cuda::xpack16_swiglu(gu.p, 2 * Is, Is, B, ps.X.p, ps.XS.p, ps.Xlo.p, nullptr).is_ok());
    }
    m.w = down.q, m.w2 = QW{}, m.sh = apart ? QW{} : shd.q, m.x = pb.X.p, m.xs = pb.XS.p, m.xlo = pb.Xlo.p;
    m.ldx = I, m.swiglu = false, m.yx = nullptr, m.yxs = nullptr, m.yxlo = nullptr, m.y = yd.p, m.ldy = H, m.n_out = H;
    m.xrow = ent.p;
    ASSERT_TRUE(cuda::qgemm(m, nullptr).is_ok());
    if (apart) {
      g.w = shd.q, g.x = ps.X.p, g.xs = ps.XS.p, g.xlo = ps.Xlo.p, g.ldx = Is, g.y = yd.p + size_t(B) * k * H;
      g.ldy = H;
      ASSERT_TRUE(cuda::qgemm(g, nullptr).is_ok());
    }
    ASSERT_TRUE(cuda::bmoe_combine(yd.p, dtw.p, k, H, B, dout.p, nullptr).is_ok());
    out = dout.get();
    const auto lo = pb.Xlo.get();
    act = unpack16(pb.X.get(), &lo, pb.XS.get(), size_t(apart ? B * k : nent), I);
    if (apart) {
      const auto slo = ps.Xlo.get();
      const auto sa = unpack16(ps.X.get(), &slo, ps.XS.get(), size_t(B), Is);
      act.insert(act.end(), sa.begin(), sa.end());
    }
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  }
  // The reference formula per row (cpu::qmatmul, fp32 activations): act of each routed slot and the
  // shared expert (k·I then Is values), out = Σ_j tw_j·down_j(act_j) + σ·sdown(act_s).
  void ref(const float* x, const int32_t* id, const float* tw, float* out, std::vector<float>& acts) {
    std::vector<double> acc(static_cast<size_t>(H), 0.0);
    std::vector<float> y(static_cast<size_t>(H));
    acts.clear();
    for (int j = 0; j <= k; ++j) {
      const bool sh = j == k;
      const int W = sh ? Is : I;
      std::vector<float> g(static_cast<size_t>(W)), u(static_cast<size_t>(W)), a(static_cast<size_t>(W));
      const QWeight wg = sh ? shgu.w.rows_slice(0, Is) : gate.w.rows_slice(id[j] * I, I);
      const QWeight wu = sh ? shgu.w.rows_slice(Is, Is) : up.w.rows_slice(id[j] * I, I);
      const QWeight wd = sh ? shd.w : down.w.rows_slice(id[j] * H, H);
      cpu::qmatmul(wg, x, 1, H, g.data(), W, false);
      cpu::qmatmul(wu, x, 1, H, u.data(), W, false);
      for (int i = 0; i < W; ++i) a[size_t(i)] = g[size_t(i)] / (1.f + std::exp(-g[size_t(i)])) * u[size_t(i)];
      acts.insert(acts.end(), a.begin(), a.end());
      cpu::qmatmul(wd, a.data(), 1, W, y.data(), H, false);
      for (int c = 0; c < H; ++c) acc[size_t(c)] += double(tw[j]) * y[size_t(c)];
    }
    for (int c = 0; c < H; ++c) out[c] = float(acc[size_t(c)]);
  }
};

// One MoE case for the expert kernels: R = 64 rows with their routing (expert 0 hot: every other row,
// so more than 8 rows at B = 64) and weights, the input rows, and the CPU reference's outputs and
// activations per row (k routed entries of I, then the shared expert's Is).
struct MoeCase {
  int H, I, E, k, Is, R = 64;
  std::vector<int32_t> ids;
  std::vector<float> tw, xh, refo, refa;
  explicit MoeCase(TcMoe& moe) : H(moe.H), I(moe.I), E(moe.E), k(moe.k), Is(moe.Is) {
    ids.resize(size_t(R) * k), tw.resize(size_t(R) * (k + 1));
    for (int r = 0; r < R; ++r) {
      std::vector<int32_t> perm(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
      std::shuffle(perm.begin(), perm.end(), rng());
      if (r % 2 == 1) std::iter_swap(perm.begin(), std::find(perm.begin(), perm.end(), 0));
      for (int j = 0; j < k; ++j) ids[size_t(r) * k + j] = perm[size_t(j)];
      for (int j = 0; j <= k; ++j) tw[size_t(r) * (k + 1) + j] = 0.05f + std::fabs(randn()) * 0.2f;
    }
    xh = act_rows(R, H);
    refo.resize(size_t(R) * H);
    std::vector<float> acts;
    for (int r = 0; r < R; ++r) {
      moe.ref(&xh[size_t(r) * H], &ids[size_t(r) * k], &tw[size_t(r) * (k + 1)], &refo[size_t(r) * H], acts);
      refa.insert(refa.end(), acts.begin(), acts.end());
    }
  }
  std::string shape(const char* tag) const {
    return "H " + std::to_string(H) + " I " + std::to_string(I) + (Is != I ? " Is " + std::to_string(Is) : "") + " E " +
           std::to_string(E) + " " + tag;
  }
};

// run(x, ids, tw, B, out, act): one kernel set over B rows. Checks its 64-row outputs and activations
// against the CPU reference (normwise, tol) and batch invariance (|Δ| = 0 at every B vs 64: row b
// of B holds row (7b + B) mod 64); returns the 64-row outputs and activations.
using MoeRun = std::function<void(const std::vector<float>&, const std::vector<int32_t>&, const std::vector<float>&, int,
                                  std::vector<float>&, std::vector<float>&)>;
void check_moe(const MoeCase& c, const std::string& label, const std::string& shape, const MoeRun& run,
               std::vector<float>& out64, std::vector<float>& act64, double tol) {
  const int H = c.H, I = c.I, Is = c.Is, k = c.k, R = c.R;
  run(c.xh, c.ids, c.tw, R, out64, act64);
  NormErr ne_out, ne_act;
  const size_t per_row = size_t(k) * I + Is;  // the reference's activations a row
  for (int r = 0; r < R; ++r) {
    ne_out.add(&out64[size_t(r) * H], &c.refo[size_t(r) * H], H);
    for (int j = 0; j < k; ++j)
      ne_act.add(&act64[(size_t(r) * k + j) * I], &c.refa[size_t(r) * per_row + size_t(j) * I], I);
    ne_act.add(&act64[size_t(R) * k * I + size_t(r) * Is], &c.refa[size_t(r) * per_row + size_t(k) * I], Is);
  }
  row((label + " act vs cpu (normwise)").c_str(), shape, R, float(ne_act.worst));
  row((label + " out vs cpu (normwise)").c_str(), shape, R, float(ne_out.worst));
  EXPECT_LE(ne_act.worst, tol) << shape;
  EXPECT_LE(ne_out.worst, tol) << shape;
  for (int B : kBs) {
    if (B == R) continue;
    std::vector<float> xb(size_t(B) * H), twb(size_t(B) * (k + 1));
    std::vector<int32_t> idb(size_t(B) * k);
    for (int b = 0; b < B; ++b) {
      const int src = (b * 7 + B) % R;
      std::copy_n(&c.xh[size_t(src) * H], H, &xb[size_t(b) * H]);
      std::copy_n(&c.ids[size_t(src) * k], k, &idb[size_t(b) * k]);
      std::copy_n(&c.tw[size_t(src) * (k + 1)], k + 1, &twb[size_t(b) * (k + 1)]);
    }
    std::vector<float> outb, actb;
    run(xb, idb, twb, B, outb, actb);
    float inv = 0.f;
    for (int b = 0; b < B; ++b)
      for (int col = 0; col < H; ++col)
        inv = std::max(inv, std::fabs(outb[size_t(b) * H + col] - out64[size_t((b * 7 + B) % R) * H + col]));
    row((label + " batch invariance").c_str(), shape, B, inv);
    EXPECT_EQ(inv, 0.f) << shape << " B " << B;
  }
}

// The model's shapes and edge shapes: one k stage, k stages that do not fill the 4-group stage
// (H 320), outputs past one unit's rows (down H 320 = 256 + 64) and under one (I 64); expert 0 hot.
TEST(CudaBatchTc, MoeMatchesCpuAndIsBatchInvariant) {
  LILY_REQUIRE_GPU();
  cpu::set_bf16_storage(false);
  // The last two: a shared expert wider and narrower than the routed ones (run apart from the table).
  struct S { int H, I, E, k, Is; };
  for (S s : {S{2048, 512, 64, 8, 512}, S{256, 64, 12, 4, 64}, S{320, 128, 24, 6, 128}, S{2048, 512, 256, 8, 512},
              S{320, 64, 16, 4, 128}, S{2048, 512, 64, 8, 256}}) {
    TcMoe moe(s.H, s.I, s.E, s.k, s.Is);
    const MoeCase c(moe);
    std::vector<float> out64, act64;
    auto run = [&](const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& tw, int B,
                   std::vector<float>& out, std::vector<float>& act) { moe.run(x, ids, tw, B, out, act); };
    check_moe(c, "qgemm moe", c.shape("two-pass"), run, out64, act64, kTolMoe);
  }
}

// The fused top-k + routing launch equals brouter_topk then broute (ids, weights and the table).
TEST(CudaBatchTc, RouteTopkFusedEqualsSplit) {
  LILY_REQUIRE_GPU();
  const int E = 256, k = 8;
  for (int B : kBs) {
    D<float> lg(randv(size_t(B) * (E + 1), 2.f));
    const int nent = B * k + B, mi = std::min(B * k, E) + 1;
    D<int32_t> ids(size_t(B) * k), ids2(size_t(B) * k), it(size_t(mi) * 4), it2(size_t(mi) * 4), n(4), n2(4);
    D<int32_t> rb(static_cast<size_t>(nent)), rb2(static_cast<size_t>(nent)), en(static_cast<size_t>(nent)), en2(static_cast<size_t>(nent));
    D<float> w(size_t(B) * (k + 1)), w2(size_t(B) * (k + 1));
    ASSERT_TRUE(cuda::brouter_topk(lg.p, E + 1, E, k, true, true, ids.p, w.p, B, nullptr).is_ok());
    ASSERT_TRUE(cuda::broute(ids.p, B, k, E, it.p, n.p, rb.p, en.p, true, nullptr).is_ok());
    ASSERT_TRUE(cuda::broute_topk(lg.p, E + 1, true, true, ids2.p, w2.p, B, k, E, it2.p, n2.p, rb2.p, en2.p, true, nullptr).is_ok());
    // Without the shared item (a shared expert of another width): the routed items alone, the same entries.
    D<int32_t> it3(size_t(mi) * 4), n3(4), rb3(static_cast<size_t>(nent)), en3(static_cast<size_t>(nent));
    ASSERT_TRUE(cuda::broute(ids.p, B, k, E, it3.p, n3.p, rb3.p, en3.p, false, nullptr).is_ok());
    const bool same = ids.get() == ids2.get() && w.get() == w2.get() && it.get() == it2.get() && n.get() == n2.get() &&
                      rb.get() == rb2.get() && en.get() == en2.get();
    // The table itself: every entry once, rows of an expert in (b, slot) order, expert ids ascending.
    const auto hid = ids.get(), hit = it.get(), hrb = rb.get(), hen = en.get();
    const auto hn = n.get();
    const int ni = hn[0];
    std::vector<int> seen(static_cast<size_t>(nent), 0);
    bool table_ok = ni >= 2 && hit[size_t(ni - 1) * 4] == E;
    int chunks = 0;  // items[i][3]: 8-row chunks before item i; n_items[1]: all chunks
    for (int i = 0; i < ni && table_ok; ++i) {
      const int e = hit[size_t(i) * 4], c = hit[size_t(i) * 4 + 1], o = hit[size_t(i) * 4 + 2];
      if (hit[size_t(i) * 4 + 3] != chunks) table_ok = false;
      chunks += (c + 7) / 8;
      if (i > 0 && e <= hit[size_t(i - 1) * 4]) table_ok = false;
      for (int j = 0; j < c && table_ok; ++j) {
        const int en_ = hen[size_t(o + j)];
        seen[size_t(en_)]++;
        if (j > 0 && en_ <= hen[size_t(o + j - 1)]) table_ok = false;
        if (e < E && (hid[size_t(en_)] != e || hrb[size_t(o + j)] != en_ / k)) table_ok = false;
        if (e == E && (en_ != B * k + j || hrb[size_t(o + j)] != j)) table_ok = false;
      }
    }
    table_ok = table_ok && hn[1] == chunks;
    for (int v : seen) table_ok = table_ok && v == 1;
    const auto hn3 = n3.get(), hit3 = it3.get(), hen3 = en3.get();
    bool apart_ok = hn3[0] == ni - 1 && hn3[1] == chunks - (B + 7) / 8 &&
                    std::equal(hit3.begin(), hit3.begin() + size_t(ni - 1) * 4, hit.begin()) &&
                    std::equal(hen3.begin(), hen3.begin() + size_t(B) * k, hen.begin());
    row("tc route table / fused top-k == split", "E 256 k 8", B, (same && table_ok) ? 0.f : 1.f);
    row("tc route table without the shared item", "E 256 k 8", B, apart_ok ? 0.f : 1.f);
    EXPECT_TRUE(same);
    EXPECT_TRUE(table_ok);
    EXPECT_TRUE(apart_ok);
  }
}

}  // namespace
}  // namespace lily::test_batch
#endif  // LILY_HAVE_CUDA
