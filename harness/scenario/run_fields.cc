// One run's fields, read from the file with one matrix cell assigned.
#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

#include "scenario/parse.h"

namespace dmpcheck::scenario::detail {

// A rank's timeout: a week at most (a larger one overflows the launcher's deadline arithmetic).

namespace {

// One optional field, read in a section of its own: its error is recorded and reading goes on.
template <typename Read>
void optional_field(const Reader& r, const YAML::Node& root, const char* key, Read& read) {
  r.section([&] {
    if (const YAML::Node& node = root[key]) read(node);
  });
}

dmp::ShardingConstraints parse_constraints(const Reader& r, const YAML::Node& node, const std::string& path,
                                           int world_size) {
  r.check_keys(node, path, {"types", "ranks", "column_shards"});
  dmp::ShardingConstraints c;
  if (node["types"]) {
    const auto names = r.string_list(node["types"], path + ".types");
    if (names.empty()) r.expected(node["types"], path + ".types", "at least one sharding type");
    for (size_t i = 0; i < names.size(); ++i) {
      c.sharding_types.push_back(
          r.choice_of(node["types"][i], fmt::format("{}.types[{}]", path, i), dmp::kShardingTypeNames));
    }
  }
  if (node["ranks"]) {
    r.integer_list(node["ranks"], path + ".ranks", "a non-empty list of ranks", 0, world_size - 1, c.ranks, 1);
  }
  if (node["column_shards"])
    c.column_shards = static_cast<int>(r.integer(node["column_shards"], path + ".column_shards", 1, 1 << 20));
  return c;
}

std::pair<int64_t, int64_t> parse_ids_per_bag(const Reader& r, const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    if (node.size() != 2) r.expected(node, path, "an integer or a [min, max] pair");
    const int64_t lo = r.integer(node[0], path + "[0]", 0, 1 << 20);
    const int64_t hi = r.integer(node[1], path + "[1]", lo, 1 << 20);
    return {lo, hi};
  }
  const int64_t n = r.integer(node, path, 0, 1 << 20);
  return {n, n};
}

// data.batches: [step][rank] -> feature -> bags, checked against the run's tables, world size,
// batch size and steps.  A feature's bags are a list of id lists, or {ids, lengths, weights}.
void parse_inline_batches(const Reader& r, const YAML::Node& node, RunSpec& run) {
  if (!node.IsSequence() || node.size() == 0)
    r.expected(node, "data.batches", "a list of steps, each a list of ranks' batches");
  if (static_cast<int64_t>(node.size()) < run.steps) {
    r.fail(node, "data.batches", fmt::format("gives {} step(s) but the run trains {} steps", node.size(), run.steps));
  }
  // A feature several tables read takes ids every one of them has: the smallest table's.
  std::map<std::string, const dmp::EmbeddingBagConfig*> table_of;
  for (const auto& t : run.model.tables) {
    for (const auto& f : t.feature_names) {
      auto it = table_of.find(f);
      if (it == table_of.end() || run.id_range(t) < run.id_range(*it->second)) table_of[f] = &t;
    }
  }
  const auto& weighted = run.data.weighted_features;
  for (size_t s = 0; s < node.size(); ++s) {
    const std::string step_path = fmt::format("data.batches[{}]", s);
    const YAML::Node ranks = node[s];
    if (!ranks.IsSequence() || static_cast<int>(ranks.size()) != run.world_size) {
      r.expected(ranks, step_path,
                 fmt::format("a list of {} ranks' batches (world_size {})", run.world_size, run.world_size));
    }
    std::vector<std::map<std::string, DataSpec::Bags>> step;
    for (size_t k = 0; k < ranks.size(); ++k) {
      const std::string rank_path = fmt::format("{}[{}]", step_path, k);
      const YAML::Node features = ranks[k];
      if (features.IsNull()) {
        step.emplace_back();
        continue;
      }
      r.require_map(features, rank_path);
      std::map<std::string, DataSpec::Bags> local;
      for (const auto& kv : features) {
        const std::string feature = kv.first.as<std::string>();
        const std::string path = rank_path + "." + feature;
        auto table = table_of.find(feature);
        if (table == table_of.end()) {
          std::vector<std::string> known;
          for (const auto& [f, t] : table_of) known.push_back(f);
          r.fail(kv.first, path,
                 fmt::format("no table reads feature '{}'; features: {}", feature, fmt::join(known, ", ")));
        }
        DataSpec::Bags bags;
        const YAML::Node v = kv.second;
        if (v.IsSequence()) {
          for (size_t b = 0; b < v.size(); ++b) {
            r.integer_list(v[b], fmt::format("{}[{}]", path, b), "a bag: a list of ids", 0,
                           run.id_range(*table->second) - 1, bags.ids);
            bags.lengths.push_back(static_cast<int64_t>(v[b].size()));
          }
        } else {
          r.check_keys(v, path, {"ids", "lengths", "weights", "inverse_indices"});
          const YAML::Node ids = r.required(v, path, "ids");
          const YAML::Node lengths = r.required(v, path, "lengths");
          if (!ids.IsSequence()) r.expected(ids, path + ".ids", "a list of ids");
          if (!lengths.IsSequence()) r.expected(lengths, path + ".lengths", "a list of bag lengths");
          r.integer_list(ids, path + ".ids", "a list of ids", 0, run.id_range(*table->second) - 1, bags.ids);
          r.integer_list(lengths, path + ".lengths", "a list of bag lengths", 0, 1 << 24, bags.lengths);
          const int64_t total = std::accumulate(bags.lengths.begin(), bags.lengths.end(), int64_t{0});
          if (total != static_cast<int64_t>(bags.ids.size())) {
            r.fail(lengths, path + ".lengths",
                   fmt::format("add up to {} but there are {} ids", total, bags.ids.size()));
          }
          if (YAML::Node w = v["weights"]) {
            if (std::find(weighted.begin(), weighted.end(), feature) == weighted.end()) {
              r.fail(w, path + ".weights",
                     fmt::format("feature '{}' is read by table '{}', which is not weighted", feature,
                                 table->second->name));
            }
            if (!w.IsSequence() || w.size() != bags.ids.size()) {
              r.expected(w, path + ".weights", fmt::format("a list of {} weights, one per id", bags.ids.size()));
            }
            for (size_t i = 0; i < w.size(); ++i) {
              bags.weights.push_back(static_cast<float>(r.number(w[i], fmt::format("{}.weights[{}]", path, i), -1e30)));
            }
          }
        }
        if (v.IsMap() && v["inverse_indices"]) {
          const YAML::Node inverse = v["inverse_indices"];
          // VBE: `lengths` holds the rank's distinct bags of the feature, and inverse_indices maps
          // each of its batch_size bags to one of them.
          const auto distinct = static_cast<int64_t>(bags.lengths.size());
          const std::string inverse_path = path + ".inverse_indices";
          if (!inverse.IsSequence() || static_cast<int64_t>(inverse.size()) != run.batch_size) {
            r.expected(inverse, inverse_path,
                       fmt::format("a list of batch_size = {} bag indices, each in [0, {}) (the bags of lengths)",
                                   run.batch_size, distinct));
          }
          if (distinct < 1 || distinct > run.batch_size) {
            r.fail(v["lengths"], path + ".lengths",
                   fmt::format("has {} distinct bags; with inverse_indices a rank holds 1 to batch_size = {}", distinct,
                               run.batch_size));
          }
          r.integer_list(inverse, inverse_path, "", 0, distinct - 1, bags.inverse_indices);
          std::vector<bool> used(static_cast<size_t>(distinct), false);
          for (const int64_t i : bags.inverse_indices) used[static_cast<size_t>(i)] = true;
          const auto unused = std::find(used.begin(), used.end(), false);
          if (unused != used.end()) {
            r.fail(inverse, inverse_path,
                   fmt::format("never names bag {} of lengths; every distinct bag is one of the batch's (as "
                               "deduplicating a batch gives them)",
                               unused - used.begin()));
          }
        } else if (static_cast<int64_t>(bags.lengths.size()) != run.batch_size) {
          r.fail(
              v, path,
              fmt::format("has {} bags; each rank's batch has batch_size = {}", bags.lengths.size(), run.batch_size));
        }
        local[feature] = std::move(bags);
      }
      step.push_back(std::move(local));
    }
    run.data.batches.push_back(std::move(step));
  }
}

}  // namespace

std::string parse_profile(const Reader& r, const YAML::Node& node, const std::string& path,
                          const std::vector<std::string>& names,
                          std::vector<std::pair<std::string, std::string>>& switches) {
  if (!node.IsMap()) return r.choice(node, path, names);
  // A named profile with switches turned: {base: torchrec-0.6, plan_on_every_rank: true}.
  std::vector<std::string> keys = dmp::behaviour_switch_names();
  keys.insert(keys.begin(), "base");
  r.check_keys(node, path, keys);
  std::string base = r.choice(r.required(node, path, "base"), path + ".base", names);
  dmp::BehaviourProfile scratch = *dmp::find_behaviour_profile("current");
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    if (key == "base") continue;
    if (!kv.second.IsScalar()) r.expected(kv.second, path + "." + key, "a value");
    if (auto what = dmp::set_behaviour_switch(scratch, key, kv.second.Scalar()))
      r.expected(kv.second, path + "." + key, *what);
    switches.emplace_back(key, kv.second.Scalar());
  }
  return base;
}

void parse_process_fields(const Reader& r, const YAML::Node& root, RunSpec& run) {
  using Node = const YAML::Node&;
  auto field = [&](const char* key, auto&& read) { optional_field(r, root, key, read); };
  field("world_size", [&](Node n) { run.world_size = static_cast<int>(r.integer(n, "world_size", 1, 64)); });
  field("system", [&](Node n) {
    const auto system = System::parse(r.string(n, "system"));
    if (!system) r.expected(n, "system", System::kExpected);
    run.system = *system;
  });
  field("timeout_s", [&](Node n) { run.timeout_s = r.number(n, "timeout_s", kShortestTimeout, kLongestTimeout); });
  field("threads_per_rank", [&](Node n) {
    const bool automatic = n.IsScalar() && n.Scalar() == "auto";
    run.threads_per_rank = automatic ? 0 : static_cast<int>(r.integer(n, "threads_per_rank", 1, 1024));
  });
}

RunSpec parse_run(const Reader& r, const YAML::Node& root) {
  if (root["script"]) return parse_script_run(r, root);
  RunSpec run;
  using Node = const YAML::Node&;
  auto field = [&](const char* key, auto&& read) { optional_field(r, root, key, read); };
  parse_process_fields(r, root, run);
  field("backend", [&](Node n) { run.backend = r.choice_of(n, "backend", comm::kBackendNames); });
  field("steps", [&](Node n) { run.steps = static_cast<int>(r.integer(n, "steps", 0, 1000000)); });
  field("batch_size", [&](Node n) { run.batch_size = r.integer(n, "batch_size", 1, 1 << 24); });
  field("torchrec", [&](Node torchrec) {
    r.check_keys(torchrec, "torchrec",
                 {"sharder", "module", "loop", "epochs", "batches_per_rank", "eval_batches", "data_iterator",
                  "is_weighted", "hooks"});
    if (Node hooks = torchrec["hooks"]) {
      run.torchrec_hooks = r.path(hooks, "torchrec.hooks");
      std::error_code ec;
      if (!std::filesystem::is_regular_file(run.torchrec_hooks, ec))
        r.fail(hooks, "torchrec.hooks", fmt::format("no hook file {}", run.torchrec_hooks));
    }
    if (torchrec["is_weighted"]) {
      run.torchrec_is_weighted = r.choice(torchrec["is_weighted"], "torchrec.is_weighted", {"true", "false"}) == "true";
    }
    if (torchrec["data_iterator"]) {
      run.torchrec_data_iterator =
          r.choice(torchrec["data_iterator"], "torchrec.data_iterator", {"fresh", "persistent"});
    }
    if (YAML::Node eval = torchrec["eval_batches"]) {
      // One count for every rank, or one per rank.
      if (eval.IsScalar()) {
        run.torchrec_eval_batches.push_back(r.integer(eval, "torchrec.eval_batches", 0, 1000000));
      } else {
        r.integer_list(eval, "torchrec.eval_batches", "a batch count, or a list of them, one per rank", 0, 1000000,
                       run.torchrec_eval_batches);
      }
    }
    if (YAML::Node counts = torchrec["batches_per_rank"]) {
      r.integer_list(counts, "torchrec.batches_per_rank", "a list of batch counts, one per rank", 0, 1000000,
                     run.torchrec_batches_per_rank);
    }
    if (torchrec["sharder"])
      run.torchrec_sharder = r.choice(torchrec["sharder"], "torchrec.sharder", {"extended", "stock"});
    if (torchrec["loop"])
      run.torchrec_loop = r.choice(torchrec["loop"], "torchrec.loop", {"plain", "train_pipeline_sparse_dist"});
    if (torchrec["epochs"])
      run.torchrec_epochs = static_cast<int>(r.integer(torchrec["epochs"], "torchrec.epochs", 1, 1000));
    if (!torchrec["module"]) return;
    run.torchrec_module =
        r.choice(torchrec["module"], "torchrec.module", {"embedding_bag_collection", "embedding_bag"});
    if (run.torchrec_module != "embedding_bag") return;
    if (!root["tables"] || !root["tables"].IsSequence() || root["tables"].size() != 1 ||
        !root["tables"][0]["features"] || root["tables"][0]["features"].size() != 1) {
      r.fail(torchrec["module"], "torchrec.module",
             "'embedding_bag' is one torch.nn.EmbeddingBag: the scenario must have one table reading one feature");
    }
    if (torchrec["sharder"] && run.torchrec_sharder != "stock") {
      r.fail(torchrec["sharder"], "torchrec.sharder",
             "an nn.EmbeddingBag is sharded by TorchRec's own EmbeddingBagSharder: 'stock' only");
    }
    run.torchrec_sharder = "stock";
  });
  field("fingerprint", [&](Node n) { run.fingerprint = r.choice(n, "fingerprint", {"true", "false"}) == "true"; });
  field("broadcast_probe", [&](Node probe) {
    if (probe.IsScalar()) {
      run.broadcast_probe.enabled = r.choice(probe, "broadcast_probe", {"true", "false"}) == "true";
      return;
    }
    r.check_keys(probe, "broadcast_probe", {"warmup", "iterations"});
    if (Node n = probe["warmup"])
      run.broadcast_probe.warmup = static_cast<int>(r.integer(n, "broadcast_probe.warmup", 0, 1000));
    if (Node n = probe["iterations"])
      run.broadcast_probe.iterations = static_cast<int>(r.integer(n, "broadcast_probe.iterations", 1, 100000));
  });
  field("topology", [&](Node topology) {
    r.check_keys(topology, "topology", {"local_world_size", "memory_per_rank"});
    if (Node n = topology["local_world_size"]) {
      run.local_world_size = static_cast<int>(r.integer(n, "topology.local_world_size", 1, run.world_size));
      if (run.world_size % run.local_world_size != 0) {
        r.fail(n, "topology.local_world_size",
               fmt::format("must divide world_size {} (hosts of equal size)", run.world_size));
      }
    }
    if (Node n = topology["memory_per_rank"])
      run.memory_per_rank = r.integer(n, "topology.memory_per_rank", 1, INT64_MAX);
  });
  field("init", [&](Node init) {
    r.check_keys(init, "init", {"mode", "seed", "from", "load"});
    if (Node n = init["load"]) {
      run.init.load_before_wrap = r.choice(n, "init.load", {"after_wrap", "before_wrap"}) == "before_wrap";
      if (!init["from"]) r.fail(n, "init.load", "says when init.from's weights are loaded; give init.from");
    }
    if (Node n = init["from"]) {
      run.init.from = r.path(n, "init.from");
      std::error_code ec;
      if (!std::filesystem::exists(run.init.from, ec)) r.fail(n, "init.from", fmt::format("no file {}", run.init.from));
    }
    if (Node n = init["mode"]) { run.init.mode = r.choice_of(n, "init.mode", kInitModeNames); }
    if (Node n = init["seed"]) run.init.seed = static_cast<uint64_t>(r.integer(n, "init.seed", 0, INT64_MAX));
  });

  run.profile = *dmp::find_behaviour_profile("current");
  field("profile", [&](Node profile) {
    std::vector<std::pair<std::string, std::string>> turned;
    run.profile =
        *dmp::find_behaviour_profile(parse_profile(r, profile, "profile", dmp::behaviour_profile_names(), turned));
    for (const auto& [key, value] : turned) {
      dmp::set_behaviour_switch(run.profile, key, value);
      run.profile.name += fmt::format("+{}={}", key, value);
    }
  });

  const YAML::Node tables = root["tables"];
  r.section([&] {
    r.required(root, "", "tables");
    if (!tables.IsSequence() || tables.size() == 0) r.expected(tables, "tables", "a non-empty list of tables");
  });
  std::set<std::string> names, features;
  for (size_t i = 0; tables.IsSequence() && i < tables.size(); ++i)
    r.section([&] {
      const std::string path = fmt::format("tables[{}]", i);
      const YAML::Node t = tables[i];
      r.check_keys(t, path,
                   {"name", "rows", "dim", "features", "pooling", "weighted", "data_type", "sharding", "quant",
                    "managed_collision"});
      dmp::EmbeddingBagConfig c;
      c.name = r.string(r.required(t, path, "name"), path + ".name");
      if (!names.insert(c.name).second)
        r.fail(t["name"], path + ".name", fmt::format("table '{}' is defined twice", c.name));
      c.num_embeddings = r.integer(r.required(t, path, "rows"), path + ".rows", 1, int64_t{1} << 40);
      c.embedding_dim = r.integer(r.required(t, path, "dim"), path + ".dim", 1, 1 << 20);
      c.feature_names = r.string_list(r.required(t, path, "features"), path + ".features");
      if (c.feature_names.empty()) r.expected(t["features"], path + ".features", "at least one feature");
      std::set<std::string> own;
      for (size_t f = 0; f < c.feature_names.size(); ++f) {
        if (!own.insert(c.feature_names[f]).second) {
          r.fail(t["features"][f], fmt::format("{}.features[{}]", path, f),
                 fmt::format("table '{}' lists feature '{}' twice", c.name, c.feature_names[f]));
        }
        features.insert(c.feature_names[f]);  // several tables may read one feature (TorchRec names them feature@table)
      }
      if (t["pooling"]) {
        const std::string pooling = r.choice(t["pooling"], path + ".pooling", {"sum", "mean", "none"});
        c.pooling = pooling == "mean" ? dmp::PoolingType::kMean : dmp::PoolingType::kSum;
        c.sequence = pooling == "none";
      }
      if (t["weighted"]) {
        const bool weighted = r.choice(t["weighted"], path + ".weighted", {"true", "false"}) == "true";
        if (weighted && c.sequence) {
          r.fail(t["weighted"], path + ".weighted",
                 "a sequence table (pooling: none) has no per-id weights in TorchRec's EmbeddingCollection");
        }
        if (weighted && c.pooling == dmp::PoolingType::kMean && !run.on_torchrec()) {
          // Not FBGEMM's limit (TorchRec 1.9.2 accepts weighted mean pooling on CPU, and trains
          // differently from a weighted sum): the reference does not model it yet.
          r.fail(t["weighted"], path + ".weighted",
                 "weighted features with mean pooling are not modelled by the reference DMP (TorchRec accepts them); "
                 "use sum");
        }
        c.weighted = weighted;
        if (weighted)
          run.data.weighted_features.insert(run.data.weighted_features.end(), c.feature_names.begin(),
                                            c.feature_names.end());
      }
      if (t["data_type"]) c.data_type = r.choice_of(t["data_type"], path + ".data_type", dmp::kDataTypeNames);
      if (t["quant"]) { run.quant[c.name] = r.choice_of(t["quant"], path + ".quant", kQuantTypeNames); }
      if (YAML::Node mc = t["managed_collision"]) {
        const std::string at = path + ".managed_collision";
        if (!mc.IsMap()) r.expected(mc, at, "a mapping {input_hash_size: N, eviction: distance_lfu, interval: 1}");
        r.check_keys(mc, at, {"module", "input_hash_size", "eviction", "interval"});
        ManagedCollision m;
        if (mc["module"]) m.module = r.choice_of(mc["module"], at + ".module", kMcModuleNames);
        for (const char* key : {"eviction", "interval"}) {
          if (m.module == McModule::kHashZch && mc[key]) {
            r.fail(mc[key], at + "." + key,
                   "sets an MCH module's eviction; hash_zch evicts by its own configuration, which dmpcheck leaves "
                   "at TorchRec's default (none)");
          }
        }
        m.input_hash_size =
            r.integer(r.required(mc, at, "input_hash_size"), at + ".input_hash_size", 1, int64_t{1} << 62);
        if (mc["eviction"]) m.eviction = r.choice_of(mc["eviction"], at + ".eviction", kMcEvictionNames);
        if (mc["interval"]) m.interval = r.integer(mc["interval"], at + ".interval", 1, 1000000);
        run.managed_collision[c.name] = m;
      }
      if (t["sharding"])
        run.constraints[c.name] = parse_constraints(r, t["sharding"], path + ".sharding", run.world_size);
      run.model.tables.push_back(c);
    });
  r.section([&] {
    // TorchRec's EmbeddingCollection requires one embedding dim for all its tables.
    const dmp::EmbeddingBagConfig* first = nullptr;
    for (size_t i = 0; i < run.model.tables.size(); ++i) {
      const auto& t = run.model.tables[i];
      if (!t.sequence) continue;
      for (size_t j = 0; j < run.model.tables.size(); ++j) {
        for (const auto& f : t.feature_names) {
          const auto& other = run.model.tables[j].feature_names;
          // Sequence tables may share a feature (TorchRec's EmbeddingCollection names each one's
          // output <feature>@<table>); a pooled table may not read it too.
          if (j != i && !run.model.tables[j].sequence && std::find(other.begin(), other.end(), f) != other.end()) {
            r.fail(tables[i]["features"], fmt::format("tables[{}].features", i),
                   fmt::format("feature '{}' of sequence table '{}' is read by the pooled table '{}' too; a feature "
                               "goes to the EmbeddingCollection or to the EmbeddingBagCollection, not both",
                               f, t.name, run.model.tables[j].name));
          }
        }
      }
      if (first != nullptr && t.embedding_dim != first->embedding_dim) {
        r.fail(tables[i]["dim"], fmt::format("tables[{}].dim", i),
               fmt::format("sequence tables (pooling: none) share one EmbeddingCollection, whose tables need one dim: "
                           "'{}' has {}, '{}' {}",
                           first->name, first->embedding_dim, t.name, t.embedding_dim));
      }
      if (first == nullptr) first = &t;
    }
  });

  // Dense MLP: one layer of one unit unless given.
  run.model.dense_layers = {1};
  field("dense", [&](Node dense) {
    r.check_keys(dense, "dense", {"layers"});
    run.model.dense_layers.clear();
    r.integer_list(r.required(dense, "dense", "layers"), "dense.layers", "a non-empty list of layer sizes", 1, 1 << 20,
                   run.model.dense_layers, 1);
  });

  field("optimizers", [&](Node opts) {
    r.check_keys(opts, "optimizers", {"sparse", "dense"});
    if (YAML::Node s = opts["sparse"]) {
      r.check_keys(s, "optimizers.sparse",
                   {"type", "lr", "eps", "beta1", "beta2", "weight_decay", "weight_decay_mode"});
      auto& o = run.sparse_optimizer;
      o.type =
          r.choice_of(r.required(s, "optimizers.sparse", "type"), "optimizers.sparse.type", dmp::kFusedOptimizerNames);
      const char* type = dmp::fused_optimizer_name(o.type);
      if (s["lr"]) o.learning_rate = r.number(s["lr"], "optimizers.sparse.lr", 0.0);
      if (s["eps"]) o.eps = r.number(s["eps"], "optimizers.sparse.eps", 0.0);
      if (s["beta1"]) o.beta1 = r.non_negative(s["beta1"], "optimizers.sparse.beta1");
      if (s["beta2"]) o.beta2 = r.non_negative(s["beta2"], "optimizers.sparse.beta2");
      if (s["weight_decay"]) o.weight_decay = r.non_negative(s["weight_decay"], "optimizers.sparse.weight_decay");
      if (s["weight_decay_mode"]) {
        o.weight_decay_mode =
            r.choice_of(s["weight_decay_mode"], "optimizers.sparse.weight_decay_mode", dmp::kWeightDecayModeNames);
        if (o.weight_decay_mode != dmp::WeightDecayMode::kNone && o.type != dmp::FusedOptimizerType::kRowWiseAdagrad) {
          r.fail(s["weight_decay_mode"], "optimizers.sparse.weight_decay_mode",
                 fmt::format("FBGEMM's {} has no weight decay modes; only rowwise_adagrad does (adam decays by "
                             "weight_decay alone)",
                             type));
        }
      }
      if (o.weight_decay > 0 &&
          (o.type == dmp::FusedOptimizerType::kSgd || o.type == dmp::FusedOptimizerType::kAdagrad)) {
        r.fail(s["weight_decay"], "optimizers.sparse.weight_decay",
               fmt::format("FBGEMM's exact {} has no weight decay", type));
      }
    }
    if (YAML::Node d = opts["dense"]) {
      r.check_keys(d, "optimizers.dense", {"type", "lr", "eps", "momentum", "beta1", "beta2", "weight_decay"});
      auto& o = run.dense_optimizer;
      o.type =
          r.choice_of(r.required(d, "optimizers.dense", "type"), "optimizers.dense.type", dmp::kDenseOptimizerNames);
      if (o.type == dmp::DenseOptimizerType::kAdagrad) o.eps = 1e-10;  // torch.optim.Adagrad's default
      if (d["lr"]) o.learning_rate = r.number(d["lr"], "optimizers.dense.lr", 0.0);
      if (d["eps"]) o.eps = r.number(d["eps"], "optimizers.dense.eps", 0.0);
      if (d["momentum"]) o.momentum = r.non_negative(d["momentum"], "optimizers.dense.momentum");
      if (d["beta1"]) o.beta1 = r.non_negative(d["beta1"], "optimizers.dense.beta1");
      if (d["beta2"]) o.beta2 = r.non_negative(d["beta2"], "optimizers.dense.beta2");
      if (d["weight_decay"]) o.weight_decay = r.non_negative(d["weight_decay"], "optimizers.dense.weight_decay");
    }
  });

  field("data", [&](Node data) {
    r.check_keys(data, "data", {"seed", "ids_per_bag", "features", "from", "batches"});
    if (data["from"] && data["batches"])
      r.fail(data["batches"], "data.batches", "give data.from or data.batches, not both");
    for (const char* generator_key : {"seed", "ids_per_bag", "features"}) {
      if ((data["from"] || data["batches"]) && data[generator_key]) {
        r.fail(
            data[generator_key], std::string("data.") + generator_key,
            fmt::format("configures generated batches; this run replays data.{}", data["from"] ? "from" : "batches"));
      }
    }
    if (data["from"]) {
      run.data.from = r.path(data["from"], "data.from");
      if (!std::filesystem::is_directory(run.data.from)) {
        r.fail(data["from"], "data.from",
               fmt::format(
                   "{} is not a directory (expected one holding batch0.pt, batch1.pt, ... as --dump-batches writes)",
                   run.data.from));
      }
    }
    if (data["batches"]) parse_inline_batches(r, data["batches"], run);
    if (data["seed"]) run.data.seed = static_cast<uint64_t>(r.integer(data["seed"], "data.seed", 0, INT64_MAX));
    if (data["ids_per_bag"]) {
      std::tie(run.data.min_ids_per_bag, run.data.max_ids_per_bag) =
          parse_ids_per_bag(r, data["ids_per_bag"], "data.ids_per_bag");
    }
    if (YAML::Node per = data["features"]) {
      r.require_map(per, "data.features");
      for (const auto& kv : per) {
        const std::string feature = kv.first.as<std::string>();
        const std::string path = "data.features." + feature;
        if (!features.count(feature)) {
          r.fail(kv.first, path,
                 fmt::format("no table reads feature '{}'; features: {}", feature, fmt::join(features, ", ")));
        }
        r.check_keys(kv.second, path, {"ids_per_bag", "stride_per_rank"});
        if (!kv.second["ids_per_bag"] && !kv.second["stride_per_rank"])
          r.expected(kv.second, path, "ids_per_bag, stride_per_rank or both");
        if (const YAML::Node n = kv.second["ids_per_bag"])
          run.data.per_feature[feature] = parse_ids_per_bag(r, n, path + ".ids_per_bag");
        if (const YAML::Node n = kv.second["stride_per_rank"]) {
          // VBE: the distinct bags of this feature in each rank's batch, one count or one per rank.
          const std::string sp = path + ".stride_per_rank";
          std::vector<int64_t> strides;
          if (n.IsSequence()) {
            if (static_cast<int>(n.size()) != run.world_size)
              r.expected(n, sp, fmt::format("one count, or one per rank ({})", run.world_size));
            r.integer_list(n, sp, "", 1, run.batch_size, strides);
          } else {
            strides.assign(static_cast<size_t>(run.world_size), r.integer(n, sp, 1, run.batch_size));
          }
          run.data.stride_per_rank[feature] = strides;
        }
      }
    }
  });
  field("resume", [&](Node resume) {
    r.check_keys(resume, "resume", {"after_step", "sharding", "world_size"});
    ResumeSpec spec;
    spec.after_step =
        static_cast<int>(r.integer(r.required(resume, "resume", "after_step"), "resume.after_step", 1, run.steps));
    spec.world_size = run.world_size;
    if (YAML::Node ws = resume["world_size"]) {
      spec.world_size = static_cast<int>(r.integer(ws, "resume.world_size", 1, 64));
      if (!run.on_torchrec() && spec.world_size != run.world_size) {
        r.fail(ws, "resume.world_size",
               fmt::format("the reference resumes on its own {} ranks; another world size is resumed on a release "
                           "(system: torchrec==X.Y.Z)",
                           run.world_size));
      }
      const int64_t global = run.batch_size * run.world_size;
      if (global % spec.world_size != 0) {
        r.fail(ws, "resume.world_size",
               fmt::format("{} ranks cannot split the global batch of {} (batch_size {} x world_size {}) evenly; the "
                           "resumed run trains on the same global batches",
                           spec.world_size, global, run.batch_size, run.world_size));
      }
    }
    if (YAML::Node sharding = resume["sharding"]) {
      r.require_map(sharding, "resume.sharding");
      for (const auto& kv : sharding) {
        const std::string table = kv.first.as<std::string>();
        if (!names.count(table)) {
          r.fail(kv.first, "resume.sharding." + table,
                 fmt::format("no table '{}' (tables: {})", table, fmt::join(names, ", ")));
        }
        spec.constraints[table] = parse_constraints(r, kv.second, "resume.sharding." + table, spec.world_size);
      }
    }
    run.resume = spec;
  });
  field("faults", [&](Node faults) {
    if (!faults.IsSequence()) r.expected(faults, "faults", "a list of faults");
    for (size_t i = 0; i < faults.size(); ++i) {
      const std::string path = fmt::format("faults[{}]", i);
      r.check_keys(faults[i], path, {"kind", "rank", "step", "exit_code", "tensor"});
      FaultSpec f;
      f.kind = r.choice_of(r.required(faults[i], path, "kind"), path + ".kind", kFaultKindNames);
      f.rank = static_cast<int>(r.integer(r.required(faults[i], path, "rank"), path + ".rank", 0, run.world_size - 1));
      if (faults[i]["step"]) f.step = static_cast<int>(r.integer(faults[i]["step"], path + ".step", 0, run.steps));
      if (faults[i]["exit_code"])
        f.exit_code = static_cast<int>(r.integer(faults[i]["exit_code"], path + ".exit_code", 1, 255));
      if (faults[i]["tensor"]) f.tensor = r.string(faults[i]["tensor"], path + ".tensor");
      run.faults.push_back(f);
    }
  });
  r.section([&] { check_system_can_run(r, root, run); });
  // By move, not by NRVO: with the return slot elided, a validation error unwinding out of here
  // drew an ASan bad-free in ~RunSpec under clang (docs/reliability.md, Fuzzing).
  return RunSpec(std::move(run));
}

}  // namespace dmpcheck::scenario::detail
