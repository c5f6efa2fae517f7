// The YAML loader: a strict schema walk.  Every field is read through Reader, which knows the
// file and the field's path, so every error says where and what was expected.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "scenario/scenario.h"

namespace dmpcheck::scenario {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string scalar_text(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a mapping";
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& path, const std::string& message) const {
    int line = 0;
    if (node.IsDefined() && node.Mark().line >= 0) line = node.Mark().line + 1;
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}: field '{}': {}", line > 0 ? fmt::format("{}:{}", file_, line) : file_, path, message));
  }
  // Runs one part of the file.  An invalid-scenario error there is recorded and reading goes on,
  // so that one pass reports every error in the file (throw_recorded), not only the first.
  template <typename F>
  void section(F&& part) const {
    try {
      part();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalidScenario) throw;
      if (std::find(errors_.begin(), errors_.end(), e.what()) == errors_.end()) errors_.push_back(e.what());
    }
  }
  // The recorded errors as one Error(kInvalidScenario): the first alone, or all of them.
  void throw_recorded() const {
    if (errors_.empty()) return;
    if (errors_.size() == 1) throw_error(ErrorKind::kInvalidScenario, errors_.front());
    std::string text = fmt::format("{}: {} errors:", file_, errors_.size());
    for (const auto& e : errors_) text += "\n  " + e;
    throw_error(ErrorKind::kInvalidScenario, text);
  }

  [[noreturn]] void expected(const YAML::Node& node, const std::string& path, const std::string& what) const {
    fail(node, path, fmt::format("expected {}, got {}", what, scalar_text(node)));
  }

  void require_map(const YAML::Node& node, const std::string& path) const {
    if (!node.IsMap()) expected(node, path, "a mapping");
  }

  // Every key of `node` must be in `allowed`; suggests the closest allowed key.
  void check_keys(const YAML::Node& node, const std::string& path, const std::vector<std::string>& allowed) const {
    require_map(node, path);
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string best;
      size_t best_distance = 3;
      for (const auto& a : allowed) {
        const size_t d = edit_distance(key, a);
        if (d < best_distance) {
          best_distance = d;
          best = a;
        }
      }
      fail(kv.first, join(path, key),
           fmt::format("unknown key{}; allowed here: {}", best.empty() ? "" : " (did you mean '" + best + "'?)",
                       fmt::join(allowed, ", ")));
    }
  }

  YAML::Node required(const YAML::Node& map, const std::string& path, const std::string& key) const {
    YAML::Node value = map[key];
    if (!value.IsDefined() || value.IsNull()) { fail(map, join(path, key), "is required"); }
    return value;
  }

  // A scalar that `parse` (std::stoll, std::stod) reads whole and `ok` accepts; otherwise "expected <what>".
  template <typename T, typename Parse, typename Ok>
  T parsed(const YAML::Node& node, const std::string& path, const std::string& what, Parse parse, Ok ok) const {
    size_t used = 0;
    T value{};
    try {
      if (node.IsScalar()) value = parse(node.Scalar(), &used);
    } catch (const std::exception&) { used = 0; }
    if (!node.IsScalar() || node.Scalar().empty() || used != node.Scalar().size() || !ok(value)) {
      expected(node, path, what);
    }
    return value;
  }
  int64_t integer(const YAML::Node& node, const std::string& path, int64_t min, int64_t max) const {
    return parsed<int64_t>(
        node, path, fmt::format("an integer in [{}, {}]", min, max),
        [](const std::string& t, size_t* used) { return std::stoll(t, used); },
        [&](int64_t v) { return v >= min && v <= max; });
  }
  double number(const YAML::Node& node, const std::string& path, double min_exclusive) const {
    return parsed<double>(
        node, path, fmt::format("a number > {}", min_exclusive),
        [](const std::string& t, size_t* used) { return std::stod(t, used); },
        [&](double v) { return v > min_exclusive; });
  }
  double non_negative(const YAML::Node& node, const std::string& path) const {
    return parsed<double>(
        node, path, "a number >= 0", [](const std::string& t, size_t* used) { return std::stod(t, used); },
        [](double v) { return v >= 0; });
  }

  std::string string(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar() || node.Scalar().empty()) expected(node, path, "a non-empty string");
    return node.Scalar();
  }

  std::string choice(const YAML::Node& node, const std::string& path, const std::vector<std::string>& options) const {
    std::string value = node.IsScalar() ? node.Scalar() : std::string();
    if (!node.IsScalar() || std::find(options.begin(), options.end(), value) == options.end()) {
      expected(node, path, fmt::format("one of {}", fmt::join(options, ", ")));
    }
    return value;
  }

  // A path, relative to the scenario file's folder unless absolute.
  std::string path(const YAML::Node& node, const std::string& field) const {
    const std::string text = string(node, field);
    const std::filesystem::path base = std::filesystem::path(file_).parent_path();
    return std::filesystem::path(text).is_absolute() || base.empty() ? text : (base / text).string();
  }

  std::vector<std::string> string_list(const YAML::Node& node, const std::string& path) const {
    if (!node.IsSequence()) expected(node, path, "a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < node.size(); ++i) out.push_back(string(node[i], fmt::format("{}[{}]", path, i)));
    return out;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::string file_;
  mutable std::vector<std::string> errors_;
};

// Keys a matrix may vary: everything that describes one run.
const std::vector<std::string> kMatrixRoots = {
    "system",      "world_size",      "backend", "steps",  "batch_size", "timeout_s",  "threads_per_rank", "topology",
    "init",        "profile",         "data",    "tables", "dense",      "optimizers", "resume",           "faults",
    "fingerprint", "broadcast_probe", "torchrec"};
// The scenario's keys: what it is, its runs' fields, and how they vary and are judged.
const std::vector<std::string> kTopLevelKeys = [] {
  std::vector<std::string> keys = {"version", "name", "description", "reproduces"};
  keys.insert(keys.end(), kMatrixRoots.begin(), kMatrixRoots.end());
  keys.insert(keys.end(), {"matrix", "expect"});
  return keys;
}();

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

bool is_index(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Sets root[path] = value, creating maps on the way.  Returns false when the path crosses a
// scalar or indexes past a list.
bool assign_path(const YAML::Node& root, const std::vector<std::string>& parts, const YAML::Node& value) {
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (node.IsSequence()) {
      if (!is_index(parts[i]) || std::stoul(parts[i]) >= node.size()) return false;
      node.reset(node[std::stoul(parts[i])]);
    } else {
      if (node.IsDefined() && !node.IsNull() && !node.IsMap()) return false;
      if (!node[parts[i]].IsDefined() || node[parts[i]].IsNull()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      node.reset(node[parts[i]]);
    }
  }
  const std::string& last = parts.back();
  if (node.IsSequence()) {
    if (!is_index(last) || std::stoul(last) >= node.size()) return false;
    node[std::stoul(last)] = value;
  } else {
    if (!node.IsMap()) return false;
    node[last] = value;
  }
  return true;
}

// A profile with switches, as a matrix value, on one line ("{base: torchrec-0.6, plan_on_every_rank: true}"):
// its cell's name.
std::string flow_text(const YAML::Node& node) {
  YAML::Emitter out;
  out.SetMapFormat(YAML::Flow);
  out.SetSeqFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

std::string slug_of(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    out += keep ? c : '_';
  }
  return out;
}

dmp::ShardingConstraints parse_constraints(const Reader& r, const YAML::Node& node, const std::string& path,
                                           int world_size) {
  r.check_keys(node, path, {"types", "ranks", "column_shards"});
  dmp::ShardingConstraints c;
  if (node["types"]) {
    const auto names = r.string_list(node["types"], path + ".types");
    if (names.empty()) r.expected(node["types"], path + ".types", "at least one sharding type");
    for (size_t i = 0; i < names.size(); ++i) {
      auto type = dmp::parse_sharding_type(names[i]);
      if (!type) {
        r.expected(node["types"][i], fmt::format("{}.types[{}]", path, i),
                   fmt::format("one of {}", fmt::join(dmp::sharding_type_names(), ", ")));
      }
      c.sharding_types.push_back(*type);
    }
  }
  if (node["ranks"]) {
    const YAML::Node ranks = node["ranks"];
    if (!ranks.IsSequence() || ranks.size() == 0) r.expected(ranks, path + ".ranks", "a non-empty list of ranks");
    for (size_t i = 0; i < ranks.size(); ++i) {
      c.ranks.push_back(static_cast<int>(r.integer(ranks[i], fmt::format("{}.ranks[{}]", path, i), 0, world_size - 1)));
    }
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
      if (it == table_of.end() || t.num_embeddings < it->second->num_embeddings) table_of[f] = &t;
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
            const std::string bag_path = fmt::format("{}[{}]", path, b);
            if (!v[b].IsSequence()) r.expected(v[b], bag_path, "a bag: a list of ids");
            bags.lengths.push_back(static_cast<int64_t>(v[b].size()));
            for (size_t i = 0; i < v[b].size(); ++i) {
              bags.ids.push_back(
                  r.integer(v[b][i], fmt::format("{}[{}]", bag_path, i), 0, table->second->num_embeddings - 1));
            }
          }
        } else {
          r.check_keys(v, path, {"ids", "lengths", "weights"});
          const YAML::Node ids = r.required(v, path, "ids");
          const YAML::Node lengths = r.required(v, path, "lengths");
          if (!ids.IsSequence()) r.expected(ids, path + ".ids", "a list of ids");
          if (!lengths.IsSequence()) r.expected(lengths, path + ".lengths", "a list of bag lengths");
          for (size_t i = 0; i < ids.size(); ++i) {
            bags.ids.push_back(
                r.integer(ids[i], fmt::format("{}.ids[{}]", path, i), 0, table->second->num_embeddings - 1));
          }
          int64_t total = 0;
          for (size_t i = 0; i < lengths.size(); ++i) {
            bags.lengths.push_back(r.integer(lengths[i], fmt::format("{}.lengths[{}]", path, i), 0, 1 << 24));
            total += bags.lengths.back();
          }
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
        if (static_cast<int64_t>(bags.lengths.size()) != run.batch_size) {
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

RunSpec parse_run(const Reader& r, const YAML::Node& root) {
  RunSpec run;
  // One optional field, read in a section of its own: its error is recorded and reading goes on.
  using Node = const YAML::Node&;
  auto field = [&](const char* key, auto&& read) {
    r.section([&] {
      if (Node node = root[key]) read(node);
    });
  };
  field("world_size", [&](Node n) { run.world_size = static_cast<int>(r.integer(n, "world_size", 1, 64)); });
  field("backend", [&](Node n) { run.backend = r.choice(n, "backend", {"gloo", "nccl"}); });
  field("system", [&](Node n) {
    run.system = r.string(n, "system");
    static const std::regex release(R"(torchrec==[0-9]+\.[0-9]+\.[0-9]+)");
    if (run.system != kReferenceSystem && !std::regex_match(run.system, release)) {
      r.expected(n, "system", "'reference' or a TorchRec release as 'torchrec==X.Y.Z' (e.g. torchrec==1.9.2)");
    }
  });
  field("steps", [&](Node n) { run.steps = static_cast<int>(r.integer(n, "steps", 0, 1000000)); });
  field("batch_size", [&](Node n) { run.batch_size = r.integer(n, "batch_size", 1, 1 << 24); });
  field("timeout_s", [&](Node n) { run.timeout_s = r.number(n, "timeout_s", 0.0); });
  field("threads_per_rank", [&](Node n) {
    const bool automatic = n.IsScalar() && n.Scalar() == "auto";
    run.threads_per_rank = automatic ? 0 : static_cast<int>(r.integer(n, "threads_per_rank", 1, 1024));
  });
  field("torchrec", [&](Node torchrec) {
    r.check_keys(torchrec, "torchrec", {"sharder", "module"});
    if (torchrec["sharder"])
      run.torchrec_sharder = r.choice(torchrec["sharder"], "torchrec.sharder", {"extended", "stock"});
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
    if (Node n = init["from"]) run.init.from = r.path(n, "init.from");
    if (Node n = init["mode"]) {
      const bool seeded = r.choice(n, "init.mode", {"seeded", "unseeded"}) == "seeded";
      run.init.mode = seeded ? InitMode::kSeeded : InitMode::kUnseeded;
    }
    if (Node n = init["seed"]) run.init.seed = static_cast<uint64_t>(r.integer(n, "init.seed", 0, INT64_MAX));
  });

  run.profile = *dmp::find_behaviour_profile("current");
  field("profile", [&](Node profile) {
    if (!profile.IsMap()) {
      run.profile = *dmp::find_behaviour_profile(r.choice(profile, "profile", dmp::behaviour_profile_names()));
      return;
    }
    // A named profile with switches turned: {base: torchrec-0.6, plan_on_every_rank: true}.
    std::vector<std::string> keys = dmp::behaviour_switch_names();
    keys.insert(keys.begin(), "base");
    r.check_keys(profile, "profile", keys);
    run.profile = *dmp::find_behaviour_profile(
        r.choice(r.required(profile, "profile", "base"), "profile.base", dmp::behaviour_profile_names()));
    std::vector<std::string> turned;
    for (const auto& kv : profile) {
      const std::string key = kv.first.Scalar();
      if (key == "base") continue;
      const std::string path = "profile." + key;
      if (!kv.second.IsScalar()) r.expected(kv.second, path, "a value");
      if (auto what = dmp::set_behaviour_switch(run.profile, key, kv.second.Scalar()))
        r.expected(kv.second, path, *what);
      turned.push_back(key + "=" + kv.second.Scalar());
    }
    if (!turned.empty()) run.profile.name += fmt::format("+{}", fmt::join(turned, "+"));
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
      r.check_keys(t, path, {"name", "rows", "dim", "features", "pooling", "weighted", "data_type", "sharding"});
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
      if (t["data_type"]) c.data_type = r.choice(t["data_type"], path + ".data_type", {"fp32", "fp16", "bf16"});
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
          if (j != i && std::find(other.begin(), other.end(), f) != other.end()) {
            r.fail(tables[i]["features"], fmt::format("tables[{}].features", i),
                   fmt::format("feature '{}' of sequence table '{}' is read by table '{}' too; a sequence table's "
                               "features are its own",
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
    const YAML::Node layers = r.required(dense, "dense", "layers");
    if (!layers.IsSequence() || layers.size() == 0)
      r.expected(layers, "dense.layers", "a non-empty list of layer sizes");
    run.model.dense_layers.clear();
    for (size_t i = 0; i < layers.size(); ++i) {
      run.model.dense_layers.push_back(r.integer(layers[i], fmt::format("dense.layers[{}]", i), 1, 1 << 20));
    }
  });

  field("optimizers", [&](Node opts) {
    r.check_keys(opts, "optimizers", {"sparse", "dense"});
    if (YAML::Node s = opts["sparse"]) {
      r.check_keys(s, "optimizers.sparse",
                   {"type", "lr", "eps", "beta1", "beta2", "weight_decay", "weight_decay_mode"});
      auto& o = run.sparse_optimizer;
      const std::string type =
          r.choice(r.required(s, "optimizers.sparse", "type"), "optimizers.sparse.type", dmp::fused_optimizer_names());
      o.type = type == "sgd"               ? dmp::FusedOptimizerType::kSgd
               : type == "adagrad"         ? dmp::FusedOptimizerType::kAdagrad
               : type == "rowwise_adagrad" ? dmp::FusedOptimizerType::kRowWiseAdagrad
                                           : dmp::FusedOptimizerType::kAdam;
      if (s["lr"]) o.learning_rate = r.number(s["lr"], "optimizers.sparse.lr", 0.0);
      if (s["eps"]) o.eps = r.number(s["eps"], "optimizers.sparse.eps", 0.0);
      if (s["beta1"]) o.beta1 = r.non_negative(s["beta1"], "optimizers.sparse.beta1");
      if (s["beta2"]) o.beta2 = r.non_negative(s["beta2"], "optimizers.sparse.beta2");
      if (s["weight_decay"]) o.weight_decay = r.non_negative(s["weight_decay"], "optimizers.sparse.weight_decay");
      if (s["weight_decay_mode"]) {
        const std::string mode =
            r.choice(s["weight_decay_mode"], "optimizers.sparse.weight_decay_mode", {"none", "l2", "decoupled"});
        o.weight_decay_mode = mode == "none" ? dmp::WeightDecayMode::kNone
                              : mode == "l2" ? dmp::WeightDecayMode::kL2
                                             : dmp::WeightDecayMode::kDecoupled;
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
      const std::string type =
          r.choice(r.required(d, "optimizers.dense", "type"), "optimizers.dense.type", {"sgd", "adagrad", "adam"});
      auto& o = run.dense_optimizer;
      o.type = type == "sgd"       ? dmp::DenseOptimizerType::kSgd
               : type == "adagrad" ? dmp::DenseOptimizerType::kAdagrad
                                   : dmp::DenseOptimizerType::kAdam;
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
        r.check_keys(kv.second, path, {"ids_per_bag"});
        run.data.per_feature[feature] =
            parse_ids_per_bag(r, r.required(kv.second, path, "ids_per_bag"), path + ".ids_per_bag");
      }
    }
  });
  field("resume", [&](Node resume) {
    r.check_keys(resume, "resume", {"after_step", "sharding"});
    ResumeSpec spec;
    spec.after_step =
        static_cast<int>(r.integer(r.required(resume, "resume", "after_step"), "resume.after_step", 1, run.steps));
    if (YAML::Node sharding = resume["sharding"]) {
      r.require_map(sharding, "resume.sharding");
      for (const auto& kv : sharding) {
        const std::string table = kv.first.as<std::string>();
        if (!names.count(table)) {
          r.fail(kv.first, "resume.sharding." + table,
                 fmt::format("no table '{}' (tables: {})", table, fmt::join(names, ", ")));
        }
        spec.constraints[table] = parse_constraints(r, kv.second, "resume.sharding." + table, run.world_size);
      }
    }
    run.resume = spec;
  });
  field("faults", [&](Node faults) {
    if (!faults.IsSequence()) r.expected(faults, "faults", "a list of faults");
    const std::vector<std::string> kinds = {"crash", "abort",   "kill", "exit",  "throw",
                                            "hang",  "corrupt", "nan",  "desync"};
    for (size_t i = 0; i < faults.size(); ++i) {
      const std::string path = fmt::format("faults[{}]", i);
      r.check_keys(faults[i], path, {"kind", "rank", "step", "exit_code", "tensor"});
      FaultSpec f;
      const std::string kind = r.choice(r.required(faults[i], path, "kind"), path + ".kind", kinds);
      f.kind = static_cast<FaultKind>(std::find(kinds.begin(), kinds.end(), kind) - kinds.begin());
      f.rank = static_cast<int>(r.integer(r.required(faults[i], path, "rank"), path + ".rank", 0, run.world_size - 1));
      if (faults[i]["step"]) f.step = static_cast<int>(r.integer(faults[i]["step"], path + ".step", 0, run.steps));
      if (faults[i]["exit_code"])
        f.exit_code = static_cast<int>(r.integer(faults[i]["exit_code"], path + ".exit_code", 1, 255));
      if (faults[i]["tensor"]) f.tensor = r.string(faults[i]["tensor"], path + ".tensor");
      run.faults.push_back(f);
    }
  });
  r.section([&] {
    if (run.on_torchrec()) {
      // What the TorchRec rank program (torchrec_sut/) cannot do is refused here, before any rank starts.
      auto refuse = [&](const char* key, const std::string& why) {
        r.fail(root[key], key, fmt::format("not available on {} ({}); run it on the reference", run.system, why));
      };
      if (run.backend != "gloo") refuse("backend", "TorchRec cells run on CPU with Gloo");
      if (run.resume) refuse("resume", "mid-run resume is reference-only");
      if (!run.faults.empty()) refuse("faults", "faults are injected by the reference's ranks");
      if (run.fingerprint) refuse("fingerprint", "collective fingerprints are the reference's");
      size_t weighted = 0;
      for (const auto& t : run.model.tables) weighted += t.weighted ? 1 : 0;
      if (weighted != 0 && weighted != run.model.tables.size()) {
        refuse("tables",
               "TorchRec's EmbeddingBagCollection is weighted or not as a whole; make every table weighted or none");
      }
    }
  });
  // By move, not by NRVO: with the return slot elided, a validation error unwinding out of here
  // drew an ASan bad-free in ~RunSpec under clang (docs/reliability.md, Fuzzing).
  return RunSpec(std::move(run));
}

Expectation parse_expectation(const Reader& r, const YAML::Node& node, const std::string& path,
                              const std::set<std::string>& table_names) {
  r.check_keys(node, path,
               {"when", "replicas", "diverged", "at", "global_model", "reference", "outputs", "initial_state",
                "max_broadcast_seconds", "error"});
  Expectation e;
  if (node["replicas"]) {
    e.replicas = r.choice(node["replicas"], path + ".replicas", {"equal", "diverge"}) == "equal"
                     ? ReplicaExpectation::kEqual
                     : ReplicaExpectation::kDiverge;
  }
  if (node["diverged"]) {
    if (e.replicas != ReplicaExpectation::kDiverge)
      r.fail(node["diverged"], path + ".diverged", "needs 'replicas: diverge'");
    e.diverged = r.string_list(node["diverged"], path + ".diverged");
    for (size_t i = 0; i < e.diverged.size(); ++i) {
      const auto& name = e.diverged[i];
      if (name.find('.') == std::string::npos && !table_names.count(name)) {
        r.fail(
            node["diverged"][i], fmt::format("{}.diverged[{}]", path, i),
            fmt::format("'{}' is neither a table nor a tensor name (tables: {})", name, fmt::join(table_names, ", ")));
      }
    }
  } else if (e.replicas == ReplicaExpectation::kDiverge) {
    r.fail(node, path, "'replicas: diverge' needs 'diverged:', the tensors or tables expected to differ");
  }
  if (node["at"]) {
    e.at.clear();
    const auto phases = r.string_list(node["at"], path + ".at");
    for (size_t i = 0; i < phases.size(); ++i) {
      e.at.push_back(r.choice(node["at"][i], fmt::format("{}.at[{}]", path, i), {"init", "final"}) == "init"
                         ? Phase::kInit
                         : Phase::kFinal);
    }
  }
  auto tolerance = [&](const YAML::Node& g, const std::string& field) {
    Tolerance t;
    if (!(g.IsScalar() && g.Scalar() == "true")) {
      r.check_keys(g, field, {"rtol", "atol", "match"});
      if (g["match"]) t.match = r.choice(g["match"], field + ".match", {"true", "false"}) == "true";
      if (g["rtol"]) t.rtol = r.non_negative(g["rtol"], field + ".rtol");
      if (g["atol"]) t.atol = r.non_negative(g["atol"], field + ".atol");
    }
    return t;
  };
  if (YAML::Node g = node["global_model"]) e.global_model = tolerance(g, path + ".global_model");
  if (YAML::Node g = node["outputs"]) {
    if (g.IsMap() && g["match"]) r.fail(g["match"], path + ".outputs.match", "outputs take rtol and atol only");
    e.outputs = tolerance(g, path + ".outputs");
    if (!node["global_model"] && !node["reference"]) {
      r.fail(g, path + ".outputs",
             "compares outputs where 'global_model' (a reference run) or 'reference' (a release cell) compares; give "
             "one of them");
    }
  }
  if (YAML::Node g = node["reference"]) {
    if (g.IsMap() && g["profile"]) {
      std::vector<std::string> profiles = dmp::behaviour_profile_names();
      profiles.push_back(dmp::kReleaseProfile);  // the profile modelling the cell's release
      e.reference_profile = r.choice(g["profile"], path + ".reference.profile", profiles);
    }
    if (g.IsMap() && g["start"]) {
      e.reference_draws_own_init = r.choice(g["start"], path + ".reference.start", {"reference", "seed"}) == "seed";
    }
    if (g.IsMap() && (g["profile"] || g["start"])) {
      YAML::Node rest = YAML::Clone(g);
      rest.remove("profile");
      rest.remove("start");
      e.reference = rest.size() == 0 ? Tolerance{} : tolerance(rest, path + ".reference");
    } else {
      e.reference = tolerance(g, path + ".reference");
    }
  }
  if (node["initial_state"]) {
    e.initial_state = r.choice(node["initial_state"], path + ".initial_state", {"from", "not_from"}) == "from";
  }
  if (YAML::Node error = node["error"]) {
    // Typed: the failure kind, and for a release's errors the text of its own message.
    if (!error.IsMap()) {
      r.expected(error, path + ".error",
                 "a mapping {kind: <failure kind>, message: <text the message contains>}, e.g. "
                 "{kind: torchrec, message: \"not supported\"}");
    }
    r.check_keys(error, path + ".error", {"kind", "message"});
    std::vector<std::string> kinds;
    for (auto k : failure_kind_names()) kinds.emplace_back(k);
    Expectation::ExpectedError expected;
    expected.kind =
        *parse_failure_kind(r.choice(r.required(error, path + ".error", "kind"), path + ".error.kind", kinds));
    if (error["message"]) expected.message = r.string(error["message"], path + ".error.message");
    e.error = expected;
  }
  if (node["max_broadcast_seconds"]) {
    e.max_broadcast_seconds = r.number(node["max_broadcast_seconds"], path + ".max_broadcast_seconds", 0.0);
  }
  return e;
}

Scenario load_scenario_unchecked(const std::string& text, const std::string& file_label, const Overrides& overrides) {
  Reader r(file_label);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}:{}: not valid YAML: {}", file_label, e.mark.line + 1, e.msg));
  }
  r.check_keys(root, "", kTopLevelKeys);

  Scenario s;
  s.file = file_label;
  s.source_text = text;
  s.overrides = overrides;
  s.version = static_cast<int>(r.integer(r.required(root, "", "version"), "version", 1, 1000));
  if (s.version != kFormatVersion) {
    r.fail(root["version"], "version",
           fmt::format("this dmpcheck reads version {}, got {}", kFormatVersion, s.version));
  }
  s.name = r.string(r.required(root, "", "name"), "name");
  if (root["description"]) s.description = r.string(root["description"], "description");
  if (YAML::Node rep = root["reproduces"]) {
    r.check_keys(rep, "reproduces", {"url", "affected", "fixed_in", "bug_profile", "fix_profile", "releases"});
    Reproduces out;
    out.url = r.string(r.required(rep, "reproduces", "url"), "reproduces.url");
    if (rep["affected"]) out.affected = r.string(rep["affected"], "reproduces.affected");
    if (rep["fixed_in"]) out.fixed_in = r.string(rep["fixed_in"], "reproduces.fixed_in");
    // The profiles are there when the bug is modelled in the reference; a report confirmed only on
    // real releases names the releases instead (at least one where it shows).
    if (rep["bug_profile"] || rep["fix_profile"]) {
      out.bug_profile = r.choice(r.required(rep, "reproduces", "bug_profile"), "reproduces.bug_profile",
                                 dmp::behaviour_profile_names());
      out.fix_profile = r.choice(r.required(rep, "reproduces", "fix_profile"), "reproduces.fix_profile",
                                 dmp::behaviour_profile_names());
    }
    if (YAML::Node releases = rep["releases"]) {
      r.require_map(releases, "reproduces.releases");
      static const std::regex release(R"(torchrec==[0-9]+\.[0-9]+\.[0-9]+)");
      for (const auto& kv : releases) {
        const std::string key = kv.first.as<std::string>();
        const std::string field = "reproduces.releases." + key;
        if (!std::regex_match(key, release)) r.expected(kv.first, field, "a release key as 'torchrec==X.Y.Z'");
        const std::string value = r.string(kv.second, field);
        if (value != "bug" && value != "fixed" && value != "absent" && value.rfind("not runnable: ", 0) != 0) {
          r.expected(kv.second, field, "bug, fixed, absent, or 'not runnable: <why>'");
        }
        out.releases.emplace_back(key, value);
      }
    }
    const bool shown_on_a_release =
        std::any_of(out.releases.begin(), out.releases.end(), [](const auto& kv) { return kv.second == "bug"; });
    if (out.bug_profile.empty() && !shown_on_a_release) {
      r.fail(rep, "reproduces",
             "say where the bug shows: bug_profile and fix_profile (modelled in the reference), or releases with at "
             "least one 'torchrec==X.Y.Z: bug' (confirmed on a real release), or both");
    }
    s.reproduces = out;
  }

  // Matrix: the cartesian product of every listed value, first key varying slowest.
  struct Axis {
    std::string path;
    YAML::Node key;
    std::vector<YAML::Node> values;
  };
  std::vector<Axis> axes;
  if (YAML::Node matrix = root["matrix"]) {
    r.require_map(matrix, "matrix");
    for (const auto& kv : matrix) {
      Axis axis{kv.first.as<std::string>(), kv.first, {}};
      const std::string field = "matrix." + axis.path;
      const auto parts = split_path(axis.path);
      if (parts.empty() || std::find(kMatrixRoots.begin(), kMatrixRoots.end(), parts[0]) == kMatrixRoots.end()) {
        r.fail(
            kv.first, field,
            fmt::format("a matrix varies a run field; expected a path under one of {}", fmt::join(kMatrixRoots, ", ")));
      }
      if (!kv.second.IsSequence() || kv.second.size() == 0) r.expected(kv.second, field, "a non-empty list of values");
      for (const auto& v : kv.second) axis.values.push_back(v);
      axes.push_back(axis);
    }
  }

  std::vector<std::vector<size_t>> cells = {{}};
  for (const auto& axis : axes) {
    std::vector<std::vector<size_t>> next;
    for (const auto& cell : cells) {
      for (size_t i = 0; i < axis.values.size(); ++i) {
        next.push_back(cell);
        next.back().push_back(i);
      }
    }
    cells = next;
  }

  std::set<std::string> table_names;
  for (const auto& cell : cells) {
    // A fresh parse per cell rather than YAML::Clone, which drops the line marks errors need.
    YAML::Node run_root = YAML::Load(text);
    run_root.remove("matrix");
    run_root.remove("expect");
    std::vector<std::pair<std::string, std::string>> assignments;
    for (size_t a = 0; a < axes.size(); ++a) {
      const YAML::Node& value = axes[a].values[cell[a]];
      if (!assign_path(run_root, split_path(axes[a].path), value)) {
        r.fail(axes[a].key, "matrix." + axes[a].path, "this path does not lead to a field of the scenario");
      }
      assignments.emplace_back(axes[a].path, value.IsScalar()            ? value.Scalar()
                                             : axes[a].path == "profile" ? flow_text(value)
                                                                         : YAML::Dump(value));
    }
    for (const auto& [path, value] : overrides) {
      const auto parts = split_path(path);
      YAML::Node parsed;
      try {
        parsed = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        throw_error(ErrorKind::kInvalidScenario,
                    fmt::format("override {}={}: not a YAML value: {}", path, value, e.msg));
      }
      DMP_CHECK(!parts.empty() && std::find(kMatrixRoots.begin(), kMatrixRoots.end(), parts[0]) != kMatrixRoots.end() &&
                    assign_path(run_root, parts, parsed),
                ErrorKind::kInvalidScenario, "override {}={}: '{}' is not a run field of {} (run fields: {})", path,
                value, path, file_label, fmt::join(kMatrixRoots, ", "));
    }
    RunSpec run = parse_run(r, run_root);
    // A behaviour profile simulates a release in the reference, and the `torchrec` axes say how a
    // release is driven: an axis that does not apply to the run's system is dropped from its cell,
    // and a cell that is then a repeat is not run again.
    const auto dropped = std::remove_if(assignments.begin(), assignments.end(), [&](const auto& a) {
      return run.on_torchrec() ? a.first == "profile" : a.first.rfind("torchrec", 0) == 0;
    });
    if (run.on_torchrec() || dropped != assignments.end()) {
      assignments.erase(dropped, assignments.end());
      if (std::any_of(s.runs.begin(), s.runs.end(), [&](const RunSpec& done) { return done.cell == assignments; }))
        continue;
    }
    run.cell = assignments;
    // The reference is the default system: its cells are named without it, as before the axis existed.
    std::vector<std::string> named, values;
    for (const auto& [path, value] : assignments) {
      if (path == "system" && value == kReferenceSystem) continue;
      named.push_back(path + "=" + value);
      values.push_back(slug_of(value));
    }
    run.name = named.empty() ? "default" : fmt::format("{}", fmt::join(named, " "));
    run.slug = values.empty() ? "default" : fmt::format("{}", fmt::join(values, "_"));
    for (const auto& t : run.model.tables) table_names.insert(t.name);

    // Expectations: the first entry whose `when` matches this cell.
    r.section([&] {
      if (YAML::Node expect = root["expect"]) {
        if (!expect.IsSequence()) r.expected(expect, "expect", "a list of expectations (each with an optional 'when')");
        bool found = false;
        for (size_t i = 0; i < expect.size() && !found; ++i) {
          const std::string path = fmt::format("expect[{}]", i);
          r.require_map(expect[i], path);
          const YAML::Node when = expect[i]["when"];
          bool matches = true;
          if (when) {
            r.require_map(when, path + ".when");
            for (const auto& kv : when) {
              const std::string key = kv.first.as<std::string>();
              auto it =
                  std::find_if(assignments.begin(), assignments.end(), [&](const auto& p) { return p.first == key; });
              if (std::none_of(axes.begin(), axes.end(), [&](const Axis& ax) { return ax.path == key; })) {
                r.fail(kv.first, path + ".when." + key, "is not a matrix key; 'when' selects matrix cells");
              }
              if (!kv.second.IsScalar()) r.expected(kv.second, path + ".when." + key, "a scalar value");
              matches = matches && it != assignments.end() && it->second == kv.second.Scalar();
            }
          }
          if (matches) {
            run.expect = parse_expectation(r, expect[i], path, table_names);
            for (const auto& t : run.model.tables) {
              const auto c = run.constraints.find(t.name);
              const bool data_parallel = c != run.constraints.end() && !c->second.sharding_types.empty() &&
                                         c->second.sharding_types.front() == dmp::ShardingType::kDataParallel;
              if (run.expect.reference && (t.data_type == "bf16" || (t.data_type == "fp16" && data_parallel))) {
                r.fail(expect[i]["reference"], path + ".reference",
                       fmt::format(
                           "table '{}' is {}, which the reference DMP does not model, so it cannot run the comparison "
                           "(run '{}')",
                           t.name, t.data_type, run.name));
              }
            }
            if (run.expect.reference && !run.on_torchrec()) {
              r.fail(
                  expect[i]["reference"], path + ".reference",
                  fmt::format("compares a TorchRec release with the reference; run '{}' runs on the reference itself "
                              "(select release cells with 'when: {{system: torchrec==X.Y.Z}}')",
                              run.name));
            }
            if (run.expect.initial_state && run.init.from.empty()) {
              r.fail(expect[i]["initial_state"], path + ".initial_state",
                     fmt::format("compares the initial state with init.from; run '{}' has no init.from", run.name));
            }
            if (run.on_torchrec() && !run.init.from.empty() && run.expect.reference) {
              r.fail(expect[i]["reference"], path + ".reference",
                     fmt::format(
                         "a release cell that starts from init.from is not compared with the reference (run '{}'); "
                         "check it with initial_state",
                         run.name));
            }
            if (run.on_torchrec() && run.expect.global_model) {
              r.fail(expect[i]["global_model"], path + ".global_model",
                     fmt::format("the unsharded-model check runs on the reference only; for run '{}' on {} use "
                                 "'reference:' (the same work on the reference, compared step by step)",
                                 run.name, run.system));
            }
            found = true;
          }
        }
        if (!found) {
          r.fail(expect, "expect",
                 fmt::format("no entry applies to run '{}'; add one without 'when' as the default", run.name));
        }
      }
    });
    // Every error of the file so far, at once (the first cell meets all that are not the matrix's).
    r.throw_recorded();
    s.runs.push_back(run);
  }
  // (Not when an override replaces every run's system, as `dmpcheck bisect` does.)
  const bool system_overridden =
      std::any_of(overrides.begin(), overrides.end(), [](const auto& o) { return o.first == "system"; });
  if (s.reproduces && !system_overridden) {
    for (const auto& entry : s.reproduces->releases) {
      const std::string& release = entry.first;
      const std::string& status = entry.second;
      if (status.rfind("not runnable: ", 0) == 0) continue;
      if (std::none_of(s.runs.begin(), s.runs.end(), [&](const RunSpec& run) { return run.system == release; })) {
        r.fail(root["reproduces"]["releases"][release], "reproduces.releases." + release,
               fmt::format("says '{}' but no run of the scenario runs on {} (add it to the matrix's system axis)",
                           status, release));
      }
    }
  }
  return s;
}

}  // namespace

const char* fault_kind_name(FaultKind kind) {
  static const char* names[] = {"crash", "abort", "kill", "exit", "throw", "hang", "corrupt", "nan", "desync"};
  return names[static_cast<int>(kind)];
}

const char* init_mode_name(InitMode mode) { return mode == InitMode::kSeeded ? "seeded" : "unseeded"; }
const char* phase_name(Phase phase) { return phase == Phase::kInit ? "init" : "final"; }

std::pair<int64_t, int64_t> DataSpec::ids_per_bag(const std::string& feature) const {
  auto it = per_feature.find(feature);
  return it == per_feature.end() ? std::make_pair(min_ids_per_bag, max_ids_per_bag) : it->second;
}

std::string Expectation::ExpectedError::describe() const {
  return message.empty() ? fmt::format("an error of kind {}", kind)
                         : fmt::format("an error of kind {} containing '{}'", kind, message);
}

std::string Expectation::describe() const {
  std::vector<const char*> phases;
  for (Phase ph : at) phases.push_back(phase_name(ph));
  std::string text =
      replicas == ReplicaExpectation::kEqual
          ? "replicas equal"
          : fmt::format("replicas diverge on {} at {}", fmt::join(diverged, ", "), fmt::join(phases, ", "));
  if (global_model) {
    text += fmt::format("; {} the unsharded model (rtol {}, atol {})", global_model->match ? "matches" : "differs from",
                        global_model->rtol, global_model->atol);
  }
  if (outputs) text += fmt::format("; outputs compared (rtol {}, atol {})", outputs->rtol, outputs->atol);
  if (initial_state)
    text += *initial_state ? "; the initial state is init.from's" : "; the initial state is not init.from's";
  if (reference) {
    text += fmt::format(
        "; {} the reference DMP{}{} (rtol {}, atol {})", reference->match ? "matches" : "differs from",
        reference_profile.empty() ? std::string() : " under profile " + reference_profile,
        reference_draws_own_init ? ", each drawing its own initial weights from the seed, on the release's plan" : "",
        reference->rtol, reference->atol);
  }
  if (max_broadcast_seconds) text += fmt::format("; init broadcast <= {} s", *max_broadcast_seconds);
  if (error) text = fmt::format("the run fails with {}", error->describe());
  return text;
}

Scenario load_scenario_text(const std::string& text, const std::string& file_label, const Overrides& overrides) {
  // Every yaml-cpp error becomes a scenario error with its line, including shapes of input
  // the schema walk did not foresee (found by fuzzing: a scalar where a mapping was expected).
  try {
    return load_scenario_unchecked(text, file_label, overrides);
  } catch (const YAML::Exception& e) {
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}:{}: not a valid scenario: {}", file_label, e.mark.line + 1, e.msg));
  }
}

Scenario load_scenario_file(const std::string& path, const Overrides& overrides) {
  std::ifstream in(path, std::ios::binary);
  DMP_CHECK(in.good(), ErrorKind::kInvalidScenario, "{}: cannot open the scenario file", path);
  return load_scenario_text(std::string(std::istreambuf_iterator<char>(in), {}), path, overrides);
}

}  // namespace dmpcheck::scenario
