// The measuring pieces: latency statistics, nccl-tests' size syntax and bus factors, the
// sweep's correctness check (it must catch a wrong element), and the broadcast probe.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "bench/sweep.h"
#include "check/broadcast_probe.h"
#include "comm/communicator.h"
#include "common/error.h"
#include "test_util.h"
#include "unit/loopback_communicator.h"

namespace dmpcheck {
namespace {

TEST(LatencyStats, NearestRankPercentilesMeanAndExtremes) {
  std::vector<double> samples;
  for (int i = 100; i >= 1; --i) samples.push_back(i);  // unsorted on purpose
  const auto s = check::latency_stats(samples);
  EXPECT_EQ(s.min_s, 1);
  EXPECT_EQ(s.max_s, 100);
  EXPECT_EQ(s.p50_s, 50);
  EXPECT_EQ(s.p99_s, 99);
  EXPECT_DOUBLE_EQ(s.mean_s, 50.5);
  const auto one = check::latency_stats({7.0});
  EXPECT_EQ(one.p50_s, 7.0);
  EXPECT_EQ(one.p99_s, 7.0);
  EXPECT_EQ(check::latency_stats({}).max_s, 0.0);
}

TEST(BenchSizes, NcclTestsSuffixesArePowersOf1024) {
  EXPECT_EQ(bench::parse_size("1024"), 1024);
  EXPECT_EQ(bench::parse_size("1K"), 1024);
  EXPECT_EQ(bench::parse_size("64M"), 64ll << 20);
  EXPECT_EQ(bench::parse_size("2G"), 2ll << 30);
  EXPECT_TRUE(testing::throws_with("unknown suffix 'Q'", [] { bench::parse_size("12Q"); }));
  EXPECT_THROW(bench::parse_size("abc"), Error);
  EXPECT_THROW(bench::parse_size("-1K"), Error);
}

TEST(BenchSizes, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bench::bus_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(bench::bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bench::bus_factor("all_gather", 4), 0.75);
  EXPECT_DOUBLE_EQ(bench::bus_factor("reduce_scatter", 2), 0.5);
  EXPECT_DOUBLE_EQ(bench::bus_factor("all_to_all", 2), 0.5);
}

// A world of one that gets one element of every result wrong.
class OffByOne final : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend_name() const override { return "off-by-one"; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  void broadcast(at::Tensor& t, int) override { spoil(t); }
  void all_reduce(at::Tensor& t, comm::ReduceOp) override { spoil(t); }
  std::vector<at::Tensor> all_gather(const at::Tensor& input) override { return {spoil(input.clone())}; }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    return spoil(input.clone());
  }
  at::Tensor reduce_scatter(const at::Tensor& input, comm::ReduceOp) override { return spoil(input.clone()); }
  void barrier() override {}

 private:
  // `t` (a handle on the caller's tensor) with its fourth element one more.
  static at::Tensor spoil(at::Tensor t) {
    if (t.numel() > 3) t.view({-1})[3] += 1;
    return t;
  }
};

TEST(BenchSweep, CountsEveryWrongElementAndNothingWhenRight) {
  bench::BenchSpec spec;
  spec.collectives = bench::bench_collectives();
  spec.min_bytes = 64;
  spec.max_bytes = 4096;
  spec.factor = 4;
  spec.warmup = 0;
  spec.iterations = 2;
  OffByOne wrong;
  const auto bad = bench::bench_on_rank(wrong, spec, nullptr);
  ASSERT_EQ(bad.size(), 5u * 4u);  // five collectives at 64, 256, 1024 and 4096 bytes
  for (const auto& row : bad) EXPECT_EQ(row.wrong, 1) << row.collective << " " << row.size_bytes;

  auto right = comm::make_loopback_communicator();
  std::vector<std::string> lines;
  const auto good = bench::bench_on_rank(*right, spec, [&](const std::string& l) { lines.push_back(l); });
  for (const auto& row : good) {
    EXPECT_EQ(row.wrong, 0) << row.collective << " " << row.size_bytes;
    EXPECT_EQ(row.size_bytes, row.count * 4);
    EXPECT_GT(row.time_us.mean_s, 0.0);
    EXPECT_LE(row.time_us.min_s, row.time_us.p50_s);
    EXPECT_LE(row.time_us.p50_s, row.time_us.max_s);
    EXPECT_NEAR(row.algbw_gbps, static_cast<double>(row.size_bytes) / row.time_us.mean_s / 1e9, 1e-9);
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(testing::contains(lines[0], "#wrong"));
}

TEST(BroadcastProbe, TimesEveryMethodOnCopiesAndLeavesTheTensorsAlone) {
  auto loopback = comm::make_loopback_communicator();
  std::vector<at::Tensor> tensors = {at::rand({16, 4}), at::rand({3}), at::rand({8, 8})};
  const std::vector<at::Tensor> before = {tensors[0].clone(), tensors[1].clone(), tensors[2].clone()};
  check::ProbeOptions options;
  options.warmup = 1;
  options.iterations = 4;
  options.bucket_caps = {64, 1 << 20};
  const auto probe = check::probe_broadcast(*loopback, tensors, options);
  EXPECT_TRUE(probe.performed);
  EXPECT_EQ(probe.bytes, (64 + 3 + 64) * 4);
  EXPECT_EQ(probe.tensors, 3);
  std::vector<std::string> methods;
  for (const auto& m : probe.methods) methods.push_back(m.method + "/" + std::to_string(m.bucket_cap_bytes));
  EXPECT_EQ(methods, (std::vector<std::string>{"per_tensor/0", "coalesced/64", "coalesced/1048576", "raw/0"}));
  EXPECT_EQ(probe.methods[0].collectives, 3);  // one per tensor
  EXPECT_EQ(probe.methods[1].collectives, 3);  // every tensor is over 64 bytes: a bucket each
  EXPECT_EQ(probe.methods[2].collectives, 1);
  EXPECT_TRUE(testing::contains(probe.note, "no framework baseline on loopback"));
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(tensors[i].equal(before[i]));
  const std::string table = check::render_probe(probe);
  EXPECT_TRUE(testing::contains(table, "ratio coalesced 1 MiB"));
}

}  // namespace
}  // namespace dmpcheck
