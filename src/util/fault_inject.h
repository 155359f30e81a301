// Fault injection for the fault suite (tests/faults, docs/reliability.md): a process started
// with DSCPP_FAULT_INJECT set stops or kills itself at a chosen point of a training step, so a
// failure can be placed in each phase deterministically (a signal sent from outside lands
// wherever the process happens to be). Unset, each point costs one load of an initialised
// static.
//
//   DSCPP_FAULT_INJECT=kill:phase=backward:rank=1:hit=7   rank 1 sends itself SIGKILL the 7th
//                                                          time it reaches a backward point
//   DSCPP_FAULT_INJECT=stop:phase=optimizer:rank=0:hit=2  ... SIGSTOP (SIGCONT resumes it)
//   DSCPP_FAULT_INJECT=eio:phase=save:rank=0:hit=3        the write at rank 0's 3rd save point
//                                                          fails with EIO (save, offload_io only)
//   DSCPP_FAULT_INJECT=count                               every rank prints, at exit, how many
//                                                          times it reached each phase
//
// Before the fault the process writes one line to stderr: "dscpp fault injection: rank R
// (pid P) SIGKILL at PHASE (hit N) at UNIX_SECONDS" (SIGSTOP, EIO), which the suite uses to time
// the others' exit from the moment of the fault. The rank is the process's (RANK,
// OMPI_COMM_WORLD_RANK or SLURM_PROCID; 0 when none is set).
#pragma once

namespace dscpp::fault {

// Where the points are. forward: each transformer block of the built-in GPT in forward;
// backward: right after a gradient bucket's reduction is launched (the collective in flight);
// optimizer: the start of the parameter update, after the gradients are reduced; all_gather: a
// parameter all-gather launched (stages 1-2 after the update, stage 3 each unit); save: each
// tensor of a safetensors file being written, and between a checkpoint's manifest and its
// `latest`; offload_io: each read or write submitted to the async I/O engine (nvme offload).
enum class Phase { forward, backward, optimizer, all_gather, save, offload_io };
inline constexpr int kPhaseCount = 6;

const char* phase_name(Phase p);

// Throws ConfigError when DSCPP_FAULT_INJECT is set but malformed (dscpp::initialize calls it,
// so a typo is an error at start-up, not a fault that never fires).
void check_environment();

// An injection point: counts the visit and, when it is the chosen one, stops or kills this
// process, or returns true: the caller fails the I/O it is about to do as if the device had
// answered EIO (the points of save and offload_io do). Safe from any thread.
bool point(Phase p);

}  // namespace dscpp::fault
