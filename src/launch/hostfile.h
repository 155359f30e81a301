// Hostfiles and host selection for dscpp launch, in DeepSpeed's syntax: a hostfile lists
// `hostname slots=N` lines; --include / --exclude pick hosts and slots (`host1:0,1@host2`);
// --num_nodes and --num_procs trim the result. Pure functions of their inputs (plus reading
// the hostfile), so they are unit-tested without starting anything. Every bad input is a
// LaunchError saying what is wrong and, after "HINT:", what to do.
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace dscpp::launch {

// One line of a hostfile.
struct HostfileEntry {
  std::string host;
  int slots = 0;  // >= 1
  int line = 0;   // 1-based line number, for messages
};

// Parses a hostfile. `where` names the file in messages. Blank lines and `#` comments
// (whole-line or trailing) are skipped. Throws LaunchError naming `where:line` and the
// expected form `hostname slots=N` for a malformed line, and naming both lines for a host
// listed twice. An empty hostfile is an error too.
std::vector<HostfileEntry> parse_hostfile(std::istream& in, const std::string& where);

// Reads and parses the file at `path`. Throws LaunchError when it cannot be opened.
std::vector<HostfileEntry> read_hostfile(const std::string& path);

// The hosts a job runs on, in hostfile order, with the slots used on each.
struct HostSlots {
  std::string host;
  std::vector<int> slots;  // selected slot indices, ascending; local rank i runs in slots[i]
  int first_rank = 0;      // global rank of this host's local rank 0

  int num_procs() const { return static_cast<int>(slots.size()); }
};

// Applies DeepSpeed's include/exclude filter to the hostfile's hosts. `include` and
// `exclude` use `host[:slot,slot...][@host[:slot,...]]...`; a host without slots means all
// its slots. Only one of them may be non-empty. The result keeps hostfile order, drops
// hosts left without slots, and has first_rank filled in. Throws LaunchError for both
// filters at once, a malformed filter, a host not in the hostfile, or a slot the host
// does not have.
std::vector<HostSlots> filter_hosts(const std::vector<HostfileEntry>& hosts,
                                    const std::string& include, const std::string& exclude);

// Keeps the first `num_nodes` hosts (-1: all) and the first `num_procs` selected slots of
// each (-1: all), then renumbers first_rank. Throws LaunchError when num_nodes exceeds the
// hosts available, when a host has fewer than num_procs slots selected, or when a count is
// zero or below -1.
std::vector<HostSlots> limit_hosts(std::vector<HostSlots> hosts, int num_nodes, int num_procs);

// True for the names that mean "this machine": localhost, 127.0.0.1, ::1, and this
// machine's own hostname.
bool is_local_host(const std::string& host);

// "host1 (slots 0,1), host2 (slots 0-3)" for logs.
std::string describe_hosts(const std::vector<HostSlots>& hosts);

}  // namespace dscpp::launch
