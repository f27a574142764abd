// Attention prefill: (1) per token and head, q/k RMSNorm + partial NeoX RoPE; K/V written into the
// fp32 cache at their positions, q to a scratch: bf16 hi and lo = q − hi (terms 3) or fp16 (terms 1);
// (2) causal GQA flash attention on wgmma (attn_wg.cu): terms 3 takes every operand x as bf16 hi + lo
// (lo = bf16(x − hi)) and each product as hi·hi + hi·lo + lo·hi, ~16-bit operands instead of 8 (one bf16
// rounding of K/V alone moves the random golden models' logprobs by ~0.2; helpers-common numerics
// finding); terms 1 (the long chunks, which always run alone) rounds each operand once to fp16 (11 bits)
// and runs one product (attn_wg16.cuh). The plain-bf16
// mma.sync kernel went with the bf16 cache option (16-bit caches measured outside the precision budget:
// docs/switches.md, docs/perf/2026-12-06-kv-f16.md); its split-operand variant lost to wgmma, +1.6% /
// +4.0% prefill at 8k / 32k (docs/perf/2026-12-03-cuda-prefill-4.md).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/attention/attn_common.cuh"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/step/prefill_ops.h"

namespace lily::cuda::pf {
namespace {

// Grid (rows of the longest segment, nh + nkv, segments): block (m, head) of segment z.
__global__ void prep_kernel(AttnPrefillArgs base, AttnSegs segs) {
  extern __shared__ float xsh[];
  __shared__ float red[32];
  const AttnSeg& sg = segs.s[blockIdx.z];
  if (int(blockIdx.x) >= sg.M) return;  // block-uniform
  const AttnPrefillArgs a = seg_attn_args(base, sg);
  const int m = blockIdx.x, b = blockIdx.y, d = threadIdx.x, hd = a.hd, pos = a.pos0 + m;
  const float* u = a.u + size_t(m) * a.ldu;
  const bool is_q = b < a.nh;
  const int kvh = b - a.nh;
  const float raw = is_q ? u[b * a.qw + d] : u[a.nh * a.qw + kvh * hd + d];
  const float y = qk_norm_rope(raw, static_cast<const uint16_t*>(is_q ? a.q_norm : a.k_norm), hd, a.eps, a.rot, a.theta, pos, xsh, red);
  if (is_q && a.terms == 1) {
    static_cast<__half*>(a.qb)[(size_t(m) * a.nh + b) * hd + d] = __float2half_rn(y);
  } else if (is_q) {
    uint16_t* qb = static_cast<uint16_t*>(a.qb) + (size_t(m) * a.nh + b) * hd + d;
    const uint16_t hi = to_bf(y);
    qb[0] = hi;
    qb[size_t(a.M) * a.nh * hd] = to_bf(y - bf(hi));
  } else {
    const size_t at = (size_t(kvh) * a.max_seq + pos) * hd + d;
    const float vv = u[a.nh * a.qw + a.nkv * hd + kvh * hd + d];
    static_cast<float*>(a.kc)[at] = y;
    static_cast<float*>(a.vc)[at] = vv;
  }
}

}  // namespace

Status attn_prefill(const AttnPrefillArgs& a, Stream stream) {
  AttnSeg sg;
  sg.u = a.u, sg.out = a.out, sg.out16 = a.out16, sg.kc = a.kc, sg.vc = a.vc, sg.qb = a.qb, sg.M = a.M, sg.pos0 = a.pos0, sg.max_seq = a.max_seq;
  return attn_prefill_segments(a, &sg, 1, stream);
}

Status attn_prefill_segments(const AttnPrefillArgs& a, const AttnSeg* segs, int n, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.hd != 64 && a.hd != 128 && a.hd != 256) return cu_err("pf::attn_prefill: head dim {} unsupported", a.hd);
  if (a.terms != 1 && a.terms != 3) return cu_err("pf::attn_prefill: terms {} (1 or 3)", a.terms);
  if (a.rot > a.hd || a.rot % 2 != 0 || a.rot <= 0) return cu_err("pf::attn_prefill: rotary dim {} unsupported", a.rot);
  if (a.nkv <= 0 || a.nh % a.nkv != 0) return cu_err("pf::attn_prefill: {} heads / {} kv heads", a.nh, a.nkv);
  for (int i = 0; i < n; ++i)
    if (segs[i].pos0 < 0 || segs[i].pos0 + segs[i].M > segs[i].max_seq)
      return cu_err("pf::attn_prefill: positions {}+{} exceed the cache", segs[i].pos0, segs[i].M);
  // Groups of up to kMaxAttnSegs non-empty segments, each group one launch per kernel.
  for (int i0 = 0; i0 < n;) {
    AttnSegs g;
    int max_m = 0;
    for (; i0 < n && g.n < kMaxAttnSegs; ++i0)
      if (segs[i0].M > 0) g.s[g.n++] = segs[i0], max_m = std::max(max_m, segs[i0].M);
    if (g.n == 0) break;
    prep_kernel<<<dim3(max_m, a.nh + a.nkv, g.n), a.hd, a.hd * sizeof(float), s>>>(a, g);
    LILY_TRY(launch_status("pf::attn_prep"));
    if (a.prof) a.prof(a.prof_ctx, "attn: q/k norm+rope+cache (prep)");
    LILY_TRY(attn_flash_wg(a, g, stream));
    if (a.prof) a.prof(a.prof_ctx, a.terms == 1 ? "attn: flash (wgmma, fp16 single pass)" : "attn: flash (wgmma, split operands)");
  }
  return Status::ok();
}

}  // namespace lily::cuda::pf
