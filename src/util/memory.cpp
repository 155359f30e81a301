// Implements return_freed_memory, keep_freed_memory_for_reuse, peak_rss_bytes and
// current_rss_bytes (memory.h).
#include "util/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>  // defines __GLIBC__ on glibc
#include <cstring>
#include <fstream>

#include "dscpp/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dscpp {

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
}

int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

void return_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

bool keep_freed_memory_for_reuse() {
  if (const char* env = std::getenv("DSCPP_MALLOC_TUNING"); env && *env) {
    DSCPP_CHECK(!std::strcmp(env, "on") || !std::strcmp(env, "off"), ConfigError,
                "DSCPP_MALLOC_TUNING is '", env, "'; expected on (the default) or off");
    if (!std::strcmp(env, "off")) return false;
  }
#if defined(__GLIBC__)
  // NOTE [allocator for training]: both, or neither helps.
  constexpr int kMaxMmapThreshold = 32 << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
  return mallopt(M_MMAP_THRESHOLD, kMaxMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, INT32_MAX) == 1;
#else
  return false;
#endif
}

}  // namespace dscpp
