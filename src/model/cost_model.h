// The model's cost from the config's shapes (model-spec §1): the weight elements each layer's matrices hold,
// by how a token meets them (the byte floor of a decode step, cli/step_bytes.h, counts their bytes), and the
// FLOPs of a prefill, which `lily bench` divides by the prefill time to report TFLOP/s beside tok/s (a rate
// comparable with the tensor cores' peak and with cuBLAS at the same shapes; docs/perf reports).
//
// Prefill FLOPs, per prompt token: 2 a weight element of every matrix the token multiplies (the mixer's
// projections, the router and the shared expert's gate, the shared expert, top-k routed experts); per
// attention layer, causal attention: 4·heads·head_dim a (query, key ≤ query) pair (q·k and p·v); once a
// prompt, the lm_head on its last token. Not counted: the DeltaNet recurrence (~1% of a token's FLOPs at
// the real shapes), norms, activations, softmax.
#pragma once
#include "io/config.h"

namespace lily {

// Weight elements of layer i's matrices: the mixer's projections (attention [q(+gate) | k | v] and o_proj, or
// DeltaNet [qkv | z | a | b] and out_proj; 4-bit), the router with the shared expert's gate row (8-bit), one
// routed expert (gate, up, down) and the shared expert (4-bit).
struct LayerElems {
  double mixer = 0, router = 0, expert = 0, shared = 0;
};
LayerElems layer_elems(const ModelConfig& c, int i);

// Weight-product FLOPs of one token (2 × the weight elements it multiplies).
double token_weight_flops(const ModelConfig& c);
// FLOPs of prefilling P tokens after `past` tokens already in the state.
double prefill_flops(const ModelConfig& c, double P, double past = 0);

}  // namespace lily
