// Returning freed heap memory to the system.
#pragma once

namespace dscpp {

// Hands the pages of freed heap memory back to the system (glibc's malloc_trim; a no-op
// elsewhere). The engine calls it after it frees a model's worth of memory at once (the original
// parameters after flattening, a unit's full parameters after sharding): glibc returns a freed
// block to the system only when it was mmapped, and once a program has freed a few large
// temporaries its mmap threshold has risen so far that parameters live on the heap, where freed
// memory stays resident.
void return_freed_memory();

}  // namespace dscpp
