// The sharding planner: tables + topology + per-table constraints -> a plan saying, for each
// table, its sharding type and the ranks that hold it.  Deterministic: every rank computing it
// from the same input gets the same plan, and the harness verifies that they did.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dmp/embedding_config.h"

namespace dmpcheck::dmp {

enum class ShardingType { kDataParallel, kTableWise };

const char* sharding_type_name(ShardingType type);
std::optional<ShardingType> parse_sharding_type(const std::string& name);
std::vector<std::string> sharding_type_names();

struct ShardingConstraints {
  // Allowed types in order of preference; empty means the planner's default (table_wise).
  std::vector<ShardingType> sharding_types;
  // Ranks a table_wise table may be placed on; empty means any.
  std::vector<int> ranks;
};

struct TablePlan {
  std::string table;
  ShardingType type = ShardingType::kTableWise;
  std::vector<int> ranks;    // data_parallel: every rank; table_wise: the owner
  int64_t bytes_per_rank = 0;  // weights plus optimizer state on each rank that holds it
};

struct ShardingPlan {
  int world_size = 1;
  std::vector<TablePlan> tables;  // in the order of the model's tables

  const TablePlan& of(const std::string& table) const;
  // One line per table; the same text on every rank for the same plan.
  std::string describe() const;
  std::vector<int64_t> bytes_per_rank() const;
};

struct PlannerInput {
  std::vector<EmbeddingBagConfig> tables;
  std::map<std::string, ShardingConstraints> constraints;  // by table name
  int world_size = 1;
  // Optimizer state per weight byte (Adagrad 1, SGD 0), counted in the balance.
  double optimizer_state_factor = 0.0;
};

// Greedy balance of bytes per rank: table_wise tables, largest first (ties by name), each to the
// allowed rank holding the fewest bytes (ties to the lowest rank).  Error(kInvalidScenario)
// names the table when a constraint cannot be met.
ShardingPlan plan_sharding(const PlannerInput& input);

}  // namespace dmpcheck::dmp
