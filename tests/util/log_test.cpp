// The logging facade (src/util/log.h): a macro formats in the caller's file (NOTE [two fmts]) and
// log.cpp writes the line; one argument is the message itself, braces and all; a level below the
// process's is not formatted at all.
#include "util/log.h"

#include <gtest/gtest.h>

#include <string>

namespace dscpp {
namespace {

TEST(Log, OneArgumentIsTheMessageItselfMoreAreAFormat) {
  EXPECT_EQ(log::message("units {\"h.*\"} as given"), "units {\"h.*\"} as given");
  EXPECT_EQ(log::message(std::string("a {} b")), "a {} b");
  EXPECT_EQ(log::message("rank {} of {}: {:.1f} MiB", 1, 2, 3.31), "rank 1 of 2: 3.3 MiB");
}

TEST(Log, LinesBelowTheLevelAreNeitherFormattedNorWritten) {
  const LogLevel before = log_level();
  set_log_level(LogLevel::warning);
  EXPECT_FALSE(log::enabled(LogLevel::info));
  EXPECT_TRUE(log::enabled(LogLevel::error));
  int formatted = 0;
  auto count = [&] { return ++formatted; };
  DSCPP_LOG_INFO("not written: {}", count());
  EXPECT_EQ(formatted, 0);
  testing::internal::CaptureStderr();
  DSCPP_LOG_WARN("written: {}", count());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(formatted, 1);
  EXPECT_NE(err.find("[warning] written: 1"), std::string::npos) << err;
  set_log_level(before);
}

}  // namespace
}  // namespace dscpp
