#include "release/release_cell.h"
#include "release/release_cell_stages.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_io.h"
#include "common/settings.h"
#include "dmp/behaviour_profile.h"
#include "dmp/checkpoint.h"
#include "release/release_inputs.h"
#include "release/torchrec_systems.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/reference_cell.h"

namespace dmpcheck::run {

// What the report says of how a cell's ranks started.
static std::string how_ranks_started(const LaunchOutcome& launched, bool commit) {
  if (!launched.warm_interpreter)
    return "ranks started as fresh interpreters" +
           (launched.cold_reason.empty() ? std::string() : " (" + launched.cold_reason + ")");
  if (commit)
    return fmt::format("ranks forked from a warm interpreter of this environment that imported torch and fbgemm_gpu "
                       "once for the command (in {:.2f} s) and no TorchRec: each rank imports this commit's source",
                       launched.warm_import_s);
  return fmt::format("ranks forked from a warm interpreter of this environment (torch and torchrec imported once for "
                     "the command, in {:.2f} s)",
                     launched.warm_import_s);
}
namespace release_stages {

namespace fs = std::filesystem;

// The environment, the rank program and the inputs: the cell is skipped where its environment is
// not installed, and an error where it cannot work as given.
Ended ReleaseCell::prepare() {
  env_ = cell_environment(spec_, result_);
  if (!env_) return result_;
  if (!spec_.torchrec_hooks.empty()) {
    // A hook file that cannot run is said before any rank starts, with its lines.
    const auto errors = check_hook_file(*env_, fs::absolute(spec_.torchrec_hooks).string());
    if (!errors.empty())
      return error({-1, check::FailureKind::kHook, "no rank started", fmt::format("{}", fmt::join(errors, "\n")), {}});
  }
  if (auto note = spec_.data.variable_batch_note()) result_.system.notes.push_back(std::move(*note));
  const std::string sut = torchrec_sut_dir();
  DMP_CHECK(fs::exists(sut + "/dmpcheck_torchrec/rank.py"), ErrorKind::kInvalidInput,
            "the TorchRec rank program is not at {} (set DMPCHECK_TORCHREC_SUT to the torchrec_sut/ folder of "
            "dmpcheck's source)",
            sut);

  exchange_.emplace("dmpcheck-torchrec", settings().keep_exchange);
  out_ = exchange_->path() + "/out";
  reference_dir_ = exchange_->path() + "/reference";
  checkpoint_dir_ = exchange_->path() + "/checkpoint";
  resumed_dir_ = exchange_->path() + "/resumed";
  resumed_after_ = spec_.resume ? spec_.resume->after_step : spec_.steps + 1;
  resumed_run_ = spec_.resume ? scenario::resumed_run(spec_) : spec_;
  // A run of zero steps that compares outputs (or quantizes) runs the forward alone, on the first batch.
  const bool forwards = spec_.expect.outputs || spec_.expect.quantized || spec_.expect.quantized_sharded;
  write_batches(spec_, exchange_->path() + "/batches", 0, forwards ? std::max(spec_.steps, 1) : spec_.steps,
                spec_.world_size, spec_.batch_size);
  return std::nullopt;
}

// The reference half of a side-by-side comparison, on the release's plan when `plan` is not empty.
Ended ReleaseCell::reference_half(const std::string& plan) {
  ScenarioRunOptions ref_options = options_;
  ref_options.write_reports = false;
  ReferenceHalf half{reference_dir_, spec_.expect.reference_profile, !spec_.expect.reference_draws_own_init, plan,
                     spec_.expect.reference_switches};
  if (half.profile == dmp::kReleaseProfile) {
    // A commit is modelled as the release it runs over; an interpreter as the torchrec it imports.
    const std::string modelled = !env_->base_release.empty() ? env_->base_release : env_->torchrec;
    half.profile = dmp::profile_for_release(modelled);
    DMP_CHECK(!half.profile.empty(), ErrorKind::kInvalidScenario, "{}: no behaviour profile models torchrec {}",
              scenario_.name, modelled);
  }
  const check::RunResult ref = run_reference_cell(scenario_, index_, ref_options, half);
  result_.system.notes.push_back(fmt::format(
      "compared with the reference DMP under profile '{}{}'{}",
      half.profile.empty() ? spec_.profile.name : half.profile, spec_.expect.switches_text(),
      plan.empty() ? "" : ", on the release's own plan, each side drawing its initial weights from the seed"));
  if (!ref.failure) return std::nullopt;
  check::RankFailure failure = *ref.failure;
  failure.message = "the reference half of the comparison failed: " + failure.message;
  return error(failure);
}

// What the release starts from, and the run spec.  `start: reference` (the default): the reference
// half runs first and TorchRec starts from its initial weights.  `start: seed`: TorchRec runs first
// and draws its own; the reference then runs on TorchRec's plan (run()), so both draw the same
// shards on the same ranks and step 0 compares the draws.  `init.from`: the user's weights (a
// release loads weights, not a checkpoint's optimizer state), handed over as whole tensors; the
// rank loads them before or after the wrap as init.load says.
Ended ReleaseCell::start() {
  contract::Start start;  // the release draws its own weights unless one of the two below
  if (spec_.expect.reference && !spec_.expect.reference_draws_own_init) {
    if (auto ended = reference_half("")) return ended;
    start = {"reference", reference_dir_ + "/" + contract::phase_init() + ".json", ""};
  }
  if (!spec_.init.from.empty()) {
    for (const auto& [name, t] : dmp::load_checkpoint(spec_.init.from).tensors) {
      const bool weight = name.size() > 7 && (name.compare(name.size() - 7, 7, ".weight") == 0 ||
                                              name.compare(name.size() - 5, 5, ".bias") == 0);
      if (weight) user_weights_[name] = t;
    }
    write_exchange_phase(exchange_->path(), contract::phase_user_weights(), whole_pieces(user_weights_));
    start = {"user_weights", exchange_->path() + "/" + contract::phase_user_weights() + ".json", ""};
  }
  contract::RunSpec document = release_spec(spec_, start);
  if (spec_.resume) document.checkpoint = {spec_.resume->after_step, checkpoint_dir_};
  report::write_text_file_atomically(exchange_->path() + "/spec.json", nlohmann::json(document).dump(2));
  return std::nullopt;
}

// One launch of the rank program over `exchange_dir` (spec.json, batches/) on `run`'s ranks.
Ended ReleaseCell::launch(const scenario::RunSpec& run, const std::string& exchange_dir, const std::string& label) {
  LaunchRequest request = torchrec_launch(*env_, {"-m", "dmpcheck_torchrec.rank", exchange_dir}, exchange_dir + "/out");
  // The rendezvous is a file in the launch's own private directory (no port to connect to, as
  // dmpcheck's own ranks), and Gloo's pairs listen on loopback: a release cell runs on one host.
  request.launch_environment["DMPCHECK_RENDEZVOUS_FILE"] = exchange_dir + "/rendezvous";
  // An exec-ed rank's temporary files (torch's among them) go with the exchange directory.
  request.launch_environment["TMPDIR"] = exchange_dir + "/tmp";
  fs::create_directory(exchange_dir + "/tmp");
  request.world_size = run.world_size;
  request.local_world_size = run.local_world_size;
  request.threads_per_rank = threads_per_rank(run, available_cores());
  request.exec_ranks = options_.exec_ranks;
  set_cell_budget_and_echo(run, options_, spec_.system.name() + label + " ", request);
  const LaunchOutcome launched = run::launch(request);
  launched_seconds_ += launched.seconds;
  result_.stray_processes.insert(result_.stray_processes.end(), launched.strays.begin(), launched.strays.end());
  if (label.empty()) {
    warm_ranks_ = launched.warm_interpreter;
    result_.system.notes.push_back(how_ranks_started(launched, spec_.system.kind == scenario::System::Kind::kCommit));
  }
  if (launched.ok) return std::nullopt;
  check::RunResult failed = failed_result(scenario_, spec_, launched);
  if (failed.failure && !label.empty()) failed.failure->message = label.substr(1) + ": " + failed.failure->message;
  failed.system = result_.system;
  failed.environment = result_.environment;
  failed.timings.total_s = launched_seconds_;
  failed.stray_processes = result_.stray_processes;
  return failed;
}

// `resume`: the first launch saved its checkpoint after resume.after_step and trained on,
// uninterrupted.  A fresh set of resume.world_size ranks now builds the model under resume's plan,
// loads that checkpoint through torch.distributed.checkpoint and trains the remaining steps on the
// same global batches (each split among its ranks).
Ended ReleaseCell::resume() {
  if (!spec_.resume) return std::nullopt;
  resumed_run_.expect.global_model.reset();  // the oracle trained uninterrupted, in the first run
  write_batches(spec_, resumed_dir_ + "/batches", resumed_after_,
                spec_.expect.outputs ? std::max(spec_.steps, 1) : spec_.steps, resumed_run_.world_size,
                resumed_run_.batch_size);
  contract::RunSpec second = release_spec(resumed_run_, {"checkpoint", checkpoint_dir_, ""});
  second.first_step = resumed_after_;
  report::write_text_file_atomically(resumed_dir_ + "/spec.json", nlohmann::json(second).dump(2));
  return launch(resumed_run_, resumed_dir_,
                fmt::format(" the resumed run ({} ranks, from the checkpoint after step {})", resumed_run_.world_size,
                            resumed_after_));
}

// What the ranks said of themselves: versions, notes, plan, losses, loops.  Ends the cell where a
// release's environment imported another release (a folder renamed, a marker copied): never a
// verdict on the wrong release.
Ended ReleaseCell::read_results(const contract::RunMeta& meta) {
  // A commit's cell must have imported the commit's source, not the release's own package.
  if (!env_->source_dir.empty()) {
    std::error_code ec;
    const auto wanted = fs::weakly_canonical(env_->source_dir + "/torchrec", ec);
    const auto got = fs::weakly_canonical(meta.versions.torchrec_source, ec);
    DMP_CHECK(wanted == got, ErrorKind::kRankFailed,
              "{}: the ranks imported torchrec from {}, not from the commit's source {}", spec_.system.name(),
              meta.versions.torchrec_source, wanted.string());
  }
  if (spec_.system.kind == scenario::System::Kind::kRelease && env_->source_dir.empty() &&
      meta.versions.torchrec != spec_.system.version) {
    return error({-1,
                  check::FailureKind::kEnvironment,
                  "the ranks imported another release",
                  fmt::format("{}'s environment {} imports torchrec {}, not {}: remove it and install it again (`bash "
                              "ci/torchrec-env.sh`)",
                              spec_.system.name(), env_->dir, meta.versions.torchrec, spec_.system.version),
                  {}});
  }
  // What the ranks imported, not what the environment's marker says it holds.
  result_.environment.libtorch_version = "torch " + meta.versions.torch;
  result_.system.torchrec = env_->source_dir.empty() ? meta.versions.torchrec : env_->describe();
  result_.system.torch = meta.versions.torch;
  result_.system.fbgemm_gpu = meta.versions.fbgemm_gpu;
  result_.system.notes.insert(result_.system.notes.end(), meta.notes.begin(), meta.notes.end());
  result_.plan = placements_of(meta.plan);
  result_.losses = meta.losses;
  for (const auto& o : meta.observed) result_.observed.push_back({o.rank, o.point, o.step, o.name, o.kind, o.value});
  if (spec_.resume) {
    const auto second = contract::read_document_file<contract::RunMeta>(resumed_dir_ + "/out/meta.json");
    result_.losses.resize(std::min<size_t>(result_.losses.size(), resumed_after_));
    result_.losses.insert(result_.losses.end(), second.losses.begin(), second.losses.end());
    result_.resumed_plan = placements_of(second.plan);
    std::vector<std::string> placed;
    for (const auto& t : second.plan) placed.push_back(t.table + " " + t.sharding);
    result_.system.notes.push_back(fmt::format(
        "saved through torch.distributed.checkpoint after step {} on {} ranks; resumed on {} ranks under the "
        "release's plan {}",
        resumed_after_, spec_.world_size, resumed_run_.world_size, fmt::join(placed, ", ")));
    for (const auto& n : second.notes) result_.system.notes.push_back("resumed run: " + n);
  }
  result_.loop = spec_.torchrec_loop;
  for (const auto& l : meta.loops) result_.loops.push_back({l.rank, l.batches, l.next_after_exhausted, l.eval_batches});
  if (spec_.torchrec_loop != "plain" || spec_.torchrec_epochs > 1 || !spec_.torchrec_eval_batches.empty()) {
    std::vector<std::string> ranks;
    for (const auto& l : meta.loops) {
      ranks.push_back(fmt::format(
          "rank {}: [{}]{}{}", l.rank, fmt::join(l.batches, ", "),
          l.eval_batches.empty() ? "" : fmt::format(", eval [{}]", fmt::join(l.eval_batches, ", ")),
          l.next_after_exhausted ? fmt::format(", next() on its exhausted iterator {}x", l.next_after_exhausted) : ""));
    }
    result_.system.notes.push_back(fmt::format("loop {}, {} epoch(s); batches executed per epoch: {}",
                                               spec_.torchrec_loop, spec_.torchrec_epochs, fmt::join(ranks, "; ")));
  }
  return std::nullopt;
}

// How long the ranks took to import, plan and train (noted after the loop's judgement, as before).
void ReleaseCell::read_timings(const contract::RunMeta& meta) {
  result_.timings.init_s = meta.timings.import_s + meta.timings.init_s;
  result_.timings.train_s = meta.timings.train_s;
  result_.system.notes.push_back(
      fmt::format("import torch + torchrec took {:.2f} s on rank 0{}, TorchRec's planner {:.2f} s",
                  meta.timings.import_s, warm_ranks_ ? " (already imported)" : "", meta.timings.plan_s));
}

// The steps the cell is judged on.  A loop that stopped early (its pipeline saw no more data)
// trained fewer steps than the scenario has.  Only where the expectation names exactly that
// shortfall (loop.batches per epoch, a run of full epochs then nothing) is the cell judged on the
// steps it trained, with a note; any other shortfall is this cell's error, never a pass on fewer steps.
int ReleaseCell::judge_loop(const contract::RunMeta& meta) {
  const auto& expected = spec_.expect.loop_batches_per_epoch;
  int64_t expected_steps = 0;
  bool prefix = !expected.empty();
  for (size_t e = 0; e < expected.size(); ++e) {
    expected_steps += expected[e];
    const int64_t full = spec_.steps / spec_.torchrec_epochs;
    if (e > 0 && expected[e] != 0 && expected[e - 1] != full) prefix = false;
  }
  int64_t least = spec_.steps;
  std::vector<std::string> trained_by;
  for (const auto& l : meta.loops) {
    int64_t trained = 0;
    for (const auto b : l.batches) trained += b;
    least = std::min(least, trained);
    trained_by.push_back(fmt::format("rank {}: [{}]", l.rank, fmt::join(l.batches, ", ")));
  }
  if (least >= spec_.steps || spec_.resume) return spec_.steps;
  bool as_expected = prefix && expected_steps > 0 && expected_steps < spec_.steps;
  for (const auto& l : meta.loops) as_expected = as_expected && l.batches == expected;
  DMP_CHECK(as_expected, ErrorKind::kRankFailed,
            "the loop trained {} of the scenario's {} steps (batches per epoch: {}); a loop expected to stop "
            "early names its batches per epoch in loop.batches",
            least, spec_.steps, fmt::join(trained_by, "; "));
  const int steps = static_cast<int>(expected_steps);
  result_.system.notes.push_back(fmt::format(
      "the loop trained {} of the scenario's {} steps, as loop.batches expects: the cell is judged on those {}", steps,
      spec_.steps, steps));
  return steps;
}

// An error while reading and judging what the ranks wrote.  The contract's and the exchange's
// readers say kRankFailed for what the release wrote that cannot be read: the release's output is
// incomplete.  Any other kind is dmpcheck's own (an invariant of ours, a scenario it cannot judge),
// said as such and never blamed on the release.
check::RunResult ReleaseCell::judging_failed(const Error& e) {
  return error(e.kind() == ErrorKind::kRankFailed
                   ? check::RankFailure{0,
                                        check::FailureKind::kTorchRec,
                                        "the ranks exited 0 but their output is incomplete",
                                        e.what(),
                                        {}}
                   : check::RankFailure{-1,
                                        check::failure_kind_of(e.kind()),
                                        "dmpcheck failed while judging the release's output",
                                        e.what(),
                                        {}});
}

}  // namespace release_stages

void ReleaseCellKind::before_cells(const std::vector<const scenario::RunSpec*>& specs,
                                   const ScenarioRunOptions& options) const {
  std::vector<scenario::System> systems;
  for (const auto* spec : specs) systems.push_back(spec->system);
  require_torchrec_repository_for(systems);
  prestart_release_interpreters(systems, options.exec_ranks);
}

check::RunResult ReleaseCellKind::run(const scenario::Scenario& scenario, size_t index,
                                      const ScenarioRunOptions& options) const {
  return release_stages::ReleaseCell(scenario, index, options).run();
}

}  // namespace dmpcheck::run
