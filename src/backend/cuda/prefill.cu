// Prefill on the CUDA backend: M tokens appended to a sequence. For now the captured decode step
// is replayed once per token (the graph without the lm_head, then the full one for the last token).
#include "backend/cuda/cuda_backend.h"

namespace lily {
namespace cuda {

Status CudaBackend::prefill(CudaSeqState& st, std::span<const int32_t> tokens, std::span<float> logits) {
  const int M = int(tokens.size());
  LILY_TRY(ensure_graphs(st));
  if (M > feed_cap_) {
    if (feed_) cudaFree(feed_);
    feed_cap_ = std::max(M, 4096);
    LILY_CU_TRY(cudaMalloc(&feed_, size_t(feed_cap_) * 4));
  }
  LILY_CU_TRY(cudaMemcpyAsync(feed_, tokens.data(), size_t(M) * 4, cudaMemcpyHostToDevice, stream_));
  for (int i = 0; i < M; ++i) {
    LILY_CU_TRY(cudaMemcpyAsync(&st.ctl->tok, feed_ + i, 4, cudaMemcpyDeviceToDevice, stream_));
    const bool full = i == M - 1 && !logits.empty();
    LILY_CU_TRY(cudaGraphLaunch(full ? st.g_full : st.g_nolog, stream_));
  }
  if (!logits.empty())
    LILY_CU_TRY(cudaMemcpyAsync(logits.data(), logits_, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  st.n += M;
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
