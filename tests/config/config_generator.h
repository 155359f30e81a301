// The seeded generator of broken DeepSpeed configs that the config fuzz test (base_tests) and the
// sanitizer run of the parsers (tests/faults/parsers_fuzz.cpp) share: valid seed configs reaching
// every section the parser reads, mutated as a user or a tool would break them (wrong types,
// huge and negative numbers, NaN and Inf written as numbers, unknown and duplicate keys, deep
// nesting, invalid UTF-8, truncated text). Header-only: both binaries compile it.
#pragma once

#include <cstdint>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace dscpp::fuzz {

using nlohmann::json;

// Valid configs that between them reach every section the parser reads.
inline const char* const kSeeds[] = {
    R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 10,
        "gradient_clipping": 1.0, "optimizer": {"type": "Adam", "params": {"lr": 1e-3,
        "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}}, "scheduler": {"type":
        "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 100,
        "warmup_type": "linear"}}, "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e8},
        "comms_logger": {"enabled": false}})",
    R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16":
        {"enabled": true}, "zero_optimization": {"stage": 3, "overlap_comm": true,
        "contiguous_gradients": true, "stage3_prefetch_bucket_size": 5e7,
        "stage3_param_persistence_threshold": 1e5, "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "sub_group_size": 1e9, "offload_optimizer": {"device":
        "nvme", "nvme_path": "/tmp/swap", "pipeline_read": true, "pipeline_write": true,
        "buffer_count": 4}, "offload_param": {"device": "nvme", "nvme_path": "/tmp/swap",
        "max_in_cpu": 0, "buffer_count": 5}}, "aio": {"block_size": 1048576, "queue_depth": 8,
        "single_submit": false, "overlap_events": true}, "optimizer": {"type": "AdamW",
        "params": {"lr": "auto", "weight_decay": 0.1}}})",
    R"({"train_batch_size": 16, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power":
        16, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}, "zero_optimization":
        {"stage": 2, "allgather_bucket_size": 2e8, "reduce_scatter": true}, "optimizer": {"type":
        "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, "scheduler": {"type": "WarmupDecayLR",
        "params": {"total_num_steps": 1000, "warmup_num_steps": 10}}, "wall_clock_breakdown":
        true, "tensorboard": {"enabled": false, "output_path": "runs", "job_name": "x"},
        "csv_monitor": {"enabled": false}, "flops_profiler": {"enabled": false, "profile_step": 2,
        "module_depth": -1, "top_modules": 3, "detailed": true}})",
    R"({"train_batch_size": 8, "zero_optimization": {"stage": 1}, "optimizer": {"type": "Lamb",
        "params": {"lr": 1e-3, "max_coeff": 10.0, "min_coeff": 0.01}}, "scheduler": {"type":
        "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
        "cycle_first_step_size": 100}}, "activation_checkpointing": {"partition_activations":
        false}, "checkpoint": {"load_universal": false}, "data_types": {"grad_accum_dtype":
        "fp32"}})",
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {
    for (const char* s : kSeeds) {
      seeds_.push_back(json::parse(s));
      collect_keys(seeds_.back());
    }
    keys_.insert(keys_.end(), {"", "stage", "enabled", "type", "params", "auto",
                               "zero_optimization", "lr", std::string(300, 'k')});
  }

  // One generated config text.
  std::string next() {
    json j = seeds_[pick(seeds_.size())];
    const int mutations = 1 + static_cast<int>(pick(4));
    for (int m = 0; m < mutations; ++m) mutate(&j);
    std::string text = j.dump();
    if (pick(3) == 0) text = mutate_text(text);
    return text;
  }

 private:
  uint64_t pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }

  void collect_keys(const json& j) {
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        keys_.push_back(it.key());
        collect_keys(it.value());
      }
    } else if (j.is_array()) {
      for (const auto& v : j) collect_keys(v);
    }
  }

  json random_value(int depth) {
    switch (pick(depth > 2 ? 5 : 7)) {
      case 0:
        return nullptr;
      case 1:
        return pick(2) == 0;
      case 2: {
        static const int64_t ints[] = {0,
                                       -1,
                                       1,
                                       2,
                                       3,
                                       7,
                                       int64_t{1} << 31,
                                       -(int64_t{1} << 31) - 1,
                                       (int64_t{1} << 53) + 1,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
        return ints[pick(std::size(ints))];
      }
      case 3: {
        static const double doubles[] = {0.5,         -0.0,  1e308, -1e308,
                                         5e-324,      1e19,  3.7,   -2.5,
                                         5e8,         1e-12, 0.999, 9.2233720368547758e18,
                                         4294967296.0};
        return doubles[pick(std::size(doubles))];
      }
      case 4: {
        static const char* const strings[] = {
            "",       "auto", "nvme", "cpu",  "none", "AdamW", "Adam",        "WarmupLR",
            "linear", "fp32", "bf16", "/tmp", "1e3",  "true",  "\u00e9\u20ac"};
        if (pick(10) == 0) return std::string(5000, 'x');
        return strings[pick(std::size(strings))];
      }
      case 5: {
        json a = json::array();
        for (uint64_t i = 0, n = pick(4); i < n; ++i) a.push_back(random_value(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (uint64_t i = 0, n = pick(4); i < n; ++i)
          o[keys_[pick(keys_.size())]] = random_value(depth + 1);
        return o;
      }
    }
  }

  // A random node of j (an object or array member), or j itself.
  json* random_node(json* j) {
    json* node = j;
    while ((node->is_object() || node->is_array()) && !node->empty() && pick(3) != 0) {
      auto it = node->begin();
      std::advance(it, static_cast<long>(pick(node->size())));
      node = &*it;
    }
    return node;
  }

  void mutate(json* j) {
    json* node = random_node(j);
    switch (pick(6)) {
      case 0:  // replace a value
        if (node != j) *node = random_value(0);
        break;
      case 1:  // add a key (known somewhere, or not)
        if (node->is_object()) (*node)[keys_[pick(keys_.size())]] = random_value(0);
        break;
      case 2:  // remove a key
        if (node->is_object() && !node->empty()) {
          auto it = node->begin();
          std::advance(it, static_cast<long>(pick(node->size())));
          node->erase(it);
        }
        break;
      case 3:  // wrap a value
        if (node != j) *node = pick(2) ? json::array({*node}) : json{{"value", *node}};
        break;
      case 4:  // a number pushed to an extreme
        if (node->is_number()) {
          const double v = node->get<double>();
          static const double factors[] = {-1.0, 1e300, 1e-300, 0.0, 1e18};
          *node = v * factors[pick(std::size(factors))];
        }
        break;
      default:  // a number as its integer or fractional neighbour
        if (node->is_number()) *node = node->get<double>() + (pick(2) ? 0.5 : -1.0);
        break;
    }
  }

  // Text-level damage that a json value cannot express (json::dump refuses invalid UTF-8). Never
  // touches the first character, so the text stays JSON text for Config::parse (not a file path).
  std::string mutate_text(std::string text) {
    const std::size_t n = text.size();
    switch (pick(7)) {
      case 0: {  // a number written as NaN, Infinity or out of range
        static const char* const words[] = {"NaN", "Infinity", "-Infinity", "1e999", "-1e999", "00",
                                            "1.",  "-",        "1e",        "0x10",  "nan"};
        const std::size_t at = text.find_first_of("0123456789", 1 + pick(n));
        if (at != std::string::npos) text.insert(at, words[pick(std::size(words))]);
        break;
      }
      case 1: {  // a duplicate key
        const std::size_t at = text.find('{', 1 + pick(n));
        const std::size_t key_end = at == std::string::npos ? at : text.find(',', at);
        if (key_end != std::string::npos)
          text.insert(key_end + 1, text.substr(at + 1, key_end - at - 1) + ",");
        else
          text.insert(1, "\"train_batch_size\": 1, \"train_batch_size\": 2, ");
        break;
      }
      case 2:  // truncated
        text.resize(1 + pick(n - 1));
        break;
      case 3:  // a flipped byte
        if (n > 1) text[1 + pick(n - 1)] ^= static_cast<char>(1 + pick(255));
        break;
      case 4: {  // invalid UTF-8 inside a string
        static const char* const bad[] = {"\xff", "\xc3\x28", "\xed\xa0\x80", "\xf8\x88\x80\x80",
                                          "\xc0\xaf"};
        const std::size_t at = text.find('"', 1 + pick(n));
        if (at != std::string::npos) text.insert(at + 1, bad[pick(std::size(bad))]);
        break;
      }
      case 5: {  // deep nesting as a value
        const std::size_t depth = 1 + pick(pick(2) ? 100 : 100000);
        text.insert(1, "\"deep\": " + std::string(depth, '[') + std::string(depth, ']') + ", ");
        break;
      }
      default:  // comments where they are allowed, and where they are not
        text.insert(1 + pick(n - 1), pick(2) ? "/* c */" : "// c\n");
        break;
    }
    return text;
  }

  std::mt19937_64 rng_;
  std::vector<json> seeds_;
  std::vector<std::string> keys_;
};

}  // namespace dscpp::fuzz
