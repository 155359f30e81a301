// NOTE [allocator for training]: keep_freed_memory_for_reuse() tunes glibc's malloc unless
// DSCPP_MALLOC_TUNING=off, and any other value is a clear error; a block below 32 MiB then comes
// from the heap, stays there when freed, and is reused without new page faults.
#include "util/memory.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "dscpp/error.h"
#include "support/errors.h"

namespace dscpp {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(KeepFreedMemory, OffLeavesTheAllocatorAloneAndOtherValuesAreAnError) {
  setenv("DSCPP_MALLOC_TUNING", "off", 1);
  EXPECT_FALSE(keep_freed_memory_for_reuse());
  setenv("DSCPP_MALLOC_TUNING", "yes", 1);
  const std::string msg = testing::error_of<ConfigError>([] { keep_freed_memory_for_reuse(); });
  EXPECT_NE(msg.find("DSCPP_MALLOC_TUNING is 'yes'; expected on (the default) or off"),
            std::string::npos)
      << msg;
  unsetenv("DSCPP_MALLOC_TUNING");
}

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
TEST(KeepFreedMemory, ABlockBelow32MiBComesFromTheHeapAndStaysThereWhenFreed) {
  unsetenv("DSCPP_MALLOC_TUNING");
  ASSERT_TRUE(keep_freed_memory_for_reuse());
  constexpr size_t kBytes = 24 << 20;
  const size_t mmapped = mallinfo2().hblkhd;
  char* p = static_cast<char*>(std::malloc(kBytes));
  std::memset(p, 1, kBytes);
  EXPECT_EQ(mallinfo2().hblkhd, mmapped) << "glibc's default would mmap it";
  std::free(p);
  EXPECT_GE(mallinfo2().keepcost, kBytes) << "glibc's default would trim it";
  const long before = minor_faults();
  p = static_cast<char*>(std::malloc(kBytes));
  std::memset(p, 2, kBytes);
  std::free(p);
  EXPECT_LT(minor_faults() - before, 100) << "6144 pages faulted in again";
}
#endif

// The peak grows by at least what the process touches beyond it, in bytes.
TEST(PeakRss, CountsMemoryTouchedBeyondTheEarlierPeak) {
  const int64_t before = peak_rss_bytes();
  EXPECT_GT(before, 0);
  const size_t size = static_cast<size_t>(before) + (64 << 20);  // surely past the old peak
  char* block = static_cast<char*>(std::malloc(size));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, size);
  const int64_t after = peak_rss_bytes();
  EXPECT_GE(after, before + (64 << 20) - (8 << 20)) << "before " << before << ", after " << after;
  std::free(block);
}

}  // namespace
}  // namespace dscpp
