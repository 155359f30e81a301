// CRC-32C against the published check values (RFC 3720 B.4, and the "123456789" check value of
// the CRC catalogue), extension, and the instruction path against the table path.
#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dscpp {
namespace {

TEST(Crc32c, PublishedCheckValues) {
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x8A9136AAu);
  buf.assign(32, 0xFF);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x113FDB5Cu);
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(detail::crc32c_extend_portable(0, check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// Any split of a buffer, at any alignment, extends to the whole buffer's CRC; the instruction
// path (when this CPU has it) and the table path agree on every length.
TEST(Crc32c, ExtendsAcrossSplitsAndBothPathsAgree) {
  std::mt19937 gen(7);
  std::vector<uint8_t> buf(4099);
  for (auto& b : buf) b = static_cast<uint8_t>(gen());
  for (size_t start : {size_t{0}, size_t{1}, size_t{3}}) {
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{4096}}) {
      const uint8_t* p = buf.data() + start;
      const uint32_t whole = crc32c(p, n);
      EXPECT_EQ(whole, detail::crc32c_extend_portable(0, p, n)) << start << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        EXPECT_EQ(crc32c_extend(crc32c(p, cut), p + cut, n - cut), whole) << start << " " << n;
      }
    }
  }
  // Without the instruction (not x86-64, or no SSE4.2) both sides are the table path, and the
  // test still checks extension.
  RecordProperty("crc32c_instruction", detail::crc32c_has_instruction() ? "yes" : "no");
}

// NOTE [three streams]: buffers long enough for the three-stream path (3 x 8 KiB blocks), at
// lengths around its block edges and offsets, split anywhere, equal the table path.
TEST(Crc32c, ThreeStreamsAgreeWithTheTableAtEveryEdge) {
  std::mt19937 gen(11);
  std::vector<uint8_t> buf(200000);
  for (auto& b : buf) b = static_cast<uint8_t>(gen());
  const size_t block = 3 * 8192;
  for (size_t start : {size_t{0}, size_t{5}}) {
    for (size_t n : {block - 1, block, block + 1, block + 8, 2 * block - 3, 2 * block,
                     5 * block + 77, buf.size() - start}) {
      const uint8_t* p = buf.data() + start;
      const uint32_t want = detail::crc32c_extend_portable(0, p, n);
      EXPECT_EQ(crc32c(p, n), want) << start << " " << n;
      for (size_t cut : {size_t{1}, n / 2, n - 9}) {
        EXPECT_EQ(crc32c_extend(crc32c(p, cut), p + cut, n - cut), want) << start << " " << n;
      }
    }
  }
}

}  // namespace
}  // namespace dscpp
