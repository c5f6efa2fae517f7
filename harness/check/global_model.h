// Global-model equivalence: the unsharded model, started from the sharded model's initial
// state and trained on the same global batches in one process, must track the sharded model.
// After every step each full tensor of the sharded model (weights and optimizer state,
// assembled from its shards) is compared with the unsharded model's.  The unsharded model is
// check::UnshardedModel: plain libtorch with autograd and optimizers written from their
// formulas, sharing no code with the DMP it judges.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/model_parallel.h"

namespace dmpcheck::check {

class UnshardedModel;

struct Tolerances {
  double rtol = 1e-5;
  double atol = 1e-6;
};

class GlobalModelTracker {
 public:
  // Not collective: runs wherever it is built (rank 0 in a run).
  GlobalModelTracker(const dmp::ModelConfig& model, const dmp::DmpOptions& options,
                     const std::map<std::string, at::Tensor>& initial_state, int64_t steps_done, Tolerances tolerances,
                     Tolerances output_tolerances = {});
  ~GlobalModelTracker();

  // Trains the unsharded model one step on `global_batch` and compares every tensor of
  // `sharded_state` (gather_full_state() after the same step) with it, and the step's forward
  // outputs (`sharded_outputs`, every rank's rows in rank order) with the unsharded forward's,
  // recorded at step - 1: the outputs at step s are computed from the weights after s steps.
  void step_and_compare(const dmp::KeyedJaggedTensor& global_batch,
                        const std::map<std::string, at::Tensor>& sharded_state,
                        const std::map<std::string, at::Tensor>& sharded_outputs, int step);
  // The forward alone (a run of zero steps): outputs compared at `step`.
  void forward_and_compare(const dmp::KeyedJaggedTensor& global_batch,
                           const std::map<std::string, at::Tensor>& sharded_outputs, int step);
  // Per tensor, the worst step seen so far.
  std::vector<GlobalModelCheck> results() const;

 private:
  std::unique_ptr<UnshardedModel> reference_;
  Tolerances tolerances_;
  Tolerances output_tolerances_;
  std::vector<GlobalModelCheck> results_;
};

// Every tensor of `sharded` against the unsharded model's tensor of that name at `step`, kept in
// `results` per tensor at its worst step (a tensor the unsharded model lacks is not comparable).
// The unsharded model is the reference's (GlobalModelTracker) or a release's own (torchrec_cell).
void compare_with_unsharded(std::vector<GlobalModelCheck>& results, const std::map<std::string, at::Tensor>& sharded,
                            const std::map<std::string, at::Tensor>& unsharded, int step, Tolerances tolerances,
                            const std::string& unsharded_label = "the unsharded model");

// Every tensor of `actual` against `expected`'s of that name, each element within its own bound
// (`bound`'s tensor of that name, as large): max_allowed_excess is max(|a - e| - bound), the note
// the worst |a - e| / bound.  A tensor one side lacks, or of another shape, is not comparable.
void compare_within_bound(std::vector<GlobalModelCheck>& results, const std::map<std::string, at::Tensor>& actual,
                          const std::map<std::string, at::Tensor>& expected,
                          const std::map<std::string, at::Tensor>& bound, int step, const std::string& expected_label);

// One tensor against another of the same name: max |a - b|, max relative difference (over
// elements where `expected` is not 0), elements not bitwise equal, and whether every
// |a - b| <= atol + rtol * |expected|.  Tensors of different shapes differ, with a note naming
// both shapes as `actual_label` and `expected_label` hold them.
ReferenceDiff diff_tensor(const std::string& name, const at::Tensor& actual, const at::Tensor& expected, int step,
                          double rtol, double atol, const std::string& actual_label, const std::string& expected_label);

// A tensor only one side holds: out of tolerance, with `note` saying which.
ReferenceDiff absent_tensor(const std::string& name, int step, int64_t numel, const std::string& note);

// Every tensor of `checkpoint` against the model's (`state`, full tensors), bitwise; a tensor
// the model lacks or holds in another shape is a difference with a note.
std::vector<ReferenceDiff> compare_with_checkpoint(const std::map<std::string, at::Tensor>& state,
                                                   const std::map<std::string, at::Tensor>& checkpoint);

}  // namespace dmpcheck::check
