// Implements hostfile parsing and DeepSpeed-style host selection (include/exclude,
// num_nodes, num_procs). No state; every function is a pure function of its arguments,
// except read_hostfile (reads a file) and is_local_host (asks for this machine's name).
#include "launch/hostfile.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "dscpp/error.h"
#include "util/strings.h"

namespace dscpp::launch {
namespace {

constexpr const char* kHostfileForm =
    "HINT: each line must read `hostname slots=N` (N >= 1); `#` starts a comment";
constexpr const char* kFilterForm =
    "HINT: use DeepSpeed's syntax `host1:0,1@host2`: hosts separated by `@`, an optional "
    "`:` and comma-separated slot indices after a host";


// Host names travel through shells and remote-command templates unquoted, so they are
// restricted to the characters of DNS names, IPv4 addresses and namespace names.
bool valid_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

// Parses a non-negative decimal integer; false on anything else (sign, junk, overflow).
bool parse_uint(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string host_names(const std::vector<HostfileEntry>& hosts) {
  std::string names;
  for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h.host;
  return names;
}

}  // namespace

std::vector<HostfileEntry> parse_hostfile(std::istream& in, const std::string& where) {
  std::vector<HostfileEntry> out;
  std::map<std::string, int> seen;  // host -> line
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    std::string line = raw;
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    const std::string at = where + ":" + std::to_string(line_no);
    DSCPP_CHECK(w.size() == 2 && w[1].rfind("slots=", 0) == 0, LaunchError, at,
                ": cannot parse hostfile line '", trim(raw), "'. ", kHostfileForm);
    for (char c : w[0]) {
      DSCPP_CHECK(valid_host_char(c), LaunchError, at, ": host name '", w[0], "' contains '",
                  std::string(1, c),
                  "'. HINT: host names may use letters, digits, '.', '-' and '_' only");
    }
    int slots = 0;
    DSCPP_CHECK(parse_uint(w[1].substr(6), &slots) && slots >= 1, LaunchError, at,
                ": slot count in '", w[1], "' is not an integer >= 1. ", kHostfileForm);
    auto [it, inserted] = seen.emplace(w[0], line_no);
    DSCPP_CHECK(inserted, LaunchError, at, ": host '", w[0], "' is listed twice (also on line ",
                it->second, "). HINT: list each host once, with all its slots");
    out.push_back({w[0], slots, line_no});
  }
  DSCPP_CHECK(!out.empty(), LaunchError, where,
              ": hostfile lists no hosts. HINT: add lines such as `worker-1 slots=4`");
  return out;
}

std::vector<HostfileEntry> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  DSCPP_CHECK(in.good(), LaunchError, "cannot open hostfile '", path,
              "'. HINT: check the path given to -H/--hostfile");
  return parse_hostfile(in, path);
}

std::vector<HostSlots> filter_hosts(const std::vector<HostfileEntry>& hosts,
                                    const std::string& include, const std::string& exclude) {
  DSCPP_CHECK(include.empty() || exclude.empty(), LaunchError,
              "--include and --exclude were both given. HINT: use only one of them");
  std::map<std::string, std::set<int>> available;
  for (const auto& h : hosts) {
    for (int s = 0; s < h.slots; ++s) available[h.host].insert(s);
  }
  const bool is_include = !include.empty();
  const std::string& filter = is_include ? include : exclude;
  const char* flag = is_include ? "--include" : "--exclude";
  std::map<std::string, std::set<int>> chosen = is_include ? decltype(available){} : available;
  if (!filter.empty()) {
    for (const std::string& node : split(filter, '@')) {
      std::string host = node;
      std::vector<int> slots;
      bool has_slots = false;
      if (size_t colon = node.find(':'); colon != std::string::npos) {
        host = node.substr(0, colon);
        has_slots = true;
        for (const std::string& s : split(node.substr(colon + 1), ',')) {
          int v = 0;
          DSCPP_CHECK(parse_uint(s, &v), LaunchError, flag, " '", filter, "': slot '", s,
                      "' of host '", host, "' is not a slot index. ", kFilterForm);
          slots.push_back(v);
        }
      }
      DSCPP_CHECK(!host.empty(), LaunchError, flag, " '", filter, "' has an empty host name. ",
                  kFilterForm);
      auto it = available.find(host);
      DSCPP_CHECK(it != available.end(), LaunchError, flag, " '", filter, "' names host '", host,
                  "', which is not among the hosts (", host_names(hosts),
                  "). HINT: use the host names of the hostfile");
      for (int s : slots) {
        DSCPP_CHECK(it->second.count(s), LaunchError, flag, " '", filter, "': host '", host,
                    "' has no slot ", s, " (it has slots 0-", it->second.size() - 1,
                    "). HINT: slot indices count from 0 up to slots-1");
      }
      if (is_include) {
        if (has_slots) {
          chosen[host].insert(slots.begin(), slots.end());
        } else {
          chosen[host] = it->second;
        }
      } else {
        if (has_slots) {
          for (int s : slots) chosen[host].erase(s);
        } else {
          chosen[host].clear();
        }
      }
    }
  }
  std::vector<HostSlots> out;
  int rank = 0;
  for (const auto& h : hosts) {
    auto it = chosen.find(h.host);
    if (it == chosen.end() || it->second.empty()) continue;
    HostSlots hs{h.host, std::vector<int>(it->second.begin(), it->second.end()), rank};
    rank += hs.num_procs();
    out.push_back(std::move(hs));
  }
  DSCPP_CHECK(!out.empty(), LaunchError, flag, " '", filter,
              "' leaves no slot to run on. HINT: exclude fewer hosts or slots");
  return out;
}

std::vector<HostSlots> limit_hosts(std::vector<HostSlots> hosts, int num_nodes, int num_procs) {
  DSCPP_CHECK(num_nodes == -1 || num_nodes >= 1, LaunchError, "--num_nodes ", num_nodes,
              " is not a node count. HINT: give a number >= 1, or leave it out to use every host");
  DSCPP_CHECK(num_procs == -1 || num_procs >= 1, LaunchError, "--num_procs ", num_procs,
              " would start no process. HINT: give a number >= 1 of processes per node");
  if (num_nodes != -1) {
    DSCPP_CHECK(num_nodes <= static_cast<int>(hosts.size()), LaunchError, "--num_nodes ", num_nodes,
                " asks for more nodes than the ", hosts.size(), " available (",
                describe_hosts(hosts), "). HINT: add hosts to the hostfile or lower --num_nodes");
    hosts.resize(num_nodes);
  }
  if (num_procs != -1) {
    for (auto& h : hosts) {
      DSCPP_CHECK(h.num_procs() >= num_procs, LaunchError, "--num_procs ", num_procs,
                  " asks for more processes than host '", h.host, "' has slots (", h.num_procs(),
                  " selected: ", join_ints(h.slots),
                  "). HINT: lower --num_procs or give the host more slots in the hostfile");
      h.slots.resize(num_procs);
    }
  }
  int rank = 0;
  for (auto& h : hosts) {
    h.first_rank = rank;
    rank += h.num_procs();
  }
  return hosts;
}

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return false;
  return host == name;
}

std::string describe_hosts(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) {
    if (!out.empty()) out += ", ";
    out += h.host + " (slots ";
    // Runs of consecutive slots print as a-b.
    for (size_t i = 0; i < h.slots.size();) {
      size_t j = i;
      while (j + 1 < h.slots.size() && h.slots[j + 1] == h.slots[j] + 1) ++j;
      if (i) out += ",";
      out += std::to_string(h.slots[i]);
      if (j > i) out += "-" + std::to_string(h.slots[j]);
      i = j + 1;
    }
    out += ")";
  }
  return out;
}

}  // namespace dscpp::launch
