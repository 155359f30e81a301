// Implements ErrorLines: the tests of NOTE [error lines] in error_lines.h, one line at a time.
#include "launch/error_lines.h"

namespace dscpp::launch {
namespace {

constexpr auto npos = std::string_view::npos;

// A log line's level tag lies near its start: before it come at most a node agent's
// "[rank 12] ", the time "[2026-11-29 22:30:01.123] " and "[rank 12345] " or "[launcher] ".
constexpr size_t kLogHead = 128;
constexpr std::string_view kLevels[] = {"debug", "info", "warning", "error"};

// The level in the "] [<level>]" tag of a dscpp log line (util/log.cpp's pattern), or "" for
// any other line.
std::string_view log_level_of(std::string_view line) {
  const std::string_view head = line.substr(0, kLogHead);
  for (size_t at = head.find("] ["); at != npos; at = head.find("] [", at + 1)) {
    const std::string_view rest = line.substr(at + 3);
    for (std::string_view level : kLevels) {
      if (rest.starts_with(level) && rest.substr(level.size()).starts_with(']')) return level;
    }
  }
  return {};
}

// The first line of an uncaught exception's message: libstdc++'s "  what():  <message>", or
// tools/main.cpp's "dscpp <tool>: error: <message>".
bool opens_message(std::string_view line) {
  if (line.find("what():  ") != npos) return true;
  const size_t tool = line.substr(0, kLogHead).find("dscpp ");
  return tool != npos && line.substr(tool, 40).find(": error: ") != npos;
}

}  // namespace

void ErrorLines::add(std::string_view line) {
  const std::string_view level = log_level_of(line);
  if (level == "error" || line.find("terminate called ") != npos) {
    message_lines_left_ = 0;
    keep(line);
  } else if (opens_message(line)) {
    message_lines_left_ = kMessageLines;
    keep(line);
  } else if (message_lines_left_ > 0 && level.empty() && line.find("frame #") == npos) {
    --message_lines_left_;
    keep(line);
  } else {
    message_lines_left_ = 0;
  }
}

void ErrorLines::keep(std::string_view line) {
  kept_.emplace_back(line);
  while (kept_.size() > max_lines_) kept_.pop_front();
}

}  // namespace dscpp::launch
