#include "dmp/behaviour_profile.h"

namespace dmpcheck::dmp {

const std::vector<BehaviourProfile>& behaviour_profiles() {
  static const std::vector<BehaviourProfile> profiles = [] {
    std::vector<BehaviourProfile> all;
    BehaviourProfile old;
    old.name = "torchrec-0.6";
    old.description =
        "TorchRec 0.6/0.7: data-parallel tables are re-initialised by each rank's RNG in "
        "reset_parameters and never broadcast (issue #1739)";
    old.broadcast_data_parallel_tables_at_init = false;
    all.push_back(old);

    BehaviourProfile fix;
    fix.name = "torchrec-0.8";
    fix.description =
        "TorchRec 0.8 (commit cc482f8a): each data-parallel table is broadcast from rank 0 after "
        "reset_parameters, one broadcast per table";
    fix.init_broadcast_bucket_cap_bytes = 0;
    all.push_back(fix);

    BehaviourProfile current;
    current.name = "current";
    current.description =
        "dmpcheck's reference: data-parallel tables are broadcast from rank 0 after "
        "reset_parameters, coalesced into 25 MiB buckets";
    all.push_back(current);
    return all;
  }();
  return profiles;
}

const BehaviourProfile* find_behaviour_profile(const std::string& name) {
  for (const auto& profile : behaviour_profiles()) {
    if (profile.name == name) return &profile;
  }
  return nullptr;
}

std::vector<std::string> behaviour_profile_names() {
  std::vector<std::string> names;
  for (const auto& profile : behaviour_profiles()) names.push_back(profile.name);
  return names;
}

}  // namespace dmpcheck::dmp
