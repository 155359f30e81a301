// Implements detect_process_env(): dscpp launch's variables first, then OpenMPI's, then
// Slurm's. A variable that is set but malformed is an error, never ignored.
#include <cstdlib>
#include <string>

#include "dscpp/error.h"
#include "dscpp/process_env.h"

namespace dscpp {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int fallback, int min_value) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  DSCPP_CHECK(end && *end == '\0' && x >= min_value && x < (1L << 30), ConfigError,
              "environment variable ", name, "='", v, "' is not an integer >= ", min_value,
              ". HINT: unset it or start the job with dscpp launch");
  return static_cast<int>(x);
}

// First host of a Slurm node list such as "node[01-04,07],gpu5" -> "node01".
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      size_t j = i + 1;
      while (j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']')
        host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

}  // namespace

ProcessEnv detect_process_env() {
  ProcessEnv pe;
  if (env("WORLD_SIZE") || env("RANK")) {
    pe.world_size = env_int("WORLD_SIZE", 1, 1);
    pe.rank = env_int("RANK", 0, 0);
    pe.local_rank = env_int("LOCAL_RANK", pe.rank, 0);
    pe.local_world_size = env_int("LOCAL_WORLD_SIZE", pe.world_size, 1);
    pe.source = env("DSCPP_LAUNCHER") ? "WORLD_SIZE set by dscpp launch"
                                      : "WORLD_SIZE from the environment";
  } else if (env("OMPI_COMM_WORLD_SIZE")) {
    pe.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1, 1);
    pe.rank = env_int("OMPI_COMM_WORLD_RANK", 0, 0);
    pe.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    pe.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1);
    pe.source = "OMPI_COMM_WORLD_SIZE set by mpirun";
  } else if (env("SLURM_NTASKS") && env("SLURM_PROCID")) {
    pe.world_size = env_int("SLURM_NTASKS", 1, 1);
    pe.rank = env_int("SLURM_PROCID", 0, 0);
    pe.local_rank = env_int("SLURM_LOCALID", 0, 0);
    pe.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 1, 1);
    if (const char* nl = env("SLURM_JOB_NODELIST")) pe.master_addr = first_slurm_host(nl);
    pe.source = "SLURM_NTASKS set by srun";
  }
  if (const char* a = env("MASTER_ADDR")) pe.master_addr = a;
  pe.master_port = env_int("MASTER_PORT", 29500, 1);
  DSCPP_CHECK(pe.master_port <= 65535, ConfigError, "MASTER_PORT=", pe.master_port,
              " is not a TCP port (1-65535)");
  DSCPP_CHECK(pe.rank < pe.world_size, ConfigError, "rank ", pe.rank,
              " is not below the world size ", pe.world_size, " (", pe.source,
              "). HINT: RANK must be in [0, WORLD_SIZE)");
  DSCPP_CHECK(pe.local_rank < pe.local_world_size, ConfigError, "local rank ",
              pe.local_rank, " is not below the local world size ", pe.local_world_size);
  return pe;
}

}  // namespace dscpp
