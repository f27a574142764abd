// The Gated DeltaNet family (src/backend/cuda/deltanet/): CudaOps.GdnStep checks the decode step
// (gdn.cu, with its fused gated RMSNorm) against the CPU reference over several tokens (ops_util.h);
// CudaPrefill.GdnPrefill* the prefill (gdn_prefill.cu; the chunked WY form of gdn_chunk.cu), in pieces
// and as independent segments in one launch, against the reference (prefill_util.h);
// CudaBatch.GdnStepEqualsBatch1 the batched step (batch_gdn.cu) against gdn_step, bit for bit
// (batch_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/step/prefill_ops.h"
#include "core/bf16.h"
#include "batch_util.h"
#include "ops_util.h"
#include "prefill_util.h"

// ---- CudaOps: the decode step against the CPU reference ---------------------------------------------------
namespace lily::test_ops {
namespace {

// The state is stored in fp16: the reference rounds S to fp16 after each step, as the kernel stores it;
// the kernel's and the reference's fp32 sums may round to neighbouring halves, one ulp (up to 2^-10 of |S|,
// at the bottom of a binade) a step at most, carried on: the state's tolerance grows by 2^-10 a step.
void gdn_case(int nk, int nv, int dk, int dv, int steps) {
  const int K = 4, kd = nk * dk, vd = nv * dv, C = 2 * kd + vd;
  auto conv_w = rand_bf16(size_t(C) * K, 0.5f);
  auto conv_wb = as_bf16(conv_w);
  std::vector<float> A_log(nv);
  for (int h = 0; h < nv; ++h) A_log[h] = std::log(1.0f + 15.0f * randu());
  auto dt = rand_bf16(nv);
  std::vector<float> win(size_t(C) * (K - 1), 0.f), S(size_t(nv) * dk * dv, 0.f);
  DBuf<uint16_t> dconv_w(to_bits(conv_w)), ddt(to_bits(dt));
  DBuf<float> dA(A_log), dwin(size_t(2) * C * (K - 1)), dout(vd), dog(vd);
  DBuf<uint16_t> dS16(S.size());
  const auto gnorm = rand_bf16(dv, 0.2f, 1.f);
  DBuf<uint16_t> dgn(to_bits(gnorm));
  cudaMemset(dwin.p, 0, dwin.n * 4);
  cudaMemset(dS16.p, 0, dS16.n * 2);
  for (int t = 0; t < steps; ++t) {
    auto u = rand_bf16(size_t(C) + vd + 2 * nv);
    // reference (fp32 storage): conv + SiLU, split/normalize, gates, recurrence
    std::vector<float> c(C);
    cpu::conv_silu(u.data(), 1, C, C, K, conv_wb.data(), win.data(), c.data());
    std::vector<float> q(kd), k(kd), v(vd), g(nv), beta(nv), o(vd);
    const cpu::GdnDims dims{nk, nv, dk, dv};
    cpu::gdn_split_qkv(dims, 1, c.data(), q.data(), k.data(), v.data());
    cpu::gdn_gates(1, nv, u.data() + C + vd, u.data() + C + vd + nv, A_log.data(), as_bf16(dt).data(), g.data(), beta.data());
    cpu::gdn_recurrent(dims, 1, q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), o.data());
    for (auto& x : S) x = testcuda::round_half(x);
    // device
    DBuf<float> du(u);
    cuda::GdnArgs a{};
    a.u = du.p, a.conv_w = dconv_w.p, a.conv = dwin.p, a.A_log = dA.p, a.dt_bias = ddt.p;
    a.S = dS16.p;
    a.o = dout.p, a.pos = t, a.nk = nk, a.nv = nv, a.dk = dk, a.dv = dv, a.K = K;
    // Fused gated RMSNorm (clusters of dv/32 blocks): z is the z projection inside u, as in the step.
    a.z = du.p + C, a.gnorm = dgn.p, a.og = dog.p, a.eps = 1e-6f;
    ASSERT_TRUE(cuda::gdn_step(a, nullptr).is_ok());
    const std::string sh = "nk" + std::to_string(nk) + " nv" + std::to_string(nv) + " d" + std::to_string(dk) + "x" +
                           std::to_string(dv) + " step " + std::to_string(t);
    if (t == 0 || t == steps - 1) {
      check("gdn step: readout o (fp32)", sh, dout.down(), o, 1e-4f, 1e-3f);
      check("gdn step: state S (fp16)", sh, testcuda::from_halves(dS16.down()), S, 1e-5f, 1e-4f + float(t + 1) * 0x1p-10f);
      std::vector<float> og(vd);  // model-spec gated RMSNorm of the reference readout
      for (int h = 0; h < nv; ++h) {
        float ss = 0;
        for (int d = 0; d < dv; ++d) ss += o[h * dv + d] * o[h * dv + d];
        const float inv = 1.0f / std::sqrt(ss / dv + 1e-6f);
        for (int d = 0; d < dv; ++d) {
          const float zz = u[C + h * dv + d];
          og[h * dv + d] = gnorm[d] * o[h * dv + d] * inv * (zz / (1.0f + std::exp(-zz)));
        }
      }
      check("gdn step: + gated rmsnorm", sh, dog.down(), og, 1e-4f, 1e-3f);
    } else {
      cudaDeviceSynchronize();
    }
  }
}
TEST(CudaOps, GdnStep) {
  LILY_OPS_REQUIRE_GPU();
  gdn_case(16, 32, 128, 128, 6);
  gdn_case(2, 4, 128, 128, 5);
  gdn_case(4, 4, 128, 128, 3);
  gdn_case(1, 2, 128, 128, 4);  // small-seed11 golden
  gdn_case(2, 4, 32, 64, 5);    // wide-seed23 golden
  gdn_case(2, 4, 64, 64, 5);    // golden-small-seed7
}

}  // namespace
}  // namespace lily::test_ops

// ---- CudaPrefill: the prefill against the CPU reference ---------------------------------------------------
namespace lily::test_prefill {
namespace {

struct GdnCase {
  int nk, nv, K = 4;
  std::vector<float> conv_w, A_log, dt_bias, gnorm;
  GdnCase(int nk_, int nv_) : nk(nk_), nv(nv_) {
    const int C = 2 * nk * 128 + nv * 128;
    conv_w = rand_bf16(size_t(C) * K, 0.5f);
    A_log = randv(nv, 0.5f);
    dt_bias = rand_bf16(nv, 0.5f);
    gnorm = rand_bf16(128, 0.2f, 1.f);
  }
  // CPU: u [M, ldu] → out [M, vd] (gated-norm applied); window [C, K-1] fp32 and S advance.
  void cpu(const std::vector<float>& u, int M, int ldu, std::vector<float>& win, std::vector<float>& S, std::vector<float>& out) {
    const int C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128;
    std::vector<float> c(size_t(M) * C), q(size_t(M) * kd), k(size_t(M) * kd), v(size_t(M) * vd), a(size_t(M) * nv), b(size_t(M) * nv);
    auto wb = as_bf16(conv_w), db = as_bf16(dt_bias);
    cpu::conv_silu(u.data(), M, ldu, C, K, wb.data(), win.data(), c.data());
    const cpu::GdnDims d{nk, nv, 128, 128};
    cpu::gdn_split_qkv(d, M, c.data(), q.data(), k.data(), v.data());
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nv; ++h) a[size_t(m) * nv + h] = u[size_t(m) * ldu + C + vd + h], b[size_t(m) * nv + h] = u[size_t(m) * ldu + C + vd + nv + h];
    std::vector<float> g(size_t(M) * nv), beta(size_t(M) * nv), o(size_t(M) * vd);
    cpu::gdn_gates(M, nv, a.data(), b.data(), A_log.data(), db.data(), g.data(), beta.data());
    cpu::gdn_recurrent(d, M, q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), o.data());
    out.resize(size_t(M) * vd);
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nv; ++h) {
        float ss = 0;
        for (int i = 0; i < 128; ++i) ss += o[(size_t(m) * nv + h) * 128 + i] * o[(size_t(m) * nv + h) * 128 + i];
        const float inv = 1.f / std::sqrt(ss / 128 + 1e-6f);
        for (int i = 0; i < 128; ++i) {
          const float z = u[size_t(m) * ldu + C + h * 128 + i];
          out[(size_t(m) * nv + h) * 128 + i] = gnorm[i] * o[(size_t(m) * nv + h) * 128 + i] * inv * (z / (1.f + std::exp(-z)));
        }
      }
  }
};

// The recurrence in the chunked WY form (gdn_chunk.cu). The state is stored in fp16, read once and written
// once a piece: the reference rounds S to fp16 at the same points (its first value, and after each piece);
// its tolerance adds the two neighbouring halves a piece may round to (one ulp: up to 2^-10 of |S|).
// terms 1 (single pass, the long chunks' form): every product's operands rounded once to tf32 (2^-11 relative),
// stated tolerance 1e-2 absolute + relative on the outputs and the state (~20 such roundings: the WY inverse and
// the state passing compound them over a chunk; a wrong chunk, row, decay or state slice is off by ~|o|).
void gdn_case(GdnCase& G, std::vector<int> pieces, bool nonzero_state, int terms = 3) {
  const int nk = G.nk, nv = G.nv, C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128, W = G.K - 1;
  const int ldu = C + vd + 2 * nv;
  int Mt = 0;
  for (int p : pieces) Mt += p;
  auto u = randv(size_t(Mt) * ldu, 0.5f);
  std::vector<float> win = nonzero_state ? rand_bf16(size_t(C) * W) : std::vector<float>(size_t(C) * W, 0.f);
  // Window buffers: fp32, each [C, K-1], alternated by parity.
  DBuf<float> wb0(win), wb1(win.size());
  std::vector<float> S = nonzero_state ? randv(size_t(nv) * 128 * 128, 0.05f) : std::vector<float>(size_t(nv) * 128 * 128, 0.f);
  for (auto& x : S) x = testcuda::round_half(x);
  DBuf<uint16_t> dcw(to_bits(G.conv_w)), ddt(to_bits(G.dt_bias)), dgn(to_bits(G.gnorm)), dS16(testcuda::halves(S));
  DBuf<float> dA(G.A_log), du(u);
  const int Mmax = *std::max_element(pieces.begin(), pieces.end());
  DBuf<float> qn(size_t(Mmax) * kd), kn(size_t(Mmax) * kd), v(size_t(Mmax) * vd), g(size_t(Mmax) * nv), be(size_t(Mmax) * nv);
  DBuf<float> oraw(size_t(Mmax) * vd), o(size_t(Mt) * vd);
  DBuf<float> wy(cuda::pf::gdn_wy_floats(Mmax, nv));
  int t0 = 0, par = 0;
  for (int M : pieces) {
    cuda::pf::GdnPrefillArgs a{};
    a.u = du.p + size_t(t0) * ldu, a.ldu = ldu, a.M = M;
    // Alternate the window buffers as the decode layout does (same buffer when M is even).
    float* bufs[2] = {wb0.p, wb1.p};
    a.win_in = bufs[par], a.win_out = bufs[par ^ (M & 1)];
    a.conv_w = dcw.p, a.A_log = dA.p, a.dt_bias = ddt.p, a.gnorm = dgn.p, a.S = dS16.p, a.nk = nk, a.nv = nv, a.K = G.K;
    a.qn = qn.p, a.kn = kn.p, a.v = v.p, a.g = g.p, a.beta = be.p, a.o_raw = oraw.p, a.o = o.p + size_t(t0) * vd;
    a.wy = wy.p, a.terms = terms;
    ASSERT_TRUE(cuda::pf::gdn_prefill(a, nullptr).is_ok());
    par ^= (M & 1);
    t0 += M;
  }
  // CPU piece by piece (as the GPU ran).
  std::vector<float> ref, Sref = S, wref = win;
  t0 = 0;
  for (int M : pieces) {
    std::vector<float> up(u.begin() + size_t(t0) * ldu, u.begin() + size_t(t0 + M) * ldu), o1;
    G.cpu(up, M, ldu, wref, Sref, o1);
    for (auto& x : Sref) x = testcuda::round_half(x);
    ref.insert(ref.end(), o1.begin(), o1.end());
    t0 += M;
  }
  std::string shape = dims({nk, nv}) + " M=";
  for (size_t i = 0; i < pieces.size(); ++i) shape += (i ? "+" : "") + std::to_string(pieces[i]);
  if (nonzero_state) shape += " S0≠0";
  if (terms == 1) shape += " single pass";
  // The chunked form uses 3xTF32 products (~fp32); the fp16 state one rounding a piece (≤ 2^-10 of |S|) more.
  const float to = terms == 1 ? 1e-2f : 5e-4f, ts = terms == 1 ? 1e-2f : 2e-4f, ts16 = ts + float(pieces.size()) * 0x1p-10f;
  check("gdn chunk out", shape, o.down(), ref, to, to);
  check("gdn chunk state (fp16)", shape, testcuda::from_halves(dS16.down()), Sref, ts, ts16);
  check("gdn prefill window", shape, (par ? wb1 : wb0).down(), wref, 0.f, 0.f);
}
TEST(CudaPrefill, GdnPrefill) {
  LILY_PREFILL_REQUIRE_GPU();
  GdnCase small(2, 4), real(16, 32);
  for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097}) gdn_case(small, {M}, M % 2 == 1);
  gdn_case(small, {3, 64, 1, 130}, true);
  gdn_case(real, {129}, false);
  gdn_case(real, {65, 2, 200}, true);
  gdn_case(real, {4097}, true);
  gdn_case(small, {64, 63, 1, 129, 4096, 5}, true);  // pieces on and off chunk boundaries
}

// The single-pass form (terms 1) on the real head counts at long chunks, continuing a state, and the small
// shape over pieces on and off the 64-token chunk boundaries.
TEST(CudaPrefill, GdnPrefillSinglePass) {
  LILY_PREFILL_REQUIRE_GPU();
  GdnCase small(2, 4), real(16, 32);
  gdn_case(real, {1024}, false, 1);
  gdn_case(real, {2048, 1030}, true, 1);
  gdn_case(small, {64, 63, 1, 129, 4096, 5}, true, 1);
  gdn_case(small, {4097}, true, 1);
}

// Several independent sequences in one launch per kernel (pf::gdn_prefill_segments: the mixed serving
// step's segments), each with its own state, window, rows of u and scratch: bit-identical to
// gdn_prefill on each alone, and within the chunked form's tolerance of the CPU reference.
void gdn_segments_case(GdnCase& G, const std::vector<int>& lens) {
  const int nk = G.nk, nv = G.nv, C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128, W = G.K - 1;
  const int ldu = C + vd + 2 * nv, n = int(lens.size());
  int Mt = 0, Mmax = 0;
  size_t wyt = 0;
  for (int L : lens) Mt += L, Mmax = std::max(Mmax, L), wyt += cuda::pf::gdn_wy_floats(L, nv);
  auto u = randv(size_t(Mt) * ldu, 0.5f);
  DBuf<uint16_t> dcw(to_bits(G.conv_w)), ddt(to_bits(G.dt_bias)), dgn(to_bits(G.gnorm));
  DBuf<float> dA(G.A_log), du(u);
  std::vector<std::vector<float>> win(n), S(n);
  // Three copies of every sequence's state: [0] for the segments launch, [1] for one launch each, [2] for one
  // launch each with the output as fp16 (o16).
  std::vector<std::unique_ptr<DBuf<float>>> wb[3][2];
  std::vector<std::unique_ptr<DBuf<uint16_t>>> dS[3];  // fp16 states
  for (int j = 0; j < n; ++j) {
    win[j] = rand_bf16(size_t(C) * W);
    S[j] = randv(size_t(nv) * 128 * 128, 0.05f);
    for (auto& x : S[j]) x = testcuda::round_half(x);
    for (int c = 0; c < 3; ++c) {
      wb[c][0].push_back(std::make_unique<DBuf<float>>(win[j]));
      wb[c][1].push_back(std::make_unique<DBuf<float>>(win[j].size()));
      dS[c].push_back(std::make_unique<DBuf<uint16_t>>(testcuda::halves(S[j])));
    }
  }
  DBuf<float> qn(size_t(Mt) * kd), kn(size_t(Mt) * kd), v(size_t(Mt) * vd), g(size_t(Mt) * nv), be(size_t(Mt) * nv);
  DBuf<float> oraw(size_t(Mt) * vd), o(size_t(Mt) * vd), o1(size_t(Mt) * vd), wy(wyt);
  std::vector<cuda::pf::GdnPrefillArgs> args(n);
  int t0 = 0, longest = 0;
  size_t wo = 0;
  for (int j = 0; j < n; ++j) {
    cuda::pf::GdnPrefillArgs& a = args[j];
    const int M = lens[j];
    a.u = du.p + size_t(t0) * ldu, a.ldu = ldu, a.M = M;
    a.win_in = wb[0][0][j]->p, a.win_out = wb[0][M & 1][j]->p;
    a.conv_w = dcw.p, a.A_log = dA.p, a.dt_bias = ddt.p, a.gnorm = dgn.p, a.S = dS[0][j]->p, a.nk = nk, a.nv = nv, a.K = G.K;
    a.qn = qn.p + size_t(t0) * kd, a.kn = kn.p + size_t(t0) * kd, a.v = v.p + size_t(t0) * vd, a.g = g.p + size_t(t0) * nv;
    a.beta = be.p + size_t(t0) * nv, a.o_raw = oraw.p + size_t(t0) * vd, a.o = o.p + size_t(t0) * vd, a.wy = wy.p + wo;
    if (M > lens[longest]) longest = j;
    t0 += M, wo += cuda::pf::gdn_wy_floats(M, nv);
  }
  DBuf<uint8_t> dargs(args.size() * sizeof(cuda::pf::GdnPrefillArgs));
  cudaMemcpy(dargs.p, args.data(), args.size() * sizeof(cuda::pf::GdnPrefillArgs), cudaMemcpyHostToDevice);
  ASSERT_TRUE(cuda::pf::gdn_prefill_segments(args[longest], reinterpret_cast<const cuda::pf::GdnPrefillArgs*>(dargs.p), n, nullptr).is_ok());
  // One launch each, on the second copies of the states, same scratch rows.
  t0 = 0;
  for (int j = 0; j < n; ++j) {
    cuda::pf::GdnPrefillArgs a = args[j];
    a.win_in = wb[1][0][j]->p, a.win_out = wb[1][lens[j] & 1][j]->p, a.S = dS[1][j]->p, a.o = o1.p + size_t(t0) * vd;
    ASSERT_TRUE(cuda::pf::gdn_prefill(a, nullptr).is_ok());
    t0 += lens[j];
  }
  // Again with the output as fp16 bits (GdnPrefillArgs::o16, the single-pass prefill's out_proj input).
  DBuf<uint16_t> o16(size_t(Mt) * vd);
  t0 = 0;
  for (int j = 0; j < n; ++j) {
    cuda::pf::GdnPrefillArgs a = args[j];
    a.win_in = wb[2][0][j]->p, a.win_out = wb[2][lens[j] & 1][j]->p, a.S = dS[2][j]->p, a.o = nullptr;
    a.o16 = o16.p + size_t(t0) * vd;
    ASSERT_TRUE(cuda::pf::gdn_prefill(a, nullptr).is_ok());
    t0 += lens[j];
  }
  EXPECT_EQ(testcuda::count_not_half_of(o16.down(), o1.down()), 0u) << "gdn fp16 output (o16) is not the fp32 output rounded to nearest";
  std::string shape = dims({nk, nv}) + " segments ";
  for (int j = 0; j < n; ++j) shape += (j ? "+" : "") + std::to_string(lens[j]);
  check("gdn segments out == alone", shape, o.down(), o1.down(), 0.f, 0.f);
  std::vector<float> ref, got_S, ref_S, alone_S;
  t0 = 0;
  for (int j = 0; j < n; ++j) {
    std::vector<float> up(u.begin() + size_t(t0) * ldu, u.begin() + size_t(t0 + lens[j]) * ldu), out1, w = win[j], s = S[j];
    G.cpu(up, lens[j], ldu, w, s, out1);
    ref.insert(ref.end(), out1.begin(), out1.end());
    auto a = testcuda::from_halves(dS[0][j]->down()), b = testcuda::from_halves(dS[1][j]->down());
    for (auto& x : s) x = testcuda::round_half(x);
    got_S.insert(got_S.end(), a.begin(), a.end()), alone_S.insert(alone_S.end(), b.begin(), b.end());
    ref_S.insert(ref_S.end(), s.begin(), s.end());
    t0 += lens[j];
  }
  check("gdn segments state == alone", shape, got_S, alone_S, 0.f, 0.f);
  check("gdn segments out", shape, o.down(), ref, 5e-4f, 5e-4f);
  check("gdn segments state (fp16)", shape, got_S, ref_S, 2e-4f, 2e-4f + 0x1p-10f);  // one rounding to fp16 more (≤ 2^-10)
}
TEST(CudaPrefill, GdnPrefillSegments) {
  LILY_PREFILL_REQUIRE_GPU();
  GdnCase small(2, 4), real(16, 32);
  gdn_segments_case(small, {5, 64, 65, 2, 130});
  gdn_segments_case(small, {96, 7});
  gdn_segments_case(real, {96, 96, 33, 129, 2});
}

}  // namespace
}  // namespace lily::test_prefill

// ---- CudaBatch: the batched step against gdn_step ---------------------------------------------------------
namespace lily::test_batch {
namespace {

// Positions of row b: one at 0, the others spread (some odd, some even: the conv window parity).
int pos_of(int b) { return b == 0 ? 0 : (b * 37 + 5) % 300; }

// The fp16 states of both kernels equal bit for bit too.
TEST(CudaBatch, GdnStepEqualsBatch1) {
  LILY_REQUIRE_GPU();
  const int nk = 16, nv = 32, dk = 128, dv = 128, K = 4, C = 2 * nk * dk + nv * dv, vd = nv * dv, ldu = C + vd + 2 * nv;
  D<uint16_t> conv_w(randbf(size_t(C) * K, 0.f, 0.3f)), dt_bias(randbf(nv, 0.f, 0.5f)), gnorm(randbf(dv, 1.f, 0.2f));
  D<float> A_log(randv(nv, 0.5f));
  for (int B : kBs) {
    const size_t Sn = size_t(nv) * dk * dv, Wn = size_t(2) * C * (K - 1);
    std::vector<float> W0 = randv(Wn * B, 0.5f);
    const std::vector<uint16_t> S0h = testcuda::halves(randv(Sn * B, 0.1f));
    D<float> Wb(W0), W1(W0), u(randv(size_t(B) * ldu, 0.7f)), og(size_t(B) * vd), og1(size_t(B) * vd), o1(size_t(B) * vd);
    D<uint16_t> Sbh(S0h), S1h(S0h);
    std::vector<void*> hc(static_cast<size_t>(B));
    std::vector<uint16_t*> hs(static_cast<size_t>(B));
    std::vector<int32_t> hp(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) hc[size_t(b)] = Wb.p + Wn * b, hs[size_t(b)] = Sbh.p + Sn * b, hp[size_t(b)] = pos_of(b);
    D<void*> tc(hc);
    D<uint16_t*> ts(hs);
    D<int32_t> tp(hp);
    cuda::BGdnArgs g{};
    g.u = u.p, g.ldu = ldu, g.conv_w = conv_w.p, g.conv = tc.p, g.S = ts.p, g.pos = tp.p, g.A_log = A_log.p;
    g.dt_bias = dt_bias.p, g.gnorm = gnorm.p, g.og = og.p, g.ldo = vd, g.nk = nk, g.nv = nv, g.dk = dk, g.dv = dv, g.K = K, g.B = B;
    D<float> prep(size_t(B) * cuda::bgdn_prep_floats(nk, nv, dk, dv));
    g.prep = prep.p;
    ASSERT_TRUE(cuda::bgdn_step(g, nullptr).is_ok());
    for (int b = 0; b < B; ++b) {
      cuda::GdnArgs a{};
      a.u = u.p + size_t(b) * ldu, a.conv_w = conv_w.p, a.conv = W1.p + Wn * b, a.S = S1h.p + Sn * b;
      a.A_log = A_log.p, a.dt_bias = dt_bias.p, a.o = o1.p + size_t(b) * vd, a.pos = pos_of(b), a.nk = nk, a.nv = nv;
      a.dk = dk, a.dv = dv, a.K = K, a.z = u.p + size_t(b) * ldu + C, a.gnorm = gnorm.p, a.og = og1.p + size_t(b) * vd;
      ASSERT_TRUE(cuda::gdn_step(a, nullptr).is_ok());
    }
    const float e1 = max_diff(og.get(), og1.get()), e3 = max_diff(Wb.get(), W1.get());
    const float e2 = max_diff(testcuda::from_halves(Sbh.get()), testcuda::from_halves(S1h.get()));
    const char* sh = "32x128x128 fp16 S";
    row("gdn step readout (gated norm)", sh, B, e1);
    row("gdn step state S", sh, B, e2);
    row("gdn step conv window", "C 8192 K 4", B, e3);
    EXPECT_EQ(e1, 0.f);
    EXPECT_EQ(e2, 0.f);
    EXPECT_EQ(e3, 0.f);
  }
}

}  // namespace
}  // namespace lily::test_batch
#endif  // LILY_HAVE_CUDA
