// The sharding planner: tables + topology + per-table constraints -> a plan saying, for each
// table, its sharding type and its shards (which rank holds which rows and columns).
// Deterministic: the same input gives the same plan.  In a run, rank 0 plans and broadcasts the
// plan (as TorchRec's collective_plan does) and the harness verifies every rank holds it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dmp/embedding_config.h"

namespace dmpcheck::dmp {

enum class ShardingType { kDataParallel, kTableWise, kRowWise, kColumnWise, kTableRowWise };

const char* sharding_type_name(ShardingType type);
std::optional<ShardingType> parse_sharding_type(const std::string& name);
std::vector<std::string> sharding_type_names();

struct ShardingConstraints {
  // Allowed types in order of preference; empty means the planner's default (table_wise).
  std::vector<ShardingType> sharding_types;
  // Ranks the table's shards may be placed on; empty means any.
  std::vector<int> ranks;
  // column_wise: how many column shards (must divide the dim); 0 means the default rule.
  int column_shards = 0;
};

struct Topology {
  int world_size = 1;
  int local_world_size = 1;       // ranks per host; world_size must be a multiple
  int64_t memory_per_rank = 0;    // bytes of weights + optimizer state a rank may hold; 0: no limit
};

// One block of a table: rows [row_offset, row_offset + rows) and columns
// [col_offset, col_offset + cols), held by `rank`.  A row_wise shard may have zero rows.
struct Shard {
  int rank = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
  int64_t bytes = 0;  // weights + optimizer state
};

struct TablePlan {
  std::string table;
  ShardingType type = ShardingType::kTableWise;
  std::vector<Shard> shards;  // data_parallel: one full replica per rank
  std::vector<int> ranks() const;  // distinct ranks holding a shard, ascending
};

struct ShardingPlan {
  Topology topology;
  std::vector<TablePlan> tables;  // in the order of the model's tables

  const TablePlan& of(const std::string& table) const;
  std::vector<int64_t> bytes_per_rank() const;
  // One line per shard; the same text for the same plan.  Also the plan's wire format.
  std::string serialize() const;
  static ShardingPlan deserialize(const std::string& text);
};

struct PlannerInput {
  std::vector<EmbeddingBagConfig> tables;
  std::map<std::string, ShardingConstraints> constraints;  // by table name
  Topology topology;
  // Optimizer state bytes for a shard of rows x cols (Adagrad: rows*cols*4, row-wise
  // Adagrad: rows*4, Adam: 2*rows*cols*4, SGD: 0).
  std::function<int64_t(int64_t rows, int64_t cols)> state_bytes;
  // Equal loads go to the first rank at or after this one (wrapping).  0 everywhere in a run;
  // a rank's own number under the plan-per-rank profile, where it makes plans differ.
  int tie_break_rank = 0;
};

// Tables are placed largest first (ties by name); each takes the first allowed type whose
// shards fit, each shard going to the allowed rank (or host) holding the fewest bytes, ties to
// the lowest.  Error(kInvalidScenario) names the table when a constraint cannot be met or
// nothing fits.
//
// Layouts:  table_wise   one shard, whole table.
//           row_wise     one shard per allowed rank, blocks of ceil(rows / n) rows (the last
//                        shards may be short or empty: rows=10 over 4 gives 3,3,3,1).
//           column_wise  k shards of dim/k columns each, placed table-wise; k from the
//                        constraint, else TorchRec's rule (width: the smallest multiple of 4
//                        >= 128 dividing dim, else dim).
//           table_row_wise  row_wise over the ranks of one host (local_world_size ranks).
//           data_parallel   a full replica on every rank.
ShardingPlan plan_sharding(const PlannerInput& input);

// Divisors of `dim`, for messages that say which column shard counts would work.
std::vector<int64_t> divisors(int64_t dim);

}  // namespace dmpcheck::dmp
