// fast_mmap's weight regions (the ranges the CPU backend advises, populates and re-reads): for a loaded
// checkpoint, inside its one file mapping, 2 MiB aligned, with the right file offsets — checked against the
// file's own bytes — before and after MADV_HUGEPAGE splits the mapping; none for weights in anonymous memory.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/fast_mmap.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "model/weights.h"

namespace lily {
namespace {

// The bytes of `path` at `off` equal the n bytes mapped at p.
void expect_same_bytes(const std::string& path, size_t off, uintptr_t p, size_t n) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(off));
  std::vector<char> buf(n);
  ASSERT_TRUE(f.read(buf.data(), std::streamsize(n))) << path << " at " << off;
  EXPECT_EQ(std::memcmp(buf.data(), reinterpret_cast<const void*>(p), n), 0) << path << " at " << off;
}

TEST(FastMmap, WeightRegionsAreTheCheckpointMapping) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("lily-mmap-" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(write_synthetic_checkpoint({"small", 3, dir}).is_ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck) << ck.message();
  auto w = ModelWeights::from_checkpoint(*ck.value());
  ASSERT_TRUE(w) << w.message();
  const auto regions = cpu::fast::weight_regions(w.value());
  ASSERT_EQ(regions.size(), 1u) << "one safetensors file, one region";
  const auto& r = regions[0];
  EXPECT_EQ(std::filesystem::weakly_canonical(r.path), std::filesystem::weakly_canonical(dir + "/model.safetensors"));
  EXPECT_LT(r.a, r.b);
  EXPECT_EQ(r.a % (2u << 20), 0u);
  EXPECT_EQ(r.b % (2u << 20), 0u);
  expect_same_bytes(r.path, r.file_offset, r.a, 4096);
  expect_same_bytes(r.path, r.file_offset + (r.b - r.a) - 4096, r.b - 4096, 4096);
  // MADV_HUGEPAGE splits the mapping at the region's ends. Found again, the region lies in a mapping that
  // starts at a file offset past 0 (and loses the 2 MiB pages its edge tensors now share with the split-off
  // mappings: compute the regions once, before advising), its offsets still the file's.
  EXPECT_EQ(cpu::fast::advise_huge_pages(regions), r.b - r.a);
  const auto again = cpu::fast::weight_regions(w.value());
  ASSERT_EQ(again.size(), 1u);
  EXPECT_GE(again[0].a, r.a);
  EXPECT_LE(again[0].b, r.b);
  EXPECT_LT(again[0].a, again[0].b);
  EXPECT_EQ(again[0].file_offset, r.file_offset + (again[0].a - r.a));
  expect_same_bytes(again[0].path, again[0].file_offset, again[0].a, 4096);
  std::filesystem::remove_all(dir);
}

TEST(FastMmap, NoRegionsForAnonymousWeights) {
  ModelWeights w;
  std::vector<uint32_t> codes(size_t(1) << 22);  // 16 MiB on the heap
  std::vector<uint16_t> sb(size_t(4096) * 128);  // rows × groups
  w.embed.codes = codes.data(), w.embed.scales = w.embed.biases = reinterpret_cast<const bf16*>(sb.data());
  w.embed.rows = 4096, w.embed.cols = 8192, w.embed.bits = 4;
  EXPECT_TRUE(cpu::fast::weight_regions(w).empty());
}

}  // namespace
}  // namespace lily
