// Entry points of the dscpp subcommands, one file each under tools/. Each receives the
// arguments after the subcommand name (argv[0] is "dscpp <sub>") and returns the exit status.
#pragma once

namespace dscpp::tools {
int launch_main(int argc, char** argv);
int report_main(int argc, char** argv);
int check_main(int argc, char** argv);
int train_main(int argc, char** argv);
int checkpoint_main(int argc, char** argv);
int zero_to_fp32_main(int argc, char** argv);
int io_bench_main(int argc, char** argv);
int estimate_main(int argc, char** argv);
int plot_main(int argc, char** argv);
}  // namespace dscpp::tools
