// A user program: joins the job that dscpp launch (or mpirun) started, averages a tensor over
// all ranks and prints it. Run with: dscpp launch --num_procs 2 ./allreduce_example
#include <ATen/ATen.h>
#include <dscpp/comm.h>
#include <dscpp/error.h>

#include <iostream>

int main() {
  try {
    auto comm = dscpp::comm::init_from_env();
    auto t = at::full({4}, static_cast<float>(comm->rank()));
    comm->all_reduce(t, dscpp::comm::ReduceOp::avg)->wait();
    std::cout << "rank " << comm->rank() << " of " << comm->world_size()
              << ": mean of ranks = " << t[0].item<float>() << std::endl;
  } catch (const dscpp::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
