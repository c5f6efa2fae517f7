#include "report/json.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "common/error.h"
#include "common/file_io.h"

namespace dmpcheck {

// Both by their names (common/outcome.cc), in their own namespace for nlohmann::json to find.  A verdict this build
// cannot read is an error; a failure kind it does not know (a newer rank program's) reads as rank_failed.
void to_json(nlohmann::json& j, const Verdict& v) { j = std::string(verdict_name(v)); }
void from_json(const nlohmann::json& j, Verdict& v) {
  const auto parsed = parse_verdict(j.get<std::string>());
  DMP_CHECK(parsed.has_value(), ErrorKind::kInvalidInput,
            "a run report's verdict '{}' is none of pass, fail, error, skipped", j.get<std::string>());
  v = *parsed;
}
void to_json(nlohmann::json& j, const FailureKind& v) { j = std::string(failure_kind_name(v)); }
void from_json(const nlohmann::json& j, FailureKind& v) {
  v = parse_failure_kind(j.get<std::string>()).value_or(FailureKind::kRankFailed);
}

}  // namespace dmpcheck

namespace dmpcheck::check {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TensorCheck, name, sharding, phase, equal, max_abs_diff, elements_differing, numel,
                                   differing_ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GlobalModelCheck, name, step, max_abs_diff, max_allowed_excess, within_tolerance,
                                   comparable, note, numel)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(BroadcastCost, performed, bytes, tensors, collectives, bucket_cap_bytes, seconds,
                                   gbps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LatencyStats, min_s, p50_s, p99_s, max_s, mean_s)

void to_json(nlohmann::json& j, const BroadcastMethodCost& v) {
  j = nlohmann::json{
      {"method", v.method},
      {"bucket_cap_bytes", v.bucket_cap_bytes},
      {"collectives", v.collectives},
      {"end_to_end", v.end_to_end},
      {"algbw_gbps", v.algbw_gbps},
      {"busbw_gbps", v.busbw_gbps},
      {"device", v.device ? nlohmann::json(*v.device) : nlohmann::json(nullptr)},
      {"device_algbw_gbps", v.device_algbw_gbps ? nlohmann::json(*v.device_algbw_gbps) : nlohmann::json(nullptr)}};
}

void from_json(const nlohmann::json& j, BroadcastMethodCost& v) {
  j.at("method").get_to(v.method);
  j.at("bucket_cap_bytes").get_to(v.bucket_cap_bytes);
  j.at("collectives").get_to(v.collectives);
  j.at("end_to_end").get_to(v.end_to_end);
  j.at("algbw_gbps").get_to(v.algbw_gbps);
  j.at("busbw_gbps").get_to(v.busbw_gbps);
  v.device = j.at("device").is_null() ? std::nullopt : std::optional<LatencyStats>(j.at("device").get<LatencyStats>());
  v.device_algbw_gbps = j.at("device_algbw_gbps").is_null()
                            ? std::nullopt
                            : std::optional<double>(j.at("device_algbw_gbps").get<double>());
}

// Written out (not the macro, whose functions are inline): `dmpcheck bench` reads probes too.
void to_json(nlohmann::json& j, const BroadcastProbe& v) {
  j = nlohmann::json{{"performed", v.performed},   {"backend", v.backend}, {"world_size", v.world_size},
                     {"bytes", v.bytes},           {"tensors", v.tensors}, {"warmup", v.warmup},
                     {"iterations", v.iterations}, {"methods", v.methods}, {"note", v.note}};
}

void from_json(const nlohmann::json& j, BroadcastProbe& v) {
  j.at("performed").get_to(v.performed);
  j.at("backend").get_to(v.backend);
  j.at("world_size").get_to(v.world_size);
  j.at("bytes").get_to(v.bytes);
  j.at("tensors").get_to(v.tensors);
  j.at("warmup").get_to(v.warmup);
  j.at("iterations").get_to(v.iterations);
  j.at("methods").get_to(v.methods);
  j.at("note").get_to(v.note);
}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ShardPlacement, rank, row_offset, rows, col_offset, cols, bytes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TablePlacement, table, sharding, shards)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Environment, libtorch_version, backend, host, git_revision, world_size, cores,
                                   threads_per_rank)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ExpectationResult, description, held, failures)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankFailure, rank, kind, cause, message, last_lines)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Timings, init_s, train_s, check_s, total_s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StepDivergence, step, tensors_differing, max_abs_diff)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ReferenceDiff, name, step, max_abs_diff, max_rel_diff, elements_differing, numel,
                                   within_tolerance, note)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SystemUnderTest, name, torchrec, torch, fbgemm_gpu, simulated, notes)

void to_json(nlohmann::json& j, const RunResult& v) {
  j = nlohmann::json{{"scenario", v.scenario},
                     {"scenario_file", v.scenario_file},
                     {"run", v.run},
                     {"slug", v.slug},
                     {"cell", v.cell},
                     {"profile", v.profile},
                     {"init_mode", v.init_mode},
                     {"system", v.system},
                     {"environment", v.environment},
                     {"plan", v.plan},
                     {"replicas", v.replicas},
                     {"divergence", v.divergence},
                     {"global_model_checked", v.global_model_checked},
                     {"global_model", v.global_model},
                     {"reference_compared", v.reference_compared},
                     {"reference", v.reference},
                     {"reference_first_break_step", v.reference_first_break_step},
                     {"init_from_compared", v.init_from_compared},
                     {"init_from", v.init_from},
                     {"init_broadcast", v.init_broadcast},
                     {"broadcast_probe", v.broadcast_probe},
                     {"losses", v.losses},
                     {"digests", v.digests},
                     {"timings", v.timings},
                     {"failure", v.failure ? nlohmann::json(*v.failure) : nlohmann::json(nullptr)},
                     {"expectation", v.expectation},
                     {"verdict", v.verdict},
                     {"skip_reason", v.skip_reason}};
}

void from_json(const nlohmann::json& j, RunResult& v) {
  j.at("scenario").get_to(v.scenario);
  j.at("scenario_file").get_to(v.scenario_file);
  j.at("run").get_to(v.run);
  j.at("slug").get_to(v.slug);
  j.at("cell").get_to(v.cell);
  j.at("profile").get_to(v.profile);
  j.at("init_mode").get_to(v.init_mode);
  if (j.contains("system")) j.at("system").get_to(v.system);
  j.at("environment").get_to(v.environment);
  j.at("plan").get_to(v.plan);
  j.at("replicas").get_to(v.replicas);
  j.at("divergence").get_to(v.divergence);
  j.at("global_model_checked").get_to(v.global_model_checked);
  j.at("global_model").get_to(v.global_model);
  v.reference_compared = j.value("reference_compared", false);
  if (j.contains("reference")) j.at("reference").get_to(v.reference);
  v.reference_first_break_step = j.value("reference_first_break_step", -1);
  v.init_from_compared = j.value("init_from_compared", false);
  if (j.contains("init_from")) j.at("init_from").get_to(v.init_from);
  j.at("init_broadcast").get_to(v.init_broadcast);
  if (j.contains("broadcast_probe")) j.at("broadcast_probe").get_to(v.broadcast_probe);
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
  v.skip_reason = j.value("skip_reason", std::string());
}

}  // namespace dmpcheck::check

namespace dmpcheck::report {

void write_json_file(const check::RunResult& result, const std::string& path) {
  write_text_file_atomically(path, nlohmann::json(result).dump(2) + "\n");
}

void write_text_file_atomically(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

}  // namespace dmpcheck::report
