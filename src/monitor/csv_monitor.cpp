// csv_monitor: DeepSpeed's layout (deepspeed/monitor/csv_monitor.py), one CSV file per tag.
#include <map>

#include "dscpp/file_system.h"
#include "monitor/monitor.h"

namespace dscpp::monitor {
namespace {

class CsvWriter final : public Writer {
 public:
  CsvWriter(std::string dir, io::FileSystem& fs) : dir_(std::move(dir)), fs_(fs) {
    fs_.create_dirs(dir_);
  }

  void write(const std::vector<Event>& events) override {
    for (const Event& e : events) {
      io::WritableFile& f = file_for(e.tag);
      const std::string row = fmt_row(e);
      f.append(row.data(), row.size());
    }
  }

  std::string describe() const override { return "CSV files in " + dir_; }

 private:
  static std::string fmt_row(const Event& e) {
    char value[64];
    std::snprintf(value, sizeof(value), "%.9g", e.value);
    return std::to_string(e.step) + "," + value + "\n";
  }

  io::WritableFile& file_for(const std::string& tag) {
    auto it = files_.find(tag);
    if (it != files_.end()) return *it->second;
    std::string name = tag;
    for (char& c : name)
      if (c == '/' || c == ' ') c = '_';
    const std::string path = dir_ + "/" + name + ".csv";
    const bool fresh = !fs_.exists(path) || fs_.file_size(path) == 0;
    auto file = fs_.open_for_append(path);
    if (fresh) {
      const std::string header = "step," + tag.substr(tag.find_last_of('/') + 1) + "\n";
      file->append(header.data(), header.size());
    }
    return *files_.emplace(tag, std::move(file)).first->second;
  }

  std::string dir_;
  io::FileSystem& fs_;
  std::map<std::string, std::unique_ptr<io::WritableFile>> files_;
};

}  // namespace

std::unique_ptr<Writer> make_csv_writer(const std::string& dir, io::FileSystem* fs) {
  return std::make_unique<CsvWriter>(dir, io::resolve(fs));
}

std::vector<std::unique_ptr<Writer>> from_config(const Config& config, int rank,
                                                 io::FileSystem* fs) {
  std::vector<std::unique_ptr<Writer>> writers;
  if (rank != 0) return writers;
  auto dir = [](const MonitorConfig& m) {
    return m.output_path.empty() ? m.job_name : m.output_path + "/" + m.job_name;
  };
  if (config.tensorboard.enabled)
    writers.push_back(make_tensorboard_writer(dir(config.tensorboard), fs));
  if (config.csv_monitor.enabled) writers.push_back(make_csv_writer(dir(config.csv_monitor), fs));
  return writers;
}

}  // namespace dscpp::monitor
