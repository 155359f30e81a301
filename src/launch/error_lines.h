// ErrorLines: picks the lines of a rank's output that say what went wrong, so the failure
// report can show them before the rank's last lines (which, in a training program, are often
// a config dump or progress lines printed after the error). Pure and single-threaded: the
// ChildGroup feeds it each line of a child as the line arrives, or the lines of a per-rank
// log file when the rank failed.
//
// NOTE [error lines]: a line is kept when it is
//  - a dscpp log line at error level, "[2026-11-29 22:30:01.123] [rank 0] [error] message"
//    (the pattern of util/log.cpp), also behind a node agent's "[rank 0] " prefix;
//  - a line of an uncaught exception: libstdc++'s "terminate called after throwing an
//    instance of 'c10::Error'" and "  what():  message", or a dscpp tool's top-level
//    "dscpp train: error: message";
//  - one of the next kMessageLines lines after a "what():" or a tool's "error:" line (a
//    libtorch or dscpp message can span lines), up to the next log line or a backtrace's
//    "frame #". Lines after an error-level log line are not taken: a program goes on
//    printing after logging an error, while an uncaught exception is its last word.
// Only the last `max_lines` kept lines are held; nothing else of the output is stored.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace dscpp::launch {

class ErrorLines {
 public:
  // Lines of a multi-line message kept after its first line.
  static constexpr size_t kMessageLines = 4;

  explicit ErrorLines(size_t max_lines = 10) : max_lines_(max_lines) {}

  // Looks at the next line of output (without its '\n'); keeps it when it is an error line.
  void add(std::string_view line);

  // The kept lines, oldest first; at most max_lines.
  std::vector<std::string> lines() const { return {kept_.begin(), kept_.end()}; }

 private:
  void keep(std::string_view line);

  size_t max_lines_;
  size_t message_lines_left_ = 0;  // continuation lines of the last message still to keep
  std::deque<std::string> kept_;
};

}  // namespace dscpp::launch
