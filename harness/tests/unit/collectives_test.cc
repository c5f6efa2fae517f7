// Every collective of the Gloo communicator at world sizes 1 to 4, ranks as threads of this
// process, against inputs whose results are known; and the same through NCCL where a GPU is
// present (otherwise the NCCL tests skip, saying why).
#include <functional>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"
#include "common/error.h"
#include "dmp/dense_data_parallel.h"
#include "test_util.h"

namespace dmpcheck {
namespace {

// Runs `body(comm)` on `world` ranks of `backend`, one thread each; rethrows the first failure.
void on_ranks(comm::Backend backend, int world, const std::function<void(comm::Communicator&)>& body) {
  comm::Store host = comm::Store::host("127.0.0.1", "collectives-test", std::chrono::seconds(30));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::Store store =
            comm::Store::connect("127.0.0.1", host.port(), "collectives-test", std::chrono::seconds(30));
        comm::BackendOptions options;
        options.timeout = std::chrono::seconds(30);
        options.local_rank = r;
        auto c = comm::make_communicator(backend, store, r, world, options);
        body(*c);
      } catch (...) { errors[static_cast<size_t>(r)] = std::current_exception(); }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Rank r's input: r * 100 + 0, 1, 2, ...
at::Tensor input_of(int rank, int64_t n) { return at::arange(n, at::kFloat) + 100.0 * rank; }

void check_every_collective(comm::Backend backend, int world) {
  on_ranks(backend, world, [world](comm::Communicator& c) {
    const int me = c.rank();
    const int64_t n = 6 * world;  // divisible for reduce_scatter

    // broadcast from the last rank
    at::Tensor b = input_of(me, n);
    c.broadcast(b, world - 1);
    EXPECT_TRUE(b.equal(input_of(world - 1, n))) << "broadcast on rank " << me;

    // all_reduce: sum, max and min
    at::Tensor expected_sum = at::zeros({n}, at::kFloat);
    for (int r = 0; r < world; ++r) expected_sum += input_of(r, n);
    at::Tensor s = input_of(me, n);
    c.all_reduce(s, comm::ReduceOp::kSum);
    EXPECT_TRUE(s.equal(expected_sum)) << "all_reduce sum on rank " << me;
    at::Tensor mx = input_of(me, n);
    c.all_reduce(mx, comm::ReduceOp::kMax);
    EXPECT_TRUE(mx.equal(input_of(world - 1, n)));
    at::Tensor mn = input_of(me, n);
    c.all_reduce(mn, comm::ReduceOp::kMin);
    EXPECT_TRUE(mn.equal(input_of(0, n)));

    // all_gather of a 2-d tensor keeps shape and rank order
    const auto gathered = c.all_gather(input_of(me, n).view({world, 6}));
    ASSERT_EQ(gathered.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) EXPECT_TRUE(gathered[r].equal(input_of(r, n).view({world, 6})));

    // all_to_all with uneven splits: rank me sends (d + me) % 3 rows of 2 columns to rank d
    std::vector<int64_t> in_splits, out_splits;
    for (int d = 0; d < world; ++d) in_splits.push_back((d + me) % 3);
    for (int s2 = 0; s2 < world; ++s2) out_splits.push_back((me + s2) % 3);
    int64_t in_rows = 0;
    for (auto v : in_splits) in_rows += v;
    at::Tensor send = (at::arange(in_rows * 2, at::kFloat) + 1000.0 * me).view({in_rows, 2});
    const at::Tensor got = c.all_to_all(send, in_splits, out_splits);
    int64_t offset = 0;
    for (int src = 0; src < world; ++src) {
      // src's rows for me start after its rows for ranks before me
      int64_t start = 0;
      for (int d = 0; d < me; ++d) start += (d + src) % 3;
      const int64_t rows = (me + src) % 3;
      const at::Tensor theirs = (at::arange(start * 2, (start + rows) * 2, at::kFloat) + 1000.0 * src).view({rows, 2});
      EXPECT_TRUE(got.narrow(0, offset, rows).equal(theirs))
          << "all_to_all block from rank " << src << " on rank " << me;
      offset += rows;
    }
    EXPECT_EQ(got.size(0), offset);

    // reduce_scatter: chunk `me` of the sum; and of the max
    at::Tensor rs = c.reduce_scatter(input_of(me, n).view({world, 6}), comm::ReduceOp::kSum);
    EXPECT_TRUE(rs.equal(expected_sum.view({world, 6})[me].unsqueeze(0))) << "reduce_scatter on rank " << me;
    at::Tensor rmax = c.reduce_scatter(input_of(me, n), comm::ReduceOp::kMax);
    EXPECT_TRUE(rmax.equal(input_of(world - 1, n).narrow(0, me * 6, 6)));

    // framework baseline where the backend has one: same result as our broadcast
    if (c.has_framework_broadcast_coalesced()) {
      std::vector<at::Tensor> tensors = {input_of(me, 5), input_of(me, 7).view({7, 1})};
      EXPECT_TRUE(c.framework_broadcast_coalesced(tensors, 16, 0));
      EXPECT_TRUE(tensors[0].equal(input_of(0, 5)));
      EXPECT_TRUE(tensors[1].equal(input_of(0, 7).view({7, 1})));
    }
    c.barrier();
  });
}

TEST(GlooCollectives, EveryCollectiveGivesTheKnownResultAtWorldSizes1To4) {
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE(world);
    check_every_collective(comm::Backend::kGloo, world);
  }
}

TEST(NcclCollectives, EveryCollectiveGivesTheKnownResultOnEachGpuCount) {
  int ran = 0;
  for (int world = 1; world <= 4; ++world) {
    if (comm::nccl_unavailable_reason(world)) break;
    SCOPED_TRACE(world);
    check_every_collective(comm::Backend::kNccl, world);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "NCCL: " << *comm::nccl_unavailable_reason(1);
}

// What one GPU allows (world size 1): a host tensor staged through the communicator's device
// buffer at sizes that make it grow and then reuse it, each result exact and timed on the device.
TEST(NcclCollectives, EveryStagingSizeRoundTripsExactly) {
  if (const auto why = comm::nccl_unavailable_reason(1)) GTEST_SKIP() << "NCCL: " << *why;
  on_ranks(comm::Backend::kNccl, 1, [](comm::Communicator& c) {
    EXPECT_FALSE(c.last_device_seconds().has_value());  // until a collective has run on the device
    for (const int64_t n : {int64_t{1}, int64_t{1} << 20, int64_t{1} << 24, int64_t{3}, int64_t{1} << 22}) {
      SCOPED_TRACE(n);
      at::Tensor t = at::arange(n, at::kFloat).remainder(9973.0);
      const at::Tensor expected = t.clone();
      c.all_reduce(t, comm::ReduceOp::kSum);  // one rank: the sum is the input, bit for bit
      EXPECT_TRUE(t.equal(expected));
      EXPECT_TRUE(c.last_device_seconds().has_value());
      at::Tensor b = at::arange(n, at::kDouble);
      c.broadcast(b, 0);
      EXPECT_TRUE(b.equal(at::arange(n, at::kDouble)));
    }
  });
}

// A call NCCL would misread is refused before it reaches NCCL, as invalid input that says what
// was wrong, and the communicator stays usable.
TEST(NcclCollectives, ErrorPathsRefuseBadCallsAndLeaveTheCommunicatorUsable) {
  if (const auto why = comm::nccl_unavailable_reason(1)) GTEST_SKIP() << "NCCL: " << *why;
  on_ranks(comm::Backend::kNccl, 1, [](comm::Communicator& c) {
    auto refused = [&c](const std::function<void()>& call, const std::string& words) {
      try {
        call();
        ADD_FAILURE() << "not refused: " << words;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
      at::Tensor t = input_of(0, 4);
      c.broadcast(t, 0);
      EXPECT_TRUE(t.equal(input_of(0, 4))) << "after: " << words;
    };
    refused(
        [&c] {
          at::Tensor t = input_of(0, 4);
          c.broadcast(t, 1);
        },
        "broadcast from rank 1 in a world of 1");
    refused([&c] { c.all_to_all(input_of(0, 4), {-1}, {4}); }, "is negative");
    refused([&c] { c.all_to_all(input_of(0, 4), {3}, {3}); }, "do not add up to the 4 rows");
    refused([&c] { c.all_to_all(at::scalar_tensor(1.0), {1}, {1}); }, "needs a tensor with rows");
  });
}

TEST(NcclCollectives, WithoutAGpuTheReasonSaysWhyNotThatItFailed) {
  const auto reason = comm::nccl_unavailable_reason(1);
  if (!reason) GTEST_SKIP() << "this machine has a GPU for NCCL";
  // Either not built, or no GPU/driver: the reason names which, in words a user can act on.
  const bool explains = reason->find("without NCCL") != std::string::npos || reason->find("GPU") != std::string::npos;
  EXPECT_TRUE(explains) << *reason;
  EXPECT_TRUE(comm::backend_unavailable_reason(comm::Backend::kNccl, 2).has_value());
  EXPECT_FALSE(comm::backend_unavailable_reason(comm::Backend::kGloo, 4).has_value());
  // A backend is a name only where a task carries it: one no build knows is refused by name.
  EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "unknown backend 'mpi' (expected one of: gloo, nccl)",
                                   [] { nlohmann::json("mpi").get<comm::Backend>(); }));
}

}  // namespace
}  // namespace dmpcheck

// DDP's gradient buckets as TorchRec's DDP (static_graph=True) lays them out, measured with a comm
// hook on torchrec 0.6.0 and 1.9.2 (a 40-4-2-1 MLP: steps 1 and 2 one bucket in registration
// order, then backward order).  The byte sizes below are that MLP's.
TEST(DdpBuckets, TwoStepsInRegistrationOrderThenRebuiltInBackwardOrder) {
  using dmpcheck::dmp::DenseDataParallel;
  const std::vector<int64_t> bytes = {640, 16, 32, 8, 8, 4};  // w0 b0 w1 b1 w2 b2
  using Buckets = std::vector<std::vector<size_t>>;
  EXPECT_EQ(DenseDataParallel::buckets(bytes, 1, 1 << 20, 25 << 20), (Buckets{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(DenseDataParallel::buckets(bytes, 2, 1 << 20, 25 << 20), (Buckets{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(DenseDataParallel::buckets(bytes, 3, 1 << 20, 25 << 20), (Buckets{{5, 4, 3, 2, 1, 0}}));
  // A bucket closes once it holds at least its cap (the first cap, then the others').
  EXPECT_EQ(DenseDataParallel::buckets(bytes, 3, 12, 40), (Buckets{{5, 4}, {3, 2}, {1, 0}}));
  EXPECT_EQ(DenseDataParallel::buckets(bytes, 3, 4, 1000), (Buckets{{5}, {4, 3, 2, 1, 0}}));
  EXPECT_TRUE(DenseDataParallel::buckets({}, 3, 4, 4).empty());
}
