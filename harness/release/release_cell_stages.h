// The release cell's stages (release_cell.cc runs them; release_judging.cc holds those that
// compare what the ranks wrote): internal to the release layer, included by those two files only.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "check/expectations.h"
#include "check/run_result.h"
#include "common/error.h"
#include "common/file_io.h"
#include "release/release_inputs.h"
#include "release/torchrec_systems.h"
#include "run/cell.h"
#include "run/rank_run.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"
#include "scenario/scenario.h"

namespace dmpcheck::run::release_stages {

using Tensors = std::map<std::string, at::Tensor>;
// A stage that ends the cell early returns its RunResult (a skip, an error, a failed launch).
using Ended = std::optional<check::RunResult>;

// One release cell, stage by stage: prepare the environment and the inputs, run the reference half
// (before the release, or after it on its plan), launch the ranks (and the resumed run), then read
// what they wrote and judge it.  Errors while reading and judging are mapped in one place
// (judging_failed): what the release wrote that cannot be read is the release's; anything else is
// dmpcheck's own, named so, never blamed on the release.
class ReleaseCell {
 public:
  ReleaseCell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options)
      : scenario_(scenario),
        index_(index),
        options_(options),
        spec_(scenario.runs.at(index)),
        result_(result_header(scenario, spec_)) {}

  check::RunResult run() {
    if (auto ended = prepare()) return *ended;
    if (auto ended = start()) return *ended;
    if (auto ended = launch(spec_, exchange_->path(), "")) return *ended;
    if (auto ended = resume()) return *ended;
    try {
      const auto meta = contract::read_document_file<contract::RunMeta>(out_ + "/meta.json");
      if (spec_.expect.reference && spec_.expect.reference_draws_own_init) {
        if (auto ended = reference_half(release_plan(spec_, meta.plan).serialize())) return *ended;
      }
      if (auto ended = read_results(meta)) return *ended;
      const int steps = judge_loop(meta);
      read_timings(meta);
      const Tensors final_state = compare_phases(steps);
      compare_quantized(steps, final_state);
      finish(steps, final_state);
    } catch (const Error& e) { return judging_failed(e); }
    result_.timings.total_s = launched_seconds_;
    result_.expectation = check::evaluate_expectation(spec_.expect, result_);
    result_.verdict = result_.expectation.held ? check::Verdict::kPass : check::Verdict::kFail;
    return result_;
  }

 private:
  Ended prepare();
  Ended reference_half(const std::string& plan);
  Ended start();
  Ended launch(const scenario::RunSpec& run, const std::string& exchange_dir, const std::string& label);
  Ended resume();
  Ended read_results(const contract::RunMeta& meta);
  int judge_loop(const contract::RunMeta& meta);
  void read_timings(const contract::RunMeta& meta);
  Tensors compare_phases(int steps);
  void compare_resumed(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step);
  void compare(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step,
               const scenario::Tolerance& tol);
  void compare_unsharded(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step,
                         const scenario::Tolerance& tol);
  void compare_quantized(int steps, const Tensors& final_state);
  void finish(int steps, const Tensors& final_state);
  check::RunResult judging_failed(const Error& e);
  // The cell so far, ended as an error by `failure`.
  check::RunResult error(check::RankFailure failure) {
    result_.verdict = check::Verdict::kError;
    result_.failure = std::move(failure);
    return result_;
  }

  // Where each phase's tensors are: the resumed run's from the step it resumed after on.
  std::vector<std::vector<ExchangePiece>> ranks_of(int step, const std::string& phase) const {
    return step >= resumed_after_ && phase != contract::phase_init()
               ? read_ranks(resumed_dir_ + "/out", resumed_run_.world_size, phase)
               : read_ranks(out_, spec_.world_size, phase);
  }

  const scenario::Scenario& scenario_;
  const size_t index_;
  const ScenarioRunOptions& options_;
  const scenario::RunSpec& spec_;
  check::RunResult result_;
  std::optional<TorchRecEnvironment> env_;
  std::optional<PrivateDir> exchange_;
  std::string out_, reference_dir_, checkpoint_dir_, resumed_dir_;
  Tensors user_weights_;
  bool warm_ranks_ = false;  // the first run's ranks forked from a warm interpreter (torchrec already imported)
  double launched_seconds_ = 0;
  int resumed_after_ = 0;
  scenario::RunSpec resumed_run_;
  std::chrono::steady_clock::time_point check_start_;
  bool sequence_note_given_ = false;
};

}  // namespace dmpcheck::run::release_stages
