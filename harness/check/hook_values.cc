#include "check/hook_values.h"

#include <cctype>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dmpcheck::check {

void judge_observed(const std::vector<std::pair<std::string, std::string>>& expected,
                    const std::vector<Observation>& observed, int world_size, std::vector<std::string>& failures) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const auto& [name, want] : expected) {
    for (int rank = 0; rank < world_size; ++rank) {  // the oracle's (kUnshardedRank) are not judged
      const Observation* last = nullptr;
      for (const auto& o : observed) {
        if (o.rank == rank && o.name == name) last = &o;
      }
      if (last == nullptr) {
        failures.push_back(fmt::format("no hook returned {} on rank {}", name, rank));
        continue;
      }
      bool same = last->value == want;
      if (last->kind == "bool") {
        const std::string w = lower(want);
        const bool truthy = w == "true" || w == "yes", falsy = w == "false" || w == "no";
        same = (truthy || falsy) && truthy == (last->value == "true");
      }
      if (last->kind == "number") {
        try {
          same = std::stod(last->value) == std::stod(want);
        } catch (const std::exception&) { same = false; }
      }
      if (!same) {
        failures.push_back(fmt::format("{} is {} on rank {} ({} {}), expected {}", name, last->value, rank, last->point,
                                       last->step, want));
      }
    }
  }
}

namespace {

// Two values of a name: numbers as numbers (a hook's 4 and 4.0), anything else as written.
bool same_value(const Observation& a, const Observation& b) {
  if (a.kind == "number" && b.kind == "number") {
    try {
      return std::stod(a.value) == std::stod(b.value);
    } catch (const std::exception&) { return a.value == b.value; }
  }
  return a.value == b.value;
}

}  // namespace

std::string describe_hook_value(const std::string& name, const std::vector<Observation>& observed) {
  std::map<int, const Observation*> last;
  const Observation* oracle = nullptr;
  for (const auto& o : observed) {
    if (o.name != name) continue;
    if (o.rank == kUnshardedRank) {
      oracle = &o;
    } else {
      last[o.rank] = &o;
    }
  }
  auto when = [](const Observation& o) {
    return o.point == "after_wrap" || o.point == "build_model" ? o.point : fmt::format("{}, step {}", o.point, o.step);
  };
  std::string oracle_said;
  if (oracle != nullptr) {
    // The ranks' values of the same hook at the same step: the oracle agrees where all are its own.
    std::vector<std::string> differing;
    bool any = false;
    for (const auto& o : observed) {
      if (o.rank == kUnshardedRank || o.name != name || o.point != oracle->point || o.step != oracle->step) continue;
      any = true;
      if (!same_value(o, *oracle)) differing.push_back(std::to_string(o.rank));
    }
    oracle_said = fmt::format("; the unsharded model's hook_{} ({}) {}", oracle->point, when(*oracle),
                              !any                ? "returned " + oracle->value
                              : differing.empty() ? std::string("agrees")
                                                  : fmt::format("returned {}: it DIFFERS from rank(s) {}",
                                                                oracle->value, fmt::join(differing, ",")));
  }
  if (last.empty()) return fmt::format("   hook value {}: on no rank{}\n", name, oracle_said);
  std::vector<std::string> values;
  bool agree = true;
  for (const auto& [rank, o] : last) {
    values.push_back(fmt::format("rank {} {}", rank, o->value));
    agree = agree && same_value(*o, *last.begin()->second);
  }
  return fmt::format("   hook value {} ({}): {}{}{}\n", name, when(*last.begin()->second), fmt::join(values, ", "),
                     last.size() > 1 ? (agree ? " (ranks agree)" : " (ranks DIFFER)") : "", oracle_said);
}

}  // namespace dmpcheck::check
