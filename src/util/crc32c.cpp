// Implements CRC-32C (crc32c.h).
#include "util/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSCPP_CRC32C_X86 1
#include <nmmintrin.h>
#endif

namespace dscpp {
namespace {

constexpr uint32_t kReflectedPoly = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kReflectedPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

#if DSCPP_CRC32C_X86
// NOTE [three streams]: one crc32 instruction takes 3 cycles before the next can use its result
// but a core starts one every cycle, so three independent streams over three consecutive blocks
// of kStream bytes run about 3x faster than one. The CRC register is linear over GF(2): the
// register after blocks A then B is shift(register after A, |B|) ^ (register of B from 0), where
// shift() is what running over |B| zero bytes does. That operator on 32-bit registers is tabled
// once (4 tables of 256, from the 32 basis vectors).
constexpr size_t kStream = 8192;

__attribute__((target("sse4.2"))) uint32_t over_zeros(uint32_t reg, size_t n) {
  uint64_t c = reg;
  for (size_t i = 0; i < n; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

struct ShiftTables {
  uint32_t t[4][256];
  uint32_t operator()(uint32_t r) const {
    return t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ t[2][(r >> 16) & 0xFF] ^ t[3][r >> 24];
  }
};

const ShiftTables& shift_by_stream() {
  static const ShiftTables tables = [] {
    ShiftTables s{};
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) basis[i] = over_zeros(uint32_t{1} << i, kStream);
    for (int j = 0; j < 4; ++j) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t r = 0;
        for (int k = 0; k < 8; ++k) {
          if ((b >> k) & 1) r ^= basis[8 * j + k];
        }
        s.t[j][b] = r;
      }
    }
    return s;
  }();
  return tables;
}

__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  if (n >= 3 * kStream) {
    const ShiftTables& shift = shift_by_stream();
    for (; n >= 3 * kStream; n -= 3 * kStream, p += 3 * kStream) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kStream; i += 8) {
        uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, p + kStream + i, 8);
        std::memcpy(&wd, p + 2 * kStream + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
      }
      const uint32_t ab = shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
      c = shift(ab) ^ static_cast<uint32_t>(d);
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // unaligned-safe
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#endif

}  // namespace

namespace detail {

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

bool crc32c_has_instruction() {
#if DSCPP_CRC32C_X86
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

}  // namespace detail

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if DSCPP_CRC32C_X86
  if (detail::crc32c_has_instruction()) return extend_sse42(crc, data, n);
#endif
  return detail::crc32c_extend_portable(crc, data, n);
}

}  // namespace dscpp
