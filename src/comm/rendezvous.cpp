// Implements init_from_env() and make_gloo_communicator(): the rendezvous (rank 0's store server,
// every rank's authenticated client; store_server.h) with clear errors (which address, which port,
// how long, which ranks are missing), and the choice of backend and of the interface Gloo binds to.
#include "comm/rendezvous.h"

#include <ATen/Context.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/c10d.h"
#include "comm/c10d_communicator.h"
#include "comm/job_secret.h"
#include "comm/hierarchy.h"
#include "comm/shm.h"
#include "comm/store_client.h"
#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::comm {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

double seconds(std::chrono::milliseconds ms) { return ms.count() / 1000.0; }

std::string connect_hint(const ProcessEnv& pe) {
  return fmt::format(
      "HINT: check that rank 0 is running, that MASTER_ADDR={} is an address of rank 0's host "
      "that this host can reach, and that no firewall blocks port {} ('dscpp check --hostfile "
      "...' tests this from every host)",
      pe.master_addr, pe.master_port);
}

// Every rank announces itself; all wait until the whole world has, or name who is missing.
void wait_for_all_ranks(c10d::Store& store, const ProcessEnv& pe, std::chrono::milliseconds limit) {
  store.set("dscpp/joined/" + std::to_string(pe.rank), bytes("1"));
  std::vector<std::string> keys;
  for (int r = 0; r < pe.world_size; ++r) keys.push_back("dscpp/joined/" + std::to_string(r));
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!store.check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (int r = 0; r < pe.world_size; ++r)
        if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ",") + std::to_string(r);
      DSCPP_FAIL(CommError, "rendezvous at ", pe.master_addr, ":", pe.master_port, ": ranks ",
                 missing, " of ", pe.world_size, " did not join within ", seconds(limit),
                 " s (world size from ", pe.source,
                 "). HINT: a rank failed to start or was started with a different WORLD_SIZE "
                 "or MASTER_ADDR/MASTER_PORT; look at its output");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Rank 0 starts the rendezvous server on MASTER_ADDR (store_server.h); every rank, rank 0
// included, connects to it and proves the job's secret (job_secret.h).
c10::intrusive_ptr<c10d::Store> connect_store(const ProcessEnv& pe, bool server,
                                              std::chrono::milliseconds limit) {
  const std::string secret = job_secret();
  std::shared_ptr<StoreServer> own;
  if (server) {
    StoreServer::Options so;
    so.address = pe.master_addr;
    so.port = pe.master_port;
    so.secret = secret;
    own = std::make_shared<StoreServer>(so);
    if (own->listens_on_loopback_only() && pe.world_size > pe.local_world_size) {
      // Debian's /etc/hosts maps a host's own name to 127.0.1.1, for one.
      DSCPP_LOG_WARN(
          "MASTER_ADDR={} is a loopback address on rank 0's host, where the rendezvous "
          "listens, but {} of the {} ranks run on other hosts: they cannot reach it. "
          "HINT: give 'dscpp launch --master_addr' (or MASTER_ADDR) as this host's "
          "address on the network the hosts share",
          pe.master_addr, pe.world_size - pe.local_world_size, pe.world_size);
    }
    if (secret.empty()) {
      DSCPP_LOG_INFO(
          "rendezvous at {}:{} admits any process that connects: no job secret ({} "
          "or {}). HINT: 'dscpp launch' makes one for every job",
          pe.master_addr, pe.master_port, kSecretEnv, kSecretFileEnv);
    }
  }
  StoreClient::Options co;
  co.host = pe.master_addr;
  co.port = pe.master_port;
  co.secret = secret;
  co.connect_timeout = limit;
  co.rank = pe.rank;
  auto store = c10::make_intrusive<StoreClient>(co, std::move(own));
  store->setTimeout(limit);
  return store;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& local_address) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    DSCPP_LOG_DEBUG("gloo: binding to interface {} (GLOO_SOCKET_IFNAME)", ifname);
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  DSCPP_LOG_DEBUG("gloo: binding to {}", local_address);
  return c10d::ProcessGroupGloo::createDeviceForHostname(local_address);
}

// Every rank sets KEY<rank> to `mine`; returns all ranks' values once every one has.
std::vector<std::string> exchange(c10d::Store& store, const std::string& key, int rank, int world,
                                  const std::string& mine, std::chrono::milliseconds timeout) {
  store.set(key + std::to_string(rank), bytes(mine));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(key + std::to_string(r));
  store.wait(keys, timeout);
  std::vector<std::string> values;
  for (const auto& k : keys) {
    auto v = store.get(k);
    values.emplace_back(v.begin(), v.end());
  }
  return values;
}

using BackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const std::string& prefix, int rank, int world_size)>;

// Across hosts, with several ranks on each: shared memory inside each host and a Gloo group per
// column between hosts (NOTE [hierarchical collectives]); null with *why when the layout does not
// allow it or this host's segment cannot be made (every rank learns the same: a failed host
// makes all ranks stay flat).
std::unique_ptr<HostCollectives> make_hierarchy(c10d::Store& store, const std::string& prefix,
                                                int rank, const std::vector<std::string>& hosts,
                                                const CommOptions& options,
                                                const BackendFactory& make_backend,
                                                std::string* why) {
  auto layout = HostLayout::of(hosts, rank, why);
  if (!layout) return nullptr;
  ShmGroup::Setup setup;
  auto local = ShmGroup::create(store, fmt::format("{}/host{}", prefix, layout->host),
                                layout->local_rank, layout->per_host, false, hosts[rank],
                                options.shm_slot_bytes, options.rendezvous_timeout,
                                options.timeout, &setup);
  // Every host's outcome, so that all ranks decide alike.
  const auto outcomes =
      exchange(store, prefix + "/hierarchy/ok/", rank, static_cast<int>(hosts.size()),
               local ? "1" : "0" + setup.why, options.rendezvous_timeout);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].rfind('1', 0) != 0) {
      *why = fmt::format("rank {} could not set up shared memory on its host: {}", r,
                         outcomes[r].substr(outcomes[r].empty() ? 0 : 1));
      return nullptr;
    }
  }
  auto column = make_backend(fmt::format("{}/column{}", prefix, layout->local_rank), layout->host,
                             layout->hosts);
  return std::make_unique<HostHierarchy>(*layout, std::move(local), std::move(column),
                                         options.timeout);
}

// What carries the collectives on CPU tensors besides the backend: shared memory when every rank
// shares a host, the hierarchy when they span several hosts with several ranks on each, else
// nothing (flat Gloo). Every rank reaches the same answer (ShmGroup::create decides
// collectively).
std::unique_ptr<HostCollectives> make_host_collectives(c10d::Store& store,
                                                       const std::string& prefix, int rank,
                                                       int world_size, const CommOptions& options,
                                                       const BackendFactory& make_backend,
                                                       std::vector<std::string>* hosts) {
  DSCPP_CHECK(options.shm == "auto" || options.shm == "on" || options.shm == "off", ConfigError,
              "CommOptions::shm is '", options.shm, "'. HINT: use auto, on or off");
  DSCPP_CHECK(options.hierarchy == "auto" || options.hierarchy == "off", ConfigError,
              "CommOptions::hierarchy is '", options.hierarchy, "'. HINT: use auto or off");
  DSCPP_CHECK(options.shm_slot_bytes > 0 && options.shm_slot_bytes <= (int64_t{1} << 40),
              ConfigError, "CommOptions::shm_slot_bytes is ", options.shm_slot_bytes,
              "; it must be between 1 byte and 1 TiB");
  if (world_size == 1) return nullptr;
  ShmGroup::Setup setup;
  const std::string host = options.host.empty() ? host_identity() : options.host;
  auto group = ShmGroup::create(store, prefix, rank, world_size, options.shm == "off", host,
                                options.shm_slot_bytes, options.rendezvous_timeout,
                                options.timeout, &setup);
  *hosts = setup.hosts;
  if (group) {
    DSCPP_LOG_DEBUG(
        "collectives on CPU tensors use shared memory ({} ranks on one host, {:.1f} "
        "MiB segment)",
        world_size, group->segment_bytes() / 1048576.0);
    return group;
  }
  // DSCPP_COMM_HIERARCHY=off on any rank is off for all: every rank says what it wants first,
  // so that no rank waits in a hierarchy others never set up.
  bool hierarchy = false;
  if (setup.result == ShmGroup::Setup::kSeveralHosts) {
    const auto wanted = exchange(store, prefix + "/hierarchy/wanted/", rank, world_size,
                                 options.hierarchy == "auto" ? "1" : "0",
                                 options.rendezvous_timeout);
    hierarchy = std::all_of(wanted.begin(), wanted.end(), [](const auto& w) { return w == "1"; });
  }
  if (hierarchy) {
    std::string why;
    if (auto group =
            make_hierarchy(store, prefix, rank, setup.hosts, options, make_backend, &why)) {
      const auto& l = static_cast<HostHierarchy&>(*group).layout();
      if (rank == 0) {
        DSCPP_LOG_INFO("collectives on CPU tensors: shared memory inside each of {} hosts ({} "
                       "ranks each), Gloo between hosts",
                       l.hosts, l.per_host);
      }
      return group;
    }
    DSCPP_CHECK(options.shm != "on", CommError,
                "shared-memory collectives were requested (DSCPP_COMM_SHM=on) but cannot be used "
                "across these hosts: ",
                why, ". HINT: run the same number of consecutive ranks on every host, or set "
                "DSCPP_COMM_SHM=auto to use flat Gloo over TCP");
    if (rank == 0) DSCPP_LOG_INFO("collectives use flat Gloo over TCP: {}", why);
    return nullptr;
  }
  DSCPP_CHECK(options.shm != "on" || setup.result == ShmGroup::Setup::kOff, CommError,
              "shared-memory collectives were requested (DSCPP_COMM_SHM=on) but cannot be used: ",
              setup.why, ". HINT: ",
              setup.result == ShmGroup::Setup::kSeveralHosts
                  ? "across hosts shared memory needs DSCPP_COMM_HIERARCHY=auto; or use "
                    "DSCPP_COMM_SHM=auto"
                  : "check that /dev/shm is mounted and has room, or set DSCPP_COMM_SHM=auto to "
                    "fall back to Gloo's TCP transport");
  if (setup.result == ShmGroup::Setup::kFailed && rank == 0) {
    DSCPP_LOG_WARN(
        "shared-memory collectives unavailable ({}); collectives use Gloo over TCP, "
        "which is slower between ranks on one host. HINT: give /dev/shm room, or set "
        "DSCPP_COMM_SHM=off to silence this",
        setup.why);
  } else {
    DSCPP_LOG_DEBUG("collectives use Gloo over TCP: {}", setup.why);
  }
  return nullptr;
}

}  // namespace

std::string local_address_towards(const std::string& remote) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(remote.c_str(), "9", &hints, &res);
  DSCPP_CHECK(rc == 0 && res, CommError, "MASTER_ADDR '", remote,
              "' does not resolve: ", gai_strerror(rc),
              ". HINT: use an IP address or a host name every node can resolve");
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  freeaddrinfo(res);
  if (fd >= 0) ::close(fd);
  DSCPP_CHECK(ok, CommError, "no route from this host to MASTER_ADDR ", remote,
              ". HINT: check the address and this host's network configuration");
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
  return buf;
}

std::shared_ptr<Communicator> make_gloo_communicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const CommOptions& options,
    const std::string& prefix, const std::string& local_address,
    c10::intrusive_ptr<c10d::Store> monitor_store) {
  auto device = gloo_device(local_address);
  BackendFactory make_backend = [&](const std::string& group, int group_rank, int group_size) {
    auto pg_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    pg_options->devices.push_back(device);
    pg_options->threads = 1;
    auto pg_store = c10::make_intrusive<c10d::PrefixStore>(group + "/pg", store);
    try {
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, group_rank, group_size,
                                                       pg_options));
    } catch (const std::exception& e) {
      std::string what = e.what();
      DSCPP_FAIL(CommError, "rank ", rank, ": the Gloo process group of ", group_size,
                 " ranks could not connect: ", what.substr(0, what.find('\n')),
                 ". HINT: set GLOO_SOCKET_IFNAME to the interface the nodes share");
    }
  };
  auto backend = make_backend(prefix, rank, world_size);
  std::vector<std::string> hosts;
  auto host = make_host_collectives(*store, prefix, rank, world_size, options, make_backend, &hosts);
  return std::make_shared<C10dCommunicator>(backend, "gloo",
                                            monitor_store ? monitor_store : store, prefix, rank,
                                            world_size, options, std::move(host), std::move(hosts));
}

std::shared_ptr<Communicator> init_from_env(const CommOptions& options) {
  ProcessEnv pe = detect_process_env();
  set_log_rank(pe.rank);
  std::string backend = options.backend;
  if (backend == "auto") backend = at::hasCUDA() ? "nccl" : "gloo";
  DSCPP_CHECK(backend == "gloo" || backend == "nccl", ConfigError, "unknown comm backend '",
              backend, "'. HINT: use gloo, nccl or auto");
  DSCPP_CHECK(backend == "gloo" || options.shm != "on", ConfigError,
              "DSCPP_COMM_SHM=on asks for shared-memory collectives, which the gloo backend "
              "provides, but the backend is nccl. HINT: set DSCPP_COMM_SHM=auto, or "
              "DSCPP_COMM_BACKEND=gloo for CPU tensors");
#if !defined(DSCPP_HAVE_NCCL)
  DSCPP_CHECK(backend != "nccl", CommError,
              "the nccl backend was requested (CUDA is available or DSCPP_COMM_BACKEND=nccl) but "
              "this dscpp was built against a libtorch without NCCL. HINT: rebuild dscpp against a "
              "CUDA libtorch, or set DSCPP_COMM_BACKEND=gloo");
#endif
  if (pe.world_size == 1) {
    DSCPP_LOG_DEBUG("single process ({}): no rendezvous", pe.source);
    return make_gloo_communicator(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
  }
  DSCPP_LOG_DEBUG("rendezvous: rank {} of {} ({}), master {}:{}", pe.rank, pe.world_size, pe.source,
                  pe.master_addr, pe.master_port);
  auto store = connect_store(pe, pe.rank == 0, options.rendezvous_timeout);
  wait_for_all_ranks(*store, pe, options.rendezvous_timeout);
  // The sync monitor's thread gets its own connection: a blocked call holds a client's one.
  auto monitor_store = store->clone();
  if (backend == "gloo") {
    return make_gloo_communicator(store, pe.rank, pe.world_size, options, "dscpp",
                                  local_address_towards(pe.master_addr), monitor_store);
  }
#if defined(DSCPP_HAVE_NCCL)
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("dscpp/pg", store);
  auto pg =
      c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, pe.rank, pe.world_size, nccl_options);
  return std::make_shared<C10dCommunicator>(pg, "nccl", monitor_store, "dscpp", pe.rank,
                                            pe.world_size, options);
#else
  DSCPP_FAIL(CommError, "unreachable: nccl backend without NCCL support");
#endif
}

}  // namespace dscpp::comm
