#include "dmp/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// TorchRec's planner on CPU (torchrec/distributed/planner, measured against 0.6.0 and 1.9.2 on
// 450 configurations): the batch size it assumes when none is given, and its bandwidths.
constexpr double kPlannerBatch = 512;
constexpr double kCpuMemoryBandwidth = 51.0 * 1024 * 1024 * 1024 / 1000;  // bytes per ms
constexpr double kIntraHostBandwidth = 600.0 * 1024 * 1024 * 1024 / 1000;

int64_t element_bytes(const EmbeddingBagConfig& t) { return t.data_type == DataType::kFp32 ? 4 : 2; }

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

// TorchRec's estimate of one table_wise or column_wise shard's time per step on CPU (ms, its
// fused kernel, batch 512 per rank): what its partitioner balances across ranks.
struct ShardPerf {
  double fwd_compute = 0, fwd_comms = 0, bwd_compute = 0, bwd_comms = 0;
  double total() const { return fwd_compute + bwd_compute + fwd_comms + bwd_comms; }  // in TorchRec's order
  ShardPerf& operator+=(const ShardPerf& o) {
    fwd_compute += o.fwd_compute;
    fwd_comms += o.fwd_comms;
    bwd_compute += o.bwd_compute;
    bwd_comms += o.bwd_comms;
    return *this;
  }
};

ShardPerf torchrec_shard_perf(int64_t cols, int world, int64_t element_bytes, bool weighted) {
  const double batch = kPlannerBatch * world;
  const double d = static_cast<double>(cols), e = static_cast<double>(element_bytes);
  const double penalty = cols >= 128 ? 1.0 : cols >= 64 ? 1.15 : 1.75;
  const double read = batch * 8 * (weighted ? 2 : 1) + batch * std::max(d, 32.0) * e + batch * d * e;
  const double fwd_compute = read * penalty / kCpuMemoryBandwidth, fwd_comms = batch * d * e / kIntraHostBandwidth;
  // ShardPerf{fwd_compute, fwd_comms, bwd_compute, bwd_comms}
  return {fwd_compute, fwd_comms, 2 * fwd_compute + (weighted ? 1.1 * fwd_compute : 0.0), fwd_comms};
}

// TorchRec's storage estimate of such a shard (bytes): weights, optimizer state, input and
// output buffers for a batch of 512 per rank.
int64_t torchrec_shard_storage(int64_t rows, int64_t cols, int world, int64_t element_bytes, double state_multiplier) {
  const int64_t batch = static_cast<int64_t>(kPlannerBatch) * world;
  const int64_t weights = rows * cols * element_bytes;
  return weights + static_cast<int64_t>(std::ceil(static_cast<double>(weights) * state_multiplier)) + batch * 8 +
         batch * cols * element_bytes;
}

}  // namespace

const char* sharding_type_name(ShardingType type) { return name_in(kShardingTypeNames, type); }
std::optional<ShardingType> parse_sharding_type(const std::string& name) { return value_in(kShardingTypeNames, name); }

int64_t torchrec_column_width(int64_t dim, int column_shards) {
  const int64_t least = column_shards > 0 ? std::max<int64_t>(1, dim / column_shards) : 128;
  for (int64_t w = least; w < dim; ++w) {
    if (dim % w == 0 && w % 4 == 0) return w;
  }
  return dim;
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
  std::string text =
      fmt::format("topology {} {} {}\n", topology.world_size, topology.local_world_size, topology.memory_per_rank);
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
  const int world = topo.world_size;
  auto state_bytes = [&](int64_t rows, int64_t cols) { return input.state_bytes ? input.state_bytes(rows, cols) : 0; };
  auto with_bytes = [&](std::vector<Shard> shards) {
    for (auto& s : shards) s.bytes = s.rows * s.cols * 4 + state_bytes(s.rows, s.cols);
    return shards;
  };
  auto constraints_of = [&](const EmbeddingBagConfig& t) -> const ShardingConstraints& {
    static const ShardingConstraints none;
    auto it = input.constraints.find(t.name);
    return it == input.constraints.end() ? none : it->second;
  };
  auto types_of = [&](const EmbeddingBagConfig& t) {
    const ShardingConstraints& c = constraints_of(t);
    return c.sharding_types.empty() ? std::vector<ShardingType>{ShardingType::kTableWise} : c.sharding_types;
  };
  std::vector<int> all_ranks(static_cast<size_t>(world));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);

  // TorchRec's order: tables placed the same way on every rank (data_parallel, row_wise,
  // table_row_wise) first, in model order; then the others by TorchRec's storage estimate,
  // largest first, ties in model order (Python's stable sort).
  std::vector<size_t> order(input.tables.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> storage(input.tables.size(), 0);
  for (size_t i = 0; i < input.tables.size(); ++i) {
    const EmbeddingBagConfig& t = input.tables[i];
    const double m = input.state_multiplier ? input.state_multiplier(t) : 0.0;
    const ShardingType first = types_of(t).front();
    const int64_t width = first == ShardingType::kColumnWise
                              ? torchrec_column_width(t.embedding_dim, constraints_of(t).column_shards)
                              : t.embedding_dim;
    for (int64_t c = 0; c < t.embedding_dim; c += width) {
      storage[i] += torchrec_shard_storage(t.num_embeddings, width, world, element_bytes(t), m);
    }
  }
  auto uniform = [&](size_t i) {
    const ShardingType first = types_of(input.tables[i]).front();
    return first == ShardingType::kDataParallel || first == ShardingType::kRowWise ||
           first == ShardingType::kTableRowWise;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (uniform(a) != uniform(b)) return uniform(a);
    return !uniform(a) && storage[a] > storage[b];
  });

  // Each rank's estimated time (TorchRec's perf, summed per component) and bytes held.
  std::vector<ShardPerf> perf(static_cast<size_t>(world));
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  // TorchRec's device order: least perf, then rank % local_world_size, then rank.  Under the
  // plan-per-rank profile each rank breaks ties from its own number instead.
  auto before = [&](const std::vector<ShardPerf>& by, int a, int b) {
    const double pa = by[static_cast<size_t>(a)].total(), pb = by[static_cast<size_t>(b)].total();
    if (pa != pb) return pa < pb;
    if (input.tie_break_rank != 0) {
      return (a - input.tie_break_rank + world) % world < (b - input.tie_break_rank + world) % world;
    }
    if (a % topo.local_world_size != b % topo.local_world_size)
      return a % topo.local_world_size < b % topo.local_world_size;
    return a < b;
  };

  ShardingPlan plan;
  plan.topology = topo;
  plan.tables.resize(input.tables.size());
  for (size_t index : order) {
    const EmbeddingBagConfig& t = input.tables[index];
    const ShardingConstraints& c = constraints_of(t);
    for (int r : c.ranks) {
      DMP_CHECK(r >= 0 && r < world, ErrorKind::kInvalidScenario,
                "table '{}': constraint rank {} does not exist at world size {}", t.name, r, world);
    }
    const std::vector<int>& allowed = c.ranks.empty() ? all_ranks : c.ranks;
    std::vector<std::string> reasons;
    bool placed = false;
    for (ShardingType type : types_of(t)) {
      std::vector<Shard> shards;
      std::vector<ShardPerf> trial = perf;
      std::vector<int64_t> after = load;
      // Table-wise and column-wise shards go one by one to the allowed rank that comes first in
      // TorchRec's device order and still has room (memory_per_rank).
      auto place = [&](int64_t col_offset, int64_t cols) {
        const int64_t bytes = t.num_embeddings * cols * 4 + state_bytes(t.num_embeddings, cols);
        int best = -1;
        for (int r : allowed) {
          if (topo.memory_per_rank > 0 && after[static_cast<size_t>(r)] + bytes > topo.memory_per_rank) continue;
          if (best < 0 || before(trial, r, best)) best = r;
        }
        if (best < 0) {
          int least = allowed.front();
          for (int r : allowed) least = after[static_cast<size_t>(r)] < after[static_cast<size_t>(least)] ? r : least;
          reasons.push_back(fmt::format("{} would put {} bytes on rank {} (limit {})", sharding_type_name(type),
                                        after[static_cast<size_t>(least)] + bytes, least, topo.memory_per_rank));
          return false;
        }
        trial[static_cast<size_t>(best)] += torchrec_shard_perf(cols, world, element_bytes(t), t.weighted);
        after[static_cast<size_t>(best)] += bytes;
        shards.push_back({best, 0, t.num_embeddings, col_offset, cols, bytes});
        return true;
      };
      bool fits = true;
      switch (type) {
        case ShardingType::kDataParallel:
          for (int r : all_ranks) shards.push_back({r, 0, t.num_embeddings, 0, t.embedding_dim, 0});
          break;
        case ShardingType::kTableWise: fits = place(0, t.embedding_dim); break;
        case ShardingType::kRowWise: shards = row_blocks(t, allowed); break;
        case ShardingType::kColumnWise: {
          const int64_t cols = torchrec_column_width(t.embedding_dim, c.column_shards);
          for (int64_t offset = 0; fits && offset < t.embedding_dim; offset += cols) fits = place(offset, cols);
          break;
        }
        case ShardingType::kTableRowWise: {
          // The host (group of local_world_size consecutive ranks) holding the fewest bytes.
          const int per_host = topo.local_world_size;
          auto host_load = [&](int h) {
            return std::accumulate(load.begin() + h * per_host, load.begin() + (h + 1) * per_host, int64_t{0});
          };
          int best_host = 0;
          for (int h = 1; h < world / per_host; ++h) best_host = host_load(h) < host_load(best_host) ? h : best_host;
          std::vector<int> host_ranks(static_cast<size_t>(per_host));
          std::iota(host_ranks.begin(), host_ranks.end(), best_host * per_host);
          shards = row_blocks(t, host_ranks);
          break;
        }
      }
      if (!fits) continue;
      if (type != ShardingType::kTableWise && type != ShardingType::kColumnWise) {
        // The same on every rank it spans (TorchRec's uniform partition): bytes only.
        shards = with_bytes(shards);
        after = load;
        for (const auto& s : shards) after[static_cast<size_t>(s.rank)] += s.bytes;
        const auto over = std::find_if(after.begin(), after.end(),
                                       [&](int64_t b) { return topo.memory_per_rank > 0 && b > topo.memory_per_rank; });
        if (over != after.end()) {
          reasons.push_back(fmt::format("{} would put {} bytes on rank {} (limit {})", sharding_type_name(type), *over,
                                        over - after.begin(), topo.memory_per_rank));
          continue;
        }
        trial = perf;
      }
      load = after;
      perf = trial;
      plan.tables[index] = TablePlan{t.name, type, shards};
      placed = true;
      break;
    }
    DMP_CHECK(placed, ErrorKind::kInvalidScenario, "table '{}' ({} x {}) fits nowhere: {}", t.name, t.num_embeddings,
              t.embedding_dim, fmt::join(reasons, "; "));
  }
  return plan;
}

ShardingPlan plan_sharding(PlannerInput input, const BehaviourProfile& profile) {
  if (!profile.planner_counts_optimizer_state) input.state_multiplier = nullptr;
  return plan_sharding(input);
}

}  // namespace dmpcheck::dmp
