// The model FLOPs of a prefill, from the config's shapes (model-spec §1): what `lily bench` divides by the
// prefill time to report TFLOP/s beside tok/s (a rate comparable with the tensor cores' peak and with cuBLAS
// at the same shapes; docs/perf reports).
//
// Counted, per prompt token: 2 FLOPs a weight element of every matrix the token multiplies (the mixer's
// projections, the router and the shared expert's gate, the shared expert, top-k routed experts); per
// attention layer, causal attention: 4·heads·head_dim FLOPs a (query, key ≤ query) pair (q·k and p·v);
// once a prompt, the lm_head on its last token. Not counted: the DeltaNet recurrence (~1% of a token's FLOPs
// at the real shapes), norms, activations, softmax.
#pragma once
#include "io/config.h"

namespace lily {

// Weight-product FLOPs of one token (2 × the weight elements it multiplies).
double token_weight_flops(const ModelConfig& c);
// FLOPs of prefilling P tokens after `past` tokens already in the state.
double prefill_flops(const ModelConfig& c, double P, double past = 0);

}  // namespace lily
