// StandInLink (stand_in_link.h): two worker threads standing in for a GPU's copy streams.
#include "support/stand_in_link.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <future>
#include <limits>

#include "dscpp/error.h"

namespace dscpp::testing {

struct StandInLink::Job {
  at::Tensor dst, src;
  int64_t copy = 0;
  bool fail = false;
  std::promise<void> done;
};

// One direction: a queue and the thread that works through it in order.
class StandInLink::Lane {
 public:
  Lane(StandInLink& link, bool to_host)
      : link_(link), to_host_(to_host), thread_([this] { run(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::shared_future<void> push(std::unique_ptr<Job> job) {
    std::shared_future<void> f = job->done.get_future().share();
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
    return f;
  }

 private:
  void run() {
    for (;;) {
      std::unique_ptr<Job> job;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      if (link_.o_.delay.count() > 0) std::this_thread::sleep_for(link_.o_.delay);
      const int64_t bytes = static_cast<int64_t>(job->src.nbytes());
      if (job->fail) {
        job->done.set_exception(std::make_exception_ptr(Error(
            "the stand-in link's copy " + std::to_string(job->copy) + " (" + std::to_string(bytes) +
            " bytes " + (to_host_ ? "to host" : "to the device") + ") failed: injected")));
        continue;
      }
      try {
        c10::InferenceMode no_autograd;
        job->dst.copy_(job->src);
        link_.log({Event::copied, to_host_, job->copy, bytes});
        job->done.set_value();
      } catch (...) {
        job->done.set_exception(std::current_exception());
      }
    }
  }

  StandInLink& link_;
  bool to_host_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

namespace {

class StandInCopy final : public offload::LinkCopy {
 public:
  StandInCopy(std::shared_future<void> f, std::function<void()> on_wait)
      : f_(std::move(f)), on_wait_(std::move(on_wait)) {}
  void wait() override {
    f_.get();
    if (on_wait_) std::exchange(on_wait_, nullptr)();
  }

 private:
  std::shared_future<void> f_;
  std::function<void()> on_wait_;
};

}  // namespace

StandInLink::StandInLink(StandInOptions options)
    : o_(options),
      down_(std::make_unique<Lane>(*this, true)),
      up_(std::make_unique<Lane>(*this, false)) {}

StandInLink::~StandInLink() = default;

at::Tensor StandInLink::host_empty(int64_t numel, at::ScalarType dtype, bool pinned) {
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  if (at::isFloatingType(dtype)) t.fill_(std::numeric_limits<double>::quiet_NaN());
  if (pinned) {
    std::lock_guard<std::mutex> g(mu_);
    pinned_bytes_ += static_cast<int64_t>(t.nbytes());
  }
  return t;
}

offload::CopyHandle StandInLink::to_host(const at::Tensor& dst, const at::Tensor& src) {
  return issue(true, dst, src);
}

offload::CopyHandle StandInLink::to_device(const at::Tensor& dst, const at::Tensor& src) {
  return issue(false, dst, src);
}

offload::CopyHandle StandInLink::issue(bool to_host, const at::Tensor& dst, const at::Tensor& src) {
  DSCPP_CHECK(dst.numel() == src.numel() && dst.scalar_type() == src.scalar_type() &&
                  dst.is_contiguous() && src.is_contiguous() && dst.is_cpu() && src.is_cpu(),
              Error, "stand-in link: a copy needs contiguous CPU tensors of one dtype and length");
  auto job = std::make_unique<Job>();
  job->dst = dst;
  job->src = src;
  const auto bytes = static_cast<int64_t>(src.nbytes());
  {
    std::lock_guard<std::mutex> g(mu_);
    job->copy = next_copy_++;
    job->fail = job->copy == o_.fail_copy;
    events_.push_back({Event::issued, to_host, job->copy, bytes});
  }
  const int64_t copy = job->copy;
  auto f = (to_host ? down_ : up_)->push(std::move(job));
  return std::make_shared<StandInCopy>(f, [this, to_host, copy, bytes] {
    log({Event::waited, to_host, copy, bytes});
  });
}

void StandInLink::log(Event e) {
  std::lock_guard<std::mutex> g(mu_);
  events_.push_back(e);
}

std::vector<StandInLink::Event> StandInLink::events() const {
  std::lock_guard<std::mutex> g(mu_);
  return events_;
}

int64_t StandInLink::bytes(bool to_host) const {
  std::lock_guard<std::mutex> g(mu_);
  int64_t b = 0;
  for (const auto& e : events_) {
    if (e.kind == Event::copied && e.to_host == to_host) b += e.bytes;
  }
  return b;
}

int64_t StandInLink::pinned_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return pinned_bytes_;
}

void StandInLink::clear_events() {
  std::lock_guard<std::mutex> g(mu_);
  events_.clear();
}

}  // namespace dscpp::testing
