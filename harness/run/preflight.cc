#include "run/preflight.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/settings.h"
#include "dmp/optim/fused_optimizer.h"
#include "dmp/planner.h"
#include "run/data_generator.h"

namespace dmpcheck::run {
namespace {

int64_t host_available_memory() {
  if (const std::string& v = settings().memory_available; !v.empty()) {
    try {
      return std::stoll(v);
    } catch (const std::exception&) {
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("DMPCHECK_MEMORY_AVAILABLE='{}': expected a number of bytes", v));
    }
  }
  return meminfo_available_bytes();
}

int64_t state_bytes(const dmp::FusedOptimizerConfig& o, int64_t rows, int64_t cols) {
  int64_t total = 0;
  for (const auto& s : dmp::FusedOptimizer::state_specs(o, rows, cols)) {
    int64_t n = 4;
    for (int64_t d : s.sizes) n *= d;
    total += n;
  }
  return total;
}

}  // namespace

int64_t meminfo_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;  // unknown: no memory check
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

RunMemory estimate_run_memory(const scenario::RunSpec& spec) {
  RunMemory m;
  dmp::ShardingPlan plan;
  try {
    // A release plans itself (memory_per_rank is its planner's to apply, with its own estimate):
    // the reference's plan here is only a proxy for how much memory its ranks take.
    scenario::RunSpec planned = spec;
    if (spec.on_torchrec()) planned.memory_per_rank = 0;
    plan = dmp::plan_sharding(scenario::planner_input(planned), spec.profile);
  } catch (const Error& e) {
    throw_error(ErrorKind::kInvalidScenario, fmt::format("run '{}': the plan fails: {}", spec.name, e.what()));
  }
  // What every rank holds at its peak (the reference DMP; a release holds less: no full draw).
  int64_t full_tables = 0, full_state = 0, dp_gradients = 0;
  for (const auto& t : spec.model.tables) {
    full_tables += t.num_embeddings * t.embedding_dim * 4;
    full_state += state_bytes(spec.sparse_optimizer, t.num_embeddings, t.embedding_dim);
  }
  for (const auto& t : plan.tables) {
    if (t.type != dmp::ShardingType::kDataParallel) continue;
    const auto& c = *std::find_if(spec.model.tables.begin(), spec.model.tables.end(),
                                  [&](const dmp::EmbeddingBagConfig& x) { return x.name == t.table; });
    dp_gradients += c.num_embeddings * c.embedding_dim * 4;  // the persistent gradient buffer
  }
  int64_t dense = 0;
  int64_t fan_in = spec.model.pooled_width();
  for (int64_t out : spec.model.dense_layers) {
    dense += (fan_in * out + out) * 4 * 4;  // weights, gradient, two optimizer states
    fan_in = out;
  }
  const auto shards = plan.bytes_per_rank();  // weights + optimizer state of each rank's shards
  const bool gathers = spec.expect.global_model.has_value() || spec.expect.reference.has_value();
  for (int r = 0; r < spec.world_size; ++r) {
    // The full draw of every table exists while the shards are cut from it (reset_parameters).
    int64_t peak = shards[static_cast<size_t>(r)] + full_tables + dense;
    std::string why = fmt::format("its shards with optimizer state {}, the full draw of every table {}",
                                  human_bytes(static_cast<double>(shards[static_cast<size_t>(r)])),
                                  human_bytes(static_cast<double>(full_tables)));
    if (dp_gradients > 0) {
      peak += dp_gradients;
      why += fmt::format(", data-parallel gradient buffers {}", human_bytes(static_cast<double>(dp_gradients)));
    }
    if (r == 0 && gathers) {
      // Rank 0 gathers every tensor whole and steps the unsharded model beside it.
      peak += 2 * (full_tables + full_state);
      why += fmt::format(", the gathered state and the unsharded model {}",
                         human_bytes(static_cast<double>(2 * (full_tables + full_state))));
    }
    m.host_bytes += peak;
    if (peak > m.largest_rank) {
      m.largest_rank = peak;
      m.breakdown = fmt::format("rank {}: {}", r, why);
    }
  }
  m.ranks_on_host = spec.world_size;
  return m;
}

void preflight(const scenario::Scenario& scenario, int64_t available) {
  if (available == 0) available = host_available_memory();
  std::vector<std::string> problems;
  for (const auto& spec : scenario.runs) {
    try {
      const RunMemory m = estimate_run_memory(spec);
      if (available > 0 && m.host_bytes > available) {
        problems.push_back(fmt::format(
            "run '{}': its {} rank(s) on this host would hold about {} at their peak ({}), but this host has {} "
            "available (MemAvailable); shrink the tables or spread the ranks over more hosts",
            spec.name, m.ranks_on_host, human_bytes(static_cast<double>(m.host_bytes)), m.breakdown,
            human_bytes(static_cast<double>(available))));
      }
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInvalidScenario) throw;
      problems.push_back(e.what());
    }
    // The report's own batches (data.from) are read here too, every step of every run: a file that
    // does not fit stops the scenario before any cell starts, whichever system the cell runs on.
    for (int step = 0; !spec.data.from.empty() && step < std::max(spec.steps, 1); ++step) {
      try {
        make_global_batch(spec, step);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kInvalidInput) throw;
        problems.push_back(fmt::format("run '{}': {}", spec.name, e.what()));
        break;
      }
    }
  }
  problems.erase(std::unique(problems.begin(), problems.end()), problems.end());
  if (problems.empty()) return;
  throw_error(ErrorKind::kInvalidScenario, problems.size() == 1
                                               ? fmt::format("{}: {}", scenario.file, problems.front())
                                               : fmt::format("{}: {} runs cannot start:\n  {}", scenario.file,
                                                             problems.size(), fmt::join(problems, "\n  ")));
}

}  // namespace dmpcheck::run
