// Implements C10dCommunicator (see c10d_communicator.h): argument checks on the caller's thread,
// the collective itself on the communication thread.
#include "comm/c10d_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "comm/quantized_reduce.h"
#include "comm/ring.h"
#include "dscpp/error.h"
#include "util/log.h"

namespace dscpp::comm {

// NOTE [point-to-point]: send and recv are posted in call order on the communication thread but
// not waited for there, since a rank typically posts a send and then the matching recv; waiting
// for the send first would deadlock two ranks that exchange. Their handle waits on the backend's
// own handle, with the same timeout.

// The handle shared by the caller (wait) and the communication thread (finish).
class C10dCommunicator::State final : public Work {
 public:
  State(std::chrono::milliseconds safety, std::chrono::milliseconds timeout, OpDesc desc)
      : safety_(safety), timeout_(timeout), desc_(desc) {}

  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    // The communication thread enforces the timeout and reports; this deadline only guards
    // against a backend call that never returns (it should not happen with Gloo or NCCL).
    if (!cv_.wait_for(lk, safety_, [&] { return done_; })) {
      DSCPP_FAIL(CommTimeout, "a collective did not return within ", safety_.count() / 1000,
                 " s and the communication thread is stuck inside the backend. HINT: rerun "
                 "with DSCPP_DEBUG_SYNC=1 to check that all ranks issue the same collectives");
    }
    if (error_) std::rethrow_exception(error_);
    if (!pending_) return;
    auto pending = pending_;
    lk.unlock();
    bool ok = false;
    std::string why = "no answer";
    try {
      ok = pending->wait(timeout_);
    } catch (const std::exception& e) {
      why = e.what();
      why = why.substr(0, why.find('\n'));
    }
    DSCPP_CHECK(ok, CommTimeout, desc_.to_string(), " did not complete within ",
                timeout_.count() / 1000.0, " s: ", why,
                ". HINT: the peer must post the matching ",
                desc_.kind == OpKind::send ? "recv" : "send");
  }
  bool is_completed() const override {
    std::lock_guard<std::mutex> g(mu_);
    return done_ && (!pending_ || pending_->isCompleted());
  }
  void finish(std::exception_ptr error, c10::intrusive_ptr<c10d::Work> pending = {}) {
    {
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
      error_ = std::move(error);
      pending_ = std::move(pending);
    }
    cv_.notify_all();
  }

 private:
  std::chrono::milliseconds safety_;
  std::chrono::milliseconds timeout_;
  OpDesc desc_;
  c10::intrusive_ptr<c10d::Work> pending_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

namespace {

using Pending = c10::intrusive_ptr<c10d::Work>;

void check_flat(const at::Tensor& t, const char* what) {
  DSCPP_CHECK(t.defined(), CommError, what, " tensor is undefined");
  DSCPP_CHECK(t.is_contiguous(), CommError, what,
              " tensor must be contiguous. HINT: pass tensor.contiguous() or a flat buffer");
}

void check_counts(const std::vector<int64_t>& counts, int world_size) {
  DSCPP_CHECK(static_cast<int>(counts.size()) == world_size, CommError, "counts has ",
              counts.size(), " entries but the world size is ", world_size);
  for (auto c : counts) DSCPP_CHECK(c >= 0, CommError, "negative count ", c, " in counts");
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // avg = sum, then divide (Gloo has no AVG)
  }
}

bool all_equal(const std::vector<int64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
}

bool looks_like_timeout(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

}  // namespace

C10dCommunicator::C10dCommunicator(c10::intrusive_ptr<c10d::Backend> backend,
                                   std::string backend_name,
                                   c10::intrusive_ptr<c10d::Store> monitor_store,
                                   std::string prefix, int rank, int world_size,
                                   CommOptions options, std::unique_ptr<HostCollectives> host,
                                   std::vector<std::string> hosts)
    : backend_(std::move(backend)),
      backend_name_(std::move(backend_name)),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      monitor_(std::move(monitor_store), prefix + "/sync", rank, world_size),
      logger_(options_.comms_logger, world_size),
      native_flat_(backend_name_ == "nccl"),
      host_(std::move(host)),
      hosts_(std::move(hosts)) {
  for (const auto& h : hosts_) spans_hosts_ = spans_hosts_ || h != hosts_[0];
  worker_ = std::thread([this] { run_loop(); });
}

C10dCommunicator::~C10dCommunicator() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  log_summary();
}

void C10dCommunicator::log_summary() {
  if (!logger_.enabled()) return;
  std::string s = logger_.summary();
  if (!s.empty()) DSCPP_LOG_INFO("comms_logger summary ({} ranks):\n{}", world_size_, s);
}

WorkHandle C10dCommunicator::enqueue(
    OpDesc desc, bool collective,
    std::function<c10::intrusive_ptr<c10d::Work>(int64_t)> body) {
  auto safety = options_.timeout + SyncMonitor::kAnswerWait + std::chrono::seconds(30);
  auto state = std::make_shared<State>(safety, options_.timeout, desc);
  {
    std::lock_guard<std::mutex> g(mu_);
    int64_t seq = collective ? ++seq_ : seq_.load();
    queue_.push_back(Task{desc, seq, collective, step_.load(), std::move(body), state});
  }
  cv_.notify_one();
  return state;
}

void C10dCommunicator::run_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained: queued work always finishes first
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_task(task);
  }
}

void C10dCommunicator::run_task(Task& task) {
  if (broken_) {
    task.state->finish(broken_);
    return;
  }
  // Point-to-point ops are not collectives: the record keeps the last collective.
  if (task.collective) monitor_.on_enter(task.seq, task.desc, task.step);
  auto t0 = std::chrono::steady_clock::now();
  try {
    if (task.collective && options_.debug_sync)
      check_same_op_everywhere(task.seq, task.desc, task.step);
    traffic_ = {};
    traffic_.counted = !native_flat_;
    auto pending = task.body(task.seq);
    if (task.collective) monitor_.on_complete(task.seq);
    if (!pending) {
      Traffic t = traffic_;
      if (host_) {
        Traffic h = host_->take_traffic();
        t.own_host += h.own_host;
        t.other_hosts += h.other_hosts;
        t.counted = t.counted && h.counted;
      }
      logger_.record(task.desc, task.desc.bytes(), std::chrono::steady_clock::now() - t0, t);
    }
    task.state->finish(nullptr, std::move(pending));
    return;
  } catch (const CollectiveMismatch&) {
    // Already a complete report, and the same on every rank.
    broken_ = std::current_exception();
  } catch (const CommError& e) {
    std::string what = e.what();
    bool timeout = dynamic_cast<const CommTimeout*>(&e) || looks_like_timeout(what);
    std::string title =
        timeout
            ? fmt::format("collective #{} {} (step {}) did not complete within {:.1f} s", task.seq,
                          task.desc.to_string(), task.step, options_.timeout.count() / 1e3)
            : fmt::format("collective #{} {} (step {}) failed: {}", task.seq, task.desc.to_string(),
                          task.step, what);
    const auto* exited = dynamic_cast<const PeerExited*>(&e);
    std::string report = monitor_.report(title, exited ? exited->rank() : -1);
    broken_ = timeout ? std::make_exception_ptr(CommTimeout(report))
                      : std::make_exception_ptr(CommError(report));
  } catch (const std::exception& e) {
    std::string what = e.what();
    bool timeout = looks_like_timeout(what) ||
                   std::chrono::steady_clock::now() - t0 >= options_.timeout;
    std::string title =
        timeout
            ? fmt::format("collective #{} {} (step {}) did not complete within {:.1f} s", task.seq,
                          task.desc.to_string(), task.step, options_.timeout.count() / 1e3)
            : fmt::format("collective #{} {} (step {}) failed in the backend: {}", task.seq,
                          task.desc.to_string(), task.step, what.substr(0, what.find('\n')));
    std::string report = monitor_.report(title);
    broken_ = timeout ? std::make_exception_ptr(CommTimeout(report))
                      : std::make_exception_ptr(CommError(report));
  }
  task.state->finish(broken_);
}

void C10dCommunicator::wait_c10d(const c10::intrusive_ptr<c10d::Work>& work) {
  bool ok = work->wait(options_.timeout);
  DSCPP_CHECK(ok, CommTimeout, "the backend did not finish within the timeout");
}

RingContext C10dCommunicator::ring(int64_t seq) {
  RingContext ctx{*backend_, rank_, world_size_, ring_tag_base(seq), options_.timeout};
  ctx.traffic = &traffic_;
  ctx.next_on_other_host =
      !hosts_.empty() && hosts_[(rank_ + 1) % world_size_] != hosts_[rank_];
  return ctx;
}

void C10dCommunicator::check_same_op_everywhere(int64_t seq, const OpDesc& desc, int64_t step) {
  // The training step too: ranks a whole step apart issue collectives of the same shapes.
  at::Tensor mine = at::tensor({static_cast<int64_t>(desc.kind), static_cast<int64_t>(desc.dtype),
                                desc.numel, desc.peer, step},
                               at::kLong);
  std::vector<at::Tensor> all;
  for (int r = 0; r < world_size_; ++r) all.push_back(at::empty_like(mine));
  std::vector<std::vector<at::Tensor>> out{all};
  std::vector<at::Tensor> in{mine};
  wait_c10d(backend_->allgather(out, in));
  auto describe = [](const at::Tensor& t) {
    OpDesc d;
    d.kind = static_cast<OpKind>(t[0].item<int64_t>());
    d.dtype = static_cast<c10::ScalarType>(t[1].item<int64_t>());
    d.numel = t[2].item<int64_t>();
    d.peer = t[3].item<int64_t>();
    const int64_t at_step = t[4].item<int64_t>();
    return d.to_string() + (at_step >= 0 ? fmt::format(" at step {}", at_step) : std::string());
  };
  std::string diffs;
  for (int r = 1; r < world_size_; ++r) {
    if (!at::equal(out[0][r], out[0][0])) {
      diffs += fmt::format("  rank 0 entered {} but rank {} entered {}\n", describe(out[0][0]), r,
                           describe(out[0][r]));
    }
  }
  DSCPP_CHECK(diffs.empty(), CollectiveMismatch, "collective mismatch at collective #", seq,
              " (step ", step, "), seen on rank ", rank_, ":\n", diffs,
              "HINT: every rank must issue the same collectives with the same dtype and size, in "
              "the same order");
}

WorkHandle C10dCommunicator::all_reduce(at::Tensor tensor, ReduceOp op) {
  check_flat(tensor, "all_reduce");
  DSCPP_CHECK(op != ReduceOp::avg || at::isFloatingType(tensor.scalar_type()), CommError,
              "all_reduce avg needs a floating-point tensor, got ", tensor.scalar_type());
  OpDesc d{OpKind::all_reduce, tensor.scalar_type(), tensor.numel(), -1};
  return enqueue(d, true, [this, tensor, op](int64_t seq) mutable -> Pending {
    // Shared memory meets the others even for an empty tensor, so sizes that differ across
    // ranks are caught (NOTE [shared-memory collectives]).
    if (host_ && host_->supports(tensor)) {
      host_->all_reduce(tensor, op, seq);
      return {};
    }
    if (world_size_ == 1 || tensor.numel() == 0) return {};
    if (!native_flat_ &&
        (tensor.scalar_type() == at::kBFloat16 || (spans_hosts_ && tensor.device().is_cpu()))) {
      // Gloo has no bf16 reduction, and across hosts dscpp counts what it sends: a ring
      // all-reduce (reduce-scatter, then all-gather, in place) over send/recv, which moves what
      // Gloo's own ring would.
      std::vector<int64_t> counts(world_size_, tensor.numel() / world_size_);
      for (int64_t i = 0; i < tensor.numel() % world_size_; ++i) ++counts[i];
      int64_t own = 0;
      for (int i = 0; i < rank_; ++i) own += counts[i];
      at::Tensor flat = tensor.view({-1});
      at::Tensor mine = flat.narrow(0, own, counts[rank_]);
      RingContext ctx = ring(seq);
      ring_reduce_scatter(ctx, mine, flat, counts, op);
      ctx.tag_base += 2048;  // the all-gather's steps get tags of their own
      ring_all_gather(ctx, flat, mine, counts);  // in place
      return {};
    }
    std::vector<at::Tensor> v{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = options_.timeout;
    traffic_.counted = false;
    wait_c10d(backend_->allreduce(v, o));
    if (op == ReduceOp::avg) tensor.div_(world_size_);
    return {};
  });
}

WorkHandle C10dCommunicator::reduce_scatter(at::Tensor output, at::Tensor input,
                                            std::vector<int64_t> counts, ReduceOp op) {
  return enqueue_reduce_scatter(std::move(output), std::move(input), std::move(counts), op, false);
}

WorkHandle C10dCommunicator::reduce_scatter_quantized(at::Tensor output, at::Tensor input,
                                                      std::vector<int64_t> counts, ReduceOp op) {
  DSCPP_CHECK(op == ReduceOp::sum || op == ReduceOp::avg, CommError,
              "reduce_scatter_quantized sums or averages, got ", reduce_op_name(op));
  DSCPP_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16 ||
                  input.scalar_type() == at::kHalf,
              CommError, "reduce_scatter_quantized: float, bf16 or fp16 only, got ",
              input.scalar_type());
  return enqueue_reduce_scatter(std::move(output), std::move(input), std::move(counts), op, true);
}

WorkHandle C10dCommunicator::enqueue_reduce_scatter(at::Tensor output, at::Tensor input,
                                                    std::vector<int64_t> counts, ReduceOp op,
                                                    bool quantized) {
  check_flat(output, "reduce_scatter output");
  check_flat(input, "reduce_scatter input");
  check_counts(counts, world_size_);
  DSCPP_CHECK(sum(counts) == input.numel(), CommError, "reduce_scatter: counts sum to ",
              sum(counts), " but the input has ", input.numel(), " elements");
  DSCPP_CHECK(output.numel() == counts[rank_], CommError, "reduce_scatter: output on rank ",
              rank_, " has ", output.numel(), " elements, expected counts[", rank_,
              "] = ", counts[rank_]);
  DSCPP_CHECK(output.scalar_type() == input.scalar_type(), CommError,
              "reduce_scatter: output dtype ", output.scalar_type(), " != input dtype ",
              input.scalar_type());
  DSCPP_CHECK(op != ReduceOp::avg || at::isFloatingType(input.scalar_type()), CommError,
              "reduce_scatter avg needs a floating-point tensor, got ", input.scalar_type());
  OpDesc d{OpKind::reduce_scatter, input.scalar_type(), input.numel(), -1};
  return enqueue(d, true, [this, output, input, counts, op, quantized](int64_t seq) mutable -> Pending {
    auto in = input.view({-1});
    auto out = output.view({-1});
    if (host_ && host_->supports(in)) {
      if (quantized) {
        host_->reduce_scatter_quantized(out, in, counts, op, seq);
      } else {
        host_->reduce_scatter(out, in, counts, op, seq);
      }
      return {};
    }
    if (quantized && !native_flat_ && spans_hosts_ && in.device().is_cpu()) {
      // NOTE [quantized reduce-scatter]: flat across hosts, every rank a member.
      std::vector<bool> remote;
      for (const auto& h : hosts_) remote.push_back(h != hosts_[rank_]);
      quantized_reduce_scatter(ring(seq), out, in, counts, remote);
      if (op == ReduceOp::avg) out.div_(world_size_);
      return {};
    }
    if (native_flat_ && all_equal(counts)) {
      c10d::ReduceScatterOptions o;
      o.reduceOp = to_c10d(op);
      o.timeout = options_.timeout;
      wait_c10d(backend_->_reduce_scatter_base(out, in, o));
      if (op == ReduceOp::avg) out.div_(world_size_);
      return {};
    }
    if (native_flat_) {
      // NOTE [uneven on NCCL]: NCCL has no uneven reduce-scatter, and the ring's separate send
      // and recv calls can deadlock on one NCCL stream. Each non-empty chunk is reduced to its
      // owner instead, as DeepSpeed's stage 2 does; non-roots' buffers are only read.
      auto off = offsets_of(counts);
      for (int r = 0; r < world_size_; ++r) {
        if (counts[r] == 0) continue;
        at::Tensor chunk = in.narrow(0, off[r], counts[r]);
        if (r == rank_ && out.data_ptr() != chunk.data_ptr()) out.copy_(chunk);
        std::vector<at::Tensor> v{r == rank_ ? out : chunk};
        c10d::ReduceOptions o;
        o.reduceOp = to_c10d(op);
        o.rootRank = r;
        o.timeout = options_.timeout;
        wait_c10d(backend_->reduce(v, o));
      }
      if (op == ReduceOp::avg) out.div_(world_size_);
      return {};
    }
    ring_reduce_scatter(ring(seq), out, in, counts, op);
    return {};
  });
}

WorkHandle C10dCommunicator::all_gather(at::Tensor output, at::Tensor input,
                                        std::vector<int64_t> counts) {
  check_flat(output, "all_gather output");
  check_flat(input, "all_gather input");
  check_counts(counts, world_size_);
  DSCPP_CHECK(sum(counts) == output.numel(), CommError, "all_gather: counts sum to ", sum(counts),
              " but the output has ", output.numel(), " elements");
  DSCPP_CHECK(input.numel() == counts[rank_], CommError, "all_gather: input on rank ", rank_,
              " has ", input.numel(), " elements, expected counts[", rank_, "] = ", counts[rank_]);
  DSCPP_CHECK(output.scalar_type() == input.scalar_type(), CommError, "all_gather: output dtype ",
              output.scalar_type(), " != input dtype ", input.scalar_type());
  OpDesc d{OpKind::all_gather, input.scalar_type(), output.numel(), -1};
  return enqueue(d, true, [this, output, input, counts](int64_t seq) mutable -> Pending {
    auto in = input.view({-1});
    auto out = output.view({-1});
    if (host_ && host_->supports(in)) {
      auto off = offsets_of(counts);
      std::vector<at::Tensor> chunks;
      for (int r = 0; r < world_size_; ++r) chunks.push_back(out.narrow(0, off[r], counts[r]));
      host_->all_gather(chunks, in, seq);
      return {};
    }
    if (native_flat_ && all_equal(counts)) {
      c10d::AllgatherOptions o;
      o.timeout = options_.timeout;
      wait_c10d(backend_->_allgather_base(out, in, o));
      return {};
    }
    if (native_flat_) {
      auto off = offsets_of(counts);
      std::vector<at::Tensor> chunks;
      for (int r = 0; r < world_size_; ++r) chunks.push_back(out.narrow(0, off[r], counts[r]));
      broadcast_from_owners(chunks, in);
      return {};
    }
    ring_all_gather(ring(seq), out, in, counts);
    return {};
  });
}

namespace {

// all_gather_into's arguments for a group of outputs.size() ranks where this rank is `place`;
// returns the elements gathered.
int64_t check_gather_into(const char* what, const std::vector<at::Tensor>& outputs,
                          const at::Tensor& input, int group, const char* group_name,
                          int place) {
  DSCPP_CHECK(static_cast<int>(outputs.size()) == group, CommError, what, ": ", outputs.size(),
              " outputs but the ", group_name, " is ", group);
  check_flat(input, what);
  int64_t total = 0;
  for (auto& o : outputs) {
    check_flat(o, what);
    DSCPP_CHECK(o.scalar_type() == input.scalar_type() && o.device() == input.device(), CommError,
                what, ": an output is ", o.scalar_type(), " on ", o.device(), ", the input ",
                input.scalar_type(), " on ", input.device());
    total += o.numel();
  }
  DSCPP_CHECK(outputs[place].numel() == input.numel(), CommError, what, ": output ", place,
              " has ", outputs[place].numel(), " elements, the input ", input.numel());
  return total;
}

}  // namespace

WorkHandle C10dCommunicator::host_all_gather_into(std::vector<at::Tensor> outputs,
                                                  at::Tensor input) {
  const int group = host_group_size();
  const int64_t total = check_gather_into("host_all_gather_into", outputs, input, group,
                                          "host group size", rank_ % group);
  DSCPP_CHECK(!host_ || host_->supports(input), CommError, "host_all_gather_into: ",
              input.scalar_type(), " on ", input.device(), " is not carried by ", host_->name());
  OpDesc d{OpKind::all_gather, input.scalar_type(), total, -1};
  return enqueue(d, true, [this, outputs, input](int64_t seq) mutable -> Pending {
    if (host_) {
      host_->host_all_gather(outputs, input, seq);
    } else if (outputs[0].data_ptr() != input.data_ptr()) {
      outputs[0].copy_(input);  // a group of one: this rank
    }
    return {};
  });
}

WorkHandle C10dCommunicator::all_gather_into(std::vector<at::Tensor> outputs, at::Tensor input) {
  const int64_t total = check_gather_into("all_gather_into", outputs, input, world_size_,
                                          "world size", rank_);
  OpDesc d{OpKind::all_gather, input.scalar_type(), total, -1};
  return enqueue(d, true, [this, outputs, input](int64_t seq) mutable -> Pending {
    if (host_ && host_->supports(input)) {
      host_->all_gather(outputs, input, seq);
      return {};
    }
    bool equal = true;
    for (auto& o : outputs) equal = equal && o.numel() == input.numel();
    if (native_flat_ && equal) {
      std::vector<std::vector<at::Tensor>> out{outputs};
      std::vector<at::Tensor> in{input};
      c10d::AllgatherOptions o;
      o.timeout = options_.timeout;
      wait_c10d(backend_->allgather(out, in, o));
      return {};
    }
    if (native_flat_) {
      broadcast_from_owners(outputs, input);
      return {};
    }
    ring_all_gather(ring(seq), outputs, input);
    return {};
  });
}

void C10dCommunicator::broadcast_from_owners(const std::vector<at::Tensor>& outputs,
                                             const at::Tensor& input) {
  // NOTE [uneven on NCCL]: each non-empty output is broadcast from its owner.
  for (int r = 0; r < world_size_; ++r) {
    if (outputs[r].numel() == 0) continue;
    if (r == rank_ && outputs[r].data_ptr() != input.data_ptr()) outputs[r].copy_(input);
    std::vector<at::Tensor> v{outputs[r]};
    c10d::BroadcastOptions o;
    o.rootRank = r;
    o.timeout = options_.timeout;
    wait_c10d(backend_->broadcast(v, o));
  }
}

WorkHandle C10dCommunicator::broadcast(at::Tensor tensor, int root) {
  check_flat(tensor, "broadcast");
  DSCPP_CHECK(root >= 0 && root < world_size_, CommError, "broadcast root ", root,
              " is not a rank (world size ", world_size_, ")");
  OpDesc d{OpKind::broadcast, tensor.scalar_type(), tensor.numel(), root};
  return enqueue(d, true, [this, tensor, root](int64_t seq) -> Pending {
    if (host_ && host_->supports(tensor)) {
      host_->broadcast(tensor, root, seq);
      return {};
    }
    if (world_size_ == 1 || tensor.numel() == 0) return {};
    if (!native_flat_ && spans_hosts_ && tensor.device().is_cpu()) {
      ring_broadcast(ring(seq), tensor, root);
      return {};
    }
    traffic_.counted = false;
    std::vector<at::Tensor> v{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = options_.timeout;
    wait_c10d(backend_->broadcast(v, o));
    return {};
  });
}

WorkHandle C10dCommunicator::barrier() {
  OpDesc d{OpKind::barrier, at::kFloat, 0, -1};
  return enqueue(d, true, [this](int64_t seq) -> Pending {
    if (world_size_ == 1) return {};
    if (host_) {
      host_->barrier(seq);
      return {};
    }
    c10d::BarrierOptions o;
    o.timeout = options_.timeout;
    traffic_.counted = false;
    wait_c10d(backend_->barrier(o));
    return {};
  });
}

WorkHandle C10dCommunicator::send(at::Tensor tensor, int dst) {
  check_flat(tensor, "send");
  DSCPP_CHECK(dst >= 0 && dst < world_size_ && dst != rank_, CommError, "send: destination ",
              dst, " is not another rank (world size ", world_size_, ", this rank ", rank_, ")");
  OpDesc d{OpKind::send, tensor.scalar_type(), tensor.numel(), dst};
  return enqueue(d, false, [this, tensor, dst](int64_t) -> Pending {
    std::vector<at::Tensor> v{tensor};
    return backend_->send(v, dst, 0);
  });
}

WorkHandle C10dCommunicator::recv(at::Tensor tensor, int src) {
  check_flat(tensor, "recv");
  DSCPP_CHECK(src >= 0 && src < world_size_ && src != rank_, CommError, "recv: source ", src,
              " is not another rank (world size ", world_size_, ", this rank ", rank_, ")");
  OpDesc d{OpKind::recv, tensor.scalar_type(), tensor.numel(), src};
  return enqueue(d, false, [this, tensor, src](int64_t) -> Pending {
    std::vector<at::Tensor> v{tensor};
    return backend_->recv(v, src, 0);
  });
}

}  // namespace dscpp::comm
