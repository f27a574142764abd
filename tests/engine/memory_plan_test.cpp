// The server's memory plan (engine/memory_plan.h) against hand-computed sizes: the real model on an
// H200-sized device (--parallel's CUDA default of 256 fits at --max-seq 8192), a long context that
// lowers the default and warns about an explicit value, --state-mb, a context that does not fit
// (an error naming --max-seq), and a small device's headroom.
#include <gtest/gtest.h>

#include "backend/cuda_state_layout.h"
#include "engine/memory_plan.h"
#include "model/synthetic_weights.h"

namespace lily {
namespace {

// State sizes of the real model on CUDA (fp32 K/V, fp16 DeltaNet states): see StateMemory.CudaLayoutOfTheRealModel.
StateMemory real_cuda_state() {
  auto cfg = synthetic_config("qwen3.6-35b-a3b");
  EXPECT_TRUE(cfg.is_ok());
  return cuda_state_layout(*cfg, 80, 2048).memory();
}

// An H200 as cudaMemGetInfo reports it (140.4 GiB), 128 GB free after the weights and scratch.
MemoryPlanInput h200(int max_seq, int parallel, bool is_default) {
  MemoryPlanInput in;
  in.state = real_cuda_state();
  in.device = {150754820096ull, 128000000000ull};
  in.max_seq = max_seq;
  in.parallel = parallel;
  in.parallel_is_default = is_default;
  in.cache_budget = size_t(8) << 30;
  return in;
}

// headroom = min(free / 4, max(1 GiB, total / 32)) = 150,754,820,096 / 32 = 4,711,088,128;
// budget = 128,000,000,000 - 4,711,088,128 = 123,288,911,872.
TEST(MemoryPlan, RealModelOnAnH200FitsTheDefault256) {
  auto p = plan_memory(h200(8192, 256, true));
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->headroom, 4711088128ull);
  EXPECT_EQ(p->budget, 123288911872ull);
  EXPECT_EQ(p->state_new, 123731968u);
  EXPECT_EQ(p->state_max, 375390208u);
  EXPECT_EQ(p->fit_at_max_seq, 328);  // 123,288,911,872 / 375,390,208 = 328.4
  EXPECT_EQ(p->parallel, 256);
  EXPECT_EQ(p->cache_budget, size_t(8) << 30);
  EXPECT_TRUE(p->notes.empty()) << p->notes[0];
  ASSERT_EQ(p->summary().size(), 3u);
  EXPECT_NE(p->summary()[2].find("--parallel 256"), std::string::npos) << p->summary()[2];
}

// At --max-seq 65,536 a state is 37,748,736 + 1,281 pages (2,686,451,712) = 2,724,200,448 B: 45 fit.
TEST(MemoryPlan, LongContextLowersTheDefaultAndWarnsAboutAnExplicitParallel) {
  auto d = plan_memory(h200(65536, 256, true));
  ASSERT_TRUE(d.is_ok()) << d.message();
  EXPECT_EQ(d->state_max, 2724200448ull);
  EXPECT_EQ(d->fit_at_max_seq, 45);
  EXPECT_EQ(d->parallel, 45);
  ASSERT_EQ(d->notes.size(), 1u);
  EXPECT_NE(d->notes[0].find("lowered from the default 256 to 45"), std::string::npos) << d->notes[0];
  auto e = plan_memory(h200(65536, 256, false));
  ASSERT_TRUE(e.is_ok()) << e.message();
  EXPECT_EQ(e->parallel, 256) << "an explicit --parallel is kept: requests wait for memory";
  ASSERT_EQ(e->notes.size(), 1u);
  EXPECT_NE(e->notes[0].find("only 45 requests fit"), std::string::npos) << e->notes[0];
}

TEST(MemoryPlan, StateMbLimitsTheBudget) {
  MemoryPlanInput in = h200(8192, 256, true);
  in.budget_limit = size_t(10) << 30;
  auto p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->budget, size_t(10) << 30);
  EXPECT_EQ(p->fit_at_max_seq, 28);  // 10,737,418,240 / 375,390,208 = 28.6
  EXPECT_EQ(p->parallel, 28);
  in.budget_limit = size_t(200) << 30;  // more than is free: the free memory wins, with a note
  p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->budget, 123288911872ull);
  ASSERT_EQ(p->notes.size(), 1u);
  EXPECT_NE(p->notes[0].find("--state-mb"), std::string::npos);
}

// At --max-seq 262,144 one state is 10,777,264,128 B: more than a 10 GiB budget.
TEST(MemoryPlan, AContextThatDoesNotFitIsAnError) {
  MemoryPlanInput in = h200(262144, 256, true);
  in.budget_limit = size_t(10) << 30;
  auto p = plan_memory(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.message().find("--max-seq 262144"), std::string::npos) << p.message();
  EXPECT_NE(p.message().find("10.0 GiB"), std::string::npos) << p.message();
  in.budget_limit = 0;  // the whole H200 holds it: 11 at once
  p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->fit_at_max_seq, 11);
  EXPECT_EQ(p->parallel, 11);
}

// A small device: the headroom is at most a quarter of what is free; the prefix cache's budget is at
// most the whole budget (it only keeps what running requests leave).
TEST(MemoryPlan, SmallDevice) {
  MemoryPlanInput in;
  in.state.fixed = 1000;
  in.state.per_position = 10;
  in.device = {size_t(8) << 30, size_t(2) << 30};
  in.max_seq = 1000;
  in.parallel = 8;
  in.cache_budget = size_t(8) << 30;
  auto p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->headroom, size_t(512) << 20);  // min(2 GiB / 4, max(1 GiB, 8 GiB / 32))
  EXPECT_EQ(p->budget, size_t(1536) << 20);
  EXPECT_EQ(p->state_max, 11000u);
  EXPECT_EQ(p->cache_budget, size_t(1536) << 20);
  EXPECT_EQ(p->parallel, 8);
  EXPECT_EQ(format_bytes(1536u << 20), "1.5 GiB");
  EXPECT_EQ(format_bytes(40960), "40.0 KiB");
  EXPECT_EQ(format_bytes(512), "512 B");
}

}  // namespace
}  // namespace lily
