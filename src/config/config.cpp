// Implements Config::parse / from_json and Config::describe(). Each DeepSpeed config section's
// plain keys are one table (NOTE [config keys] in keys.h) that both read and describe; what a
// table line cannot say (deprecated spellings, defaults that depend on another key, rules over
// two keys, the scheduler's required keys) is code in the section's parse function, reading
// through the same JsonReader (NOTE [strict config reading]). The batch triangle lives in
// batch.cpp.
#include "dscpp/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "config/json_reader.h"
#include "config/key_verdicts.h"
#include "config/keys.h"
#include "dscpp/error.h"
#include "util/log.h"
#include "util/strings.h"

namespace dscpp {

using config::above;
using config::at_least;
using config::beta;
using config::betas;
using config::Describer;
using config::even_above_zero;
using config::format_double;
using config::fraction;
using config::JsonReader;
using config::Keys;
using config::ParseNotes;
using config::Rule;
using nlohmann::json;

namespace {

// ----- sections ---------------------------------------------------------------------------------

// describe()'s condition for a section's keys past `enabled`.
template <typename S>
bool enabled(const S& s) {
  return s.enabled;
}

// A section that is its table alone.
template <typename S>
void read_section(JsonReader& root, std::string_view name, const Keys<S>& keys, S* s) {
  JsonReader r = root.child(name);
  keys.read(r, *s);
  r.finish();
}

// ----- optimizer ------------------------------------------------------------------------------

const std::vector<std::string> kOptimizerTypes = {"Adam", "AdamW", "SGD", "Adagrad",
                                                  "Lamb", "Lion",  "Muon"};
// DeepSpeed optimizers dscpp does not implement (deepspeed/runtime/config.py).
const std::vector<std::string> kDeepSpeedOnlyOptimizers = {
    "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD"};

const Keys<AdamParams>& adam_keys() {
  using A = AdamParams;
  static const Keys<A> k = Keys<A>()
                               .key("lr", &A::lr, at_least(0.0))
                               .key("betas", &A::betas, betas())
                               .key("eps", &A::eps, at_least(0.0))
                               .key("weight_decay", &A::weight_decay, at_least(0.0))
                               .key("bias_correction", &A::bias_correction)
                               .key("adam_w_mode", &A::adam_w_mode)
                               .key("amsgrad", &A::amsgrad)
                               .key("torch_adam", &A::torch_adam);
  return k;
}

void parse_adam(JsonReader& p, bool adamw, AdamParams* a) {
  adam_keys().read(p, *a);
  if (adamw && !a->adam_w_mode) {
    p.notes().warn(p.path("adam_w_mode") +
                   " is false but type AdamW always decouples weight decay (as in DeepSpeed); "
                   "ignored. HINT: use type Adam with adam_w_mode false for L2 regularisation");
    a->adam_w_mode = true;
  }
  if (a->amsgrad)
    p.fail("amsgrad", "true is not supported (DeepSpeed's fused Adam rejects it too)");
}

const Keys<SgdParams>& sgd_keys() {
  using S = SgdParams;
  static const Keys<S> k = Keys<S>()
                               .key("lr", &S::lr, at_least(0.0))
                               .key("momentum", &S::momentum, at_least(0.0))
                               .key("dampening", &S::dampening)
                               .key("weight_decay", &S::weight_decay, at_least(0.0))
                               .key("nesterov", &S::nesterov);
  return k;
}

void parse_sgd(JsonReader& p, SgdParams* s) {
  sgd_keys().read(p, *s);
  if (s->nesterov && (s->momentum <= 0.0 || s->dampening != 0.0))
    p.fail("nesterov",
           "true needs momentum > 0 and dampening 0 (as torch.optim.SGD), got momentum " +
               format_double(s->momentum) + ", dampening " + format_double(s->dampening));
}

const Keys<AdagradParams>& adagrad_keys() {
  using A = AdagradParams;
  static const Keys<A> k =
      Keys<A>()
          .key("lr", &A::lr, at_least(0.0))
          .key("lr_decay", &A::lr_decay, at_least(0.0))
          .key("weight_decay", &A::weight_decay, at_least(0.0))
          .key("initial_accumulator_value", &A::initial_accumulator_value, at_least(0.0))
          .key("eps", &A::eps, at_least(0.0));
  return k;
}

const Keys<LambParams>& lamb_keys() {
  using L = LambParams;
  static const Keys<L> k = Keys<L>()
                               .key("lr", &L::lr, at_least(0.0))
                               .key("bias_correction", &L::bias_correction)
                               .key("betas", &L::betas, betas())
                               .key("eps", &L::eps, at_least(0.0))
                               .key("eps_inside_sqrt", &L::eps_inside_sqrt)
                               .key("weight_decay", &L::weight_decay, at_least(0.0))
                               .key("max_grad_norm", &L::max_grad_norm, at_least(0.0))
                               .key("max_coeff", &L::max_coeff)
                               .key("min_coeff", &L::min_coeff)
                               .key("amsgrad", &L::amsgrad);
  return k;
}

void parse_lamb(JsonReader& p, LambParams* l) {
  lamb_keys().read(p, *l);
  if (!(l->min_coeff <= l->max_coeff))
    p.fail("min_coeff", "must be <= max_coeff " + format_double(l->max_coeff) + ", got " +
                            format_double(l->min_coeff));
  if (l->amsgrad) p.fail("amsgrad", "true is not supported (DeepSpeed's FusedLamb rejects it too)");
}

const Keys<LionParams>& lion_keys() {
  using L = LionParams;
  static const Keys<L> k = Keys<L>()
                               .key("lr", &L::lr, at_least(0.0))
                               .key("betas", &L::betas, betas())
                               .key("weight_decay", &L::weight_decay, at_least(0.0));
  return k;
}

const Keys<MuonParams>& muon_keys() {
  using M = MuonParams;
  static const Keys<M> k =
      Keys<M>()
          .key("lr", &M::lr, when_set(at_least(0.0)))
          .unset_means("Muon half 0.02, Adam half 3e-4")
          .key("muon_lr", &M::muon_lr, when_set(at_least(0.0)))
          .unset_means("lr")
          .key("adam_lr", &M::adam_lr, when_set(at_least(0.0)))
          .unset_means("lr")
          .key("momentum", &M::momentum, beta())
          .key("weight_decay", &M::weight_decay, at_least(0.0))
          .key("betas", &M::betas, betas())
          .key("eps", &M::eps, at_least(0.0))
          .key("ns_method", &M::ns_method, config::one_of({"gram", "standard"}))
          .key("adam_w_mode", &M::adam_w_mode);
  return k;
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
  JsonReader p = r.child("params");
  if (o->type == "Adam" || o->type == "AdamW") {
    parse_adam(p, o->type == "AdamW", &o->adam);
  } else if (o->type == "SGD") {
    parse_sgd(p, &o->sgd);
  } else if (o->type == "Adagrad") {
    adagrad_keys().read(p, o->adagrad);
  } else if (o->type == "Lamb") {
    parse_lamb(p, &o->lamb);
  } else if (o->type == "Muon") {
    muon_keys().read(p, o->muon);
    p.read_not_honoured();
  } else {
    lion_keys().read(p, o->lion);
  }
  p.finish();
  r.read_not_honoured();
  r.finish();
}

// ----- scheduler ------------------------------------------------------------------------------

const std::vector<std::string> kSchedulerTypes = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                  "OneCycle", "LRRangeTest"};

const char* const kWhyTotal = "the schedule needs the total number of optimizer steps";

Rule<std::string> warmup_types() { return config::one_of({"log", "linear"}); }

const Keys<WarmupLRParams>& warmup_lr_keys() {
  using W = WarmupLRParams;
  static const Keys<W> k =
      Keys<W>()
          .key("warmup_min_lr", &W::warmup_min_lr, at_least(0.0))
          .key("warmup_max_lr", &W::warmup_max_lr)
          .unset_means("the optimizer's lr")
          .key("warmup_num_steps", &W::warmup_num_steps, at_least<int64_t>(0))
          .key("warmup_type", &W::warmup_type, warmup_types())
          .key("last_batch_iteration", &W::last_batch_iteration, at_least<int64_t>(-1));
  return k;
}

const Keys<WarmupDecayLRParams>& warmup_decay_lr_keys() {
  using W = WarmupDecayLRParams;
  static const Keys<W> k =
      Keys<W>()
          .required("total_num_steps", &W::total_num_steps, kWhyTotal, above<int64_t>(0))
          .key("warmup_min_lr", &W::warmup_min_lr, at_least(0.0))
          .key("warmup_max_lr", &W::warmup_max_lr)
          .key("warmup_num_steps", &W::warmup_num_steps, at_least<int64_t>(0))
          .key("warmup_type", &W::warmup_type, warmup_types())
          .key("last_batch_iteration", &W::last_batch_iteration, at_least<int64_t>(-1));
  return k;
}

const Keys<WarmupCosineLRParams>& warmup_cosine_lr_keys() {
  using W = WarmupCosineLRParams;
  static const Keys<W> k =
      Keys<W>()
          .required("total_num_steps", &W::total_num_steps, kWhyTotal, above<int64_t>(0))
          .key("warmup_min_ratio", &W::warmup_min_ratio, fraction())
          .key("warmup_num_steps", &W::warmup_num_steps, at_least<int64_t>(0))
          .key("cos_min_ratio", &W::cos_min_ratio, fraction())
          .key("warmup_type", &W::warmup_type, warmup_types())
          .key("last_batch_iteration", &W::last_batch_iteration, at_least<int64_t>(-1));
  return k;
}

const Keys<OneCycleParams>& one_cycle_keys() {
  using C = OneCycleParams;
  static const Keys<C> k =
      Keys<C>()
          .required("cycle_min_lr", &C::cycle_min_lr, "it is the lower LR of the cycle",
                    at_least(0.0))
          .required("cycle_max_lr", &C::cycle_max_lr, "it is the upper LR of the cycle")
          .key("decay_lr_rate", &C::decay_lr_rate, at_least(0.0))
          .key("cycle_first_step_size", &C::cycle_first_step_size, above<int64_t>(0))
          .key("cycle_second_step_size", &C::cycle_second_step_size,
               config::when_set(above<int64_t>(0)))
          .key("cycle_first_stair_count", &C::cycle_first_stair_count, at_least<int64_t>(0))
          .key("cycle_second_stair_count", &C::cycle_second_stair_count,
               config::when_set(at_least<int64_t>(0)))
          .key("decay_step_size", &C::decay_step_size, at_least<int64_t>(0))
          .key("cycle_momentum", &C::cycle_momentum)
          .key("cycle_min_mom", &C::cycle_min_mom, fraction())
          .key("cycle_max_mom", &C::cycle_max_mom, fraction())
          .key("decay_mom_rate", &C::decay_mom_rate, at_least(0.0))
          .key("last_batch_iteration", &C::last_batch_iteration, at_least<int64_t>(-1));
  return k;
}

const Keys<LRRangeTestParams>& lr_range_test_keys() {
  using T = LRRangeTestParams;
  static const Keys<T> k =
      Keys<T>()
          .key("lr_range_test_min_lr", &T::lr_range_test_min_lr, at_least(0.0))
          .key("lr_range_test_step_size", &T::lr_range_test_step_size, above<int64_t>(0))
          .key("lr_range_test_step_rate", &T::lr_range_test_step_rate, at_least(0.0))
          .key("lr_range_test_staircase", &T::lr_range_test_staircase)
          .key("last_batch_iteration", &T::last_batch_iteration, at_least<int64_t>(-1));
  return k;
}

// DeepSpeed warns when the warmup is longer than the whole schedule.
void warn_short_schedule(const JsonReader& p, int64_t total, int64_t warmup) {
  if (total < warmup)
    p.notes().warn(p.path("total_num_steps") + " " + std::to_string(total) +
                   " is less than warmup_num_steps " + std::to_string(warmup) +
                   " (DeepSpeed warns too)");
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
  if (s->type == "WarmupLR") {
    WarmupLRParams& w = s->warmup_lr;
    warmup_lr_keys().read(p, w);
    if (w.warmup_max_lr) at_least(w.warmup_min_lr).check(p, "warmup_max_lr", *w.warmup_max_lr);
  } else if (s->type == "WarmupDecayLR") {
    WarmupDecayLRParams& w = s->warmup_decay_lr;
    warmup_decay_lr_keys().read(p, w);
    at_least(w.warmup_min_lr).check(p, "warmup_max_lr", w.warmup_max_lr);
    warn_short_schedule(p, w.total_num_steps, w.warmup_num_steps);
  } else if (s->type == "WarmupCosineLR") {
    WarmupCosineLRParams& w = s->warmup_cosine_lr;
    warmup_cosine_lr_keys().read(p, w);
    warn_short_schedule(p, w.total_num_steps, w.warmup_num_steps);
  } else if (s->type == "OneCycle") {
    OneCycleParams& c = s->one_cycle;
    one_cycle_keys().read(p, c);
    at_least(c.cycle_min_lr).check(p, "cycle_max_lr", c.cycle_max_lr);
  } else {
    lr_range_test_keys().read(p, s->lr_range_test);
  }
  p.finish();
  r.finish();
}

// ----- precision ------------------------------------------------------------------------------

// initial_scale_power: 2^p must be a finite float scale.
Rule<int> scale_power() {
  return {[](const JsonReader& r, std::string_view key, const int& v) {
    at_least(0).check(r, key, v);
    if (v >= 64) r.fail(key, "must be < 64, got " + std::to_string(v));
  }};
}

const Keys<Fp16Config>& fp16_keys() {
  using F = Fp16Config;
  static const Keys<F> k =
      Keys<F>()
          .key("enabled", &F::enabled)
          .key("auto_cast", &F::auto_cast, {}, enabled<F>)
          .key("loss_scale", &F::loss_scale, at_least(0.0), enabled<F>)
          .key("initial_scale_power", &F::initial_scale_power, scale_power(), enabled<F>)
          .key("loss_scale_window", &F::loss_scale_window, above(0), enabled<F>)
          .key("hysteresis", &F::hysteresis, at_least(1), enabled<F>)
          .key("consecutive_hysteresis", &F::consecutive_hysteresis, {}, enabled<F>)
          .key("min_loss_scale", &F::min_loss_scale, above(0.0), enabled<F>);
  return k;
}

void parse_fp16(JsonReader& root, Fp16Config* f) {
  JsonReader r = root.child("fp16");
  fp16_keys().read(r, *f);
  r.read_not_honoured();
  r.finish();
}

void parse_bf16(JsonReader& root, Bf16Config* b) {
  // DeepSpeed reads "bf16", or its old name "bfloat16" when "bf16" is absent.
  const bool old_name = root.has("bfloat16");
  if (old_name && root.has("bf16"))
    root.fail("bfloat16", "both 'bf16' and its old name 'bfloat16' are given. HINT: keep 'bf16'");
  root.raw(old_name ? "bf16" : "bfloat16");
  JsonReader r = root.child(old_name ? "bfloat16" : "bf16", /*null_is_absent=*/true);
  r.get("enabled", &b->enabled);
  r.get("immediate_grad_update", &b->immediate_grad_update);
  // DeepSpeed 0.18.3+: bf16 master weights and gradients (check_supported judges it with the
  // stage and offload); 0.19.1+: bf16 optimizer states (with them).
  r.get("bf16_master_weights_and_grads", &b->bf16_master_weights_and_grads);
  r.get("bf16_optimizer_states", &b->bf16_optimizer_states);
  r.read_not_honoured();
  r.finish();
}

// ----- zero_optimization ----------------------------------------------------------------------

void read_offload_device(JsonReader& r, std::string* device,
                         std::optional<std::string>* nvme_path) {
  r.get("device", device);
  config::one_of({"none", "cpu", "nvme"}).check(r, "device", *device);
  r.get("nvme_path", nvme_path);
  if (*device == "nvme" && (!*nvme_path || (*nvme_path)->empty()))
    r.fail("nvme_path",
           "is required when device is \"nvme\". HINT: set it to a folder on a "
           "fast local disk");
}

template <typename S>
bool offloaded(const S& o) {
  return o.device != "none";
}

const Keys<OffloadOptimizerConfig>& offload_optimizer_keys() {
  using O = OffloadOptimizerConfig;
  static const Keys<O> k =
      Keys<O>()
          .key("buffer_count", &O::buffer_count, at_least<int64_t>(0), offloaded<O>)
          .key("pin_memory", &O::pin_memory, {}, offloaded<O>)
          .key("pipeline_read", &O::pipeline_read, {}, offloaded<O>)
          .key("pipeline_write", &O::pipeline_write, {}, offloaded<O>)
          .key("fast_init", &O::fast_init, {}, offloaded<O>)
          .key("ratio", &O::ratio, fraction(), offloaded<O>);
  return k;
}

void parse_offload_optimizer(JsonReader& zr, OffloadOptimizerConfig* o) {
  JsonReader r = zr.child("offload_optimizer");
  read_offload_device(r, &o->device, &o->nvme_path);
  offload_optimizer_keys().read(r, *o);
  r.read_not_honoured();
  r.finish();
}

const Keys<OffloadParamConfig>& offload_param_keys() {
  using O = OffloadParamConfig;
  static const Keys<O> k =
      Keys<O>()
          .key("buffer_count", &O::buffer_count, at_least<int64_t>(0), offloaded<O>)
          .key("buffer_size", &O::buffer_size, at_least<int64_t>(0), offloaded<O>)
          .key("max_in_cpu", &O::max_in_cpu, at_least<int64_t>(0), offloaded<O>)
          .key("pin_memory", &O::pin_memory, {}, offloaded<O>);
  return k;
}

void parse_offload_param(JsonReader& zr, OffloadParamConfig* o) {
  JsonReader r = zr.child("offload_param");
  read_offload_device(r, &o->device, &o->nvme_path);
  offload_param_keys().read(r, *o);
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

bool zero_stage3(const ZeroConfig& z) { return z.stage == 3; }

const Keys<ZeroConfig>& zero_keys() {
  using Z = ZeroConfig;
  static const Keys<Z> k =
      Keys<Z>()
          .key("contiguous_gradients", &Z::contiguous_gradients)
          .key("reduce_scatter", &Z::reduce_scatter)
          .key("reduce_bucket_size", &Z::reduce_bucket_size, above<int64_t>(0))
          .key("allgather_partitions", &Z::allgather_partitions)
          .key("allgather_bucket_size", &Z::allgather_bucket_size, even_above_zero())
          .key("round_robin_gradients", &Z::round_robin_gradients)
          .key("zero_quantized_weights", &Z::zero_quantized_weights)
          .key("zero_quantized_gradients", &Z::zero_quantized_gradients)
          .key("zero_hpz_partition_size", &Z::zero_hpz_partition_size, at_least<int64_t>(0))
          .key("sub_group_size", &Z::sub_group_size, above<int64_t>(0))
          .key("ignore_unused_parameters", &Z::ignore_unused_parameters)
          .key("stage3_prefetch_bucket_size", &Z::stage3_prefetch_bucket_size, at_least<int64_t>(0),
               zero_stage3, "prefetch_bucket_size")
          .key("stage3_allgather_sequential", &Z::stage3_allgather_sequential, {}, zero_stage3,
               "allgather_sequential")
          .key("stage3_param_persistence_threshold", &Z::stage3_param_persistence_threshold,
               at_least<int64_t>(0), zero_stage3, "param_persistence_threshold")
          .key("stage3_max_live_parameters", &Z::stage3_max_live_parameters, at_least<int64_t>(0),
               zero_stage3, "max_live_parameters")
          .key("stage3_max_reuse_distance", &Z::stage3_max_reuse_distance, at_least<int64_t>(0),
               zero_stage3, "max_reuse_distance");
  return k;
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
  // DeepSpeed: overlap_comm defaults to (stage == 3).
  z->overlap_comm = z->stage == 3;
  // null (DeepSpeed's Optional[bool]) is the stage's default too.
  const bool overlap_null = r.raw("overlap_comm") && r.raw("overlap_comm")->is_null();
  if (overlap_null || !r.get("overlap_comm", &z->overlap_comm))
    r.notes().set_origin(
        r.path("overlap_comm"),
        (r.notes().origins && r.notes().origins->count(r.path("overlap_comm")) ? "auto -> " : "") +
            std::string("default for stage ") + std::to_string(z->stage));
  zero_keys().read(r, *z);
  // DeepSpeed's stage 3 with allgather_sequential prefetches a bucket of one element.
  if (z->stage == 3 && z->stage3_allgather_sequential && z->stage3_prefetch_bucket_size != 1) {
    if (r.has("stage3_prefetch_bucket_size") || r.has("prefetch_bucket_size"))
      r.notes().warn(r.path("stage3_prefetch_bucket_size") + " " +
                     std::to_string(z->stage3_prefetch_bucket_size) +
                     " is replaced by 1: allgather_sequential sets it (as in DeepSpeed)");
    z->stage3_prefetch_bucket_size = 1;
    r.notes().set_origin(r.path("stage3_prefetch_bucket_size"), "1 by allgather_sequential");
  }
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
  parse_leaf_module(r, &z->leaf_module);
  parse_offload_optimizer(r, &z->offload_optimizer);
  parse_offload_param(r, &z->offload_param);

  // Deprecated spellings DeepSpeed still maps onto offload_optimizer / offload_param; null (their
  // default in DeepSpeed) is absent.
  auto given = [&r](const char* key) {
    const json* v = r.raw(key);
    return v && !v->is_null();
  };
  bool flag = false;
  if (given("cpu_offload") && r.get("cpu_offload", &flag)) {
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
  if (given("cpu_offload_param") && r.get("cpu_offload_param", &flag)) {
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
  if (given("cpu_offload_use_pin_memory") && r.get("cpu_offload_use_pin_memory", &flag))
    r.notes().warn(r.path("cpu_offload_use_pin_memory") +
                   " is deprecated and ignored (as in DeepSpeed). HINT: use "
                   "offload_optimizer.pin_memory / offload_param.pin_memory");

  // The rest of ZeRO++: their defaults (off) are accepted; asking for them is refused.
  bool flag_on = false;
  if (r.get("zero_quantized_nontrainable_weights", &flag_on) && flag_on) {
    r.fail("zero_quantized_nontrainable_weights",
           "true (frozen weights stored as int8) is not implemented yet: stage 3 keeps frozen "
           "parameters in the training dtype. HINT: remove it or set false");
  }
  r.read_not_honoured();
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
    // Only those set to another value than their default: a default says nothing.
    const ZeroConfig d;
    const std::pair<const char*, bool> stage3_keys[] = {
        {"stage3_prefetch_bucket_size",
         z->stage3_prefetch_bucket_size != d.stage3_prefetch_bucket_size},
        {"stage3_param_persistence_threshold",
         z->stage3_param_persistence_threshold != d.stage3_param_persistence_threshold},
        {"stage3_max_live_parameters",
         z->stage3_max_live_parameters != d.stage3_max_live_parameters},
        {"stage3_max_reuse_distance", z->stage3_max_reuse_distance != d.stage3_max_reuse_distance},
        {"leaf_module", !z->leaf_module.empty()},
        {"zero_quantized_weights", z->zero_quantized_weights},
        {"zero_quantized_gradients", z->zero_quantized_gradients},
        {"zero_hpz_partition_size", z->zero_hpz_partition_size != d.zero_hpz_partition_size}};
    std::string given;
    for (const auto& [key, set] : stage3_keys)
      if (set) given += (given.empty() ? "" : ", ") + std::string(key);
    if (!given.empty()) {
      r.notes().warn("zero_optimization." + given + ": stage 3 settings have no effect at stage " +
                     std::to_string(z->stage) + "; ignored");
    }
  }
}

// ----- the smaller sections -------------------------------------------------------------------

const Keys<AioConfig>& aio_keys() {
  using A = AioConfig;
  static const Keys<A> k =
      Keys<A>()
          .key("block_size", &A::block_size, above<int64_t>(0))
          .key("queue_depth", &A::queue_depth, above<int64_t>(0))
          // DeepSpeed's newer spelling of the I/O threads per rank.
          .key("thread_count", &A::thread_count, above<int64_t>(0), nullptr, "intra_op_parallelism")
          .key("single_submit", &A::single_submit)
          .key("overlap_events", &A::overlap_events);
  return k;
}

void parse_aio(JsonReader& root, AioConfig* a) {
  JsonReader r = root.child("aio", /*null_is_absent=*/true);
  aio_keys().read(r, *a);
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
  r.get("cpu_checkpointing", &a->cpu_checkpointing);
  r.read_not_honoured();
  r.finish();
}

// DeepSpeed's DtypeEnum spellings (exact case) of fp32, fp16 and bf16, read as those three;
// anything else (int8 is a DtypeEnum too) fails naming `key`.
std::string canonical_dtype(JsonReader& r, std::string_view key, const std::string& value) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kNames = {
      {"fp32", {"fp32", "float32", "float", "torch.float32"}},
      {"fp16", {"fp16", "float16", "half", "torch.float16"}},
      {"bf16", {"bf16", "bfloat16", "torch.bfloat16"}}};
  for (const auto& [name, spellings] : kNames) {
    if (std::find(spellings.begin(), spellings.end(), value) != spellings.end()) return name;
  }
  r.fail(key,
         "must be fp32, fp16 or bf16 (or DeepSpeed's other spellings of them, such as "
         "float32 or torch.bfloat16), got \"" +
             value + "\"");
  return "";
}

void parse_data_types(JsonReader& root, DataTypesConfig* d) {
  JsonReader r = root.child("data_types");
  if (r.get("grad_accum_dtype", &d->grad_accum_dtype) && d->grad_accum_dtype)
    d->grad_accum_dtype = canonical_dtype(r, "grad_accum_dtype", *d->grad_accum_dtype);
  r.read_not_honoured();
  r.finish();
}

void parse_torch_autocast(JsonReader& root, TorchAutocastConfig* t) {
  JsonReader r = root.child("torch_autocast");
  r.get("enabled", &t->enabled);
  if (r.get("dtype", &t->dtype) && t->dtype) t->dtype = canonical_dtype(r, "dtype", *t->dtype);
  // null: unset (DeepSpeed's default list), as absent.
  constexpr const char* kModules = "lower_precision_safe_modules";
  std::vector<std::string> modules;
  const bool null = r.has(kModules) && r.raw(kModules)->is_null();
  if (!null && r.get(kModules, &modules)) t->lower_precision_safe_modules = modules;
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
  {
    CheckpointWriterConfig& cw = c->writer;
    cw.given = r.has("writer");
    JsonReader w = r.child("writer", /*null_is_absent=*/true);
    // DeepSpeed upper-cases type and data_parallel before it checks them.
    auto upper = [](std::string v) {
      for (char& ch : v) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      return v;
    };
    std::string type = cw.type;
    w.get("type", &type);
    cw.type = upper(type);
    if (cw.type != "FAST" && cw.type != "PYTHON" && cw.type != "MOCK")
      w.fail("type", "must be one of mock, python, fast (any case), got \"" + type + "\"");
    w.get("decoupled", &cw.decoupled);
    w.get("io_buffer_size", &cw.io_buffer_size);
    if (cw.io_buffer_size < (int64_t{1} << 20))
      w.fail("io_buffer_size",
             "must be at least 1048576 (1 MiB), got " + std::to_string(cw.io_buffer_size));
    if (w.has("io_buffer_double")) {
      bool v = true;
      w.get("io_buffer_double", &v);
      cw.io_buffer_double = v;
    }
    w.get("show_statistics", &cw.show_statistics);
    std::optional<std::string> dp;
    w.get("data_parallel", &dp);
    if (dp) {
      cw.data_parallel = upper(*dp);
      if (cw.data_parallel != "REPLICA" && cw.data_parallel != "SOCKET" &&
          cw.data_parallel != "MACHINE")
        w.fail("data_parallel",
               "must be one of replica, socket, machine (any case), got \"" + *dp + "\"");
    }
    w.get("io_multiplier", &cw.io_multiplier);
    w.finish();
  }
  r.read_not_honoured();
  r.finish();
}

const Keys<CommsLoggerConfig>& comms_logger_keys() {
  using C = CommsLoggerConfig;
  static const Keys<C> k = Keys<C>()
                               .key("enabled", &C::enabled)
                               .key("verbose", &C::verbose, {}, enabled<C>)
                               .key("prof_all", &C::prof_all, {}, enabled<C>)
                               .key("debug", &C::debug, {}, enabled<C>)
                               .key("prof_ops", &C::prof_ops, {}, enabled<C>);
  return k;
}

const Keys<FlopsProfilerConfig>& flops_profiler_keys() {
  using F = FlopsProfilerConfig;
  static const Keys<F> k =
      Keys<F>()
          .key("enabled", &F::enabled)
          .key("profile_step", &F::profile_step, at_least<int64_t>(0), enabled<F>)
          .key("module_depth", &F::module_depth, at_least<int64_t>(-1), enabled<F>)
          .key("top_modules", &F::top_modules, at_least<int64_t>(0), enabled<F>)
          .key("detailed", &F::detailed, {}, enabled<F>)
          .key("output_file", &F::output_file, {}, enabled<F>);
  return k;
}

void parse_flops_profiler(JsonReader& root, FlopsProfilerConfig* f) {
  JsonReader r = root.child("flops_profiler");
  flops_profiler_keys().read(r, *f);
  r.read_not_honoured();
  r.finish();
}

const Keys<MonitorConfig>& monitor_keys() {
  using M = MonitorConfig;
  static const Keys<M> k = Keys<M>()
                               .key("enabled", &M::enabled)
                               .key("output_path", &M::output_path, {}, enabled<M>)
                               .key("job_name", &M::job_name, {}, enabled<M>);
  return k;
}

const Keys<ElasticityConfig>& elasticity_keys() {
  using E = ElasticityConfig;
  static const Rule<std::vector<int64_t>> sizes{
      [](const JsonReader& r, std::string_view key, const std::vector<int64_t>& v) {
        if (v.empty()) r.fail(key, "must list at least one micro batch size");
        for (int64_t m : v)
          if (m <= 0) r.fail(key, "must hold positive integers, got " + std::to_string(m));
      }};
  static const Rule<int64_t> no_model_parallel{
      [](const JsonReader& r, std::string_view key, const int64_t& v) {
        if (v != 1)
          r.fail(key, std::to_string(v) +
                          " is not supported: dscpp has no model parallelism. HINT: remove it");
      }};
  static const Rule<double> versions{[](const JsonReader& r, std::string_view key,
                                        const double& v) {
    if (v != 0.1 && v != 0.2)
      r.fail(key, "must be 0.1 or 0.2 (DeepSpeed's elasticity versions), got " + format_double(v));
  }};
  static const Keys<E> k =
      Keys<E>()
          .key("enabled", &E::enabled)
          .key("max_train_batch_size", &E::max_train_batch_size, above<int64_t>(0), enabled<E>)
          .key("micro_batch_sizes", &E::micro_batch_sizes, sizes, enabled<E>)
          .key("min_gpus", &E::min_gpus, at_least<int64_t>(1), enabled<E>)
          .key("max_gpus", &E::max_gpus, at_least<int64_t>(1), enabled<E>)
          .key("num_gpus_per_node", &E::num_gpus_per_node, at_least<int64_t>(1), enabled<E>)
          .key("model_parallel_size", &E::model_parallel_size, no_model_parallel, enabled<E>)
          .key("min_time", &E::min_time, at_least(0.0), enabled<E>)
          .key("prefer_larger_batch", &E::prefer_larger_batch, {}, enabled<E>)
          .key("ignore_non_elastic_batch_info", &E::ignore_non_elastic_batch_info, {}, enabled<E>)
          .key("version", &E::version, versions, enabled<E>);
  return k;
}

void parse_elasticity(JsonReader& root, ElasticityConfig* e) {
  JsonReader r = root.child("elasticity");
  elasticity_keys().read(r, *e);
  if (e->enabled) {
    // DeepSpeed: an enabled section names its batch bounds.
    for (const char* key : {"max_train_batch_size", "micro_batch_sizes"})
      if (!r.has(key))
        r.fail(key, "is required when elasticity is enabled (DeepSpeed requires it too)");
  }
  // Read by resource schedulers only, as in DeepSpeed: said, since nothing here acts on it.
  if (e->enabled && r.has("min_time"))
    r.notes().warn(r.path("min_time") +
                   " is a hint for resource schedulers; dscpp's engine and launcher do not read "
                   "it (neither does DeepSpeed's engine)");
  if (e->max_gpus < e->min_gpus)
    r.fail("max_gpus", "must be >= min_gpus " + std::to_string(e->min_gpus) + ", got " +
                           std::to_string(e->max_gpus));
  r.finish();
}

// The top level's plain keys (the batch triple, communication_data_type, gradient_allreduce_op
// and log_level are code).
const Keys<Config>& root_keys() {
  static const Keys<Config> k =
      Keys<Config>()
          .key("gradient_clipping", &Config::gradient_clipping, at_least(0.0))
          .key("steps_per_print", &Config::steps_per_print, config::when_set(above<int64_t>(0)))
          .unset_means("no step line")
          .key("wall_clock_breakdown", &Config::wall_clock_breakdown)
          .key("prescale_gradients", &Config::prescale_gradients)
          .key("gradient_predivide_factor", &Config::gradient_predivide_factor, above(0.0))
          .key("zero_allow_untested_optimizer", &Config::zero_allow_untested_optimizer)
          .key("dump_state", &Config::dump_state)
          .key("seed", &Config::seed, config::when_set(at_least<int64_t>(0)));
  return k;
}

void parse_root(const json& j, Config* c, std::vector<std::string>* read = nullptr) {
  ParseNotes notes{&c->warnings, &c->origins, read};
  JsonReader r(j, "", notes);

  r.get_batch("train_batch_size", &c->train_batch_size);
  r.get_batch("train_micro_batch_size_per_gpu", &c->train_micro_batch_size_per_gpu);
  r.get_batch("gradient_accumulation_steps", &c->gradient_accumulation_steps);

  root_keys().read(r, *c);
  if (r.get("communication_data_type", &c->communication_data_type) && c->communication_data_type) {
    std::string t = to_lower(*c->communication_data_type);
    if (t == "bfp16") t = "bf16";  // DeepSpeed's spelling before 0.14
    config::one_of({"fp16", "bf16", "fp32"}).check(r, "communication_data_type", t);
    c->communication_data_type = t;
  }

  if (r.get("gradient_allreduce_op", &c->gradient_allreduce_op)) {
    c->gradient_allreduce_op = to_lower(c->gradient_allreduce_op);
    config::one_of({"mean", "sum"}).check(r, "gradient_allreduce_op", c->gradient_allreduce_op);
  }

  if (r.get("log_level", &c->log_level) && c->log_level) {
    c->log_level = to_lower(*c->log_level);
    config::one_of({"debug", "info", "warning", "error", "critical"})
        .check(r, "log_level", *c->log_level);
  }

  parse_optimizer(r, &c->optimizer);
  parse_scheduler(r, &c->scheduler);
  parse_fp16(r, &c->fp16);
  parse_bf16(r, &c->bf16);
  parse_zero(r, &c->zero_optimization);
  parse_aio(r, &c->aio);
  // With offload to nvme the swap files are read and written with direct I/O, in pieces of
  // aio.block_size (io::kDirectAlignment, 4096, is what the file workers check when they start):
  // refused here, so that dscpp check says it before a job starts.
  const ZeroConfig& z = c->zero_optimization;
  if (((z.stage > 0 && z.offload_optimizer.device == "nvme") ||
       (z.stage == 3 && z.offload_param.device == "nvme")) &&
      c->aio.block_size % 4096 != 0)
    DSCPP_FAIL(ConfigError, "aio.block_size ", c->aio.block_size,
               " must be a multiple of 4096 bytes with offload to nvme: the swap files are read "
               "and written with direct I/O. HINT: remove it (1048576, DeepSpeed's default) or "
               "use another multiple of 4096");
  parse_checkpoint(r, &c->checkpoint);
  parse_activation_checkpointing(r, &c->activation_checkpointing);
  parse_data_types(r, &c->data_types);
  parse_torch_autocast(r, &c->torch_autocast);
  if (r.has("elasticity"))
    notes.note(
        "elasticity: DeepSpeed 0.19.8 removed elastic training and refuses this section; "
        "dscpp honours it as DeepSpeed 0.19.7 and earlier did");
  parse_elasticity(r, &c->elasticity);
  read_section(r, "comms_logger", comms_logger_keys(), &c->comms_logger);
  parse_flops_profiler(r, &c->flops_profiler);
  read_section(r, "csv_monitor", monitor_keys(), &c->csv_monitor);
  read_section(r, "tensorboard", monitor_keys(), &c->tensorboard);
  r.read_not_honoured();
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

void describe_optimizer(Describer& d, const OptimizerConfig& o) {
  if (o.type.empty()) {
    d.line("optimizer", "(none: the program supplies its optimizer)");
    return;
  }
  d.line("optimizer.type", o.type);
  const std::string p = "optimizer.params.";
  if (o.type == "Adam" || o.type == "AdamW") {
    adam_keys().describe(d, p, o.adam);
  } else if (o.type == "SGD") {
    sgd_keys().describe(d, p, o.sgd);
  } else if (o.type == "Adagrad") {
    adagrad_keys().describe(d, p, o.adagrad);
  } else if (o.type == "Lamb") {
    lamb_keys().describe(d, p, o.lamb);
  } else if (o.type == "Muon") {
    muon_keys().describe(d, p, o.muon);
  } else {
    lion_keys().describe(d, p, o.lion);
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
    warmup_lr_keys().describe(d, p, s.warmup_lr);
  } else if (s.type == "WarmupDecayLR") {
    warmup_decay_lr_keys().describe(d, p, s.warmup_decay_lr);
  } else if (s.type == "WarmupCosineLR") {
    warmup_cosine_lr_keys().describe(d, p, s.warmup_cosine_lr);
  } else if (s.type == "OneCycle") {
    one_cycle_keys().describe(d, p, s.one_cycle);
  } else {
    lr_range_test_keys().describe(d, p, s.lr_range_test);
  }
}

void describe_zero(Describer& d, const ZeroConfig& z) {
  const std::string p = "zero_optimization.";
  d.line(p + "stage", z.stage);
  if (z.stage == 0) {  // its all-reduces always overlap backward (src/zero/all_reduce.h)
    d.raw("  " + p +
          "overlap_comm = true  (stage 0 always overlaps its all-reduces with "
          "backward; the key applies to stages 1-3)");
  } else {
    d.line(p + "overlap_comm", z.overlap_comm);
  }
  zero_keys().describe(d, p, z);
  if (z.stage == 3) {
    d.line(p + "stage3_gather_16bit_weights_on_model_save",
           z.stage3_gather_16bit_weights_on_model_save);
    d.line(p + "leaf_module.classes", z.leaf_module.classes);
    d.line(p + "leaf_module.names", z.leaf_module.names);
    d.line(p + "leaf_module.name_suffixes", z.leaf_module.name_suffixes);
  }
  const OffloadOptimizerConfig& oo = z.offload_optimizer;
  d.str(p + "offload_optimizer.device", oo.device);
  if (oo.device != "none") d.str(p + "offload_optimizer.nvme_path", oo.nvme_path);
  offload_optimizer_keys().describe(d, p + "offload_optimizer.", oo);
  const OffloadParamConfig& op = z.offload_param;
  d.str(p + "offload_param.device", op.device);
  if (op.device != "none") d.str(p + "offload_param.nvme_path", op.nvme_path);
  offload_param_keys().describe(d, p + "offload_param.", op);
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

namespace config {

std::string config_key_reference() {
  // The keys the parser reads (NOTE [strict config reading]): parsing configs that open every
  // conditional section, and each table's keys (optimizer and scheduler parameters per type).
  std::vector<std::string> read = table_key_paths();
  for (const char* seed :
       {"{}", R"({"checkpoint": {"writer": {"io_buffer_double": true}}, "optimizer": {"type":
       "Adam"}, "scheduler": {"type": "WarmupLR"}})"}) {
    Config c;
    parse_root(json::parse(seed), &c, &read);
  }
  std::map<std::string, const KeyVerdict*> keys;  // sorted by path
  for (const std::string& p : read) {
    const KeyVerdict* v = find_key_verdict(p);
    const bool under_verdict_section = [&] {  // inside a section the table judges as a whole
      for (const KeyVerdict& kv : key_verdicts())
        if (p.size() > kv.path.size() && p.compare(0, kv.path.size(), kv.path) == 0 &&
            p[kv.path.size()] == '.')
          return true;
      return false;
    }();
    if (!under_verdict_section) keys.emplace(p, v);
  }
  for (const KeyVerdict& v : key_verdicts()) keys[std::string(v.path)] = &v;
  // A path that only opens a section read key by key (zero_optimization, fp16) is no key of its
  // own: drop it when keys below it are listed.
  for (auto it = keys.begin(); it != keys.end();) {
    auto next = std::next(it);
    const bool parent = next != keys.end() && !it->second &&
                        next->first.compare(0, it->first.size() + 1, it->first + ".") == 0;
    it = parent ? keys.erase(it) : next;
  }
  std::map<KeyClass, int> counts;
  std::string rows;
  for (const auto& [path, v] : keys) {
    const KeyClass cls = v ? v->cls : KeyClass::honoured;
    ++counts[cls];
    std::string what = v ? std::string(v->why) : "";
    if (v && !v->inert.empty()) what = "inert: `" + std::string(v->inert) + "`; " + what;
    if (v && !v->hint.empty()) what += ". HINT: " + std::string(v->hint);
    rows += "| `" + path + "` | " + class_name(cls) + " | " + what + " |\n";
  }
  std::string out = "| class | keys |\n| --- | --- |\n";
  for (const auto& [cls, n] : counts)
    out += "| " + std::string(class_name(cls)) + " | " + std::to_string(n) + " |\n";
  return out + "\n| key | class | what dscpp does |\n| --- | --- | --- |\n" + rows;
}

std::vector<std::string> table_key_paths() {
  std::vector<std::string> out;
  auto add = [&out](const std::string& prefix, const std::vector<std::string>& names) {
    for (const auto& n : names) out.push_back(prefix + n);
  };
  add("", root_keys().names());
  for (const auto& names : {adam_keys().names(), sgd_keys().names(), adagrad_keys().names(),
                            lamb_keys().names(), lion_keys().names(), muon_keys().names()})
    add("optimizer.params.", names);
  for (const auto& names :
       {warmup_lr_keys().names(), warmup_decay_lr_keys().names(), warmup_cosine_lr_keys().names(),
        one_cycle_keys().names(), lr_range_test_keys().names()})
    add("scheduler.params.", names);
  add("fp16.", fp16_keys().names());
  add("zero_optimization.", zero_keys().names());
  add("zero_optimization.offload_optimizer.", offload_optimizer_keys().names());
  add("zero_optimization.offload_param.", offload_param_keys().names());
  add("aio.", aio_keys().names());
  add("elasticity.", elasticity_keys().names());
  add("comms_logger.", comms_logger_keys().names());
  add("flops_profiler.", flops_profiler_keys().names());
  add("csv_monitor.", monitor_keys().names());
  add("tensorboard.", monitor_keys().names());
  return out;
}

}  // namespace config

std::string Config::describe() const {
  Describer d(*this);
  d.raw("DeepSpeed config from " + source + ":");
  describe_batch(d, *this);
  root_keys().describe(d, "", *this);
  d.line("communication_data_type", communication_data_type
                                        ? "\"" + *communication_data_type + "\""
                                        : std::string("(unset: the training precision)"));
  d.line("gradient_allreduce_op", "\"" + gradient_allreduce_op + "\"");
  if (log_level) d.str("log_level", log_level);
  describe_optimizer(d, optimizer);
  describe_scheduler(d, scheduler);
  fp16_keys().describe(d, "fp16.", fp16);
  d.line("bf16.enabled", bf16.enabled);
  if (bf16.immediate_grad_update) d.line("bf16.immediate_grad_update", true);
  if (bf16.bf16_master_weights_and_grads) d.line("bf16.bf16_master_weights_and_grads", true);
  if (bf16.bf16_optimizer_states) d.line("bf16.bf16_optimizer_states", true);
  describe_zero(d, zero_optimization);
  if (zero_optimization.offload_optimizer.device == "nvme" ||
      zero_optimization.offload_param.device == "nvme")
    aio_keys().describe(d, "aio.", aio);
  if (data_types.grad_accum_dtype) d.str("data_types.grad_accum_dtype", *data_types.grad_accum_dtype);
  if (torch_autocast.enabled) {
    d.line("torch_autocast.enabled", true);
    d.str("torch_autocast.dtype", torch_autocast.dtype.value_or("(unset: the device's default)"));
    if (torch_autocast.lower_precision_safe_modules)
      d.line("torch_autocast.lower_precision_safe_modules",
             "[" + join(*torch_autocast.lower_precision_safe_modules, ", ") + "]");
  }
  if (activation_checkpointing.cpu_checkpointing)
    d.line("activation_checkpointing.cpu_checkpointing", true);
  d.str("checkpoint.tag_validation", checkpoint.tag_validation);
  if (checkpoint.writer.given) {
    const CheckpointWriterConfig& w = checkpoint.writer;
    d.str("checkpoint.writer.type", w.type);
    d.line("checkpoint.writer.decoupled", w.decoupled);
    d.line("checkpoint.writer.io_buffer_size", w.io_buffer_size);
    if (w.io_buffer_double) d.line("checkpoint.writer.io_buffer_double", *w.io_buffer_double);
    d.line("checkpoint.writer.show_statistics", w.show_statistics);
    if (!w.data_parallel.empty()) d.str("checkpoint.writer.data_parallel", w.data_parallel);
    d.line("checkpoint.writer.io_multiplier", w.io_multiplier);
  }
  elasticity_keys().describe(d, "elasticity.", elasticity);
  comms_logger_keys().describe(d, "comms_logger.", comms_logger);
  flops_profiler_keys().describe(d, "flops_profiler.", flops_profiler);
  monitor_keys().describe(d, "csv_monitor.", csv_monitor);
  monitor_keys().describe(d, "tensorboard.", tensorboard);
  if (!warnings.empty()) {
    d.raw("warnings and notes:");
    for (const std::string& w : warnings) d.raw("  - " + w);
  }
  return d.text();
}

}  // namespace dscpp
