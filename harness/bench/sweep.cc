#include "bench/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "common/error.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/worker.h"
#include "scenario/scenario.h"

namespace dmpcheck::bench {

using namespace run;  // the launcher, the worker and the in-rank run this sits on

const std::vector<std::string>& bench_collectives() {
  static const std::vector<std::string> names = {"broadcast", "all_reduce", "all_gather", "reduce_scatter",
                                                 "all_to_all"};
  return names;
}

namespace {

// The seeded input of `rank`: element i is ((13 i + 7 (rank + 1)) mod 31) - 15, small integers
// so that sums over up to 64 ranks are exact in float and a wrong element cannot hide in
// rounding.  Built by tiling one period, so a 1 GiB input costs 1 GiB.
at::Tensor seeded(int rank, int64_t count) {
  const at::Tensor period = ((at::arange(31, at::kLong) * 13 + (rank + 1) * 7) % 31 - 15).to(at::kFloat);
  return period.repeat({(count + 30) / 31}).narrow(0, 0, count).contiguous();
}

int64_t mismatches(const at::Tensor& got, const at::Tensor& expected) {
  if (!got.sizes().equals(expected.sizes())) return std::max(got.numel(), expected.numel());
  return got.ne(expected).sum().item<int64_t>();
}

bool chunked(const std::string& collective) {
  return collective == "all_gather" || collective == "reduce_scatter" || collective == "all_to_all";
}

// One size of one collective: the buffers, a run of the collective, and its check.
class Case {
 public:
  Case(comm::Communicator& comm, std::string collective, int64_t count, int root)
      : comm_(comm),
        collective_(std::move(collective)),
        count_(count),
        root_(root),
        world_(comm.world_size()),
        chunk_(count / world_),
        input_(seeded(comm.rank(), collective_ == "all_gather" ? chunk_ : count)) {}

  void run() {
    if (collective_ == "broadcast") {
      comm_.broadcast(input_, root_);
      output_ = input_;
    } else if (collective_ == "all_reduce") {
      comm_.all_reduce(input_, comm::ReduceOp::kSum);
      output_ = input_;
    } else if (collective_ == "all_gather") {
      output_ = at::cat(comm_.all_gather(input_));
    } else if (collective_ == "reduce_scatter") {
      output_ = comm_.reduce_scatter(input_, comm::ReduceOp::kSum);
    } else if (collective_ == "all_to_all") {
      const std::vector<int64_t> splits(static_cast<size_t>(world_), chunk_);
      output_ = comm_.all_to_all(input_, splits, splits);
    } else {
      throw_error(ErrorKind::kInvalidInput, fmt::format("unknown collective '{}'", collective_));
    }
  }

  // Elements of this rank's output that differ from what the seeded inputs must give.
  int64_t wrong() const {
    if (collective_ == "broadcast") return mismatches(output_, seeded(root_, count_));
    // Each rank's part of the output, in rank order: its whole input, or (reduce_scatter, all_to_all)
    // its chunk `rank()`; all_reduce and reduce_scatter sum the parts, all_gather and all_to_all join them.
    const bool own_chunk = collective_ == "reduce_scatter" || collective_ == "all_to_all";
    const bool summed = collective_ == "all_reduce" || collective_ == "reduce_scatter";
    at::Tensor expected = summed ? at::zeros({own_chunk ? chunk_ : count_}, at::kFloat) : at::Tensor();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world_; ++r) {
      const at::Tensor input = seeded(r, collective_ == "all_gather" ? chunk_ : count_);
      const at::Tensor part = own_chunk ? input.narrow(0, comm_.rank() * chunk_, chunk_) : input;
      if (summed) expected += part;
      else parts.push_back(part);
    }
    return mismatches(output_, summed ? expected : at::cat(parts));
  }

 private:
  comm::Communicator& comm_;
  std::string collective_;
  int64_t count_;
  int root_;
  int world_;
  int64_t chunk_;
  at::Tensor input_;
  at::Tensor output_;
};

std::string us(double seconds) { return fmt::format("{:.1f}", seconds * 1e6); }

}  // namespace

void to_json(nlohmann::json& j, const Microseconds& s) {
  j = nlohmann::json{{"mean", s.mean_s * 1e6},
                     {"min", s.min_s * 1e6},
                     {"p50", s.p50_s * 1e6},
                     {"p99", s.p99_s * 1e6},
                     {"max", s.max_s * 1e6}};
}

void from_json(const nlohmann::json& j, Microseconds& s) {
  s = Microseconds{{j.at("min").get<double>() / 1e6, j.at("p50").get<double>() / 1e6, j.at("p99").get<double>() / 1e6,
                    j.at("max").get<double>() / 1e6, j.at("mean").get<double>() / 1e6}};
}

int64_t parse_size(const std::string& text) {
  DMP_CHECK(!text.empty(), ErrorKind::kInvalidInput, "empty size (expected bytes such as 1024, 1K, 64M or 1G)");
  size_t used = 0;
  long double value = 0;
  try {
    value = std::stold(text, &used);
  } catch (const std::exception&) {
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("size '{}' is not a number (expected e.g. 1024, 1K, 64M, 1G)", text));
  }
  const std::string suffix = text.substr(used);
  long double unit = 1;
  if (suffix == "K" || suffix == "k") unit = 1024.0L;
  else if (suffix == "M" || suffix == "m") unit = 1024.0L * 1024;
  else if (suffix == "G" || suffix == "g") unit = 1024.0L * 1024 * 1024;
  else
    DMP_CHECK(suffix.empty(), ErrorKind::kInvalidInput, "size '{}' has an unknown suffix '{}' (expected K, M or G)",
              text, suffix);
  DMP_CHECK(value > 0, ErrorKind::kInvalidInput, "size '{}' must be positive", text);
  return static_cast<int64_t>(value * unit);
}

double bus_factor(const std::string& collective, int world) {
  const double n = world;
  if (collective == "all_reduce") return 2.0 * (n - 1) / n;
  if (chunked(collective)) return (n - 1) / n;
  return 1.0;
}

static std::string bench_table_header(bool device_column) {
  std::string out = fmt::format(
      "#{:>15} {:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10}", "collective",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "min", "p50", "p99", "max");
  if (device_column) out += fmt::format(" {:>10}", "dev_time");
  out += "\n";
  out += fmt::format("#{:>15} {:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10}", "",
                     "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(us)");
  if (device_column) out += fmt::format(" {:>10}", "(us)");
  return out;
}

static std::string bench_table_row(const BenchRow& r, bool device_column) {
  std::string out = fmt::format(
      " {:>15} {:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8.3f} {:>8.3f} {:>7} {:>10} {:>10} {:>10} {:>10}",
      r.collective, r.size_bytes, r.count, r.type, r.redop, r.root, us(r.time_us.mean_s), r.algbw_gbps, r.busbw_gbps,
      r.wrong, us(r.time_us.min_s), us(r.time_us.p50_s), us(r.time_us.p99_s), us(r.time_us.max_s));
  if (device_column) out += fmt::format(" {:>10}", r.device_time_us ? us(r.device_time_us->mean_s) : std::string("-"));
  return out;
}

std::vector<BenchRow> bench_on_rank(comm::Communicator& comm, const BenchSpec& spec,
                                    const std::function<void(const std::string&)>& line) {
  at::NoGradGuard no_grad;
  const int world = comm.world_size();
  const bool device_column = comm.backend_name() == "nccl";
  if (line) line(bench_table_header(device_column));
  std::vector<BenchRow> rows;
  for (const auto& collective : spec.collectives) {
    for (int64_t size = spec.min_bytes; size <= spec.max_bytes; size *= spec.factor) {
      BenchRow row;
      row.collective = collective;
      int64_t count = size / static_cast<int64_t>(sizeof(float));
      if (chunked(collective)) count = count / world * world;  // whole chunks, as nccl-tests rounds down
      if (count == 0) {
        if (spec.factor <= 1) break;
        continue;
      }
      row.count = count;
      row.size_bytes = count * static_cast<int64_t>(sizeof(float));
      row.redop = collective == "all_reduce" || collective == "reduce_scatter" ? "sum" : "none";
      row.root = collective == "broadcast" ? spec.root : -1;
      Case c(comm, collective, count, spec.root);

      // Correctness first, on freshly seeded inputs.
      c.run();
      at::Tensor wrong = at::tensor({c.wrong()}, at::kLong);
      comm.all_reduce(wrong, comm::ReduceOp::kSum);
      row.wrong = wrong.item<int64_t>();

      const auto [host, device] = check::time_iterations(
          comm, spec.warmup, spec.iterations, [&] { c.run(); }, [&] { return comm.last_device_seconds(); });
      row.time_us = Microseconds{host};
      if (device) row.device_time_us = Microseconds{*device};
      row.algbw_gbps = row.time_us.mean_s > 0 ? static_cast<double>(row.size_bytes) / row.time_us.mean_s / 1e9 : 0.0;
      row.busbw_gbps = row.algbw_gbps * bus_factor(collective, world);
      if (line) line(bench_table_row(row, device_column));
      rows.push_back(row);
      if (spec.factor <= 1) break;
    }
  }
  return rows;
}

namespace {

// Launches `world` ranks of `dmpcheck worker` with `entries` in the store; rank 0's lines that
// start with `echo_prefix` are passed to `out` as they arrive (the prefix removed).
LaunchOutcome launch_bench(const std::string& executable, int world, int threads, RankTask task, double budget_s,
                           std::ostream* out) {
  LaunchRequest request;
  request.executable = executable;
  request.arguments = {"worker"};
  request.in_process = [] {
    WorkerOptions worker;
    worker.bench = bench_worker;
    return worker_main(worker);
  };
  request.world_size = world;
  request.threads_per_rank = threads;
  request.task = std::move(task);
  request.budget = std::chrono::milliseconds(static_cast<int64_t>(budget_s * 1000.0));
  static std::mutex out_mutex;
  if (out) {
    request.on_line = [out](int rank, const std::string& text) {
      std::lock_guard<std::mutex> lock(out_mutex);
      if (rank == 0 && text.rfind("bench| ", 0) == 0) {
        *out << text.substr(7) << "\n" << std::flush;
      } else if (text.find("error") != std::string::npos) {
        *out << "[rank " << rank << "] " << text << "\n" << std::flush;
      }
    };
  }
  return launch(request);
}

std::string failure_text(const LaunchOutcome& launched) {
  if (!launched.failure) return "the ranks ended without a result";
  return fmt::format("rank {} {}: {}", launched.failure->rank, launched.failure->cause, launched.failure->message);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  report::write_text_file_atomically(path, j.dump(2) + "\n");
}

nlohmann::json environment_json() { return nlohmann::json{{"cores", available_cores()}}; }

}  // namespace

int run_bench(const BenchCommandOptions& options) {
  const BenchSpec& spec = options.spec;
  DMP_CHECK(spec.min_bytes > 0 && spec.max_bytes >= spec.min_bytes, ErrorKind::kInvalidInput,
            "sizes: -b {} must be positive and at most -e {}", spec.min_bytes, spec.max_bytes);
  DMP_CHECK(spec.factor >= 2 || spec.min_bytes == spec.max_bytes, ErrorKind::kInvalidInput,
            "-f {} must be at least 2 (or -b equal to -e)", spec.factor);
  DMP_CHECK(spec.iterations >= 1 && spec.warmup >= 0, ErrorKind::kInvalidInput,
            "-n must be at least 1 and -w at least 0");
  for (const auto& c : spec.collectives) {
    DMP_CHECK(std::find(bench_collectives().begin(), bench_collectives().end(), c) != bench_collectives().end(),
              ErrorKind::kInvalidInput, "unknown collective '{}' (expected one of: {}, or all)", c,
              fmt::join(bench_collectives(), ", "));
  }
  std::vector<BenchGroup> groups;
  int code = 0;
  for (const auto& backend : options.backends) {
    for (int world : options.world_sizes) {
      DMP_CHECK(world >= 1 && world <= 64, ErrorKind::kInvalidInput, "world size {} is out of range 1..64", world);
      const int threads = spec.threads_per_rank > 0 ? spec.threads_per_rank : std::max(1, available_cores() / world);
      BenchGroup group{comm::backend_name(backend), world, threads, false, {}, {}, {}};
      if (options.out) {
        *options.out << fmt::format(
                            "# dmpcheck bench: {} on {} rank(s), {} thread(s)/rank, -w {} -n {}, sizes {}..{} x{}\n",
                            group.backend, world, group.threads_per_rank, spec.warmup, spec.iterations, spec.min_bytes,
                            spec.max_bytes, spec.factor)
                     << std::flush;
      }
      if (auto reason = comm::backend_unavailable_reason(backend, world)) {
        group.skipped = true;
        group.skip_reason = *reason;
        if (options.out) *options.out << "# skipped: " << *reason << "\n" << std::flush;
        groups.push_back(group);
        continue;
      }
      BenchSpec rank_spec = spec;
      rank_spec.threads_per_rank = group.threads_per_rank;
      RankTask task;
      task.bench_kind = BenchKind::kSweep;
      task.bench_backend = backend;
      task.bench_options = rank_spec;
      const LaunchOutcome launched = launch_bench(options.worker_executable, world, group.threads_per_rank,
                                                  std::move(task), std::max(600.0, 20.0 * spec.timeout_s), options.out);
      if (launched.ok && launched.result) {
        group.rows = nlohmann::json::parse(*launched.result).get<std::vector<BenchRow>>();
        for (const auto& r : group.rows) code = std::max(code, r.wrong != 0 ? 1 : 0);
      } else {
        group.error = failure_text(launched);
        if (options.out) *options.out << "# error: " << group.error << "\n" << std::flush;
        code = 3;
      }
      groups.push_back(group);
      if (interrupt_requested()) break;
    }
  }
  int64_t wrong = 0;
  for (const auto& g : groups) {
    for (const auto& r : g.rows) wrong += r.wrong;
  }
  if (options.out) {
    *options.out << fmt::format("# #wrong over every row: {} ({})\n", wrong, wrong == 0 ? "OK" : "FAILED");
    *options.out << "# time: mean over timed iterations of each iteration's slowest rank; algbw = size / time; "
                    "busbw = algbw x nccl-tests' factor; GB = 1e9 bytes\n";
  }
  write_json(options.json_path, nlohmann::json{{"tool", "dmpcheck bench"},
                                               {"spec", spec},
                                               {"environment", environment_json()},
                                               {"units",
                                                {{"size_bytes", "bytes"},
                                                 {"time_us", "microseconds"},
                                                 {"algbw_gbps", "1e9 bytes/s"},
                                                 {"busbw_gbps", "1e9 bytes/s"}}},
                                               {"groups", groups}});
  if (options.out && !options.json_path.empty()) *options.out << "# JSON: " << options.json_path << "\n";
  return interrupt_requested() ? 130 : code;
}

void bench_worker(comm::Store& store, const comm::RankEnvironment& env, const std::string& secret,
                  const RankTask& task) {
  // Rank 0's lines go to the launcher marked, so that it can print them as the table.
  auto line = [&](const std::string& text) {
    if (env.rank != 0) return;
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) std::printf("bench| %s\n", l.c_str());
    std::fflush(stdout);
  };
  comm::Store group_store = store.with_prefix("bench");
  if (task.bench_kind == BenchKind::kSweep) {
    const BenchSpec spec = task.bench_options.get<BenchSpec>();
    at::set_num_threads(std::max(1, spec.threads_per_rank));
    DMP_INTERNAL_ASSERT(task.bench_backend.has_value(), "a sweep task names no backend");
    auto comm = comm::make_communicator(*task.bench_backend, group_store, env, spec.timeout_s);
    const std::vector<BenchRow> rows = bench_on_rank(*comm, spec, line);
    if (env.rank == 0) set_signed(store, run::kResultKey, nlohmann::json(rows).dump(), secret);
    return;
  }
  DMP_INTERNAL_ASSERT(task.bench_kind == BenchKind::kScenario, "a benchmark task of no kind");
  const scenario::Scenario scenario =
      scenario::load_scenario_text(task.scenario_text, task.scenario_file, task.overrides);
  const scenario::RunSpec& spec = scenario.runs.at(static_cast<size_t>(task.run_index));
  check::ProbeOptions probe;
  task.bench_options.at("warmup").get_to(probe.warmup);
  task.bench_options.at("iterations").get_to(probe.iterations);
  task.bench_options.at("bucket_caps").get_to(probe.bucket_caps);
  auto comm = comm::make_communicator(task.bench_backend.value_or(spec.backend), group_store, env, spec.timeout_s);
  RankRunOptions run_options;
  run_options.progress = line;
  const check::BroadcastProbe result = probe_scenario_on_rank(scenario, spec, *comm, probe, run_options);
  if (env.rank == 0) set_signed(store, run::kResultKey, nlohmann::json(result).dump(), secret);
}

int run_scenario_bench(const ScenarioBenchOptions& options) {
  const scenario::Scenario scenario = scenario::load_scenario_file(options.scenario_path);
  nlohmann::json results = nlohmann::json::array();
  int code = 0;
  bool any = false;
  for (size_t i = 0; i < scenario.runs.size() && !interrupt_requested(); ++i) {
    const scenario::RunSpec& spec = scenario.runs[i];
    if (!options.run_filter.empty() && spec.name.find(options.run_filter) == std::string::npos) continue;
    if (spec.on_torchrec()) continue;  // the probe times the reference's broadcast; a release cell has none of ours
    any = true;
    const std::vector<comm::Backend> backends =
        options.backends.empty() ? std::vector<comm::Backend>{spec.backend} : options.backends;
    for (const auto& backend : backends) {
      if (options.out) {
        *options.out << fmt::format("== {} [{}]: broadcast of its replicated parameters, {} on {} ranks\n",
                                    scenario.name, spec.name, comm::backend_name(backend), spec.world_size)
                     << std::flush;
      }
      const int local_world_size = spec.ranks_per_host();
      if (auto reason = comm::backend_unavailable_reason(backend, local_world_size)) {
        if (options.out) *options.out << "   skipped: " << *reason << "\n";
        results.push_back({{"run", spec.name}, {"backend", backend}, {"skipped", true}, {"skip_reason", *reason}});
        continue;
      }
      RankTask task;
      task.scenario_text = scenario.source_text;
      task.scenario_file = scenario.file;
      task.run_index = static_cast<int64_t>(i);
      task.overrides = scenario.overrides;
      task.bench_kind = BenchKind::kScenario;
      task.bench_backend = backend;
      task.bench_options = {{"warmup", options.probe.warmup},
                            {"iterations", options.probe.iterations},
                            {"bucket_caps", options.probe.bucket_caps}};
      const LaunchOutcome launched =
          launch_bench(options.worker_executable, spec.world_size, threads_per_rank(spec, available_cores()),
                       std::move(task), std::max(600.0, 10.0 * spec.timeout_s), options.out);
      if (launched.ok && launched.result) {
        const auto probe = nlohmann::json::parse(*launched.result).get<check::BroadcastProbe>();
        if (options.out) *options.out << check::render_probe(probe) << std::flush;
        results.push_back({{"run", spec.name}, {"backend", backend}, {"skipped", false}, {"probe", probe}});
      } else {
        const std::string error = failure_text(launched);
        if (options.out) *options.out << "   error: " << error << "\n";
        results.push_back({{"run", spec.name}, {"backend", backend}, {"error", error}});
        code = 3;
      }
    }
  }
  DMP_CHECK(any, ErrorKind::kInvalidInput, "no run of {} matches --run '{}' (runs: {})", scenario.file,
            options.run_filter, [&] {
              std::vector<std::string> names;
              for (const auto& r : scenario.runs) names.push_back(r.name);
              return fmt::format("{}", fmt::join(names, "; "));
            }());
  write_json(options.json_path, nlohmann::json{{"tool", "dmpcheck bench --scenario"},
                                               {"scenario", scenario.name},
                                               {"scenario_file", scenario.file},
                                               {"environment", environment_json()},
                                               {"runs", results}});
  if (options.out && !options.json_path.empty()) *options.out << "# JSON: " << options.json_path << "\n";
  return interrupt_requested() ? 130 : code;
}

}  // namespace dmpcheck::bench
