// CudaBackend::decode_draw: a decode step whose rows' next tokens are drawn on the device
// (draw.cu) from the logits where the step left them; only the Drawn records come back. One row
// replays the batch-1 decode graph; several rows take the batched step (batch.cu), drawn the same way.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/draw.h"

namespace lily::cuda {

Status CudaBackend::draw_device(const float* logits, int B, std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const int V = cfg_.vocab_size;
  if (draw_cap_ < B) {
    const int cap = std::max(B, 64);
    draw_spec_ = dalloc<DrawSpec>(size_t(cap), owned_);
    draw_out_ = dalloc<Drawn>(size_t(cap), owned_);
    draw_scratch_ = dalloc<uint8_t>(draw_scratch_bytes(cap, V), owned_);
    if (!draw_spec_ || !draw_out_ || !draw_scratch_) return cu_err("decode_draw: out of device memory for {} rows", cap);
    draw_cap_ = cap;
  }
  LILY_CU_TRY(cudaMemcpyAsync(draw_spec_, spec.data(), size_t(B) * sizeof(DrawSpec), cudaMemcpyHostToDevice, stream_));
  LILY_TRY(draw_rows(logits, B, V, draw_spec_, draw_out_, draw_scratch_, stream_));
  LILY_CU_TRY(cudaMemcpyAsync(out.data(), draw_out_, size_t(B) * sizeof(Drawn), cudaMemcpyDeviceToHost, stream_));
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  return Status::ok();
}

Status CudaBackend::decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                                std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const int B = int(states.size());
  if (tokens.size() != states.size() || spec.size() != states.size() || out.size() != states.size())
    return cu_err("decode_draw: {} states, {} tokens, {} specs, {} outputs", B, tokens.size(), spec.size(), out.size());
  if (B == 0) return Status::ok();
  if (B > 1) return batch_step(states, tokens, {}, spec, out);
  auto* st = dynamic_cast<CudaSeqState*>(states[0]);
  if (!st || st->be != this) return cu_err("decode_draw: state belongs to another backend");
  LILY_TRY(st->reserve(st->n + 1));
  if (st->n + 1 > st->cap) return cu_err("decode_draw: the state is full ({} of max_seq {})", st->n, st->limit);
  if (tokens[0] < 0 || tokens[0] >= cfg_.vocab_size) return cu_err("decode_draw: token {} outside the vocabulary", tokens[0]);
  LILY_TRY(ensure_graphs(*st));
  *pinned_tok_ = tokens[0];
  LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, pinned_tok_, 4, cudaMemcpyHostToDevice, stream_));
  LILY_CU_TRY(cudaGraphLaunch(st->g_full, stream_));
  LILY_TRY(draw_device(logits_, 1, spec, out));
  st->n += 1;
  return Status::ok();
}

}  // namespace lily::cuda
