// Returning freed heap memory to the system, keeping it for reuse while training, and the
// process's peak resident memory.
#pragma once

#include <cstdint>

namespace dscpp {

// The most memory this process has held resident so far, in bytes (getrusage's ru_maxrss).
int64_t peak_rss_bytes();

// The memory this process holds resident now, in bytes (/proc/self/statm; 0 where there is none).
int64_t current_rss_bytes();

// Hands the pages of freed heap memory back to the system (glibc's malloc_trim; a no-op
// elsewhere). The engine calls it after it frees a model's worth of memory at once (the original
// parameters after flattening, a unit's full parameters after sharding): glibc returns a freed
// block to the system only when it was mmapped, and once a program has freed a few large
// temporaries its mmap threshold has risen so far that parameters live on the heap, where freed
// memory stays resident.
void return_freed_memory();

// NOTE [allocator for training]: glibc's malloc gives memory back to the system in two ways
// that cost a CPU training step dearly, since every step frees and allocates again the same
// activations, gradients of ops and temporaries: a block above the mmap threshold (128 KiB at
// first, rising to the largest freed mmapped block, at most 32 MiB) is unmapped when freed and
// faulted in again page by page when next allocated, and free memory at the top of the heap is
// trimmed once it exceeds the trim threshold (twice the mmap threshold) and faulted back at the
// next step. On the benchmark GPT (2 ranks on 2 cores; docs/benchmarks.md) that was 13k minor
// page faults and 90 ms of system time per rank and step in fp32. With the mmap threshold fixed
// at glibc's maximum (32 MiB) and trimming off, a step reuses the previous step's memory.
// Setting one without the other makes things worse: a fixed trim threshold alone stops the mmap
// threshold from rising (5.8M faults in 15 steps instead of 0.7M), a fixed mmap threshold alone
// still trims.
//
// keep_freed_memory_for_reuse() sets both (glibc only; returns false elsewhere, or when the
// environment sets DSCPP_MALLOC_TUNING=off, and then changes nothing; a value other than on or
// off is a ConfigError). The engine calls it for a CPU model as set-up starts: what set-up frees
// in bulk (the original parameters) it still returns to the system explicitly
// (return_freed_memory, which trims whatever the thresholds say), and peak memory stays the same
// since the steps reuse what they free. Blocks above 32 MiB are still mmapped and unmapped.
bool keep_freed_memory_for_reuse();

}  // namespace dscpp
