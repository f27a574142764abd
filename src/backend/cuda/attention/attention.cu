// attention/: gated GQA attention with q/k RMSNorm and partial NeoX RoPE over K/V caches [nkv, max_seq,
// hd], fp32; output fp32 [tokens, nh·hd] with the sigmoid output gate applied. Entry points:
// attn_prep / attn_decode (common/ops.h; attention.cu: one token, split-K flash decoding in fp32,
// hd ∈ {64, 128, 256}); pf::attn_prefill (step/prefill_ops.h; attn_prefill.cu, attn_wg.cu: M tokens,
// causal flash attention on wgmma, operands bf16 hi + lo (~16 bits),
// softmax in fp32); battn (step/batch_ops.h; batch_attn.cu: B rows over fp32 caches, attn_decode's
// splits (attn_chunk.cuh) on persistent blocks).
//
// Attention decode: (1) q/k RMSNorm + partial NeoX RoPE + K/V cache write at pos; (2) split-K
// flash decoding over positions 0..pos with the GQA group's query heads sharing each K/V row
// read; (3) a merge kernel, one block per query head, combining the splits (log-sum-exp) and
// applying the sigmoid output gate. Position and split count come from the device, so one graph serves
// every context length. Activations and the cache fp32.
#include <cfloat>

#include "backend/cuda/attention/attn_chunk.cuh"
#include "backend/cuda/attention/attn_common.cuh"
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = kAttnThreads, kMaxSplits = kAttnMaxSplits;

__global__ void attn_prep_kernel(AttnArgs a) {
  extern __shared__ float xsh[];
  __shared__ float red[32];
  const int b = blockIdx.x, d = threadIdx.x, hd = a.hd;
  pdl_wait();
  pdl_trigger();
  const int pos = a.ctl ? a.ctl->pos : a.pos;
  const float* qkv = a.qkv;
  const bool is_q = b < a.nh;
  const int kvh = b - a.nh;
  const float raw = is_q ? qkv[b * a.qw + d] : qkv[a.nh * a.qw + kvh * hd + d];
  const float y = qk_norm_rope(raw, static_cast<const uint16_t*>(is_q ? a.q_norm : a.k_norm), hd, a.eps, a.rot, a.theta, pos, xsh, red);
  if (is_q) {
    a.q[b * hd + d] = y;
  } else {
    const size_t at = (size_t(kvh) * a.max_seq + pos) * hd + d;
    static_cast<float*>(a.kc)[at] = y;
    static_cast<float*>(a.vc)[at] = qkv[a.nh * a.qw + a.nkv * hd + kvh * hd + d];
  }
}

template <int DPL, int G> __global__ void __launch_bounds__(kThreads) attn_decode_chunk_kernel(AttnArgs a) {
  extern __shared__ float sm[];
  constexpr int HD = DPL * 32;
  const int split = blockIdx.x, kvh = blockIdx.y;
  pdl_wait();
  pdl_trigger();
  const int n = a.ctl->pos + 1, nse = n_splits_for(n, a.n_split, a.min_per_split);
  if (split >= nse) return;
  const int len = (n + nse - 1) / nse, t0 = split * len, t1 = min(n, t0 + len);
  const size_t kv0 = size_t(kvh) * a.max_seq * HD;
  attn_split<DPL, G>(a.q + size_t(kvh) * G * HD, static_cast<const float*>(a.kc) + kv0, static_cast<const float*>(a.vc) + kv0, t0, t1,
                         a.partial + (size_t(kvh) * a.n_split + split) * G * (HD + 2), sm);
}

// Merge of the splits: one block per query head, one thread per dim. Split weights
// exp(m_sp − M) in shared memory, then each thread streams its dim over the splits.
__global__ void __launch_bounds__(256) attn_merge_kernel(AttnArgs a) {
  __shared__ float wsp[kMaxSplits];
  __shared__ float red[32];
  const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.x, kvh = h / G, g = h % G, d = threadIdx.x;
  pdl_wait();
  pdl_trigger();
  const int n = a.ctl->pos + 1, nse = n_splits_for(n, a.n_split, a.min_per_split), ws = G * (hd + 2);
  const float* pk = a.partial + size_t(kvh) * a.n_split * ws + g * (hd + 2);
  float val = merge_splits(pk, ws, hd, nse, wsp, red);
  if (a.qw == 2 * hd) val = val * sigmoid(a.qkv[h * a.qw + hd + d]);
  a.out[h * hd + d] = val;
}

template <int DPL, int G> Status launch_decode(const AttnArgs& a, cudaStream_t s) {
  // Splits capped so that all nkv·splits blocks are resident at once (one wave): measured on the
  // H200 at 32k (fp32 K/V), 66 splits (132 blocks) against 128 (256 blocks, two waves): attention
  // 0.87 → 0.58 ms per step.
  auto kern = attn_decode_chunk_kernel<DPL, G>;
  static const int per_sm = [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, chunk_smem<DPL, G>()) != cudaSuccess || n < 1) n = 1;
    return n;
  }();
  AttnArgs b = a;
  const int cap = sm_count() * per_sm / a.nkv;
  if (cap >= 1 && cap < b.n_split) b.n_split = cap;
  LILY_TRY(launch_k("attn_decode", kern, dim3(b.n_split, b.nkv), dim3(kThreads), chunk_smem<DPL, G>(), s, b));
  return launch_k("attn_merge", attn_merge_kernel, dim3(b.nh), dim3(b.hd), 0, s, b);
}

template <int DPL> Status dispatch_g(const AttnArgs& a, cudaStream_t s) {
  switch (a.nh / a.nkv) {
    case 1: return launch_decode<DPL, 1>(a, s);
    case 2: return launch_decode<DPL, 2>(a, s);
    case 3: return launch_decode<DPL, 3>(a, s);
    case 4: return launch_decode<DPL, 4>(a, s);
    case 6: return launch_decode<DPL, 6>(a, s);
    case 8: return launch_decode<DPL, 8>(a, s);
    default: return cu_err("attn_decode: GQA group {} unsupported (1, 2, 3, 4, 6, 8)", a.nh / a.nkv);
  }
}

}  // namespace

int attn_max_splits() { return kMaxSplits; }

template <int DPL> static Status init_g() {
  auto set_t = [](auto kern, size_t smem) -> Status {
    LILY_CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return Status::ok();
  };
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 1>, chunk_smem<DPL, 1>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 2>, chunk_smem<DPL, 2>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 3>, chunk_smem<DPL, 3>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 4>, chunk_smem<DPL, 4>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 6>, chunk_smem<DPL, 6>()));
  LILY_TRY(set_t(attn_decode_chunk_kernel<DPL, 8>, chunk_smem<DPL, 8>()));
  return Status::ok();
}

Status attn_init() {
  LILY_TRY(init_g<2>());
  LILY_TRY(init_g<4>());
  return init_g<8>();
}

Status attn_prep(const AttnArgs& a, Stream s) {
  if (a.hd % 32 != 0 || a.hd > 1024 || a.rot > a.hd || a.rot % 2 != 0) return cu_err("attn_prep: head dim {} / rotary {} unsupported", a.hd, a.rot);
  if (!a.ctl && (a.pos < 0 || a.pos >= a.max_seq)) return cu_err("attn_prep: position {} outside the cache", a.pos);
  auto st = static_cast<cudaStream_t>(s);
  const dim3 grid(a.nh + a.nkv), block(a.hd);
  return launch_k("attn_prep", attn_prep_kernel, grid, block, a.hd * sizeof(float), st, a);
}

Status attn_decode(const AttnArgs& a, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (!a.ctl) return cu_err("attn_decode: needs the step control block");
  if (a.nkv > 14 || a.nkv <= 0 || a.nh % a.nkv != 0) return cu_err("attn_decode: {} kv heads unsupported", a.nkv);
  if (a.n_split < 1 || a.n_split > attn_max_splits()) return cu_err("attn_decode: n_split {} out of range", a.n_split);
  switch (a.hd) {
    case 64: return dispatch_g<2>(a, s);
    case 128: return dispatch_g<4>(a, s);
    case 256: return dispatch_g<8>(a, s);
    default: return cu_err("attn_decode: head dim {} unsupported (64, 128, 256)", a.hd);
  }
}


}  // namespace lily::cuda
