// Op times (NOTE [op times]): each op's self time is its time less its callees', so the self
// times add up to the time inside outermost ops; autograd's nodes count as ops of their own; one
// timer per process; the step log's table lists the top ops with their share of the time.
#include "profiling/op_times.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "support/errors.h"

namespace dscpp {
namespace {

using profiling::OpTimes;

const OpTimes::Op* find(const OpTimes::Summary& s, const std::string& name) {
  for (const auto& op : s.ops)
    if (op.name == name) return &op;
  return nullptr;
}

TEST(OpTimes, SelfTimesAddUpToTheTimeInsideOps) {
  auto a = at::randn({128, 128}), b = at::randn({128, 128});
  auto x = at::randn({4, 16, 128}).requires_grad_(), w = at::randn({64, 128}).requires_grad_();
  // Once untimed: a first call's one-off set-up (the BLAS, the dispatcher) would be linear's own.
  at::mm(a, b);
  at::linear(x, w).sum().backward();
  OpTimes times;
  for (int i = 0; i < 5; ++i) at::mm(a, b);
  at::linear(x, w).sum().backward();
  const auto s = times.take();
  const auto* mm = find(s, "aten::mm");
  ASSERT_NE(mm, nullptr);
  EXPECT_GE(mm->calls, 5 + 2) << "5 here, linear's forward, and its backward's";
  const auto* linear = find(s, "aten::linear");
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->calls, 1);
  bool backward_node = false;
  double self = 0;
  int64_t calls = 0;
  for (const auto& op : s.ops) {
    EXPECT_GE(op.self_seconds, 0) << op.name;
    self += op.self_seconds;
    calls += op.calls;
    backward_node = backward_node || op.name.find("Backward") != std::string::npos;
  }
  EXPECT_TRUE(backward_node) << "autograd's nodes are timed";
  EXPECT_NEAR(self, s.in_ops_seconds, 1e-9 + 1e-9 * s.in_ops_seconds);
  EXPECT_EQ(calls, s.calls);
  EXPECT_GT(s.in_ops_seconds, 0);
  for (size_t i = 1; i < s.ops.size(); ++i)
    EXPECT_GE(s.ops[i - 1].self_seconds, s.ops[i].self_seconds) << "largest first";
  // An op's self time excludes its callees': mm is the bulk of linear here.
  EXPECT_LT(linear->self_seconds, mm->self_seconds);

  const auto again = times.take();
  EXPECT_TRUE(again.ops.empty()) << "take() starts afresh";
  EXPECT_EQ(again.in_ops_seconds, 0);

  // Only the thread that made the timer (and autograd's workers it starts) is timed.
  std::thread([&] { at::mm(a, b); }).join();
  EXPECT_EQ(times.take().calls, 0);
}

TEST(OpTimes, OneAtATimePerProcess) {
  OpTimes a;
  std::string msg = testing::error_of([] { OpTimes b; });
  EXPECT_NE(msg.find("another engine in this process is timing ops"), std::string::npos) << msg;
}

TEST(OpTimes, TableListsTheTopOpsWithTheirShareOfTheTime) {
  OpTimes::Summary s;
  s.ops = {{"aten::mm", 10, 0.5}, {"aten::gelu", 4, 0.2}, {"aten::add", 3, 0.1}};
  s.in_ops_seconds = 0.8;
  s.calls = 17;
  const std::string t = profiling::format_op_table(s, 1.0, 2);
  EXPECT_NE(t.find("800.0 ms inside libtorch ops (80.0% of the time), 200.0 ms outside them "
                   "(17 calls)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find(" 50.0%      500.0 ms       10 calls  aten::mm"), std::string::npos) << t;
  EXPECT_NE(t.find(" 20.0%      200.0 ms        4 calls  aten::gelu"), std::string::npos) << t;
  EXPECT_EQ(t.find("aten::add"), std::string::npos) << t;
  EXPECT_NE(t.find(" 10.0%      100.0 ms        1 ops    the others"), std::string::npos) << t;
}

}  // namespace
}  // namespace dscpp
