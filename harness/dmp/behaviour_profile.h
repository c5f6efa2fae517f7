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
};

const std::vector<BehaviourProfile>& behaviour_profiles();
// nullptr when unknown.
const BehaviourProfile* find_behaviour_profile(const std::string& name);
std::vector<std::string> behaviour_profile_names();

}  // namespace dmpcheck::dmp
