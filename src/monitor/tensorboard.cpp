// TensorBoard event files: Event messages (tensorboard_event.proto, compiled by protoc) in
// TFRecord framing. Each record is
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// little-endian, with TensorFlow's mask ((crc >> 15 | crc << 17) + 0xa282ead8) so that a CRC of
// bytes that themselves contain CRCs stays well distributed. TensorBoard skips a file whose
// framing or checksums are wrong, so the test suite reads the files back through this framing.
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "monitor/monitor.h"
#include "util/crc32c.h"

#ifdef DSCPP_HAVE_PROTOBUF
#include "monitor/tensorboard_event.pb.h"
#endif

namespace dscpp::monitor {

#ifdef DSCPP_HAVE_PROTOBUF
namespace {

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

template <typename T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Appends one TFRecord holding `data` to `out`.
void frame(std::string& out, const std::string& data) {
  std::string len;
  put_le<uint64_t>(len, data.size());
  out += len;
  put_le<uint32_t>(out, masked_crc(len.data(), len.size()));
  out += data;
  put_le<uint32_t>(out, masked_crc(data.data(), data.size()));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class TensorBoardWriter final : public Writer {
 public:
  TensorBoardWriter(const std::string& dir, io::FileSystem& fs) {
    fs.create_dirs(dir);
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    const double t = now_seconds();
    path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host +
            "." + std::to_string(::getpid());
    file_ = fs.open_for_write(path_);
    tensorboard::Event first;
    first.set_wall_time(t);
    first.set_file_version("brain.Event:2");
    append({first});
  }

  void write(const std::vector<Event>& events) override {
    const double t = now_seconds();
    std::vector<tensorboard::Event> records;
    records.reserve(events.size());
    for (const Event& e : events) {
      tensorboard::Event& r = records.emplace_back();
      r.set_wall_time(t);
      r.set_step(e.step);
      tensorboard::Summary::Value* v = r.mutable_summary()->add_value();
      v->set_tag(e.tag);
      v->set_simple_value(static_cast<float>(e.value));
    }
    append(records);
  }

  std::string describe() const override { return "TensorBoard event file " + path_; }

 private:
  void append(const std::vector<tensorboard::Event>& records) {
    std::string bytes;
    for (const auto& r : records) frame(bytes, r.SerializeAsString());
    file_->append(bytes.data(), bytes.size());  // one write(2): readers never see half a step
  }

  std::string path_;
  std::unique_ptr<io::WritableFile> file_;
};

}  // namespace

void require_tensorboard() {}

std::unique_ptr<Writer> make_tensorboard_writer(const std::string& dir, io::FileSystem* fs) {
  return std::make_unique<TensorBoardWriter>(dir, io::resolve(fs));
}

#else  // no protobuf in this build

void require_tensorboard() {
  DSCPP_FAIL(ConfigError,
             "tensorboard.enabled: this dscpp was built without protobuf, which writes "
             "TensorBoard's event files. HINT: install protobuf-compiler and libprotobuf-dev, "
             "configure and build again, or use csv_monitor");
}

std::unique_ptr<Writer> make_tensorboard_writer(const std::string&, io::FileSystem*) {
  require_tensorboard();
  return nullptr;  // not reached
}

#endif

}  // namespace dscpp::monitor
