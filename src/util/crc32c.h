// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected; as iSCSI, ext4 and LevelDB use it): the
// checksum a checkpoint's manifest records for each file (docs/checkpoint.md). On x86-64 with
// SSE4.2 the CPU's crc32 instruction computes it (several GB/s); elsewhere a table does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dscpp {

// The CRC-32C of `n` bytes following data whose CRC-32C was `crc` (0 to start), so that
// crc32c_extend(crc32c(a), b) == crc32c(a followed by b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

namespace detail {
// The table path, and whether the instruction path exists on this CPU (tests compare the two).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
bool crc32c_has_instruction();
}  // namespace detail

}  // namespace dscpp
