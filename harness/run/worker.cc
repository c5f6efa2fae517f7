#include "run/worker.h"

#include "dmp/behaviour_profile.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/backends.h"
#include "comm/fingerprint.h"
#include "common/error.h"
#include "report/console.h"
#include "report/json.h"
#include "run/rank_run.h"
#include "run/release_contract.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

scenario::RunSpec reference_half_of(scenario::RunSpec spec, const ReferenceHalf& half) {
  spec.system = scenario::System{};
  const auto outputs = spec.expect.outputs;  // still dumped for the comparison
  spec.expect = scenario::Expectation{};
  spec.expect.outputs = outputs;
  if (!half.profile.empty()) spec.profile = *dmp::find_behaviour_profile(half.profile);
  for (const auto& [name, value] : half.switches) {  // checked by the loader
    DMP_CHECK(!dmp::set_behaviour_switch(spec.profile, name, value), ErrorKind::kInternal,
              "the reference half's switch {}={} does not apply", name, value);
    spec.profile.name += fmt::format("+{}={}", name, value);
  }
  if (half.shares_its_start) dmp::set_behaviour_switch(spec.profile, "broadcast_data_parallel_tables_at_init", "true");
  if (!half.plan.empty()) spec.given_plan = half.plan;
  return spec;
}

namespace {

check::RunResult run_one(const scenario::Scenario& scenario, size_t index, comm::Store& store,
                         const comm::RankEnvironment& env, const RankTask& task) {
  const scenario::RunSpec& spec = scenario.runs.at(index);
  comm::Store run_store = store.with_prefix(fmt::format("run{}", index));
  std::unique_ptr<comm::Communicator> comm = comm::make_communicator(spec.backend, run_store, env, spec.timeout_s);
  if (spec.fingerprint) comm = comm::make_fingerprinting_communicator(std::move(comm));
  RankRunOptions options;
  options.local_world_size = env.local_world_size;
  options.checkpoint_dir = task.checkpoint_dir;
  options.dump_batches_dir = task.dump_batches_dir;
  if (task.reference_half) options.full_state_dir = task.reference_half->full_state_dir;
  options.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  return run_on_rank(scenario, spec, *comm, options);
}

// torchrun's error file (TORCHELASTIC_ERROR_FILE): what its agent reads to report a failed
// worker, in the shape torch.distributed.elastic's error handler writes.
void write_torchelastic_error_file(const std::string& kind, const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const nlohmann::json error = {{"message",
                                 {{"message", fmt::format("dmpcheck.{}: {}", kind, message)},
                                  {"extraInfo",
                                   {{"py_callstack", "(C++: dmpcheck worker, no Python stack)"},
                                    {"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
  std::ofstream out(path, std::ios::trunc);
  out << error.dump() << "\n";
}

}  // namespace

int worker_main(const WorkerOptions& options) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A write to a peer that has died must fail (EPIPE) and be reported as a communication error,
  // not kill this rank with SIGPIPE. dmpcheck's own launcher sets this before it starts a rank;
  // an external one (torchrun, mpirun, srun) does not: under srun, a rank killed mid-run once took
  // its peer down with "Broken pipe" before the peer could say what happened.
  std::signal(SIGPIPE, SIG_IGN);
  std::optional<comm::Store> store;  // the run's view: keys under the secret's prefix
  std::string secret;
  int rank = -1;
  try {
    const comm::RankEnvironment env = comm::rank_environment_from_process();
    rank = env.rank;
    if (const char* s = std::getenv(kSecretVariable)) secret = s;
    const char* launched = std::getenv("DMPCHECK_LAUNCHED");
    const auto store_timeout = std::chrono::seconds(120);
    if (launched != nullptr && std::string(launched) == "1") {
      DMP_CHECK(!secret.empty(), ErrorKind::kInvalidInput, "started as dmpcheck's rank without {}", kSecretVariable);
      comm::Store raw = env.store_file.empty()
                            ? comm::Store::connect(env.master_addr, env.master_port, secret, store_timeout)
                            : comm::Store::open_file(env.store_file, store_timeout);
      store = secret_view(raw, secret);
      const RankTask task = take_task(*store, secret);
      if (task.bench_kind != BenchKind::kNone) {
        DMP_INTERNAL_ASSERT(options.bench != nullptr, "a benchmark task reached a worker that cannot run one");
        options.bench(*store, env, secret, task);
        return 0;
      }
      scenario::Scenario scenario =
          scenario::load_scenario_text(task.scenario_text, task.scenario_file, task.overrides);
      const size_t index = static_cast<size_t>(task.run_index);
      if (task.reference_half)
        scenario.runs.at(index) = reference_half_of(scenario.runs.at(index), *task.reference_half);
      const check::RunResult result = run_one(scenario, index, *store, env, task);
      if (env.rank == 0) set_signed(*store, kResultKey, nlohmann::json(result).dump(), secret);
      return 0;
    }

    // Under an external launcher: rank 0 hosts the store; the secret, when the user set the same
    // one on every rank, keeps everyone else out of the run's keys.
    DMP_CHECK(options.scenario_path.has_value(), ErrorKind::kInvalidInput,
              "`dmpcheck worker` outside `dmpcheck run` needs the scenario file as its argument");
    // Under torchrun's agent store, dmpcheck's own store lives on env.store_port (rendezvous.h).
    comm::Store raw = comm::Store::for_rank(env, secret, store_timeout);
    store = secret_view(raw, secret);
    if (env.rank == 0) {
      if (secret.empty()) {
        std::printf("dmpcheck: %s is not set: the run's store on port %u is open to anyone who can reach it; set the "
                    "same secret for every rank (e.g. %s=$(openssl rand -hex 32))\n",
                    kSecretVariable, static_cast<unsigned>(env.store_port), kSecretVariable);
      }
      const scenario::Scenario loaded = scenario::load_scenario_file(*options.scenario_path);
      RankTask task;
      task.scenario_file = loaded.file;
      task.scenario_text = loaded.source_text;
      hand_over(*store, task, secret);
    }
    const RankTask task = take_task(*store, secret);
    const scenario::Scenario scenario = scenario::load_scenario_text(task.scenario_text, task.scenario_file);
    int exit_code = 0;
    for (size_t i = 0; i < scenario.runs.size(); ++i) {
      if (scenario.runs[i].on_torchrec()) {
        // A release runs under its own Python, started by `dmpcheck run`, not inside these ranks.
        if (env.rank == 0) {
          std::printf("SKIP %s [%s]: TorchRec cells run from `dmpcheck run`, not under an external launcher\n",
                      scenario.name.c_str(), scenario.runs[i].name.c_str());
        }
        continue;
      }
      check::RunResult result = run_one(scenario, i, *store, env, task);
      if (env.rank != 0) continue;
      report::write_json_file(result, fmt::format("{}/{}/{}.json", options.out_dir, scenario.name, result.slug));
      std::printf("%s%s\n", report::render_run_table(result).c_str(), report::render_verdict_line(result).c_str());
      exit_code = std::max(exit_code, check::exit_status(result.verdict, std::nullopt));
    }
    return exit_code;
  } catch (const std::exception& e) {
    // A dmpcheck Error has its kind; anything else is internal.
    const auto* error = dynamic_cast<const Error*>(&e);
    const check::FailureKind kind = error ? check::failure_kind_of(error->kind()) : check::FailureKind::kInternal;
    const std::string name(check::failure_kind_name(kind));
    if (error) std::fprintf(stderr, "rank %d: error (%s): %s\n", rank, name.c_str(), e.what());
    else std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    write_torchelastic_error_file(name, e.what());
    if (store) {
      try {
        set_signed(*store, error_key(rank),
                   nlohmann::json(contract::RankError{contract::kSchemaVersion, name, e.what(), ""}).dump(), secret);
      } catch (const std::exception&) {
        // The launcher may already be gone; the message above is on stderr regardless.
      }
    }
    return check::exit_status(check::Verdict::kError, kind);
  }
}

}  // namespace dmpcheck::run
