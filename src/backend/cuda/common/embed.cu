// Quantized embedding lookup: rows of the 4-bit table dequantized to fp32 (scale·q + bias unfused, as the
// CPU reference). The decode graph's one row reads its token from the step control block, so the graph
// needs no host input; the prefill and the batched step take a token per row from a device array.
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

// grid (rows): row m's token is ctl->tok (ctl set), toks[m] (toks set) or token; x row m = its dequantized row.
__global__ void embed_kernel(QW e, const StepCtl* ctl, const int32_t* toks, int token, float* x) {
  pdl_wait();
  pdl_trigger();
  const int m = blockIdx.x;
  const int tok = ctl ? ctl->tok : toks ? toks[m] : token;
  const int H = e.cols, wpr = H / 8, groups = H / 64;
  const uint32_t* codes = e.codes + size_t(tok) * wpr;
  const uint32_t* sb = reinterpret_cast<const uint32_t*>(e.sb) + size_t(tok) * groups;
  x += size_t(m) * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    const uint32_t q = (codes[c / 8] >> (4 * (c % 8))) & 0xF;
    const uint32_t p = sb[c / 64];
    const float s = __uint_as_float(p << 16), b = __uint_as_float(p & 0xFFFF0000u);
    x[c] = __fadd_rn(__fmul_rn(s, float(q)), b);  // unfused, as the CPU reference
  }
}

}  // namespace

Status embed_row(const QW& e, const StepCtl* ctl, int token, float* x, Stream s) {
  if (e.bits != 4 || e.cols % 64 != 0) return cu_err("embed_row: needs a 4-bit table with group 64");
  if (!ctl && (token < 0 || token >= e.rows)) return cu_err("embed_row: token {} out of range", token);
  return launch_k("embed_row", embed_kernel, dim3(1), dim3(256), 0, static_cast<cudaStream_t>(s), e, ctl,
                  static_cast<const int32_t*>(nullptr), token, x);
}

Status embed_rows(const QW& e, const int32_t* tok, int M, float* x, Stream s) {
  if (e.bits != 4 || e.cols % 64 != 0) return cu_err("embed_rows: needs a 4-bit table with group 64");
  if (M <= 0) return Status::ok();
  return launch_k("embed_rows", embed_kernel, dim3(M), dim3(256), 0, static_cast<cudaStream_t>(s), e,
                  static_cast<const StepCtl*>(nullptr), tok, 0, x);
}

}  // namespace lily::cuda
