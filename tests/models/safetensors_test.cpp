// Tests of safetensors I/O and the FileSystem seam: the exact byte layout, a round trip for every
// dtype (0-d and empty tensors too), rejection of every kind of corrupt or truncated file with an
// IoError naming the file and tensor, atomic writes under injected faults (no partial file left),
// and loading a module's weights by name with all mismatches listed at once.
#include "dscpp/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "checkpoint/verify.h"
#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "dscpp/models/gpt.h"
#include "support/fault_file_system.h"
#include "support/temp_dir.h"

namespace dscpp::safetensors {
namespace {

namespace fs = std::filesystem;

using dscpp::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename Fn>
std::string io_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no error>";
}

// A file made of a hand-written header and `data_len` bytes of data.
std::string make_file(const std::string& header, size_t data_len) {
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_len, '\x01');
}

TensorList every_dtype() {
  torch::manual_seed(0);
  return {
      {"f32", torch::randn({2, 3})},
      {"f64", torch::randn({3}, at::kDouble)},
      {"f16", torch::randn({4, 1}).to(at::kHalf)},
      {"bf16", torch::randn({5}).to(at::kBFloat16)},
      {"i64", torch::tensor({int64_t{-1}, int64_t{1} << 40, int64_t{7}})},
      {"i32", torch::tensor({-5, 6}, at::kInt)},
      {"i16", torch::tensor({-300, 300}, at::kShort)},
      {"i8", torch::tensor({-7, 7}, at::kChar)},
      {"u8", torch::tensor({0, 255}, at::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},                   // 0-d
      {"empty", torch::empty({0}, at::kFloat)},          // no bytes
      {"empty_2d", torch::empty({2, 0, 3}, at::kLong)},  // no bytes, shape kept
  };
}

TEST(Safetensors, ByteLayoutMatchesTheFormat) {
  std::string bytes = serialize({{"a", torch::tensor({1.0f, 2.0f})}}, {{"format", "pt"}});
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n, padded.size());
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, n), padded);
  float data[2];
  std::memcpy(data, bytes.data() + 8 + n, 8);
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_EQ(data[1], 2.0f);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const TensorList tensors = every_dtype();
  save(path, tensors, {{"format", "pt"}, {"note", "round trip"}});
  Contents c = load(path);
  ASSERT_EQ(c.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    EXPECT_EQ(c.tensors[i].first, name);  // file order = given order
    EXPECT_EQ(c.tensors[i].second.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(c.tensors[i].second.sizes(), t.sizes()) << name;
    EXPECT_TRUE(c.tensors[i].second.equal(t)) << name;
  }
  EXPECT_EQ(c.metadata.at("note"), "round trip");
  EXPECT_EQ(c.metadata.size(), 2u);
  // The in-memory form is the same bytes.
  EXPECT_EQ(read_all(path), serialize(tensors, {{"format", "pt"}, {"note", "round trip"}}));
  Contents d = deserialize(read_all(path), "mem");
  EXPECT_TRUE(d.tensors[10].second.equal(torch::tensor(3.5f)));
  EXPECT_EQ(d.tensors[10].second.dim(), 0);
  // No metadata: no "__metadata__" key at all.
  save(path, {{"x", torch::ones({1})}});
  EXPECT_EQ(read_all(path).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(load(path).metadata.empty());
}

TEST(Safetensors, StridedTensorsAreWrittenContiguous) {
  at::Tensor base = torch::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor t = base.t();  // [4, 3], not contiguous
  Contents c = deserialize(serialize({{"t", t}, {"col", base.select(1, 2)}}), "mem");
  EXPECT_TRUE(c.tensors[0].second.equal(t));
  EXPECT_TRUE(c.tensors[1].second.equal(torch::tensor({2.0f, 6.0f, 10.0f})));
}

TEST(Safetensors, RejectsWhatTheFormatCannotHold) {
  EXPECT_NE(io_error_of([] {
              serialize({{"", torch::ones({1})}});
            }).find("empty name"),
            std::string::npos);
  EXPECT_NE(io_error_of([] {
              serialize({{"a", torch::ones({1})}, {"a", torch::ones({1})}});
            }).find("given twice"),
            std::string::npos);
  EXPECT_NE(io_error_of([] {
              serialize({{"__metadata__", torch::ones({1})}});
            }).find("__metadata__"),
            std::string::npos);
  EXPECT_NE(io_error_of([] {
              serialize({{"c", torch::ones({1}, at::kComplexFloat)}});
            }).find("cannot hold dtype"),
            std::string::npos);
}

TEST(Safetensors, EveryTruncationIsDetected) {
  const std::string good = serialize({{"w", torch::randn({3, 5})}, {"b", torch::zeros({5})}});
  for (size_t len = 0; len < good.size(); ++len) {
    std::string e = io_error_of([&] { deserialize(good.substr(0, len), "cut.safetensors"); });
    EXPECT_NE(e.find("'cut.safetensors'"), std::string::npos) << "length " << len << ": " << e;
  }
  // Extra bytes at the end are corruption too.
  std::string e = io_error_of([&] { deserialize(good + "x", "long.safetensors"); });
  EXPECT_NE(e.find("trailing bytes"), std::string::npos) << e;
}

TEST(Safetensors, CorruptHeadersAreRejectedNamingFileAndTensor) {
  struct Case {
    std::string header;
    size_t data_len;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "not valid JSON"},
      {R"([1,2])", 0, "not an object"},
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has unknown dtype \"F33\""},
      {R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", 4,
       "tensor 'a' has dtype U16, which libtorch cannot hold"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has dtype F32 and shape [3] (3 elements, 12 bytes) but data_offsets [0, 8]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8,
       "tensor 'a' has data_offsets [0, 16] beyond the 8 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensor 'b' (bytes [4, 12)) overlaps tensor 'a'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "bytes [0, 4) of the data section belong to no tensor (a hole before tensor 'a')"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12, "trailing bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       16, "tensor 'a' appears twice"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has a shape entry -2"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
       "tensor 'a' has no \"data_offsets\" array of two numbers"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 'a' has no \"shape\""},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8,
       "tensor 'a' has an unknown field \"x\""},
      {R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
       "__metadata__ value of 'k' is not a string"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has dtype F32"},
  };
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  for (const auto& c : cases) {
    write_all(path, make_file(c.header, c.data_len));
    std::string e = io_error_of([&] { load(path); });
    EXPECT_NE(e.find(path), std::string::npos) << c.header << "\n-> " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.header << "\n-> " << e;
  }
  // A header length larger than the file.
  std::string huge(8, '\0');
  uint64_t n = 1000;
  std::memcpy(huge.data(), &n, 8);
  write_all(path, huge + "{}");
  EXPECT_NE(io_error_of([&] { load(path); }).find("header length 1000 does not fit"),
            std::string::npos);
  // A well-formed empty file: no tensors, no data.
  write_all(path, make_file("{}      ", 0));
  EXPECT_TRUE(load(path).tensors.empty());
  EXPECT_NE(io_error_of([&] { load(dir.file("missing.safetensors")); }).find("cannot open"),
            std::string::npos);
}

TEST(Safetensors, TornWriteIsDetectedOnLoad) {
  TempDir dir;
  const std::string path = dir.file("torn.safetensors");
  const TensorList tensors = {{"w", torch::randn({64, 64})}};
  const size_t full = serialize(tensors).size();
  for (uint64_t keep : {uint64_t{0}, uint64_t{5}, uint64_t{8}, uint64_t{40}, uint64_t{full - 1}}) {
    // The file system loses everything after `keep` bytes and reports success (a torn write
    // below the page cache): the reader must notice.
    io::FaultFileSystem torn({io::FileFault::Kind::tear, 1, keep});
    save(path, tensors, {}, &torn);
    EXPECT_GT(torn.injected(), 0);
    EXPECT_EQ(fs::file_size(path), keep);
    std::string e = io_error_of([&] { load(path); });
    EXPECT_NE(e.find(path), std::string::npos) << keep << ": " << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos ||
                e.find("not valid JSON") != std::string::npos)
        << keep << ": " << e;
  }
}

TEST(Safetensors, FailedWriteLeavesNoPartialFile) {
  using Kind = io::FileFault::Kind;
  const TensorList tensors = {{"a", torch::randn({100})}, {"b", torch::randn({100})}};
  for (io::FileFault fault :
       {io::FileFault{Kind::fail_append, 1, 0}, io::FileFault{Kind::fail_append, 3, 0},
        io::FileFault{Kind::fail_sync, 1, 0}, io::FileFault{Kind::fail_rename, 1, 0},
        io::FileFault{Kind::disk_full, 1, 300}}) {
    TempDir dir;
    const std::string path = dir.file("w.safetensors");
    io::FaultFileSystem faulty(fault);
    std::string e = io_error_of([&] { save(path, tensors, {}, &faulty); });
    EXPECT_NE(e.find("injected"), std::string::npos) << e;
    EXPECT_EQ(faulty.injected(), 1);
    EXPECT_TRUE(dir.entries().empty()) << "left behind: " << dir.entries()[0];

    // An existing file keeps its old content.
    save(path, {{"old", torch::ones({3})}});
    io::FaultFileSystem faulty2(fault);
    EXPECT_THROW(save(path, tensors, {}, &faulty2), IoError);
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"});
    Contents c = load(path);
    ASSERT_EQ(c.tensors.size(), 1u);
    EXPECT_EQ(c.tensors[0].first, "old");
  }
  // Without a fault the same writes go through.
  TempDir dir;
  io::FaultFileSystem none({});
  save(dir.file("ok.safetensors"), tensors, {}, &none);
  EXPECT_EQ(load(dir.file("ok.safetensors"), &none).tensors.size(), 2u);
}

TEST(Safetensors, ModuleSaveAndLoadIntoByName) {
  TempDir dir;
  const std::string path = dir.file("gpt.safetensors");
  models::GPTConfig cfg{13, 6, 2, 2, 8};
  models::GPT a(cfg, 1), b(cfg, 2);
  save(*a, path, cfg.to_metadata());
  Contents c = load(path);
  ASSERT_EQ(c.tensors.size(), a->named_parameters().size());
  EXPECT_EQ(c.tensors[0].first, "wte.weight");
  EXPECT_EQ(c.tensors[4].first, "h.0.attn.c_attn.weight");
  for (const auto& [name, t] : c.tensors) EXPECT_EQ(t.scalar_type(), at::kFloat) << name;

  auto meta = load_into(*b, path);
  EXPECT_EQ(models::GPTConfig::from_metadata(meta).to_string(), cfg.to_string());
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].value().equal(pb[i].value()));

  // Into a bf16 model: converted to the parameter's dtype.
  models::GPT half(cfg, 3);
  half->to(at::kBFloat16);
  load_into(*half, path);
  EXPECT_EQ(half->wte->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(half->wte->weight.equal(a->wte->weight.to(at::kBFloat16)));
}

TEST(Safetensors, LoadIntoListsEveryMismatchAtOnce) {
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  models::GPTConfig cfg{13, 6, 2, 2, 8};
  models::GPT model(cfg, 1);
  TensorList tensors;
  for (const auto& p : model->named_parameters()) {
    if (p.key() == "ln_f.bias" || p.key() == "h.1.mlp.c_fc.weight") continue;  // missing
    at::Tensor t = p.value().detach();
    if (p.key() == "wpe.weight") t = torch::zeros({7, 8});  // wrong shape
    tensors.emplace_back(p.key(), t);
  }
  tensors.emplace_back("lm_head.weight", torch::zeros({13, 8}));  // extra
  save(path, tensors);
  const at::Tensor before = model->wte->weight.clone();
  std::string e;
  try {
    load_into(*model, path);
  } catch (const CheckpointError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("missing from the file (2):\n    h.1.mlp.c_fc.weight\n    ln_f.bias"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("in the file but not in the module (1):\n    lm_head.weight"), std::string::npos)
      << e;
  EXPECT_NE(e.find("shape mismatch (1):\n    wpe.weight (module [6, 8], file [7, 8])"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_TRUE(model->wte->weight.equal(before)) << "a failed load changed the module";
}

}  // namespace
}  // namespace dscpp::safetensors

namespace dscpp {
namespace {

// A file larger than several writeback pieces (NOTE [early writeback] in
// src/io/posix_file_system.cpp: written in 8 MiB pieces, each handed to the disk early and its
// pages dropped once written) reads back byte for byte, with the size and CRC save reported.
TEST(Safetensors, LargeFileWrittenInPiecesReadsBackExactly) {
  testing::TempDir tmp;
  const std::string path = tmp.file("big.safetensors");
  at::Tensor a = at::arange(int64_t{5} << 20, at::kFloat).mul_(0.37f).sin_();  // 20 MiB
  at::Tensor b = at::arange(int64_t{3} << 20, at::kInt);                       // 12 MiB
  safetensors::FileDigest d = safetensors::save(path, {{"a", a}, {"b", b}});
  auto [bytes, crc] = checkpoint::checksum_file(path);
  EXPECT_EQ(bytes, d.bytes);
  EXPECT_EQ(crc, d.crc32c);
  auto c = safetensors::load(path);
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_TRUE(at::equal(c.tensors[0].second, a));
  EXPECT_TRUE(at::equal(c.tensors[1].second, b));
}

}  // namespace
}  // namespace dscpp
