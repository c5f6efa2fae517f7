// Behaviour profiles: named sets of switches that reproduce what a TorchRec release did.  The
// DMP code reads the switches, never the names, so a new profile is one entry in the table in
// behaviour_profile.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dmpcheck::dmp {

struct BehaviourProfile {
  std::string name;
  std::string description;
  // After reset_parameters, copy every data-parallel table from rank 0 to all ranks (TorchRec
  // commit cc482f8a, first released in 0.8.0; issue #1739).  Off: each rank keeps what its own
  // RNG drew, and replicas differ unless every rank seeded identically.
  bool broadcast_data_parallel_tables_at_init = true;
  // Bucket cap of that broadcast.  0: one broadcast per table, as cc482f8a does.
  int64_t init_broadcast_bucket_cap_bytes = 25 * 1024 * 1024;
  // Backward through a model-parallel collective divides the gradient by world size, so a
  // shard sees the average over ranks (TorchRec's GRADIENT_DIVISION, issue #2251).
  bool divide_model_parallel_gradients_by_world_size = true;
  // Mean pooling of a row-sharded table divides each shard's partial sum by the number of the
  // bag's ids that shard holds, before the partials are summed (TorchRec #2362); the fix
  // divides the summed partials by the bag's full length.
  bool row_wise_mean_divides_by_local_length = false;
  // Computing the mean-pooling divisor overwrites, in place, the lengths of the sum-pooled
  // row-sharded features with 1 before the lengths all-to-all, so the lengths sent no longer
  // match the ids (TorchRec #2808, fixed by cloning the lengths).
  bool mean_divisor_mutates_lengths = false;
  // Row-sharded outputs cannot be reduced on Gloo: torchrec 0.6's row-wise output dist calls
  // reduce_scatter_base asynchronously, which Gloo's fallback refuses, so any row_wise or
  // table_row_wise table fails the run on Gloo (measured on 0.6.0; 0.8 and later run it).
  bool row_wise_fails_on_gloo = false;
  // TorchRec's stock EmbeddingBagCollectionSharder offers row_wise and table_row_wise for cuda
  // devices only, so a table constrained to them has no sharding type on CPU and planning fails
  // (TorchRec #1252; measured the same in 0.6.0 and 1.9.2).  Read where the reference runs on
  // Gloo (CPU); dmpcheck's TorchRec cells extend the sharder unless `torchrec: {sharder: stock}`.
  bool row_wise_offered_on_cpu = true;
  // Weights the user put into the unsharded model before DMP wraps it survive the wrap.  Off
  // (measured in 0.6.0 and 1.9.2, TorchRec #1165): sharding draws every table again, so user
  // weights must be loaded after the wrap or given as the table config's init_fn.
  bool wrap_keeps_weights_loaded_before_it = true;
  // The mean of a row-sharded table divides the summed partials by L + eps (float), not by L
  // (TorchRec >= 0.8 guards empty bags so).  0: divide by max(L, 1).
  double row_wise_mean_divisor_eps = 1e-6;
  // With a row-sharded mean table in the collection, TorchRec's mean-pooling callback divides
  // the *whole* pooled output by its divisor, and sets that divisor to 1 only for the
  // row-sharded sum features: every other feature (table_wise, column_wise, data_parallel, sum
  // or mean) is divided by its bag length + eps as well.  Measured in 0.8.0 and 1.9.2 (dmpcheck
  // found it; scenarios/regressions/unfiled-row-wise-mean-divides-other-tables.yaml).
  bool row_wise_mean_divides_other_features = false;
  // Exact optimizers sum a row's gradients first and update the row once.  Off: one update per
  // occurrence of the row in the batch, in turn (TorchRec #1298's inconsistency with plain
  // PyTorch on duplicate ids).
  bool deduplicate_row_gradients = true;
  // The DDP-like wrapper broadcasts rank 0's dense parameters when it wraps (DDP does).
  bool broadcast_dense_at_wrap = true;
  // The cap of the first gradient bucket once DDP rebuilds its buckets in backward order.  TorchRec
  // passes bucket_cap_mb=25; torch <= 2.4 (TorchRec 0.6-0.8) still gives the rebuilt first bucket
  // DDP's default 1 MiB, torch 2.14 (TorchRec 1.9) the 25 MiB asked for.  Where a bucket ends
  // decides which elements Gloo's ring adds in which order, so at world sizes above 2 it is
  // visible in the last bit of the dense weights.
  int64_t ddp_first_bucket_cap_bytes = 25 * 1024 * 1024;
  // Data-parallel tables get their optimizer step; off: their gradients are reduced but no
  // optimizer is attached to them (TorchRec's warning in #1739: "don't forget to apply
  // optimizer to DP tables").
  bool update_data_parallel_tables = true;
  // Data-parallel tables lose the optimizer given to apply_optimizer_in_backward (they use the
  // dense kernel): DDP averages their full dense gradient and the dense optimizer trains them,
  // every row, with torch.optim's semantics.  Measured in torchrec 0.6.0 and 1.9.2 alike.  Off:
  // the sparse (fused) optimizer updates their touched rows, as the scenario's optimizers say.
  bool data_parallel_tables_use_dense_optimizer = false;
  // TorchRec's planner counts the optimizer state in a shard's storage estimate, which orders
  // the tables it places.  Off (measured in 0.6.0-0.8.0): it reads tensor._optimizer_class,
  // which apply_optimizer_in_backward never sets, and counts none.
  bool planner_counts_optimizer_state = true;
  // Every rank plans for itself with its own tie-breaks instead of taking rank 0's plan.
  bool plan_on_every_rank = false;
  // A checkpoint names data-parallel tables' optimizer state the torch.optim way
  // ("<table>.weight.<state>") while sharded tables use the fused names ("<table>.<state>"), so
  // a resume under another plan silently starts that state from zero (TorchRec #2394).
  bool data_parallel_state_keys_differ = false;
  // Loading a checkpoint into a table whose sharding type changed fails, as loading a plain
  // tensor into a ShardedTensor did (TorchRec #1497, pytorch#79016).
  bool load_requires_same_sharding = false;
  // The dense side's rowwise_adagrad (torchrec.optim.RowWiseAdagrad) accumulates and applies each
  // row's mean gradient, mean(g)^2, instead of mean(g^2) and g (before 0.8.0, TorchRec PR #2015).
  bool dense_rowwise_adagrad_mean_gradient = false;
};

const std::vector<BehaviourProfile>& behaviour_profiles();
// nullptr when unknown.
const BehaviourProfile* find_behaviour_profile(const std::string& name);
// The profile that models a TorchRec release ("0.6.0" -> torchrec-0.6, "0.8.0" -> torchrec-0.8,
// "1.9.2" -> torchrec-1.9), for `reference: {profile: release}`.  Empty for a version it cannot read.
std::string profile_for_release(const std::string& version);
// The name a scenario gives to mean "the profile of the cell's release".
inline constexpr const char* kReleaseProfile = "release";
std::vector<std::string> behaviour_profile_names();

// How the profile's DMP broadcasts data-parallel tables at init: "coalesced", "one per table", or
// nullptr (not at all: TorchRec #1739).
const char* data_parallel_init_broadcast(const BehaviourProfile& profile);

// The switches by their field names, for scenarios (`profile: {base: torchrec-0.6, <switch>: v}`)
// and reports (every run records the values it ran with).
std::vector<std::string> behaviour_switch_names();
std::map<std::string, std::string> behaviour_switch_values(const BehaviourProfile& profile);
// Sets switch `name` from its text ("true"/"false", or a number); the error says what was
// expected, or that there is no such switch.
std::optional<std::string> set_behaviour_switch(BehaviourProfile& profile, const std::string& name,
                                                const std::string& value);

}  // namespace dmpcheck::dmp
