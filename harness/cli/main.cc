// dmpcheck: run, validate and join TorchRec-style DMP correctness scenarios.
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "dmp/behaviour_profile.h"
#include "report/explain.h"
#include "run/scenario_runner.h"
#include "run/worker.h"
#include "scenario/scenario.h"

namespace {

using namespace dmpcheck;

std::string self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  DMP_CHECK(!ec, ErrorKind::kInternal, "cannot resolve /proc/self/exe: {}", ec.message());
  return path.string();
}

std::string profiles_help() {
  std::string text = "Behaviour profiles:\n";
  for (const auto& p : dmp::behaviour_profiles()) text += fmt::format("  {:<14} {}\n", p.name, p.description);
  return text;
}

int command_validate(const std::vector<std::string>& files) {
  for (const auto& file : files) {
    const auto s = scenario::load_scenario_file(file);
    std::cout << fmt::format("{}: valid (scenario '{}', {} run(s))\n", file, s.name, s.runs.size());
    for (const auto& run : s.runs) {
      std::cout << fmt::format("  - {} : {} ranks, {} steps, profile {}, init {}; expect {}\n", run.name,
                               run.world_size, run.steps, run.profile.name, scenario::init_mode_name(run.init.mode),
                               run.expect.describe());
    }
  }
  return 0;
}

int command_explain(const std::vector<std::string>& files) {
  for (const auto& file : files) {
    const auto s = scenario::load_scenario_file(file);
    std::cout << fmt::format("{} ({}):\n", s.name, file);
    for (const auto& run : s.runs) std::cout << report::explain_run(run);
  }
  return 0;
}

int command_run(const std::vector<std::string>& files, const std::string& out_dir, bool quiet,
                std::optional<double> budget) {
  // Validate everything first: a typo in the third file should not cost two runs.
  std::vector<scenario::Scenario> scenarios;
  for (const auto& file : files) scenarios.push_back(scenario::load_scenario_file(file));
  std::vector<check::RunResult> all;
  for (const auto& s : scenarios) {
    run::ScenarioRunOptions options;
    options.worker_executable = self_executable();
    options.out_dir = out_dir;
    options.echo_rank_output = !quiet;
    options.out = &std::cout;
    options.budget_s = budget;
    auto outcome = run::run_scenario(s, options);
    all.insert(all.end(), outcome.results.begin(), outcome.results.end());
  }
  int passed = 0;
  for (const auto& r : all) passed += r.verdict == "pass" ? 1 : 0;
  std::cout << fmt::format("dmpcheck: {} of {} run(s) met their expectations; reports in {}/\n", passed, all.size(), out_dir);
  return run::exit_code_for(all);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dmpcheck: a correctness harness for TorchRec-style distributed embedding training.\n"
      "Exit status: 0 every expectation held, 1 one did not, 2 bad input or a failed rank."};
  app.footer(profiles_help());
  app.require_subcommand(1);

  std::vector<std::string> run_files;
  std::string out_dir = "reports";
  bool quiet = false;
  std::optional<double> budget;
  auto* run_cmd = app.add_subcommand("run", "Run scenario files: spawn the ranks, train, compare replicas, judge");
  run_cmd->add_option("scenario", run_files, "Scenario YAML file(s)")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--out", out_dir, "Report directory (reports/<scenario>/<run>.json)")->capture_default_str();
  run_cmd->add_flag("--quiet", quiet, "Do not echo the ranks' own output");
  run_cmd->add_option("--budget", budget, "Seconds a run may take in all before its ranks are killed");

  std::vector<std::string> validate_files;
  auto* validate_cmd = app.add_subcommand("validate", "Check scenario files without running them");
  validate_cmd->add_option("scenario", validate_files, "Scenario YAML file(s)")->required();

  std::vector<std::string> explain_files;
  auto* explain_cmd = app.add_subcommand("explain", "Print each run's sharding plan and the collectives a step issues");
  explain_cmd->add_option("scenario", explain_files, "Scenario YAML file(s)")->required();

  std::optional<std::string> worker_file;
  std::string worker_out = "reports";
  auto* worker_cmd = app.add_subcommand(
      "worker",
      "Be one rank. Under torchrun/srun give the scenario file; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
      "come from the environment (rank 0 hosts the store on MASTER_PORT)");
  worker_cmd->add_option("scenario", worker_file, "Scenario YAML file (not needed under `dmpcheck run`)");
  worker_cmd->add_option("--out", worker_out, "Report directory (rank 0)")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*run_cmd) return command_run(run_files, out_dir, quiet, budget);
    if (*validate_cmd) return command_validate(validate_files);
    if (*explain_cmd) return command_explain(explain_files);
    if (*worker_cmd) return run::worker_main({worker_file, worker_out});
  } catch (const Error& e) {
    std::cerr << "dmpcheck: " << e.what() << "\n";
    return e.kind() == ErrorKind::kInternal ? 3 : 2;
  } catch (const std::exception& e) {
    std::cerr << "dmpcheck: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
