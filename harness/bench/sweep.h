// `dmpcheck bench`: collective sweeps in the manner of nccl-tests, and a scenario's init
// broadcast as a benchmark.
//
// Sweep: for each backend x world size, ranks are launched as for a run; for each collective
// and each size from min_bytes to max_bytes (times `factor`), every rank fills its input from a
// seed, runs the collective once and counts elements that differ from the known result
// (#wrong, summed over ranks so every rank agrees), then runs `warmup` untimed and `iterations`
// timed collectives, each after a barrier; an iteration's time is the maximum over ranks.
// time = mean; algbw = S / time and busbw = algbw * factor with nccl-tests' S and factors
// (GB = 1e9): broadcast S = bytes, factor 1; all_reduce S = bytes, 2(n-1)/n; all_gather,
// reduce_scatter and all_to_all S = the whole buffer (n chunks), (n-1)/n.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/broadcast_probe.h"
#include "common/json.h"
#include "run/handover.h"

namespace dmpcheck::comm {
class Communicator;
class Store;
struct RankEnvironment;
}  // namespace dmpcheck::comm
namespace dmpcheck::scenario {
struct Scenario;
struct RunSpec;
}  // namespace dmpcheck::scenario

namespace dmpcheck::bench {

using run::RankTask;

const std::vector<std::string>& bench_collectives();

struct BenchSpec {
  std::vector<std::string> collectives = {"broadcast"};
  int64_t min_bytes = 1024;
  int64_t max_bytes = 1 << 20;
  int64_t factor = 2;
  int warmup = 2;
  int iterations = 20;
  int root = 0;
  double timeout_s = 120.0;
  int threads_per_rank = 0;  // 0: cores / world size
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BenchSpec, collectives, min_bytes, max_bytes, factor, warmup, iterations, root,
                                   timeout_s, threads_per_rank)

// Latency statistics, written out in microseconds as the table prints them.
struct Microseconds : check::LatencyStats {};
void to_json(nlohmann::json& j, const Microseconds& s);
void from_json(const nlohmann::json& j, Microseconds& s);

struct BenchRow {
  std::string collective;
  int64_t size_bytes = 0;  // S of nccl-tests: the whole buffer
  int64_t count = 0;       // elements of that buffer
  std::string type = "float";
  std::string redop;     // "sum" for reductions, "none" otherwise
  int root = -1;         // broadcast only
  int64_t wrong = 0;     // elements that differed from the seeded expectation, over all ranks
  Microseconds time_us;  // end to end (staging included on NCCL), max over ranks
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
  std::optional<Microseconds> device_time_us;  // NCCL: CUDA-event time of the collective alone
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BenchRow, collective, size_bytes, count, type, redop, root, wrong, algbw_gbps,
                                   busbw_gbps, time_us, device_time_us)

struct BenchGroup {
  std::string backend;
  int world_size = 0;
  int threads_per_rank = 0;
  bool skipped = false;
  std::string skip_reason;
  std::string error;  // a rank failed: what it said
  std::vector<BenchRow> rows;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BenchGroup, backend, world_size, threads_per_rank, skipped, skip_reason, error, rows)

// "1K" -> 1024, "64M" -> 67108864, "2G", or plain bytes; nccl-tests' suffixes (powers of 1024).
int64_t parse_size(const std::string& text);

// nccl-tests' busbw factor for `collective` at `world` ranks.
double bus_factor(const std::string& collective, int world);

// The sweep on one rank (collective).  Rank 0's rows are complete; `line`, when set, gets each
// formatted table row as it is measured.
std::vector<BenchRow> bench_on_rank(comm::Communicator& comm, const BenchSpec& spec,
                                    const std::function<void(const std::string&)>& line);

struct BenchCommandOptions {
  std::string worker_executable;
  std::vector<comm::Backend> backends = {comm::Backend::kGloo};
  std::vector<int> world_sizes = {2};
  BenchSpec spec;
  std::string json_path;  // written when not empty
  std::ostream* out = nullptr;
};

// Runs the sweep over backends x world sizes, printing the table as rows arrive; returns the
// exit status (0; 1 when any #wrong is non-zero; 3 when a group's ranks failed).
int run_bench(const BenchCommandOptions& options);

struct ScenarioBenchOptions {
  std::string worker_executable;
  std::string scenario_path;
  std::string run_filter;               // substring of a run's name; empty: every run
  std::vector<comm::Backend> backends;  // each run on each of these, side by side; empty: the run's own
  check::ProbeOptions probe;
  std::string json_path;
  std::ostream* out = nullptr;
};

int run_scenario_bench(const ScenarioBenchOptions& options);

// A rank of either benchmark, started by run_bench or run_scenario_bench (the store says which
// and with what); rank 0 leaves its result in the store under "result".
// `task`: what the launcher handed over (run/handover.h); `store`: the run's view of the store.
void bench_worker(comm::Store& store, const comm::RankEnvironment& env, const std::string& secret,
                  const RankTask& task);

}  // namespace dmpcheck::bench
