#include "dmp/behaviour_profile.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dmpcheck::dmp {

const std::vector<BehaviourProfile>& behaviour_profiles() {
  static const std::vector<BehaviourProfile> profiles = [] {
    std::vector<BehaviourProfile> all;
    BehaviourProfile old;
    old.name = "torchrec-0.6";
    old.description =
        "TorchRec 0.6/0.7: data-parallel tables are re-initialised by each rank's RNG in "
        "reset_parameters and never broadcast (issue #1739); the dense optimizer trains them; row_wise fails on Gloo; "
        "the dense side's RowWiseAdagrad applies each row's mean gradient (PR #2015)";
    old.broadcast_data_parallel_tables_at_init = false;
    old.data_parallel_tables_use_dense_optimizer = true;
    old.row_wise_fails_on_gloo = true;
    old.wrap_keeps_weights_loaded_before_it = false;
    old.ddp_first_bucket_cap_bytes = 1024 * 1024;  // torch 2.2 / 2.3
    old.planner_counts_optimizer_state = false;
    old.dense_rowwise_adagrad_mean_gradient = true;
    all.push_back(old);

    BehaviourProfile fix;
    fix.name = "torchrec-0.8";
    fix.description = "TorchRec 0.8 (commit cc482f8a): each data-parallel table is broadcast from rank 0 after "
                      "reset_parameters, one broadcast per table; the dense optimizer trains them";
    fix.init_broadcast_bucket_cap_bytes = 0;
    fix.data_parallel_tables_use_dense_optimizer = true;
    fix.wrap_keeps_weights_loaded_before_it = false;
    fix.row_wise_mean_divides_other_features = true;
    fix.ddp_first_bucket_cap_bytes = 1024 * 1024;  // torch 2.4
    fix.planner_counts_optimizer_state = false;
    all.push_back(fix);

    BehaviourProfile latest = fix;
    latest.name = "torchrec-1.9";
    latest.ddp_first_bucket_cap_bytes = 25 * 1024 * 1024;  // torch 2.14
    latest.planner_counts_optimizer_state = true;
    latest.description =
        "TorchRec 1.9 as measured against 1.9.2: data-parallel tables broadcast from rank 0 one by one, and "
        "trained by the dense optimizer after DDP averages their gradient (the in-backward optimizer is dropped)";
    all.push_back(latest);

    BehaviourProfile current;
    current.name = "current";
    current.description =
        "dmpcheck's reference of what the user asked for: data-parallel tables are broadcast from rank 0 "
        "after reset_parameters (25 MiB buckets) and trained by the sparse optimizer, like every table";
    all.push_back(current);

    auto variant = [&](const std::string& name, const std::string& description, auto&& set) {
      BehaviourProfile p;  // current, with one switch turned
      p.name = name;
      p.description = description;
      set(p);
      all.push_back(p);
    };
    variant("torchrec#2362", "row_wise mean pooling divides each shard's partial sum by the shard's share of the bag",
            [](BehaviourProfile& p) { p.row_wise_mean_divides_by_local_length = true; });
    variant("torchrec#2808",
            "the mean-pooling divisor overwrites the lengths of sum-pooled row_wise features before the all-to-all",
            [](BehaviourProfile& p) { p.mean_divisor_mutates_lengths = true; });
    variant("torchrec#1252",
            "the stock EBC sharder offers no row_wise or table_row_wise on CPU, so planning such a table fails",
            [](BehaviourProfile& p) { p.row_wise_offered_on_cpu = false; });
    variant("torchrec#1165", "weights loaded into the model before DMP wraps it are replaced by the wrap's own draw",
            [](BehaviourProfile& p) { p.wrap_keeps_weights_loaded_before_it = false; });
    variant("mean-divisor-divides-all",
            "beside a row-wise mean table, every other table's pooled embedding is divided by its bag length too",
            [](BehaviourProfile& p) { p.row_wise_mean_divides_other_features = true; });
    variant("torchrec#2251", "model-parallel gradients are not divided by world size (the other convention of #2251)",
            [](BehaviourProfile& p) { p.divide_model_parallel_gradients_by_world_size = false; });
    variant("torchrec#1298", "fused optimizers update a row once per occurrence instead of once per batch",
            [](BehaviourProfile& p) { p.deduplicate_row_gradients = false; });
    variant(
        "torchrec#2394",
        "checkpoints name data-parallel optimizer state the torch.optim way, so a resume under another plan drops it",
        [](BehaviourProfile& p) { p.data_parallel_state_keys_differ = true; });
    variant("torchrec#1497", "a checkpoint cannot be loaded into a table whose sharding type changed",
            [](BehaviourProfile& p) { p.load_requires_same_sharding = true; });
    variant("dense-not-broadcast", "the dense wrapper does not broadcast rank 0's parameters when it wraps",
            [](BehaviourProfile& p) { p.broadcast_dense_at_wrap = false; });
    variant("dp-tables-not-updated", "no optimizer is attached to data-parallel tables",
            [](BehaviourProfile& p) { p.update_data_parallel_tables = false; });
    variant("plan-per-rank", "every rank plans for itself, breaking ties its own way, instead of taking rank 0's plan",
            [](BehaviourProfile& p) { p.plan_on_every_rank = true; });

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

std::string profile_for_release(const std::string& version) {
  int major = -1, minor = -1;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2 || major < 0 || minor < 0) return {};
  if (major == 0 && minor < 8) return "torchrec-0.6";
  if (major == 0) return "torchrec-0.8";
  return "torchrec-1.9";
}

std::vector<std::string> behaviour_profile_names() {
  std::vector<std::string> names;
  for (const auto& profile : behaviour_profiles()) names.push_back(profile.name);
  return names;
}

const char* data_parallel_init_broadcast(const BehaviourProfile& profile) {
  if (!profile.broadcast_data_parallel_tables_at_init) return nullptr;
  return profile.init_broadcast_bucket_cap_bytes > 0 ? "coalesced" : "one per table";
}

namespace {

using Member = std::variant<bool BehaviourProfile::*, int64_t BehaviourProfile::*, double BehaviourProfile::*>;
#define DMPCHECK_SWITCH(field) \
  { #field, &BehaviourProfile::field }
const std::vector<std::pair<std::string, Member>> kSwitches = {
    DMPCHECK_SWITCH(broadcast_data_parallel_tables_at_init),
    DMPCHECK_SWITCH(init_broadcast_bucket_cap_bytes),
    DMPCHECK_SWITCH(divide_model_parallel_gradients_by_world_size),
    DMPCHECK_SWITCH(row_wise_mean_divides_by_local_length),
    DMPCHECK_SWITCH(mean_divisor_mutates_lengths),
    DMPCHECK_SWITCH(row_wise_fails_on_gloo),
    DMPCHECK_SWITCH(row_wise_offered_on_cpu),
    DMPCHECK_SWITCH(wrap_keeps_weights_loaded_before_it),
    DMPCHECK_SWITCH(row_wise_mean_divisor_eps),
    DMPCHECK_SWITCH(row_wise_mean_divides_other_features),
    DMPCHECK_SWITCH(deduplicate_row_gradients),
    DMPCHECK_SWITCH(broadcast_dense_at_wrap),
    DMPCHECK_SWITCH(ddp_first_bucket_cap_bytes),
    DMPCHECK_SWITCH(update_data_parallel_tables),
    DMPCHECK_SWITCH(data_parallel_tables_use_dense_optimizer),
    DMPCHECK_SWITCH(planner_counts_optimizer_state),
    DMPCHECK_SWITCH(plan_on_every_rank),
    DMPCHECK_SWITCH(data_parallel_state_keys_differ),
    DMPCHECK_SWITCH(load_requires_same_sharding),
    DMPCHECK_SWITCH(dense_rowwise_adagrad_mean_gradient),
};
#undef DMPCHECK_SWITCH

}  // namespace

std::vector<std::string> behaviour_switch_names() {
  std::vector<std::string> names;
  for (const auto& entry : kSwitches) names.push_back(entry.first);
  return names;
}

std::map<std::string, std::string> behaviour_switch_values(const BehaviourProfile& profile) {
  std::map<std::string, std::string> values;
  for (const auto& [name, member] : kSwitches) {
    values[name] = std::visit([&](auto m) { return fmt::format("{}", profile.*m); }, member);
  }
  return values;
}

std::optional<std::string> set_behaviour_switch(BehaviourProfile& profile, const std::string& name,
                                                const std::string& value) {
  for (const auto& [known, member] : kSwitches) {
    if (known != name) continue;
    if (auto* flag = std::get_if<bool BehaviourProfile::*>(&member)) {
      if (value != "true" && value != "false") return std::string("true or false");
      profile.** flag = value == "true";
      return std::nullopt;
    }
    char* end = nullptr;
    if (auto* bytes = std::get_if<int64_t BehaviourProfile::*>(&member)) {
      errno = 0;  // read as a whole number, not through a double, which rounds above 2^53
      const long long n = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 0 || errno == ERANGE)
        return std::string("a whole number of bytes, 0 or more");
      profile.** bytes = n;
      return std::nullopt;
    }
    const double number = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0') return std::string("a number");
    profile.*std::get<double BehaviourProfile::*>(member) = number;
    return std::nullopt;
  }
  return fmt::format("one of the switches {}", fmt::join(behaviour_switch_names(), ", "));
}

}  // namespace dmpcheck::dmp
