// What the engine needs from a constraint on a request's tokens (structured outputs, a thinking
// budget): whether the next token is constrained, the mask of allowed tokens, and the token that
// was chosen. A constrained row's mask goes with its draw (model/draw.h's DrawSpec::allowed), on
// the host or where the logits are. One instance per reply, used by one thread at a time (the
// row's sampling).
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace lily {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether the next token must come from mask(); tokens_left counts it.
  virtual bool constrains(int tokens_left) const = 0;
  // allowed[id / 64] bit (id % 64) set for every allowed token; never all zero.
  virtual void mask(int tokens_left, std::span<uint64_t> allowed) = 0;
  // The token that was chosen (sampled, drawn, forced or injected). False: it broke the
  // constraint, which then stops constraining.
  virtual bool accept(int32_t id) = 0;
  // A new constraint in the start state (another choice of the same request).
  virtual std::unique_ptr<TokenConstraint> fresh() const = 0;
};

}  // namespace lily
