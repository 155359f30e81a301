// Monitors (src/monitor): the TensorBoard event file read back record by record through its
// framing and checksums with the same message definitions, the wire bytes pinned to
// TensorBoard's field numbers, csv_monitor's DeepSpeed layout, and an engine on 2 ranks writing
// DeepSpeed's tags with the values it reports, from rank 0 only.
#include "monitor/monitor.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/test_net.h"
#include "support/fault_file_system.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "util/crc32c.h"

#ifdef DSCPP_HAVE_PROTOBUF
#include "monitor/tensorboard_event.pb.h"
#endif
#include <zlib.h>

namespace dscpp::enginetest {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

#ifdef DSCPP_HAVE_PROTOBUF
// TensorFlow's record reader: length, masked CRC of the length, data, masked CRC of the data;
// every checksum must hold (TensorBoard drops a file whose records do not).
std::vector<tensorboard::Event> read_events(const fs::path& p) {
  const std::string bytes = slurp(p);
  auto masked = [](const char* d, size_t n) {
    uint32_t c = crc32c(d, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
  };
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    return v;
  };
  std::vector<tensorboard::Event> events;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "torn record header";
    uint64_t n;
    std::memcpy(&n, bytes.data() + at, 8);
    EXPECT_EQ(u32(at + 8), masked(bytes.data() + at, 8)) << "length checksum at " << at;
    EXPECT_LE(at + 12 + n + 4, bytes.size()) << "torn record";
    if (at + 12 + n + 4 > bytes.size()) break;
    EXPECT_EQ(u32(at + 12 + n), masked(bytes.data() + at + 12, n)) << "data checksum at " << at;
    tensorboard::Event e;
    EXPECT_TRUE(e.ParseFromArray(bytes.data() + at + 12, static_cast<int>(n)));
    events.push_back(e);
    at += 12 + n + 4;
  }
  return events;
}

TEST(Monitor, TensorBoardWireBytesUseTensorBoardsFieldNumbers) {
  // Summary.Value{tag=1: "a", simple_value=2: 1.0f}; Event{step=2: 5, file_version=3: "x"};
  // Event.summary is field 5. Any other numbering and TensorBoard would read nothing.
  tensorboard::Summary::Value v;
  v.set_tag("a");
  v.set_simple_value(1.0f);
  EXPECT_EQ(v.SerializeAsString(), std::string("\x0a\x01"
                                               "a"
                                               "\x15\x00\x00\x80\x3f",
                                               8));
  tensorboard::Event e;
  e.set_step(5);
  e.set_file_version("x");
  EXPECT_EQ(e.SerializeAsString(), std::string("\x10\x05\x1a\x01x", 5));
  tensorboard::Event s;
  s.mutable_summary()->add_value()->set_tag("b");
  EXPECT_EQ(s.SerializeAsString(), std::string("\x2a\x05\x0a\x03\x0a\x01"
                                               "b",
                                               7));
}

TEST(Monitor, TensorBoardFileReadsBackRecordByRecord) {
  testing::TempDir dir;
  auto w = monitor::make_tensorboard_writer(dir.file("run/job"), nullptr);
  w->write({{"Train/Samples/train_loss", 2.5, 8}, {"Train/Samples/lr", 1e-3, 8}});
  w->write({{"Train/Samples/train_loss", 2.25, 16}});
  std::vector<fs::path> files;
  for (auto& f : fs::directory_iterator(dir.file("run/job"))) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];
  auto events = read_events(files[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.7e9);
  EXPECT_EQ(events[1].step(), 8);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "Train/Samples/train_loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1e-3f);
  EXPECT_EQ(events[3].step(), 16);
  EXPECT_EQ(events[3].summary().value(0).simple_value(), 2.25f);
}
#endif

TEST(Monitor, CsvFilesFollowDeepSpeedsLayoutAndContinueOnReopen) {
  testing::TempDir dir;
  {
    auto w = monitor::make_csv_writer(dir.file("job"), nullptr);
    w->write({{"Train/Samples/train_loss", 2.5, 8}, {"Train/Samples/lr", 0.001, 8}});
    w->write({{"Train/Samples/train_loss", 2.25, 16}});
  }
  // A resumed run appends; the header is not repeated.
  monitor::make_csv_writer(dir.file("job"), nullptr)->write({{"Train/Samples/train_loss", 2, 24}});
  EXPECT_EQ(lines_of(dir.file("job/Train_Samples_train_loss.csv")),
            (std::vector<std::string>{"step,train_loss", "8,2.5", "16,2.25", "24,2"}));
  EXPECT_EQ(lines_of(dir.file("job/Train_Samples_lr.csv")),
            (std::vector<std::string>{"step,lr", "8,0.001"}));
}

TEST(Monitor, AnUnwritableFolderIsAnIoErrorNamingIt) {
  testing::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  std::string msg =
      testing::error_of<IoError>([&] { monitor::make_csv_writer(dir.file("file/job"), nullptr); });
  EXPECT_NE(msg.find(dir.file("file")), std::string::npos) << msg;
}

// DeepSpeed's tags, global_samples as the x axis, the engine's own numbers, rank 0 only.
TEST(Monitor, EngineWritesDeepSpeedsTagsFromRankZero) {
  testing::TempDir dir;
  const std::string out = dir.file("mon");
  const std::string cfg =
      config_json(8, 2,
                  kAdamW +
                      ", \"bf16\": {\"enabled\": true}, "
                      "\"wall_clock_breakdown\": true, \"csv_monitor\": {\"enabled\": true, "
                      "\"output_path\": \"" +
                      out + "\", \"job_name\": \"csv\"}" +
#ifdef DSCPP_HAVE_PROTOBUF
                      ", \"tensorboard\": {\"enabled\": true, \"output_path\": \"" + out +
                      "\", \"job_name\": \"tb\"}" +
#endif
                      "");
  std::vector<Trajectory> t = run_ranks(2, 3, cfg);
  ASSERT_EQ(t[0].losses.size(), 3u);
  // Only rank 0 writes: one folder per monitor, nothing else.
  std::vector<std::string> folders;
  for (auto& f : fs::directory_iterator(out)) folders.push_back(f.path().filename());
  std::sort(folders.begin(), folders.end());
#ifdef DSCPP_HAVE_PROTOBUF
  EXPECT_EQ(folders, (std::vector<std::string>{"csv", "tb"}));
#else
  EXPECT_EQ(folders, (std::vector<std::string>{"csv"}));
#endif
  auto loss = lines_of(out + "/csv/Train_Samples_train_loss.csv");
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[0], "step,train_loss");
  for (int s = 0; s < 3; ++s) {
    std::istringstream row(loss[s + 1]);
    int64_t x;
    char comma;
    double v;
    row >> x >> comma >> v;
    EXPECT_EQ(x, 8 * (s + 1)) << "global_samples";
    EXPECT_NEAR(v, t[0].losses[s], 1e-8 * std::abs(t[0].losses[s]));
  }
  for (const char* tag :
       {"lr", "grad_norm", "samples_per_sec", "rss_gib", "peak_rss_gib", "elapsed_time_ms_forward",
        "elapsed_time_ms_backward", "elapsed_time_ms_backward_inner",
        "elapsed_time_ms_backward_allreduce", "elapsed_time_ms_step"}) {
    EXPECT_TRUE(fs::exists(out + "/csv/Train_Samples_" + tag + ".csv")) << tag;
  }
  EXPECT_FALSE(fs::exists(out + "/csv/Train_Samples_loss_scale.csv")) << "fp16 only";
  // No tokens_per_sec without set_tokens_per_sample.
  EXPECT_FALSE(fs::exists(out + "/csv/Train_Samples_tokens_per_sec.csv"));
#ifdef DSCPP_HAVE_PROTOBUF
  std::vector<fs::path> files;
  for (auto& f : fs::directory_iterator(out + "/tb")) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, std::vector<std::pair<int64_t, float>>> series;
  for (const auto& e : read_events(files[0])) {
    for (const auto& v : e.summary().value())
      series[v.tag()].push_back({e.step(), v.simple_value()});
  }
  ASSERT_EQ(series["Train/Samples/train_loss"].size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(series["Train/Samples/train_loss"][s].first, 8 * (s + 1));
    EXPECT_EQ(series["Train/Samples/train_loss"][s].second, static_cast<float>(t[0].losses[s]));
    EXPECT_EQ(series["Train/Samples/grad_norm"][s].second, static_cast<float>(t[0].grad_norms[s]));
  }
  EXPECT_EQ(series.size(), 11u) << "train_loss, lr, grad_norm, samples_per_sec, rss_gib, "
                                   "peak_rss_gib and 5 elapsed_time_ms_*";
#endif
}

// NOTE [rank-0 observers]: a monitor whose disk fills mid-run stops with an error on rank 0;
// training goes on, on every rank, the same as without it (no rank is left at a collective).
TEST(Monitor, AFullDiskStopsTheMonitorNotTheTraining) {
  testing::TempDir dir;
  io::FaultFileSystem full({io::FileFault::Kind::disk_full, 1, /*bytes=*/300});
  const std::string cfg = config_json(8, 2,
                                      kAdamW +
                                          ", \"csv_monitor\": {\"enabled\": true, "
                                          "\"output_path\": \"" +
                                          dir.path() + "\", \"job_name\": \"j\"}");
  auto with_full_disk = run_ranks(2, 6, cfg, [&](InitOptions& o) { o.file_system = &full; });
  auto plain = run_ranks(2, 6, config_json(8, 2, kAdamW));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(with_full_disk[r].losses.size(), 6u) << "rank " << r;
    EXPECT_EQ(with_full_disk[r].losses, plain[r].losses) << "rank " << r;
  }
  // What reached the disk before it filled is intact: the header and whole rows.
  auto loss = lines_of(dir.file("j/Train_Samples_train_loss.csv"));
  ASSERT_GE(loss.size(), 2u);
  EXPECT_EQ(loss[0], "step,train_loss");
  EXPECT_LT(loss.size(), 7u) << "the disk filled before the last step";
}

// fp16 adds the loss scale the step's backward used (element-wise model: libtorch 1.13 has no
// CPU fp16 matmul).
TEST(Monitor, Fp16WritesTheLossScale) {
  testing::TempDir dir;
  auto errors = testing::run_thread_ranks(1, [&](Communicator& c) {
    struct ScaleImpl : torch::nn::Module {
      at::Tensor w = register_parameter("w", at::linspace(-0.5, 0.7, 8));
    };
    auto net = std::make_shared<ScaleImpl>();
    auto engine =
        initialize(net,
                   config_json(2, 2,
                               kAdamW +
                                   ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}, "
                                   "\"csv_monitor\": {\"enabled\": true, \"output_path\": \"" +
                                   dir.path() + "\", \"job_name\": \"j\"}"),
                   borrowed(c));
    for (int s = 0; s < 2; ++s) {
      at::Tensor x = at::linspace(0.1, 0.9, 16).reshape({2, 8}).to(at::kHalf);
      engine->backward((x * net->w).to(at::kFloat).pow(2).mean());
      engine->step();
    }
  });
  ASSERT_FALSE(errors[0]) << testing::error_text(errors[0]);
  EXPECT_EQ(lines_of(dir.file("j/Train_Samples_loss_scale.csv")),
            (std::vector<std::string>{"step,loss_scale", "2,256", "4,256"}));
}

// A PNG's size and pixels: the chunks walked, IDAT inflated with zlib and unfiltered (8-bit
// RGB or RGBA, not interlaced: what gnuplot's pngcairo writes).
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // rows of width * channels bytes
};

Image read_png(const std::string& path) {
  const std::string b = slurp(path);
  Image img;
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "not a PNG";
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(b[at])) << 24) | (uint32_t(uint8_t(b[at + 1])) << 16) |
           (uint32_t(uint8_t(b[at + 2])) << 8) | uint32_t(uint8_t(b[at + 3]));
  };
  std::string idat;
  int depth = 0, color = 0, interlace = 0;
  for (size_t at = 8; at + 8 <= b.size();) {
    const uint32_t n = be32(at);
    const std::string type = b.substr(at + 4, 4);
    if (type == "IHDR") {
      img.width = static_cast<int>(be32(at + 8));
      img.height = static_cast<int>(be32(at + 12));
      depth = uint8_t(b[at + 16]);
      color = uint8_t(b[at + 17]);
      interlace = uint8_t(b[at + 20]);
    } else if (type == "IDAT") {
      idat += b.substr(at + 8, n);
    }
    at += 12 + n;
  }
  EXPECT_EQ(depth, 8);
  EXPECT_EQ(interlace, 0);
  EXPECT_TRUE(color == 2 || color == 6) << "color type " << color;
  img.channels = color == 6 ? 4 : 3;
  const size_t stride = size_t(img.width) * img.channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf got = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &got, reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
            Z_OK);
  EXPECT_EQ(got, raw.size());
  img.pixels.assign(stride * img.height, 0);
  const int bpp = img.channels;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &img.pixels[y * stride];
    const uint8_t* up = y > 0 ? &img.pixels[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= size_t(bpp) ? out[i - bpp] : 0, u = up ? up[i] : 0,
                c = (up && i >= size_t(bpp)) ? up[i - bpp] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = u;
      if (filter == 3) pred = (a + u) / 2;
      if (filter == 4) {
        const int p = a + u - c, pa = std::abs(p - a), pb = std::abs(p - u), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? u : c);
      }
      out[i] = static_cast<uint8_t>(in[i] + pred);
    }
  }
  return img;
}

// Share of pixels that are not the image's most common colour (the background).
double ink(const Image& img) {
  std::map<uint32_t, int64_t> count;
  for (size_t p = 0; p + img.channels <= img.pixels.size(); p += img.channels) {
    uint32_t v = 0;
    for (int k = 0; k < 3; ++k) v = v << 8 | img.pixels[p + k];
    ++count[v];
  }
  int64_t most = 0;
  for (auto& [v, n] : count) most = std::max(most, n);
  return 1.0 - double(most) / (double(img.width) * img.height);
}

TEST(Plot, DrawsARunAsAPngThatIsNotBlank) {
  testing::TempDir dir;
  {
    std::ofstream m(dir.file("metrics.jsonl"));
    for (int s = 1; s <= 60; ++s) {
      m << fmt::format(
          "{{\"step\": {}, \"loss\": {}, \"lr\": {}, \"grad_norm\": {}, \"samples_per_s\": "
          "{}, \"tokens_per_s\": {}, \"loss_scale\": 1, \"skipped\": false}}\n",
          s, 5.0 / std::sqrt(s), 1e-3 * std::min(1.0, s / 10.0), 1.0 + 0.3 * std::sin(s),
          40 + s % 3, 2560 + 10 * (s % 7));
    }
    m << "{\"step\": 61, \"lo";  // the torn line of a killed run
  }
  auto r = testing::run_command(std::string(DSCPP_CLI_PATH) + " plot " + dir.file("metrics.jsonl") +
                                " -o " + dir.file("run.png") + " --width 800 --height 600 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("60 steps"), std::string::npos) << r.output;
  Image img = read_png(dir.file("run.png"));
  EXPECT_EQ(img.width, 800);
  EXPECT_EQ(img.height, 600);
  const double share = ink(img);
  EXPECT_GT(share, 0.02) << "blank";  // axes, labels and four curves
  EXPECT_LT(share, 0.5) << "all painted";

  // A csv_monitor folder plots too; a folder with neither is refused with what to give.
  {
    auto w = monitor::make_csv_writer(dir.file("csv"), nullptr);
    for (int s = 1; s <= 20; ++s)
      w->write({{"Train/Samples/train_loss", 3.0 / s, 8 * s}, {"Train/Samples/lr", 1e-3, 8 * s}});
  }
  r = testing::run_command(std::string(DSCPP_CLI_PATH) + " plot " + dir.file("csv") + " -o " +
                           dir.file("csv.png") + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_GT(ink(read_png(dir.file("csv.png"))), 0.01);
  fs::create_directories(dir.file("empty"));
  r = testing::run_command(std::string(DSCPP_CLI_PATH) + " plot " + dir.file("empty") + " -o " +
                           dir.file("x.png") + " 2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("neither a metrics.jsonl nor csv_monitor files"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace dscpp::enginetest
