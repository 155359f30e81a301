// Dataset (NOTE [data contract]), BatchLayout, Sampler (NOTE [batch split]) and Loader. The
// shuffled order is a Fisher-Yates permutation per epoch from SplitMix64(seed, "shuf", epoch),
// reproduced by gpt_reference.py.
#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "data/rng.h"
#include "dscpp/data.h"
#include "dscpp/error.h"

namespace dscpp::data {

Dataset::Dataset(std::shared_ptr<const TokenStream> tokens, int64_t block_size)
    : tokens_(std::move(tokens)), block_size_(block_size) {
  DSCPP_CHECK(tokens_ != nullptr, ConfigError, "Dataset needs a token stream");
  DSCPP_CHECK(block_size_ >= 1, ConfigError, "block size must be >= 1, got ", block_size_);
}

void Dataset::check_holds_one_step(int64_t train_batch_size) const {
  const int64_t n = tokens_->size(), t = block_size_;
  const int64_t need = train_batch_size * t + 1;
  DSCPP_CHECK(num_samples() >= train_batch_size, ConfigError, "the data '", tokens_->name(),
              "' has ", n, " tokens: with block size T=", t, " that is (n-1)/T = ", num_samples(),
              " samples, fewer than one optimizer step needs (train_batch_size=",
              train_batch_size, " samples, i.e. at least ", need,
              " tokens). HINT: use a longer file, a smaller block size or a smaller "
              "train_batch_size.");
}

Batch Dataset::get(const std::vector<int64_t>& indices) const {
  const int64_t b = static_cast<int64_t>(indices.size()), t = block_size_, n = num_samples();
  at::Tensor rows = at::empty({b, t + 1}, at::kLong);  // [b, T+1]
  for (int64_t i = 0; i < b; ++i) {
    const int64_t j = indices[i];
    DSCPP_CHECK(j >= 0 && j < n, std::out_of_range, "sample ", j, " is outside '", tokens_->name(),
                "' (", n, " samples of block size ", t, ")");
    rows[i].copy_(tokens_->read(j * t, t + 1));
  }
  Batch batch;
  batch.inputs = rows.narrow(1, 0, t).contiguous();
  batch.targets = rows.narrow(1, 1, t).contiguous();
  batch.indices = indices;
  return batch;
}

void BatchLayout::validate() const {
  DSCPP_CHECK(train_batch_size > 0 && micro_batch_size > 0 && world_size > 0 &&
                  gradient_accumulation_steps > 0,
              ConfigError, "batch layout must be positive: train_batch_size=", train_batch_size,
              " micro_batch_size=", micro_batch_size, " world_size=", world_size,
              " gradient_accumulation_steps=", gradient_accumulation_steps);
  DSCPP_CHECK(train_batch_size == micro_batch_size * world_size * gradient_accumulation_steps,
              ConfigError, "train_batch_size (", train_batch_size,
              ") != train_micro_batch_size_per_gpu (", micro_batch_size, ") * world_size (",
              world_size, ") * gradient_accumulation_steps (", gradient_accumulation_steps,
              ") = ", micro_batch_size * world_size * gradient_accumulation_steps);
}

Sampler::Sampler(int64_t num_samples, BatchLayout layout, bool shuffle, uint64_t seed)
    : num_samples_(num_samples), layout_(layout), shuffle_(shuffle), seed_(seed) {
  layout_.validate();
  DSCPP_CHECK(num_samples_ >= 1, ConfigError,
              "the data has no sample (num_samples = ", num_samples_, ")");
}

std::vector<int64_t> Sampler::permutation(int64_t epoch) const {
  std::vector<int64_t> perm(num_samples_);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (!shuffle_) return perm;
  SplitMix64 rng(seed_, kShuffleStream, static_cast<uint64_t>(epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

int64_t Sampler::sample_at(int64_t position) const {
  DSCPP_CHECK(position >= 0, std::out_of_range, "negative sample position ", position);
  const int64_t offset = position % num_samples_;
  if (!shuffle_) return offset;
  const int64_t epoch = position / num_samples_;
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != cached_epoch_) {
    cached_perm_ = permutation(epoch);
    cached_epoch_ = epoch;
  }
  return cached_perm_[offset];
}

std::vector<int64_t> Sampler::step_indices(int64_t step) const {
  std::vector<int64_t> out(layout_.train_batch_size);
  for (int64_t i = 0; i < layout_.train_batch_size; ++i) {
    out[i] = sample_at(step * layout_.train_batch_size + i);
  }
  return out;
}

std::vector<int64_t> Sampler::micro_batch_indices(int64_t step, int64_t rank,
                                                  int64_t micro_step) const {
  DSCPP_CHECK(rank >= 0 && rank < layout_.world_size, std::out_of_range, "rank ", rank,
              " outside world_size ", layout_.world_size);
  DSCPP_CHECK(micro_step >= 0 && micro_step < layout_.gradient_accumulation_steps,
              std::out_of_range, "micro-step ", micro_step, " outside gradient_accumulation_steps ",
              layout_.gradient_accumulation_steps);
  const int64_t b = layout_.micro_batch_size;
  const int64_t first =
      step * layout_.train_batch_size + (micro_step * layout_.world_size + rank) * b;
  std::vector<int64_t> out(b);
  for (int64_t i = 0; i < b; ++i) out[i] = sample_at(first + i);
  return out;
}

Loader::Loader(Dataset dataset, BatchLayout layout, bool shuffle, uint64_t seed)
    : dataset_(std::move(dataset)),
      sampler_((layout.validate(), std::max<int64_t>(dataset_.num_samples(), 1)), layout, shuffle,
               seed) {
  dataset_.check_holds_one_step(layout.train_batch_size);
}

Batch Loader::micro_batch(int64_t step, int64_t rank, int64_t micro_step) const {
  return dataset_.get(sampler_.micro_batch_indices(step, rank, micro_step));
}

}  // namespace dscpp::data
