#include "report/json.h"

#include "common/error.h"
#include "common/file_io.h"

namespace dmpcheck {

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

namespace dmpcheck::scenario {

void to_json(nlohmann::json& j, const Phase& p) { j = std::string(phase_name(p)); }
void from_json(const nlohmann::json& j, Phase& p) {
  const auto parsed = value_in(kPhaseNames, j.get<std::string>());
  DMP_CHECK(parsed.has_value(), ErrorKind::kInvalidInput, "a run report's phase '{}' is none of {}",
            j.get<std::string>(), fmt::join(names_in(kPhaseNames), ", "));
  p = *parsed;
}

}  // namespace dmpcheck::scenario

namespace dmpcheck::report {

void write_json_file(const check::RunResult& result, const std::string& path) {
  write_text_file_atomically(path, nlohmann::json(result).dump(2) + "\n");
}

void write_text_file_atomically(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

}  // namespace dmpcheck::report
