#include "run/worker.h"

#include "dmp/behaviour_profile.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "comm/fingerprint.h"
#include "comm/backends.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "common/error.h"
#include "report/console.h"
#include "report/json.h"
#include "run/bench.h"
#include "run/rank_run.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {
namespace {

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

check::RunResult run_one(const scenario::Scenario& scenario, size_t index, comm::Store& store,
                         const comm::RankEnvironment& env, const WorkerOptions& worker) {
  const scenario::RunSpec& spec = scenario.runs.at(index);
  comm::Store run_store = store.with_prefix(fmt::format("run{}", index));
  comm::BackendOptions backend;
  backend.timeout = millis(spec.timeout_s);
  backend.local_rank = env.local_rank;
  // dmpcheck's own launcher runs every rank on this host (its "hosts" are simulated topology).
  const char* launched = std::getenv("DMPCHECK_LAUNCHED");
  backend.hostname = launched != nullptr && std::string(launched) == "1" ? "127.0.0.1" : comm::gloo_listen_address(env);
  backend.interface = env.gloo_interface;
  std::unique_ptr<comm::Communicator> comm =
      comm::make_communicator(spec.backend, run_store, env.rank, env.world_size, backend);
  if (spec.fingerprint) comm = comm::make_fingerprinting_communicator(std::move(comm));
  RankRunOptions options;
  options.local_world_size = env.local_world_size;
  options.checkpoint_dir = store.try_get("checkpoint_dir").value_or(worker.checkpoint_dir);
  options.dump_batches_dir = store.try_get("dump_batches_dir").value_or(worker.dump_batches_dir);
  options.full_state_dir = store.try_get("full_state_dir").value_or("");
  options.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  return run_on_rank(scenario, spec, *comm, options);
}

// torchrun's error file (TORCHELASTIC_ERROR_FILE): what its agent reads to report a failed
// worker, in the shape torch.distributed.elastic's error handler writes.
void write_torchelastic_error_file(const std::string& kind, const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const nlohmann::json error = {
      {"message",
       {{"message", fmt::format("dmpcheck.{}: {}", kind, message)},
        {"extraInfo", {{"py_callstack", "(C++: dmpcheck worker, no Python stack)"},
                       {"timestamp", std::to_string(static_cast<long long>(std::time(nullptr)))}}}}}};
  std::ofstream out(path, std::ios::trunc);
  out << error.dump() << "\n";
}

}  // namespace

int worker_main(const WorkerOptions& options) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::optional<comm::Store> store;
  int rank = -1;
  try {
    const comm::RankEnvironment env = comm::rank_environment_from_process();
    rank = env.rank;
    const char* launched = std::getenv("DMPCHECK_LAUNCHED");
    const auto store_timeout = std::chrono::seconds(120);
    if (launched != nullptr && std::string(launched) == "1") {
      store = comm::Store::connect(env.master_addr, env.master_port, store_timeout);
      if (store->try_get("bench/kind")) {
        bench_worker(*store, env);
        return 0;
      }
      const auto overrides = nlohmann::json::parse(store->get("overrides")).get<scenario::Overrides>();
      scenario::Scenario scenario =
          scenario::load_scenario_text(store->get("scenario_text"), store->get("scenario_file"), overrides);
      const size_t index = std::stoul(store->get("run_index"));
      if (store->try_get("as_reference")) {
        // The reference half of a side-by-side TorchRec cell: the same run on the reference DMP;
        // its verdict is not used, only the state it dumps.
        scenario::RunSpec& spec = scenario.runs.at(index);
        spec.system = scenario::kReferenceSystem;
        spec.expect = scenario::Expectation{};
        if (auto profile = store->try_get("as_reference_profile")) spec.profile = *dmp::find_behaviour_profile(*profile);
      }
      const check::RunResult result = run_one(scenario, index, *store, env, options);
      if (env.rank == 0) store->set("result", nlohmann::json(result).dump());
      return 0;
    }

    // Under an external launcher.
    DMP_CHECK(options.scenario_path.has_value(), ErrorKind::kInvalidInput,
              "`dmpcheck worker` outside `dmpcheck run` needs the scenario file as its argument");
    // Under torchrun's agent store, dmpcheck's own store lives on env.store_port (rendezvous.h).
    store = comm::Store::for_rank(env.master_addr, env.store_port, env.rank, env.world_size, store_timeout);
    if (env.rank == 0) {
      const scenario::Scenario loaded = scenario::load_scenario_file(*options.scenario_path);
      store->set("scenario_file", loaded.file);
      store->set("scenario_text", loaded.source_text);
    }
    const scenario::Scenario scenario = scenario::load_scenario_text(store->get("scenario_text"), store->get("scenario_file"));
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
      check::RunResult result = run_one(scenario, i, *store, env, options);
      if (env.rank != 0) continue;
      report::write_json_file(result, fmt::format("{}/{}/{}.json", options.out_dir, scenario.name, result.slug));
      std::printf("%s%s\n", report::render_run_table(result).c_str(), report::render_verdict_line(result).c_str());
      if (result.verdict != "pass") exit_code = 1;
    }
    return exit_code;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error (%s): %s\n", rank, std::string(error_kind_name(e.kind())).c_str(), e.what());
    write_torchelastic_error_file(std::string(error_kind_name(e.kind())), e.what());
    if (store) {
      try {
        store->set(fmt::format("error/{}", rank),
                   nlohmann::json{{"kind", std::string(error_kind_name(e.kind()))}, {"message", e.what()}}.dump());
      } catch (const std::exception&) {
        // The launcher may already be gone; the message above is on stderr regardless.
      }
    }
    return e.kind() == ErrorKind::kInvalidScenario ? 2 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    write_torchelastic_error_file("internal", e.what());
    if (store) {
      try {
        store->set(fmt::format("error/{}", rank), nlohmann::json{{"kind", "internal"}, {"message", e.what()}}.dump());
      } catch (const std::exception&) {
      }
    }
    return 3;
  }
}

}  // namespace dmpcheck::run
