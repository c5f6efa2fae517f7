#include "check/script_checks.h"

#include <algorithm>
#include <regex>

#include "common/names.h"

namespace dmpcheck::check {
namespace {

std::string ranks_text(const std::optional<int>& rank) {
  return rank ? fmt::format("rank {}", *rank) : std::string("any rank");
}

// The ranks a part of an expectation looks at: one, or all.
std::vector<const ScriptRank*> looked_at(const RunResult& result, const std::optional<int>& rank) {
  std::vector<const ScriptRank*> out;
  for (const auto& r : result.script_ranks) {
    if (!rank || r.rank == *rank) out.push_back(&r);
  }
  return out;
}

bool output_holds(const scenario::ScriptExpectation::Output& o, const ScriptRank& r) {
  if (o.test == "matches") {
    const std::regex pattern(o.text, std::regex::ECMAScript);
    return std::any_of(r.output.begin(), r.output.end(),
                       [&](const std::string& line) { return std::regex_search(line, pattern); });
  }
  return std::any_of(r.output.begin(), r.output.end(),
                     [&](const std::string& line) { return line.find(o.text) != std::string::npos; });
}

}  // namespace

std::optional<std::string> last_traceback_exception(const std::vector<std::string>& raw) {
  // torch.distributed (2.2 on) prefixes what an uncaught exception prints with "[rank<R>]: ".
  static const std::regex kRankPrefix(R"(^\[rank\d+\]: ?)");
  std::vector<std::string> lines;
  for (const auto& line : raw) lines.push_back(std::regex_replace(line, kRankPrefix, ""));
  std::optional<std::string> found;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("Traceback (most recent call last):", 0) != 0) continue;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const std::string& line = lines[j];
      if (line.empty() || line[0] == ' ' || line[0] == '\t') continue;
      found = line;
      break;
    }
  }
  return found;
}

bool exception_matches(const std::string& seen, const std::string& type, const std::string& message) {
  const size_t colon = seen.find(':');
  const std::string seen_type = seen.substr(0, colon);
  const std::string seen_message = colon == std::string::npos ? std::string() : seen.substr(colon + 1);
  const bool type_ok = seen_type == type || ends_with(seen_type, "." + type);
  return type_ok && seen_message.find(message) != std::string::npos;
}

bool names_tensor(const std::string& name, const std::string& tensor) {
  return tensor == name || ends_with(tensor, "." + name) || ends_with(tensor, "." + name + ".weight");
}

void judge_script(const scenario::ScriptExpectation& expect, const RunResult& result,
                  std::vector<std::string>& failures) {
  // A phase some rank did not record cannot be said equal; where a rank failed, that is its failure's to say.
  const bool all_exited_0 = std::all_of(result.script_ranks.begin(), result.script_ranks.end(),
                                        [](const ScriptRank& r) { return !r.stopped && r.exit_status == 0; });
  if (all_exited_0) {
    for (const auto& gap : result.audit_gaps) failures.push_back("the audit's " + gap);
  } else if (!expect.judges_failure()) {
    // Judged on a script's run that failed (a bisection asks each release's expectation of one run).
    for (const auto& r : result.script_ranks) {
      if (r.stopped || r.exit_status != 0) {
        failures.push_back(
            fmt::format("rank {} {}, and no exit, exception or hang expects a failing script", r.rank, r.ended));
        break;
      }
    }
  }
  if (expect.exit_status) {
    for (const ScriptRank* r : looked_at(result, expect.exit_rank)) {
      const bool nonzero = *expect.exit_status == scenario::ScriptExpectation::kNonzero;
      const bool any = *expect.exit_status == scenario::ScriptExpectation::kAny;
      const bool held = !r->stopped && (any || (nonzero ? r->exit_status != 0 : r->exit_status == *expect.exit_status));
      if (!held) {
        failures.push_back(fmt::format("rank {} {}, expected {}", r->rank, r->ended,
                                       any       ? "it to end by itself"
                                       : nonzero ? "a non-zero exit"
                                                 : fmt::format("exit {}", *expect.exit_status)));
      }
    }
  }
  for (const auto& o : expect.output) {
    const auto ranks = looked_at(result, o.rank);
    const bool any = std::any_of(ranks.begin(), ranks.end(), [&](const ScriptRank* r) { return output_holds(o, *r); });
    if (o.test == "lacks" && any) {
      for (const ScriptRank* r : ranks) {
        scenario::ScriptExpectation::Output contains = o;
        contains.test = "contains";
        if (output_holds(contains, *r))
          failures.push_back(fmt::format("rank {}'s output contains '{}', expected it lacking", r->rank, o.text));
      }
    } else if (o.test != "lacks" && !any) {
      failures.push_back(fmt::format("{}'s output {} '{}'", ranks_text(o.rank),
                                     o.test == "matches" ? "has no line matching" : "does not contain", o.text));
    }
  }
  if (expect.exception) {
    const auto& x = *expect.exception;
    const auto ranks = looked_at(result, x.rank);
    const bool any = std::any_of(ranks.begin(), ranks.end(), [&](const ScriptRank* r) {
      return !r->exception.empty() && exception_matches(r->exception, x.type, x.message);
    });
    if (!any) {
      std::vector<std::string> seen;
      for (const ScriptRank* r : ranks) {
        seen.push_back(fmt::format("rank {}: {}", r->rank, r->exception.empty() ? "no traceback" : r->exception));
      }
      failures.push_back(fmt::format("expected {} to raise {}{}; seen {}", ranks_text(x.rank), x.type,
                                     x.message.empty() ? "" : " containing '" + x.message + "'",
                                     fmt::join(seen, "; ")));
    }
  }
  if (expect.hang && !result.script_hung)
    failures.push_back("expected a rank to hang past timeout_s; every rank ended");
  if (!expect.hang && result.script_hung) {
    failures.push_back("a rank was still running when timeout_s ran out (a hang; expect it with 'hang: true')");
  }
}

}  // namespace dmpcheck::check
