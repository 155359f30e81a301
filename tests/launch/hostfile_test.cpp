// Hostfile parsing and DeepSpeed-style host selection (include/exclude, num_nodes,
// num_procs): good inputs, and every bad input is a LaunchError naming what and where.
#include "support/errors.h"
#include "launch/hostfile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "dscpp/error.h"

namespace dscpp::launch {
namespace {

std::vector<HostfileEntry> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_hostfile(in, "hosts.txt");
}

using dscpp::testing::error_of;

std::vector<HostfileEntry> three_hosts() { return parse("a slots=4\nb slots=2\nc slots=3\n"); }

std::string summary(const std::vector<HostSlots>& hosts) {
  std::string s;
  for (const auto& h : hosts) {
    s += h.host + "@" + std::to_string(h.first_rank) + ":";
    for (int x : h.slots) s += std::to_string(x);
    s += " ";
  }
  return s;
}

TEST(Hostfile, ParsesHostsInOrder) {
  auto hosts = parse("worker-1 slots=4\nworker-2 slots=8\n");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "worker-1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[0].line, 1);
  EXPECT_EQ(hosts[1].host, "worker-2");
  EXPECT_EQ(hosts[1].slots, 8);
}

TEST(Hostfile, SkipsCommentsBlankLinesAndExtraSpace) {
  auto hosts = parse(
      "# cluster\n\n   \n  node_a   slots=2   # trailing comment\n\t10.0.0.7 slots=1\r\n# end\n");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "node_a");
  EXPECT_EQ(hosts[0].line, 4);
  EXPECT_EQ(hosts[1].host, "10.0.0.7");
  EXPECT_EQ(hosts[1].slots, 1);
}

TEST(Hostfile, MalformedLineNamesFileLineAndForm) {
  for (const char* bad :
       {"a slots=2\nb\n", "a slots=2\nb slots=x\n", "a slots=2\nb slots=0\n",
        "a slots=2\nb slots=-1\n", "a slots=2\nb slots=2 extra\n", "a slots=2\nb cores=2\n"}) {
    std::string msg = error_of([&] { parse(bad); });
    EXPECT_NE(msg.find("hosts.txt:2"), std::string::npos) << bad << " -> " << msg;
    EXPECT_NE(msg.find("hostname slots=N"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  }
}

TEST(Hostfile, BadHostNameIsAnError) {
  std::string msg = error_of([] { parse("user@host slots=2\n"); });
  EXPECT_NE(msg.find("hosts.txt:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'@'"), std::string::npos) << msg;
}

TEST(Hostfile, DuplicateHostNamesBothLines) {
  std::string msg = error_of([] { parse("a slots=2\n# x\nb slots=1\na slots=4\n"); });
  EXPECT_NE(msg.find("hosts.txt:4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("listed twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
}

TEST(Hostfile, EmptyHostfileIsAnError) {
  EXPECT_NE(error_of([] { parse("# nothing\n\n"); }).find("no hosts"), std::string::npos);
}

TEST(Hostfile, ReadsFileAndReportsMissingFile) {
  char path[] = "/tmp/dscpp_hostfile_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "h1 slots=2\nh2 slots=2\nbroken line here\n";
  std::string msg = error_of([&] { read_hostfile(path); });
  EXPECT_NE(msg.find(std::string(path) + ":3"), std::string::npos) << msg;
  std::remove(path);
  msg = error_of([&] { read_hostfile(path); });
  EXPECT_NE(msg.find("cannot open hostfile"), std::string::npos) << msg;
}

TEST(Hostfile, NoFilterKeepsEverything) {
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "", "")), "a@0:0123 b@4:01 c@6:012 ");
}

TEST(Hostfile, IncludeHostsAndSlots) {
  // DeepSpeed syntax: hosts separated by '@', slots after ':'; a bare host means all slots.
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "c@a:1,3", "")), "a@0:13 c@2:012 ");
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "b:1", "")), "b@0:1 ");
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "a:3,1,3", "")), "a@0:13 ");
}

TEST(Hostfile, ExcludeHostsAndSlots) {
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "", "b")), "a@0:0123 c@4:012 ");
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "", "a:0,2@c:1")), "a@0:13 b@2:01 c@4:02 ");
  EXPECT_EQ(summary(filter_hosts(three_hosts(), "", "b:0,1")), "a@0:0123 c@4:012 ");
}

TEST(Hostfile, FilterErrors) {
  auto hosts = three_hosts();
  std::string msg = error_of([&] { filter_hosts(hosts, "a", "b"); });
  EXPECT_NE(msg.find("both"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "zz:0", ""); });
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a, b, c"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "", "q"); });
  EXPECT_NE(msg.find("'q'"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "b:2", ""); });
  EXPECT_NE(msg.find("no slot 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "a:x", ""); });
  EXPECT_NE(msg.find("not a slot index"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "a:", ""); });
  EXPECT_NE(msg.find("not a slot index"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "a@@b", ""); });
  EXPECT_NE(msg.find("empty host name"), std::string::npos) << msg;
  msg = error_of([&] { filter_hosts(hosts, "", "a@b@c"); });
  EXPECT_NE(msg.find("leaves no slot"), std::string::npos) << msg;
}

TEST(Hostfile, LimitNodesAndProcs) {
  auto hosts = filter_hosts(three_hosts(), "", "");
  EXPECT_EQ(summary(limit_hosts(hosts, 2, -1)), "a@0:0123 b@4:01 ");
  EXPECT_EQ(summary(limit_hosts(hosts, -1, 2)), "a@0:01 b@2:01 c@4:01 ");
  EXPECT_EQ(summary(limit_hosts(hosts, 1, 3)), "a@0:012 ");
  // num_procs takes the first selected slots, after include.
  EXPECT_EQ(summary(limit_hosts(filter_hosts(three_hosts(), "a:1,2,3", ""), -1, 2)), "a@0:12 ");
}

TEST(Hostfile, LimitErrors) {
  auto hosts = filter_hosts(three_hosts(), "", "");
  std::string msg = error_of([&] { limit_hosts(hosts, 4, -1); });
  EXPECT_NE(msg.find("--num_nodes 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 available"), std::string::npos) << msg;
  msg = error_of([&] { limit_hosts(hosts, -1, 3); });
  EXPECT_NE(msg.find("host 'b'"), std::string::npos) << msg;
  msg = error_of([&] { limit_hosts(hosts, -1, 0); });
  EXPECT_NE(msg.find("--num_procs 0"), std::string::npos) << msg;
  msg = error_of([&] { limit_hosts(hosts, 0, -1); });
  EXPECT_NE(msg.find("--num_nodes 0"), std::string::npos) << msg;
}

TEST(Hostfile, LocalHostNamesAndDescription) {
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  EXPECT_TRUE(is_local_host(name));
  EXPECT_FALSE(is_local_host("surely-not-this-host.example"));
  EXPECT_EQ(describe_hosts({{"a", {0, 1, 2, 5}, 0}, {"b", {3}, 4}}),
            "a (slots 0-2,5), b (slots 3)");
}

}  // namespace
}  // namespace dscpp::launch
