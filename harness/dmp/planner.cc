#include "dmp/planner.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace dmpcheck::dmp {

const char* sharding_type_name(ShardingType type) {
  switch (type) {
    case ShardingType::kDataParallel: return "data_parallel";
    case ShardingType::kTableWise: return "table_wise";
  }
  return "unknown";
}

std::optional<ShardingType> parse_sharding_type(const std::string& name) {
  if (name == "data_parallel") return ShardingType::kDataParallel;
  if (name == "table_wise") return ShardingType::kTableWise;
  return std::nullopt;
}

std::vector<std::string> sharding_type_names() { return {"data_parallel", "table_wise"}; }

const TablePlan& ShardingPlan::of(const std::string& table) const {
  for (const auto& t : tables) {
    if (t.table == table) return t;
  }
  throw_error(ErrorKind::kInternal, fmt::format("the sharding plan has no table '{}'", table));
}

std::string ShardingPlan::describe() const {
  std::string text;
  for (const auto& t : tables) {
    text += fmt::format("{} {} ranks=[{}] bytes_per_rank={}\n", t.table, sharding_type_name(t.type),
                        fmt::join(t.ranks, ","), t.bytes_per_rank);
  }
  return text;
}

std::vector<int64_t> ShardingPlan::bytes_per_rank() const {
  std::vector<int64_t> bytes(static_cast<size_t>(world_size), 0);
  for (const auto& t : tables) {
    for (int r : t.ranks) bytes[static_cast<size_t>(r)] += t.bytes_per_rank;
  }
  return bytes;
}

ShardingPlan plan_sharding(const PlannerInput& input) {
  ShardingPlan plan;
  plan.world_size = input.world_size;
  std::vector<int> all_ranks(static_cast<size_t>(input.world_size));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);

  for (const auto& config : input.tables) {
    TablePlan t;
    t.table = config.name;
    t.bytes_per_rank = static_cast<int64_t>(static_cast<double>(config.bytes()) * (1.0 + input.optimizer_state_factor));
    auto it = input.constraints.find(config.name);
    const ShardingConstraints none;
    const ShardingConstraints& c = it == input.constraints.end() ? none : it->second;
    t.type = c.sharding_types.empty() ? ShardingType::kTableWise : c.sharding_types.front();
    for (int r : c.ranks) {
      DMP_CHECK(r >= 0 && r < input.world_size, ErrorKind::kInvalidScenario,
                "table '{}': constraint rank {} does not exist at world size {}", config.name, r,
                input.world_size);
    }
    if (t.type == ShardingType::kDataParallel) t.ranks = all_ranks;
    plan.tables.push_back(t);
  }

  // Place table_wise tables, largest first, on the least loaded allowed rank.
  std::vector<int64_t> load = plan.bytes_per_rank();
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.tables.size(); ++i) {
    if (plan.tables[i].type == ShardingType::kTableWise) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (plan.tables[a].bytes_per_rank != plan.tables[b].bytes_per_rank) {
      return plan.tables[a].bytes_per_rank > plan.tables[b].bytes_per_rank;
    }
    return plan.tables[a].table < plan.tables[b].table;
  });
  for (size_t i : order) {
    TablePlan& t = plan.tables[i];
    auto it = input.constraints.find(t.table);
    const std::vector<int>& allowed =
        (it == input.constraints.end() || it->second.ranks.empty()) ? all_ranks : it->second.ranks;
    int best = allowed.front();
    for (int r : allowed) {
      if (load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)] ||
          (load[static_cast<size_t>(r)] == load[static_cast<size_t>(best)] && r < best)) {
        best = r;
      }
    }
    t.ranks = {best};
    load[static_cast<size_t>(best)] += t.bytes_per_rank;
  }
  return plan;
}

}  // namespace dmpcheck::dmp
