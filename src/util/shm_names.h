// The names of the POSIX shared-memory segments dscpp creates, shared by their creator
// (src/comm/shm.cpp) and the launcher that cleans up after it (src/launch/process_group.cpp).
//
// NOTE [shared-memory names]: "/dscpp-<process group>-<pid>-<serial>-<random>". A segment is
// named only while rank 0 sets up the shared-memory collectives (it unlinks the name once every
// rank has mapped it), but a rank 0 killed in that window leaves the name in /dev/shm. The
// launcher runs each rank in a process group of its own whose id is the pid it knows, so when it
// kills a failed rank's group it also removes the names that start with that group's prefix.
#pragma once

#include <string>

namespace dscpp {

// The prefix of the segments the processes of group `pgid` create, as listed in /dev/shm (no
// leading '/').
inline std::string shm_segment_prefix(long pgid) { return "dscpp-" + std::to_string(pgid) + "-"; }

}  // namespace dscpp
