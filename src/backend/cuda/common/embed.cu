// Quantized embedding lookup: one row of the 4-bit table dequantized to fp32, token read from
// the step control block so the decode graph needs no host input.
#include "backend/cuda/common/common.cuh"

namespace lily::cuda {
namespace {

__global__ void embed_kernel(QW e, const StepCtl* ctl, int token, float* x) {
  pdl_wait();
  pdl_trigger();
  const int tok = ctl ? ctl->tok : token;
  const int H = e.cols, wpr = H / 8, groups = H / 64;
  const uint32_t* codes = e.codes + size_t(tok) * wpr;
  const uint32_t* sb = reinterpret_cast<const uint32_t*>(e.sb) + size_t(tok) * groups;
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
  return launch_k("embed_row", embed_kernel, dim3(1), dim3(256), 0, static_cast<cudaStream_t>(s), e, ctl, token, x);
}

}  // namespace lily::cuda
