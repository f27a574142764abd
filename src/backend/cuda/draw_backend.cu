// CudaBackend::launch / wait, and decode_draw: a decode step whose rows' next tokens are drawn on
// the device (draw.cu) from the logits where the step left them; only the Drawn records come back.
// One row replays the batch-1 decode graph (launched without waiting where it can: launch_draw);
// several rows take the batched step (batch.cu), drawn the same way.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/sampling/draw.h"

namespace lily::cuda {

Status CudaBackend::ensure_draw(int B) {
  if (draw_cap_ >= B) return Status::ok();
  const int cap = std::max(B, 64);
  draw_spec_ = dalloc<DrawSpec>(size_t(cap), owned_);
  draw_out_ = dalloc<Drawn>(size_t(cap), owned_);
  draw_scratch_ = dalloc<uint8_t>(draw_scratch_bytes(cap, cfg_.vocab_size), owned_);
  if (!draw_spec_ || !draw_out_ || !draw_scratch_) return cu_err("decode_draw: out of device memory for {} rows", cap);
  draw_cap_ = cap;
  return Status::ok();
}

Status CudaBackend::draw_device(const float* logits, int B, std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const int V = cfg_.vocab_size;
  if (spec.size() < size_t(B) || out.size() < size_t(B)) return cu_err("draw_device: {} rows, {} specs", B, spec.size());
  LILY_TRY(ensure_draw(B));
  // The specs with their penalty lists and masks, in one copy to the head of the draw scratch (the
  // engine thread's buffer, reused: this call returns after the copy has been made).
  static thread_local std::vector<unsigned char> image;
  LILY_TRY(pack_draw_specs(spec.first(size_t(B)), V, draw_scratch_, image));
  LILY_CU_TRY(cudaMemcpyAsync(draw_scratch_, image.data(), image.size(), cudaMemcpyHostToDevice, stream_));
  LILY_TRY(draw_rows(logits, B, V, static_cast<const DrawSpec*>(draw_scratch_), draw_out_, draw_scratch_, stream_));
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

Status CudaBackend::launch_draw(CudaSeqState& state, int32_t token, const DrawSpec& spec) {
  CudaSeqState* st = &state;
  if (pipe_launched_ - pipe_collected_ >= 2) return cu_err("launch_draw: two steps are already in flight");
  if (token < 0 && (pipe_launched_ == 0 || pipe_last_ != st))
    return cu_err("launch_draw: no step was launched for this state to feed its drawn token");
  if (token >= cfg_.vocab_size) return cu_err("launch_draw: token {} outside the vocabulary", token);
  if (draw_edits_logits(spec))  // its lists would have to outlive the call; the engine never pipelines them
    return cu_err("launch_draw: a spec with a token mask or penalties cannot be pipelined");
  LILY_TRY(st->reserve(st->n + 1));
  if (st->n + 1 > st->cap) return cu_err("launch_draw: the state is full ({} of max_seq {})", st->n, st->limit);
  LILY_TRY(ensure_draw(2));
  if (!pipe_spec_h_) {
    LILY_CU_TRY(cudaHostAlloc(&pipe_spec_h_, 2 * sizeof(DrawSpec), cudaHostAllocDefault));
    LILY_CU_TRY(cudaHostAlloc(&pipe_out_h_, 2 * sizeof(Drawn), cudaHostAllocDefault));
    LILY_CU_TRY(cudaHostAlloc(&pipe_tok_h_, 2 * sizeof(int32_t), cudaHostAllocDefault));
    for (auto& e : pipe_ev_) LILY_CU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  }
  LILY_TRY(ensure_graphs(*st));
  // Slot k's host buffers were last used by step launched - 2, which collect_draw has waited for.
  const int k = int(pipe_launched_ % 2);
  if (token >= 0) {
    pipe_tok_h_[k] = token;
    LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, &pipe_tok_h_[k], 4, cudaMemcpyHostToDevice, stream_));
  }  // else ctl->tok holds the previous step's drawn id (copied below, in stream order)
  pipe_spec_h_[k] = spec;
  LILY_CU_TRY(cudaGraphLaunch(st->g_full, stream_));
  LILY_CU_TRY(cudaMemcpyAsync(draw_spec_ + k, &pipe_spec_h_[k], sizeof(DrawSpec), cudaMemcpyHostToDevice, stream_));
  LILY_TRY(draw_rows(logits_, 1, cfg_.vocab_size, draw_spec_ + k, draw_out_ + k, draw_scratch_, stream_));
  LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->tok, &draw_out_[k].id, 4, cudaMemcpyDeviceToDevice, stream_));
  LILY_CU_TRY(cudaMemcpyAsync(&pipe_out_h_[k], draw_out_ + k, sizeof(Drawn), cudaMemcpyDeviceToHost, stream_));
  LILY_CU_TRY(cudaEventRecord(pipe_ev_[k], stream_));
  st->n += 1;
  pipe_last_ = st;
  ++pipe_launched_;
  return Status::ok();
}

Status CudaBackend::collect_draw(Drawn& out) {
  if (pipe_collected_ == pipe_launched_) return cu_err("collect_draw: no step in flight");
  const int k = int(pipe_collected_ % 2);
  ++pipe_collected_;  // a failed step is not collected twice
  LILY_CU_TRY(cudaEventSynchronize(pipe_ev_[k]));
  out = pipe_out_h_[k];
  return Status::ok();
}

Result<StepTicket> CudaBackend::launch(std::span<const StepFeed> feeds) {
  const StepFeed& f0 = feeds[0];
  if (feeds.size() == 1 && f0.tokens.size() == 1 && f0.draw && !draw_edits_logits(*f0.draw)) {
    auto* st = dynamic_cast<CudaSeqState*>(f0.state);
    if (!st || st->be != this) return cu_err("launch: the state belongs to another backend");
    LILY_TRY(launch_draw(*st, f0.tokens[0], *f0.draw));
    in_flight_.push_back({++tickets_, f0.drawn});
    return tickets_;
  }
  // A step that does not pipeline runs after those in flight, their draws collected.
  Status st = collect_in_flight(tickets_);
  for (const StepFeed& f : feeds)
    if (st && f.tokens[0] == kDrawnToken) st = cu_err("launch: kDrawnToken in a step that cannot be pipelined");
  if (st) st = step(feeds);
  done_.add(++tickets_, std::move(st));
  return tickets_;
}

Status CudaBackend::collect_in_flight(StepTicket upto) {
  Status first = Status::ok();
  while (!in_flight_.empty() && in_flight_.front().ticket <= upto) {
    const InFlight f = in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    Drawn d;
    Status s = collect_draw(d);
    if (s) *f.out = d;
    else if (first) first = s;
    done_.add(f.ticket, std::move(s));
  }
  return first;
}

Status CudaBackend::wait(StepTicket ticket) {
  if (ticket == 0 || ticket > tickets_) return cu_err("wait: step {} was never launched", ticket);
  (void)collect_in_flight(ticket);  // each step's status goes to done_, this one's too
  if (auto st = done_.take(ticket)) return std::move(*st);
  return cu_err("wait: step {} was already waited for", ticket);
}

}  // namespace lily::cuda
