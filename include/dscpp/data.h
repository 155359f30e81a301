// Training data for the built-in GPT: a token stream (a text file's bytes, a .bin of uint16
// tokens, an in-memory tensor, or the built-in reverse task generated on the fly), cut into
// samples by the data contract, and the sampler that says which samples each rank and
// micro-step of an optimizer step trains on. Every rank computes the same plan and reads only
// its own samples (files are read with pread of the needed slices; the task generates only the
// problems asked for). Deterministic per seed, identical on every rank.
//
// NOTE [data contract]: with n tokens tok[0..n) and block size T, sample j (0 <= j < (n-1)/T)
// is inputs tok[j*T, j*T+T) and targets tok[j*T+1, j*T+T+1). num_samples = (n-1)/T (integer
// division). tests/golden/gpt_reference.py implements the same contract.
//
// NOTE [batch split]: optimizer step s trains on global positions p = s*B + i, i in [0, B)
// (B = train_batch_size). Position p is sample p mod num_samples without shuffling, or
// perm_e[p mod num_samples] with e = p / num_samples when shuffling, perm_e being a permutation
// of the samples drawn from (seed, e). Rank r's micro-step k (0 <= k < gradient_accumulation_
// steps) takes i in [(k*world_size + r)*b, (k*world_size + r)*b + b), b = micro batch per GPU.
// So one micro-step of all ranks together covers a contiguous run of b*world_size positions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dscpp::io {
class FileSystem;
}
namespace dscpp::models {
class GPTImpl;
}

namespace dscpp::data {

// ---------------------------------------------------------------------------------------------
// Token streams.

// A read-only sequence of token ids with random access. Implementations are thread-safe.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  // Number of tokens n.
  virtual int64_t size() const = 0;
  // Token ids lie in [0, vocab_size).
  virtual int64_t vocab_size() const = 0;
  // Tokens [begin, begin + count) as int64 [count] on the CPU. Throws IoError when a file read
  // fails, ConfigError when a token id is >= vocab_size (naming the file and the position), and
  // std::out_of_range when the range is outside [0, size()).
  virtual at::Tensor read(int64_t begin, int64_t count) const = 0;
  // For messages: the file path, or a description of the generated task.
  virtual std::string name() const = 0;
};

// The bytes of a text file as tokens, vocab 256. Throws IoError when it cannot be opened.
std::shared_ptr<TokenStream> open_text_file(const std::string& path, io::FileSystem* fs = nullptr);

// Raw little-endian uint16 tokens. vocab_size > 0: ids must be below it (checked as they are
// read). vocab_size == 0: the file is scanned once and vocab_size = largest id + 1. Throws
// IoError for an odd byte length or an unreadable file, ConfigError for an id >= vocab_size.
std::shared_ptr<TokenStream> open_bin_file(const std::string& path, int64_t vocab_size = 0,
                                           io::FileSystem* fs = nullptr);

// By extension: ".bin" -> open_bin_file(path, vocab_size), anything else -> open_text_file
// (vocab_size must then be 0 or 256). Throws ConfigError for a vocab_size that does not fit.
std::shared_ptr<TokenStream> open_token_file(const std::string& path, int64_t vocab_size = 0,
                                             io::FileSystem* fs = nullptr);

// An in-memory stream over a 1-D integer tensor (copied to int64 on the CPU). Throws
// ConfigError when an id is outside [0, vocab_size).
std::shared_ptr<TokenStream> from_tensor(const at::Tensor& tokens, int64_t vocab_size,
                                         std::string name = "<tensor>");

// ---------------------------------------------------------------------------------------------
// The built-in task.
//
// NOTE [built-in task]: reverse a random string of num_digits symbols. Problem j is
//   [BOS, d_1 .. d_k, SEP, d_k .. d_1]           (T = 2k + 2 tokens, k = num_digits)
// with symbols 0..num_symbols-1, BOS = num_symbols, SEP = num_symbols + 1 (vocab_size =
// num_symbols + 2). The stream is the problems back to back plus one final BOS, so with block
// size T sample j is exactly problem j (its last target is the next problem's BOS). The answer
// is the targets at input positions k+1 .. 2k (inputs SEP, d_k .. d_2). The digits are
// unpredictable, so the best possible loss is k*ln(num_symbols)/T; a model that has learnt the
// task gets the answers right, which accuracy() measures.
// Every string belongs either to the training or to the held-out half of the problem space (a
// fixed hash of the string, 1 in 8 held out, independent of the seed), so a held-out set never
// shares a problem with any training set. Problem j of a seed is generated from
// splitmix64(seed, j) alone (random access, nothing materialised).
struct ReverseTaskOptions {
  // Digits per problem (k). In [1, 16].
  int64_t num_digits = 8;
  // Alphabet size. In [2, 1000]; num_digits * log2(num_symbols) <= 63.
  int64_t num_symbols = 10;
  // Problems (= samples) in the stream. > 0.
  int64_t num_problems = 1 << 20;
  // Seed of the problem stream.
  uint64_t seed = 1234;
  // Draw from the held-out half of the problem space instead of the training half.
  bool held_out = false;

  int64_t vocab_size() const { return num_symbols + 2; }
  int64_t block_size() const { return 2 * num_digits + 2; }
  // Throws ConfigError for a value out of range.
  void validate() const;
  // The held-out set for a training task: a different seed (derived from this one) and the
  // held-out half of the problem space.
  ReverseTaskOptions held_out_set(int64_t problems) const;
};

class ReverseTask final : public TokenStream {
 public:
  explicit ReverseTask(const ReverseTaskOptions& options);

  int64_t size() const override { return options_.num_problems * block_size() + 1; }
  int64_t vocab_size() const override { return options_.vocab_size(); }
  at::Tensor read(int64_t begin, int64_t count) const override;
  std::string name() const override;

  const ReverseTaskOptions& options() const { return options_; }
  int64_t block_size() const { return options_.block_size(); }
  int64_t bos() const { return options_.num_symbols; }
  int64_t sep() const { return options_.num_symbols + 1; }
  // The k digits of problem j (0 <= j < num_problems).
  std::vector<int64_t> digits(int64_t j) const;
  // Problem j's T tokens.
  std::vector<int64_t> problem(int64_t j) const;
  // [T] bool: true at the input positions whose target is an answer digit (k+1 .. 2k).
  at::Tensor answer_mask() const;
  // Whether a digit string is in the held-out half of the problem space.
  static bool is_held_out(const std::vector<int64_t>& digits, int64_t num_symbols);

 private:
  ReverseTaskOptions options_;
};

struct Accuracy {
  double token_accuracy = 0;     // answer tokens predicted right / answer tokens
  double sequence_accuracy = 0;  // problems with every answer token right / problems
  int64_t problems = 0;
  int64_t tokens = 0;
};

// Held-out accuracy of a model on the first `problems` problems of `task` (normally a held-out
// set, see ReverseTaskOptions::held_out_set): the inputs are fed whole (teacher forcing) and the
// greedy argmax of the logits at the answer positions is compared with the targets. `logits_of`
// maps idx [n, T] int64 (CPU) to logits [n, T, V]; it is called in chunks of `batch_size`
// problems under NoGradGuard. Throws ConfigError when problems > the task's size.
Accuracy accuracy(const std::function<at::Tensor(const at::Tensor&)>& logits_of,
                  const ReverseTask& task, int64_t problems, int64_t batch_size = 256);
// The same for a GPT on its own (switched to eval mode and back; its parameters' device is
// used for the inputs).
Accuracy accuracy(models::GPTImpl& model, const ReverseTask& task, int64_t problems,
                  int64_t batch_size = 256);

// ---------------------------------------------------------------------------------------------
// Samples and batches.

struct Batch {
  at::Tensor inputs;             // [b, T] int64, CPU
  at::Tensor targets;            // [b, T] int64, CPU
  std::vector<int64_t> indices;  // the b sample indices
};

// A token stream cut into samples of block size T (NOTE [data contract]).
class Dataset {
 public:
  // Throws ConfigError when block_size < 1.
  Dataset(std::shared_ptr<const TokenStream> tokens, int64_t block_size);

  int64_t num_samples() const { return (tokens_->size() - 1) / block_size_; }
  int64_t block_size() const { return block_size_; }
  int64_t vocab_size() const { return tokens_->vocab_size(); }
  const TokenStream& tokens() const { return *tokens_; }
  // Throws ConfigError naming the data, its token count, T and the tokens needed when it holds
  // fewer samples than one optimizer step (num_samples < train_batch_size).
  void check_holds_one_step(int64_t train_batch_size) const;
  // The samples `indices`, reading only their T+1 tokens each. Throws std::out_of_range for an
  // index outside [0, num_samples), and what TokenStream::read throws.
  Batch get(const std::vector<int64_t>& indices) const;

 private:
  std::shared_ptr<const TokenStream> tokens_;
  int64_t block_size_;
};

// The batch triangle as the engine resolved it.
struct BatchLayout {
  int64_t train_batch_size = 0;             // B, samples per optimizer step (all ranks)
  int64_t micro_batch_size = 0;             // b, train_micro_batch_size_per_gpu
  int64_t world_size = 1;                   // data-parallel ranks
  int64_t gradient_accumulation_steps = 1;  // micro-steps per optimizer step
  // Throws ConfigError unless every value is > 0 and B == b * world_size * GAS.
  void validate() const;
};

// Which samples each optimizer step, rank and micro-step uses (NOTE [batch split]).
// Thread-safe; the shuffled permutation of the current epoch is cached.
class Sampler {
 public:
  // Throws ConfigError for an invalid layout or num_samples < 1.
  Sampler(int64_t num_samples, BatchLayout layout, bool shuffle = false, uint64_t seed = 0);

  // The sample at global position p = step * B + i.
  int64_t sample_at(int64_t position) const;
  // The B samples of optimizer step `step` (0-based), in position order.
  std::vector<int64_t> step_indices(int64_t step) const;
  // The b samples of rank `rank`'s micro-step `micro_step` in optimizer step `step`. Throws
  // std::out_of_range for a rank or micro-step outside the layout.
  std::vector<int64_t> micro_batch_indices(int64_t step, int64_t rank, int64_t micro_step) const;

  int64_t num_samples() const { return num_samples_; }
  const BatchLayout& layout() const { return layout_; }
  // The permutation of epoch e (shuffling only; the identity otherwise), as the sampler uses it.
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  int64_t num_samples_;
  BatchLayout layout_;
  bool shuffle_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

// A Dataset and a Sampler together: what a training loop asks for one micro-batch.
class Loader {
 public:
  // Throws ConfigError when the data holds fewer samples than one optimizer step
  // (Dataset::check_holds_one_step).
  Loader(Dataset dataset, BatchLayout layout, bool shuffle = false, uint64_t seed = 0);

  // Rank `rank`'s micro-batch `micro_step` of optimizer step `step`: [b, T] inputs and targets.
  Batch micro_batch(int64_t step, int64_t rank, int64_t micro_step) const;
  const Dataset& dataset() const { return dataset_; }
  const Sampler& sampler() const { return sampler_; }

 private:
  Dataset dataset_;
  Sampler sampler_;
};

}  // namespace dscpp::data
