// The program each rank runs in the multi-process communicator tests (started through
// `dscpp launch` or mpirun). Scenarios:
//   ops       every collective at lengths 0, 1, 5, 1001 (uneven over the ranks), results checked
//   skip      rank 1 skips its 2nd all_reduce, then idles: the others must report it and fail
//   mismatch  rank 2 all-reduces 999 elements where the others use 1000 (run with
//             DSCPP_DEBUG_SYNC=1): every rank must fail at once naming both sides
//   vanish    rank 1 exits (status 0) right after joining; the others all-reduce and must fail
//             at once naming it (shared memory notices the missing process)
//   rendezvous  only joins the job and prints the world it found
// Exit status 0 on success; on failure the error goes to stderr and the status is 1.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "dscpp/comm.h"
#include "dscpp/error.h"
#include "support/fault_communicator.h"

using namespace dscpp;
using namespace dscpp::comm;

namespace {

at::Tensor rank_input(int r, int64_t n) { return at::arange(n, at::kFloat) * 0.5 + (r + 1) * 3; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

void run_ops(Communicator& c) {
  const int w = c.world_size(), r = c.rank();
  for (int64_t n : {0, 1, 5, 1001}) {
    at::Tensor sum = at::zeros({n});
    for (int q = 0; q < w; ++q) sum += rank_input(q, n);
    auto t = rank_input(r, n);
    c.all_reduce(t)->wait();
    require(at::allclose(t, sum), "all_reduce n=" + std::to_string(n));
    auto counts = split_evenly(n, w);
    int64_t off = 0;
    for (int q = 0; q < r; ++q) off += counts[q];
    auto out = at::empty({counts[r]});
    c.reduce_scatter(out, rank_input(r, n), counts)->wait();
    require(at::allclose(out, sum.narrow(0, off, counts[r])),
            "reduce_scatter n=" + std::to_string(n));
    auto gathered = at::empty({n});
    c.all_gather(gathered, rank_input(r, n).narrow(0, off, counts[r]).contiguous(), counts)->wait();
    std::vector<at::Tensor> parts;
    for (int q = 0; q < w; ++q) {
      int64_t o = 0;
      for (int p = 0; p < q; ++p) o += counts[p];
      parts.push_back(rank_input(q, n).narrow(0, o, counts[q]));
    }
    require(at::equal(gathered, at::cat(parts)), "all_gather n=" + std::to_string(n));
    auto b = rank_input(r, n);
    c.broadcast(b, w - 1)->wait();
    require(at::equal(b, rank_input(w - 1, n)), "broadcast n=" + std::to_string(n));
  }
  if (w > 1) {
    auto in = at::empty({4});
    auto s = c.send(rank_input(r, 4), (r + 1) % w);
    auto rv = c.recv(in, (r + w - 1) % w);
    s->wait();
    rv->wait();
    require(at::equal(in, rank_input((r + w - 1) % w, 4)), "send/recv");
  }
  c.barrier()->wait();
  std::cout << "rank " << r << " of " << w << ": all collectives OK (" << c.sequence_number()
            << " collectives, backend " << c.backend_name() << ")" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "ops";
  at::set_num_threads(1);
  try {
    auto options = CommOptions::from_config();
    if (options.backend == "auto") options.backend = "gloo";  // CPU tensors, also on a GPU host
    std::shared_ptr<Communicator> comm = init_from_env(options);
    if (scenario == "ops") {
      run_ops(*comm);
    } else if (scenario == "rendezvous") {
      std::cout << "rank " << comm->rank() << " of " << comm->world_size() << " joined"
                << std::endl;
    } else if (scenario == "skip") {
      comm = std::make_shared<FaultCommunicator>(comm, Fault{Fault::Kind::skip, 1, 2});
      comm->set_step(7);
      auto t = at::ones({1000});
      for (int i = 0; i < 3; ++i) comm->all_reduce(t)->wait();
      if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
    } else if (scenario == "vanish") {
      if (comm->rank() == 1) return 0;
      auto t = at::ones({1000});
      comm->all_reduce(t)->wait();
    } else if (scenario == "mismatch") {
      auto t = at::ones({comm->rank() == 2 ? 999 : 1000});
      comm->all_reduce(t)->wait();
    } else {
      std::cerr << "unknown scenario " << scenario << std::endl;
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
