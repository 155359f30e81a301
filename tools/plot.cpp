// dscpp plot: a run's loss, learning rate, gradient norm and throughput against the step, as one
// PNG of four panels, drawn by gnuplot (Debian's gnuplot-nox, pngcairo terminal). It reads
// `dscpp train --metrics` JSON lines (x: the optimizer step), or a csv_monitor folder (x:
// DeepSpeed's global_samples), or a folder holding a metrics.jsonl.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "dscpp/error.h"
#include "tools.h"

namespace dscpp::tools {
namespace {

namespace fs = std::filesystem;

// One curve per panel: (x, y) points in step order.
struct Series {
  std::string x_label;
  std::map<std::string, std::vector<std::pair<double, double>>> curves;  // by panel name
};

void add(Series& s, const std::string& curve, double x, double y) {
  if (std::isfinite(y)) s.curves[curve].push_back({x, y});
}

Series read_jsonl(const std::string& path) {
  std::ifstream in(path);
  DSCPP_CHECK(in.good(), IoError, "cannot read '", path, "'");
  Series s{"optimizer step", {}};
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      // A killed run's torn last line; any other bad line is an error.
      if (in.peek() == EOF) break;
      DSCPP_FAIL(ConfigError, path, ":", n,
                 " is not a JSON line (dscpp train --metrics writes one "
                 "per optimizer step)");
    }
    DSCPP_CHECK(j.contains("step"), ConfigError, path, ":", n, " has no \"step\"");
    const double x = j["step"].get<double>();
    auto num = [&](const char* key) {
      return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
    };
    if (j.value("skipped", false)) continue;  // fp16 overflow: no update, no norm
    add(s, "loss", x, num("loss"));
    add(s, "learning rate", x, num("lr"));
    add(s, "gradient norm", x, num("grad_norm"));
    if (j.contains("tokens_per_s"))
      add(s, "tokens/s", x, num("tokens_per_s"));
    else
      add(s, "samples/s", x, num("samples_per_s"));
  }
  return s;
}

// csv_monitor's files (src/monitor/csv_monitor.cpp): "step,<name>" then "x,value" rows.
Series read_csv_monitor(const std::string& dir) {
  Series s{"samples (global_samples)", {}};
  const std::pair<const char*, const char*> files[] = {
      {"Train_Samples_train_loss.csv", "loss"},
      {"Train_Samples_lr.csv", "learning rate"},
      {"Train_Samples_grad_norm.csv", "gradient norm"},
      {"Train_Samples_tokens_per_sec.csv", "tokens/s"},
  };
  for (const auto& [file, curve] : files) {
    std::string path = dir + "/" + file;
    std::string name = curve;
    if (!fs::exists(path) && name == "tokens/s") {
      path = dir + "/Train_Samples_samples_per_sec.csv";
      name = "samples/s";
    }
    std::ifstream in(path);
    if (!in.good()) continue;
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      double x = 0, y = 0;
      if (std::sscanf(line.c_str(), "%lf,%lf", &x, &y) == 2) add(s, name, x, y);
    }
  }
  return s;
}

Series read_run(const std::string& input) {
  if (fs::is_directory(input)) {
    if (fs::exists(input + "/metrics.jsonl")) return read_jsonl(input + "/metrics.jsonl");
    DSCPP_CHECK(fs::exists(input + "/Train_Samples_train_loss.csv"), ConfigError, "'", input,
                "' holds neither a metrics.jsonl nor csv_monitor files "
                "(Train_Samples_train_loss.csv). HINT: give the file of dscpp train --metrics, "
                "or the csv_monitor folder output_path/job_name");
    return read_csv_monitor(input);
  }
  return read_jsonl(input);
}

// A gnuplot string literal; a control character (a newline would end the string and start a
// gnuplot command) is refused.
std::string quoted(const std::string& s) {
  for (unsigned char c : s)
    DSCPP_CHECK(c >= 0x20 && c != 0x7f, ConfigError,
                "dscpp plot: a title or path with a control "
                "character cannot be passed to gnuplot: ",
                nlohmann::json(s).dump());
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

}  // namespace

int plot_main(int argc, char** argv) {
  CLI::App app{"dscpp plot: loss, lr, grad norm and throughput of a run as a PNG (gnuplot)"};
  std::string input, output, title;
  int width = 1200, height = 900;
  app.add_option("run", input,
                 "metrics.jsonl of dscpp train --metrics, a folder holding one, or "
                 "a csv_monitor folder")
      ->required();
  app.add_option("-o,--output", output, "the PNG to write")->required();
  app.add_option("--title", title, "title above the panels (default: the input's name)");
  app.add_option("--width", width, "pixels")->capture_default_str()->check(CLI::Range(200, 10000));
  app.add_option("--height", height, "pixels")
      ->capture_default_str()
      ->check(CLI::Range(200, 10000));
  CLI11_PARSE(app, argc, argv);
  if (title.empty()) title = input;

  Series s = read_run(input);
  DSCPP_CHECK(!s.curves["loss"].empty(), ConfigError, "'", input,
              "' has no steps to plot (no loss values)");

  // gnuplot reads the points from one data file, a blank-line-separated block per panel.
  const fs::path work = fs::temp_directory_path() / fmt::format("dscpp_plot_{}", ::getpid());
  fs::create_directories(work);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{work};
  std::ofstream data(work / "points.dat");
  std::ostringstream script;
  script << "set terminal pngcairo size " << width << "," << height << " font 'sans,10'\n"
         << "set output " << quoted(output) << "\n"
         << "set multiplot layout 2,2 title " << quoted(title) << "\n"
         << "set grid\nset key off\nset xlabel " << quoted(s.x_label) << "\n";
  int block = 0;
  for (const char* panel : {"loss", "learning rate", "gradient norm",
                            s.curves.count("tokens/s") ? "tokens/s" : "samples/s"}) {
    const auto& pts = s.curves[panel];
    script << "set title " << quoted(panel) << "\n";
    if (pts.empty()) {
      // Nothing recorded (a csv_monitor folder without that file): an empty, labelled panel.
      script << "set label 1 'not recorded' at graph 0.5,0.5 center\n"
             << "plot [0:1] [0:1] NaN notitle\nunset label 1\n";
      continue;
    }
    double lo = pts[0].second, hi = lo;
    for (const auto& [x, y] : pts) {
      data << fmt::format("{:.10g} {:.10g}\n", x, y);
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
    data << "\n\n";
    // A constant curve (a constant learning rate) gets a range around it, which gnuplot would
    // otherwise pick itself with a warning.
    const double pad = lo == hi ? (lo == 0 ? 1.0 : std::abs(lo) * 0.01) : 0;
    script << "plot " << (pad > 0 ? fmt::format("[] [{:.10g}:{:.10g}] ", lo - pad, hi + pad) : "")
           << quoted((work / "points.dat").string()) << " index " << block++
           << " using 1:2 with lines linewidth 2\n";
  }
  script << "unset multiplot\n";
  data.close();
  std::ofstream(work / "plot.gp") << script.str();

  const pid_t pid = ::fork();
  DSCPP_CHECK(pid >= 0, Error, "fork failed");
  if (pid == 0) {
    const std::string gp = (work / "plot.gp").string();
    ::execlp("gnuplot", "gnuplot", gp.c_str(), static_cast<char*>(nullptr));
    std::cerr << "dscpp plot: error: cannot run gnuplot: " << std::strerror(errno)
              << ". HINT: install it (apt-get install gnuplot-nox)\n";
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  DSCPP_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, Error, "gnuplot failed drawing ",
              output,
              WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (gnuplot is not installed)" : "",
              "; its messages are above");
  DSCPP_CHECK(fs::exists(output) && fs::file_size(output) > 0, IoError, "gnuplot wrote no ",
              output);
  std::cout << fmt::format("wrote {} ({}x{}): {} steps of loss, lr, grad norm and {}", output,
                           width, height, s.curves["loss"].size(),
                           s.curves.count("tokens/s") ? "tokens/s" : "samples/s")
            << std::endl;
  return 0;
}

}  // namespace dscpp::tools
