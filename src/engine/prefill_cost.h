// Prefill cost model of the engine's scheduler: a forward over n prompt tokens takes about
// fixed + per_token·n seconds (a GPU pays a fixed cost per forward that dwarfs a few tokens), fitted
// by least squares over the most recent forwards. The scheduler asks how many tokens fit in the
// time a step may spend on prefill while others decode.
#pragma once
#include <array>
#include <cstddef>

namespace lily {

class PrefillCost {
 public:
  // One observed forward: n tokens in `seconds`.
  void add(size_t n, double seconds);
  bool known() const { return count_ > 0; }
  double fixed() const { return fixed_; }          // seconds per forward
  double per_token() const { return per_token_; }  // seconds per token
  double predict(size_t n) const { return fixed_ + per_token_ * double(n); }
  // Most tokens whose forward is predicted to take at most `seconds` (0 if not even one token
  // fits; only meaningful when known()).
  size_t tokens_within(double seconds) const;

 private:
  void fit();
  static constexpr size_t kWindow = 32;
  std::array<double, kWindow> n_{}, s_{};
  size_t count_ = 0, next_ = 0;
  double fixed_ = 0, per_token_ = 0;
};

}  // namespace lily
