// Communicator tests with ranks as threads over a shared store: every operation at world sizes
// 1 to 4, lengths 0, 1, odd and not divisible by the world size, several dtypes and ops, and bad
// arguments. Each rank's input is a known function of (rank, index), so the expected result is
// computed independently of the ring code.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <limits>

#include "comm/comms_logger.h"
#include "comm/quantize.h"
#include "comm/ring.h"
#include "dscpp/comm.h"
#include "dscpp/error.h"
#include "comm/rendezvous.h"
#include "support/thread_ranks.h"

namespace dscpp::comm {
namespace {

using dscpp::testing::error_text;
using dscpp::testing::run_thread_ranks;

// Rank r's value at index i: distinct per rank and index, exact in fp32 for small sizes.
at::Tensor rank_input(int r, int64_t n, at::ScalarType dtype = at::kFloat) {
  return (at::arange(n, at::kDouble) * 0.5 + (r + 1) * 3).to(dtype);
}

at::Tensor expected_reduce(int world, int64_t n, ReduceOp op, at::ScalarType dtype = at::kFloat) {
  // Each rank's input in the tested dtype, then reduced exactly in double.
  at::Tensor acc = rank_input(0, n, dtype).to(at::kDouble);
  for (int r = 1; r < world; ++r) {
    auto x = rank_input(r, n, dtype).to(at::kDouble);
    if (op == ReduceOp::max) acc = at::maximum(acc, x);
    else if (op == ReduceOp::min) acc = at::minimum(acc, x);
    else acc = acc + x;
  }
  if (op == ReduceOp::avg) acc = acc / world;
  return acc.to(dtype);
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << error_text(errors[r]);
}

// Every operation over each transport: Gloo's TCP ("gloo"), shared memory ("shm") and the
// hierarchy across simulated hosts of 2 ranks each ("hosts": shared memory inside a host, Gloo
// between hosts), with slots of 4 KiB so that most lengths take several pieces.
class CommWorld : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  const std::string& transport() const { return std::get<1>(GetParam()); }
  CommOptions options() const {
    CommOptions o;
    o.shm = transport() == "gloo" ? "off" : "on";
    o.shm_slot_bytes = 4096;
    return o;
  }
  // Runs fn on every rank and checks that the transport asked for is the one in use.
  std::vector<std::exception_ptr> run(const std::function<void(Communicator&)>& fn) const {
    const std::string want = world() == 1 || transport() == "gloo" ? "gloo"
                             : transport() == "shm"                 ? "gloo+shm"
                                                                    : "gloo+shm+hosts";
    auto check = [&](Communicator& c) {
      EXPECT_EQ(c.backend_name(), want);
      fn(c);
    };
    if (transport() == "hosts") {
      return testing::run_thread_ranks_with(testing::on_hosts(2, options()), world(), check);
    }
    return run_thread_ranks(world(), check, options());
  }
};

TEST_P(CommWorld, AllReduceEveryOpAndLength) {
  int world = this->world();
  expect_no_errors(run([&](Communicator& c) {
    for (int64_t n : {0, 1, 7, 1001, 5003}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        auto t = rank_input(c.rank(), n);
        c.all_reduce(t, op)->wait();
        EXPECT_TRUE(at::allclose(t, expected_reduce(world, n, op), 1e-6, 1e-6))
            << "n=" << n << " op=" << reduce_op_name(op);
      }
    }
    for (auto dtype : {at::kDouble, at::kLong}) {
      auto t = rank_input(c.rank(), 33, dtype);
      c.all_reduce(t, ReduceOp::sum)->wait();
      EXPECT_TRUE(at::equal(t, expected_reduce(world, 33, ReduceOp::sum, dtype)));
    }
    // Mixed precision's dtypes (bf16 takes the ring path: Gloo cannot reduce it). Small
    // integers are exact in both.
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      for (int64_t n : {1, 7, 1001}) {
        auto t = at::arange(n, at::kFloat).remainder(5).add(c.rank()).to(dtype);
        c.all_reduce(t, ReduceOp::sum)->wait();
        auto want = at::arange(n, at::kFloat).remainder(5).mul(world).add(world * (world - 1) / 2);
        EXPECT_TRUE(at::equal(t.to(at::kFloat), want)) << dtype << " n=" << n;
      }
    }
  }));
}

TEST_P(CommWorld, ReduceScatterEvenAndUneven) {
  int world = this->world();
  expect_no_errors(run([&](Communicator& c) {
    for (int64_t n : {0, 1, 5, 1001, 4096}) {
      auto counts = split_evenly(n, world);
      int64_t offset = 0;
      for (int r = 0; r < c.rank(); ++r) offset += counts[r];
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        auto in = rank_input(c.rank(), n);
        auto in_copy = in.clone();
        auto out = at::full({counts[c.rank()]}, -1.0f);
        c.reduce_scatter(out, in, counts, op)->wait();
        auto want = expected_reduce(world, n, op).narrow(0, offset, counts[c.rank()]);
        EXPECT_TRUE(at::allclose(out, want, 1e-6, 1e-5)) << "n=" << n << " op=" << reduce_op_name(op);
        EXPECT_TRUE(at::equal(in, in_copy)) << "reduce_scatter modified its input";
      }
    }
    // Chunks longer than the ring's pipeline piece, of very different lengths (one empty), so
    // the pieces run out at different times per chunk.
    {
      const int64_t P = comm::kRingPieceElements;
      std::vector<int64_t> counts(world);
      for (int r = 0; r < world; ++r) counts[r] = r == 1 ? 0 : (r % 2 ? 3 : 2 * P + 7 + r);
      int64_t n = 0, offset = 0;
      for (int r = 0; r < world; ++r) (r < c.rank() ? offset : n) += counts[r];
      n += offset;
      auto in = rank_input(c.rank(), n);
      auto out = at::empty({counts[c.rank()]});
      c.reduce_scatter(out, in, counts, ReduceOp::sum)->wait();
      EXPECT_TRUE(at::allclose(out, expected_reduce(world, n, ReduceOp::sum).narrow(0, offset, counts[c.rank()]), 1e-6, 1e-5))
          << "pieces";
    }
    // In place: the output is this rank's own chunk of the input (as ZeRO stage 1 uses it).
    for (int64_t n : {1, 5, 1001, 20011}) {
      auto counts = split_evenly(n, world);
      int64_t offset = 0;
      for (int r = 0; r < c.rank(); ++r) offset += counts[r];
      auto buf = rank_input(c.rank(), n);
      auto mine = buf.narrow(0, offset, counts[c.rank()]);
      c.reduce_scatter(mine, buf, counts, ReduceOp::sum)->wait();
      EXPECT_TRUE(at::allclose(mine, expected_reduce(world, n, ReduceOp::sum).narrow(0, offset, counts[c.rank()]), 1e-6, 1e-5))
          << "in place, n=" << n;
    }
    // The equal-chunk overload.
    auto in = rank_input(c.rank(), 8 * world);
    auto out = at::empty({8});
    c.reduce_scatter(out, in)->wait();
    EXPECT_TRUE(at::allclose(out, expected_reduce(world, 8 * world, ReduceOp::sum).narrow(0, 8 * c.rank(), 8)));
  }));
}

TEST_P(CommWorld, AllGatherEvenAndUneven) {
  int world = this->world();
  expect_no_errors(run([&](Communicator& c) {
    for (int64_t n : {0, 1, 5, 1001, 20011}) {
      auto counts = split_evenly(n, world);
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(rank_input(r, counts[r]));
      auto want = at::cat(parts);
      auto out = at::full({n}, -1.0f);
      c.all_gather(out, rank_input(c.rank(), counts[c.rank()]), counts)->wait();
      EXPECT_TRUE(at::equal(out, want)) << "n=" << n;
      // In place: the input is this rank's own chunk of the output (as ZeRO gathers).
      auto buf = at::full({n}, -1.0f);
      int64_t offset = 0;
      for (int r = 0; r < c.rank(); ++r) offset += counts[r];
      auto mine = buf.narrow(0, offset, counts[c.rank()]);
      mine.copy_(rank_input(c.rank(), counts[c.rank()]));
      c.all_gather(buf, mine, counts)->wait();
      EXPECT_TRUE(at::equal(buf, want)) << "in place, n=" << n;
      // Into one tensor per rank, anywhere (here every rank's piece sits after a gap of 3), in
      // place, as ZeRO gathers piece j of every shard.
      auto spread = at::full({n + 3 * world}, -1.0f);
      std::vector<at::Tensor> outs;
      int64_t at_ = 0;
      for (int r = 0; r < world; ++r) {
        outs.push_back(spread.narrow(0, at_ + 3, counts[r]));
        at_ += 3 + counts[r];
      }
      outs[c.rank()].copy_(rank_input(c.rank(), counts[c.rank()]));
      c.all_gather_into(outs, outs[c.rank()])->wait();
      for (int r = 0; r < world; ++r) EXPECT_TRUE(at::equal(outs[r], parts[r])) << "into, n=" << n << " r=" << r;
      EXPECT_EQ(spread.eq(-1.0f).sum().item<int64_t>(), 3 * world) << "wrote outside the outputs";
    }
    auto out = at::empty({3 * world}, at::kDouble);
    c.all_gather(out, rank_input(c.rank(), 3, at::kDouble))->wait();
    EXPECT_EQ(out[3 * c.rank()].item<double>(), (c.rank() + 1) * 3);
  }));
}

TEST_P(CommWorld, BroadcastBarrierSendRecv) {
  int world = this->world();
  expect_no_errors(run([&](Communicator& c) {
    for (int root = 0; root < world; ++root) {
      for (int64_t n : {17, 5003}) {
        auto t = rank_input(c.rank(), n);
        c.broadcast(t, root)->wait();
        EXPECT_TRUE(at::equal(t, rank_input(root, n))) << "root " << root << " n " << n;
      }
    }
    c.barrier()->wait();
    if (world > 1) {
      // Pass a token around the ring.
      int next = (c.rank() + 1) % world, prev = (c.rank() + world - 1) % world;
      auto out = rank_input(c.rank(), 9);
      auto in = at::empty({9});
      auto s = c.send(out, next);
      auto r = c.recv(in, prev);
      s->wait();
      r->wait();
      EXPECT_TRUE(at::equal(in, rank_input(prev, 9)));
    }
  }));
}

TEST_P(CommWorld, ManyOutstandingOpsCompleteInOrder) {
  int world = this->world();
  expect_no_errors(run([&](Communicator& c) {
    std::vector<at::Tensor> ts;
    std::vector<WorkHandle> ws;
    for (int i = 0; i < 20; ++i) {
      ts.push_back(at::full({100 + i}, static_cast<float>(c.rank() + i)));
      ws.push_back(c.all_reduce(ts.back()));
    }
    for (int i = 0; i < 20; ++i) {
      ws[i]->wait();
      float want = 0;
      for (int r = 0; r < world; ++r) want += r + i;
      EXPECT_EQ(ts[i][0].item<float>(), want);
    }
    EXPECT_EQ(c.sequence_number(), 20);
  }));
}

std::string world_name(const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, CommWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("gloo", "shm")),
                         world_name);
// 2 and 3 hosts of 2 ranks: the column's ring has 1 and 2 steps.
INSTANTIATE_TEST_SUITE_P(Hosts, CommWorld,
                         ::testing::Combine(::testing::Values(4, 6), ::testing::Values("hosts")),
                         world_name);

TEST(CommArgs, BadArgumentsAreClearErrors) {
  expect_no_errors(run_thread_ranks(2, [&](Communicator& c) {
    auto in = at::zeros({10});
    auto out = at::zeros({4});
    try {
      c.reduce_scatter(out, in, {5, 5});
      ADD_FAILURE() << "wrong output size accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("expected counts["), std::string::npos) << e.what();
    }
    EXPECT_THROW(c.reduce_scatter(out, in, {5, 4}), CommError);     // counts sum
    EXPECT_THROW(c.reduce_scatter(out, in, {10}), CommError);       // counts size
    EXPECT_THROW(c.reduce_scatter(out, in), CommError);             // 10 != 2 * 4
    EXPECT_THROW(c.all_gather(at::zeros({7}), at::zeros({4})), CommError);
    EXPECT_THROW(c.broadcast(in, 2), CommError);
    EXPECT_THROW(c.send(in, c.rank()), CommError);
    EXPECT_THROW(c.all_reduce(at::zeros({4, 4}).t()), CommError);   // not contiguous
    EXPECT_THROW(c.all_reduce(at::zeros({4}, at::kLong), ReduceOp::avg), CommError);
    c.barrier()->wait();
  }));
}

// Shared memory: every rank gets the same bits (each element is reduced once, by one rank, in
// rank order), over many pieces of the default slot; mixed precision sums in fp32.
TEST(ShmCollectives, EveryRankGetsTheSameBits) {
  const int world = 3;
  const int64_t n = (int64_t{3} << 20) + 5;  // three 4 MiB slots' worth of fp32, and a tail
  std::vector<at::Tensor> results(world), bf16(world);
  CommOptions o;
  o.shm = "on";
  expect_no_errors(run_thread_ranks(world, [&](Communicator& c) {
    ASSERT_EQ(c.backend_name(), "gloo+shm");
    EXPECT_EQ(c.host_group_size(), world);  // one host: the host group is the world
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + c.rank());
    auto t = at::randn({n}, gen);
    auto want = t.to(at::kDouble);
    c.all_reduce(t)->wait();
    results[c.rank()] = t;
    // bf16 values whose fp32 sum is exact but whose bf16 partial sums would round.
    auto b = at::full({5000}, c.rank() == 0 ? 256.0f : 1.0f).to(at::kBFloat16);
    c.all_reduce(b)->wait();
    bf16[c.rank()] = b;
  }, o));
  for (int r = 1; r < world; ++r) {
    EXPECT_TRUE(at::equal(results[r], results[0])) << "rank " << r << " differs from rank 0";
  }
  at::Tensor want = at::zeros({n}, at::kDouble);
  for (int r = 0; r < world; ++r) {
    want += at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(100 + r)).to(at::kDouble);
  }
  EXPECT_TRUE(at::allclose(results[0].to(at::kDouble), want, 1e-5, 1e-5));
  // 256 + 1 + 1 = 258 is a bf16 value; summing in bf16 would give 256 + 1 = 256 (rounded), + 1
  // = 256 again.
  EXPECT_EQ(bf16[0][0].item<float>(), 258.0f);
}

// Across simulated hosts: every rank gets the same bits from all_reduce (3 hosts of 2, a ring of
// 3 between them, many pieces), sums agree with the exact ones, and layouts the hierarchy does
// not fit stay on flat Gloo, or fail when shared memory was demanded.
TEST(HierarchyCollectives, EveryRankGetsTheSameBitsAndOtherLayoutsStayFlat) {
  const int world = 6;
  const int64_t n = (int64_t{1} << 20) + 7;
  std::vector<at::Tensor> results(world), sums(world);
  expect_no_errors(testing::run_thread_ranks_with(testing::on_hosts(2), world, [&](Communicator& c) {
    ASSERT_EQ(c.backend_name(), "gloo+shm+hosts");
    auto t = at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(100 + c.rank()));
    c.all_reduce(t)->wait();
    results[c.rank()] = t;
    // Each rank's chunk of a reduce-scatter, then gathered back: the same as the all-reduce.
    auto in = at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(100 + c.rank()));
    auto counts = split_evenly(n, world);
    auto out = at::empty({counts[c.rank()]});
    c.reduce_scatter(out, in, counts)->wait();
    auto all = at::empty({n});
    c.all_gather(all, out, counts)->wait();
    sums[c.rank()] = all;
    // hpZ's gather among the host's 2 ranks: the host's inputs only, in local rank order.
    ASSERT_EQ(c.host_group_size(), 2);
    auto own = at::full({5}, static_cast<float>(c.rank()));
    auto got = at::empty({10});
    c.host_all_gather_into({got.narrow(0, 0, 5), got.narrow(0, 5, 5)}, own)->wait();
    const float first = static_cast<float>(c.rank() / 2 * 2);
    EXPECT_TRUE(at::equal(got, at::cat({at::full({5}, first), at::full({5}, first + 1)})))
        << "rank " << c.rank() << ": " << got;
  }));
  at::Tensor want = at::zeros({n}, at::kDouble);
  for (int r = 0; r < world; ++r) {
    want += at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(100 + r)).to(at::kDouble);
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(at::equal(results[r], results[0])) << "rank " << r << " differs from rank 0";
    EXPECT_TRUE(at::equal(sums[r], sums[0])) << "rank " << r << " differs from rank 0";
  }
  EXPECT_TRUE(at::allclose(results[0].to(at::kDouble), want, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(sums[0].to(at::kDouble), want, 1e-5, 1e-5));

  // Interleaved hosts, or hosts of different sizes: flat Gloo, the same results.
  for (auto host_of : {std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 0, 1}}) {
    auto options_of = [&](int rank) {
      CommOptions o;
      o.host = "host" + std::to_string(host_of[rank]);
      return o;
    };
    expect_no_errors(testing::run_thread_ranks_with(options_of, 4, [&](Communicator& c) {
      EXPECT_EQ(c.backend_name(), "gloo");
      EXPECT_EQ(c.host_group_size(), 1);  // no ranks share memory through the collectives
      auto t = rank_input(c.rank(), 1000);
      c.all_reduce(t)->wait();
      EXPECT_TRUE(at::equal(t, expected_reduce(4, 1000, ReduceOp::sum)));
    }));
    auto demanded = [&](int rank) {
      auto o = options_of(rank);
      o.shm = "on";
      return o;
    };
    auto errors = testing::run_thread_ranks_with(demanded, 4, [](Communicator&) {});
    for (auto& e : errors) {
      EXPECT_NE(error_text(e).find("cannot be used across these hosts: the "), std::string::npos)
          << error_text(e);
    }
  }
  // DSCPP_COMM_HIERARCHY=off: flat over the same hosts; off on one rank is off for all (nobody
  // waits in a hierarchy the others never set up).
  CommOptions off;
  off.hierarchy = "off";
  expect_no_errors(testing::run_thread_ranks_with(testing::on_hosts(2, off), 4, [&](Communicator& c) {
    EXPECT_EQ(c.backend_name(), "gloo");
  }));
  for (int odd_one : {0, 3}) {
    auto options_of = [&](int rank) {
      CommOptions o = testing::on_hosts(2)(rank);
      if (rank == odd_one) o.hierarchy = "off";
      o.rendezvous_timeout = std::chrono::seconds(20);
      return o;
    };
    expect_no_errors(testing::run_thread_ranks_with(options_of, 4, [&](Communicator& c) {
      EXPECT_EQ(c.backend_name(), "gloo");
      auto t = rank_input(c.rank(), 100);
      c.all_reduce(t)->wait();
      EXPECT_TRUE(at::equal(t, expected_reduce(4, 100, ReduceOp::sum)));
    }));
  }
}

// NOTE [tree order]: with powers of two of hosts and of ranks per host, the hierarchy sums in
// the tree one host of all the ranks sums in: all_reduce (sum and avg) and an uneven
// reduce_scatter give one host's bits at 2 x 2, 2 x 4 and 4 x 2, pieces and tails included.
TEST(HierarchyCollectives, PowersOfTwoGiveOneHostsBits) {
  const int64_t n = (int64_t{1} << 20) * 3 + 13;  // several shared-memory slots and tree pieces
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2}}) {
    const int world = hosts * per_host;
    auto counts = split_evenly(n, world);
    counts[0] += counts[1] / 2;  // uneven, one chunk short
    counts[1] -= counts[1] / 2;
    struct Out {
      at::Tensor sum, avg, scattered;
    };
    auto run = [&](const testing::OptionsFn& options_of) {
      std::vector<Out> out(world);
      expect_no_errors(testing::run_thread_ranks_with(options_of, world, [&](Communicator& c) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + c.rank());
        auto x = at::randn({n}, gen) * at::exp(at::randn({n}, gen) * 4);  // wide exponents
        Out& o = out[c.rank()];
        o.sum = x.clone();
        c.all_reduce(o.sum)->wait();
        o.avg = x.clone();
        c.all_reduce(o.avg, ReduceOp::avg)->wait();
        o.scattered = at::empty({counts[c.rank()]});
        c.reduce_scatter(o.scattered, x, counts)->wait();
      }));
      return out;
    };
    CommOptions shm;
    shm.shm = "on";
    auto one_host = run([&](int) { return shm; });
    auto across = run(testing::on_hosts(per_host));
    const std::string what = std::to_string(hosts) + " x " + std::to_string(per_host);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(at::equal(across[r].sum, one_host[r].sum)) << what << " rank " << r;
      EXPECT_TRUE(at::equal(across[r].avg, one_host[r].avg)) << what << " rank " << r;
      EXPECT_TRUE(at::equal(across[r].scattered, one_host[r].scattered)) << what << " rank " << r;
    }
  }
}

// Ranks that enter different collectives fail at the first barrier, naming both sides, without
// debug_sync and without waiting for the timeout.
TEST(ShmCollectives, MismatchedSizesFailAtOnceNamingBothSides) {
  const int world = 3;
  CommOptions o;
  o.shm = "on";
  o.timeout = std::chrono::seconds(60);
  auto start = std::chrono::steady_clock::now();
  auto errors = run_thread_ranks(world, [&](Communicator& c) {
    auto ok = at::ones({8});
    c.all_reduce(ok)->wait();
    auto t = at::ones({c.rank() == 2 ? 999 : 1000});
    c.all_reduce(t)->wait();
  }, o);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    std::string s = error_text(errors[r]);
    EXPECT_NE(s.find("rank 0 entered #2 all_reduce(float32, 1000 elements) op sum but rank 2 "
                     "entered #2 all_reduce(float32, 999 elements) op sum"), std::string::npos) << s;
  }
}

// Every dtype the group reduces, and max/min/avg in 16-bit floats (max/min exact, avg summed in
// fp32): world 3, over several pieces.
TEST(ShmCollectives, EveryDtypeAndOp) {
  const int world = 3;
  CommOptions o;
  o.shm = "on";
  o.shm_slot_bytes = 4096;
  expect_no_errors(run_thread_ranks(world, [&](Communicator& c) {
    for (auto dtype : {at::kChar, at::kByte, at::kShort, at::kInt, at::kLong}) {
      auto t = at::arange(3000, at::kLong).remainder(7).add(c.rank()).to(dtype);
      c.all_reduce(t)->wait();
      auto want = at::arange(3000, at::kLong).remainder(7).mul(world).add(3).to(dtype);
      EXPECT_TRUE(at::equal(t, want)) << dtype;
    }
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      for (ReduceOp op : {ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
        auto t = rank_input(c.rank(), 3000, dtype);
        c.all_reduce(t, op)->wait();
        EXPECT_TRUE(at::allclose(t.to(at::kFloat), expected_reduce(world, 3000, op, dtype).to(at::kFloat), 1e-2, 1e-2))
            << dtype << " " << reduce_op_name(op);
      }
    }
  }, o));
}

// Same total but other counts, or another reduce op: caught at the first barrier too.
TEST(ShmCollectives, MismatchedCountsOrOpsFailAtOnce) {
  CommOptions o;
  o.shm = "on";
  o.timeout = std::chrono::seconds(60);
  for (bool counts : {true, false}) {
    auto errors = run_thread_ranks(2, [&](Communicator& c) {
      auto in = at::ones({4});
      if (counts) {
        auto out = at::empty({c.rank() == 0 ? 3 : 2});
        c.reduce_scatter(out, in, c.rank() == 0 ? std::vector<int64_t>{3, 1} : std::vector<int64_t>{2, 2})->wait();
      } else {
        c.all_reduce(in, c.rank() == 0 ? ReduceOp::sum : ReduceOp::avg)->wait();
      }
    }, o);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(errors[r]) << "rank " << r;
      std::string s = error_text(errors[r]);
      EXPECT_NE(s.find("collective mismatch in shared memory"), std::string::npos) << s;
      EXPECT_NE(s.find(counts ? "counts" : "op avg"), std::string::npos) << s;
    }
  }
}

// A segment that cannot be made (larger than all of /dev/shm, which tmpfs refuses at once): an
// error on every rank with "on", Gloo (and correct results) with "auto".
TEST(ShmCollectives, UnavailableSegmentIsAnErrorWhenAskedForAndGlooOtherwise) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0) << "no /dev/shm";
  const int64_t tmpfs_bytes = static_cast<int64_t>(fs.f_blocks) * static_cast<int64_t>(fs.f_frsize);
  if (tmpfs_bytes == 0) GTEST_SKIP() << "/dev/shm has no size limit, so no segment is too large";
  CommOptions o;
  o.shm_slot_bytes = tmpfs_bytes;  // the segment is 2 x 2 slots
  o.shm = "on";
  auto errors = run_thread_ranks(2, [&](Communicator&) {}, o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    std::string s = error_text(errors[r]);
    EXPECT_NE(s.find("shared-memory collectives were requested"), std::string::npos) << s;
    EXPECT_NE(s.find("rank 0 could not"), std::string::npos) << s;
  }
  o.shm = "auto";
  expect_no_errors(run_thread_ranks(2, [&](Communicator& c) {
    EXPECT_EQ(c.backend_name(), "gloo");
    auto t = at::full({10}, 1.0f + c.rank());
    c.all_reduce(t)->wait();
    EXPECT_EQ(t[9].item<float>(), 3.0f);
  }, o));
}

// One rank with shared memory off turns it off for every rank, without an error or a wait.
TEST(ShmCollectives, OffOnOneRankIsOffForAll) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> names(2), errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommOptions mine;
        mine.shm = r == 1 ? "off" : "auto";
        auto c = make_gloo_communicator(store, r, 2, mine);
        names[r] = c->backend_name();
        auto t = at::ones({4});
        c->all_reduce(t)->wait();
        EXPECT_EQ(t[0].item<float>(), 2.0f);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(names[r], "gloo") << "rank " << r;
  }
}

// NOTE [quantized reduce-scatter]: across 2 simulated hosts of 2 ranks (the hierarchy), and
// flat across them (DSCPP_COMM_HIERARCHY=off), each rank's chunk is the exact sum within the
// int4 error of the other host's (or other ranks') contributions, in place or not, sum and avg;
// on one host it is the exact reduce_scatter.
TEST(QuantizedReduceScatter, WithinTheInt4ErrorAcrossHostsAndExactOnOne) {
  const int world = 4;
  const int64_t n = 4 * 3000 + 3;
  auto counts = split_evenly(n, world);
  auto input_of = [&](int r) {
    return at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(50 + r));
  };
  at::Tensor exact = at::zeros({n}, at::kDouble);
  for (int r = 0; r < world; ++r) exact += input_of(r).to(at::kDouble);
  const auto off = offsets_of(counts);
  for (std::string mode : {"hosts", "flat", "one host"}) {
    CommOptions o;
    if (mode == "flat") o.hierarchy = "off";
    auto options_of = [&](int rank) {
      CommOptions mine = o;
      if (mode != "one host") mine.host = "host" + std::to_string(rank / 2);
      return mine;
    };
    expect_no_errors(testing::run_thread_ranks_with(options_of, world, [&](Communicator& c) {
      const int r = c.rank();
      auto in = input_of(r);
      auto want = exact.narrow(0, off[r], counts[r]);
      auto out = at::empty({counts[r]});
      c.reduce_scatter_quantized(out, in, counts, ReduceOp::sum)->wait();
      // The error bound: half an int4 step of each quantized contribution's block, at most the
      // largest |value| / 14 per contribution, 3 contributions at most.
      const double bound = 3 * 4.5 / 14;  // randn stays below 4.5 here
      const double err = (out.to(at::kDouble) - want).abs().max().item<double>();
      if (mode == "one host") {
        auto plain = at::empty({counts[r]});
        c.reduce_scatter(plain, in, counts)->wait();
        EXPECT_TRUE(at::equal(out, plain)) << mode;
      } else {
        EXPECT_LE(err, bound) << mode << " rank " << r;
        EXPECT_GT(err, 0) << mode << ": nothing was quantized";
      }
      // In place, averaged: the same values / world.
      auto again = in.clone();
      auto mine = again.narrow(0, off[r], counts[r]);
      c.reduce_scatter_quantized(mine, again, counts, ReduceOp::avg)->wait();
      EXPECT_TRUE(at::allclose(mine, out / world, 1e-6, 1e-6)) << mode << " rank " << r;
    }));
  }
}

// NOTE [block-wise quantization], int8 (weights) and int4 (gradients): each element comes back
// within half its block's step (max |x| / 2L), blocks are independent (a large value coarsens
// only its own block), zeros and exact multiples of the step come back exact, a NaN or infinity
// makes its block NaN, fp32, bf16 and fp16 go in and out, and `accumulate` adds.
TEST(Quantize, BlockWiseRoundTripsWithinHalfAStep) {
  for (QuantFormat f : {kWeightFormat, kGradientFormat}) {
    const std::string what = std::to_string(f.bits) + "-bit";
    const float levels = static_cast<float>((1 << (f.bits - 1)) - 1);
    const int64_t n = 3 * f.block + 17;
    ASSERT_EQ(quant_blocks(n, f), 4);
    auto x = at::randn({n}, at::make_generator<at::CPUGeneratorImpl>(7));
    x.narrow(0, f.block, f.block).mul_(1000);  // block 1 is large
    x.narrow(0, 2 * f.block, f.block).zero_();  // block 2 is zeros
    auto codes = at::empty({code_bytes(n, f)}, at::kChar);
    auto scales = at::empty({4});
    quantize(x, codes, scales, f);
    auto back = at::empty({n});
    dequantize(codes, scales, back, f);
    for (int64_t b = 0; b < 4; ++b) {
      auto xs = x.narrow(0, b * f.block, std::min(f.block, n - b * f.block));
      auto bs = back.narrow(0, b * f.block, xs.numel());
      const float step = xs.abs().max().item<float>() / levels;
      EXPECT_LE((xs - bs).abs().max().item<float>(), step / 2 * (1 + 1e-5) + 1e-30)
          << what << " block " << b;
    }
    EXPECT_TRUE(at::equal(back.narrow(0, 2 * f.block, f.block), at::zeros({f.block}))) << what;
    EXPECT_LT(scales[0].item<float>(), scales[1].item<float>() / 100) << what;
    // accumulate adds the same values.
    auto twice = back.clone();
    dequantize(codes, scales, twice, f, /*accumulate=*/true);
    EXPECT_TRUE(at::allclose(twice, back * 2)) << what;
    // Multiples of the step come back exactly.
    auto exact = at::arange(-levels, levels + 1, at::kFloat) * 0.5f;
    auto ec = at::empty({code_bytes(exact.numel(), f)}, at::kChar);
    auto es = at::empty({1});
    quantize(exact, ec, es, f);
    auto eback = at::empty_like(exact);
    dequantize(ec, es, eback, f);
    EXPECT_TRUE(at::equal(eback, exact)) << what;
    // Tiny values (subnormal fp32) come back within FLT_MIN / 2, zeros as zeros.
    auto tiny = at::zeros({f.block});
    tiny.narrow(0, 0, 8).fill_(1e-40f);
    auto tc = at::empty({code_bytes(tiny.numel(), f)}, at::kChar);
    auto ts = at::empty({1});
    quantize(tiny, tc, ts, f);
    auto tback = at::empty_like(tiny);
    dequantize(tc, ts, tback, f);
    EXPECT_LE((tback - tiny).abs().max().item<float>(), std::numeric_limits<float>::min()) << what;
    EXPECT_TRUE(at::equal(tback.narrow(0, 8, f.block - 8), at::zeros({f.block - 8}))) << what;
    // A non-finite value poisons its own block only.
    auto bad = at::ones({2 * f.block});
    bad[5] = std::numeric_limits<float>::infinity();
    auto bc = at::empty({code_bytes(bad.numel(), f)}, at::kChar);
    auto bscale = at::empty({2});
    quantize(bad, bc, bscale, f);
    auto bback = at::empty_like(bad);
    dequantize(bc, bscale, bback, f);
    EXPECT_TRUE(at::isnan(bback.narrow(0, 0, f.block)).all().item<bool>()) << what;
    EXPECT_TRUE(at::equal(bback.narrow(0, f.block, f.block), at::ones({f.block}))) << what;
    // bf16 in, fp16 out: within a step of the bf16 values (and fp16's rounding).
    auto h = x.to(at::kBFloat16);
    quantize(h, codes, scales, f);
    auto hback = at::empty({n}, at::kHalf);
    dequantize(codes, scales, hback, f);
    auto err = (hback.to(at::kFloat) - h.to(at::kFloat)).abs().narrow(0, 0, f.block);
    const float amax = h.narrow(0, 0, f.block).to(at::kFloat).abs().max().item<float>();
    EXPECT_LE(err.max().item<float>(), amax / levels / 2 + amax / 1024) << what;  // + fp16's ulp
    EXPECT_THROW(quantize(x.to(at::kDouble), codes, scales, f), Error);
  }
}

}  // namespace
}  // namespace dscpp::comm

namespace dscpp::comm {
namespace {

TEST(CommsLogger, SummarisesCountsSizesAndBusBandwidth) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::reduce_scatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::all_gather, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(OpKind::broadcast, 4), 1.0);
  CommsLoggerConfig cfg;
  cfg.enabled = true;
  CommsLogger log(cfg, 4);
  OpDesc ar{OpKind::all_reduce, at::kFloat, 1 << 20, -1};  // 4 MiB
  for (int i = 0; i < 3; ++i) log.record(ar, ar.bytes(), std::chrono::milliseconds(4));
  log.record(OpDesc{OpKind::barrier, at::kFloat, 0, -1}, 0, std::chrono::milliseconds(1));
  std::string s = log.summary();
  EXPECT_NE(s.find("all_reduce"), std::string::npos) << s;
  EXPECT_NE(s.find("4.00 MiB"), std::string::npos) << s;
  EXPECT_NE(s.find("      3 "), std::string::npos) << s;   // count column
  EXPECT_NE(s.find("1000.00 MiB/s"), std::string::npos) << s;  // algbw = 4 MiB / 4 ms
  EXPECT_NE(s.find("1.46 GiB/s"), std::string::npos) << s;  // busbw = 1500 MiB/s = algbw * 2(n-1)/n
  EXPECT_NE(s.find("barrier"), std::string::npos) << s;
  EXPECT_NE(s.find("sent own host"), std::string::npos) << s;
  EXPECT_NE(s.find("sent to hosts"), std::string::npos) << s;

  // Bytes sent to the own host and to other hosts are summed over calls, "-" once any call's
  // were moved by the backend's own algorithm.
  CommsLogger hosts(cfg, 4);
  OpDesc rs{OpKind::reduce_scatter, at::kFloat, 1 << 20, -1};
  Traffic t;
  t.own_host = 3 << 20;
  t.other_hosts = 1 << 20;
  hosts.record(rs, rs.bytes(), std::chrono::milliseconds(4), t);
  hosts.record(rs, rs.bytes(), std::chrono::milliseconds(4), t);
  Traffic unseen;
  unseen.counted = false;
  hosts.record(ar, ar.bytes(), std::chrono::milliseconds(4), t);
  hosts.record(ar, ar.bytes(), std::chrono::milliseconds(4), unseen);
  s = hosts.summary();
  const auto rs_row = s.substr(s.find("reduce_scatter"));
  EXPECT_NE(rs_row.find("      6.00 MiB       2.00 MiB\n"), std::string::npos) << s;
  const auto ar_row = s.substr(s.find("all_reduce"));
  EXPECT_NE(ar_row.find("              -              -\n"), std::string::npos) << s;

  cfg.prof_all = false;
  cfg.prof_ops = {"reduce_scatter"};
  CommsLogger only_rs(cfg, 4);
  only_rs.record(ar, ar.bytes(), std::chrono::milliseconds(4));
  EXPECT_EQ(only_rs.summary(), "");
  cfg.enabled = false;
  CommsLogger off(cfg, 4);
  off.record(ar, ar.bytes(), std::chrono::milliseconds(4));
  EXPECT_EQ(off.summary(), "");
}

}  // namespace
}  // namespace dscpp::comm
