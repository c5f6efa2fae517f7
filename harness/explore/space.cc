#include "explore/space.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace dmpcheck::explore {
namespace {

// splitmix64: a generator whose numbers are the same on every platform (std's distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  bool chance(int percent) { return below(100) < percent; }
  template <typename T>
  const T& pick(const std::vector<T>& from) {
    return from[static_cast<size_t>(below(static_cast<int>(from.size())))];
  }

 private:
  uint64_t state_;
};

bool sequence(const TableDraw& t) { return t.pooling == "none"; }

bool has_fp16(const Config& c) {
  return std::any_of(c.tables.begin(), c.tables.end(), [](const TableDraw& t) { return t.data_type == "fp16"; });
}

// The shape rules a drawn or simplified configuration keeps, so that every one loads: sequence
// tables share one dim and take no table_row_wise; weights only where every table sums;
// weight decay only with rowwise_adagrad; a shared feature only where an earlier table of the
// same kind exists; rows enough for every rank's row block.
Config normalised(Config c) {
  int sequence_dim = 0;
  bool seen_pooled = false, seen_sequence = false;
  for (auto& t : c.tables) {
    if (sequence(t)) {
      if (sequence_dim == 0) sequence_dim = t.dim;
      t.dim = sequence_dim;
      if (t.sharding == "table_row_wise") t.sharding = "row_wise";
      if (!seen_sequence) t.shares_feature = false;
      seen_sequence = true;
    } else {
      if (!seen_pooled) t.shares_feature = false;
      seen_pooled = true;
    }
    t.rows = std::max(t.rows, 2 * c.world_size);
  }
  // (A release cell's EBC is weighted as a whole; a mean or sequence table is not weighted there.)
  const bool all_sum =
      std::all_of(c.tables.begin(), c.tables.end(), [](const TableDraw& t) { return t.pooling == "sum"; });
  if (!all_sum) c.weighted = false;
  // The oracle holds fp16 tables in fp16 under torch.optim's optimizers, whose eps (1e-10) is 0 in
  // fp16: Adagrad's and Adam's rows no batch touched become 0/0 = NaN (measured, 1.9.2).  So an fp16
  // table trains with SGD, which both sides can hold.
  if (has_fp16(c)) c.sparse = "sgd";
  if (c.sparse != "rowwise_adagrad") c.weight_decay = false;
  if (c.steps % c.epochs != 0) c.epochs = 1;
  c.eval_batches = std::min(c.eval_batches, c.steps / c.epochs);
  return c;
}

}  // namespace

Config draw(uint64_t seed, uint64_t index) {
  Rng rng(seed * 0x100000001b3ULL ^ (index + 1) * 0x9e3779b97f4a7c15ULL);
  rng.next();
  Config c;
  c.world_size = rng.pick(std::vector<int>{1, 2, 2, 2, 3, 4});
  c.steps = rng.pick(std::vector<int>{1, 2, 3});
  c.batch_size = rng.pick(std::vector<int>{2, 4, 8});
  c.max_ids_per_bag = rng.pick(std::vector<int>{1, 3, 6});
  c.sparse = rng.pick(std::vector<std::string>{"sgd", "adagrad", "rowwise_adagrad", "rowwise_adagrad", "adam"});
  c.weight_decay = rng.chance(40);
  c.dense = rng.pick(std::vector<std::string>{"sgd", "sgd", "adagrad", "adam"});
  c.loop = rng.chance(20) ? "train_pipeline_sparse_dist" : "plain";
  c.weighted = rng.chance(25);
  c.tables.clear();
  const int n = 1 + rng.below(3);
  for (int i = 0; i < n; ++i) {
    TableDraw t;
    t.rows = rng.pick(std::vector<int>{8, 16, 40, 100});
    t.dim = rng.pick(std::vector<int>{4, 8});
    t.pooling = rng.pick(std::vector<std::string>{"sum", "sum", "mean", "none"});
    t.sharding =
        rng.pick(std::vector<std::string>{"data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"});
    t.shares_feature = i > 0 && rng.chance(25);
    t.variable_batch = rng.chance(15);
    c.tables.push_back(t);
  }
  c.data_seed = rng.next() % 100000;
  // Drawn after the rest, so that a seed's earlier choices stay what they were before these axes.
  c.epochs = rng.chance(20) ? c.steps : 1;
  c.eval_batches = rng.chance(20) ? 1 : 0;
  for (auto& t : c.tables) t.data_type = rng.chance(15) ? "fp16" : "fp32";
  return normalised(c);
}

std::string scenario_yaml(const Config& raw, const std::string& name, const std::string& system,
                          const std::string& head, const std::string& matrix, const std::string& expect) {
  const Config c = normalised(raw);
  std::string y = fmt::format("version: 1\nname: {}\n{}", name, head);
  y += fmt::format("world_size: {}\nsteps: {}\nbatch_size: {}\n", c.world_size, c.steps, c.batch_size);
  if (matrix.empty()) y += fmt::format("system: {}\n", system);
  y += fmt::format("init: {{mode: seeded, seed: {}}}\n", c.data_seed % 1000);
  // Features: table i reads f<i>, or the feature of the first table of its kind.
  std::vector<std::string> feature(c.tables.size());
  std::string strides;
  for (size_t i = 0; i < c.tables.size(); ++i) {
    const auto& t = c.tables[i];
    feature[i] = fmt::format("f{}", i);
    if (t.shares_feature) {
      for (size_t j = 0; j < i; ++j) {
        if (sequence(c.tables[j]) == sequence(t)) {
          feature[i] = feature[j];
          break;
        }
      }
    }
    if (t.variable_batch && feature[i] == fmt::format("f{}", i)) {
      std::vector<std::string> per_rank;
      for (int r = 0; r < c.world_size; ++r) per_rank.push_back(std::to_string(1 + (r + 1) * 7 % c.batch_size));
      strides += fmt::format("    {}: {{stride_per_rank: [{}]}}\n", feature[i], fmt::join(per_rank, ", "));
    }
  }
  y += fmt::format("data:\n  seed: {}\n  ids_per_bag: [1, {}]\n", c.data_seed, c.max_ids_per_bag);
  if (!strides.empty()) y += "  features:\n" + strides;
  y += "tables:\n";
  for (size_t i = 0; i < c.tables.size(); ++i) {
    const auto& t = c.tables[i];
    y += fmt::format(
        "  - {{name: t{}, rows: {}, dim: {}, features: [{}], pooling: {}{}{}, sharding: {{types: [{}]}}}}\n", i, t.rows,
        t.dim, feature[i], t.pooling, c.weighted && !sequence(t) ? ", weighted: true" : "",
        t.data_type == "fp32" ? "" : ", data_type: " + t.data_type, t.sharding);
  }
  y += "optimizers:\n";
  y += fmt::format("  sparse: {{type: {}, lr: 0.1{}}}\n", c.sparse,
                   c.weight_decay ? ", weight_decay: 0.05, weight_decay_mode: l2" : "");
  y += fmt::format("  dense: {{type: {}, lr: {}}}\n", c.dense, c.dense == "adam" ? "0.01" : "0.1");
  std::vector<std::string> torchrec;
  if (c.loop != "plain") torchrec.push_back("loop: " + c.loop);
  if (c.epochs != 1) torchrec.push_back(fmt::format("epochs: {}", c.epochs));
  if (c.eval_batches != 0) torchrec.push_back(fmt::format("eval_batches: {}", c.eval_batches));
  if (!torchrec.empty()) y += fmt::format("torchrec: {{{}}}\n", fmt::join(torchrec, ", "));
  y += matrix;
  y += "expect:\n";
  // fp16 rows round each update to 2^-11 of their size on either side, in its own order.
  y += !expect.empty() ? expect
       : has_fp16(c)   ? "  - replicas: equal\n    global_model: {rtol: 1.0e-3, atol: 1.0e-4}\n"
                       : "  - replicas: equal\n    global_model: {rtol: 1.0e-5, atol: 1.0e-6}\n";
  return y;
}

std::vector<Config> simpler(const Config& c) {
  std::vector<Config> out;
  auto add = [&](Config s) {
    s = normalised(s);
    if (!(s == c) && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  // The biggest cuts first: a whole table, then ranks and steps, then each setting.
  for (size_t i = 0; c.tables.size() > 1 && i < c.tables.size(); ++i) {
    Config s = c;
    s.tables.erase(s.tables.begin() + static_cast<std::ptrdiff_t>(i));
    add(s);
  }
  // (A change that leaves `c` as it is adds nothing.)
  auto whole = [&](auto&& change) {
    Config s = c;
    change(s);
    add(s);
  };
  for (int w : {2, 1}) whole([&](Config& s) { s.world_size = std::min(s.world_size, w); });
  whole([](Config& s) { s.steps = 1; });
  whole([](Config& s) { s.loop = "plain"; });
  whole([](Config& s) { s.epochs = 1; });
  whole([](Config& s) { s.eval_batches = 0; });
  whole([](Config& s) { s.sparse = "sgd"; });
  whole([](Config& s) { s.weight_decay = false; });
  whole([](Config& s) { s.dense = "sgd"; });
  whole([](Config& s) { s.weighted = false; });
  whole([](Config& s) { s.batch_size = std::min(s.batch_size, 2); });
  whole([](Config& s) { s.max_ids_per_bag = 1; });
  for (size_t i = 0; i < c.tables.size(); ++i) {
    const TableDraw simplest;
    auto with = [&](auto&& change) {
      Config t = c;
      change(t.tables[i]);
      add(t);
    };
    with([](TableDraw& t) { t.variable_batch = false; });
    with([](TableDraw& t) { t.data_type = "fp32"; });
    with([](TableDraw& t) { t.shares_feature = false; });
    with([&](TableDraw& t) { t.sharding = simplest.sharding; });
    if (c.tables[i].pooling == "mean") with([](TableDraw& t) { t.pooling = "sum"; });
    with([&](TableDraw& t) { t.rows = std::min(t.rows, 8); });
    with([&](TableDraw& t) { t.dim = simplest.dim; });
  }
  return out;
}

Config minimise(const Config& start, const std::function<bool(const Config&)>& still_fails, int max_tries, int* tries) {
  Config c = normalised(start);
  int made = 0;
  bool progressed = true;
  while (progressed && made < max_tries) {
    progressed = false;
    for (const Config& s : simpler(c)) {
      if (made >= max_tries) break;
      ++made;
      if (still_fails(s)) {
        c = s;
        progressed = true;
        break;
      }
    }
  }
  if (tries) *tries = made;
  return c;
}

std::vector<std::string> traits(const Config& c) {
  const Config simplest;
  std::vector<std::string> out;
  if (c.world_size > simplest.world_size) out.push_back(fmt::format("{} ranks", c.world_size));
  if (c.steps > 1) out.push_back(fmt::format("{} steps", c.steps));
  if (c.sparse != simplest.sparse) out.push_back("sparse " + c.sparse);
  if (c.weight_decay) out.push_back("weight decay");
  if (c.dense != simplest.dense) out.push_back("dense " + c.dense);
  if (c.loop != simplest.loop) out.push_back(c.loop);
  if (c.epochs > 1) out.push_back(fmt::format("{} epochs", c.epochs));
  if (c.eval_batches > 0) out.push_back("eval passes");
  if (c.weighted) out.push_back("weighted");
  if (c.max_ids_per_bag > 1) out.push_back("bags of several ids");
  if (c.batch_size > 2) out.push_back(fmt::format("batch {}", c.batch_size));
  for (const auto& t : c.tables) {
    std::string phrase = fmt::format("table {} {}", t.sharding, t.pooling == "none" ? "sequence" : t.pooling);
    if (t.shares_feature) phrase += " shared feature";
    if (t.variable_batch) phrase += " variable batch";
    if (t.data_type != simplest.tables[0].data_type) phrase += " " + t.data_type;
    out.push_back(phrase);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> axis_values(const Config& c) {
  std::set<std::string> out = {fmt::format("world_size={}", c.world_size),
                               fmt::format("steps={}", c.steps),
                               fmt::format("sparse={}", c.sparse),
                               fmt::format("weight_decay={}", c.weight_decay),
                               fmt::format("dense={}", c.dense),
                               fmt::format("loop={}", c.loop),
                               fmt::format("epochs={}", c.epochs),
                               fmt::format("eval_batches={}", c.eval_batches),
                               fmt::format("weighted={}", c.weighted),
                               fmt::format("tables={}", c.tables.size()),
                               fmt::format("ids_per_bag=1..{}", c.max_ids_per_bag)};
  for (const auto& t : c.tables) {
    out.insert("sharding=" + t.sharding);
    out.insert("pooling=" + t.pooling);
    out.insert("data_type=" + t.data_type);
    if (t.shares_feature) out.insert("shared_feature=true");
    if (t.variable_batch) out.insert("variable_batch=true");
  }
  return {out.begin(), out.end()};
}

}  // namespace dmpcheck::explore
