#include "run/rank_run.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include "check/broadcast_probe.h"
#include "check/expectations.h"
#include "check/global_model.h"
#include "check/replica_check.h"
#include "comm/broadcast_bytes.h"
#include "comm/communicator.h"
#include "common/digest.h"
#include "common/error.h"
#include "common/revision.h"
#include "dmp/checkpoint.h"
#include "dmp/model_parallel.h"
#include "run/data_generator.h"
#include "run/tensor_exchange.h"

namespace dmpcheck::run {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string hostname() {
  char buffer[256] = {0};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown";
  return buffer;
}

// The plan handed to the run (a release's own placement), checked against the model: every table
// once, in model order, its shards inside the table and on ranks of the world.
dmp::ShardingPlan given_plan(const scenario::RunSpec& spec) {
  dmp::ShardingPlan plan = dmp::ShardingPlan::deserialize(spec.given_plan);
  DMP_CHECK(plan.tables.size() == spec.model.tables.size(), ErrorKind::kInvalidInput,
            "the given plan places {} tables, the model has {}", plan.tables.size(), spec.model.tables.size());
  for (size_t i = 0; i < plan.tables.size(); ++i) {
    const auto& config = spec.model.tables[i];
    const auto& t = plan.tables[i];
    DMP_CHECK(t.table == config.name, ErrorKind::kInvalidInput,
              "the given plan's table {} is '{}', the model's is '{}'", i, t.table, config.name);
    for (const auto& s : t.shards) {
      DMP_CHECK(s.rank >= 0 && s.rank < spec.world_size && s.row_offset >= 0 && s.col_offset >= 0 &&
                    s.row_offset + s.rows <= config.num_embeddings && s.col_offset + s.cols <= config.embedding_dim,
                ErrorKind::kInvalidInput,
                "the given plan's shard of '{}' (rank {}, rows {}+{}, columns {}+{}) is outside a "
                "{}x{} table on {} ranks",
                t.table, s.rank, s.row_offset, s.rows, s.col_offset, s.cols, config.num_embeddings,
                config.embedding_dim, spec.world_size);
    }
  }
  return plan;
}

std::vector<dmp::StateTensor> replicated(const std::vector<dmp::StateTensor>& state) {
  std::vector<dmp::StateTensor> out;
  for (const auto& s : state) {
    if (s.replicated) out.push_back(s);
  }
  return out;
}

// What DDP and the fix for #1739 broadcast at init: the replicated parameters (data-parallel
// tables and dense layers), not their optimizer state.
std::vector<at::Tensor> replicated_parameters(const dmp::DistributedModelParallel& model) {
  std::vector<at::Tensor> out;
  auto ends_with = [](const std::string& text, const std::string& end) {
    return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
  };
  for (const auto& s : model.state()) {
    if (s.replicated && (ends_with(s.name, ".weight") || ends_with(s.name, ".bias"))) out.push_back(s.tensor);
  }
  return out;
}

// The mid-run checkpoint of spec.resume: take the full state as a checkpoint holds it, build
// the model again under the resume constraints, load, and carry on.
std::unique_ptr<dmp::DistributedModelParallel> resume_under_new_plan(
    comm::Communicator& comm, const scenario::RunSpec& spec, dmp::DistributedModelParallel& old_model,
    dmp::PlannerInput planner, at::Generator& generator, const dmp::DmpOptions& options, int64_t steps) {
  for (const auto& [table, constraints] : spec.resume->constraints) planner.constraints[table] = constraints;
  const dmp::ShardingPlan new_plan = dmp::collective_plan(comm, planner, spec.profile);
  return dmp::reshard(comm, old_model, spec.model, new_plan, generator, options, steps);
}

// The scenario's faults for this rank at this step (0: after the build).  Faults that end the
// process do so the way a real failure would: a signal, an exit status, an exception, a hang.
void inject_faults(const scenario::RunSpec& spec, comm::Communicator& comm, int step,
                   dmp::DistributedModelParallel& model, const std::function<void(const std::string&)>& say) {
  const int rank = comm.rank();
  for (const auto& f : spec.faults) {
    if (f.rank != rank || f.step != step) continue;
    say(fmt::format("injecting fault '{}' at step {}", scenario::fault_kind_name(f.kind), step));
    std::fflush(stdout);
    switch (f.kind) {
      case scenario::FaultKind::kCrash: std::raise(SIGSEGV); break;
      case scenario::FaultKind::kAbort: std::abort();
      case scenario::FaultKind::kKill: std::raise(SIGKILL); break;
      case scenario::FaultKind::kExit: std::_Exit(f.exit_code);
      case scenario::FaultKind::kThrow:
        throw_error(ErrorKind::kInjected, fmt::format("injected fault: rank {} throws at step {}", rank, step));
      case scenario::FaultKind::kHang:
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      case scenario::FaultKind::kDesync: {  // one collective the other ranks do not issue
        at::Tensor extra = at::zeros({3}, at::kFloat);
        comm.all_reduce(extra, comm::ReduceOp::kSum);
        break;
      }
      case scenario::FaultKind::kCorrupt:
      case scenario::FaultKind::kNan: {
        at::NoGradGuard no_grad;
        bool applied = false;
        for (const auto& t : model.state()) {
          if (!(f.tensor.empty() ? t.replicated : t.name == f.tensor) || t.tensor.numel() == 0) continue;
          applied = true;
          at::Tensor flat = t.tensor.view({-1});
          if (f.kind == scenario::FaultKind::kNan) {
            flat[0] = std::numeric_limits<float>::quiet_NaN();
          } else {  // one ulp up on the first element
            flat[0] = std::nextafter(flat[0].item<float>(), std::numeric_limits<float>::infinity());
          }
          break;
        }
        DMP_CHECK(applied, ErrorKind::kInvalidScenario, "fault '{}' on rank {}: this rank holds no tensor {}",
                  scenario::fault_kind_name(f.kind), rank,
                  f.tensor.empty() ? std::string("that is replicated") : "'" + f.tensor + "'");
        break;
      }
    }
  }
}

// NaN or Inf in the loss or in any tensor this rank holds stops the run with the place it was
// first seen.
// Collective.  Every rank's forward outputs stacked in rank order (the global batch's rows):
// one all_gather of the outputs side by side.
std::map<std::string, at::Tensor> gather_outputs(comm::Communicator& comm,
                                                 const std::map<std::string, at::Tensor>& local) {
  std::vector<at::Tensor> columns;
  for (const auto& [name, t] : local) columns.push_back(t.reshape({t.size(0), -1}).to(at::kFloat));
  const std::vector<at::Tensor> gathered = comm.all_gather(at::cat(columns, 1).contiguous());
  const at::Tensor global = at::cat(gathered, 0);
  std::map<std::string, at::Tensor> out;
  int64_t column = 0;
  for (const auto& [name, t] : local) {
    const int64_t width = t.numel() / std::max<int64_t>(t.size(0), 1);
    out[name] = global.narrow(1, column, width).reshape({global.size(0), width}).clone();
    column += width;
  }
  return out;
}

void check_finite(dmp::DistributedModelParallel& model, double loss, int step) {
  DMP_CHECK(std::isfinite(loss), ErrorKind::kInvalidInput, "step {}: the loss is {}", step, loss);
  for (const auto& t : model.state()) {
    if (t.tensor.numel() == 0 || !at::is_floating_point(t.tensor)) continue;
    const at::Tensor bad = at::isfinite(t.tensor).logical_not();
    if (!bad.any().item<bool>()) continue;
    const int64_t first = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("step {}: {} ({}) holds {} at element {} (rows {}+, cols {}+ of the full tensor)", step,
                            t.name, t.sharding, t.tensor.reshape({-1})[first].item<float>(), first,
                            t.placement.row_offset, t.placement.col_offset));
  }
}

}  // namespace

std::string tensor_digest(const at::Tensor& tensor) {
  const at::Tensor t = tensor.contiguous();
  return fmt::format(
      "{:016x}", fnv1a64({static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size()}));
}

check::RunResult result_header(const scenario::Scenario& scenario, const scenario::RunSpec& spec) {
  check::RunResult result;
  result.scenario = scenario.name;
  result.scenario_file = scenario.file;
  result.run = spec.name;
  result.slug = spec.slug;
  result.cell = spec.cell;
  result.profile = spec.on_torchrec() ? std::string() : spec.profile.name;
  if (!spec.on_torchrec()) result.switches = dmp::behaviour_switch_values(spec.profile);
  result.system.name = spec.system;
  result.system.simulated = !spec.on_torchrec();
  result.init_mode = scenario::init_mode_name(spec.init.mode);
  result.environment.world_size = spec.world_size;
  result.environment.backend = spec.backend;
  result.expectation.description = spec.expect.describe();
  return result;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int threads_per_rank(const scenario::RunSpec& spec, int cores) {
  if (spec.threads_per_rank > 0) return spec.threads_per_rank;
  return std::max(1, cores / spec.world_size);
}

check::BroadcastProbe probe_scenario_on_rank(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                                             comm::Communicator& comm, const check::ProbeOptions& options,
                                             const RankRunOptions& run_options) {
  DMP_CHECK(comm.world_size() == spec.world_size, ErrorKind::kInvalidInput,
            "run '{}' of {} needs {} ranks but this group has {}", spec.name, scenario.name, spec.world_size,
            comm.world_size());
  const int cores = run_options.cores > 0 ? run_options.cores : available_cores();
  at::set_num_threads(threads_per_rank(spec, cores));
  const int local_world_size = spec.local_world_size > 0 ? spec.local_world_size : spec.world_size;
  const dmp::ShardingPlan plan =
      dmp::collective_plan(comm, scenario::planner_input(spec, local_world_size), spec.profile);
  const uint64_t seed = spec.init.seed + (spec.init.mode == scenario::InitMode::kUnseeded ? comm.rank() : 0);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  dmp::DmpOptions dmp_options{spec.profile, spec.sparse_optimizer, spec.dense_optimizer};
  dmp::DistributedModelParallel model(comm, spec.model, plan, generator, dmp_options);
  return check::probe_broadcast(comm, replicated_parameters(model), options, run_options.progress);
}

check::RunResult run_on_rank(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                             comm::Communicator& comm, const RankRunOptions& options) {
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  DMP_CHECK(comm.world_size() == spec.world_size, ErrorKind::kInvalidInput,
            "run '{}' needs {} ranks but this group has {} (WORLD_SIZE)", spec.name, spec.world_size,
            comm.world_size());
  const auto start = Clock::now();
  const int cores = options.cores > 0 ? options.cores : available_cores();
  const int threads = threads_per_rank(spec, cores);
  at::set_num_threads(threads);

  check::RunResult result = result_header(scenario, spec);
  result.environment = {TORCH_VERSION, comm.backend_name(), hostname(), git_revision(), spec.world_size, cores,
                        threads};

  // Plan.
  // The hosts the launcher really gives (LOCAL_WORLD_SIZE) plan the run; a scenario that names
  // its topology must agree with them.
  const int scenario_local = spec.local_world_size > 0 ? spec.local_world_size : spec.world_size;
  const int local_world_size = options.local_world_size > 0 ? options.local_world_size : scenario_local;
  DMP_CHECK(spec.local_world_size == 0 || local_world_size == spec.local_world_size, ErrorKind::kInvalidInput,
            "LOCAL_WORLD_SIZE is {} but the scenario's topology.local_world_size is {}", local_world_size,
            spec.local_world_size);
  const dmp::PlannerInput planner = scenario::planner_input(spec, local_world_size);
  const dmp::ShardingPlan plan =
      spec.given_plan.empty() ? dmp::collective_plan(comm, planner, spec.profile) : given_plan(spec);
  for (const auto& t : plan.tables) {
    check::TablePlacement placement{t.table, dmp::sharding_type_name(t.type), {}};
    for (const auto& s : t.shards)
      placement.shards.push_back({s.rank, s.row_offset, s.rows, s.col_offset, s.cols, s.bytes});
    result.plan.push_back(placement);
  }

  // Build: the generator is seeded per the init mode before the model exists.
  const uint64_t seed = spec.init.seed + (spec.init.mode == scenario::InitMode::kUnseeded ? comm.rank() : 0);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  dmp::DmpOptions dmp_options{spec.profile, spec.sparse_optimizer, spec.dense_optimizer};
  auto model = std::make_unique<dmp::DistributedModelParallel>(comm, spec.model, plan, generator, dmp_options);
  int64_t steps_done = 0;  // steps the model had taken before this run (a checkpoint's)
  std::optional<dmp::FullState> checkpoint;
  if (!spec.init.from.empty()) {
    checkpoint = dmp::load_checkpoint(spec.init.from);
    if (!spec.init.load_before_wrap) {
      model->resume(checkpoint->tensors, checkpoint->steps);
      steps_done = checkpoint->steps;
      say(fmt::format("resumed from {} after {} step(s)", spec.init.from, steps_done));
    } else if (model->take_weights_loaded_before_wrap(checkpoint->tensors, checkpoint->steps)) {
      steps_done = checkpoint->steps;
      say(fmt::format("{} loaded before the wrap, and kept by it", spec.init.from));
    } else {
      say(fmt::format("{} loaded before the wrap, and replaced by its draw (profile {})", spec.init.from,
                      spec.profile.name));
    }
  }
  if (spec.expect.initial_state) {
    // Collective: every tensor the checkpoint holds, as the model holds it before any step.
    const auto state = model->gather_full_state();
    if (comm.rank() == 0) result.init_from = check::compare_with_checkpoint(state, checkpoint->tensors);
    result.init_from_compared = true;
  }
  inject_faults(spec, comm, 0, *model, say);
  const auto& init = model->init_broadcast();
  if (init.data_parallel_tables_broadcast) {
    at::Tensor seconds = at::tensor({init.data_parallel_tables.seconds}, at::kDouble);
    comm.all_reduce(seconds, comm::ReduceOp::kMax);
    auto& cost = result.init_broadcast;
    cost.performed = true;
    cost.bytes = init.data_parallel_tables.bytes;
    cost.tensors = init.data_parallel_tables.tensors;
    cost.collectives = init.data_parallel_tables.collectives;
    cost.bucket_cap_bytes = init.data_parallel_bucket_cap_bytes;
    cost.seconds = seconds.item<double>();
    cost.gbps = cost.seconds > 0 ? static_cast<double>(cost.bytes) / cost.seconds / 1e9 : 0.0;
    if (spec.broadcast_probe.enabled) {
      check::ProbeOptions probe;
      probe.warmup = spec.broadcast_probe.warmup;
      probe.iterations = spec.broadcast_probe.iterations;
      result.broadcast_probe = check::probe_broadcast(comm, replicated_parameters(*model), probe);
    }
  }
  result.replicas = check::check_replicas(comm, replicated(model->state()), "init");
  auto record_divergence = [&](int step, const std::vector<check::TensorCheck>& checks) {
    result.divergence.push_back(check::step_divergence(step, checks));
  };
  record_divergence(0, result.replicas);
  auto dump_full_state = [&](const std::string& phase) {
    if (options.full_state_dir.empty()) return;
    const auto state = model->gather_full_state();  // collective
    if (comm.rank() == 0) write_exchange_phase(options.full_state_dir, phase, whole_pieces(state));
  };
  dump_full_state("init");
  const bool compare_global = spec.expect.global_model.has_value();
  std::unique_ptr<check::GlobalModelTracker> tracker;
  if (compare_global) {
    const auto initial = model->gather_full_state();
    if (comm.rank() == 0) {
      tracker = std::make_unique<check::GlobalModelTracker>(
          spec.model, dmp_options, initial, steps_done,
          check::Tolerances{spec.expect.global_model->rtol, spec.expect.global_model->atol},
          spec.expect.outputs ? check::Tolerances{spec.expect.outputs->rtol, spec.expect.outputs->atol}
                              : check::Tolerances{});
    }
  }
  result.timings.init_s = seconds_since(start);
  say(fmt::format(
      "built: {} tables, plan {}, threads/rank {}", spec.model.tables.size(),
      [&] {
        std::vector<std::string> p;
        for (const auto& t : plan.tables) p.push_back(fmt::format("{}:{}", t.table, dmp::sharding_type_name(t.type)));
        return fmt::format("{}", fmt::join(p, " "));
      }(),
      threads));

  // Train; the unsharded model follows step by step when the scenario compares with it.
  const auto train_start = Clock::now();
  double check_seconds = 0.0;
  for (int step = 0; step < spec.steps; ++step) {
    const int global_step = static_cast<int>(steps_done) + step;
    const dmp::KeyedJaggedTensor global = make_global_batch(spec, global_step);
    if (!options.dump_batches_dir.empty() && comm.rank() == 0) {
      dmp::save_batch(
          fmt::format("{}/{}/{}/batch{}.pt", options.dump_batches_dir, scenario.name, spec.slug, global_step), global);
    }
    const double loss = model->train_step(local_batch(spec, global, comm.rank()));
    result.losses.push_back(loss);
    std::map<std::string, at::Tensor> outputs;
    if (spec.expect.outputs && (compare_global || !options.full_state_dir.empty())) {
      outputs = gather_outputs(comm, model->last_outputs());  // collective
      if (comm.rank() == 0 && !options.full_state_dir.empty()) {
        write_exchange_phase(options.full_state_dir, fmt::format("outputs{}", global_step), whole_pieces(outputs));
      }
    }
    inject_faults(spec, comm, step + 1, *model, say);
    check_finite(*model, loss, step + 1);
    dump_full_state(fmt::format("step{}", global_step + 1));
    if (step + 1 < spec.steps) {  // the last step is checked in full below
      const auto check_start = Clock::now();
      record_divergence(step + 1, check::check_replicas(comm, replicated(model->state()), "step"));
      check_seconds += seconds_since(check_start);
    }
    if (compare_global) {
      const auto check_start = Clock::now();
      const auto state = model->gather_full_state();
      if (tracker) tracker->step_and_compare(global, state, outputs, step + 1);
      check_seconds += seconds_since(check_start);
    }
    say(fmt::format("step {}/{} loss {:.6f} ({:.2f} s)", step + 1, spec.steps, loss, seconds_since(train_start)));
    if (spec.resume && step + 1 == spec.resume->after_step) {
      model = resume_under_new_plan(comm, spec, *model, planner, generator, dmp_options, steps_done + step + 1);
      say(fmt::format("resumed after step {} under another plan", step + 1));
    }
  }
  if (spec.expect.outputs && spec.steps == 0 && (compare_global || !options.full_state_dir.empty())) {
    // No step to check after: the forward alone, so that the outputs at step 0 are compared.
    const dmp::KeyedJaggedTensor global = make_global_batch(spec, static_cast<int>(steps_done));
    model->forward(local_batch(spec, global, comm.rank()));
    const auto outputs = gather_outputs(comm, model->last_outputs());  // collective
    if (tracker) tracker->forward_and_compare(global, outputs, 0);
    if (comm.rank() == 0 && !options.full_state_dir.empty())
      write_exchange_phase(options.full_state_dir, "outputs0", whole_pieces(outputs));
  }
  result.timings.train_s = seconds_since(train_start) - check_seconds;
  if (!options.checkpoint_dir.empty()) {
    const std::string dir = fmt::format("{}/{}/{}", options.checkpoint_dir, scenario.name, spec.slug);
    dmp::save_sharded_checkpoint(dir, *model, comm.rank(), comm.world_size(), steps_done + spec.steps);
    say(fmt::format("checkpoint saved to {}/rank{}.pt", dir, comm.rank()));
  }

  // Check.
  const auto check_start = Clock::now();
  auto final_checks = check::check_replicas(comm, replicated(model->state()), "final");
  result.replicas.insert(result.replicas.end(), final_checks.begin(), final_checks.end());
  if (spec.steps > 0) record_divergence(spec.steps, final_checks);
  if (tracker) {
    result.global_model = tracker->results();
    result.global_model_checked = true;
  }
  for (const auto& [name, tensor] : model->gather_full_state()) result.digests[name] = tensor_digest(tensor);
  result.timings.check_s = seconds_since(check_start) + check_seconds;
  result.expectation = check::evaluate_expectation(spec.expect, result);
  result.verdict = result.expectation.held ? check::Verdict::kPass : check::Verdict::kFail;
  return result;
}

}  // namespace dmpcheck::run
