// The built-in reverse task (NOTE [built-in task] in include/dscpp/data.h) and its held-out
// accuracy. Problems are generated on demand from (seed, j); gpt_reference.py's
// `reverse_task_tokens` is the Python twin and the Golden tests compare the two.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "data/rng.h"
#include "dscpp/data.h"
#include "dscpp/error.h"
#include "dscpp/models/gpt.h"

namespace dscpp::data {
namespace {
constexpr uint64_t kHeldOutBuckets = 8;              // 1 in 8 strings is held out
constexpr uint64_t kPartitionKey = 0x5EEDF00Dull;    // fixed: the partition ignores the seed
constexpr uint64_t kHeldOutSeedKey = 0x686F6C64ull;  // "hold": derives the held-out seed
}  // namespace

void ReverseTaskOptions::validate() const {
  DSCPP_CHECK(num_digits >= 1 && num_digits <= 16, ConfigError,
              "reverse task num_digits must be in [1, 16], got ", num_digits);
  DSCPP_CHECK(num_symbols >= 2 && num_symbols <= 1000, ConfigError,
              "reverse task num_symbols must be in [2, 1000], got ", num_symbols);
  DSCPP_CHECK(static_cast<double>(num_digits) * std::log2(static_cast<double>(num_symbols)) <= 63,
              ConfigError, "reverse task: num_symbols^num_digits = ", num_symbols, "^", num_digits,
              " does not fit in 63 bits");
  DSCPP_CHECK(num_problems > 0, ConfigError, "reverse task num_problems must be > 0, got ",
              num_problems);
}

ReverseTaskOptions ReverseTaskOptions::held_out_set(int64_t problems) const {
  ReverseTaskOptions o = *this;
  o.seed = mix64(seed ^ kHeldOutSeedKey);
  o.held_out = true;
  o.num_problems = problems;
  return o;
}

ReverseTask::ReverseTask(const ReverseTaskOptions& options) : options_(options) {
  options_.validate();
}

std::string ReverseTask::name() const {
  return detail::str_cat("built-in reverse task (", options_.held_out ? "held-out, " : "",
                         options_.num_digits, " symbols of ", options_.num_symbols, ", ",
                         options_.num_problems, " problems, seed ", options_.seed, ")");
}

bool ReverseTask::is_held_out(const std::vector<int64_t>& digits, int64_t num_symbols) {
  uint64_t v = 0;
  for (int64_t d : digits) v = v * static_cast<uint64_t>(num_symbols) + static_cast<uint64_t>(d);
  return mix64(v ^ kPartitionKey) % kHeldOutBuckets == 0;
}

std::vector<int64_t> ReverseTask::digits(int64_t j) const {
  DSCPP_CHECK(j >= 0 && j < options_.num_problems, std::out_of_range, "problem ", j, " is outside ",
              name());
  // Draw strings from the stream of (seed, j) until one falls in this task's half.
  SplitMix64 rng(options_.seed, kTaskStream, static_cast<uint64_t>(j));
  std::vector<int64_t> d(options_.num_digits);
  do {
    for (auto& x : d) x = static_cast<int64_t>(rng.below(options_.num_symbols));
  } while (is_held_out(d, options_.num_symbols) != options_.held_out);
  return d;
}

std::vector<int64_t> ReverseTask::problem(int64_t j) const {
  const auto d = digits(j);
  std::vector<int64_t> p;
  p.reserve(block_size());
  p.push_back(bos());
  p.insert(p.end(), d.begin(), d.end());
  p.push_back(sep());
  p.insert(p.end(), d.rbegin(), d.rend());
  return p;
}

at::Tensor ReverseTask::read(int64_t begin, int64_t count) const {
  DSCPP_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), std::out_of_range, "tokens [",
              begin, ", ", begin + count, ") are outside ", name(), " (", size(), " tokens)");
  at::Tensor out = at::empty({count}, at::kLong);
  auto* dst = out.data_ptr<int64_t>();
  const int64_t t = block_size();
  int64_t cached = -1;
  std::vector<int64_t> prob;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t pos = begin + i, j = pos / t;
    if (j == options_.num_problems) {  // the final BOS
      dst[i] = bos();
      continue;
    }
    if (j != cached) {
      prob = problem(j);
      cached = j;
    }
    dst[i] = prob[pos % t];
  }
  return out;
}

at::Tensor ReverseTask::answer_mask() const {
  const int64_t k = options_.num_digits;
  at::Tensor m = at::zeros({block_size()}, at::kBool);
  m.narrow(0, k + 1, k).fill_(true);
  return m;
}

Accuracy accuracy(const std::function<at::Tensor(const at::Tensor&)>& logits_of,
                  const ReverseTask& task, int64_t problems, int64_t batch_size) {
  DSCPP_CHECK(problems > 0 && problems <= task.options().num_problems, ConfigError,
              "accuracy over ", problems, " problems, but ", task.name(), " has ",
              task.options().num_problems);
  DSCPP_CHECK(batch_size > 0, ConfigError, "accuracy batch_size must be > 0");
  at::NoGradGuard no_grad;
  Dataset ds(std::make_shared<ReverseTask>(task), task.block_size());
  const at::Tensor mask = task.answer_mask();  // [T] bool
  const int64_t k = task.options().num_digits;
  int64_t right_tokens = 0, right_problems = 0;
  for (int64_t b = 0; b < problems; b += batch_size) {
    std::vector<int64_t> idx(std::min(batch_size, problems - b));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = b + static_cast<int64_t>(i);
    Batch batch = ds.get(idx);
    at::Tensor logits = logits_of(batch.inputs).to(at::kCPU);                     // [n, T, V]
    at::Tensor pred = logits.argmax(-1);                                          // [n, T]
    at::Tensor ok = pred.eq(batch.targets).index({at::indexing::Slice(), mask});  // [n, k]
    right_tokens += ok.sum().item<int64_t>();
    right_problems += ok.all(1).sum().item<int64_t>();
  }
  Accuracy a;
  a.problems = problems;
  a.tokens = problems * k;
  a.token_accuracy = static_cast<double>(right_tokens) / static_cast<double>(a.tokens);
  a.sequence_accuracy = static_cast<double>(right_problems) / static_cast<double>(problems);
  return a;
}

Accuracy accuracy(models::GPTImpl& model, const ReverseTask& task, int64_t problems,
                  int64_t batch_size) {
  const bool was_training = model.is_training();
  model.eval();
  auto device = model.wte->weight.device();
  Accuracy a;
  try {
    a = accuracy([&](const at::Tensor& idx) { return model.forward(idx.to(device)); }, task,
                 problems, batch_size);
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  return a;
}

}  // namespace dscpp::data
