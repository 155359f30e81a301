// Out-of-sync detection: a rank that skips a collective makes the others fail within the
// timeout plus a few seconds with a report that names it; the debug switch catches ranks that
// enter different collectives, naming both sides; the report table itself.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support/fault_communicator.h"
#include "comm/sync_monitor.h"
#include "dscpp/comm.h"
#include "dscpp/error.h"
#include "support/thread_ranks.h"

namespace dscpp::comm {
namespace {

using dscpp::testing::error_text;
using dscpp::testing::run_thread_ranks;
using Clock = std::chrono::steady_clock;

TEST(SyncReport, NamesTheRankBehindAndTheCollectiveItNeverEntered) {
  std::vector<std::optional<RankRecord>> recs(3);
  OpDesc ar{OpKind::all_reduce, at::kFloat, 1000, -1};
  recs[0] = RankRecord{0, 3, ar, 7, false};
  recs[1] = RankRecord{1, 2, ar, 7, true};
  recs[2] = RankRecord{2, 3, ar, 7, false};
  std::string s = format_sync_report(0, 3, "collective #3 timed out", recs);
  EXPECT_NE(s.find("rank 1 is behind"), std::string::npos) << s;
  EXPECT_NE(s.find("never entered #3 (all_reduce(float32, 1000 elements))"), std::string::npos) << s;
  EXPECT_NE(s.find("rank(s) 0,2 are waiting in"), std::string::npos) << s;
  EXPECT_EQ(s.find("did not answer"), std::string::npos) << s;
}

TEST(SyncReport, NamesRanksThatDidNotAnswer) {
  std::vector<std::optional<RankRecord>> recs(2);
  recs[0] = RankRecord{0, 5, OpDesc{OpKind::barrier, at::kFloat, 0, -1}, 1, false};
  std::string s = format_sync_report(0, 2, "collective #5 barrier timed out", recs);
  EXPECT_NE(s.find("rank(s) 1 did not answer"), std::string::npos) << s;
}

// Over TCP, a collective issued on one rank only (save_checkpoint inside `if (rank == 0)`)
// leaves the ranks at the same number in different operations: said so, not "all ranks entered
// the same collective".
TEST(SyncReport, NamesRanksInDifferentOperationsAtTheSameNumber) {
  std::vector<std::optional<RankRecord>> recs(2);
  recs[0] = RankRecord{0, 16, OpDesc{OpKind::broadcast, at::kDouble, 1, 0}, 3, false};
  recs[1] = RankRecord{1, 16, OpDesc{OpKind::reduce_scatter, at::kFloat, 128, -1}, 3, false};
  std::string s = format_sync_report(1, 2, "collective #16 timed out", recs);
  EXPECT_NE(s.find("entered different operations as collective #16: rank 0 entered "
                   "broadcast(float64, 1 elements, root 0), rank 1 entered "
                   "reduce_scatter(float32, 128 elements)"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("All ranks entered the same collective"), std::string::npos) << s;
}

// A stopped rank 0 cannot answer through the store it serves: the report says so and names it.
TEST(SyncReport, NamesRankZeroWhenTheStoreIsSilent) {
  std::vector<std::optional<RankRecord>> recs(3);
  recs[1] = RankRecord{1, 4, OpDesc{OpKind::all_reduce, at::kFloat, 8, -1}, 2, false};
  std::string s = format_sync_report(1, 3, "collective #4 timed out", recs, /*store_silent=*/true);
  EXPECT_NE(s.find("unknown (the store did not answer)"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 0 did not answer: the store every rank reports through runs in rank "
                   "0's process"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("rank(s)"), std::string::npos) << s;
}

TEST(SyncReport, RecordRoundTrips) {
  RankRecord r{3, 42, OpDesc{OpKind::broadcast, at::kDouble, 17, 2}, 9, false};
  auto p = RankRecord::parse(r.serialize());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 3);
  EXPECT_EQ(p->seq, 42);
  EXPECT_EQ(p->op.kind, OpKind::broadcast);
  EXPECT_EQ(p->op.dtype, at::kDouble);
  EXPECT_EQ(p->op.peer, 2);
  EXPECT_EQ(p->step, 9);
  EXPECT_FALSE(p->completed);
  EXPECT_FALSE(RankRecord::parse("garbage"));
}

// Rank 1 of 4 skips the 2nd of three all_reduces; the others must fail within timeout + 10 s
// with the report naming rank 1, over Gloo's TCP and over shared memory alike.
class SyncTimeout : public ::testing::TestWithParam<const char*> {};

TEST_P(SyncTimeout, SkippedAllReduceIsReportedByEverySurvivor) {
  const int world = 4;
  CommOptions opts;
  opts.timeout = std::chrono::seconds(2);
  opts.shm = GetParam();
  std::atomic<int> finished{0};
  std::vector<double> seconds_to_fail(world, -1);
  Fault fault{Fault::Kind::skip, /*rank=*/1, /*nth=*/2};
  auto errors = run_thread_ranks(
      world,
      [&](Communicator& c) {
        c.set_step(7);
        auto t = at::ones({1000});
        c.all_reduce(t)->wait();
        auto start = Clock::now();
        try {
          c.all_reduce(t)->wait();
          c.all_reduce(t)->wait();
        } catch (...) {
          seconds_to_fail[c.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
          finished++;
          throw;
        }
        // Rank 1 gets here (its 2nd call was skipped, its 3rd matched the others' 2nd): it
        // stays alive until the others have reported, as a hung rank would.
        while (finished < world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      },
      opts, [&](auto inner) { return std::make_shared<FaultCommunicator>(inner, fault); });
  EXPECT_FALSE(errors[1]) << error_text(errors[1]);
  for (int r : {0, 2, 3}) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    std::string s = error_text(errors[r]);
    EXPECT_NE(s.find("rank 1 is behind"), std::string::npos) << "rank " << r << ":\n" << s;
    EXPECT_NE(s.find("never entered #3"), std::string::npos) << s;
    EXPECT_NE(s.find("did not complete within 2.0 s"), std::string::npos) << s;
    EXPECT_LT(seconds_to_fail[r], 2 + 10) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommTimeout&) {
    } catch (...) {
      ADD_FAILURE() << "rank " << r << " threw something other than CommTimeout";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, SyncTimeout, ::testing::Values("off", "on"),
                         [](const auto& info) { return std::string(info.param) == "on" ? "shm" : "gloo"; });

// With debug_sync, rank 2 entering an all_reduce of a different size fails at once on every
// rank with both sides named, instead of hanging or producing wrong numbers.
TEST(SyncDebug, MismatchedShapesFailAtOnceNamingBothSides) {
  const int world = 3;
  CommOptions opts;
  opts.debug_sync = true;
  opts.timeout = std::chrono::seconds(30);
  auto start = Clock::now();
  auto errors = run_thread_ranks(world, [&](Communicator& c) {
    auto ok = at::ones({8});
    c.all_reduce(ok)->wait();
    EXPECT_EQ(ok[0].item<float>(), 3.0f);
    auto t = at::ones({c.rank() == 2 ? 999 : 1000});
    c.all_reduce(t)->wait();
  }, opts);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    std::string s = error_text(errors[r]);
    EXPECT_NE(s.find("collective mismatch at collective #2"), std::string::npos) << s;
    EXPECT_NE(s.find("rank 0 entered all_reduce(float32, 1000 elements) but rank 2 entered "
                     "all_reduce(float32, 999 elements)"),
              std::string::npos)
        << s;
  }
}

TEST(SyncDebug, DifferentOperationsAreCaught) {
  CommOptions opts;
  opts.debug_sync = true;
  auto errors = run_thread_ranks(2, [&](Communicator& c) {
    auto t = at::ones({4});
    if (c.rank() == 0) c.all_reduce(t)->wait();
    else c.broadcast(t, 0)->wait();
  }, opts);
  for (int r = 0; r < 2; ++r) {
    std::string s = error_text(errors[r]);
    EXPECT_NE(s.find("but rank 1 entered broadcast(float32, 4 elements, root 0)"), std::string::npos) << s;
  }
}

TEST(CommFault, InjectedFailureSurfacesInWait) {
  Fault fault{Fault::Kind::fail, 0, 1};
  auto errors = run_thread_ranks(1, [&](Communicator& c) {
    auto t = at::ones({4});
    EXPECT_THROW(c.all_reduce(t)->wait(), CommError);
    c.all_reduce(t)->wait();  // the next one goes through
  }, {}, [&](auto inner) { return std::make_shared<FaultCommunicator>(inner, fault); });
  EXPECT_FALSE(errors[0]) << error_text(errors[0]);
}

}  // namespace
}  // namespace dscpp::comm
