// A reply constrained by a grammar, as the engine sees it (engine/token_constraint.h). Phases:
// thinking (nothing constrained until </think>, which is forced when a thinking budget is spent or
// when only the tokens the grammar needs are left), then either the whole rest of the reply
// follows the grammar and ends with a stop token (response_format, tool_choice required), or the
// grammar applies from each trigger token (<tool_call>, tool_choice auto) to the end of that call.
// The budget rule: a token is allowed only if the output can still complete in the tokens left
// after it (one byte per token always exists), so a reply never ends half-written.
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "engine/token_constraint.h"
#include "structured/token_mask.h"

namespace lily::structured {

// Process-wide totals of the masks computed (for /metrics): how many, and the time they took.
struct MaskTotals {
  std::atomic<uint64_t> masks{0}, nanoseconds{0};
};
MaskTotals& mask_totals();

struct ConstraintSpec {
  std::shared_ptr<const Grammar> grammar;       // null: a thinking budget only
  std::shared_ptr<const VocabIndex> vocab;
  std::vector<uint64_t> allowed;                // tokens the grammar may use (vocab.words())
  std::vector<int32_t> stop_ids;                // end the reply once the grammar is complete
  std::optional<int32_t> think_close;           // </think>
  bool in_think = false;                        // the prompt opened a think block
  int think_budget = -1;                        // force </think> after this many thinking tokens (-1: no limit)
  std::optional<int32_t> trigger;               // constrain from this token to the end of the grammar, repeatedly
  // The budget rule (complete output within the tokens left, </think> forced in time). Off when
  // max_tokens is below reserve(): the output then follows the grammar and may be cut by length.
  bool budget = true;
};

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const ConstraintSpec> spec);
  bool constrains(int tokens_left) const override;
  void mask(int tokens_left, std::span<uint64_t> allowed) override;
  bool accept(int32_t id) override;
  std::unique_ptr<TokenConstraint> fresh() const override;

  // Tokens a reply needs after the think block at least (</think>, the grammar, a stop token).
  int64_t reserve() const;
  const MaskStats& stats() const { return masks_.stats(); }
  double mask_seconds() const { return mask_seconds_; }

 private:
  enum class Phase { kThink, kWait, kActive, kDone, kOff };
  void start_grammar();
  std::shared_ptr<const ConstraintSpec> spec_;
  Phase phase_;
  Position pos_;
  MaskComputer masks_;
  int thought_ = 0;  // thinking tokens so far
  double mask_seconds_ = 0;
};

}  // namespace lily::structured
