// Where this process sits in a job: rank, world size, local rank, and how to reach the
// rendezvous master. Detected from the variables that dscpp launch, OpenMPI's mpirun or
// Slurm's srun set, in that order of preference. Torch-free, so the launcher and config
// can use it.
#pragma once

#include <string>

namespace dscpp {

struct ProcessEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where world_size came from, for error messages: "WORLD_SIZE set by dscpp launch",
  // "OMPI_COMM_WORLD_SIZE set by mpirun", "SLURM_NTASKS set by srun",
  // "WORLD_SIZE from the environment", or "default: single process".
  std::string source = "default: single process";
};

// Reads the environment. Throws ConfigError when a variable is present but malformed
// (RANK=abc, RANK >= WORLD_SIZE, ...), naming the variable and its value.
ProcessEnv detect_process_env();

}  // namespace dscpp
