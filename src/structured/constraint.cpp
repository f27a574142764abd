// GrammarConstraint: see constraint.h.
#include "structured/constraint.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

namespace lily::structured {

MaskTotals& mask_totals() {
  static MaskTotals t;
  return t;
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const ConstraintSpec> spec)
    : spec_(std::move(spec)), masks_(*spec_->vocab) {
  if (spec_->in_think && spec_->think_close) phase_ = Phase::kThink;
  else if (!spec_->grammar) phase_ = Phase::kOff;
  else if (spec_->trigger) phase_ = Phase::kWait;
  else start_grammar();
}

std::unique_ptr<TokenConstraint> GrammarConstraint::fresh() const { return std::make_unique<GrammarConstraint>(spec_); }

void GrammarConstraint::start_grammar() {
  pos_ = Position(*spec_->grammar);
  phase_ = Phase::kActive;
}

int64_t GrammarConstraint::reserve() const {
  if (!spec_->grammar || spec_->trigger) return 1;
  return 1 + spec_->grammar->nodes[spec_->grammar->root].min_len + 1;
}

bool GrammarConstraint::constrains(int tokens_left) const {
  switch (phase_) {
    case Phase::kThink:
      return (spec_->think_budget >= 0 && thought_ >= spec_->think_budget) ||
             (spec_->budget && spec_->grammar && !spec_->trigger && tokens_left <= reserve());
    case Phase::kActive: return true;
    default: return false;
  }
}

void GrammarConstraint::mask(int tokens_left, std::span<uint64_t> bits) {
  std::fill(bits.begin(), bits.end(), 0);
  auto allow_stops = [&] {
    for (int32_t s : spec_->stop_ids)
      if (s >= 0 && size_t(s) / 64 < bits.size()) set_bit(bits, size_t(s));
  };
  if (phase_ == Phase::kThink) {
    set_bit(bits, size_t(*spec_->think_close));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Grammar& g = *spec_->grammar;
  // Whole-reply grammars keep one token for the stop token after the output.
  const bool whole = !spec_->trigger;
  const int64_t limit = spec_->budget ? int64_t(tokens_left) - (whole ? 2 : 1) : kInf;
  masks_.compute(g, pos_, limit, spec_->allowed, bits);
  if (whole && pos_.can_complete(g)) allow_stops();
  bool any = false;
  for (uint64_t w : bits) any = any || w != 0;
  if (!any) {  // cannot happen while the budget rule holds; ending beats a stuck row
    spdlog::warn("structured output: no token fits the grammar here; ending the reply");
    allow_stops();
  }
  const auto dt = std::chrono::steady_clock::now() - t0;
  mask_seconds_ += std::chrono::duration<double>(dt).count();
  mask_totals().masks++;
  mask_totals().nanoseconds += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count());
}

bool GrammarConstraint::accept(int32_t id) {
  switch (phase_) {
    case Phase::kThink:
      if (id == *spec_->think_close) {
        if (!spec_->grammar) phase_ = Phase::kOff;
        else if (spec_->trigger) phase_ = Phase::kWait;
        else start_grammar();
      } else {
        ++thought_;
      }
      return true;
    case Phase::kWait:
      if (id == *spec_->trigger) start_grammar();
      return true;
    case Phase::kActive: {
      if (std::find(spec_->stop_ids.begin(), spec_->stop_ids.end(), id) != spec_->stop_ids.end()) {
        phase_ = Phase::kDone;
        return true;
      }
      const VocabIndex& v = *spec_->vocab;
      if (id < 0 || id >= v.n_vocab() || !v.in_trie(id) || !pos_.advance(*spec_->grammar, v.bytes(id))) {
        spdlog::warn("structured output: token {} breaks the grammar; no longer constrained", id);
        phase_ = Phase::kOff;
        return false;
      }
      // A triggered grammar that has ended waits for the next trigger.
      if (spec_->trigger && pos_.can_complete(*spec_->grammar) && !pos_.can_continue(*spec_->grammar))
        phase_ = Phase::kWait;
      return true;
    }
    default: return true;
  }
}

}  // namespace lily::structured
