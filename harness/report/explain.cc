#include "report/explain.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dmp/optim/fused_optimizer.h"
#include "dmp/planner.h"

namespace dmpcheck::report {
namespace {

std::string human_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{} B", bytes);
}

}  // namespace

std::string explain_placement(const scenario::RunSpec& run, const dmp::ShardingPlan& plan) {
  std::string out =
      "  table            sharding        shards (rank: rows x cols @ row,col offset)        bytes, all shards\n";
  for (size_t i = 0; i < plan.tables.size(); ++i) {
    const auto& t = plan.tables[i];
    const auto& config = run.model.tables[i];
    std::vector<std::string> shards;
    int64_t bytes = 0;
    for (const auto& s : t.shards) {
      shards.push_back(fmt::format("{}: {}x{} @{},{}", s.rank, s.rows, s.cols, s.row_offset, s.col_offset));
      bytes += s.bytes;
    }
    if (t.type == dmp::ShardingType::kDataParallel) {
      shards = {fmt::format("every rank: {}x{}", config.num_embeddings, config.embedding_dim)};
    }
    out += fmt::format("  {:<16} {:<15} {:<62} {}\n", t.table, dmp::sharding_type_name(t.type),
                       fmt::format("{}", fmt::join(shards, "; ")), bytes > 0 ? human_bytes(bytes) : std::string("-"));
  }
  return out;
}

std::string explain_run(const scenario::RunSpec& run) {
  const dmp::ShardingPlan plan = dmp::plan_sharding(scenario::planner_input(run), run.profile);
  std::string out =
      fmt::format("run [{}]: {} ranks ({} per host), profile {}, sparse optimizer {}, batch {} per rank\n", run.name,
                  run.world_size, plan.topology.local_world_size, run.profile.name,
                  dmp::fused_optimizer_name(run.sparse_optimizer.type), run.batch_size);
  out += explain_placement(run, plan);
  if (run.resume) {
    const scenario::RunSpec resumed = scenario::resumed_run(run);
    out += fmt::format("  after step {}, resumed on {} ranks under:\n", run.resume->after_step, resumed.world_size);
    out += explain_placement(resumed, dmp::plan_sharding(scenario::planner_input(resumed), run.profile));
  }
  int64_t dp_elements = 0;
  int64_t dp_rows = 0;
  int64_t items = 0;
  bool model_parallel = false;
  bool weighted = false;
  for (size_t i = 0; i < plan.tables.size(); ++i) {
    const auto& t = plan.tables[i];
    const auto& config = run.model.tables[i];
    if (t.type == dmp::ShardingType::kDataParallel) {
      dp_elements += config.num_embeddings * config.embedding_dim;
      dp_rows += config.num_embeddings;
    } else {
      model_parallel = true;
      weighted = weighted || config.weighted;
      items += static_cast<int64_t>(t.shards.size() * config.feature_names.size());
    }
  }
  const auto per_rank = plan.bytes_per_rank();
  std::vector<std::string> loads;
  for (size_t r = 0; r < per_rank.size(); ++r) loads.push_back(fmt::format("rank {}: {}", r, human_bytes(per_rank[r])));
  out += fmt::format("  held per rank (weights + optimizer state): {}\n", fmt::join(loads, ", "));

  out += "  collectives per training step, in order, on every rank:\n";
  int n = 1;
  const auto step = [&](const std::string& what) { out += fmt::format("    {}. {}\n", n++, what); };
  if (model_parallel) {
    step(fmt::format("all_to_all  lengths: {} bags x (table, feature, shard) items = {} int64 per rank, split by owner",
                     run.batch_size, run.batch_size * items));
    step("all_to_all  id counts: 1 int64 to each rank");
    step("all_to_all  ids bucketized by shard row range (variable sizes)");
    if (weighted) step("all_to_all  per-id weights (same splits as the ids)");
    step("all_to_all  pooled partial sums back to the bags' ranks");
  }
  out += "    -- dense forward and backward --\n";
  if (model_parallel) step("all_to_all  gradients of the pooled outputs to the shard owners");
  if (dp_elements > 0) {
    step(fmt::format("all_reduce  data_parallel row gradients + touched-row counts: {} floats ({})",
                     dp_elements + dp_rows, human_bytes((dp_elements + dp_rows) * 4)));
  }
  int64_t dense = 0;
  int64_t fan_in = run.model.pooled_width();
  for (int64_t size : run.model.dense_layers) {
    dense += size * fan_in + size;
    fan_in = size;
  }
  step(fmt::format("all_reduce  dense gradients (25 MiB buckets): {} floats ({})", dense, human_bytes(dense * 4)));
  out += "  at init: ";
  const char* broadcast = dmp::data_parallel_init_broadcast(run.profile);
  out += dp_elements > 0 && broadcast != nullptr
             ? fmt::format("broadcast of data_parallel tables from rank 0 ({}, {}), ", human_bytes(dp_elements * 4),
                           broadcast)
             : std::string("no broadcast of data_parallel tables, ");
  out += fmt::format("broadcast of dense parameters ({})\n", human_bytes(dense * 4));
  return out;
}

}  // namespace dmpcheck::report
