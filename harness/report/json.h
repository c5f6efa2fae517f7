// RunResult <-> JSON.  The JSON is the RunResult's canonical form: workers hand it to the
// launcher in it, and reports/<scenario>/<run>.json is it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "check/run_result.h"

namespace dmpcheck::check {

void to_json(nlohmann::json& j, const TensorCheck& v);
void from_json(const nlohmann::json& j, TensorCheck& v);
void to_json(nlohmann::json& j, const GlobalModelCheck& v);
void from_json(const nlohmann::json& j, GlobalModelCheck& v);
void to_json(nlohmann::json& j, const BroadcastCost& v);
void from_json(const nlohmann::json& j, BroadcastCost& v);
void to_json(nlohmann::json& j, const ShardPlacement& v);
void from_json(const nlohmann::json& j, ShardPlacement& v);
void to_json(nlohmann::json& j, const TablePlacement& v);
void from_json(const nlohmann::json& j, TablePlacement& v);
void to_json(nlohmann::json& j, const Environment& v);
void from_json(const nlohmann::json& j, Environment& v);
void to_json(nlohmann::json& j, const ExpectationResult& v);
void from_json(const nlohmann::json& j, ExpectationResult& v);
void to_json(nlohmann::json& j, const RankFailure& v);
void from_json(const nlohmann::json& j, RankFailure& v);
void to_json(nlohmann::json& j, const StepDivergence& v);
void from_json(const nlohmann::json& j, StepDivergence& v);
void to_json(nlohmann::json& j, const Timings& v);
void from_json(const nlohmann::json& j, Timings& v);
void to_json(nlohmann::json& j, const LatencyStats& v);
void from_json(const nlohmann::json& j, LatencyStats& v);
void to_json(nlohmann::json& j, const BroadcastMethodCost& v);
void from_json(const nlohmann::json& j, BroadcastMethodCost& v);
void to_json(nlohmann::json& j, const BroadcastProbe& v);
void from_json(const nlohmann::json& j, BroadcastProbe& v);
void to_json(nlohmann::json& j, const RunResult& v);
void from_json(const nlohmann::json& j, RunResult& v);

}  // namespace dmpcheck::check

namespace dmpcheck::report {

// Writes `result` as JSON to `path` atomically (a temporary file, then rename), creating
// directories as needed.
void write_json_file(const check::RunResult& result, const std::string& path);
void write_text_file_atomically(const std::string& path, const std::string& text);

}  // namespace dmpcheck::report
