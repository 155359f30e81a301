// The dscpp command: dispatches to one subcommand per file under tools/. Errors that escape a
// subcommand are printed as one "error:" line (with its HINT) and exit status 2.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "tools.h"

namespace {

struct Subcommand {
  const char* name;
  int (*main)(int, char**);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"train", dscpp::tools::train_main, "train the built-in GPT with a DeepSpeed config"},
    {"launch", dscpp::tools::launch_main,
     "start a job: one process per rank, on one or many nodes"},
    {"check", dscpp::tools::check_main, "pre-flight: hosts, master port, config, collectives"},
    {"report", dscpp::tools::report_main, "versions, backends, BLAS speed, SIMD, threads, memory"},
    {"checkpoint", dscpp::tools::checkpoint_main, "verify a checkpoint offline (sizes, CRCs)"},
    {"zero-to-fp32", dscpp::tools::zero_to_fp32_main,
     "whole fp32 weights from a checkpoint of any world size and stage"},
    {"estimate", dscpp::tools::estimate_main,
     "model-state memory and disk per rank at every ZeRO stage, and what fits"},
    {"io-bench", dscpp::tools::io_bench_main,
     "direct I/O bandwidth of a folder per aio setting (for nvme offload)"},
    {"plot", dscpp::tools::plot_main,
     "a run's loss, lr, grad norm and throughput as a PNG (gnuplot)"},
};

void usage(std::ostream& os) {
  os << "usage: dscpp <command> [options]\n\ncommands:\n";
  for (const auto& s : kSubcommands)
    os << "  " << s.name << std::string(14 - std::strlen(s.name), ' ') << s.help << "\n";
  os << "\n'dscpp <command> --help' shows the options of a command.\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    std::string name = std::string("dscpp ") + s.name;
    std::vector<char*> args(argv + 1, argv + argc);
    args[0] = name.data();
    try {
      return s.main(static_cast<int>(args.size()), args.data());
    } catch (const std::exception& e) {
      std::cerr << "dscpp " << s.name << ": error: " << e.what() << "\n";
      return 2;
    }
  }
  std::cerr << "dscpp: unknown command '" << argv[1] << "'\n";
  usage(std::cerr);
  return 2;
}
