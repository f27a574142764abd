// CudaBackend's half of speculative decoding (issue 23 item 3). A verify feed (a decode row's token and
// its drafts, an output per token) runs as a segment of the mixed step (step_mixed.cu): the prefill
// mixers on its rows, every projection batched with the step's other rows, each row's draw on the
// device. Model::rewind then drops the rejected drafts:
// - attention: nothing to undo (positions past the state's count are never read, and are overwritten);
// - DeltaNet: before the step, the state's fixed arena up to its StepCtl (every layer's conv windows and
//   state S: ~63 MB at full size, a device copy of ~30 µs) is copied aside, and as the step runs, each
//   DeltaNet layer's projections u of the feed's rows [L, ldu] are saved (1.5 MB a row at full size);
//   rewinding to `keep` of the L tokens restores the copy and runs pf::gdn_prefill over the first `keep`
//   saved rows of each layer (conv, norms, chunked recurrence; its readout discarded). That is the
//   arithmetic of a segment of those `keep` tokens (gdn_prefill_segments is gdn_prefill's per segment),
//   so the state is the one a step feeding them would leave.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/step/batch_ctx.h"
#include "backend/cuda/step/prefill_ops.h"

namespace lily {
namespace cuda {

namespace {
// The bytes of a state's fixed arena before its StepCtl: conv windows and S of every DeltaNet layer.
size_t snap_bytes(const CudaSeqState& st) {
  return size_t(reinterpret_cast<const char*>(st.ctl) - static_cast<const char*>(st.fixed_arena));
}

// Grows a device buffer to at least n elements (its contents dropped).
template <typename T> Status grow(T*& p, size_t& cap, size_t n, const char* what) {
  if (n <= cap) return Status::ok();
  if (p) cudaFree(p);
  p = nullptr, cap = 0;
  if (cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)) != cudaSuccess) {
    cudaGetLastError();
    return cu_err("speculative decoding: out of device memory for {} ({:.1f} MB)", what, double(n * sizeof(T)) / 1e6);
  }
  cap = n;
  return Status::ok();
}
}  // namespace

// A lone verify feed's step over a plain decode step (H100, full size, lily bench --spec-draft, all drafts
// right, commit 45d1531; docs/perf/2026-12-05-spec-cuda.md): 2.66x with 3 drafts and 3.21x with 5.4 at
// context 256, 2.71x / 3.40x at 4k (4.26x with 5.4 at 32k, where each row's decode attention adds): about
// 1 + 0.9 + 0.25 a draft row. The fixed part is the mixed step's (not captured as a graph, its GEMMs on
// qgemm), the per-row part the experts each row adds and its DeltaNet decode step.
double CudaBackend::spec_row_cost() const { return 0.25; }
double CudaBackend::spec_step_cost() const { return 0.9; }

// Verify feeds run on the mixed step: a model it takes.
bool CudaBackend::speculates() const { return mixed_step_ok(cfg_); }

Status CudaBackend::spec_begin(std::span<const StepFeed> feeds, int ldu, std::vector<int>& undo) {
  spec_undo_.clear();
  undo.assign(feeds.size(), -1);
  int n = 0, rows = 0;
  size_t snap = 0;
  for (const StepFeed& f : feeds)
    if (f.rewindable) ++n, rows += int(f.tokens.size()), snap = snap_bytes(*static_cast<const CudaSeqState*>(f.state));
  if (n == 0) return Status::ok();
  if (n > kSpecFeeds) return cu_err("step: {} verify feeds, at most {}", n, kSpecFeeds);
  const int n_gdn = n_gdn_layers();
  LILY_TRY(grow(spec_snap_, spec_snap_cap_, size_t(n) * snap, "the DeltaNet states of verify feeds"));
  LILY_TRY(grow(spec_u_, spec_u_cap_, size_t(n_gdn) * size_t(rows) * size_t(ldu), "the DeltaNet inputs of verify feeds"));
  spec_rows_ = rows, spec_ldu_ = ldu;
  int row = 0;
  for (size_t j = 0; j < feeds.size(); ++j) {
    const StepFeed& f = feeds[j];
    if (!f.rewindable) continue;
    const auto* st = static_cast<const CudaSeqState*>(f.state);
    const int slot = int(spec_undo_.size());
    LILY_CU_TRY(cudaMemcpyAsync(spec_snap_ + size_t(slot) * snap, st->fixed_arena, snap, cudaMemcpyDeviceToDevice, stream_));
    undo[j] = slot;
    spec_undo_.push_back({st, st->n, int(f.tokens.size()), row, slot});
    row += int(f.tokens.size());
  }
  return Status::ok();
}

Status CudaBackend::spec_save_u(int gi, int r, const float* u) {
  const SpecUndo& s = spec_undo_[size_t(r)];
  float* dst = spec_u_ + (size_t(gi) * size_t(spec_rows_) + size_t(s.row0)) * size_t(spec_ldu_);
  LILY_CU_TRY(cudaMemcpyAsync(dst, u, size_t(s.L) * size_t(spec_ldu_) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  return Status::ok();
}

Status CudaBackend::rewind(SeqState& state, int n_tokens) {
  auto* st = dynamic_cast<CudaSeqState*>(&state);
  if (!st || st->be != this) return cu_err("rewind: the state belongs to another backend");
  auto it = std::find_if(spec_undo_.begin(), spec_undo_.end(), [&](const SpecUndo& s) { return s.st == st; });
  if (it == spec_undo_.end() || st->n != it->n0 + it->L)
    return cu_err("rewind: the state's last step did not feed it a rewindable feed");
  if (n_tokens < it->n0) return cu_err("rewind: to {} tokens, before its rewindable feed's start {}", n_tokens, it->n0);
  if (n_tokens >= st->n) return Status::ok();
  const SpecUndo u = *it;
  const int keep = n_tokens - u.n0;
  const size_t snap = snap_bytes(*st);
  LILY_CU_TRY(cudaMemcpyAsync(st->fixed_arena, spec_snap_ + size_t(u.slot) * snap, snap, cudaMemcpyDeviceToDevice, stream_));
  if (keep > 0)
    for (int i = 0, gi = 0; i < cfg_.num_hidden_layers; ++i) {
      if (d_.layers[size_t(i)].attn) continue;
      const float* uu = spec_u_ + (size_t(gi++) * size_t(spec_rows_) + size_t(u.row0)) * size_t(spec_ldu_);
      LILY_TRY(pf::gdn_prefill(gdn_args(i, *st, u.n0, keep, uu, spec_ldu_, 0, pf_.o, pf_.wy), stream_));
    }
  // The decode graph reads the next position from the StepCtl; a token drawn in flight for this state
  // (the pipeline's input) is stale.
  const int32_t pos = n_tokens;
  LILY_CU_TRY(cudaMemcpyAsync(&st->ctl->pos, &pos, sizeof pos, cudaMemcpyHostToDevice, stream_));
  LILY_CU_TRY(cudaStreamSynchronize(stream_));
  if (pipe_last_ == st) pipe_last_ = nullptr;
  st->n = n_tokens;
  spec_undo_.erase(it);
  return Status::ok();
}

}  // namespace cuda
}  // namespace lily
