// Drivers of the DeltaNet prefill kernels (fast_gdn.h): work items over fast::parallel_dynamic,
// per-thread workspaces kept between calls.
#include "backend/cpu/fast_gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/fast_ops.h"

namespace lily::cpu::fast {

bool gdn_chunked_ok(const GdnDims& d) {
  return d.dk % 64 == 0 && d.dv % 64 == 0 && d.dk > 0 && d.dv > 0 && d.n_k_heads > 0 &&
         d.n_v_heads % d.n_k_heads == 0;
}

void gdn_chunked(const GdnDims& d, int M, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* S, float* out) {
  const KernelTable& kt = kernels();
  const int ratio = d.n_v_heads / d.n_k_heads;
  const size_t ws_n = gdn_chunk_ws_floats(d.dk, d.dv);
  // One item per key head: its value heads share K Kᵀ and Q Kᵀ; chunks run in order (the state).
  parallel_dynamic(d.n_k_heads, [&](int kh) {
    thread_local std::vector<float> ws;
    if (ws.size() < ws_n) ws.resize(ws_n);
    GdnChunkArgs a;
    a.dk = d.dk, a.dv = d.dv, a.n_heads = ratio;
    a.ldqk = d.n_k_heads * d.dk, a.ldv = d.n_v_heads * d.dv, a.ldg = d.n_v_heads, a.ldo = d.n_v_heads * d.dv;
    a.S = S + size_t(kh) * ratio * d.dk * d.dv;
    a.ws = ws.data();
    for (int t0 = 0; t0 < M; t0 += kGdnChunk) {
      a.n = std::min(kGdnChunk, M - t0);
      a.q = q + size_t(t0) * a.ldqk + size_t(kh) * d.dk;
      a.k = k + size_t(t0) * a.ldqk + size_t(kh) * d.dk;
      a.v = v + size_t(t0) * a.ldv + size_t(kh) * ratio * d.dv;
      a.g = g + size_t(t0) * a.ldg + size_t(kh) * ratio;
      a.beta = beta + size_t(t0) * a.ldg + size_t(kh) * ratio;
      a.out = out + size_t(t0) * a.ldo + size_t(kh) * ratio * d.dv;
      kt.gdn_chunk(a);
    }
  });
}

void conv4_silu(const float* u, int M, int ldu, int C, const bf16* w, float* window, float* out) {
  const KernelTable& kt = kernels();
  const int block = M == 1 ? 1024 : 64;  // channels per item (one token: a few items, each a few hundred ns)
  parallel_dynamic((C + block - 1) / block, [&](int b) {
    const int c0 = b * block, c1 = std::min(C, c0 + block);
    kt.conv4_silu(u, M, ldu, c0, c1, C, w, window, out);
  });
}

void conv_silu(const float* u, int M, int ldu, int C, int K, const bf16* w, float* window, float* out) {
  if (K != 4) {
    cpu::conv_silu(u, M, ldu, C, K, w, window, out);
    return;
  }
  conv4_silu(u, M, ldu, C, w, window, out);
  if (bf16_storage())
    for (size_t i = 0; i < size_t(M) * C; ++i) out[i] = store(out[i]);
}

void gated_norm(float* o, const float* z, const bf16* w, int rows, int dv, float eps) {
  if (bf16_storage() || dv % 16 != 0 || dv > 512) {
    for (int r = 0; r < rows; ++r) {
      float* oh = o + size_t(r) * dv;
      const float* zh = z + size_t(r) * dv;
      float ss = 0;
      for (int d = 0; d < dv; ++d) {
        oh[d] = store(oh[d]);
        ss += oh[d] * oh[d];
      }
      const float inv = 1.0f / std::sqrt(ss / dv + eps);
      for (int d = 0; d < dv; ++d) oh[d] = store(bf16_to_f32(w[d]) * oh[d] * inv * (zh[d] / (1.0f + std::exp(-zh[d]))));
    }
    return;
  }
  const KernelTable& kt = kernels();
  constexpr int kRows = 64;  // rows per item
  parallel_dynamic((rows + kRows - 1) / kRows, [&](int b) {
    const int r0 = b * kRows, n = std::min(rows, r0 + kRows) - r0;
    kt.gated_norm(o + size_t(r0) * dv, z + size_t(r0) * dv, w, n, dv, eps);
  });
}

void silu_mul(float* g, const float* u, size_t n) {
  if (bf16_storage()) {
    for (size_t i = 0; i < n; ++i) {
      const float x = store(g[i]);
      g[i] = store(x / (1.0f + std::exp(-x)) * store(u[i]));
    }
    return;
  }
  const KernelTable& kt = kernels();
  constexpr size_t kItem = 16384;  // elements per item
  parallel_dynamic(int((n + kItem - 1) / kItem), [&](int b) {
    const size_t i0 = size_t(b) * kItem;
    kt.silu_mul(g + i0, u + i0, std::min(kItem, n - i0));
  });
}

void rmsnorm(const float* x, int M, int n, const bf16* gain, float eps, float* out) {
  if (bf16_storage() || n % 16 != 0) {
    cpu::rmsnorm(x, M, n, gain, eps, out);
    return;
  }
  std::vector<float> gf(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) gf[size_t(i)] = bf16_to_f32(gain[i]);
  const KernelTable& kt = kernels();
  constexpr int kRows = 16;  // rows per item
  parallel_dynamic((M + kRows - 1) / kRows, [&](int b) {
    const int r0 = b * kRows, nr = std::min(M, r0 + kRows) - r0;
    kt.rmsnorm(x + size_t(r0) * n, nr, n, gf.data(), eps, out + size_t(r0) * n);
  });
}

}  // namespace lily::cpu::fast
