// Implements the step-time model (step_time.h, NOTE [step-time model]).
#include "engine/step_time.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numeric>

#include "dscpp/models/gpt.h"
#include "engine/estimate.h"

namespace dscpp::engine {
namespace {

// ZeRO++'s wire formats (comm/quantize.h): bytes per element, a code and its share of a scale.
constexpr double kWeightWire = 1.0 + 4.0 / 2048;   // int8, one fp32 scale per 2048
constexpr double kGradientWire = 0.5 + 4.0 / 512;  // int4, one fp32 scale per 512

// One reduce-scatter or all-gather pass over a buffer whose every element puts `wire` bytes on
// the link: the bytes each host sends to other hosts, and how long the pass takes.
struct Pass {
  double bytes = 0;
  double seconds = 0;
  Pass& operator+=(const Pass& o) {
    bytes += o.bytes;
    seconds += o.seconds;
    return *this;
  }
  Pass times(double k) const { return {bytes * k, seconds * k}; }
};

// Steps between hosts of one reduce-scatter (`reduce`) or all-gather: the hierarchy's column
// reduces in a tree of log2 H steps when H is a power of two (NOTE [tree order]), else in a ring
// of H - 1, and gathers in a ring; flat rings take P - 1.
double steps_between_hosts(const Cluster& c, bool reduce) {
  const int H = c.hosts;
  if (H == 1) return 0;
  if (!(c.hierarchy && c.per_host > 1)) return c.world() - 1;
  if (reduce && (H & (H - 1)) == 0) return std::log2(static_cast<double>(H));
  return H - 1;
}

// Hosts (hierarchy) or ranks (flat) that qgZ's all-to-all sends to, one message each.
double all_to_all_steps(const Cluster& c) {
  if (c.hosts == 1) return 0;
  return c.hierarchy && c.per_host > 1 ? c.hosts - 1 : c.world() - 1;
}

Pass ring_pass(const Cluster& c, double elements, double wire, bool reduce) {
  const double n = elements * wire;
  const int H = c.hosts, P = c.world();
  if (n == 0) return {};                          // nothing to move: no collective
  if (H == 1) return {0, n / c.shm_bytes_per_s};  // one host: shared memory only
  const double latency = steps_between_hosts(c, reduce) * c.net_latency_s;
  if (c.hierarchy && c.per_host > 1) {
    const double bytes = n * (H - 1) / H;
    return {bytes, bytes / c.net_bytes_per_s + latency + n / c.shm_bytes_per_s};
  }
  const double bytes = n * (P - 1) / P;  // the ring crosses each host boundary once per step
  return {bytes, bytes / c.net_bytes_per_s + latency};
}

// qgZ's reduce-scatter (NOTE [quantized reduce-scatter]): all-to-all of int4 codes; in the
// hierarchy each host's exact sum crosses once, flat every rank's own contribution.
Pass quantized_reduce(const Cluster& c, double elements) {
  const int H = c.hosts, R = c.per_host;
  if (H == 1) return {0, elements * 4 / c.shm_bytes_per_s};  // exact on one host
  const bool hier = c.hierarchy && R > 1;
  const double bytes = (hier ? 1.0 : R) * elements * kGradientWire * (H - 1) / H;
  return {bytes, bytes / c.net_bytes_per_s + all_to_all_steps(c) * c.net_latency_s +
                     (hier ? elements * 4 / c.shm_bytes_per_s : 0)};
}

}  // namespace

int64_t StepWork::elements() const {
  return std::accumulate(units.begin(), units.end(), other);
}

StepTime model_step(const Cluster& c, const StepWork& w) {
  StepTime t;
  t.compute_s = w.compute_s;
  const double item = w.item_bytes;
  const double grad_item = w.grad_wire_bytes;
  const double gas = w.gas;
  Pass hidden, exposed;
  const double all = static_cast<double>(w.elements());
  if (w.stage == 0) {
    // The gradients' all-reduce, bucket by bucket during backward.
    Pass ar = ring_pass(c, all, grad_item, true);
    ar += ring_pass(c, all, grad_item, false);
    t.reduce_bytes = ar.bytes;
    hidden += ar;
  } else {
    // What is not a unit (everything below stage 3): reduce-scattered (stage 1 once a step, at
    // the boundary; stages 2-3 every micro-batch), all-gathered after the step.
    const double others = w.stage == 3 ? static_cast<double>(w.other) : all;
    Pass rs = ring_pass(c, others, grad_item, true).times(w.stage == 1 ? 1 : gas);
    Pass ag = ring_pass(c, others, item, false);
    t.reduce_bytes += rs.bytes;
    t.after_bytes += ag.bytes;
    if (w.stage >= 2 && w.overlap_comm) {
      hidden += rs;
    } else {
      exposed += rs;
    }
    exposed += ag;
  }
  if (w.stage == 3) {
    const int64_t K = static_cast<int64_t>(w.units.size());
    const double unit_elements = all - static_cast<double>(w.other);
    // Kept between forward and backward: the elements requested in between (the later units'
    // forward and backward gathers) within stage3_max_reuse_distance (NOTE [stage 3 prefetch
    // order]); the others are gathered again in backward.
    double later = 0, regathered = 0;
    for (int64_t i = K - 1; i >= 0; --i) {
      if (2 * later > static_cast<double>(w.max_reuse_distance)) {
        regathered += static_cast<double>(w.units[i]);
        ++t.units_regathered;
      }
      later += static_cast<double>(w.units[i]);
    }
    const double wire = w.quantized_weights ? kWeightWire : item;
    Pass gather = ring_pass(c, unit_elements, wire, false).times(gas);
    Pass regather = w.secondary_partition
                        ? Pass{0, regathered * item / c.shm_bytes_per_s}.times(gas)
                        : ring_pass(c, regathered, wire, false).times(gas);
    Pass reduce = (w.quantized_gradients ? quantized_reduce(c, unit_elements)
                                         : ring_pass(c, unit_elements, grad_item, true))
                      .times(gas);
    t.gather_bytes = gather.bytes;
    t.regather_bytes = regather.bytes;
    t.reduce_bytes += reduce.bytes;
    hidden += gather;
    hidden += regather;
    hidden += reduce;
    // One latency per unit gather and per reduced bucket beyond the first.
    const double buckets =
        std::max<double>(static_cast<double>(K),
                         unit_elements / static_cast<double>(std::max<int64_t>(w.reduce_bucket_size, 1)));
    const double regathers = w.secondary_partition ? 0 : static_cast<double>(t.units_regathered);
    const double reduce_steps =
        w.quantized_gradients ? all_to_all_steps(c) : steps_between_hosts(c, true);
    hidden.seconds += gas * c.net_latency_s *
                      ((buckets - 1) * reduce_steps +
                       (std::max<double>(static_cast<double>(K) - 1, 0) +
                        std::max(regathers - 1, 0.0)) *
                           steps_between_hosts(c, false));
    if (w.quantized_weights) {
      // Every rank dequantizes every gathered element (forward, and backward unless hpZ).
      const double read = unit_elements + (w.secondary_partition ? 0 : regathered);
      t.quantize_s += gas * read * w.quantize_s_per_element;
    }
    if (w.quantized_gradients && c.hosts > 1) {
      t.quantize_s += gas * unit_elements * w.quantize_s_per_element;
    }
  }
  t.hidden_comm_s = hidden.seconds;
  t.exposed_comm_s = std::max(0.0, hidden.seconds - w.overlap * w.compute_s) + exposed.seconds;
  t.step_s = t.compute_s + t.quantize_s + t.exposed_comm_s;
  return t;
}

void add_gpt_units(const models::GPTConfig& g, int64_t threshold, StepWork* w) {
  const int64_t C = g.n_embd;
  auto sharded = [&](std::initializer_list<int64_t> sizes) {
    int64_t n = 0;
    for (int64_t s : sizes) n += s >= threshold ? s : 0;
    return n;
  };
  // ln_1, c_attn, c_proj, ln_2, c_fc, mlp's c_proj: weights and biases.
  const int64_t block =
      sharded({C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C});
  const int64_t wte = sharded({g.vocab_size * C});
  w->units.clear();
  if (wte > 0) w->units.push_back(wte);
  for (int64_t l = 0; l < g.n_layer; ++l) w->units.push_back(block);
  w->other = g.num_parameters() - wte - g.n_layer * block;
}

StageThreeUnits gpt_units(const models::GPTConfig& g, int64_t threshold) {
  StepWork w;
  add_gpt_units(g, threshold, &w);
  StageThreeUnits u;
  u.sizes = w.units;
  const int blocks_from = static_cast<int>(w.units.size()) - static_cast<int>(g.n_layer);
  if (blocks_from == 1) u.forward.push_back(0);  // wte, unless all of it stays whole
  for (int l = 0; l < g.n_layer; ++l) u.forward.push_back(blocks_from + l);
  if (blocks_from == 1) u.forward.push_back(0);
  return u;
}

}  // namespace dscpp::engine
