// Behaviour profiles: named sets of switches that reproduce what a TorchRec release did.  The
// DMP code reads the switches, never the names, so a new profile is one entry in the table in
// behaviour_profile.cc.
#pragma once

#include <cstdint>
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
  // Exact optimizers sum a row's gradients first and update the row once.  Off: one update per
  // occurrence of the row in the batch, in turn (TorchRec #1298's inconsistency with plain
  // PyTorch on duplicate ids).
  bool deduplicate_row_gradients = true;
  // The DDP-like wrapper broadcasts rank 0's dense parameters when it wraps (DDP does).
  bool broadcast_dense_at_wrap = true;
  // Data-parallel tables get their optimizer step; off: their gradients are reduced but no
  // optimizer is attached to them (TorchRec's warning in #1739: "don't forget to apply
  // optimizer to DP tables").
  bool update_data_parallel_tables = true;
  // Every rank plans for itself with its own tie-breaks instead of taking rank 0's plan.
  bool plan_on_every_rank = false;
  // A checkpoint names data-parallel tables' optimizer state the torch.optim way
  // ("<table>.weight.<state>") while sharded tables use the fused names ("<table>.<state>"), so
  // a resume under another plan silently starts that state from zero (TorchRec #2394).
  bool data_parallel_state_keys_differ = false;
  // Loading a checkpoint into a table whose sharding type changed fails, as loading a plain
  // tensor into a ShardedTensor did (TorchRec #1497, pytorch#79016).
  bool load_requires_same_sharding = false;
};

const std::vector<BehaviourProfile>& behaviour_profiles();
// nullptr when unknown.
const BehaviourProfile* find_behaviour_profile(const std::string& name);
std::vector<std::string> behaviour_profile_names();

}  // namespace dmpcheck::dmp
