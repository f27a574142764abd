// Accumulators behind fast_profile.h (the forward pass runs on one thread at a time).
#include "backend/cpu/fast_profile.h"

namespace lily::cpu {
namespace {

const char* const kNames[] = {"embed", "rmsnorm+quantize", "mixer projections", "deltanet (conv+step+norm)",
                              "attention (norm+rope+sdpa)", "mixer out_proj", "moe router+shared gate/up",
                              "moe experts gate/up", "moe act+combine", "moe experts+shared down", "lm_head"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(Op::kCount));

bool g_on = false;
OpStat g_stats[size_t(Op::kCount)];

}  // namespace

void profile_enable(bool on) { g_on = on; }
bool profile_enabled() { return g_on; }
void profile_reset() {
  for (auto& s : g_stats) s = OpStat{};
}
void profile_add(Op op, double seconds, double bytes) {
  OpStat& s = g_stats[size_t(op)];
  s.seconds += seconds, s.bytes += bytes, ++s.calls;
}
std::vector<OpStat> profile_snapshot() {
  std::vector<OpStat> v;
  for (size_t i = 0; i < size_t(Op::kCount); ++i) {
    v.push_back(g_stats[i]);
    v.back().name = kNames[i];
  }
  return v;
}

}  // namespace lily::cpu
