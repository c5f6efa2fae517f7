#include "run/rank_run.h"

#include <chrono>
#include <cmath>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include "check/expectations.h"
#include "check/global_model.h"
#include "check/replica_check.h"
#include "comm/communicator.h"
#include "common/digest.h"
#include "common/error.h"
#include "common/names.h"
#include "common/revision.h"
#include "dmp/checkpoint.h"
#include "dmp/model_parallel.h"
#include "run/data_generator.h"
#include "run/faults.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"

namespace dmpcheck::run {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<check::TablePlacement> placements_of(const dmp::ShardingPlan& plan) {
  std::vector<check::TablePlacement> out;
  for (const auto& t : plan.tables) out.push_back({t.table, dmp::sharding_type_name(t.type), t.shards});
  return out;
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
  for (const auto& s : model.state()) {
    if (s.replicated && (ends_with(s.name, ".weight") || ends_with(s.name, ".bias"))) out.push_back(s.tensor);
  }
  return out;
}

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

// NaN or Inf in the loss or in any tensor this rank holds stops the run with the place it was
// first seen.
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
  result.system.name = spec.system.name();
  result.system.simulated = !spec.on_torchrec();
  result.init_mode = scenario::init_mode_name(spec.init.mode);
  result.environment.world_size = spec.world_size;
  result.environment.backend = comm::backend_name(spec.backend);
  // What the ranks were given, even when none reports back (a failed cell's header says so too).
  result.environment.host = hostname();
  result.environment.git_revision = git_revision();
  result.environment.cores = available_cores();
  result.environment.threads_per_rank = threads_per_rank(spec, result.environment.cores);
  result.expectation.description = spec.expect.describe();
  return result;
}

std::string hostname() {
  char buffer[256] = {0};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown";
  return buffer;
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
  const int cores = available_cores();
  at::set_num_threads(threads_per_rank(spec, cores));
  const dmp::ShardingPlan plan = dmp::collective_plan(comm, scenario::planner_input(spec), spec.profile);
  const uint64_t seed = spec.init.seed_of_rank(comm.rank());
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  dmp::DmpOptions dmp_options{spec.profile, spec.sparse_optimizer, spec.dense_optimizer};
  dmp::DistributedModelParallel model(comm, spec.model, plan, generator, dmp_options);
  return check::probe_broadcast(comm, replicated_parameters(model), options, run_options.progress);
}

namespace {

// One run on this rank, in the order of its phases: plan, build, check the start, train (with
// the per-step checks), save, check the end.  Each phase reads and adds to what the earlier ones
// left in the members.
class RankRun {
 public:
  RankRun(const scenario::Scenario& scenario, const scenario::RunSpec& spec, comm::Communicator& comm,
          const RankRunOptions& options)
      : scenario_(scenario), spec_(spec), comm_(comm), options_(options), start_(Clock::now()) {
    DMP_CHECK(comm.world_size() == spec.world_size, ErrorKind::kInvalidInput,
              "run '{}' needs {} ranks but this group has {} (WORLD_SIZE)", spec.name, spec.world_size,
              comm.world_size());
    const int cores = available_cores();
    threads_ = threads_per_rank(spec, cores);
    at::set_num_threads(threads_);
    result_ = result_header(scenario, spec);
    result_.environment = {TORCH_VERSION, comm.backend_name(), hostname(), git_revision(), spec.world_size, cores,
                           threads_};
  }

  // The hosts the launcher really gives (LOCAL_WORLD_SIZE) plan the run; a scenario that names its
  // topology must agree with them.
  void plan() {
    const int given = options_.local_world_size;  // 0: not given
    DMP_CHECK(spec_.local_world_size == 0 || given <= 0 || given == spec_.local_world_size, ErrorKind::kInvalidInput,
              "LOCAL_WORLD_SIZE is {} but the scenario's topology.local_world_size is {}", given,
              spec_.local_world_size);
    planner_ = scenario::planner_input(spec_, given);
    plan_ = spec_.given_plan.empty() ? dmp::collective_plan(comm_, planner_, spec_.profile) : given_plan(spec_);
    result_.plan = placements_of(plan_);
  }

  // The generator is seeded per the init mode before the model exists; then the model, what it
  // starts from, the scenario's step-0 faults, and what the init broadcast cost.
  void build() {
    const uint64_t seed = spec_.init.seed_of_rank(comm_.rank());
    generator_ = at::make_generator<at::CPUGeneratorImpl>(seed);
    dmp_options_ = {spec_.profile, spec_.sparse_optimizer, spec_.dense_optimizer};
    model_ = std::make_unique<dmp::DistributedModelParallel>(comm_, spec_.model, plan_, generator_, dmp_options_);
    std::optional<dmp::FullState> checkpoint;
    if (!spec_.init.from.empty()) {
      checkpoint = dmp::load_checkpoint(spec_.init.from);
      dmp::check_state_fits(*model_, checkpoint->tensors, "init.from " + spec_.init.from);
      if (!checkpoint->plan.empty())
        dmp::check_same_sharding(dmp::ShardingPlan::deserialize(checkpoint->plan), plan_, spec_.profile);
      if (!spec_.init.load_before_wrap) {
        model_->resume(checkpoint->tensors, checkpoint->steps);
        steps_done_ = checkpoint->steps;
        say(fmt::format("resumed from {} after {} step(s)", spec_.init.from, steps_done_));
      } else if (model_->take_weights_loaded_before_wrap(checkpoint->tensors, checkpoint->steps)) {
        steps_done_ = checkpoint->steps;
        say(fmt::format("{} loaded before the wrap, and kept by it", spec_.init.from));
      } else {
        say(fmt::format("{} loaded before the wrap, and replaced by its draw (profile {})", spec_.init.from,
                        spec_.profile.name));
      }
    }
    if (spec_.expect.initial_state) {
      // Collective: every tensor the checkpoint holds, as the model holds it before any step.
      const auto state = model_->gather_full_state();
      if (comm_.rank() == 0) result_.init_from = check::compare_with_checkpoint(state, checkpoint->tensors);
      result_.init_from_compared = true;
    }
    inject_faults(spec_, comm_, 0, *model_, [this](const std::string& line) { say(line); });
    const auto& init = model_->init_broadcast();
    if (!init.data_parallel_tables_broadcast) return;
    at::Tensor seconds = at::tensor({init.data_parallel_tables.seconds}, at::kDouble);
    comm_.all_reduce(seconds, comm::ReduceOp::kMax);
    const auto& dp = init.data_parallel_tables;
    const double s = seconds.item<double>();
    result_.init_broadcast = {true,
                              dp.bytes,
                              dp.tensors,
                              dp.collectives,
                              init.data_parallel_bucket_cap_bytes,
                              s,
                              s > 0 ? static_cast<double>(dp.bytes) / s / 1e9 : 0.0};
    if (spec_.broadcast_probe.enabled) {
      const check::ProbeOptions probe{spec_.broadcast_probe.warmup, spec_.broadcast_probe.iterations};
      result_.broadcast_probe = check::probe_broadcast(comm_, replicated_parameters(*model_), probe);
    }
  }

  // The replicas at init; the unsharded model starts from the same state when it is compared.
  void check_start() {
    result_.replicas = check::check_replicas(comm_, replicated(model_->state()), scenario::Phase::kInit);
    result_.divergence.push_back(check::step_divergence(0, result_.replicas));
    dump_full_state(contract::phase_init());
    if (spec_.expect.global_model) {
      const auto initial = model_->gather_full_state();
      if (comm_.rank() == 0) {
        tracker_ = std::make_unique<check::GlobalModelTracker>(
            spec_.model, dmp_options_, initial, steps_done_,
            check::Tolerances{spec_.expect.global_model->rtol, spec_.expect.global_model->atol},
            spec_.expect.outputs ? check::Tolerances{spec_.expect.outputs->rtol, spec_.expect.outputs->atol}
                                 : check::Tolerances{});
      }
    }
    result_.timings.init_s = seconds_since(start_);
    std::vector<std::string> placed;
    for (const auto& t : plan_.tables) placed.push_back(fmt::format("{}:{}", t.table, dmp::sharding_type_name(t.type)));
    say(fmt::format("built: {} tables, plan {}, threads/rank {}", spec_.model.tables.size(), fmt::join(placed, " "),
                    threads_));
  }

  // The steps; the unsharded model follows step by step when the scenario compares with it.
  void train() {
    const auto train_start = Clock::now();
    const bool compare_global = spec_.expect.global_model.has_value();
    const bool gather_outputs_too = spec_.expect.outputs && (compare_global || !options_.full_state_dir.empty());
    for (int step = 0; step < spec_.steps; ++step) {
      const int global_step = static_cast<int>(steps_done_) + step;
      const dmp::KeyedJaggedTensor global = make_global_batch(spec_, global_step);
      if (!options_.dump_batches_dir.empty() && comm_.rank() == 0) {
        dmp::save_batch(
            fmt::format("{}/{}/{}/batch{}.pt", options_.dump_batches_dir, scenario_.name, spec_.slug, global_step),
            global);
      }
      const double loss = model_->train_step(local_batch(spec_, global, comm_.rank()));
      result_.losses.push_back(loss);
      std::map<std::string, at::Tensor> outputs;
      if (gather_outputs_too) {
        outputs = gather_outputs(comm_, model_->last_outputs());  // collective
        if (comm_.rank() == 0 && !options_.full_state_dir.empty()) {
          write_exchange_phase(options_.full_state_dir, contract::phase_outputs(global_step), whole_pieces(outputs));
        }
      }
      inject_faults(spec_, comm_, step + 1, *model_, [this](const std::string& line) { say(line); });
      check_finite(*model_, loss, step + 1);
      dump_full_state(contract::phase_after(global_step + 1));
      const auto check_start = Clock::now();
      if (step + 1 < spec_.steps) {  // the last step is checked in full by check_end
        const auto checks = check::check_replicas(comm_, replicated(model_->state()), scenario::Phase::kStep);
        result_.divergence.push_back(check::step_divergence(step + 1, checks));
      }
      if (compare_global) {
        const auto state = model_->gather_full_state();
        if (tracker_) tracker_->step_and_compare(global, state, outputs, step + 1);
      }
      check_seconds_ += seconds_since(check_start);
      say(fmt::format("step {}/{} loss {:.6f} ({:.2f} s)", step + 1, spec_.steps, loss, seconds_since(train_start)));
      if (spec_.resume && step + 1 == spec_.resume->after_step) {
        // The mid-run checkpoint: the full state as a checkpoint holds it, the model built again
        // under the resume constraints, loaded, and on.
        dmp::PlannerInput planner = planner_;
        for (const auto& [table, constraints] : spec_.resume->constraints) planner.constraints[table] = constraints;
        model_ = dmp::reshard(comm_, *model_, spec_.model, dmp::collective_plan(comm_, planner, spec_.profile),
                              generator_, dmp_options_, steps_done_ + step + 1);
        result_.resumed_plan = placements_of(model_->plan());
        std::vector<std::string> placed;
        for (const auto& t : result_.resumed_plan) placed.push_back(t.table + " " + t.sharding);
        say(fmt::format("resumed after step {} under another plan: {}", step + 1, fmt::join(placed, ", ")));
      }
    }
    if (gather_outputs_too && spec_.steps == 0) {
      // No step to check after: the forward alone, so that the outputs at step 0 are compared.
      const dmp::KeyedJaggedTensor global = make_global_batch(spec_, static_cast<int>(steps_done_));
      model_->forward(local_batch(spec_, global, comm_.rank()));
      const auto outputs = gather_outputs(comm_, model_->last_outputs());  // collective
      if (tracker_) tracker_->forward_and_compare(global, outputs, 0);
      if (comm_.rank() == 0 && !options_.full_state_dir.empty())
        write_exchange_phase(options_.full_state_dir, contract::phase_outputs(0), whole_pieces(outputs));
    }
    result_.timings.train_s = seconds_since(train_start) - check_seconds_;
  }

  void save() {
    if (options_.checkpoint_dir.empty()) return;
    const std::string dir = fmt::format("{}/{}/{}", options_.checkpoint_dir, scenario_.name, spec_.slug);
    dmp::save_sharded_checkpoint(dir, *model_, comm_.rank(), comm_.world_size(), steps_done_ + spec_.steps);
    say(fmt::format("checkpoint saved to {}/rank{}.pt", dir, comm_.rank()));
  }

  // The replicas at the end, the unsharded model's verdict, the digests, the expectation.
  check::RunResult check_end() {
    const auto check_start = Clock::now();
    auto final_checks = check::check_replicas(comm_, replicated(model_->state()), scenario::Phase::kFinal);
    result_.replicas.insert(result_.replicas.end(), final_checks.begin(), final_checks.end());
    if (spec_.steps > 0) result_.divergence.push_back(check::step_divergence(spec_.steps, final_checks));
    if (tracker_) {
      result_.global_model = tracker_->results();
      result_.global_model_checked = true;
    }
    for (const auto& [name, tensor] : model_->gather_full_state()) result_.digests[name] = tensor_digest(tensor);
    result_.timings.check_s = seconds_since(check_start) + check_seconds_;
    result_.expectation = check::evaluate_expectation(spec_.expect, result_);
    result_.verdict = result_.expectation.held ? check::Verdict::kPass : check::Verdict::kFail;
    return result_;
  }

 private:
  void say(const std::string& line) const {
    if (options_.progress) options_.progress(line);
  }
  // The side-by-side TorchRec cell's reference half: every tensor whole, for the comparison.
  void dump_full_state(const std::string& phase) {
    if (options_.full_state_dir.empty()) return;
    const auto state = model_->gather_full_state();  // collective
    if (comm_.rank() == 0) write_exchange_phase(options_.full_state_dir, phase, whole_pieces(state));
  }

  const scenario::Scenario& scenario_;
  const scenario::RunSpec& spec_;
  comm::Communicator& comm_;
  const RankRunOptions& options_;
  const Clock::time_point start_;
  int threads_ = 1;
  check::RunResult result_;
  dmp::PlannerInput planner_;
  dmp::ShardingPlan plan_;
  at::Generator generator_;
  dmp::DmpOptions dmp_options_;
  std::unique_ptr<dmp::DistributedModelParallel> model_;
  int64_t steps_done_ = 0;  // steps the model had taken before this run (a checkpoint's)
  std::unique_ptr<check::GlobalModelTracker> tracker_;
  double check_seconds_ = 0.0;  // inside train(): the per-step checks, not training
};

}  // namespace

check::RunResult run_on_rank(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                             comm::Communicator& comm, const RankRunOptions& options) {
  RankRun run(scenario, spec, comm, options);
  run.plan();
  run.build();
  run.check_start();
  run.train();
  run.save();
  return run.check_end();
}

}  // namespace dmpcheck::run
