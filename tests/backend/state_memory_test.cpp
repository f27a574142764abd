// What one sequence state takes (model.h's StateMemory), against sizes computed by hand: the CUDA
// layout of the real model (cuda_state_layout.h: two allocations, 2 MiB pages) and the CPU state's,
// and the CPU state itself: its bytes() after new_state, reserve (straight to `upto`, or doubling)
// and clone are exactly what StateMemory says; a CPU backend with a state limit (the test hook
// that acts as a small GPU) refuses new states, growth and clones beyond it and changes nothing then.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_state.h"
#include "backend/cuda_state_layout.h"
#include "model/synthetic_weights.h"

namespace lily {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(StateMemory, Arithmetic) {
  StateMemory m;
  m.fixed = 3 * kMiB + 5;  // takes 2 pages of 2 MiB
  m.kv_base = 100;
  m.per_position = 1000;
  m.initial_positions = 64;
  m.position_step = 16;
  m.page = 2 * kMiB;
  EXPECT_EQ(m.alloc_bytes(2 * kMiB - 1), 2 * kMiB - 1);  // below a page: as is
  EXPECT_EQ(m.alloc_bytes(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(m.alloc_bytes(2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(m.positions_for(0, 1000), 64);     // a new state: the initial positions
  EXPECT_EQ(m.positions_for(64, 1000), 64);
  EXPECT_EQ(m.positions_for(65, 1000), 80);    // rounded up to the step
  EXPECT_EQ(m.positions_for(999, 1000), 1000); // never beyond max_seq
  EXPECT_EQ(m.positions_for(5000, 1000), 1000);
  EXPECT_EQ(m.positions_for(10, 40), 40);      // initial positions capped by max_seq
  EXPECT_EQ(m.bytes_at(80), 4 * kMiB + 100 + 80000);
  EXPECT_EQ(m.bytes_for(65, 1000), 4 * kMiB + 100 + 80000);
  // 2,100 positions: 2,100,100 bytes of K/V, just over a page.
  EXPECT_EQ(m.bytes_at(2100), 4 * kMiB + 4 * kMiB);
  EXPECT_EQ(m.clone_bytes(0, 1000), 4 * kMiB + 100 + 16000);  // a clone holds at least one position, rounded
  EXPECT_EQ(m.clone_bytes(17, 1000), 4 * kMiB + 100 + 32000);
}

// Qwen3.6-35B-A3B on CUDA, fp32 K/V (the default), fp16 DeltaNet states, by hand:
//   conv window 2 x 8,192 x 3 x 4 = 196,608 B -> 196,864 in the arena (+16, on 256);
//   S 32 x 128 x 128 x 2 = 1,048,576 B -> 1,048,832; StepCtl 80 B -> 256;
//   fixed arena 30 x (196,864 + 1,048,832) + 256 = 37,371,136 B -> 18 pages = 37,748,736;
//   K/V per position 10 layers x (K, V) x 2 heads x 256 x 4 = 40,960 B, + 20 x 256 B of padding;
//   new (2,048 positions): 83,891,200 B -> 41 pages = 85,983,232, state 123,731,968 B;
//   at 8,192: 335,549,440 B -> 161 pages = 337,641,472, state 375,390,208 B (358 MiB);
//   at 5,000 tokens: 5,008 positions, 205,132,800 B -> 98 pages, state 243,269,632 B.
TEST(StateMemory, CudaLayoutOfTheRealModel) {
  auto cfg = synthetic_config("qwen3.6-35b-a3b");
  ASSERT_TRUE(cfg.is_ok());
  const CudaStateLayout lay = cuda_state_layout(*cfg, /*ctl_bytes=*/80, /*initial=*/2048);
  EXPECT_EQ(lay.n_gdn, 30);
  EXPECT_EQ(lay.n_attn, 10);
  EXPECT_EQ(lay.conv_bytes, 196608u);
  EXPECT_EQ(lay.S_bytes, 1048576u);
  EXPECT_EQ(lay.kv_row, 2048u);
  EXPECT_EQ(lay.fixed_arena(), 37371136u);
  EXPECT_EQ(lay.kv_arena(2048), 83891200u);
  const StateMemory m = lay.memory();
  EXPECT_EQ(m.per_position, 40960u);
  EXPECT_EQ(m.kv_base, 5120u);
  EXPECT_EQ(m.kv_elem, 4);  // fp32 K/V and conv windows, fp16 S: what the byte floor counts
  EXPECT_EQ(m.s_elem, 2);
  EXPECT_EQ(m.bytes_at(2048), 37748736u + 85983232u);
  EXPECT_EQ(m.bytes_for(0, 8192), 123731968u);
  EXPECT_EQ(m.bytes_for(8192, 8192), 375390208u);
  EXPECT_EQ(m.bytes_for(5000, 8192), 243269632u);
  for (int cap : {16, 2048, 5008, 8192})  // the linear form is exact: kv_row is a multiple of 256
    EXPECT_EQ(m.kv_base + m.per_position * size_t(cap), lay.kv_arena(cap)) << cap;
}

// The CPU's: conv windows 8,192 x 3 and S 32 x 128 x 128 floats per DeltaNet layer, fp32 K/V; no
// initial K/V, no rounding.
TEST(StateMemory, CpuOfTheRealModel) {
  auto cfg = synthetic_config("qwen3.6-35b-a3b");
  ASSERT_TRUE(cfg.is_ok());
  const StateMemory m = cpu::cpu_state_memory(*cfg);
  EXPECT_EQ(m.fixed, 65863680u);  // 30 x (24,576 + 524,288) x 4
  EXPECT_EQ(m.per_position, 40960u);
  EXPECT_EQ(m.kv_elem, 4);
  EXPECT_EQ(m.s_elem, 4);
  EXPECT_EQ(m.bytes_for(0, 8192), 65863680u);
  EXPECT_EQ(m.bytes_for(8192, 8192), 65863680u + 8192u * 40960u);
}

struct Tiny {
  std::unique_ptr<SyntheticWeights> sw;
  Tiny() {
    auto cfg = synthetic_config("tiny");
    EXPECT_TRUE(cfg.is_ok());
    sw = make_synthetic_weights(*cfg, 11);
  }
  std::vector<int32_t> tokens(int n) const {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 37 + 5) % sw->w.cfg.vocab_size);
    return t;
  }
};

// The in-memory tiny config: 3 DeltaNet layers of (1,024 x 3 + 4 x 128 x 128) floats = 823,296 B,
// one attention layer of 2 x 2 x 64 floats = 1,024 B per position.
TEST(StateMemory, CpuStateHoldsWhatItsMemorySays) {
  Tiny t;
  auto be = make_cpu_backend(t.sw->w);
  ASSERT_TRUE(be.is_ok());
  auto model = Model::over(t.sw->w.cfg, std::move(be).value());
  const StateMemory m = model->state_memory(128);
  EXPECT_EQ(m.fixed, 823296u);
  EXPECT_EQ(m.per_position, 1024u);
  auto s = model->new_state(128);
  ASSERT_TRUE(s.is_ok());
  SeqState& st = **s;
  EXPECT_EQ(st.bytes(), m.bytes_for(0, 128));
  ASSERT_TRUE(st.reserve(10, 40).is_ok());  // straight to upto
  EXPECT_EQ(st.bytes(), m.bytes_for(40, 128));
  EXPECT_EQ(st.bytes(), 823296u + 40u * 1024u);
  ASSERT_TRUE(st.reserve(40).is_ok());  // within: nothing changes
  EXPECT_EQ(st.bytes(), m.bytes_for(40, 128));
  ASSERT_TRUE(st.reserve(41).is_ok());  // without upto: doubles
  EXPECT_EQ(st.bytes(), m.bytes_for(80, 128));
  ASSERT_TRUE(st.reserve(100, 200).is_ok());  // upto capped by max_seq
  EXPECT_EQ(st.bytes(), m.bytes_for(128, 128));
  EXPECT_FALSE(st.reserve(129).is_ok());
  const auto toks = t.tokens(21);
  ASSERT_TRUE(model->forward(st, toks, {}).is_ok());
  EXPECT_EQ(st.bytes(), m.bytes_for(128, 128)) << "a forward within the reserved room must not reallocate";
  auto c = st.clone();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->n_tokens(), 21);
  EXPECT_EQ(c->bytes(), m.clone_bytes(21, 128));
  st.reset();
  EXPECT_EQ(st.bytes(), m.bytes_for(128, 128)) << "reset keeps the allocation";
}

TEST(StateMemory, CpuStateLimitActsAsASmallDevice) {
  Tiny t;
  const size_t fixed = 823296, limit = 2 * fixed + 100 * 1024;
  auto be = make_cpu_backend(t.sw->w, limit);
  ASSERT_TRUE(be.is_ok());
  auto dm = (*be)->device_memory();
  ASSERT_TRUE(dm.is_ok());
  EXPECT_EQ(dm->total, limit);
  EXPECT_EQ(dm->free, limit);
  auto a = (*be)->new_state(128);
  auto b = (*be)->new_state(128);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_FALSE((*be)->new_state(128).is_ok()) << "a third state passes the limit";
  EXPECT_EQ((*be)->device_memory()->free, 100u * 1024u);
  ASSERT_TRUE((*a)->reserve(50, 50).is_ok());
  const size_t b_before = (*b)->bytes();
  Status grow = (*b)->reserve(60, 60);  // 50 + 60 positions > 100
  EXPECT_FALSE(grow.is_ok());
  EXPECT_NE(grow.message().find("out of memory"), std::string::npos) << grow.message();
  EXPECT_EQ((*b)->bytes(), b_before) << "a failed growth changes nothing";
  ASSERT_TRUE((*b)->reserve(50, 50).is_ok());
  EXPECT_EQ((*b)->clone(), nullptr) << "no room for a copy";
  a.value().reset();  // a's state is destroyed: its fixed part and K/V go back
  EXPECT_EQ((*be)->device_memory()->free, limit - (*b)->bytes());
  auto c = (*b)->clone();
  ASSERT_TRUE(c);
  EXPECT_EQ((*be)->device_memory()->free, limit - (*b)->bytes() - c->bytes());
}

}  // namespace
}  // namespace lily
