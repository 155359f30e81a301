// The error lines of a rank's output (NOTE [error lines] in src/launch/error_lines.h): dscpp log
// lines at error level as the real logger writes them, an uncaught exception's lines with a
// bounded multi-line message, a dscpp tool's top-level error, and only the last ones kept.
#include "launch/error_lines.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "util/log.h"

namespace dscpp::launch {
namespace {

std::vector<std::string> error_lines_of(const std::vector<std::string>& output,
                                        size_t max_lines = 10) {
  ErrorLines e(max_lines);
  for (const auto& line : output) e.add(line);
  return e.lines();
}

TEST(ErrorLines, KeepsErrorLogLinesOnly) {
  const std::vector<std::string> out = {
      "[2026-11-29 22:30:01.123] [rank 0] [info] config: {\"train_batch_size\": 8}",
      "[2026-11-29 22:30:01.124] [rank 0] [warning] no optimizer given",
      "[2026-11-29 22:30:01.125] [rank 0] [error] shard 2 is corrupt",
      "step 1 loss 2.31",
      "  \"error\": [1, 2]",
      "[rank 3] [2026-11-29 22:30:01.126] [rank 3] [error] behind a node agent's prefix",
      "[2026-11-29 22:30:01.127] [launcher] [error] the launcher's own",
      "[2026-11-29 22:30:01.128] [rank 0] [info] an [error] word later in a message",
  };
  EXPECT_EQ(error_lines_of(out), (std::vector<std::string>{out[2], out[5], out[6]}));
}

TEST(ErrorLines, MatchesWhatTheLoggerWrites) {
  const LogLevel before = log_level();
  set_log_level(LogLevel::info);
  ::testing::internal::CaptureStderr();
  DSCPP_LOG_INFO("all is well");
  DSCPP_LOG_ERROR("the real thing: {}", 42);
  DSCPP_LOG_WARN("careful");
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_log_level(before);
  std::vector<std::string> lines;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << err;
  EXPECT_EQ(error_lines_of(lines), std::vector<std::string>{lines[1]}) << err;
}

TEST(ErrorLines, UncaughtExceptionWithBoundedMessage) {
  const std::vector<std::string> out = {
      "step 7 loss 1.9",
      "terminate called after throwing an instance of 'c10::Error'",
      "  what():  CUDA out of memory.",
      "Tried to allocate 2.00 GiB",
      "Exception raised from malloc at CUDACachingAllocator.cpp:1 (most recent call first):",
      "frame #0: c10::Error::Error(...)",
      "frame #1: ...",
  };
  EXPECT_EQ(error_lines_of(out), (std::vector<std::string>(out.begin() + 1, out.begin() + 5)));

  // A long message keeps kMessageLines lines after what(); a log line ends it sooner.
  std::vector<std::string> longer = {"  what():  first"};
  for (int i = 0; i < 8; ++i) longer.push_back("more " + std::to_string(i));
  auto kept = error_lines_of(longer);
  ASSERT_EQ(kept.size(), 1 + ErrorLines::kMessageLines);
  EXPECT_EQ(kept.back(), "more " + std::to_string(ErrorLines::kMessageLines - 1));
  kept = error_lines_of({"  what():  first", "second",
                         "[2026-11-29 22:30:01.123] [rank 0] [info] next", "not the message"});
  EXPECT_EQ(kept, (std::vector<std::string>{"  what():  first", "second"}));
}

TEST(ErrorLines, DscppToolErrorAndPlainLinesAfterAnErrorLog) {
  EXPECT_EQ(error_lines_of({"dscpp train: error: config key 'zero_optimization.stage': 5",
                            "HINT: use 0-3", "plain"}),
            (std::vector<std::string>{"dscpp train: error: config key 'zero_optimization.stage': 5",
                                      "HINT: use 0-3", "plain"}));
  // After an error-level log line the program may print on: those lines are not taken.
  EXPECT_EQ(error_lines_of({"[2026-11-29 22:30:01.123] [rank 0] [error] bad", "step 8"}),
            std::vector<std::string>{"[2026-11-29 22:30:01.123] [rank 0] [error] bad"});
}

TEST(ErrorLines, KeepsOnlyTheLastOnes) {
  std::vector<std::string> out;
  for (int i = 0; i < 25; ++i) {
    out.push_back("[2026-11-29 22:30:01.123] [rank 0] [error] e" + std::to_string(i));
  }
  auto kept = error_lines_of(out, 10);
  ASSERT_EQ(kept.size(), 10u);
  EXPECT_EQ(kept.front(), out[15]);
  EXPECT_EQ(kept.back(), out[24]);
  EXPECT_TRUE(error_lines_of(out, 0).empty());
}

}  // namespace
}  // namespace dscpp::launch
