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

#include "dmp/behaviour_profile.h"
#include "dmp/config.h"

namespace dmpcheck::dmp {

enum class ShardingType { kDataParallel, kTableWise, kRowWise, kColumnWise, kTableRowWise };
inline constexpr Named<ShardingType> kShardingTypeNames[] = {{ShardingType::kDataParallel, "data_parallel"},
                                                             {ShardingType::kTableWise, "table_wise"},
                                                             {ShardingType::kRowWise, "row_wise"},
                                                             {ShardingType::kColumnWise, "column_wise"},
                                                             {ShardingType::kTableRowWise, "table_row_wise"}};

const char* sharding_type_name(ShardingType type);
std::optional<ShardingType> parse_sharding_type(const std::string& name);

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
  int local_world_size = 1;     // ranks per host; world_size must be a multiple
  int64_t memory_per_rank = 0;  // bytes of weights + optimizer state a rank may hold; 0: no limit
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
  std::vector<Shard> shards;       // data_parallel: one full replica per rank
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
  // TorchRec's storage estimate counts a shard's optimizer state as its weight bytes times this
  // (sgd 0, adagrad 1, adam 2, rowwise_adagrad 1/dim of the whole table); TorchRec 0.6-0.8
  // count none.  It orders the tables; unset: 0.
  std::function<double(const EmbeddingBagConfig&)> state_multiplier;
  // Equal loads go to the first rank at or after this one (wrapping).  0 everywhere in a run;
  // a rank's own number under the plan-per-rank profile, where it makes plans differ.
  int tie_break_rank = 0;
};

// The width of TorchRec's column shards: the smallest multiple of 4 that divides dim and is at
// least dim / column_shards (its min_partition; 128 when column_shards is 0), else dim.  So
// TorchRec may make fewer shards than asked: dim 8 in 4 gives 2 shards of 4, dim 12 in 2 one.
int64_t torchrec_column_width(int64_t dim, int column_shards);

// TorchRec's placement on CPU (its GreedyPerfPartitioner as measured on 0.6.0 and 1.9.2):
// tables spread alike over ranks (data_parallel, row_wise, table_row_wise) first, in model
// order; then the others by TorchRec's storage estimate, largest first, ties in model order.
// Each table takes the first allowed type whose shards fit (memory_per_rank); each table_wise
// or column_wise shard goes to the allowed rank with the least estimated time so far (ties:
// rank % local_world_size, then rank), shards of one table may share a rank.  Error
// (kInvalidScenario) names the table when a constraint cannot be met or nothing fits.
// `ranks` constraints are dmpcheck's own (TorchRec has none).
//
// Layouts:  table_wise   one shard, whole table.
//           row_wise     one shard per allowed rank, blocks of ceil(rows / n) rows (the last
//                        shards may be short or empty: rows=10 over 4 gives 3,3,3,1).
//           column_wise  shards of torchrec_column_width(dim, column_shards) columns.
//           table_row_wise  row_wise over the ranks of one host (local_world_size ranks).
//           data_parallel   a full replica on every rank.
ShardingPlan plan_sharding(const PlannerInput& input);
// As the profile's TorchRec plans: without the optimizer state in the storage estimate unless
// planner_counts_optimizer_state.
ShardingPlan plan_sharding(PlannerInput input, const BehaviourProfile& profile);

}  // namespace dmpcheck::dmp
