// fast_mmap's lookup of the file behind a mapping (refault_small_folios evicts the weights through it):
// the path and the offset of an address, for a mapping that starts past the file's first page.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/fast_mmap.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "model/weights.h"

namespace lily {
namespace {

TEST(FastMmap, MappedFileGivesPathAndOffset) {
  const long page = ::sysconf(_SC_PAGESIZE);
  char tmpl[] = "/tmp/lily_mmap_testXXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  const std::vector<char> bytes(size_t(page) * 4, 'x');
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  // Pages 1..3 of the file, so the mapping's own offset counts too.
  void* p = ::mmap(nullptr, size_t(page) * 3, PROT_READ, MAP_PRIVATE, fd, page);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  size_t off = 0;
  const std::string path = cpu::fast::mapped_file(static_cast<const char*>(p) + page + 100, off);
  EXPECT_EQ(std::filesystem::weakly_canonical(path), std::filesystem::weakly_canonical(tmpl));
  EXPECT_EQ(off, size_t(2 * page + 100));
  ::munmap(p, size_t(page) * 3);
  ::unlink(tmpl);
  // Anonymous memory and the stack are no file.
  std::vector<int> heap(1 << 20);
  size_t off2 = 7;
  EXPECT_TRUE(cpu::fast::mapped_file(heap.data(), off2).empty());
  EXPECT_TRUE(cpu::fast::mapped_file(&off2, off2).empty());
}

// The weight regions of a loaded checkpoint: inside its one file mapping, 2 MiB aligned, with the file
// offsets of that mapping, and nothing else (the calls that drop pages touch only these ranges).
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
  size_t off = 0;
  EXPECT_EQ(cpu::fast::mapped_file(reinterpret_cast<const void*>(r.a), off), r.path);
  EXPECT_EQ(off, r.file_offset);
  // The region lies inside the tensors' bytes: the first codes byte is at or before it.
  EXPECT_LE(reinterpret_cast<uintptr_t>(w.value().embed.codes), r.b);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lily
