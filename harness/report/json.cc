#include "report/json.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "common/error.h"

namespace dmpcheck::check {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TensorCheck, name, sharding, phase, equal, max_abs_diff, elements_differing,
                                   numel, differing_ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GlobalModelCheck, name, step, max_abs_diff, max_allowed_excess, within_tolerance,
                                   comparable, note, numel)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BroadcastCost, performed, bytes, tensors, collectives, bucket_cap_bytes, seconds, gbps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ShardPlacement, rank, row_offset, rows, col_offset, cols, bytes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TablePlacement, table, sharding, shards)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Environment, libtorch_version, backend, host, git_revision, world_size, cores,
                                   threads_per_rank)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ExpectationResult, description, held, failures)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankFailure, rank, kind, cause, message, last_lines)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Timings, init_s, train_s, check_s, total_s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StepDivergence, step, tensors_differing, max_abs_diff)

void to_json(nlohmann::json& j, const RunResult& v) {
  j = nlohmann::json{{"scenario", v.scenario},
                     {"scenario_file", v.scenario_file},
                     {"run", v.run},
                     {"slug", v.slug},
                     {"cell", v.cell},
                     {"profile", v.profile},
                     {"init_mode", v.init_mode},
                     {"environment", v.environment},
                     {"plan", v.plan},
                     {"replicas", v.replicas},
                     {"divergence", v.divergence},
                     {"global_model_checked", v.global_model_checked},
                     {"global_model", v.global_model},
                     {"init_broadcast", v.init_broadcast},
                     {"losses", v.losses},
                     {"digests", v.digests},
                     {"timings", v.timings},
                     {"failure", v.failure ? nlohmann::json(*v.failure) : nlohmann::json(nullptr)},
                     {"expectation", v.expectation},
                     {"verdict", v.verdict}};
}

void from_json(const nlohmann::json& j, RunResult& v) {
  j.at("scenario").get_to(v.scenario);
  j.at("scenario_file").get_to(v.scenario_file);
  j.at("run").get_to(v.run);
  j.at("slug").get_to(v.slug);
  j.at("cell").get_to(v.cell);
  j.at("profile").get_to(v.profile);
  j.at("init_mode").get_to(v.init_mode);
  j.at("environment").get_to(v.environment);
  j.at("plan").get_to(v.plan);
  j.at("replicas").get_to(v.replicas);
  j.at("divergence").get_to(v.divergence);
  j.at("global_model_checked").get_to(v.global_model_checked);
  j.at("global_model").get_to(v.global_model);
  j.at("init_broadcast").get_to(v.init_broadcast);
  j.at("losses").get_to(v.losses);
  if (j.contains("digests")) j.at("digests").get_to(v.digests);
  j.at("timings").get_to(v.timings);
  if (j.at("failure").is_null()) {
    v.failure.reset();
  } else {
    v.failure = j.at("failure").get<RankFailure>();
  }
  j.at("expectation").get_to(v.expectation);
  j.at("verdict").get_to(v.verdict);
}

}  // namespace dmpcheck::check

namespace dmpcheck::report {

void write_json_file(const check::RunResult& result, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  DMP_CHECK(!ec, ErrorKind::kInvalidInput, "cannot create the report directory {}: {}",
            target.parent_path().string(), ec.message());
  const std::string temporary = path + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    DMP_CHECK(out.good(), ErrorKind::kInvalidInput, "cannot write the report {}", temporary);
    out << nlohmann::json(result).dump(2) << "\n";
    out.flush();
    DMP_CHECK(out.good(), ErrorKind::kInvalidInput, "writing the report {} failed", temporary);
  }
  fs::rename(temporary, target, ec);
  if (ec) {
    std::remove(temporary.c_str());
    throw_error(ErrorKind::kInvalidInput, fmt::format("cannot move the report into place at {}: {}", path, ec.message()));
  }
}

}  // namespace dmpcheck::report
