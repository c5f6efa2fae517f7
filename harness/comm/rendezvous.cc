#include "comm/rendezvous.h"

#include <cstdlib>

#include "common/error.h"

namespace dmpcheck::comm {
namespace {

int64_t parse_int(const std::string& name, const std::string& text, int64_t min, int64_t max) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DMP_CHECK(used == text.size() && !text.empty() && value >= min && value <= max,
            ErrorKind::kInvalidInput, "environment variable {}='{}': expected an integer in [{}, {}]",
            name, text, min, max);
  return value;
}

}  // namespace

RankEnvironment rank_environment_from(
    const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  static const Names kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
  };
  const Names* names = nullptr;
  for (const auto& candidate : kLaunchers) {
    if (lookup(candidate.rank).has_value()) {
      names = &candidate;
      break;
    }
  }
  DMP_CHECK(names != nullptr, ErrorKind::kInvalidInput,
            "no rank variables are set: a rank needs RANK and WORLD_SIZE (torchrun, `dmpcheck run`), SLURM_PROCID and "
            "SLURM_NTASKS (srun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK and PMI_SIZE, plus "
            "MASTER_ADDR and MASTER_PORT");
  auto required = [&](const std::string& name) {
    auto value = lookup(name);
    DMP_CHECK(value.has_value(), ErrorKind::kInvalidInput,
              "environment variable {} is not set; under {} a rank needs {}, {}, MASTER_ADDR and MASTER_PORT{}", name,
              names->launcher, names->rank, names->size,
              std::string(names->launcher) == "torchrun" ? "" : " (set MASTER_ADDR and MASTER_PORT yourself, e.g. the first host and a free port)");
    return *value;
  };
  RankEnvironment env;
  env.launcher = names->launcher;
  env.world_size = static_cast<int>(parse_int(names->size, required(names->size), 1, 1 << 20));
  env.rank = static_cast<int>(parse_int(names->rank, required(names->rank), 0, env.world_size - 1));
  env.master_addr = required("MASTER_ADDR");
  env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", required("MASTER_PORT"), 1, 65535));
  env.local_rank = env.rank;
  env.local_world_size = env.world_size;
  if (auto v = lookup(names->local_size)) {
    // SLURM_NTASKS_PER_NODE may read "2(x3)": the leading count is the tasks per node.
    const std::string text = v->substr(0, v->find('('));
    env.local_world_size = static_cast<int>(parse_int(names->local_size, text, 1, env.world_size));
  }
  if (auto v = lookup(names->local_rank)) {
    env.local_rank = static_cast<int>(parse_int(names->local_rank, *v, 0, env.local_world_size - 1));
  }
  return env;
}

RankEnvironment rank_environment_from_process() {
  return rank_environment_from([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace dmpcheck::comm
