// Per-op time and weight bytes of the fast CPU backend, for `lily bench-cpu`'s breakdown
// (achieved GB/s per op). Off unless enabled; when on, each op costs two clock reads.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace lily::cpu {

enum class Op { kEmbed, kNorm, kMixerProj, kGdn, kAttention, kOutProj, kMoeRouterShared, kMoeGateUp, kMoeAct,
                kMoeDown, kLmHead, kCount };

struct OpStat {
  std::string name;
  double seconds = 0, bytes = 0;
  long calls = 0;
};

void profile_enable(bool on);
bool profile_enabled();
void profile_reset();
std::vector<OpStat> profile_snapshot();
void profile_add(Op op, double seconds, double bytes);

// Times the enclosing scope (or until stop()) into op when profiling is on.
class ProfileScope {
 public:
  ProfileScope(Op op, double bytes) : op_(op), bytes_(bytes), on_(profile_enabled()) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() { stop(); }
  void stop() {
    if (!on_) return;
    on_ = false;
    profile_add(op_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), bytes_);
  }

 private:
  Op op_;
  double bytes_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace lily::cpu
