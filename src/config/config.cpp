// Implements Config::parse / from_json (one function per DeepSpeed config section, each reading
// its keys through a JsonReader, see NOTE [strict config reading]) and Config::describe().
// The batch triangle lives in batch.cpp.
#include "dscpp/config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "config/json_reader.h"
#include "dscpp/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace dscpp {

using config::format_double;
using config::JsonReader;
using config::ParseNotes;
using nlohmann::json;

namespace {

// ----- range checks: each throws ConfigError "<path>: must be ..., got ..." -------------------

template <typename T>
std::string text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return format_double(v);
  } else {
    return std::to_string(v);
  }
}

template <typename T>
void check_ge(const JsonReader& r, std::string_view key, T v, T min) {
  if (!(v >= min)) r.fail(key, "must be >= " + text(min) + ", got " + text(v));
}

template <typename T>
void check_gt(const JsonReader& r, std::string_view key, T v, T min) {
  if (!(v > min)) r.fail(key, "must be > " + text(min) + ", got " + text(v));
}

void check_unit(const JsonReader& r, std::string_view key, double v) {
  if (!(v >= 0.0 && v <= 1.0)) r.fail(key, "must be in [0, 1], got " + format_double(v));
}

void check_betas(const JsonReader& r, std::string_view key, const std::array<double, 2>& b) {
  for (double x : b) {
    if (!(x >= 0.0 && x < 1.0))
      r.fail(key, "each beta must be in [0, 1), got [" + format_double(b[0]) + ", " +
                      format_double(b[1]) + "]");
  }
}

void check_one_of(const JsonReader& r, std::string_view key, const std::string& v,
                  const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed)
    if (v == a) return;
  std::string msg = "must be one of " + join(allowed, ", ") + ", got \"" + v + "\"";
  const std::string near = nearest_match(v, allowed);
  if (!near.empty()) msg += "; did you mean '" + near + "'?";
  r.fail(key, msg);
}

// ----- optimizer ------------------------------------------------------------------------------

const std::vector<std::string> kOptimizerTypes = {"Adam",    "AdamW", "SGD",
                                                  "Adagrad", "Lamb",  "Lion"};
// DeepSpeed optimizers dscpp does not implement (deepspeed/runtime/config.py).
const std::vector<std::string> kDeepSpeedOnlyOptimizers = {
    "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD", "Muon"};

void parse_adam(JsonReader& p, bool adamw, AdamParams* a) {
  p.get("lr", &a->lr);
  check_ge(p, "lr", a->lr, 0.0);
  p.get("betas", &a->betas);
  check_betas(p, "betas", a->betas);
  p.get("eps", &a->eps);
  check_ge(p, "eps", a->eps, 0.0);
  p.get("weight_decay", &a->weight_decay);
  check_ge(p, "weight_decay", a->weight_decay, 0.0);
  p.get("bias_correction", &a->bias_correction);
  p.get("adam_w_mode", &a->adam_w_mode);
  if (adamw && !a->adam_w_mode) {
    p.notes().warn(p.path("adam_w_mode") +
                   " is false but type AdamW always decouples weight decay (as in DeepSpeed); "
                   "ignored. HINT: use type Adam with adam_w_mode false for L2 regularisation");
    a->adam_w_mode = true;
  }
  p.get("amsgrad", &a->amsgrad);
  if (a->amsgrad)
    p.fail("amsgrad", "true is not supported (DeepSpeed's fused Adam rejects it too)");
  p.get("torch_adam", &a->torch_adam);
}

void parse_sgd(JsonReader& p, SgdParams* s) {
  p.get("lr", &s->lr);
  check_ge(p, "lr", s->lr, 0.0);
  p.get("momentum", &s->momentum);
  check_ge(p, "momentum", s->momentum, 0.0);
  p.get("dampening", &s->dampening);
  p.get("weight_decay", &s->weight_decay);
  check_ge(p, "weight_decay", s->weight_decay, 0.0);
  p.get("nesterov", &s->nesterov);
  if (s->nesterov && (s->momentum <= 0.0 || s->dampening != 0.0))
    p.fail("nesterov",
           "true needs momentum > 0 and dampening 0 (as torch.optim.SGD), got momentum " +
               format_double(s->momentum) + ", dampening " + format_double(s->dampening));
}

void parse_adagrad(JsonReader& p, AdagradParams* a) {
  p.get("lr", &a->lr);
  check_ge(p, "lr", a->lr, 0.0);
  p.get("lr_decay", &a->lr_decay);
  check_ge(p, "lr_decay", a->lr_decay, 0.0);
  p.get("weight_decay", &a->weight_decay);
  check_ge(p, "weight_decay", a->weight_decay, 0.0);
  p.get("initial_accumulator_value", &a->initial_accumulator_value);
  check_ge(p, "initial_accumulator_value", a->initial_accumulator_value, 0.0);
  p.get("eps", &a->eps);
  check_ge(p, "eps", a->eps, 0.0);
}

void parse_lamb(JsonReader& p, LambParams* l) {
  p.get("lr", &l->lr);
  check_ge(p, "lr", l->lr, 0.0);
  p.get("bias_correction", &l->bias_correction);
  p.get("betas", &l->betas);
  check_betas(p, "betas", l->betas);
  p.get("eps", &l->eps);
  check_ge(p, "eps", l->eps, 0.0);
  p.get("eps_inside_sqrt", &l->eps_inside_sqrt);
  p.get("weight_decay", &l->weight_decay);
  check_ge(p, "weight_decay", l->weight_decay, 0.0);
  p.get("max_grad_norm", &l->max_grad_norm);
  check_ge(p, "max_grad_norm", l->max_grad_norm, 0.0);
  p.get("max_coeff", &l->max_coeff);
  p.get("min_coeff", &l->min_coeff);
  if (!(l->min_coeff <= l->max_coeff))
    p.fail("min_coeff", "must be <= max_coeff " + format_double(l->max_coeff) + ", got " +
                            format_double(l->min_coeff));
  p.get("amsgrad", &l->amsgrad);
  if (l->amsgrad) p.fail("amsgrad", "true is not supported (DeepSpeed's FusedLamb rejects it too)");
}

void parse_lion(JsonReader& p, LionParams* l) {
  p.get("lr", &l->lr);
  check_ge(p, "lr", l->lr, 0.0);
  p.get("betas", &l->betas);
  check_betas(p, "betas", l->betas);
  p.get("weight_decay", &l->weight_decay);
  check_ge(p, "weight_decay", l->weight_decay, 0.0);
}

void parse_optimizer(JsonReader& root, OptimizerConfig* o) {
  if (!root.has("optimizer")) {
    root.raw("optimizer");
    return;
  }
  JsonReader r = root.child("optimizer");
  std::string given;
  r.require("type", &given, "it names the optimizer, e.g. \"AdamW\"");
  for (const std::string& t : kOptimizerTypes)
    if (iequals(given, t)) o->type = t;
  if (o->type.empty()) {
    for (const std::string& t : kDeepSpeedOnlyOptimizers)
      if (iequals(given, t))
        r.fail("type", "'" + given +
                           "' is a DeepSpeed optimizer that dscpp does not implement "
                           "yet. HINT: dscpp supports " +
                           join(kOptimizerTypes, ", "));
    std::string msg = "unknown optimizer type '" + given + "'";
    const std::string near = nearest_match(given, kOptimizerTypes);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    r.fail("type",
           msg + " dscpp supports " + join(kOptimizerTypes, ", ") + " (matched ignoring case)");
  }
  r.unimplemented("legacy_fusion");
  JsonReader p = r.child("params");
  if (o->type == "Adam" || o->type == "AdamW") {
    parse_adam(p, o->type == "AdamW", &o->adam);
  } else if (o->type == "SGD") {
    parse_sgd(p, &o->sgd);
  } else if (o->type == "Adagrad") {
    parse_adagrad(p, &o->adagrad);
  } else if (o->type == "Lamb") {
    parse_lamb(p, &o->lamb);
  } else {
    parse_lion(p, &o->lion);
  }
  p.finish();
  r.finish();
}

// ----- scheduler ------------------------------------------------------------------------------

const std::vector<std::string> kSchedulerTypes = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                  "OneCycle", "LRRangeTest"};

void read_warmup_type(JsonReader& p, std::string* t) {
  p.get("warmup_type", t);
  check_one_of(p, "warmup_type", *t, {"log", "linear"});
}

void read_last_batch_iteration(JsonReader& p, int64_t* v) {
  p.get("last_batch_iteration", v);
  check_ge<int64_t>(p, "last_batch_iteration", *v, -1);
}

void parse_scheduler(JsonReader& root, SchedulerConfig* s) {
  if (!root.has("scheduler")) {
    root.raw("scheduler");
    return;
  }
  JsonReader r = root.child("scheduler");
  std::string given;
  r.require("type", &given, "it names the schedule, e.g. \"WarmupLR\"");
  for (const std::string& t : kSchedulerTypes)
    if (given == t) s->type = t;
  if (s->type.empty()) {
    std::string msg = "unknown scheduler type '" + given + "'";
    const std::string near = nearest_match(given, kSchedulerTypes);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    r.fail("type", msg + " dscpp supports " + join(kSchedulerTypes, ", ") + " (exact spelling)");
  }
  JsonReader p = r.child("params");
  const std::string why_total = "the schedule needs the total number of optimizer steps";
  if (s->type == "WarmupLR") {
    WarmupLRParams& w = s->warmup_lr;
    p.get("warmup_min_lr", &w.warmup_min_lr);
    check_ge(p, "warmup_min_lr", w.warmup_min_lr, 0.0);
    p.get("warmup_max_lr", &w.warmup_max_lr);
    if (w.warmup_max_lr) check_ge(p, "warmup_max_lr", *w.warmup_max_lr, w.warmup_min_lr);
    p.get("warmup_num_steps", &w.warmup_num_steps);
    check_ge<int64_t>(p, "warmup_num_steps", w.warmup_num_steps, 0);
    read_warmup_type(p, &w.warmup_type);
    read_last_batch_iteration(p, &w.last_batch_iteration);
  } else if (s->type == "WarmupDecayLR") {
    WarmupDecayLRParams& w = s->warmup_decay_lr;
    p.require("total_num_steps", &w.total_num_steps, why_total);
    check_gt<int64_t>(p, "total_num_steps", w.total_num_steps, 0);
    p.get("warmup_min_lr", &w.warmup_min_lr);
    check_ge(p, "warmup_min_lr", w.warmup_min_lr, 0.0);
    p.get("warmup_max_lr", &w.warmup_max_lr);
    check_ge(p, "warmup_max_lr", w.warmup_max_lr, w.warmup_min_lr);
    p.get("warmup_num_steps", &w.warmup_num_steps);
    check_ge<int64_t>(p, "warmup_num_steps", w.warmup_num_steps, 0);
    read_warmup_type(p, &w.warmup_type);
    read_last_batch_iteration(p, &w.last_batch_iteration);
    if (w.total_num_steps < w.warmup_num_steps)
      p.notes().warn(p.path("total_num_steps") + " " + std::to_string(w.total_num_steps) +
                     " is less than warmup_num_steps " + std::to_string(w.warmup_num_steps) +
                     " (DeepSpeed warns too)");
  } else if (s->type == "WarmupCosineLR") {
    WarmupCosineLRParams& w = s->warmup_cosine_lr;
    p.require("total_num_steps", &w.total_num_steps, why_total);
    check_gt<int64_t>(p, "total_num_steps", w.total_num_steps, 0);
    p.get("warmup_min_ratio", &w.warmup_min_ratio);
    check_unit(p, "warmup_min_ratio", w.warmup_min_ratio);
    p.get("warmup_num_steps", &w.warmup_num_steps);
    check_ge<int64_t>(p, "warmup_num_steps", w.warmup_num_steps, 0);
    p.get("cos_min_ratio", &w.cos_min_ratio);
    check_unit(p, "cos_min_ratio", w.cos_min_ratio);
    read_warmup_type(p, &w.warmup_type);
    read_last_batch_iteration(p, &w.last_batch_iteration);
    if (w.total_num_steps < w.warmup_num_steps)
      p.notes().warn(p.path("total_num_steps") + " " + std::to_string(w.total_num_steps) +
                     " is less than warmup_num_steps " + std::to_string(w.warmup_num_steps) +
                     " (DeepSpeed warns too)");
  } else if (s->type == "OneCycle") {
    OneCycleParams& c = s->one_cycle;
    p.require("cycle_min_lr", &c.cycle_min_lr, "it is the lower LR of the cycle");
    check_ge(p, "cycle_min_lr", c.cycle_min_lr, 0.0);
    p.require("cycle_max_lr", &c.cycle_max_lr, "it is the upper LR of the cycle");
    check_ge(p, "cycle_max_lr", c.cycle_max_lr, c.cycle_min_lr);
    p.get("decay_lr_rate", &c.decay_lr_rate);
    check_ge(p, "decay_lr_rate", c.decay_lr_rate, 0.0);
    p.get("cycle_first_step_size", &c.cycle_first_step_size);
    check_gt<int64_t>(p, "cycle_first_step_size", c.cycle_first_step_size, 0);
    p.get("cycle_second_step_size", &c.cycle_second_step_size);
    if (c.cycle_second_step_size)
      check_gt<int64_t>(p, "cycle_second_step_size", *c.cycle_second_step_size, 0);
    p.get("cycle_first_stair_count", &c.cycle_first_stair_count);
    check_ge<int64_t>(p, "cycle_first_stair_count", c.cycle_first_stair_count, 0);
    p.get("cycle_second_stair_count", &c.cycle_second_stair_count);
    if (c.cycle_second_stair_count)
      check_ge<int64_t>(p, "cycle_second_stair_count", *c.cycle_second_stair_count, 0);
    p.get("decay_step_size", &c.decay_step_size);
    check_ge<int64_t>(p, "decay_step_size", c.decay_step_size, 0);
    p.get("cycle_momentum", &c.cycle_momentum);
    p.get("cycle_min_mom", &c.cycle_min_mom);
    check_unit(p, "cycle_min_mom", c.cycle_min_mom);
    p.get("cycle_max_mom", &c.cycle_max_mom);
    check_unit(p, "cycle_max_mom", c.cycle_max_mom);
    p.get("decay_mom_rate", &c.decay_mom_rate);
    check_ge(p, "decay_mom_rate", c.decay_mom_rate, 0.0);
    read_last_batch_iteration(p, &c.last_batch_iteration);
  } else {
    LRRangeTestParams& t = s->lr_range_test;
    p.get("lr_range_test_min_lr", &t.lr_range_test_min_lr);
    check_ge(p, "lr_range_test_min_lr", t.lr_range_test_min_lr, 0.0);
    p.get("lr_range_test_step_size", &t.lr_range_test_step_size);
    check_gt<int64_t>(p, "lr_range_test_step_size", t.lr_range_test_step_size, 0);
    p.get("lr_range_test_step_rate", &t.lr_range_test_step_rate);
    check_ge(p, "lr_range_test_step_rate", t.lr_range_test_step_rate, 0.0);
    p.get("lr_range_test_staircase", &t.lr_range_test_staircase);
    read_last_batch_iteration(p, &t.last_batch_iteration);
  }
  p.finish();
  r.finish();
}

// ----- precision ------------------------------------------------------------------------------

void parse_fp16(JsonReader& root, Fp16Config* f) {
  JsonReader r = root.child("fp16");
  r.get("enabled", &f->enabled);
  r.get("auto_cast", &f->auto_cast);
  r.get("loss_scale", &f->loss_scale);
  check_ge(r, "loss_scale", f->loss_scale, 0.0);
  r.get("initial_scale_power", &f->initial_scale_power);
  check_ge(r, "initial_scale_power", f->initial_scale_power, 0);
  if (f->initial_scale_power >= 64)
    r.fail("initial_scale_power", "must be < 64, got " + std::to_string(f->initial_scale_power));
  r.get("loss_scale_window", &f->loss_scale_window);
  check_gt(r, "loss_scale_window", f->loss_scale_window, 0);
  r.get("hysteresis", &f->hysteresis);
  check_ge(r, "hysteresis", f->hysteresis, 1);
  r.get("consecutive_hysteresis", &f->consecutive_hysteresis);
  r.get("min_loss_scale", &f->min_loss_scale);
  check_gt(r, "min_loss_scale", f->min_loss_scale, 0.0);
  r.unimplemented("fp16_master_weights_and_grads");
  r.unimplemented("fused_mode");
  r.finish();
}

void parse_bf16(JsonReader& root, Bf16Config* b) {
  // DeepSpeed reads "bf16", or its old name "bfloat16" when "bf16" is absent.
  const bool old_name = root.has("bfloat16");
  if (old_name && root.has("bf16"))
    root.fail("bfloat16", "both 'bf16' and its old name 'bfloat16' are given. HINT: keep 'bf16'");
  root.raw(old_name ? "bf16" : "bfloat16");
  JsonReader r = root.child(old_name ? "bfloat16" : "bf16");
  r.get("enabled", &b->enabled);
  r.unimplemented("immediate_grad_update");
  r.unimplemented("check_grad_overflow");
  r.finish();
}

// ----- zero_optimization ----------------------------------------------------------------------

void read_offload_device(JsonReader& r, std::string* device,
                         std::optional<std::string>* nvme_path) {
  r.get("device", device);
  check_one_of(r, "device", *device, {"none", "cpu", "nvme"});
  r.get("nvme_path", nvme_path);
  if (*device == "nvme" && (!*nvme_path || (*nvme_path)->empty()))
    r.fail("nvme_path",
           "is required when device is \"nvme\". HINT: set it to a folder on a "
           "fast local disk");
}

void parse_offload_optimizer(JsonReader& zr, OffloadOptimizerConfig* o) {
  JsonReader r = zr.child("offload_optimizer");
  read_offload_device(r, &o->device, &o->nvme_path);
  r.get("buffer_count", &o->buffer_count);
  check_ge<int64_t>(r, "buffer_count", o->buffer_count, 0);
  r.get("pin_memory", &o->pin_memory);
  r.get("pipeline_read", &o->pipeline_read);
  r.get("pipeline_write", &o->pipeline_write);
  r.get("fast_init", &o->fast_init);
  r.get("ratio", &o->ratio);
  check_unit(r, "ratio", o->ratio);
  r.unimplemented("super_offload");
  r.unimplemented("cpuadam_cores_perc");
  r.finish();
}

void parse_offload_param(JsonReader& zr, OffloadParamConfig* o) {
  JsonReader r = zr.child("offload_param");
  read_offload_device(r, &o->device, &o->nvme_path);
  r.get("buffer_count", &o->buffer_count);
  check_ge<int64_t>(r, "buffer_count", o->buffer_count, 0);
  r.get("buffer_size", &o->buffer_size);
  check_ge<int64_t>(r, "buffer_size", o->buffer_size, 0);
  r.get("max_in_cpu", &o->max_in_cpu);
  check_ge<int64_t>(r, "max_in_cpu", o->max_in_cpu, 0);
  r.get("pin_memory", &o->pin_memory);
  r.finish();
}

// A key that takes a string or an array of strings (DeepSpeed coerces the string to a list).
void get_strings(JsonReader& r, std::string_view key, std::vector<std::string>* out) {
  if (const nlohmann::json* v = r.raw(key); v && v->is_string()) {
    std::string one;
    if (r.get(key, &one)) *out = {one};  // false: "auto", the default (empty)
    return;
  }
  r.get(key, out);
}

void parse_leaf_module(JsonReader& zr, ZeroLeafModuleConfig* l) {
  JsonReader r = zr.child("leaf_module");
  const std::pair<const char*, std::vector<std::string>*> lists[] = {
      {"classes", &l->classes}, {"names", &l->names}, {"name_suffixes", &l->name_suffixes}};
  for (const auto& [key, list] : lists) {
    get_strings(r, key, list);
    for (const auto& s : *list) {
      if (s.empty())
        r.fail(key, "has an empty entry, which would match every module. HINT: remove it");
    }
  }
  r.finish();
}

void parse_zero(JsonReader& root, ZeroConfig* z) {
  if (const json* v = root.raw("zero_optimization"); v && v->is_boolean())
    root.fail("zero_optimization",
              "the boolean form is DeepSpeed's deprecated ZeRO format. HINT: write "
              "{\"stage\": 1} (true) or {\"stage\": 0} (false)");
  JsonReader r = root.child("zero_optimization");
  r.get("stage", &z->stage);
  if (z->stage < 0 || z->stage > 3)
    r.fail("stage", "must be 0, 1, 2 or 3, got " + std::to_string(z->stage));
  r.get("contiguous_gradients", &z->contiguous_gradients);
  // DeepSpeed: overlap_comm defaults to (stage == 3).
  z->overlap_comm = z->stage == 3;
  if (!r.get("overlap_comm", &z->overlap_comm))
    r.notes().set_origin(
        r.path("overlap_comm"),
        (r.notes().origins && r.notes().origins->count(r.path("overlap_comm")) ? "auto -> " : "") +
            std::string("default for stage ") + std::to_string(z->stage));
  r.get("reduce_scatter", &z->reduce_scatter);
  r.get("reduce_bucket_size", &z->reduce_bucket_size);
  check_gt<int64_t>(r, "reduce_bucket_size", z->reduce_bucket_size, 0);
  r.get("allgather_partitions", &z->allgather_partitions);
  r.get("allgather_bucket_size", &z->allgather_bucket_size);
  check_gt<int64_t>(r, "allgather_bucket_size", z->allgather_bucket_size, 0);
  if (z->allgather_bucket_size % 2 != 0)
    r.fail("allgather_bucket_size", "must be a multiple of 2 (DeepSpeed asserts this), got " +
                                        std::to_string(z->allgather_bucket_size));
  r.get("round_robin_gradients", &z->round_robin_gradients);
  r.get("sub_group_size", &z->sub_group_size);
  check_gt<int64_t>(r, "sub_group_size", z->sub_group_size, 0);
  r.get_aliased("stage3_prefetch_bucket_size", "prefetch_bucket_size",
                &z->stage3_prefetch_bucket_size);
  check_ge<int64_t>(r, "stage3_prefetch_bucket_size", z->stage3_prefetch_bucket_size, 0);
  r.get_aliased("stage3_param_persistence_threshold", "param_persistence_threshold",
                &z->stage3_param_persistence_threshold);
  check_ge<int64_t>(r, "stage3_param_persistence_threshold", z->stage3_param_persistence_threshold,
                    0);
  r.get_aliased("stage3_max_live_parameters", "max_live_parameters",
                &z->stage3_max_live_parameters);
  check_ge<int64_t>(r, "stage3_max_live_parameters", z->stage3_max_live_parameters, 0);
  r.get_aliased("stage3_max_reuse_distance", "max_reuse_distance", &z->stage3_max_reuse_distance);
  check_ge<int64_t>(r, "stage3_max_reuse_distance", z->stage3_max_reuse_distance, 0);
  const bool gather_given = r.get_aliased("stage3_gather_16bit_weights_on_model_save",
                                          "gather_16bit_weights_on_model_save",
                                          &z->stage3_gather_16bit_weights_on_model_save);
  if (r.raw("stage3_gather_fp16_weights_on_model_save")) {
    if (gather_given)
      r.fail("stage3_gather_fp16_weights_on_model_save",
             "is the deprecated name of stage3_gather_16bit_weights_on_model_save, which is also "
             "given. HINT: keep stage3_gather_16bit_weights_on_model_save");
    r.get("stage3_gather_fp16_weights_on_model_save",
          &z->stage3_gather_16bit_weights_on_model_save);
    r.notes().warn(r.path("stage3_gather_fp16_weights_on_model_save") +
                   " is deprecated (as in DeepSpeed); read as "
                   "stage3_gather_16bit_weights_on_model_save");
  }
  r.get("ignore_unused_parameters", &z->ignore_unused_parameters);
  parse_leaf_module(r, &z->leaf_module);
  parse_offload_optimizer(r, &z->offload_optimizer);
  parse_offload_param(r, &z->offload_param);

  // Deprecated spellings DeepSpeed still maps onto offload_optimizer / offload_param.
  bool flag = false;
  if (r.get("cpu_offload", &flag)) {
    if (r.has("offload_optimizer"))
      r.fail("cpu_offload",
             "is deprecated and offload_optimizer is also given (DeepSpeed "
             "rejects this too). HINT: drop cpu_offload");
    r.notes().warn(r.path("cpu_offload") +
                   " is deprecated (as in DeepSpeed); read as "
                   "offload_optimizer.device \"" +
                   (flag ? "cpu" : "none") + "\"");
    if (flag) z->offload_optimizer.device = "cpu";
  }
  flag = false;
  if (r.get("cpu_offload_param", &flag)) {
    if (r.has("offload_param"))
      r.fail("cpu_offload_param",
             "is deprecated and offload_param is also given (DeepSpeed "
             "rejects this too). HINT: drop cpu_offload_param");
    r.notes().warn(r.path("cpu_offload_param") +
                   " is deprecated (as in DeepSpeed); read as "
                   "offload_param.device \"" +
                   (flag ? "cpu" : "none") + "\"");
    if (flag) z->offload_param.device = "cpu";
  }
  if (r.get("cpu_offload_use_pin_memory", &flag))
    r.notes().warn(r.path("cpu_offload_use_pin_memory") +
                   " is deprecated and ignored (as in DeepSpeed). HINT: use "
                   "offload_optimizer.pin_memory / offload_param.pin_memory");

  for (const char* key : {"elastic_checkpoint",
                          "load_from_fp32_weights",
                          "use_multi_rank_bucket_allreduce",
                          "legacy_stage1",
                          "zero_hpz_partition_size",
                          "zero_quantized_weights",
                          "zero_quantized_nontrainable_weights",
                          "zero_quantized_gradients",
                          "zeropp_loco_param",
                          "mics_shard_size",
                          "mics_hierarchical_params_gather",
                          "memory_efficient_linear",
                          "pipeline_loading_checkpoint",
                          "override_module_apply",
                          "stage3_model_persistence_threshold",
                          "model_persistence_threshold",
                          "stage3_module_granularity_threshold",
                          "module_granularity_threshold",
                          "stage3_use_all_reduce_for_fetch_params",
                          "use_all_reduce_for_fetch_params",
                          "log_trace_cache_warnings",
                          "zenflow"})
    r.unimplemented(key);
  r.finish();

  // Settings DeepSpeed accepts but that have no effect at this stage: say so.
  if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
    DSCPP_FAIL(ConfigError, "zero_optimization.offload_optimizer.ratio ",
               format_double(z->offload_optimizer.ratio),
               " < 1 (partial offload) needs stage 3, got stage ", z->stage,
               " (DeepSpeed asserts this too)");
  if (z->offload_optimizer.device != "none" && z->stage == 0)
    r.notes().warn("zero_optimization.offload_optimizer.device \"" + z->offload_optimizer.device +
                   "\" has no effect at stage 0 (ZeRO off); ignored");
  if (z->offload_param.device != "none" && z->stage != 3)
    r.notes().warn("zero_optimization.offload_param.device \"" + z->offload_param.device +
                   "\" has no effect at stage " + std::to_string(z->stage) +
                   " (parameter offload is stage 3 only); ignored");
  if (z->stage != 3) {
    std::string given;
    for (const char* key : {"stage3_prefetch_bucket_size", "prefetch_bucket_size",
                            "stage3_param_persistence_threshold", "param_persistence_threshold",
                            "stage3_max_live_parameters", "max_live_parameters",
                            "stage3_max_reuse_distance", "max_reuse_distance", "leaf_module"}) {
      if (r.has(key)) given += (given.empty() ? "" : ", ") + std::string(key);
    }
    if (!given.empty()) {
      r.notes().warn("zero_optimization." + given + ": stage 3 settings have no effect at stage " +
                     std::to_string(z->stage) + "; ignored");
    }
  }
}

// ----- the smaller sections -------------------------------------------------------------------

void parse_aio(JsonReader& root, AioConfig* a) {
  JsonReader r = root.child("aio");
  r.get("block_size", &a->block_size);
  check_gt<int64_t>(r, "block_size", a->block_size, 0);
  r.get("queue_depth", &a->queue_depth);
  check_gt<int64_t>(r, "queue_depth", a->queue_depth, 0);
  // DeepSpeed's newer spelling of the I/O threads per rank.
  r.get_aliased("thread_count", "intra_op_parallelism", &a->thread_count);
  check_gt<int64_t>(r, "thread_count", a->thread_count, 0);
  r.get("single_submit", &a->single_submit);
  r.get("overlap_events", &a->overlap_events);
  bool gds = false;
  if (r.get("use_gds", &gds) && gds) {
    r.fail("use_gds",
           "true is not implemented: GPUDirect Storage moves data between NVMe and GPU memory, "
           "and dscpp's swap files go through host memory. HINT: remove it");
  }
  r.finish();
}

void parse_activation_checkpointing(JsonReader& root, ActivationCheckpointingConfig* a) {
  JsonReader r = root.child("activation_checkpointing");
  r.get("partition_activations", &a->partition_activations);
  r.get("cpu_checkpointing", &a->cpu_checkpointing);
  r.get("contiguous_memory_optimization", &a->contiguous_memory_optimization);
  r.get("number_checkpoints", &a->number_checkpoints);
  if (a->number_checkpoints) check_gt<int64_t>(r, "number_checkpoints", *a->number_checkpoints, 0);
  r.get("synchronize_checkpoint_boundary", &a->synchronize_checkpoint_boundary);
  r.get("profile", &a->profile);
  r.finish();
}

void parse_checkpoint(JsonReader& root, CheckpointConfig* c) {
  JsonReader r = root.child("checkpoint");
  std::string mode = c->tag_validation;
  r.get("tag_validation", &mode);
  bool matched = false;
  for (const char* m : {"Ignore", "Warn", "Fail"}) {
    if (iequals(mode, m)) {
      c->tag_validation = m;
      matched = true;
    }
  }
  if (!matched)
    r.fail("tag_validation", "must be one of Ignore, Warn, Fail (any case), got \"" + mode + "\"");
  r.get("load_universal", &c->load_universal);
  r.get("use_node_local_storage", &c->use_node_local_storage);
  {
    JsonReader w = r.child("parallel_write");
    w.get("pipeline_stage", &c->parallel_write.pipeline_stage);
    w.finish();
  }
  r.unimplemented("writer");
  r.finish();
}

void parse_comms_logger(JsonReader& root, CommsLoggerConfig* c) {
  JsonReader r = root.child("comms_logger");
  r.get("enabled", &c->enabled);
  r.get("verbose", &c->verbose);
  r.get("prof_all", &c->prof_all);
  r.get("debug", &c->debug);
  r.get("prof_ops", &c->prof_ops);
  r.finish();
}

void parse_flops_profiler(JsonReader& root, FlopsProfilerConfig* f) {
  JsonReader r = root.child("flops_profiler");
  r.get("enabled", &f->enabled);
  r.get("profile_step", &f->profile_step);
  check_ge<int64_t>(r, "profile_step", f->profile_step, 0);
  r.get("module_depth", &f->module_depth);
  check_ge<int64_t>(r, "module_depth", f->module_depth, -1);
  r.get("top_modules", &f->top_modules);
  check_ge<int64_t>(r, "top_modules", f->top_modules, 0);
  r.get("detailed", &f->detailed);
  r.get("output_file", &f->output_file);
  r.unimplemented("recompute_fwd_factor");
  r.finish();
}

void parse_monitor(JsonReader& root, const char* section, MonitorConfig* m) {
  JsonReader r = root.child(section);
  r.get("enabled", &m->enabled);
  r.get("output_path", &m->output_path);
  r.get("job_name", &m->job_name);
  r.finish();
}

void parse_comet(JsonReader& root, CometConfig* c) {
  JsonReader r = root.child("comet");
  r.get("enabled", &c->enabled);
  for (const char* key : {"samples_log_interval", "project", "workspace", "api_key",
                          "experiment_name", "experiment_key", "online", "mode"})
    r.raw(key);
  r.finish();
}

void parse_wandb(JsonReader& root, WandbConfig* w) {
  JsonReader r = root.child("wandb");
  r.get("enabled", &w->enabled);
  r.get("group", &w->group);
  r.get("team", &w->team);
  r.get("project", &w->project);
  r.finish();
}

// Real DeepSpeed top-level keys (deepspeed/runtime/config.py and friends) dscpp does not
// implement yet: present means a warning, never an error.
const char* const kUnimplementedTopLevel[] = {"pipeline",
                                              "sparse_attention",
                                              "data_efficiency",
                                              "curriculum_learning",
                                              "compression_training",
                                              "autotuning",
                                              "elasticity",
                                              "amp",
                                              "eigenvalue",
                                              "quantize_training",
                                              "sparse_gradients",
                                              "hybrid_engine",
                                              "nebula",
                                              "data_types",
                                              "graph_harvesting",
                                              "memory_breakdown",
                                              "disable_allgather",
                                              "progressive_layer_drop",
                                              "torch_autocast",
                                              "weight_quantization",
                                              "compile",
                                              "timers",
                                              "tensor_parallel",
                                              "expert_parallel",
                                              "dataloader_drop_last",
                                              "vocabulary_size",
                                              "zero_force_ds_cpu_optimizer",
                                              "fp32_allreduce",
                                              "seq_parallel_comm_data_type",
                                              "use_data_before_expert_parallelism",
                                              "sequence_parallel_size",
                                              "trackio"};

void parse_root(const json& j, Config* c) {
  ParseNotes notes{&c->warnings, &c->origins};
  JsonReader r(j, "", notes);

  r.get_batch("train_batch_size", &c->train_batch_size);
  r.get_batch("train_micro_batch_size_per_gpu", &c->train_micro_batch_size_per_gpu);
  r.get_batch("gradient_accumulation_steps", &c->gradient_accumulation_steps);

  r.get("gradient_clipping", &c->gradient_clipping);
  check_ge(r, "gradient_clipping", c->gradient_clipping, 0.0);
  r.get("steps_per_print", &c->steps_per_print);
  check_gt(r, "steps_per_print", c->steps_per_print, 0);
  r.get("wall_clock_breakdown", &c->wall_clock_breakdown);
  r.get("prescale_gradients", &c->prescale_gradients);
  r.get("gradient_predivide_factor", &c->gradient_predivide_factor);
  check_gt(r, "gradient_predivide_factor", c->gradient_predivide_factor, 0.0);
  r.get("zero_allow_untested_optimizer", &c->zero_allow_untested_optimizer);
  if (r.get("communication_data_type", &c->communication_data_type) && c->communication_data_type) {
    std::string t = to_lower(*c->communication_data_type);
    if (t == "bfp16") t = "bf16";  // DeepSpeed's spelling before 0.14
    check_one_of(r, "communication_data_type", t, {"fp16", "bf16", "fp32"});
    c->communication_data_type = t;
  }
  r.get("dump_state", &c->dump_state);
  r.get("seed", &c->seed);
  if (c->seed) check_ge<int64_t>(r, "seed", *c->seed, 0);

  parse_optimizer(r, &c->optimizer);
  parse_scheduler(r, &c->scheduler);
  parse_fp16(r, &c->fp16);
  parse_bf16(r, &c->bf16);
  parse_zero(r, &c->zero_optimization);
  parse_aio(r, &c->aio);
  parse_activation_checkpointing(r, &c->activation_checkpointing);
  parse_checkpoint(r, &c->checkpoint);
  parse_comms_logger(r, &c->comms_logger);
  parse_flops_profiler(r, &c->flops_profiler);
  parse_monitor(r, "csv_monitor", &c->csv_monitor);
  parse_monitor(r, "tensorboard", &c->tensorboard);
  parse_wandb(r, &c->wandb);
  parse_comet(r, &c->comet);
  for (const char* key : kUnimplementedTopLevel) r.unimplemented(key);
  r.finish();

  if (c->fp16.enabled && c->bf16.enabled)
    DSCPP_FAIL(ConfigError,
               "fp16.enabled and bf16.enabled are both true: one mixed-precision mode at a time "
               "(DeepSpeed asserts this too). HINT: set one of them to false");
}

// Parses JSON text with comments allowed and duplicate keys rejected (DeepSpeed loads configs
// with dict_raise_error_on_duplicate_keys).
json parse_text(const std::string& text, const std::string& source) {
  struct Frame {
    bool is_object;
    std::set<std::string> keys;
    std::string key;  // the key being read (objects)
  };
  std::vector<Frame> stack;
  auto where = [&stack] {
    std::string p;
    for (std::size_t i = 0; i + 1 < stack.size(); ++i) {
      if (!stack[i].is_object) {
        p += "[]";
        continue;
      }
      if (!p.empty()) p += ".";
      p += stack[i].key;
    }
    return p.empty() ? std::string("config root") : p;
  };
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        stack.push_back({true, {}, {}});
        break;
      case json::parse_event_t::array_start:
        stack.push_back({false, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        Frame& f = stack.back();
        if (!f.keys.insert(key).second)
          DSCPP_FAIL(ConfigError, "duplicate key '", key, "' at ", where(), " in ", source,
                     " (DeepSpeed rejects duplicate keys too). HINT: keep one of them");
        f.key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // nlohmann's message is "[json.exception.parse_error.101] parse error at line 3, column 0:
    // <reason>"; its column can be off after a newline, so the position is recomputed from
    // e.byte (the number of bytes read; the offending one is the last).
    std::string reason = e.what();
    if (auto pos = reason.find("] ");
        reason.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
      reason = reason.substr(pos + 2);
    if (auto pos = reason.find(": ");
        reason.rfind("parse error", 0) == 0 && pos != std::string::npos)
      reason = reason.substr(pos + 2);
    const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    std::size_t line = 1, line_start = 0;
    for (std::size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    DSCPP_FAIL(ConfigError, "malformed JSON in ", source, " at line ", line, ", column ",
               at - line_start + 1, ": ", reason,
               ". HINT: look for a missing comma, colon, quote or brace at or just before that "
               "position");
  } catch (const json::out_of_range& e) {
    // A number beyond a double's range ("stage": 1e999; found by tests/config/config_fuzz_test):
    // nlohmann says "number overflow parsing '1e999'", without a position.
    std::string reason = e.what();
    if (auto pos = reason.find("] "); pos != std::string::npos) reason = reason.substr(pos + 2);
    DSCPP_FAIL(ConfigError, "malformed JSON in ", source, ": ", reason,
               ". HINT: every number must fit a 64-bit float (at most about 1.8e308)");
  }
}

}  // namespace

Config Config::from_json(const json& j) {
  Config c;
  c.source = "<json object>";
  parse_root(j, &c);
  return c;
}

Config Config::parse(const std::string& path_or_json) {
  const std::string trimmed = trim(path_or_json);
  Config c;
  json j;
  if (!trimmed.empty() && trimmed[0] == '{') {
    c.source = "<json text>";
    j = parse_text(trimmed, c.source);
  } else {
    const std::string& path = path_or_json;
    c.source = path;
    std::error_code ec;
    DSCPP_CHECK(!path.empty(), IoError,
                "no DeepSpeed config given: expected a file path or JSON text starting with '{'");
    DSCPP_CHECK(!std::filesystem::is_directory(path, ec), IoError, "DeepSpeed config '", path,
                "' is a directory, not a file. HINT: pass the path of the .json file");
    std::ifstream in(path, std::ios::binary);
    DSCPP_CHECK(in.good(), IoError, "cannot read DeepSpeed config '", path,
                "': ", std::strerror(errno), ". HINT: check the path (relative paths start from ",
                std::filesystem::current_path(ec).string(), ")");
    std::ostringstream text;
    text << in.rdbuf();
    DSCPP_CHECK(!in.bad(), IoError, "error while reading DeepSpeed config '", path, "'");
    j = parse_text(text.str(), "'" + path + "'");
  }
  parse_root(j, &c);
  return c;
}

// ----- describe -------------------------------------------------------------------------------

namespace {

class Describer {
 public:
  explicit Describer(const Config& c) : c_(c) {}

  void line(const std::string& path, const std::string& value) {
    os_ << "  " << path << " = " << value;
    if (auto it = c_.origins.find(path); it != c_.origins.end()) os_ << "  (" << it->second << ")";
    os_ << "\n";
  }
  void line(const std::string& path, bool v) { line(path, std::string(v ? "true" : "false")); }
  void line(const std::string& path, int v) { line(path, std::to_string(v)); }
  void line(const std::string& path, int64_t v) { line(path, std::to_string(v)); }
  void line(const std::string& path, double v) { line(path, format_double(v)); }
  void line(const std::string& path, const char* v) { line(path, std::string(v)); }
  void str(const std::string& path, const std::string& v) { line(path, "\"" + v + "\""); }
  void str(const std::string& path, const std::optional<std::string>& v) {
    line(path, v ? "\"" + *v + "\"" : std::string("(unset)"));
  }
  void line(const std::string& path, const std::optional<int64_t>& v) {
    line(path, v ? std::to_string(*v) : std::string("(unset)"));
  }
  void line(const std::string& path, const std::optional<double>& v) {
    line(path, v ? format_double(*v) : std::string("(unset)"));
  }
  void line(const std::string& path, const std::array<double, 2>& v) {
    line(path, "[" + format_double(v[0]) + ", " + format_double(v[1]) + "]");
  }
  void line(const std::string& path, const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
    line(path, s + "]");
  }
  void raw(const std::string& text) { os_ << text << "\n"; }
  std::string str() const { return os_.str(); }

 private:
  const Config& c_;
  std::ostringstream os_;
};

void describe_optimizer(Describer& d, const OptimizerConfig& o) {
  if (o.type.empty()) {
    d.line("optimizer", "(none: the program supplies its optimizer)");
    return;
  }
  d.line("optimizer.type", o.type);
  const std::string p = "optimizer.params.";
  if (o.type == "Adam" || o.type == "AdamW") {
    const AdamParams& a = o.adam;
    d.line(p + "lr", a.lr);
    d.line(p + "betas", a.betas);
    d.line(p + "eps", a.eps);
    d.line(p + "weight_decay", a.weight_decay);
    d.line(p + "bias_correction", a.bias_correction);
    d.line(p + "adam_w_mode", a.adam_w_mode);
    d.line(p + "amsgrad", a.amsgrad);
    d.line(p + "torch_adam", a.torch_adam);
  } else if (o.type == "SGD") {
    d.line(p + "lr", o.sgd.lr);
    d.line(p + "momentum", o.sgd.momentum);
    d.line(p + "dampening", o.sgd.dampening);
    d.line(p + "weight_decay", o.sgd.weight_decay);
    d.line(p + "nesterov", o.sgd.nesterov);
  } else if (o.type == "Adagrad") {
    d.line(p + "lr", o.adagrad.lr);
    d.line(p + "lr_decay", o.adagrad.lr_decay);
    d.line(p + "weight_decay", o.adagrad.weight_decay);
    d.line(p + "initial_accumulator_value", o.adagrad.initial_accumulator_value);
    d.line(p + "eps", o.adagrad.eps);
  } else if (o.type == "Lamb") {
    const LambParams& l = o.lamb;
    d.line(p + "lr", l.lr);
    d.line(p + "bias_correction", l.bias_correction);
    d.line(p + "betas", l.betas);
    d.line(p + "eps", l.eps);
    d.line(p + "eps_inside_sqrt", l.eps_inside_sqrt);
    d.line(p + "weight_decay", l.weight_decay);
    d.line(p + "max_grad_norm", l.max_grad_norm);
    d.line(p + "max_coeff", l.max_coeff);
    d.line(p + "min_coeff", l.min_coeff);
    d.line(p + "amsgrad", l.amsgrad);
  } else {
    d.line(p + "lr", o.lion.lr);
    d.line(p + "betas", o.lion.betas);
    d.line(p + "weight_decay", o.lion.weight_decay);
  }
}

void describe_scheduler(Describer& d, const SchedulerConfig& s) {
  if (s.type.empty()) {
    d.line("scheduler", "(none: constant learning rate unless the program supplies one)");
    return;
  }
  d.line("scheduler.type", s.type);
  const std::string p = "scheduler.params.";
  if (s.type == "WarmupLR") {
    const WarmupLRParams& w = s.warmup_lr;
    d.line(p + "warmup_min_lr", w.warmup_min_lr);
    if (w.warmup_max_lr) {
      d.line(p + "warmup_max_lr", w.warmup_max_lr);
    } else {
      d.line(p + "warmup_max_lr", "(unset: the optimizer's lr)");
    }
    d.line(p + "warmup_num_steps", w.warmup_num_steps);
    d.str(p + "warmup_type", w.warmup_type);
    d.line(p + "last_batch_iteration", w.last_batch_iteration);
  } else if (s.type == "WarmupDecayLR") {
    const WarmupDecayLRParams& w = s.warmup_decay_lr;
    d.line(p + "total_num_steps", w.total_num_steps);
    d.line(p + "warmup_min_lr", w.warmup_min_lr);
    d.line(p + "warmup_max_lr", w.warmup_max_lr);
    d.line(p + "warmup_num_steps", w.warmup_num_steps);
    d.str(p + "warmup_type", w.warmup_type);
    d.line(p + "last_batch_iteration", w.last_batch_iteration);
  } else if (s.type == "WarmupCosineLR") {
    const WarmupCosineLRParams& w = s.warmup_cosine_lr;
    d.line(p + "total_num_steps", w.total_num_steps);
    d.line(p + "warmup_min_ratio", w.warmup_min_ratio);
    d.line(p + "warmup_num_steps", w.warmup_num_steps);
    d.line(p + "cos_min_ratio", w.cos_min_ratio);
    d.str(p + "warmup_type", w.warmup_type);
    d.line(p + "last_batch_iteration", w.last_batch_iteration);
  } else if (s.type == "OneCycle") {
    const OneCycleParams& c = s.one_cycle;
    d.line(p + "cycle_min_lr", c.cycle_min_lr);
    d.line(p + "cycle_max_lr", c.cycle_max_lr);
    d.line(p + "decay_lr_rate", c.decay_lr_rate);
    d.line(p + "cycle_first_step_size", c.cycle_first_step_size);
    d.line(p + "cycle_second_step_size", c.cycle_second_step_size);
    d.line(p + "cycle_first_stair_count", c.cycle_first_stair_count);
    d.line(p + "cycle_second_stair_count", c.cycle_second_stair_count);
    d.line(p + "decay_step_size", c.decay_step_size);
    d.line(p + "cycle_momentum", c.cycle_momentum);
    d.line(p + "cycle_min_mom", c.cycle_min_mom);
    d.line(p + "cycle_max_mom", c.cycle_max_mom);
    d.line(p + "decay_mom_rate", c.decay_mom_rate);
    d.line(p + "last_batch_iteration", c.last_batch_iteration);
  } else {
    const LRRangeTestParams& t = s.lr_range_test;
    d.line(p + "lr_range_test_min_lr", t.lr_range_test_min_lr);
    d.line(p + "lr_range_test_step_size", t.lr_range_test_step_size);
    d.line(p + "lr_range_test_step_rate", t.lr_range_test_step_rate);
    d.line(p + "lr_range_test_staircase", t.lr_range_test_staircase);
    d.line(p + "last_batch_iteration", t.last_batch_iteration);
  }
}

void describe_zero(Describer& d, const ZeroConfig& z) {
  const std::string p = "zero_optimization.";
  d.line(p + "stage", z.stage);
  d.line(p + "contiguous_gradients", z.contiguous_gradients);
  if (z.stage == 0) {  // its all-reduces always overlap backward (src/zero/all_reduce.h)
    d.raw("  " + p + "overlap_comm = true  (stage 0 always overlaps its all-reduces with "
          "backward; the key applies to stages 1-3)");
  } else {
    d.line(p + "overlap_comm", z.overlap_comm);
  }
  d.line(p + "reduce_scatter", z.reduce_scatter);
  d.line(p + "reduce_bucket_size", z.reduce_bucket_size);
  d.line(p + "allgather_partitions", z.allgather_partitions);
  d.line(p + "allgather_bucket_size", z.allgather_bucket_size);
  d.line(p + "round_robin_gradients", z.round_robin_gradients);
  d.line(p + "sub_group_size", z.sub_group_size);
  d.line(p + "ignore_unused_parameters", z.ignore_unused_parameters);
  if (z.stage == 3) {
    d.line(p + "stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size);
    d.line(p + "stage3_param_persistence_threshold", z.stage3_param_persistence_threshold);
    d.line(p + "stage3_max_live_parameters", z.stage3_max_live_parameters);
    d.line(p + "stage3_max_reuse_distance", z.stage3_max_reuse_distance);
    d.line(p + "stage3_gather_16bit_weights_on_model_save",
           z.stage3_gather_16bit_weights_on_model_save);
    d.line(p + "leaf_module.classes", z.leaf_module.classes);
    d.line(p + "leaf_module.names", z.leaf_module.names);
    d.line(p + "leaf_module.name_suffixes", z.leaf_module.name_suffixes);
  }
  const OffloadOptimizerConfig& oo = z.offload_optimizer;
  d.str(p + "offload_optimizer.device", oo.device);
  if (oo.device != "none") {
    d.str(p + "offload_optimizer.nvme_path", oo.nvme_path);
    d.line(p + "offload_optimizer.buffer_count", oo.buffer_count);
    d.line(p + "offload_optimizer.pin_memory", oo.pin_memory);
    d.line(p + "offload_optimizer.pipeline_read", oo.pipeline_read);
    d.line(p + "offload_optimizer.pipeline_write", oo.pipeline_write);
    d.line(p + "offload_optimizer.fast_init", oo.fast_init);
    d.line(p + "offload_optimizer.ratio", oo.ratio);
  }
  const OffloadParamConfig& op = z.offload_param;
  d.str(p + "offload_param.device", op.device);
  if (op.device != "none") {
    d.str(p + "offload_param.nvme_path", op.nvme_path);
    d.line(p + "offload_param.buffer_count", op.buffer_count);
    d.line(p + "offload_param.buffer_size", op.buffer_size);
    d.line(p + "offload_param.max_in_cpu", op.max_in_cpu);
    d.line(p + "offload_param.pin_memory", op.pin_memory);
  }
}

void describe_batch(Describer& d, const Config& c) {
  const BatchSizes& b = c.batch;
  if (b.resolved()) {
    d.line("train_batch_size", b.train_batch_size);
    d.line("train_micro_batch_size_per_gpu", b.train_micro_batch_size_per_gpu);
    d.line("gradient_accumulation_steps", b.gradient_accumulation_steps);
    d.line("world size", std::to_string(b.world_size) + " (" + b.world_source + ")");
    return;
  }
  auto given = [](const std::optional<int>& v) {
    return v ? std::to_string(*v) : std::string("(not given)");
  };
  d.line("train_batch_size", given(c.train_batch_size));
  d.line("train_micro_batch_size_per_gpu", given(c.train_micro_batch_size_per_gpu));
  d.line("gradient_accumulation_steps", given(c.gradient_accumulation_steps));
  d.raw("  (batch sizes not resolved yet: resolve_batch() needs the world size)");
}

}  // namespace

std::string Config::describe() const {
  Describer d(*this);
  d.raw("DeepSpeed config from " + source + ":");
  describe_batch(d, *this);
  d.line("gradient_clipping", gradient_clipping);
  d.line("steps_per_print", steps_per_print);
  d.line("wall_clock_breakdown", wall_clock_breakdown);
  d.line("prescale_gradients", prescale_gradients);
  d.line("gradient_predivide_factor", gradient_predivide_factor);
  d.line("zero_allow_untested_optimizer", zero_allow_untested_optimizer);
  d.line("communication_data_type", communication_data_type
                                        ? "\"" + *communication_data_type + "\""
                                        : std::string("(unset: the training precision)"));
  d.line("dump_state", dump_state);
  d.line("seed", seed);
  describe_optimizer(d, optimizer);
  describe_scheduler(d, scheduler);
  d.line("fp16.enabled", fp16.enabled);
  if (fp16.enabled) {
    d.line("fp16.auto_cast", fp16.auto_cast);
    d.line("fp16.loss_scale", fp16.loss_scale);
    d.line("fp16.initial_scale_power", fp16.initial_scale_power);
    d.line("fp16.loss_scale_window", fp16.loss_scale_window);
    d.line("fp16.hysteresis", fp16.hysteresis);
    d.line("fp16.consecutive_hysteresis", fp16.consecutive_hysteresis);
    d.line("fp16.min_loss_scale", fp16.min_loss_scale);
  }
  d.line("bf16.enabled", bf16.enabled);
  describe_zero(d, zero_optimization);
  if (zero_optimization.offload_optimizer.device == "nvme" ||
      zero_optimization.offload_param.device == "nvme") {
    d.line("aio.block_size", aio.block_size);
    d.line("aio.queue_depth", aio.queue_depth);
    d.line("aio.thread_count", aio.thread_count);
    d.line("aio.single_submit", aio.single_submit);
    d.line("aio.overlap_events", aio.overlap_events);
  }
  const ActivationCheckpointingConfig& ac = activation_checkpointing;
  d.line("activation_checkpointing.partition_activations", ac.partition_activations);
  d.line("activation_checkpointing.cpu_checkpointing", ac.cpu_checkpointing);
  d.line("activation_checkpointing.contiguous_memory_optimization",
         ac.contiguous_memory_optimization);
  d.line("activation_checkpointing.number_checkpoints", ac.number_checkpoints);
  d.line("activation_checkpointing.synchronize_checkpoint_boundary",
         ac.synchronize_checkpoint_boundary);
  d.line("activation_checkpointing.profile", ac.profile);
  d.str("checkpoint.tag_validation", checkpoint.tag_validation);
  d.line("checkpoint.load_universal", checkpoint.load_universal);
  d.line("checkpoint.use_node_local_storage", checkpoint.use_node_local_storage);
  d.line("checkpoint.parallel_write.pipeline_stage", checkpoint.parallel_write.pipeline_stage);
  d.line("comms_logger.enabled", comms_logger.enabled);
  if (comms_logger.enabled) {
    d.line("comms_logger.verbose", comms_logger.verbose);
    d.line("comms_logger.prof_all", comms_logger.prof_all);
    d.line("comms_logger.debug", comms_logger.debug);
    d.line("comms_logger.prof_ops", "[" + join(comms_logger.prof_ops, ", ") + "]");
  }
  d.line("flops_profiler.enabled", flops_profiler.enabled);
  if (flops_profiler.enabled) {
    d.line("flops_profiler.profile_step", flops_profiler.profile_step);
    d.line("flops_profiler.module_depth", flops_profiler.module_depth);
    d.line("flops_profiler.top_modules", flops_profiler.top_modules);
    d.line("flops_profiler.detailed", flops_profiler.detailed);
    d.str("flops_profiler.output_file", flops_profiler.output_file);
  }
  auto monitor = [&d](const std::string& name, const MonitorConfig& m) {
    d.line(name + ".enabled", m.enabled);
    if (m.enabled) {
      d.str(name + ".output_path", m.output_path);
      d.str(name + ".job_name", m.job_name);
    }
  };
  monitor("csv_monitor", csv_monitor);
  monitor("tensorboard", tensorboard);
  d.line("wandb.enabled", wandb.enabled);
  if (wandb.enabled) {
    d.str("wandb.group", wandb.group);
    d.str("wandb.team", wandb.team);
    d.str("wandb.project", wandb.project);
  }
  d.line("comet.enabled", comet.enabled);
  if (!warnings.empty()) {
    d.raw("warnings and notes:");
    for (const std::string& w : warnings) d.raw("  - " + w);
  }
  return d.str();
}

}  // namespace dscpp
