// The row kernels of src/backend/cuda/common/ (embed.cu, norm.cu) against the CPU reference: CudaOps.*
// (ops_util.h says how). The prefill's row kernels (prefill_elem.cu) run inside CudaPrefill.TinyModel.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "core/bf16.h"
#include "ops_util.h"

// ---- CudaOps: embedding rows and standalone add + RMSNorm -------------------------------------------------
namespace lily::test_ops {
namespace {

// ---------------------------------------------------------------- standalone add + rmsnorm
TEST(CudaOps, AddRmsNorm) {
  LILY_OPS_REQUIRE_GPU();
  for (int H : {2048, 256, 96}) {
    auto x = rand_bf16(H, 3.f), mix = rand_bf16(H), gain = rand_bf16(H, 0.2f, 1.f);
    std::vector<float> r(H), n(H);
    for (int i = 0; i < H; ++i) r[i] = x[i] + mix[i];
    auto gb = as_bf16(gain);
    cpu::rmsnorm(r.data(), 1, H, gb.data(), 1e-6f, n.data());
    DBuf<float> dx(x), dm(mix), dr(H), dn(H);
    DBuf<uint16_t> dg(to_bits(gain));
    ASSERT_TRUE(cuda::add_rmsnorm(dx.p, dm.p, dg.p, H, 1e-6f, dr.p, dn.p, nullptr).is_ok());
    check("add_rmsnorm residual", dims({H}), dr.down(), r, 0, 0);
    check("add_rmsnorm normed", dims({H}), dn.down(), n, 1e-5f, 1e-5f);
  }
}

// ---------------------------------------------------------------- embedding
TEST(CudaOps, Embed) {
  LILY_OPS_REQUIRE_GPU();
  for (auto [V, H] : {std::pair{248320, 2048}, std::pair{100, 256}}) {
    HostQ E(V, H, 4, std::sqrt(float(H)));
    DevQ D({&E.w});
    for (int tok : {0, V - 1, V / 3}) {
      std::vector<float> ref(H);
      int32_t t = tok;
      cpu::embed_rows(E.w, std::span<const int32_t>(&t, 1), ref.data());
      DBuf<float> dx(H);
      ASSERT_TRUE(cuda::embed_row(D.q, nullptr, tok, dx.p, nullptr).is_ok());
      check("embed row", dims({V, H}) + " tok " + std::to_string(tok), dx.down(), ref, 0, 0);
    }
    // Rows from a device token array (the prefill and the batched step), repeats and both ends included.
    const std::vector<int32_t> toks = {V - 1, 0, V / 3, 7 % V, V - 1, V / 2};
    const int M = int(toks.size());
    std::vector<float> ref(size_t(M) * H);
    cpu::embed_rows(E.w, toks, ref.data());
    DBuf<int32_t> dt(toks);
    DBuf<float> dx(size_t(M) * H);
    ASSERT_TRUE(cuda::embed_rows(D.q, dt.p, M, dx.p, nullptr).is_ok());
    check("embed rows", dims({V, H}) + " M " + std::to_string(M), dx.down(), ref, 0, 0);
  }
}

}  // namespace
}  // namespace lily::test_ops
#endif  // LILY_HAVE_CUDA
