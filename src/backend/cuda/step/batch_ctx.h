// step/: the CUDA backend's multi-token paths, CudaBackend methods declared in cuda_backend.h: the
// prefill of M tokens of one sequence (prefill.cu, chunks of up to 4,096 tokens by default, kernels in
// step/prefill_ops.h), forward_batch (batch.cu: one token for each of B sequences, a captured graph per
// batch size, kernels in step/batch_ops.h and gemm/qgemm.h) and step (step_mixed.cu: decode rows and
// prompt segments in one step). Activations fp32 row-major [rows, width]; each writes the state the
// decode graph reads (K/V caches, conv windows, S). In the batched step a row's result depends only on
// that row (gemm/qgemm.h states the one exception) and stays within ~1e-5 of the batch-1 decode.
//
// The batched step's scratch and row tables (BatchCtx), shared by the decode step (batch.cu) and the mixed
// step of decode rows and prompt segments (step_mixed.cu), and the step's enqueue function.
#pragma once
#include <cstring>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/step/batch_ops.h"

namespace lily {
namespace cuda {

struct BatchCtx {
  int cap = 0, L = 0;
  std::vector<void*> owned;
  // Activations, fp32, row-major per batch row.
  float *xres[2] = {}, *mix = nullptr, *xn = nullptr, *u = nullptr, *og = nullptr, *o = nullptr, *q = nullptr;
  float *rl = nullptr, *topk_w = nullptr, *act = nullptr, *logits = nullptr, *partial = nullptr;
  float* gprep = nullptr;  // the GDN step's per-row scratch (bgdn_prep_floats)
  int32_t* topk_ids = nullptr;
  int urows = 0;
  // The qgemm step: packed GEMM inputs (gemm/qgemm.h: X_a the normed rows, og,
  // o; X_b the MoE activations per entry; Xl_* their two-pass remainders; XS_* the group sums and
  // scales), per-entry MoE outputs (entries: B·k routed + B shared), the routing table, and the dense
  // k split's workspace and counters.
  uint16_t *X_a = nullptr, *X_b = nullptr, *Xl_a = nullptr, *Xl_b = nullptr;
  float *XS_a = nullptr, *XS_b = nullptr, *yd = nullptr;
  // A shared expert of another width Is than the routed experts' runs apart (moe_tc): its [gate | up]
  // rows fp32 in act [cap][2·Is], the SwiGLU packed in X_s / Xl_s [cap][Is], XS_s [cap][Is/64][2].
  uint16_t *X_s = nullptr, *Xl_s = nullptr;
  float* XS_s = nullptr;
  int32_t *items = nullptr, *n_items = nullptr, *rowb = nullptr, *ent = nullptr;
  float* ws = nullptr;
  int32_t* cnt = nullptr;
  // Row table: [tok | pos | cap] int32 [cap] each, then pointers ctl [cap], p0 [L][cap], p1 [L][cap].
  char* tab_dev = nullptr;
  char* tab_host = nullptr;
  // Mixed steps (CudaBackend::step): the rows whose logits the step computes, gathered packed for the
  // lm_head (Gx / Gxl / Gxs, [cap] rows); their table: out_idx [cap], fin_pos [cap] int32, then
  // fin_ctl [cap] (the state of each decode row and each segment's last row, and that row's position).
  uint16_t *Gx = nullptr, *Gxl = nullptr;
  float* Gxs = nullptr;
  char* mtab_dev = nullptr;
  char* mtab_host = nullptr;
  void* seg_args = nullptr;  // the mixed step's per-segment DeltaNet args, every layer (pf::GdnPrefillArgs)
  size_t seg_args_cap = 0;
  size_t mtab_bytes = 0, mtab_ptr_off = 0;
  int32_t* out_idx(char* base) const { return reinterpret_cast<int32_t*>(base); }
  int32_t* fin_pos(char* base) const { return out_idx(base) + cap; }
  StepCtl** fin_ctl(char* base) const { return reinterpret_cast<StepCtl**>(base + mtab_ptr_off); }
  size_t tab_bytes = 0, ptr_off = 0;
  std::map<int, cudaGraphExec_t> graphs;
  // LILY_BATCH_PROFILE=1: steps run uncaptured with an event after each op; the third step of
  // each batch size prints the time per op kind (stderr).
  std::vector<std::pair<const char*, cudaEvent_t>> ev;
  bool prof = false;
  std::map<int, int> prof_calls;
  int32_t* tok() const { return reinterpret_cast<int32_t*>(tab_dev); }
  int32_t* pos() const { return tok() + cap; }
  int32_t* caps() const { return tok() + 2 * cap; }
  void** ptrs(char* base) const { return reinterpret_cast<void**>(base + ptr_off); }
  StepCtl* const* ctl() const { return reinterpret_cast<StepCtl* const*>(ptrs(tab_dev)); }
  void* const* p0(int layer) const { return ptrs(tab_dev) + cap + size_t(layer) * cap; }
  void* const* p1(int layer) const { return ptrs(tab_dev) + cap + size_t(L + layer) * cap; }
  void release() {
    for (auto& g : graphs) cudaGraphExecDestroy(g.second);
    graphs.clear();
    for (void* p : owned) cudaFree(p);
    owned.clear();
    if (tab_host) cudaFreeHost(tab_host);
    if (mtab_host) cudaFreeHost(mtab_host);
    if (seg_args) cudaFree(seg_args);
    seg_args = nullptr, seg_args_cap = 0;
    tab_host = nullptr, mtab_host = nullptr;
    cap = 0;
  }
  // Profiling (prof): an event after an op, named by its kind (time is attributed to the op before).
  void mark(const char* name, cudaStream_t s) {
    if (!prof) return;
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    ev.push_back({name, e});
  }
  // Row r of the host row table: its token, position, state capacity, control block and per-layer state.
  void put_row(int r, const CudaSeqState& st, int32_t tok, int pos) {
    auto* ti = reinterpret_cast<int32_t*>(tab_host);
    void** tp = ptrs(tab_host);
    ti[r] = tok, ti[cap + r] = pos, ti[2 * cap + r] = st.cap;
    tp[r] = st.ctl;
    for (int l = 0; l < L; ++l) {
      const auto& SL = st.layers[size_t(l)];
      tp[cap + size_t(l) * cap + r] = SL.kc ? static_cast<void*>(SL.kc) : static_cast<void*>(SL.conv);
      tp[cap + size_t(L + l) * cap + r] = SL.vc ? static_cast<void*>(SL.vc) : static_cast<void*>(SL.S);
    }
  }
  ~BatchCtx() { release(); }
};

// The prefill scratch's split-A planes (pf::split_rows), where prompt rows take the prefill's router GEMM.
struct RouterSplit {
  uint16_t *ah = nullptr, *al = nullptr;
  float* axs = nullptr;
};

// A mixed step's layout (CudaBackend::step): rows [0, D) are decode rows (one token each, the batched
// mixers); the rest are prompt segments, whose mixers seg_mixers(layer, attn) runs (the prefill
// kernels, over every segment in one launch per kernel, reading x.u and writing x.og / x.o at the
// segment's rows). The lm_head runs on the n_out rows listed in the mixed table (out_idx), gathered.
struct MixedPlan {
  int D = 0, n_out = 0;
  RouterSplit router;  // for the prompt rows [Da, B)
  // Rows [0, Da) take the batched decode attention (battn, each row over its cache up to its position):
  // the D decode rows, then the rows of short verify feeds (step_mixed.cu); -1: D.
  int Da = -1;
  std::function<Status(int layer, bool attn)> seg_mixers;
};

// Profiling marker of enqueue_tc: called after each op with the op kind's name.
using Marker = std::function<void(const char*)>;
// The qgemm step over B rows (batch.cu): embedding, every layer, final norm and lm_head, reading the rows
// from x's row table; with mp, a mixed step (batched mixers on rows [0, mp->D) (attention: [0, mp->Da)),
// seg_mixers for the rest, the lm_head on the gathered output rows).
Status enqueue_tc(BatchCtx& x, const ModelConfig& c, const DevWeights& d, int B, cudaStream_t s, const Marker& mk,
                  const MixedPlan* mp);
// The batched DeltaNet step's arguments (bgdn_step) of layer i, weights L, over B rows of the row table
// from row r0 (their states, positions and projections; readout into x.og's rows, prep scratch from row 0).
BGdnArgs bgdn_args(const BatchCtx& x, const ModelConfig& c, const DevLayer& L, int i, size_t r0, int B);
// The environment knobs the batched steps read (batch.cu).
bool env_is(const char* name, const char* val);
// Whether the mixed step (step_mixed.cu) runs this model at today's knobs: the qgemm step and shapes the
// batched and prefill kernels take. Its fp32-state condition is per step.
bool mixed_step_ok(const ModelConfig& c);

}  // namespace cuda
}  // namespace lily
