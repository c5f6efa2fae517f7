#include "dmp/planner.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

struct TypeName {
  ShardingType type;
  const char* name;
};
constexpr TypeName kTypeNames[] = {{ShardingType::kDataParallel, "data_parallel"},
                                   {ShardingType::kTableWise, "table_wise"},
                                   {ShardingType::kRowWise, "row_wise"},
                                   {ShardingType::kColumnWise, "column_wise"},
                                   {ShardingType::kTableRowWise, "table_row_wise"}};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The allowed rank with the fewest bytes, ties to the lowest; `avoid` ranks are skipped while
// any other is left.
int least_loaded(const std::vector<int>& allowed, const std::vector<int64_t>& load, const std::set<int>& avoid,
                 int tie_break_rank) {
  const int world = static_cast<int>(load.size());
  auto order = [&](int r) { return (r - tie_break_rank + world) % world; };
  int best = -1;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {
    for (int r : allowed) {
      if (pass == 0 && avoid.count(r)) continue;
      const auto lr = load[static_cast<size_t>(r)];
      if (best < 0 || lr < load[static_cast<size_t>(best)] ||
          (lr == load[static_cast<size_t>(best)] && order(r) < order(best))) {
        best = r;
      }
    }
  }
  return best;
}

// Row blocks of ceil(rows / n) over `ranks`, in order.
std::vector<Shard> row_blocks(const EmbeddingBagConfig& t, const std::vector<int>& ranks) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  const int64_t block = ceil_div(t.num_embeddings, n);
  std::vector<Shard> shards;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = std::min(t.num_embeddings, i * block);
    const int64_t end = std::min(t.num_embeddings, (i + 1) * block);
    shards.push_back({ranks[static_cast<size_t>(i)], begin, end - begin, 0, t.embedding_dim, 0});
  }
  return shards;
}

}  // namespace

const char* sharding_type_name(ShardingType type) {
  for (const auto& t : kTypeNames) {
    if (t.type == type) return t.name;
  }
  return "unknown";
}

std::optional<ShardingType> parse_sharding_type(const std::string& name) {
  for (const auto& t : kTypeNames) {
    if (name == t.name) return t.type;
  }
  return std::nullopt;
}

std::vector<std::string> sharding_type_names() {
  std::vector<std::string> names;
  for (const auto& t : kTypeNames) names.push_back(t.name);
  return names;
}

std::vector<int64_t> divisors(int64_t dim) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= dim; ++d) {
    if (dim % d == 0) out.push_back(d);
  }
  return out;
}

std::vector<int> TablePlan::ranks() const {
  std::set<int> r;
  for (const auto& s : shards) r.insert(s.rank);
  return {r.begin(), r.end()};
}

const TablePlan& ShardingPlan::of(const std::string& table) const {
  for (const auto& t : tables) {
    if (t.table == table) return t;
  }
  throw_error(ErrorKind::kInternal, fmt::format("the sharding plan has no table '{}'", table));
}

std::vector<int64_t> ShardingPlan::bytes_per_rank() const {
  std::vector<int64_t> bytes(static_cast<size_t>(topology.world_size), 0);
  for (const auto& t : tables) {
    for (const auto& s : t.shards) bytes[static_cast<size_t>(s.rank)] += s.bytes;
  }
  return bytes;
}

std::string ShardingPlan::serialize() const {
  std::string text = fmt::format("topology {} {} {}\n", topology.world_size, topology.local_world_size, topology.memory_per_rank);
  for (const auto& t : tables) {
    text += fmt::format("table {} {} {}\n", t.table, sharding_type_name(t.type), t.shards.size());
    for (const auto& s : t.shards) {
      text += fmt::format("shard {} {} {} {} {} {}\n", s.rank, s.row_offset, s.rows, s.col_offset, s.cols, s.bytes);
    }
  }
  return text;
}

ShardingPlan ShardingPlan::deserialize(const std::string& text) {
  std::istringstream in(text);
  ShardingPlan plan;
  std::string word;
  in >> word >> plan.topology.world_size >> plan.topology.local_world_size >> plan.topology.memory_per_rank;
  DMP_INTERNAL_ASSERT(word == "topology" && in, "malformed plan text");
  while (in >> word) {
    DMP_INTERNAL_ASSERT(word == "table", "malformed plan text at '{}'", word);
    TablePlan t;
    std::string type;
    size_t count = 0;
    in >> t.table >> type >> count;
    auto parsed = parse_sharding_type(type);
    DMP_INTERNAL_ASSERT(parsed.has_value(), "malformed plan: sharding type '{}'", type);
    t.type = *parsed;
    for (size_t i = 0; i < count; ++i) {
      Shard s;
      in >> word >> s.rank >> s.row_offset >> s.rows >> s.col_offset >> s.cols >> s.bytes;
      DMP_INTERNAL_ASSERT(word == "shard" && in, "malformed plan shard");
      t.shards.push_back(s);
    }
    plan.tables.push_back(t);
  }
  return plan;
}

ShardingPlan plan_sharding(const PlannerInput& input) {
  const Topology& topo = input.topology;
  DMP_CHECK(topo.world_size >= 1 && topo.local_world_size >= 1 && topo.world_size % topo.local_world_size == 0,
            ErrorKind::kInvalidScenario, "topology: world size {} is not a multiple of the local world size {}",
            topo.world_size, topo.local_world_size);
  auto state_bytes = [&](int64_t rows, int64_t cols) { return input.state_bytes ? input.state_bytes(rows, cols) : 0; };
  auto with_bytes = [&](std::vector<Shard> shards) {
    for (auto& s : shards) s.bytes = s.rows * s.cols * 4 + state_bytes(s.rows, s.cols);
    return shards;
  };
  std::vector<int> all_ranks(static_cast<size_t>(topo.world_size));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);

  ShardingPlan plan;
  plan.topology = topo;
  plan.tables.resize(input.tables.size());
  std::vector<size_t> order(input.tables.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t ba = input.tables[a].bytes(), bb = input.tables[b].bytes();
    return ba != bb ? ba > bb : input.tables[a].name < input.tables[b].name;
  });

  std::vector<int64_t> load(static_cast<size_t>(topo.world_size), 0);
  for (size_t index : order) {
    const EmbeddingBagConfig& t = input.tables[index];
    auto it = input.constraints.find(t.name);
    const ShardingConstraints none;
    const ShardingConstraints& c = it == input.constraints.end() ? none : it->second;
    for (int r : c.ranks) {
      DMP_CHECK(r >= 0 && r < topo.world_size, ErrorKind::kInvalidScenario,
                "table '{}': constraint rank {} does not exist at world size {}", t.name, r, topo.world_size);
    }
    const std::vector<int>& allowed = c.ranks.empty() ? all_ranks : c.ranks;
    const std::vector<ShardingType> types = c.sharding_types.empty() ? std::vector<ShardingType>{ShardingType::kTableWise}
                                                                     : c.sharding_types;
    std::vector<std::string> reasons;
    bool placed = false;
    for (ShardingType type : types) {
      std::vector<Shard> shards;
      switch (type) {
        case ShardingType::kDataParallel:
          for (int r : all_ranks) shards.push_back({r, 0, t.num_embeddings, 0, t.embedding_dim, 0});
          break;
        case ShardingType::kTableWise:
          shards.push_back({least_loaded(allowed, load, {}, input.tie_break_rank), 0, t.num_embeddings, 0, t.embedding_dim, 0});
          break;
        case ShardingType::kRowWise:
          shards = row_blocks(t, allowed);
          break;
        case ShardingType::kColumnWise: {
          int64_t k = c.column_shards;
          if (k == 0) {
            // TorchRec's default: shards of the smallest width >= 128 that divides the dim and is
            // a multiple of 4, else one shard (so dims up to 128 stay whole).
            int64_t width = t.embedding_dim;
            for (int64_t w = 128; w < t.embedding_dim; ++w) {
              if (t.embedding_dim % w == 0 && w % 4 == 0) {
                width = w;
                break;
              }
            }
            k = t.embedding_dim / width;
          }
          DMP_CHECK(t.embedding_dim % k == 0, ErrorKind::kInvalidScenario,
                    "table '{}': dim {} cannot be split into {} column shards; shard counts that divide it: {}", t.name,
                    t.embedding_dim, k, fmt::join(divisors(t.embedding_dim), ", "));
          std::vector<int64_t> trial = load;
          std::set<int> used;
          const int64_t cols = t.embedding_dim / k;
          for (int64_t i = 0; i < k; ++i) {
            const int r = least_loaded(allowed, trial, used, input.tie_break_rank);
            used.insert(r);
            trial[static_cast<size_t>(r)] += t.num_embeddings * cols * 4 + state_bytes(t.num_embeddings, cols);
            shards.push_back({r, 0, t.num_embeddings, i * cols, cols, 0});
          }
          break;
        }
        case ShardingType::kTableRowWise: {
          // The host (group of local_world_size consecutive ranks) holding the fewest bytes.
          const int hosts = topo.world_size / topo.local_world_size;
          int best_host = 0;
          int64_t best_load = -1;
          for (int h = 0; h < hosts; ++h) {
            int64_t host_load = 0;
            for (int r = h * topo.local_world_size; r < (h + 1) * topo.local_world_size; ++r) host_load += load[static_cast<size_t>(r)];
            if (best_load < 0 || host_load < best_load) {
              best_load = host_load;
              best_host = h;
            }
          }
          std::vector<int> host_ranks;
          for (int r = best_host * topo.local_world_size; r < (best_host + 1) * topo.local_world_size; ++r) host_ranks.push_back(r);
          shards = row_blocks(t, host_ranks);
          break;
        }
      }
      shards = with_bytes(shards);
      std::vector<int64_t> after = load;
      for (const auto& s : shards) after[static_cast<size_t>(s.rank)] += s.bytes;
      int over = -1;
      if (topo.memory_per_rank > 0) {
        for (int r = 0; r < topo.world_size && over < 0; ++r) {
          if (after[static_cast<size_t>(r)] > topo.memory_per_rank) over = r;
        }
      }
      if (over >= 0) {
        reasons.push_back(fmt::format("{} would put {} bytes on rank {} (limit {})", sharding_type_name(type),
                                      after[static_cast<size_t>(over)], over, topo.memory_per_rank));
        continue;
      }
      load = after;
      plan.tables[index] = TablePlan{t.name, type, shards};
      placed = true;
      break;
    }
    DMP_CHECK(placed, ErrorKind::kInvalidScenario, "table '{}' ({} x {}) fits nowhere: {}", t.name, t.num_embeddings,
              t.embedding_dim, fmt::join(reasons, "; "));
  }
  return plan;
}

}  // namespace dmpcheck::dmp
