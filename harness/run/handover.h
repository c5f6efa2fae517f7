// Who may take part in a run, and what they may believe: every run has a secret (made by
// dmpcheck's launcher and handed to its ranks as DMPCHECK_RUN_SECRET, or set by the user for the
// same value on every rank under an external launcher).  All the run's keys live under a prefix
// derived from it, so a process without it cannot find them to read or overwrite, and what the
// ranks receive (the scenario, the run spec) and what they send back (the result, their errors)
// carries an HMAC-SHA256 under it, so nothing forged is believed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/store.h"
#include "common/json.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

inline constexpr const char* kSecretVariable = "DMPCHECK_RUN_SECRET";

// The run's store keys besides the task's (hand_over's own "entries", "entry/<name>"), for the
// launcher, the ranks and the benchmark alike: rank 0's result, and a failing rank's error.
inline constexpr const char* kResultKey = "result";
inline std::string error_key(int rank) { return "error/" + std::to_string(rank); }

// The store's view for the run's keys: prefixed by a name derived from the secret.
comm::Store secret_view(const comm::Store& store, const std::string& secret);

// What a rank is asked to do: the one vocabulary of the launcher (or rank 0 under an external
// launcher) and the ranks, handed over as one signed entry.  A field neither side knows cannot be
// written by one and missed by the other.
enum class BenchKind { kNone, kSweep, kScenario };
NLOHMANN_JSON_SERIALIZE_ENUM(BenchKind, {{BenchKind::kNone, "none"},
                                         {BenchKind::kSweep, "sweep"},
                                         {BenchKind::kScenario, "scenario"}})

// The reference half of a side-by-side release cell (release/release_cell.cc): the same run on the
// reference DMP, dumping its whole state (init, every step, the outputs) into full_state_dir; under
// `profile` when set, sharing rank 0's start on every rank (a release starts from rank 0's
// data-parallel replicas, so the profile's #1739 broadcast is forced on), on `plan` when set
// (ShardingPlan text: the release's own placement).  Handed over whole; the worker derives the
// run from it in one place (reference_half_of).
struct ReferenceHalf {
  std::string full_state_dir;
  std::string profile;
  bool shares_its_start = false;
  std::string plan;
  std::vector<std::pair<std::string, std::string>> switches;  // turned on `profile`, in order
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ReferenceHalf, full_state_dir, profile, shares_its_start, plan,
                                                switches)

// `spec` as the reference half runs it: on the reference, no expectation of its own (its verdict is
// not used) but the outputs still dumped, under the half's profile and plan.
scenario::RunSpec reference_half_of(scenario::RunSpec spec, const ReferenceHalf& half);

struct RankTask {
  std::string scenario_file;
  std::string scenario_text;
  scenario::Overrides overrides;
  int64_t run_index = -1;  // -1: every run of the scenario (ranks under an external launcher)
  std::string checkpoint_dir;
  std::string dump_batches_dir;
  std::optional<ReferenceHalf> reference_half;
  // `dmpcheck bench`: a sweep (bench_options a BenchSpec) or a scenario benchmark (the probe's
  // warmup, iterations, bucket_caps); kNone for a run.  The backend, when set, replaces the run's.
  BenchKind bench_kind = BenchKind::kNone;
  std::optional<comm::Backend> bench_backend;
  nlohmann::json bench_options;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankTask, scenario_file, scenario_text, overrides, run_index,
                                                checkpoint_dir, dump_batches_dir, reference_half, bench_kind,
                                                bench_backend, bench_options)
// Launcher (or rank 0 under an external launcher): the task as one signed entry.  A rank: the
// task, once its MAC checks; Error(kCommunication) when it does not (forged, or written by a run
// with another secret).
void hand_over(comm::Store& store, const RankTask& task, const std::string& secret);
RankTask take_task(comm::Store& store, const std::string& secret);

// A value with its MAC (key and key + "#mac").
void set_signed(comm::Store& store, const std::string& key, const std::string& value, const std::string& secret);
// The value when present and its MAC checks; `problem` says why a present value was refused.
std::optional<std::string> get_signed(comm::Store& store, const std::string& key, const std::string& secret,
                                      std::string* problem = nullptr);

}  // namespace dmpcheck::run
