// SHA-256 against FIPS 180-4's examples (and the million-'a' message), split into updates at
// every length; HMAC-SHA-256 against RFC 4231's test cases 1, 2, 3 and 6 (a key longer than a
// block).
#include "util/sha256.h"

#include <gtest/gtest.h>

#include <string>

#include "util/strings.h"

namespace dscpp {
namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }

TEST(Sha256, PublishedExamples) {
  EXPECT_EQ(hex(sha256("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc", 3)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(hex(sha256(two_blocks.data(), two_blocks.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(hex(sha256(million.data(), million.size())),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, AnySplitIntoUpdatesGivesTheSameDigest) {
  std::string msg;
  for (int i = 0; i < 200; ++i) msg.push_back(static_cast<char>(i * 7 + 3));
  const Sha256Digest whole = sha256(msg.data(), msg.size());
  for (size_t cut = 0; cut <= msg.size(); ++cut) {
    Sha256 s;
    s.update(msg.data(), cut);
    s.update(msg.data() + cut, msg.size() - cut);
    EXPECT_TRUE(digests_equal(s.finish(), whole)) << "cut at " << cut;
  }
}

TEST(HmacSha256, Rfc4231TestCases) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, DigestsDifferingAnywhereCompareUnequal) {
  const Sha256Digest a = hmac_sha256("key", "message");
  for (size_t i = 0; i < a.size(); ++i) {
    Sha256Digest b = a;
    b[i] ^= 1;
    EXPECT_FALSE(digests_equal(a, b)) << i;
  }
  EXPECT_TRUE(digests_equal(a, hmac_sha256("key", "message")));
}

}  // namespace
}  // namespace dscpp
