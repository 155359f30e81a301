// dscpp report: what this machine and build offer dscpp (like DeepSpeed's ds_report):
// versions, backends, CUDA devices, the BLAS in use and its measured speed, SIMD level, threads,
// io_uring and memory. Items that need attention carry a HINT. Exit status 0.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "tools.h"
#include "util/log.h"
#include "util/system_info.h"

namespace dscpp::tools {

int report_main(int argc, char** argv) {
  CLI::App app{"dscpp report: versions, backends, BLAS speed, SIMD, threads, memory"};
  std::string level = "info";
  bool no_blas = false;
  app.add_option("--log_level", level, "debug|info|warning|error");
  app.add_flag("--no_blas_benchmark", no_blas, "skip the matmul measurement");
  CLI11_PARSE(app, argc, argv);
  set_log_level(parse_log_level(level));
  auto items = collect_system_info(!no_blas);
  size_t width = 0;
  for (const auto& it : items) width = std::max(width, it.name.size());
  std::cout << "dscpp report\n" << std::string(60, '-') << "\n";
  int hints = 0;
  for (const auto& it : items) {
    std::cout << fmt::format("{:<{}}  {}\n", it.name, width, it.value);
    if (!it.hint.empty()) {
      std::cout << fmt::format("{:<{}}  HINT: {}\n", "", width, it.hint);
      ++hints;
    }
  }
  std::cout << std::string(60, '-') << "\n"
            << (hints ? fmt::format("{} item(s) need attention (see HINT lines)\n", hints)
                      : std::string("nothing needs attention\n"));
  return 0;
}

}  // namespace dscpp::tools
