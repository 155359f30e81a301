// Tests of the data pipeline: the data contract on tensors, text and .bin files, the batch split
// over steps, ranks and micro-steps (with wrap-around and shuffling), reading only a rank's own
// bytes, the errors for short or malformed files, and the built-in reverse task: layout,
// determinism, a disjoint held-out set, the accuracy measure and that a small GPT learns it.
#include "dscpp/data.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/file_system.h"
#include "dscpp/models/gpt.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace dscpp::data {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> to_vec(const at::Tensor& t) {
  at::Tensor c = t.contiguous().to(at::kLong);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

using dscpp::testing::error_of;

using dscpp::testing::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Counts the bytes read through it.
class CountingFileSystem final : public io::FileSystem {
 public:
  class File final : public io::RandomAccessFile {
   public:
    File(std::unique_ptr<io::RandomAccessFile> inner, std::atomic<int64_t>& bytes)
        : inner_(std::move(inner)), bytes_(bytes) {}
    void pread(uint64_t offset, void* dst, size_t n) const override {
      bytes_ += static_cast<int64_t>(n);
      inner_->pread(offset, dst, n);
    }
    uint64_t size() const override { return inner_->size(); }
    const std::string& path() const override { return inner_->path(); }

   private:
    std::unique_ptr<io::RandomAccessFile> inner_;
    std::atomic<int64_t>& bytes_;
  };
  std::unique_ptr<io::RandomAccessFile> open_for_read(const std::string& path) override {
    return std::make_unique<File>(base().open_for_read(path), bytes_read);
  }
  std::unique_ptr<io::WritableFile> open_for_write(const std::string& path) override {
    return base().open_for_write(path);
  }
  std::unique_ptr<io::WritableFile> open_for_append(const std::string& path) override {
    return base().open_for_append(path);
  }
  void rename_file(const std::string& a, const std::string& b) override {
    base().rename_file(a, b);
  }
  void remove_file(const std::string& p) override { base().remove_file(p); }
  void sync_dir(const std::string& d) override { base().sync_dir(d); }
  void create_dirs(const std::string& d) override { base().create_dirs(d); }
  bool exists(const std::string& p) override { return base().exists(p); }
  uint64_t file_size(const std::string& p) override { return base().file_size(p); }

  std::atomic<int64_t> bytes_read{0};

 private:
  static io::FileSystem& base() { return io::default_file_system(); }
};

// ---------------------------------------------------------------------------------------------
TEST(Data, ContractOnATensor) {
  // n = 18 tokens 0..17, T = 4: (18-1)/4 = 4 samples.
  auto stream = from_tensor(torch::arange(18, at::kLong), 100, "arange");
  Dataset ds(stream, 4);
  EXPECT_EQ(ds.num_samples(), 4);
  Batch b = ds.get({2, 0, 3});
  EXPECT_EQ(b.inputs.sizes().vec(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(to_vec(b.inputs[0]), range(8, 12));
  EXPECT_EQ(to_vec(b.targets[0]), range(9, 13));
  EXPECT_EQ(to_vec(b.inputs[1]), range(0, 4));
  EXPECT_EQ(to_vec(b.targets[2]), range(13, 17));
  EXPECT_EQ(b.indices, (std::vector<int64_t>{2, 0, 3}));
  EXPECT_THROW(ds.get({4}), std::out_of_range);
  // The last target must exist: n = 17 still gives 4 samples, n = 16 only 3.
  EXPECT_EQ(Dataset(from_tensor(torch::arange(17), 100), 4).num_samples(), 4);
  EXPECT_EQ(Dataset(from_tensor(torch::arange(16), 100), 4).num_samples(), 3);
  EXPECT_EQ(Dataset(from_tensor(torch::arange(1), 100), 4).num_samples(), 0);
  EXPECT_THROW(from_tensor(torch::arange(18), 17), ConfigError);
  EXPECT_THROW(Dataset(stream, 0), ConfigError);
}

TEST(Data, TextFileIsBytes) {
  TempDir dir;
  const std::string path = dir.file("t.txt");
  const std::string text = "hello, world\n\xff\x01 more text";
  write_bytes(path, text);
  auto stream = open_token_file(path);
  EXPECT_EQ(stream->vocab_size(), 256);
  EXPECT_EQ(stream->size(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(stream->name(), path);
  Dataset ds(stream, 5);
  EXPECT_EQ(ds.num_samples(), (static_cast<int64_t>(text.size()) - 1) / 5);
  Batch b = ds.get({2});
  std::vector<int64_t> want;
  for (int i = 10; i < 15; ++i) want.push_back(static_cast<unsigned char>(text[i]));
  EXPECT_EQ(to_vec(b.inputs[0]), want);
  EXPECT_EQ(to_vec(b.inputs[0])[3], 255);
  EXPECT_EQ(to_vec(b.targets[0])[2], 255);
  EXPECT_EQ(to_vec(b.targets[0])[3], 1);  // the byte after 0xff
  EXPECT_EQ(to_vec(b.targets[0])[4], ' ');
  EXPECT_THROW(open_token_file(path, 1000), ConfigError);
  EXPECT_THROW(open_text_file(dir.file("missing.txt")), IoError);
}

TEST(Data, BinFileIsLittleEndianUint16) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  std::vector<uint16_t> toks = {1, 2, 300, 65535, 7, 0, 9, 40000, 5};
  write_bytes(path, std::string(reinterpret_cast<const char*>(toks.data()), toks.size() * 2));
  auto scanned = open_token_file(path);  // vocab from a scan: largest id + 1
  EXPECT_EQ(scanned->vocab_size(), 65536);
  EXPECT_EQ(scanned->size(), 9);
  EXPECT_EQ(to_vec(scanned->read(2, 3)), (std::vector<int64_t>{300, 65535, 7}));
  Dataset ds(scanned, 4);
  EXPECT_EQ(ds.num_samples(), 2);
  EXPECT_EQ(to_vec(ds.get({1}).targets[0]), (std::vector<int64_t>{0, 9, 40000, 5}));

  // An explicit vocabulary is enforced on every read, naming the file and the position.
  auto small = open_token_file(path, 1000);
  EXPECT_EQ(to_vec(small->read(0, 3)), (std::vector<int64_t>{1, 2, 300}));
  std::string e = error_of([&] { small->read(0, 5); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("token 3 has id 65535, not below vocab_size 1000"), std::string::npos) << e;
  EXPECT_THROW(small->read(0, 5), ConfigError);

  // An odd byte length is not a file of uint16 tokens.
  write_bytes(path, std::string("\x01\x00\x02", 3));
  e = error_of([&] { open_bin_file(path, 10); });
  EXPECT_NE(e.find("3 bytes, an odd number"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_THROW(open_bin_file(path, 10), IoError);
  EXPECT_THROW(open_bin_file(path, 70000), ConfigError);
}

TEST(Data, FileTooShortForOneBatchIsAClearError) {
  TempDir dir;
  const std::string path = dir.file("short.txt");
  write_bytes(path, std::string(20, 'a'));
  BatchLayout layout{/*train_batch_size=*/4, /*micro_batch_size=*/2, /*world_size=*/2,
                     /*gradient_accumulation_steps=*/1};
  std::string e = error_of([&] { Loader(Dataset(open_token_file(path), 8), layout); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("has 20 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("T=8"), std::string::npos) << e;
  EXPECT_NE(e.find("= 2 samples"), std::string::npos) << e;
  EXPECT_NE(e.find("train_batch_size=4"), std::string::npos) << e;
  EXPECT_NE(e.find("at least 33 tokens"), std::string::npos) << e;
  EXPECT_THROW(Loader(Dataset(open_token_file(path), 8), layout), ConfigError);
  // An empty file: no sample at all.
  write_bytes(path, "");
  EXPECT_THROW(Loader(Dataset(open_token_file(path), 8), layout), ConfigError);
  // 33 bytes is exactly enough.
  write_bytes(path, std::string(33, 'a'));
  EXPECT_NO_THROW(Loader(Dataset(open_token_file(path), 8), layout));
}

TEST(Data, ARankReadsOnlyItsOwnSamples) {
  TempDir dir;
  const std::string path = dir.file("big.txt");
  write_bytes(path, std::string(100000, 'x'));
  CountingFileSystem counting;
  BatchLayout layout{/*train_batch_size=*/16, /*micro_batch_size=*/2, /*world_size=*/4,
                     /*gradient_accumulation_steps=*/2};
  Loader loader(Dataset(open_token_file(path, 0, &counting), 32), layout);
  counting.bytes_read = 0;
  Batch b = loader.micro_batch(3, 1, 1);
  EXPECT_EQ(counting.bytes_read.load(), 2 * 33);  // b samples of T+1 bytes each
  EXPECT_EQ(b.inputs.sizes().vec(), (std::vector<int64_t>{2, 32}));
}

// ---------------------------------------------------------------------------------------------
TEST(Data, BatchSplitWithoutShuffle) {
  {
    // B=8 = b 2 * world 2 * gas 2, plenty of samples: rank r, micro k gets [(k*2+r)*2, +2).
    Sampler s(100, {8, 2, 2, 2});
    EXPECT_EQ(s.micro_batch_indices(0, 0, 0), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(s.micro_batch_indices(0, 1, 0), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(s.micro_batch_indices(0, 0, 1), (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(s.micro_batch_indices(0, 1, 1), (std::vector<int64_t>{6, 7}));
    EXPECT_EQ(s.micro_batch_indices(3, 1, 1), (std::vector<int64_t>{30, 31}));
    EXPECT_EQ(s.step_indices(2), range(16, 24));
    EXPECT_THROW(s.micro_batch_indices(0, 2, 0), std::out_of_range);
    EXPECT_THROW(s.micro_batch_indices(0, 0, 2), std::out_of_range);
  }
  {
    // Wrap-around: 10 samples, B=4 over 4 ranks: step 2 is positions 8..11 = samples 8,9,0,1.
    Sampler s(10, {4, 1, 4, 1});
    EXPECT_EQ(s.step_indices(2), (std::vector<int64_t>{8, 9, 0, 1}));
    EXPECT_EQ(s.micro_batch_indices(2, 2, 0), (std::vector<int64_t>{0}));
    EXPECT_EQ(s.micro_batch_indices(2, 3, 0), (std::vector<int64_t>{1}));
    EXPECT_EQ(s.micro_batch_indices(5, 0, 0), (std::vector<int64_t>{0}));  // position 20
  }
  {
    // 3 ranks, 7 samples, B=6: step 1 is positions 6..11; rank 2 gets 10, 11 = samples 3, 4.
    Sampler s(7, {6, 2, 3, 1});
    EXPECT_EQ(s.micro_batch_indices(1, 2, 0), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(s.micro_batch_indices(1, 0, 0), (std::vector<int64_t>{6, 0}));
  }
  {
    // One rank, GAS 4, b 3: micro-step k takes [3k, 3k+3) of the step.
    Sampler s(50, {12, 3, 1, 4});
    EXPECT_EQ(s.micro_batch_indices(1, 0, 3), (std::vector<int64_t>{21, 22, 23}));
  }
  // Whatever the layout, the micro-batches of a step partition the step's positions.
  for (BatchLayout l : {BatchLayout{8, 2, 2, 2}, BatchLayout{12, 3, 2, 2}, BatchLayout{6, 1, 3, 2},
                        BatchLayout{5, 5, 1, 1}}) {
    Sampler s(13, l);
    for (int64_t step : {0, 1, 7}) {
      std::vector<int64_t> seen;
      for (int64_t k = 0; k < l.gradient_accumulation_steps; ++k)
        for (int64_t r = 0; r < l.world_size; ++r)
          for (int64_t j : s.micro_batch_indices(step, r, k)) seen.push_back(j);
      EXPECT_EQ(seen, s.step_indices(step));
    }
  }
}

TEST(Data, BatchLayoutMustMultiplyOut) {
  std::string e = error_of([] { Sampler(100, {8, 3, 2, 1}); });
  EXPECT_NE(e.find("train_batch_size (8) != train_micro_batch_size_per_gpu (3) * world_size (2) * "
                   "gradient_accumulation_steps (1) = 6"),
            std::string::npos)
      << e;
  EXPECT_THROW(Sampler(100, {0, 0, 1, 1}), ConfigError);
  EXPECT_THROW(Sampler(0, {1, 1, 1, 1}), ConfigError);
}

TEST(Data, ShuffleIsASeededPermutationPerEpoch) {
  const int64_t n = 24;
  Sampler a(n, {8, 2, 2, 2}, /*shuffle=*/true, /*seed=*/11);
  Sampler b(n, {8, 2, 2, 2}, /*shuffle=*/true, /*seed=*/11);
  Sampler other(n, {8, 2, 2, 2}, /*shuffle=*/true, /*seed=*/12);
  const auto p0 = a.permutation(0), p1 = a.permutation(1);
  EXPECT_EQ(std::set<int64_t>(p0.begin(), p0.end()).size(), static_cast<size_t>(n));
  EXPECT_EQ(std::set<int64_t>(p1.begin(), p1.end()).size(), static_cast<size_t>(n));
  EXPECT_NE(p0, range(0, n));
  EXPECT_NE(p0, p1);
  EXPECT_NE(p0, other.permutation(0));
  // Epoch 0 = steps 0..2, each sample once; step 3 starts epoch 1.
  std::vector<int64_t> epoch0;
  for (int64_t s = 0; s < 3; ++s) {
    auto idx = a.step_indices(s);
    epoch0.insert(epoch0.end(), idx.begin(), idx.end());
  }
  EXPECT_EQ(epoch0, p0);
  EXPECT_EQ(a.step_indices(3), std::vector<int64_t>(p1.begin(), p1.begin() + 8));
  // Every rank (another Sampler instance, asked in another order) agrees.
  EXPECT_EQ(b.micro_batch_indices(4, 1, 1), a.micro_batch_indices(4, 1, 1));
  EXPECT_EQ(b.micro_batch_indices(0, 0, 0), (std::vector<int64_t>{p0[0], p0[1]}));
  // Pinned values: the permutation is part of the data contract (gpt_reference.py reproduces
  // it); a change here changes every shuffled run.
  Sampler pinned(10, {1, 1, 1, 1}, true, 1234);
  EXPECT_EQ(pinned.permutation(0), (std::vector<int64_t>{2, 0, 7, 8, 4, 3, 1, 5, 9, 6}));
}

// ---------------------------------------------------------------------------------------------
TEST(Data, ReverseTaskLayout) {
  ReverseTaskOptions o;  // defaults: 8 digits of 10 symbols
  EXPECT_EQ(o.vocab_size(), 12);
  EXPECT_EQ(o.block_size(), 18);
  o.num_problems = 100;
  auto task = std::make_shared<ReverseTask>(o);
  EXPECT_EQ(task->size(), 100 * 18 + 1);
  Dataset ds(task, o.block_size());
  EXPECT_EQ(ds.num_samples(), 100);
  Batch b = ds.get({0, 37, 99});
  for (int i = 0; i < 3; ++i) {
    auto in = to_vec(b.inputs[i]), tg = to_vec(b.targets[i]);
    const auto d = task->digits(b.indices[i]);
    ASSERT_EQ(d.size(), 8u);
    EXPECT_EQ(in[0], 10);  // BOS
    EXPECT_EQ(in[9], 11);  // SEP
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(in[1 + j], d[j]);
      EXPECT_EQ(in[10 + j], d[7 - j]);
      EXPECT_LT(d[j], 10);
    }
    EXPECT_EQ(tg[17], 10);  // the next problem's BOS (or the final one)
    EXPECT_EQ(std::vector<int64_t>(in.begin() + 1, in.end()),
              std::vector<int64_t>(tg.begin(), tg.end() - 1));
  }
  EXPECT_EQ(to_vec(task->answer_mask().to(at::kLong)),
            (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  // read() across problem boundaries equals the problems laid end to end.
  auto p3 = task->problem(3), p4 = task->problem(4);
  auto r = to_vec(task->read(3 * 18 + 10, 12));
  EXPECT_EQ(std::vector<int64_t>(r.begin(), r.begin() + 8),
            std::vector<int64_t>(p3.begin() + 10, p3.end()));
  EXPECT_EQ(std::vector<int64_t>(r.begin() + 8, r.end()),
            std::vector<int64_t>(p4.begin(), p4.begin() + 4));
  EXPECT_THROW(ReverseTask(ReverseTaskOptions{0}), ConfigError);
  EXPECT_THROW(ReverseTask(ReverseTaskOptions{20, 10}), ConfigError);
}

TEST(Data, ReverseTaskIsDeterministicPerSeed) {
  ReverseTaskOptions o;
  o.num_problems = 500;
  o.seed = 5;
  ReverseTask a(o), b(o);
  o.seed = 6;
  ReverseTask c(o);
  EXPECT_TRUE(a.read(0, a.size()).equal(b.read(0, b.size())));
  EXPECT_FALSE(a.read(0, a.size()).equal(c.read(0, c.size())));
  // Random access gives the same problem as a sequential read.
  EXPECT_EQ(a.problem(321), to_vec(a.read(321 * 18, 18)));
  // Digits look uniform: each symbol about 1/10 of 4000 draws.
  auto counts = torch::zeros({10}, at::kLong);
  for (int64_t j = 0; j < 500; ++j)
    for (auto d : a.digits(j)) counts[d] += 1;
  EXPECT_GT(counts.min().item<int64_t>(), 300);
  EXPECT_LT(counts.max().item<int64_t>(), 500);
}

TEST(Data, ReverseTaskHeldOutSetIsDisjoint) {
  ReverseTaskOptions train;
  train.num_problems = 20000;
  train.num_digits = 4;  // only 10^4 strings: a held-out set drawn from the same space would
                         // almost surely collide with 20000 training problems
  const ReverseTaskOptions held = train.held_out_set(2000);
  EXPECT_NE(held.seed, train.seed);
  EXPECT_TRUE(held.held_out);
  ReverseTask t(train), h(held);
  std::set<std::vector<int64_t>> train_set, held_set;
  for (int64_t j = 0; j < train.num_problems; ++j) train_set.insert(t.digits(j));
  for (int64_t j = 0; j < held.num_problems; ++j) held_set.insert(h.digits(j));
  for (const auto& d : held_set) {
    EXPECT_EQ(train_set.count(d), 0u);
    EXPECT_TRUE(ReverseTask::is_held_out(d, 10));
  }
  // About 1 in 8 of all strings is held out, and the training draws cover the rest.
  int64_t held_strings = 0;
  for (int64_t v = 0; v < 10000; ++v) {
    std::vector<int64_t> d = {v / 1000, v / 100 % 10, v / 10 % 10, v % 10};
    held_strings += ReverseTask::is_held_out(d, 10);
  }
  EXPECT_NEAR(static_cast<double>(held_strings) / 10000, 0.125, 0.015);
  // 2000 draws from the ~1250 held-out strings: most of them are seen.
  EXPECT_GT(held_set.size(), 900u);
}

TEST(Data, AccuracyCountsOnlyAnswerPositions) {
  ReverseTaskOptions o;
  o.num_problems = 50;
  ReverseTask task(o);
  const int64_t v = o.vocab_size();
  // An oracle on the answer positions that is wrong everywhere else.
  auto oracle = [&](int wrong_answer_pos) {
    return [&task, v, wrong_answer_pos](const at::Tensor& idx) {
      at::Tensor targets = torch::cat(
          {idx.narrow(1, 1, idx.size(1) - 1), torch::full({idx.size(0), 1}, task.bos(), at::kLong)},
          1);
      at::Tensor pred = (targets + 1) % v;  // wrong
      at::Tensor mask = task.answer_mask();
      pred.index_put_({at::indexing::Slice(), mask}, targets.index({at::indexing::Slice(), mask}));
      if (wrong_answer_pos >= 0) {
        const int64_t p = task.options().num_digits + 1 + wrong_answer_pos;
        pred.index_put_({at::indexing::Slice(), p},
                        (targets.index({at::indexing::Slice(), p}) + 1) % v);
      }
      return torch::one_hot(pred, v).to(at::kFloat);
    };
  };
  Accuracy a = accuracy(oracle(-1), task, 50, 7);
  EXPECT_EQ(a.token_accuracy, 1.0);
  EXPECT_EQ(a.sequence_accuracy, 1.0);
  EXPECT_EQ(a.problems, 50);
  EXPECT_EQ(a.tokens, 400);
  Accuracy b = accuracy(oracle(2), task, 50, 64);
  EXPECT_DOUBLE_EQ(b.token_accuracy, 7.0 / 8.0);
  EXPECT_EQ(b.sequence_accuracy, 0.0);
  EXPECT_THROW(accuracy(oracle(-1), task, 51), ConfigError);
}

TEST(Data, ReverseTaskIsLearntByASmallGPT) {
  at::set_num_threads(1);
  ReverseTaskOptions o;
  o.seed = 3;
  auto task = std::make_shared<ReverseTask>(o);
  ReverseTask held(o.held_out_set(500));
  models::GPT model(models::GPTConfig{o.vocab_size(), o.block_size(), 2, 4, 64}, 42);
  const double before = accuracy(*model, held, 500).token_accuracy;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0));
  Loader loader(Dataset(task, o.block_size()), {32, 32, 1, 1});
  for (int64_t step = 0; step < 150; ++step) {
    Batch b = loader.micro_batch(step, 0, 0);
    opt.zero_grad();
    model->loss(b.inputs, b.targets).backward();
    opt.step();
  }
  Accuracy after = accuracy(*model, held, 500);
  EXPECT_LT(before, 0.3);
  EXPECT_GE(after.token_accuracy, 0.95) << "sequence accuracy " << after.sequence_accuracy;
}

}  // namespace
}  // namespace dscpp::data
