// RunResult <-> JSON.  The JSON is the RunResult's canonical form: workers hand it to the
// launcher in it, and reports/<scenario>/<run>.json is it.  One mapping per type, each field
// named once (nlohmann's macros); a field missing from a report (an older dmpcheck's) reads as
// its default.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "check/run_result.h"
#include "common/json.h"

namespace dmpcheck {

// Both by their names (common/outcome.cc), in their own namespace for nlohmann::json to find.  A
// verdict this build cannot read is an error; a failure kind it does not know (a newer rank
// program's) reads as rank_failed.
void to_json(nlohmann::json& j, const Verdict& v);
void from_json(const nlohmann::json& j, Verdict& v);
void to_json(nlohmann::json& j, const FailureKind& v);
void from_json(const nlohmann::json& j, FailureKind& v);

}  // namespace dmpcheck

namespace dmpcheck::scenario {  // a phase by its name; one this build does not know is an error
void to_json(nlohmann::json& j, const Phase& p);
void from_json(const nlohmann::json& j, Phase& p);
}  // namespace dmpcheck::scenario

namespace dmpcheck::dmp {  // where nlohmann::json looks for a plan's shard
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Shard, rank, row_offset, rows, col_offset, cols, bytes)
}  // namespace dmpcheck::dmp

namespace dmpcheck::check {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TensorCheck, name, sharding, phase, equal, max_abs_diff,
                                                elements_differing, numel, differing_ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GlobalModelCheck, name, step, max_abs_diff, max_allowed_excess,
                                                within_tolerance, comparable, note, numel)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BroadcastCost, performed, bytes, tensors, collectives, bucket_cap_bytes,
                                                seconds, gbps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LatencyStats, min_s, p50_s, p99_s, max_s, mean_s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BroadcastMethodCost, method, bucket_cap_bytes, collectives, end_to_end,
                                                algbw_gbps, busbw_gbps, device, device_algbw_gbps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BroadcastProbe, performed, backend, world_size, bytes, tensors, warmup,
                                                iterations, methods, note)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TablePlacement, table, sharding, shards)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Environment, libtorch_version, backend, host, git_revision, world_size,
                                                cores, threads_per_rank)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ExpectationResult, description, held, failures)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankFailure, rank, kind, cause, message, last_lines)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Timings, init_s, train_s, check_s, total_s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StepDivergence, step, tensors_differing, max_abs_diff)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ReferenceDiff, name, step, max_abs_diff, max_rel_diff,
                                                elements_differing, numel, within_tolerance, note)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SystemUnderTest, name, torchrec, torch, fbgemm_gpu, simulated, notes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankLoop, rank, batches, next_after_exhausted, eval_batches)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Observation, rank, point, step, name, kind, value)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ScriptRank, rank, ended, exit_status, stopped, exception, output)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    RunResult, scenario, scenario_file, run, slug, cell, profile, switches, init_mode, system, environment, plan,
    resumed_plan, replicas, divergence, global_model_checked, global_model, reference_compared, reference,
    reference_first_break_step, init_from_compared, init_from, resumed_compared, resumed_world_size, resumed,
    quantized_compared, quantized, quantized_sharded_compared, quantized_sharded, quantized_reference_compared,
    quantized_reference, init_broadcast, broadcast_probe, losses, loop, loops, digests, script_ranks, script_hung,
    stray_processes, audit_phases, audit_gaps, observed, timings, failure, expectation, verdict, skip_reason)

}  // namespace dmpcheck::check

namespace dmpcheck::report {

// Writes `result` as JSON to `path` atomically (a temporary file, then rename), creating
// directories as needed.
void write_json_file(const check::RunResult& result, const std::string& path);
void write_text_file_atomically(const std::string& path, const std::string& text);

}  // namespace dmpcheck::report
