#include "suite/behaviour.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "check/expectations.h"
#include "release/torchrec_systems.h"
#include "scenario/system.h"

namespace dmpcheck::run {
namespace {

using Cell = std::vector<std::pair<std::string, std::string>>;

// The cell's matrix assignments without the ones a system replaces.
Cell without_system(const Cell& cell) {
  Cell out;
  for (const auto& kv : cell) {
    if (kv.first != "system" && kv.first != "profile") out.push_back(kv);
  }
  return out;
}

// Whether every assignment of `part` is in `whole` (a reference cell lacks the torchrec.* axes).
bool within(const Cell& part, const Cell& whole) {
  return std::all_of(part.begin(), part.end(),
                     [&](const auto& kv) { return std::find(whole.begin(), whole.end(), kv) != whole.end(); });
}

// "bug", "fixed", ... : the status's first words, without the why of "not runnable: <why>".
std::string status_word(const std::string& status) { return status.substr(0, status.find(':')); }

std::string system_of(const Cell& cell) {
  for (const auto& [k, v] : cell)
    if (k == "system") return v;
  return scenario::System{}.name();
}

// Whether `named` can be judged on a run whose own expectation is `ran`: a comparison is made only
// where the run's expectation asks for it (the reference under a profile, the unsharded model,
// the outputs, the resumed run), so an expectation that needs another one is judged on its own
// cell.  An expected failure is judged on any run.
bool comparable(const scenario::Expectation& named, const scenario::Expectation& ran) {
  if (named.error) return true;
  auto has = [](const auto& o) { return o.has_value(); };
  return has(named.reference) == has(ran.reference) && named.reference_profile == ran.reference_profile &&
         named.reference_switches == ran.reference_switches &&
         named.reference_draws_own_init == ran.reference_draws_own_init &&
         has(named.global_model) == has(ran.global_model) && has(named.outputs) == has(ran.outputs) &&
         has(named.resumed) == has(ran.resumed) && has(named.initial_state) == has(ran.initial_state);
}

// An expectation that something works: no failure, replicas equal, every comparison matching.
bool healthy(const scenario::Expectation& e) {
  return !e.error && e.replicas == scenario::ReplicaExpectation::kEqual && (!e.global_model || e.global_model->match) &&
         (!e.reference || e.reference->match) && (!e.resumed || e.resumed->match) &&
         (!e.initial_state || *e.initial_state);
}

}  // namespace

std::string cell_label(const Cell& cell) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : without_system(cell)) parts.push_back(k + "=" + v);
  return parts.empty() ? std::string("default") : fmt::format("{}", fmt::join(parts, " "));
}

std::string observation(const check::RunResult& r) {
  if (r.verdict == check::Verdict::kSkipped) return "skipped: " + r.skip_reason;
  if (r.failure && !r.script_ranks.empty() && r.failure->rank >= 0) {
    return fmt::format("the script failed: rank {} {}: {}", r.failure->rank, r.failure->cause,
                       r.failure->message.substr(0, 160));
  }
  if (r.failure) return fmt::format("error ({}): {}", r.failure->kind, r.failure->message.substr(0, 160));
  std::vector<std::string> diverged;
  for (const auto& c : r.replicas) {
    if (!c.equal && std::find(diverged.begin(), diverged.end(), c.name) == diverged.end()) diverged.push_back(c.name);
  }
  if (diverged.empty()) return "replicas equal";
  return fmt::format("replicas DIVERGE on {} tensor(s): {}", diverged.size(), fmt::join(diverged, ", "));
}

bool meets(const scenario::Expectation& expect, const check::RunResult& r, std::string* why_not) {
  std::string why;
  bool held = false;
  // A script's ranks that ran and failed are an outcome its expectations judge (exit, exception,
  // hang), not an error of the cell's: each named release's expectation is asked of it.
  const bool script_outcome = r.failure && !r.script_ranks.empty() && r.failure->kind != FailureKind::kInterrupted;
  if (r.failure && !script_outcome) {
    held = expect.error && expect.error->matches(r.failure->kind, r.failure->message);
    if (!held) {
      why = expect.error ? fmt::format("expected {}, got a {} error", expect.error->describe(), r.failure->kind)
                         : fmt::format("a {} error", r.failure->kind);
    }
  } else if (!r.failure && expect.error) {
    why = fmt::format("expected {}, and it ran without one", expect.error->describe());
  } else {  // a script's outcome, or a run without a failure that expects none
    const check::ExpectationResult e = check::evaluate_expectation(expect, r);
    held = e.held;
    if (!held) why = e.failures.empty() ? e.description : e.failures.front();
  }
  if (why_not) *why_not = why;
  return held;
}

std::vector<CellOnSystem> cells_on_system(const scenario::Scenario& original, const scenario::Scenario& replaced) {
  std::map<std::string, std::string> status;  // "torchrec==0.6.0" -> "bug"
  std::string bug_profile, fix_profile;
  if (original.reproduces) {
    for (const auto& [system, s] : original.reproduces->releases) status[system] = status_word(s);
    bug_profile = original.reproduces->bug_profile;
    fix_profile = original.reproduces->fix_profile;
  }
  std::vector<CellOnSystem> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < replaced.runs.size(); ++i) {
    const Cell cell = without_system(replaced.runs[i].cell);
    CellOnSystem c;
    c.label = cell_label(cell);
    if (!seen.insert(c.label).second) continue;
    c.run = i;
    // The behaviours the scenario names for this cell, newest release first.
    // A scenario that names no release's behaviour (a modelled bug no release is known to have):
    // its release cells' expectations are what a release is written to show.
    const bool names_releases = !status.empty();
    std::optional<scenario::System> newest;
    std::vector<NamedBehaviour> profiles;
    for (const auto& run : original.runs) {
      if (!within(without_system(run.cell), cell)) continue;
      if (run.system.kind == scenario::System::Kind::kRelease) {
        const auto it = status.find(run.system.name());
        if (names_releases && it == status.end()) continue;
        NamedBehaviour n{run.system.name(), names_releases ? it->second : "as written", run.expect, std::nullopt};
        for (size_t j = 0; j < replaced.runs.size(); ++j) {
          if (without_system(replaced.runs[j].cell) == cell && system_of(replaced.runs[j].cell) == run.system.name())
            n.run = j;
        }
        // The run to execute first: the one written for the newest release named.
        if (n.run && (!newest || version_less(newest->version, run.system.version))) {
          c.run = *n.run;
          newest = run.system;
        }
        c.named.push_back(std::move(n));
      } else if (run.system.kind == scenario::System::Kind::kReference && !bug_profile.empty() &&
                 (run.profile.name == bug_profile || run.profile.name == fix_profile)) {
        profiles.push_back({"profile " + run.profile.name, run.profile.name == bug_profile ? "bug" : "fixed",
                            run.expect, std::nullopt});
      }
    }
    // The profiles model the report in the reference, whose cells lack the torchrec axes: they judge a
    // cell only where no release's behaviour is named for it.
    if (c.named.empty()) c.named = std::move(profiles);
    c.expect = replaced.runs[c.run].expect;
    // A control: every release named, a buggy one among them, expects the same working behaviour of
    // this cell (the workaround beside the bug); it shows whether a release runs it, not which
    // behaviour it has.  (Where every release named is fixed or absent, working is that behaviour.)
    const std::string first_expect = c.named.empty() ? std::string() : c.named.front().expect.describe();
    c.control =
        !c.named.empty() && healthy(c.named.front().expect) &&
        std::any_of(c.named.begin(), c.named.end(), [](const NamedBehaviour& n) { return n.status == "bug"; }) &&
        std::all_of(c.named.begin(), c.named.end(),
                    [&](const NamedBehaviour& n) { return n.expect.describe() == first_expect; });
    out.push_back(std::move(c));
  }
  return out;
}

// Whether a failure is what the environment explains rather than what the commit does: the source
// reaching for an operator, schema or attribute of fbgemm or torch that the environment's builds
// lack.  Where dmpcheck chose the environment (a commit over the release before it), such a commit
// did not run there; where the user pinned it (--over), the error stays the commit's.
bool environment_explains(const check::RunResult& r) {
  if (!r.failure) return false;
  if (r.failure->kind == check::FailureKind::kImport || r.failure->kind == check::FailureKind::kEnvironment)
    return true;
  const std::string& m = r.failure->message;
  const auto has = [&](const char* text) { return m.find(text) != std::string::npos; };
  const bool operator_missing = has("Could not find schema for fbgemm::") || has("No such operator fbgemm::") ||
                                has("No such operator torch") || has("undefined symbol");
  const bool attribute_missing = has("AttributeError") && (has("an attribute of fbgemm_gpu's") || has("fbgemm") ||
                                                           has("torch.ops") || has("_OpNamespace") || has("torch._C"));
  return operator_missing || attribute_missing;
}

Behaviour behaviour_of(const CellOnSystem& cell, const check::RunResult& r) {
  Behaviour b;
  const std::string seen = observation(r);
  // An environment that could not be made ran nothing of TorchRec: no behaviour, as one not installed.
  b.skipped =
      r.verdict == check::Verdict::kSkipped || (r.failure && r.failure->kind == check::FailureKind::kEnvironment);
  b.failed = r.failure.has_value();
  // What an interrupt stopped showed nothing of the release: it is said so, and never judged.
  if (r.failure && r.failure->kind == check::FailureKind::kInterrupted) {
    b.skipped = true;
    b.key = "interrupted";
    b.text = "interrupted (SIGINT or SIGTERM) before it ended: not judged";
    return b;
  }
  if (b.skipped || cell.named.empty()) {
    b.key = b.skipped ? "skipped" : "other: " + seen;
    b.text = seen;
    return b;
  }
  if (cell.control) {
    std::string why;
    const bool ok = meets(cell.named.front().expect, r, &why);
    b.key = ok ? "control" : "other: " + seen;
    b.text = ok ? fmt::format("{} (as every release named expects: a control, it tells no behaviour apart)", seen)
                : fmt::format("{} (a control every release named runs, and this one does not: {})", seen, why);
    return b;
  }
  std::vector<std::string> as, words, whys;
  for (const auto& n : cell.named) {
    std::string why;
    if (!comparable(n.expect, cell.expect)) continue;  // judged on its own cell, where needed
    if (meets(n.expect, r, &why)) {
      as.push_back(fmt::format("{}: {}", n.system, n.status));
      if (std::find(words.begin(), words.end(), n.status) == words.end()) words.push_back(n.status);
    } else {
      whys.push_back(fmt::format("not {} ({})", n.system, why));
    }
  }
  if (words.size() == 1) {
    b.key = words[0];
    b.text = fmt::format("{} (as {})", seen, fmt::join(as, ", "));
  } else if (words.size() > 1) {
    b.key = "undecided";
    b.text = fmt::format("{} (as {}: this cell does not tell them apart)", seen, fmt::join(as, " and "));
  } else {
    b.key = "other: " + seen;
    b.text = fmt::format("{} (as none of the behaviours named: {})", seen, fmt::join(whys, "; "));
  }
  return b;
}

Behaviour judge_cell(const CellOnSystem& cell, const std::function<check::RunResult(size_t)>& run) {
  Behaviour first = behaviour_of(cell, run(cell.run));
  if (first.skipped || first.key.rfind("other", 0) != 0) return first;
  // Each named release's own cell, where its run differs (an expectation that asks for other
  // comparisons: a reference-only cell beside a global_model one), judged by its own expectations.
  std::set<size_t> tried = {cell.run};
  for (const auto& n : cell.named) {
    if (cell.control || !n.run || !tried.insert(*n.run).second) continue;
    const check::RunResult r = run(*n.run);
    std::string why;
    if (meets(n.expect, r, &why)) {
      return {n.status,
              fmt::format("{} (as {}: {}, run as its own cell; {})", observation(r), n.system, n.status, first.text),
              /*skipped=*/false, /*failed=*/r.failure.has_value()};
    }
  }
  return first;
}

}  // namespace dmpcheck::run
