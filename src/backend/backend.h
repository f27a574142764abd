// The backend interface: a backend owns its copy (or view) of the weights and the per-sequence
// state, and runs the forward pass. The CPU backend is the reference; the CUDA backend captures
// the decode step as a graph. Model (src/model/model.h) picks one at load.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "model/model.h"
#include "model/weights.h"

namespace lily {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Result<std::unique_ptr<SeqState>> new_state(int max_seq) = 0;
  // Appends tokens to state; logits (if non-empty, [vocab] fp32) of the last token.
  virtual Status forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) = 0;
};

// weights must outlive the backend.
Result<std::unique_ptr<Backend>> make_cpu_backend(const ModelWeights& weights);
// Defined by the CUDA backend when it is compiled in; otherwise returns a clear error.
Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights& weights, bool verbose);

}  // namespace lily
