// The release cell's judging stages: what the ranks wrote, phase by phase, against each other, the
// reference, the release's own unsharded model, the run that was never interrupted, and the quantized
// models (the stages that run the cell are in release_cell.cc).
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "check/global_model.h"
#include "check/quantized_lookup.h"
#include "check/replica_check.h"
#include "release/release_cell_stages.h"
#include "run/data_generator.h"
#include "run/rank_run.h"

namespace dmpcheck::run::release_stages {

// TorchRec's tensors of `phase` against the reference's; the earliest step that breaks `tol` is kept.
void ReleaseCell::compare(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase, int step,
                          const scenario::Tolerance& tol) {
  auto theirs = assemble_full(per_rank);
  const auto ours = assemble_full({read_exchange_phase(reference_dir_, phase)});
  // Each id's row of a sequence table: the reference models the table by its bag sums
  // (pooled_embeddings.<feature>, compared), so these are held against the unsharded model only.
  const auto sequence = [](const auto& entry) { return entry.first.rfind(kSequenceOutputPrefix, 0) == 0; };
  if (!sequence_note_given_ && std::any_of(theirs.begin(), theirs.end(), sequence)) {
    result_.system.notes.push_back(
        spec_.expect.global_model
            ? "each id's row of a sequence table (sequence_embeddings.*) is compared with the release's own "
              "unsharded model (global_model) only: the reference models a sequence table by its bag sums"
            : "each id's row of a sequence table (sequence_embeddings.*) is not compared: the reference models "
              "a sequence table by its bag sums (global_model compares them with the release's own unsharded "
              "model)");
    sequence_note_given_ = true;
  }
  for (auto it = theirs.begin(); it != theirs.end();) it = sequence(*it) ? theirs.erase(it) : std::next(it);
  for (auto& d : compare_with_reference(theirs, ours, step, tol)) {
    if (!d.within_tolerance && (result_.reference_first_break_step < 0 || step < result_.reference_first_break_step))
      result_.reference_first_break_step = step;
    result_.reference.push_back(std::move(d));
  }
}

// TorchRec's sharded tensors against its own unsharded model's (the oracle on the release, rank 0's
// out/unsharded), each tensor kept at its worst step.
void ReleaseCell::compare_unsharded(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase,
                                    int step, const scenario::Tolerance& tol) {
  check::compare_with_unsharded(result_.global_model, assemble_full(per_rank),
                                assemble_full({read_exchange_phase(out_ + "/unsharded", phase)}), step,
                                {tol.rtol, tol.atol});
}

// The resumed run's tensors of `phase` against the run that was never interrupted.
void ReleaseCell::compare_resumed(const std::vector<std::vector<ExchangePiece>>& per_rank, const std::string& phase,
                                  int step) {
  const auto resumed = assemble_full(per_rank);
  const auto uninterrupted = assemble_full(read_ranks(out_, spec_.world_size, phase));
  const auto tol = spec_.expect.resumed ? *spec_.expect.resumed : scenario::Tolerance{};
  check::compare_with_unsharded(result_.resumed, resumed, uninterrupted, step, {tol.rtol, tol.atol},
                                "the uninterrupted run");
  for (const auto& [name, t] : uninterrupted) {
    const std::string& key = name;
    if (resumed.count(name) || std::any_of(result_.resumed.begin(), result_.resumed.end(),
                                           [&](const check::GlobalModelCheck& c) { return c.name == key; }))
      continue;
    check::GlobalModelCheck lost;
    lost.name = name;
    lost.step = step;
    lost.within_tolerance = lost.comparable = false;
    lost.one_sided = true;
    lost.numel = t.numel();
    lost.note = "only in the uninterrupted run: the resumed run holds no such tensor";
    result_.resumed.push_back(lost);
  }
}

// Every phase the ranks wrote, step by step: the replicas across ranks, the reference, the
// unsharded model, the resumed run; then the forward's outputs.  Returns every full tensor after
// the last step.
Tensors ReleaseCell::compare_phases(int steps) {
  check_start_ = std::chrono::steady_clock::now();
  std::vector<std::vector<ExchangePiece>> last;
  for (int step = 0; step <= steps; ++step) {
    const std::string phase = contract::phase_after(step);
    auto per_rank = ranks_of(step, phase);
    if (spec_.resume && step >= resumed_after_) compare_resumed(per_rank, phase, step);
    const bool final_phase = step == steps;
    const auto checks = replica_checks(per_rank, step == 0     ? scenario::Phase::kInit
                                                 : final_phase ? scenario::Phase::kFinal
                                                               : scenario::Phase::kStep);
    result_.divergence.push_back(check::step_divergence(step, checks));
    if (step == 0) result_.replicas = checks;
    if (final_phase && step > 0) result_.replicas.insert(result_.replicas.end(), checks.begin(), checks.end());
    if (spec_.expect.reference) compare(per_rank, phase, step, *spec_.expect.reference);
    if (spec_.expect.global_model && step > 0) compare_unsharded(per_rank, phase, step, *spec_.expect.global_model);
    if (final_phase) last = std::move(per_rank);
  }
  // The forward's outputs, from step 0 (the forward of step s + 1, on the weights after s steps).
  for (int step = 0; spec_.expect.outputs && step < std::max(steps, 1); ++step) {
    const std::string phase = contract::phase_outputs(step);
    const auto per_rank = ranks_of(step, phase);
    if (spec_.expect.reference) compare(per_rank, phase, step, *spec_.expect.outputs);
    if (spec_.expect.global_model) compare_unsharded(per_rank, phase, step, *spec_.expect.outputs);
  }
  if (steps == 0) {  // nothing trained: the final state is the initial one
    const auto again = replica_checks(last, scenario::Phase::kFinal);
    result_.replicas.insert(result_.replicas.end(), again.begin(), again.end());
  }
  return assemble_full(last);
}

// The trained model quantized (rank 0's out/quantized): on the first batch, against the float model
// within each element's bound, against the reference's quantized lookup, and sharded for inference
// against unsharded.
void ReleaseCell::compare_quantized(int steps, const Tensors& final_state) {
  if (!spec_.expect.quantized && !spec_.expect.quantized_sharded) return;
  const auto phase = [&](const std::string& who) {
    return assemble_full({read_exchange_phase(out_ + "/quantized/" + who, contract::phase_outputs(0))});
  };
  const auto quantized = phase("unsharded");
  if (spec_.expect.quantized) {
    check::compare_within_bound(result_.quantized, quantized, phase("float"), phase("bound"), steps, "the float model");
    result_.quantized_compared = true;
  }
  // The reference's quantized lookup on the release's trained weights and the same batch (a
  // variable batch goes to the release as rank 0's local batch: not compared).
  if (!spec_.data.variable_batch()) {
    const auto ours = check::quantized_pooled(spec_, final_state, make_global_batch(spec_, 0));
    for (const auto& [name, theirs] : quantized) {
      const auto it = ours.find(name);
      result_.quantized_reference.push_back(
          it == ours.end()
              ? check::absent_tensor(name, steps, theirs.numel(), "the reference has no such output")
              : check::diff_tensor(name, theirs, it->second, steps, 0.0, 0.0, "the release's", "the reference's"));
    }
    result_.quantized_reference_compared = true;
  }
  if (spec_.expect.quantized_sharded) {
    const auto& tol = *spec_.expect.quantized_sharded;
    check::compare_with_unsharded(result_.quantized_sharded, phase("sharded"), quantized, steps, {tol.rtol, tol.atol},
                                  "the unsharded quantized model");
    result_.quantized_sharded_compared = true;
  }
}

// What was compared, init.from against the user's weights, and the final state's digests.
void ReleaseCell::finish(int /*steps*/, const Tensors& final_state) {
  result_.reference_compared = spec_.expect.reference.has_value();
  result_.global_model_checked = spec_.expect.global_model.has_value();
  result_.resumed_compared = spec_.resume.has_value();
  result_.resumed_world_size = spec_.resume ? resumed_run_.world_size : 0;
  if (spec_.expect.initial_state) {
    result_.init_from = check::compare_with_checkpoint(
        assemble_full(read_ranks(out_, spec_.world_size, contract::phase_init())), user_weights_);
    result_.init_from_compared = true;
  }
  for (const auto& [name, tensor] : final_state) result_.digests[name] = tensor_digest(tensor);
  result_.timings.check_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - check_start_).count();
}

}  // namespace dmpcheck::run::release_stages
