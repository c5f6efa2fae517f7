// The space `dmpcheck explore` draws from: a configuration is a handful of choices (ranks, steps,
// tables and how each is pooled and sharded, the optimizers, weights, variable batches, the loop),
// each with a simplest value.  A configuration becomes a scenario file held to what any healthy
// release must show: every replica equal and the sharded model equal to its own unsharded model.
// Pure functions of their inputs: the same seed gives the same configurations on every machine.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dmpcheck::explore {

struct TableDraw {
  int rows = 16;
  int dim = 4;
  std::string pooling = "sum";          // sum, mean, none (a sequence table, TorchRec's EmbeddingCollection)
  std::string sharding = "table_wise";  // data_parallel, table_wise, row_wise, column_wise, table_row_wise
  bool shares_feature = false;          // reads the feature of the first table of its kind (pooled, sequence)
  bool variable_batch = false;          // its feature's batch varies per rank (stride_per_rank, VBE)
  std::string data_type = "fp32";       // fp32, fp16 (the table's storage type)

  bool operator==(const TableDraw& o) const {
    return rows == o.rows && dim == o.dim && pooling == o.pooling && sharding == o.sharding &&
           shares_feature == o.shares_feature && variable_batch == o.variable_batch && data_type == o.data_type;
  }
};

struct Config {
  int world_size = 2;
  int steps = 2;
  int batch_size = 4;
  int max_ids_per_bag = 1;     // bags of 1..max ids
  bool weighted = false;       // the pooled tables' features carry weights (all of them: one EBC)
  std::string sparse = "sgd";  // the fused optimizer: sgd, adagrad, rowwise_adagrad, adam
  bool weight_decay = false;   // rowwise_adagrad: weight_decay 0.05, mode l2
  std::string dense = "sgd";   // sgd, adagrad, adam
  std::string loop = "plain";  // plain, train_pipeline_sparse_dist
  int epochs = 1;              // the steps in that many passes over fresh iterators (divides steps)
  int eval_batches = 0;        // an eval pass of that many batches after every epoch
  std::vector<TableDraw> tables{TableDraw{}};
  uint64_t data_seed = 0;  // the ids' and weights' generator (not simplified: it is no setting)

  bool operator==(const Config& o) const {
    return world_size == o.world_size && steps == o.steps && batch_size == o.batch_size &&
           max_ids_per_bag == o.max_ids_per_bag && weighted == o.weighted && sparse == o.sparse &&
           weight_decay == o.weight_decay && dense == o.dense && loop == o.loop && epochs == o.epochs &&
           eval_batches == o.eval_batches && tables == o.tables && data_seed == o.data_seed;
  }
};

// The `index`-th configuration of `seed`'s sequence (each index its own generator, so a sequence
// can be resumed or sampled anywhere).
Config draw(uint64_t seed, uint64_t index);

// The configuration as a scenario file for `system`.  `expect`: the YAML lines of its `expect:`
// list (indented two spaces); empty: replicas equal and the unsharded model matched within
// rtol 1e-5, atol 1e-6.  `head`: lines put after `name:` (a description, a reproduces block).
std::string scenario_yaml(const Config& c, const std::string& name, const std::string& system,
                          const std::string& head = "", const std::string& matrix = "", const std::string& expect = "");

// Every configuration one step simpler than `c` (a table fewer, fewer ranks, steps, rows, a
// setting back to its simplest), in the order the minimiser tries them: the biggest cuts first.
std::vector<Config> simpler(const Config& c);

// C-Reduce's loop: take the first simpler configuration that still fails, until none does or
// `max_tries` calls of `still_fails` were made.  `tries`: the calls made.
Config minimise(const Config& c, const std::function<bool(const Config&)>& still_fails, int max_tries,
                int* tries = nullptr);

// What in `c` is not its simplest, one phrase each, sorted ("sparse rowwise_adagrad",
// "weight decay", "table 0 row_wise", ...).  Two minimised findings with the same traits are
// the same finding.
std::vector<std::string> traits(const Config& c);

// "axis=value" for every choice `c` made, for the report's count of what the search covered.
std::vector<std::string> axis_values(const Config& c);

}  // namespace dmpcheck::explore
