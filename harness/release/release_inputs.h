// What passes between the release cell and the release's rank program, in the reference's terms:
// the run spec and every rank's batches going in (the contract's documents, run/release_contract.h),
// the plan and each rank's tensors coming back (run/tensor_exchange.h), and the checks made of them;
// and the release's own planner asked alone (explain --release).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "check/run_result.h"
#include "dmp/planner.h"
#include "run/release_contract.h"
#include "run/tensor_exchange.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

// The rank program's per-id outputs of a sequence table (models.py): "sequence_embeddings.<feature>".
inline constexpr const char* kSequenceOutputPrefix = "sequence_embeddings.";

struct TorchRecEnvironment;

// The environment a release or script cell of `spec` runs under, with `result`'s environment
// filled in; or nullopt with `result` ended before any rank starts: skipped where it is not
// installed (naming the install command), an error where it cannot work as given (an interpreter
// without TorchRec, a commit the repository lacks).
std::optional<TorchRecEnvironment> cell_environment(const scenario::RunSpec& spec, check::RunResult& result);

// The plan a release chose, as the reference's ShardingPlan in model order.
dmp::ShardingPlan release_plan(const scenario::RunSpec& spec, const std::vector<contract::PlanRow>& rows);

// The run as the rank program reads it: every field it needs, the seed rule applied per rank.
contract::RunSpec release_spec(const scenario::RunSpec& spec, contract::Start start);

// Every rank's local batch of steps first + 1 .. last, exactly what the reference trains on: each
// step's global batch split into `world` local batches of `batch_size` bags, in rank order (the
// run's own ranks, or a resumed run's).
void write_batches(const scenario::RunSpec& spec, const std::string& dir, int first, int last, int world,
                   int64_t batch_size);

// Each rank's pieces of `phase` under <out>/rank<r>.
std::vector<std::vector<ExchangePiece>> read_ranks(const std::string& out, int world_size, const std::string& phase);

// Every replicated tensor of rank 0, compared across the ranks.
std::vector<check::TensorCheck> replica_checks(const std::vector<std::vector<ExchangePiece>>& per_rank,
                                               scenario::Phase phase);

// TorchRec's full tensors against the reference's, each named on the side that lacks it.
std::vector<check::ReferenceDiff> compare_with_reference(const std::map<std::string, at::Tensor>& torchrec,
                                                         const std::map<std::string, at::Tensor>& reference, int step,
                                                         const scenario::Tolerance& tol);

// A release's plan, as a report records a plan.
std::vector<check::TablePlacement> placements_of(const std::vector<contract::PlanRow>& plan);

// The plan the release's own planner makes for `spec` (`python -m dmpcheck_torchrec.plan`: one
// process, no training), in the reference's terms.  `label` receives "torchrec X (torch Y)".
// Error(kInvalidInput) when the release is not installed or its planner fails, with its output.
dmp::ShardingPlan torchrec_planner_plan(const scenario::RunSpec& spec, const std::string& version, std::string* label);

}  // namespace dmpcheck::run
