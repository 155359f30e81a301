// Monitors: DeepSpeed's `tensorboard` and `csv_monitor` sections. The engine hands rank 0's
// monitors a list of scalar events after every optimizer step (NOTE [monitor events] in
// src/engine/step.cpp); each writer appends them to its files and flushes, so a run killed at
// any moment keeps every step it finished. Writers are used from the training thread only.
// docs/monitor.md is the user's page.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/config.h"

namespace dscpp::io {
class FileSystem;
}

namespace dscpp::monitor {

// One scalar: DeepSpeed's (log_name, value, step) tuple.
struct Event {
  std::string tag;  // "Train/Samples/train_loss"
  double value = 0;
  int64_t step = 0;  // the x axis; the engine writes global_samples, as DeepSpeed does
};

class Writer {
 public:
  virtual ~Writer() = default;
  // Appends the events and flushes them to the file system. Throws IoError naming the file.
  virtual void write(const std::vector<Event>& events) = 0;
  // Where the events go, for the start-up log line ("TensorBoard: DIR/events.out...").
  virtual std::string describe() const = 0;
};

// TensorBoard: a new event file DIR/events.out.tfevents.<seconds>.<host>.<pid> (TensorBoard
// reads every such file in a folder, so a resumed run adds one beside the earlier run's), in
// TFRecord framing with CRC-32C checksums, one Event per scalar; the first record names the
// format ("brain.Event:2"). Creates DIR. Throws IoError, or ConfigError when this build has no
// protobuf (require_tensorboard()).
std::unique_ptr<Writer> make_tensorboard_writer(const std::string& dir, io::FileSystem* fs);
// Throws ConfigError, saying what to install, when this build has no protobuf and so cannot
// write TensorBoard's event files; returns otherwise.
void require_tensorboard();

// csv_monitor: DeepSpeed's layout, one file per tag: DIR/<tag with '/' and ' ' replaced by
// '_'>.csv with the header "step,<the tag's last '/' part>" and a "step,value" row per event.
// Files are appended to (a resumed run continues them); the header is written only into an
// empty file. Creates DIR. Throws IoError.
std::unique_ptr<Writer> make_csv_writer(const std::string& dir, io::FileSystem* fs);

// The writers the config enables, on rank 0 (other ranks: none, as in DeepSpeed), each under
// output_path/job_name (output_path "" = the working directory). wandb, comet, and tensorboard in
// a build without protobuf are refused earlier, by engine::check_supported.
std::vector<std::unique_ptr<Writer>> from_config(const Config& config, int rank,
                                                 io::FileSystem* fs);

}  // namespace dscpp::monitor
