// dmpcheck: run, validate and join TorchRec-style DMP correctness scenarios.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench/sweep.h"
#include "cli/explore_command.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/revision.h"
#include "common/settings.h"
#include "dmp/behaviour_profile.h"
#include "dmp/checkpoint.h"
#include "dmp/planner.h"
#include "release/release_inputs.h"
#include "report/explain.h"
#include "report/suite_reports.h"
#include "run/launcher.h"
#include "run/preflight.h"
#include "run/worker.h"
#include "scenario/scenario.h"
#include "suite/cells.h"
#include "suite/releases.h"
#include "suite/suite.h"

namespace {

// A duration in seconds: finite, above zero, at most a week (inf, nan or 1e308 would overflow the
// deadline it becomes; zero or less would end every run at once).
const CLI::Validator kSeconds(
    [](std::string& text) -> std::string {
      constexpr double kWeek = 7 * 24 * 3600.0;
      double value = 0;
      size_t used = 0;
      try {
        value = std::stod(text, &used);
      } catch (const std::exception&) { used = 0; }
      if (used != text.size() || used == 0 || !std::isfinite(value) || value <= 0 || value > kWeek) {
        return fmt::format("expected seconds > 0 and <= {} (a week), got '{}'", kWeek, text);
      }
      return "";
    },
    "SECONDS");

// The reports' headline, every run counted ("3 of 4 run(s) met their expectations (0 failed, 0 errored,
// 1 skipped)"), and the reports that could not be written.
std::string tally(const std::vector<dmpcheck::check::RunResult>& results) {
  const auto unwritten =
      std::count_if(results.begin(), results.end(), [](const auto& r) { return !r.report_error.empty(); });
  return dmpcheck::report::headline(results) +
         (unwritten > 0 ? fmt::format(", {} report(s) NOT written (said above)", unwritten) : std::string());
}

using namespace dmpcheck;

std::string self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  DMP_CHECK(!ec, ErrorKind::kInternal, "cannot resolve /proc/self/exe: {}", ec.message());
  return path.string();
}

std::string profiles_help() {
  std::string text = "Behaviour profiles:\n";
  for (const auto& p : dmp::behaviour_profiles()) text += fmt::format("  {:<22} {}\n", p.name, p.description);
  return text;
}

// Every file (directories are searched for *.yaml), each error reported, none stopping the rest.
int command_validate(const std::vector<std::string>& paths) {
  int invalid = 0;
  const std::vector<std::string> files = run::collect_scenario_files(paths);
  DMP_CHECK(!files.empty(), ErrorKind::kInvalidInput, "no scenario files (*.yaml) in {}", fmt::join(paths, ", "));
  for (const auto& file : files) {
    if (run::interrupt_requested()) break;  // the status says so (130)
    scenario::Scenario s;
    try {
      s = scenario::load_scenario_file(file);
      run::preflight(s);  // every plan, and the memory against this host's
    } catch (const Error& e) {
      std::cerr << "dmpcheck: " << e.what() << "\n";
      if (run::interrupt_requested()) break;  // stopped, not invalid
      ++invalid;
      continue;
    }
    std::cout << fmt::format("{}: valid (scenario '{}', {} run(s))\n", file, s.name, s.runs.size());
    for (const auto& spec : s.runs) {
      if (spec.script) {
        std::cout << fmt::format("  - {} : the script {} on {} ranks, on {}, timeout_s {}; expect {}\n", spec.name,
                                 spec.script->path, spec.world_size, spec.system.name(), spec.timeout_s,
                                 spec.expect.describe());
        continue;
      }
      const run::RunMemory memory = run::estimate_run_memory(spec);
      std::cout << fmt::format(
          "  - {} : {} ranks, {} steps, {}, init {}; expect {}; peak memory about {} on this host\n", spec.name,
          spec.world_size, spec.steps, spec.on_torchrec() ? "on " + spec.system.name() : "profile " + spec.profile.name,
          scenario::init_mode_name(spec.init.mode), spec.expect.describe(),
          run::human_bytes(static_cast<double>(memory.host_bytes)));
    }
  }
  if (invalid > 0) std::cerr << fmt::format("dmpcheck validate: {} of {} file(s) invalid\n", invalid, files.size());
  return invalid > 0 ? 2 : 0;
}

int command_explain(const std::vector<std::string>& files, const std::vector<std::string>& releases) {
  for (const auto& file : files) {
    const auto s = scenario::load_scenario_file(file);
    std::cout << fmt::format("{} ({}):\n", s.name, file);
    for (const auto& run : s.runs) {
      if (run.on_torchrec()) continue;  // a release cell plans with the release (--release shows how)
      std::cout << report::explain_run(run);
      for (const auto& version : releases) {
        // Bytes are the reference's estimate; the release's plan has none, so compare placements only.
        auto compare = [&](const scenario::RunSpec& planned, const std::string& when) {
          std::string label;
          const dmp::ShardingPlan theirs = run::torchrec_planner_plan(planned, version, &label);
          dmp::ShardingPlan ours = dmp::plan_sharding(scenario::planner_input(planned), run.profile);
          for (auto& t : ours.tables) {
            for (auto& shard : t.shards) shard.bytes = 0;
          }
          std::cout << fmt::format("  {}'s own planner{}{}:\n", label, when,
                                   ours.serialize() == theirs.serialize() ? " places every shard as above"
                                                                          : " places them differently")
                    << report::explain_placement(planned, theirs);
        };
        compare(run, "");
        if (run.resume)
          compare(scenario::resumed_run(run), fmt::format(", resumed after step {},", run.resume->after_step));
      }
    }
  }
  return 0;
}

struct RunFlags {
  int repeat = 1;
  std::optional<double> timeout_s;  // overrides every run's timeout_s
  bool quiet = false;
  std::string ranks = "fork";
  run::ScenarioRunOptions run;  // --out, --budget, --checkpoint-dir, --dump-batches, --filter
};

int command_gather(const std::string& directory, const std::string& output) {
  const dmp::FullState state = dmp::load_sharded_checkpoint(directory);
  dmp::save_unsharded_checkpoint(output, state);
  std::cout << fmt::format("{}: {} tensors after {} step(s), unsharded, written to {}\n", directory,
                           state.tensors.size(), state.steps, output);
  return 0;
}

int command_suite(run::SuiteOptions options) {
  options.worker_executable = self_executable();
  options.out = &std::cout;
  const auto outcome = run::run_suite(options);
  std::cout << fmt::format("dmpcheck suite: {} in {:.1f} s\n", tally(outcome.results), outcome.seconds);
  std::cout << fmt::format("reports: {0}/junit.xml {0}/summary.md {0}/report.html and one JSON per run\n",
                           outcome.report_dir);
  return outcome.exit_code;
}

int command_run(const std::vector<std::string>& files, RunFlags flags) {
  // Validate everything first: a typo in the third file should not cost two runs.
  std::vector<scenario::Scenario> scenarios;
  scenario::Overrides overrides;
  if (flags.timeout_s) overrides.emplace_back("timeout_s", fmt::format("{}", *flags.timeout_s));
  for (const auto& file : files) {
    if (run::interrupt_requested()) return 130;
    scenarios.push_back(scenario::load_scenario_file(file, overrides));
    run::preflight(scenarios.back());  // plans and memory, before any rank starts
  }
  run::ScenarioRunOptions& options = flags.run;
  options.worker_executable = self_executable();
  options.echo_rank_output = !flags.quiet;
  options.print_tables = !flags.quiet;
  options.out = &std::cout;
  options.exec_ranks = flags.ranks == "exec";
  std::vector<check::RunResult> all;
  bool deterministic = true;
  for (const auto& s : scenarios) {
    std::vector<check::RunResult> first;
    for (int attempt = 0; attempt < std::max(1, flags.repeat); ++attempt) {
      if (flags.repeat > 1) std::cout << fmt::format("== repetition {}/{} of {}\n", attempt + 1, flags.repeat, s.name);
      auto outcome = run::run_scenario(s, options);
      all.insert(all.end(), outcome.results.begin(), outcome.results.end());
      if (attempt == 0) {
        first = outcome.results;
        continue;
      }
      // Every digest of every run must be what the first repetition produced.
      for (size_t i = 0; i < outcome.results.size() && i < first.size(); ++i) {
        for (const auto& [name, digest] : first[i].digests) {
          auto it = outcome.results[i].digests.find(name);
          const std::string other = it == outcome.results[i].digests.end() ? "missing" : it->second;
          if (other == digest) continue;
          deterministic = false;
          std::cout << fmt::format("NONDETERMINISTIC {} [{}]: {} is {} in repetition 1 but {} in repetition {}\n",
                                   s.name, first[i].run, name, digest, other, attempt + 1);
        }
      }
    }
  }
  DMP_CHECK(!all.empty() || options.filter.empty(), ErrorKind::kInvalidInput,
            "--filter '{}' matches no run of {} (runs are named '<scenario> [<run>]'; `dmpcheck validate` lists them)",
            options.filter, fmt::join(files, ", "));
  if (flags.repeat > 1) {
    std::cout << (deterministic ? fmt::format("dmpcheck: every digest identical over {} repetitions\n", flags.repeat)
                                : std::string("dmpcheck: digests differ between repetitions\n"));
  }
  std::cout << fmt::format("dmpcheck: {}; reports in {}/\n", tally(all), options.out_dir);
  const int code = check::exit_status(all);
  return code == 0 && !deterministic ? 1 : code;
}

struct BenchFlags {
  bench::BenchCommandOptions sweep;  // with --scenario: its --backend, -w, -n and --json
  std::string min_bytes = "1K";
  std::string max_bytes = "1M";
  std::string scenario;
  std::string run_filter;
  std::vector<std::string> bucket_caps;
  std::vector<std::string> backends = {"gloo"};  // --backend, by name
  bool backend_given = false;                    // --scenario: compare these backends instead of the run's own
};

int command_bench(BenchFlags flags) {
  bench::BenchCommandOptions& options = flags.sweep;
  options.backends.clear();
  for (const auto& name : flags.backends) options.backends.push_back(*value_in(comm::kBackendNames, name));
  options.worker_executable = self_executable();
  options.out = &std::cout;
  bench::BenchSpec& spec = options.spec;
  if (!flags.scenario.empty()) {
    check::ProbeOptions probe;
    probe.warmup = spec.warmup;
    probe.iterations = spec.iterations;
    if (!flags.bucket_caps.empty()) probe.bucket_caps.clear();
    for (const auto& cap : flags.bucket_caps) probe.bucket_caps.push_back(bench::parse_size(cap));
    return bench::run_scenario_bench({options.worker_executable, flags.scenario, flags.run_filter,
                                      flags.backend_given ? options.backends : std::vector<comm::Backend>(), probe,
                                      options.json_path, options.out});
  }
  if (std::count(spec.collectives.begin(), spec.collectives.end(), "all") > 0)
    spec.collectives = bench::bench_collectives();
  spec.min_bytes = bench::parse_size(flags.min_bytes);
  spec.max_bytes = bench::parse_size(flags.max_bytes);
  return bench::run_bench(options);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dmpcheck: a correctness harness for TorchRec-style distributed embedding training.\n"
               "Exit status: 0 every expectation held, 1 one did not, 2 bad input, 3 a rank failed or timed out, 130 "
               "interrupted.\n"
               "Docs: README.md, docs/guide.md (every command), docs/scenarios.md (the scenario format), "
               "docs/reliability.md."};
  app.footer(profiles_help());
  app.set_version_flag(
      "--version", [] { return fmt::format("dmpcheck {}, built against {}", git_revision(), run::libtorch_build()); });
  app.require_subcommand(1);

  std::vector<std::string> run_files;
  RunFlags flags;
  auto* run_cmd = app.add_subcommand("run", "Run scenario files: spawn the ranks, train, compare replicas, judge");
  run_cmd->add_option("scenario", run_files, "Scenario YAML file(s)")->required()->check(CLI::ExistingFile);
  // Where `system: torchrec@<rev>` finds its commit (run, suite and bisect take it).
  std::string torchrec_repo;
  static constexpr const char* kTorchRecRepoHelp =
      "TorchRec's git repository for torchrec@<rev> systems: a local clone (used in place), or a URL or bundle "
      "(cloned once into the environments' cache); default $DMPCHECK_TORCHREC_REPO";
  run_cmd->add_option("--torchrec-repo", torchrec_repo, kTorchRecRepoHelp);
  bool install_releases = false;
  static constexpr const char* kInstallHelp =
      "Install a TorchRec release a cell needs that is not installed (bash ci/torchrec-env.sh X, about 5 GB, within "
      "$DMPCHECK_TORCHREC_BUDGET_GB) instead of skipping the cell";
  run_cmd->add_flag("--install", install_releases, kInstallHelp);
  run_cmd->add_option("--out", flags.run.out_dir, "Report directory (reports/<scenario>/<run>.json)")
      ->capture_default_str();
  run_cmd->add_flag("--quiet", flags.quiet,
                    "Print one verdict line per run and the summary: no rank output, no tables (the JSON reports "
                    "hold everything)");
  run_cmd
      ->add_option("--timeout", flags.timeout_s,
                   "Deadline in seconds of every collective (overrides the scenarios' timeout_s)")
      ->check(kSeconds);
  run_cmd
      ->add_option("--repeat", flags.repeat, "Run each scenario N times; fail unless every tensor digest is identical")
      ->check(CLI::Range(1, 1000));
  run_cmd->add_option("--budget", flags.run.budget_s, "Seconds a run may take in all before its ranks are killed")
      ->check(kSeconds);
  run_cmd->add_option(
      "--checkpoint-dir", flags.run.checkpoint_dir,
      "After the last step every rank saves its shards to DIR/<scenario>/<run>/rank<r>.pt (torch.load reads them)");
  run_cmd->add_option(
      "--dump-batches", flags.run.dump_batches_dir,
      "Rank 0 writes every global batch to DIR/<scenario>/<run>/batch<step>.pt, to feed TorchRec the same data");
  run_cmd->add_option("--filter", flags.run.filter,
                      "Only the runs whose '<scenario> [<run>]' matches this regex (as suite --filter)");
  run_cmd
      ->add_option("--ranks", flags.ranks,
                   "fork: ranks are forked from this warm process (no second libtorch start-up); exec: a fresh "
                   "`dmpcheck worker` per rank (also DMPCHECK_RANKS=exec)")
      ->check(CLI::IsMember({"fork", "exec"}))
      ->capture_default_str();

  run::SuiteOptions suite;
  auto* suite_cmd = app.add_subcommand(
      "suite",
      "Run every scenario and matrix cell under the given paths; write JSON, JUnit XML, Markdown and HTML reports");
  suite_cmd->add_option("paths", suite.paths, "Scenario files or directories (searched for *.yaml)")->required();
  suite_cmd->add_option("--filter", suite.filter, "Only cells whose '<scenario> [<run>]' matches this regex");
  suite_cmd->add_option("--jobs,-j", suite.jobs, "Runs at once, while their ranks fit on the cores")
      ->capture_default_str();
  suite_cmd->add_option("--out", suite.out_root, "Reports go to <out>/<timestamp>/")->capture_default_str();
  suite_cmd->add_option("--budget", suite.budget_s, "Seconds a run may take in all before its ranks are killed")
      ->check(kSeconds);
  suite_cmd->add_option("--torchrec-repo", torchrec_repo, kTorchRecRepoHelp);
  suite_cmd->add_flag("--install", install_releases, kInstallHelp);
  std::string suite_ranks = "fork";
  suite_cmd
      ->add_option("--ranks", suite_ranks,
                   "fork: ranks are forked from this warm process (with --jobs 1); exec: a fresh `dmpcheck worker` per "
                   "rank (also DMPCHECK_RANKS=exec)")
      ->check(CLI::IsMember({"fork", "exec"}))
      ->capture_default_str();

  std::string report_dir;
  auto* report_cmd = app.add_subcommand(
      "report", "Render junit.xml, summary.md and report.html again from the run JSON files in a directory");
  report_cmd->add_option("directory", report_dir, "A suite's report directory")
      ->required()
      ->check(CLI::ExistingDirectory);

  std::string gather_dir, gather_out;
  auto* checkpoint_cmd = app.add_subcommand("checkpoint", "Work with checkpoints");
  auto* gather_cmd =
      checkpoint_cmd->add_subcommand("gather", "Assemble a sharded checkpoint directory into one unsharded file");
  gather_cmd->add_option("directory", gather_dir, "Directory holding rank<r>.pt")
      ->required()
      ->check(CLI::ExistingDirectory);
  gather_cmd->add_option("output", gather_out, "Unsharded file to write (a dict with 'state_dict')")->required();
  checkpoint_cmd->require_subcommand(1);

  std::vector<std::string> validate_files;
  auto* validate_cmd = app.add_subcommand("validate", "Check scenario files without running them");
  validate_cmd->add_option("scenario", validate_files, "Scenario YAML files or directories (searched for *.yaml)")
      ->required();

  std::vector<std::string> explain_files;
  auto* explain_cmd = app.add_subcommand("explain", "Print each run's sharding plan and the collectives a step issues");
  explain_cmd->add_option("scenario", explain_files, "Scenario YAML file(s)")->required();
  std::vector<std::string> explain_releases;
  explain_cmd
      ->add_option("--release", explain_releases,
                   "Also print the plan this TorchRec release's own planner makes for each run (its installed "
                   "environment, ci/torchrec-env.sh), and whether it places the shards as the reference does; "
                   "comma-separated for several")
      ->delimiter(',');

  BenchFlags bench;
  bench::BenchSpec& spec = bench.sweep.spec;
  auto* bench_cmd = app.add_subcommand(
      "bench",
      "Measure collectives the way nccl-tests does (sizes x collectives x backends x world sizes, each size checked "
      "on seeded inputs), or with --scenario what broadcasting a model's replicated parameters costs");
  bench_cmd
      ->add_option("--collective,-c", spec.collectives,
                   "broadcast, all_reduce, all_gather, reduce_scatter, all_to_all, or all (repeat or comma-separate)")
      ->delimiter(',')
      ->capture_default_str();
  bench_cmd->add_option("--minbytes,-b", bench.min_bytes, "Smallest size (bytes; K, M, G suffixes as nccl-tests)")
      ->capture_default_str();
  bench_cmd->add_option("--maxbytes,-e", bench.max_bytes, "Largest size")->capture_default_str();
  bench_cmd->add_option("--stepfactor,-f", spec.factor, "Multiply the size by this between rows")
      ->capture_default_str();
  bench_cmd->add_option("--warmup_iters,-w", spec.warmup, "Untimed iterations per size")->capture_default_str();
  bench_cmd->add_option("--iters,-n", spec.iterations, "Timed iterations per size")->capture_default_str();
  bench_cmd
      ->add_option("--backend", bench.backends,
                   "gloo, nccl (repeat or comma-separate); unavailable ones are skipped with the reason. With "
                   "--scenario: run each "
                   "run on each of these instead of its own backend")
      ->delimiter(',')
      ->check(CLI::IsMember(names_in(comm::kBackendNames)))
      ->capture_default_str();
  bench_cmd->add_option("--world,-g", bench.sweep.world_sizes, "World sizes (repeat or comma-separate)")
      ->delimiter(',')
      ->capture_default_str();
  bench_cmd->add_option("--threads", spec.threads_per_rank, "Intra-op threads per rank (default: cores / ranks)");
  bench_cmd->add_option("--timeout", spec.timeout_s, "Deadline in seconds of every collective")->capture_default_str();
  bench_cmd->add_option("--json", bench.sweep.json_path, "Also write the results as JSON to this file");
  bench_cmd
      ->add_option("--scenario", bench.scenario,
                   "Instead of the sweep: build each run of this scenario and time every way of broadcasting its "
                   "replicated parameters (per tensor, coalesced at each --bucket-cap, c10d's, one raw buffer)")
      ->check(CLI::ExistingFile);
  bench_cmd->add_option("--run", bench.run_filter, "With --scenario: only runs whose name contains this");
  bench_cmd
      ->add_option("--bucket-cap", bench.bucket_caps, "With --scenario: bucket caps to compare (default 1M,25M,250M)")
      ->delimiter(',');

  run::ReleaseOptions releases;
  auto* bisect_cmd = app.add_subcommand(
      "bisect",
      "Binary-search the TorchRec releases (then, with --commits, the commits between two of them) for the first "
      "whose behaviour on a scenario differs from the oldest's: its cells run on each point visited (its `system` "
      "replaced), judged against the expectations the scenario writes for each release it names (bug, fixed, ...), and "
      "showing replicas equal, which diverge, or the error. Exit: 0 the first that differs is named, 1 "
      "both ends behave the same, 2 bad input, 3 an end could not run, 4 the change lies among points that could "
      "not be tested (named)");
  bisect_cmd->add_option("scenario", releases.scenario_files, "Scenario YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  bisect_cmd
      ->add_option("--releases", releases.releases,
                   "Releases oldest first, comma-separated (e.g. 0.6.0,0.7.0,0.8.0,1.9.2), or a range of pinned "
                   "ones (0.6.0..1.9.2; default: every release in torchrec_sut/pins.tsv); one that is not "
                   "installed is installed when the search visits it, or with --no-install skipped, and is never "
                   "the answer")
      ->delimiter(',');
  bool no_install = false;
  bisect_cmd->add_flag("--no-install", no_install,
                       "Skip a release that is not installed instead of installing it (bash ci/torchrec-env.sh X, "
                       "within $DMPCHECK_TORCHREC_BUDGET_GB, default 40, least recently used ones removed first)");
  bisect_cmd->add_flag("--commits", releases.commits,
                       "Then bisect the commits between the two releases' tags (first parents), each commit's "
                       "source over the older release's environment, and name the first that differs (needs "
                       "--torchrec-repo)");
  bisect_cmd->add_option("--commit-range", releases.commit_range,
                         "Bisect only these commits, OLD..NEW (e.g. cc482f8~8..cc482f8), no releases");
  bisect_cmd->add_option("--over", releases.over,
                         "The release whose environment the commits run over (default: the older release; with "
                         "--commit-range, the release OLD descends from)");
  bisect_cmd->add_option("--out", releases.out_dir, "Report directory (<out>/bisect-<release>/...)")
      ->capture_default_str();
  bisect_cmd->add_option("--torchrec-repo", torchrec_repo, kTorchRecRepoHelp);
  auto* fidelity_cmd = app.add_subcommand(
      "fidelity",
      "Measure the reference DMP against TorchRec releases (fidelity scenarios, `expect: reference`) and write "
      "the Markdown table (docs/fidelity.md)");
  fidelity_cmd->add_option("scenario", releases.scenario_files, "Fidelity scenario files (fidelity/*.yaml)")
      ->required()
      ->check(CLI::ExistingFile);
  fidelity_cmd->add_option("--releases", releases.releases, "Releases, comma-separated")->delimiter(',')->required();
  fidelity_cmd->add_option("--output", releases.output, "Markdown file to write")->required();
  fidelity_cmd->add_option("--out", releases.out_dir, "Report directory for the runs' JSON")->capture_default_str();

  bool table_no_install = false;
  auto* table_cmd = app.add_subcommand(
      "releases",
      "Run every scenario on every TorchRec release and write the table of what each showed (bug, fixed, absent, "
      "the release's own error), judged by the expectations each scenario writes for the releases it names; only "
      "pairs not measured before, or whose scenario changed, run (the measurements are kept in <output>.json). "
      "Exit: 0 every pair measured, 4 some could not be");
  table_cmd->add_option("paths", releases.scenario_files, "Scenario files or directories (searched for *.yaml)")
      ->required()
      ->check(CLI::ExistingPath);
  table_cmd
      ->add_option("--releases", releases.releases,
                   "Releases oldest first, comma-separated, or a range of pinned ones (0.6.0..1.9.2); default: every "
                   "release in torchrec_sut/pins.tsv")
      ->delimiter(',');
  table_cmd->add_option("--output", releases.output, "The Markdown table to write (its store: the same name, .json)")
      ->required();
  table_cmd->add_flag("--fresh", releases.fresh, "Measure every pair again (the store is started anew)");
  table_cmd->add_flag("--commits", releases.table_commits,
                      "Where a bug appears or goes between two releases whose tags the repository has, bisect the "
                      "commits from the older one's branch point to the newer tag and name the first that behaves "
                      "differently from the older release (needs --torchrec-repo)");
  table_cmd->add_option("--torchrec-repo", torchrec_repo, kTorchRecRepoHelp);
  table_cmd->add_flag("--no-install", table_no_install,
                      "Skip a release that is not installed instead of installing it (within "
                      "$DMPCHECK_TORCHREC_BUDGET_GB, least recently used environments removed first)");
  table_cmd->add_option("--out", releases.out_dir, "Report directory (<out>/releases-<release>/...)")
      ->capture_default_str();

  cli::ExploreFlags explore_flags;
  auto* explore_cmd = cli::add_explore_command(app, explore_flags);

  run::WorkerOptions worker;
  worker.bench = bench::bench_worker;
  auto* worker_cmd = app.add_subcommand(
      "worker",
      "Be one rank. Under torchrun/srun give the scenario file; RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
      "come from the environment (rank 0 hosts the store on MASTER_PORT)");
  worker_cmd->add_option("scenario", worker.scenario_path, "Scenario YAML file (not needed under `dmpcheck run`)");
  worker_cmd->add_option("--out", worker.out_dir, "Report directory (rank 0)")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are CLI11's "errors" of status 0; a command line it refuses is bad
    // input, 2, like every other (CLI11's own statuses, 105 and up, are nobody's policy).
    return app.exit(e) == 0 ? 0 : 2;
  }
  // The settings, read once: the environment's, the flags over them (common/settings.h).
  Settings settings;
  try {
    settings = Settings::from_environment();
  } catch (const Error& e) {
    std::cerr << "dmpcheck: " << e.what() << "\n";
    return 2;
  }
  if (!torchrec_repo.empty()) {
    // Refused before git sees it: an option, a remote helper, a transport nobody means (the
    // variable's value was checked where it was read).
    try {
      check_torchrec_repo(torchrec_repo, "--torchrec-repo");
    } catch (const Error& e) {
      std::cerr << "dmpcheck: " << e.what() << "\n";
      return 2;
    }
    settings.torchrec_repo = torchrec_repo;
  }
  // A clone of the repository and an interpreter's probe are bounded by the command's --budget too.
  for (const auto& budget : {flags.run.budget_s, suite.budget_s}) {
    if (budget) settings.command_budget_s = std::min(settings.command_budget_s, *budget);
  }
  // A missing release is installed where asked, and by bisect and releases unless told not to.
  if (install_releases || (*bisect_cmd && !no_install) || (*table_cmd && !table_no_install))
    settings.install_releases = true;
  install_settings(std::move(settings));
  if (!*worker_cmd) run::install_interrupt_handlers();  // ranks die with their launcher anyway
  // A long command interrupted (Ctrl-C, SIGTERM) says so in its status, whatever it returned.
  auto finish = [](int code) { return run::interrupt_requested() ? 130 : code; };
  // What a killed dmpcheck left (its store, exchange and interpreter directories) goes first.
  if (!*worker_cmd) {
    for (const auto& gone : remove_private_dirs_of_gone_makers()) {
      std::cerr << "dmpcheck: removed " << gone << ", left by a dmpcheck that was killed\n";
    }
  }
  try {
    if (*run_cmd) return finish(command_run(run_files, flags));
    if (*gather_cmd) return command_gather(gather_dir, gather_out);
    if (*suite_cmd) {
      suite.exec_ranks = suite_ranks == "exec";
      return finish(command_suite(suite));
    }
    if (*report_cmd) {
      const size_t n = run::rerender_reports(report_dir);
      std::cout << fmt::format("{}: {} runs rendered into junit.xml, summary.md, report.html\n", report_dir, n);
      return 0;
    }
    if (*bench_cmd) {
      bench.backend_given = bench_cmd->get_option("--backend")->count() > 0;
      return finish(command_bench(bench));
    }
    if (*bisect_cmd || *fidelity_cmd || *table_cmd) {
      releases.worker_executable = self_executable();
      releases.out = &std::cout;
      if (*table_cmd) return finish(run::release_table(releases));
      return finish(*bisect_cmd ? run::bisect_releases(releases) : run::measure_fidelity(releases));
    }
    if (*explore_cmd) return finish(cli::command_explore(explore_flags, self_executable()));
    if (*validate_cmd) return finish(command_validate(validate_files));
    if (*explain_cmd) return command_explain(explain_files, explain_releases);
    if (*worker_cmd) return run::worker_main(worker);
  } catch (const Error& e) {
    std::cerr << "dmpcheck: " << e.what() << "\n";
    return finish(exit_status(e.kind()));
  } catch (const std::exception& e) {
    std::cerr << "dmpcheck: " << e.what() << "\n";
    return exit_status(ErrorKind::kInternal);
  }
  return 0;
}
