// Checkpoints: saved by every rank in PyTorch's serialisation, loaded at another world size and
// under another plan (resharding) bitwise, and a run resumed from one ends where an
// uninterrupted run ends.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dmp/checkpoint.h"
#include "multiproc/multiproc_util.h"

namespace dmpcheck {
namespace {

const char* kModel = R"(version: 1
name: NAME
world_size: WORLD
steps: STEPS
batch_size: 4
init: {mode: unseeded, seed: 3FROM}
data: {seed: 42, ids_per_bag: [0, 4]}
tables:
  - {name: t0, rows: 37, dim: 8, features: [f0], sharding: {types: [TYPE0]}}
  - {name: t1, rows: 23, dim: 4, features: [f1], pooling: mean, sharding: {types: [data_parallel]}}
  - {name: t2, rows: 9, dim: 8, features: [f2], weighted: true, sharding: TYPE2}
dense: {layers: [8, 1]}
optimizers: {sparse: {type: adam, lr: 0.05}, dense: {type: adam, lr: 0.01}}
)";

std::string model(const std::string& name, int world, int steps, const std::string& type0, const std::string& type2,
                  const std::string& from = "") {
  std::string text = kModel;
  text = testing::replace_once(text, "NAME", name);
  text = testing::replace_once(text, "WORLD", std::to_string(world));
  text = testing::replace_once(text, "STEPS", std::to_string(steps));
  text = testing::replace_once(text, "TYPE0", type0);
  text = testing::replace_once(text, "TYPE2", type2);
  return testing::replace_once(text, "FROM", from.empty() ? "" : ", from: " + from);
}

class Checkpoints : public testing::MultiProcessTest {
 protected:
  // Runs `text`, saving checkpoints under <dir>/ckpt; returns the run's checkpoint directory.
  std::string run(const std::string& text, const std::string& name) {
    run::ScenarioRunOptions options;
    options.checkpoint_dir = path("ckpt");
    const auto outcome = run_all(scenario::load_scenario_text(text, name + ".yaml"), options);
    EXPECT_EQ(outcome.exit_code, 0) << (outcome.results.at(0).failure ? outcome.results.at(0).failure->message : "");
    return path("ckpt/" + name + "/default");
  }
};

TEST_F(Checkpoints, ReloadUnderAnotherWorldSizeAndPlanIsBitwise) {
  const std::string a = run(model("a", 2, 2, "row_wise", "{types: [column_wise], column_shards: 2}"), "a");
  // world 3, t0 table_wise instead of row_wise, t2 row_wise instead of column_wise, no training.
  const std::string b = run(model("b", 3, 0, "table_wise", "{types: [row_wise]}", a), "b");
  const dmp::FullState saved = dmp::load_checkpoint(a);
  const dmp::FullState reloaded = dmp::load_checkpoint(b);
  EXPECT_EQ(saved.steps, 2);
  EXPECT_EQ(reloaded.steps, 2);
  ASSERT_EQ(saved.tensors.size(), reloaded.tensors.size());
  for (const auto& [name, t] : saved.tensors) {
    ASSERT_TRUE(reloaded.tensors.count(name)) << name;
    EXPECT_TRUE(t.equal(reloaded.tensors.at(name))) << name;
  }
  // The gathered, unsharded file holds the same tensors under the unsharded model's keys.
  const std::string file = dir_ + "/a.pt";
  dmp::save_unsharded_checkpoint(file, saved);
  const dmp::FullState unsharded = dmp::load_checkpoint(file);
  EXPECT_TRUE(
      unsharded.tensors.at("ebc.embedding_bags.t0.weight").equal(saved.tensors.at("ebc.embedding_bags.t0.weight")));
  EXPECT_EQ(unsharded.tensors.at("ebc.embedding_bags.t0.weight").sizes(), (at::IntArrayRef{37, 8}));
}

// Row-wise Adagrad's state of a column-sharded table is TorchRec's [shards * rows], shard after
// shard; a checkpoint holding it the old way ([rows, shards], one column per shard) still loads.
TEST_F(Checkpoints, ColumnShardedRowStateIsTorchRecsLayoutAndTheOldOneLoads) {
  auto text = [](const std::string& name, int steps, const std::string& from) {
    std::string t = model(name, 2, steps, "table_wise", "{types: [column_wise], column_shards: 2}", from);
    return testing::replace_once(t, "sparse: {type: adam, lr: 0.05}", "sparse: {type: rowwise_adagrad, lr: 0.05}");
  };
  const dmp::FullState trained = dmp::load_checkpoint(run(text("cw", 2, ""), "cw"));
  const at::Tensor state = trained.tensors.at("ebc.embedding_bags.t2.momentum1");
  ASSERT_EQ(state.sizes(), (at::IntArrayRef{2 * 9}));
  EXPECT_FALSE(state.narrow(0, 0, 9).equal(state.narrow(0, 9, 9)));  // each shard's own columns
  dmp::FullState old = trained;
  old.tensors["ebc.embedding_bags.t2.momentum1"] = state.reshape({2, 9}).t().contiguous();  // [rows, shards]
  const std::string file = dir_ + "/old-layout.pt";
  dmp::save_unsharded_checkpoint(file, old);
  const dmp::FullState reloaded = dmp::load_checkpoint(run(text("reload", 0, file), "reload"));
  EXPECT_TRUE(reloaded.tensors.at("ebc.embedding_bags.t2.momentum1").equal(state));
}

TEST_F(Checkpoints, AResumedRunEndsWhereAnUninterruptedRunEnds) {
  // Same world size (the global batch is batch_size x world_size), another plan after the stop.
  const dmp::FullState straight =
      dmp::load_checkpoint(run(model("straight", 2, 4, "row_wise", "{types: [table_wise]}"), "straight"));
  const std::string half = run(model("half", 2, 2, "row_wise", "{types: [table_wise]}"), "half");
  const dmp::FullState resumed = dmp::load_checkpoint(
      run(model("resumed", 2, 2, "table_wise", "{types: [column_wise], column_shards: 2}", half), "resumed"));
  EXPECT_EQ(resumed.steps, 4);
  for (const auto& [name, t] : straight.tensors) {
    ASSERT_TRUE(resumed.tensors.count(name)) << name;
    EXPECT_TRUE(t.allclose(resumed.tensors.at(name), 1e-5, 1e-6))
        << name << " max |diff| " << (t - resumed.tensors.at(name)).abs().max().item<double>();
  }
}

// Under torchrec#1497 a checkpoint loads only into the sharding types it was saved under, for
// init.from as for a resume: a sharded checkpoint that held t1 data_parallel loads into the same
// plan, and a model that shards t1 row_wise is refused, naming the table.
TEST_F(Checkpoints, InitFromUnderTorchRec1497RefusesATableShardedAnotherWay) {
  const std::string saved = run(model("saved", 2, 1, "row_wise", "{types: [table_wise]}"), "saved");
  auto under_1497 = [&](const std::string& name, const std::string& t1) {
    const std::string text = model(name, 2, 1, "row_wise", "{types: [table_wise]}", saved);
    return testing::replace_once(text, "sharding: {types: [data_parallel]}", "sharding: {types: [" + t1 + "]}") +
           "profile: \"torchrec#1497\"\n";
  };
  run(under_1497("same", "data_parallel"), "same");
  const auto moved = run_all(scenario::load_scenario_text(under_1497("moved", "row_wise"), "moved.yaml"), {});
  ASSERT_TRUE(moved.results.at(0).failure.has_value());
  EXPECT_NE(moved.exit_code, 0);
  const std::string& message = moved.results.at(0).failure->message;
  EXPECT_NE(message.find("cannot load table 't1': the checkpoint holds it data_parallel (a plain tensor), the model "
                         "now shards it row_wise ('Tensor' object has no attribute 'local_shards'"),
            std::string::npos)
      << message;
}

// Issue 46 item 8: init.from is held against the model: a table of another size, a misspelt,
// missing or extra tensor, a tensor that is not finite, each refused naming the file and the tensor.
TEST_F(Checkpoints, InitFromThatDoesNotFitTheModelIsRefusedNamingTheTensor) {
  const std::string saved = run(model("fits", 2, 1, "table_wise", "{types: [table_wise]}"), "fits");
  const dmp::FullState state = dmp::load_checkpoint(saved);
  auto refused = [&](const std::string& name, const std::map<std::string, at::Tensor>& tensors) {
    dmp::FullState changed = state;
    changed.tensors = tensors;
    const std::string file = dir_ + "/" + name + ".pt";
    dmp::save_unsharded_checkpoint(file, changed);
    const auto outcome = run_all(
        scenario::load_scenario_text(model(name, 2, 1, "table_wise", "{types: [table_wise]}", file), name + ".yaml"),
        {});
    const auto& failure = outcome.results.at(0).failure;
    EXPECT_TRUE(failure && failure->kind == check::FailureKind::kInvalidInput) << name;
    return failure ? failure->message : std::string("no failure");
  };
  const std::string w0 = "ebc.embedding_bags.t0.weight";
  auto with = [&](const std::string& drop, const std::string& add, const at::Tensor& t) {
    auto tensors = state.tensors;
    tensors.erase(drop);
    if (!add.empty()) tensors[add] = t;
    return tensors;
  };
  EXPECT_NE(refused("rows", with(w0, w0, at::zeros({50, 8})))
                .find("init.from " + dir_ + "/rows.pt: '" + w0 + "' is [50, 8] but the model's is [37, 8]"),
            std::string::npos);
  EXPECT_NE(refused("misspelt", with(w0, "ebc.embedding_bags.t0.wieght", at::zeros({37, 8})))
                .find("holds 'ebc.embedding_bags.t0.wieght', which this model does not"),
            std::string::npos);
  EXPECT_NE(refused("missing", with(w0, "", {})).find("has no '" + w0 + "', which the model holds ([37, 8])"),
            std::string::npos);
  EXPECT_NE(refused("extra", with("", "ebc.embedding_bags.t9.weight", at::zeros({3, 8})))
                .find("holds 'ebc.embedding_bags.t9.weight', which this model does not"),
            std::string::npos);
  EXPECT_NE(refused("nan", with(w0, w0, at::full({37, 8}, NAN))).find("'" + w0 + "' holds NaN or Inf"),
            std::string::npos);
}

}  // namespace
}  // namespace dmpcheck
