#include "explore/explore.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "common/error.h"
#include "common/file_io.h"
#include "explore/space.h"
#include "run/launcher.h"
#include "scenario/scenario.h"
#include "suite/cells.h"

namespace dmpcheck::explore {
namespace {

using Clock = std::chrono::steady_clock;

// What one configuration showed on a system.
struct Outcome {
  enum Kind { kPassed, kRefused, kFinding, kSkipped, kInvalid } kind = kPassed;
  std::string signature;  // a finding's: which check broke, or how the rank died
  std::string text;       // what to show: the refusal's or the failure's first line
  std::optional<FailureKind> failure;
  std::vector<std::string> diverged;  // replicas that differ at the end
};

std::string first_line(const std::string& s, size_t width = 160) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > width ? line.substr(0, width) + "..." : line;
}

// A release's own words for "I do not do this": not supported, not implemented, no plan for it.
bool refusal(const std::string& message) {
  static const std::regex kRefusal(
      "not supported|not implemented|notimplementederror|no available sharding|unsupported|only supports|"
      "is not allowed|does not support|support is enabled for",
      std::regex::icase);
  return std::regex_search(message, kRefusal);
}

// An error's message with its numbers taken out (sizes and indices vary with the configuration),
// so that one failure is one signature while the minimiser changes the sizes.
std::string normalised_message(const std::string& message) {
  static const std::regex kNumber("[0-9]+");
  return first_line(std::regex_replace(message, kNumber, "N"), 100);
}

Outcome classify(const check::RunResult& r) {
  Outcome o;
  if (r.verdict == Verdict::kPass) return o;
  if (r.verdict == Verdict::kSkipped) return Outcome{Outcome::kSkipped, {}, r.skip_reason, {}, {}};
  if (r.failure) {
    const FailureKind k = r.failure->kind;
    o.failure = k;
    o.text = first_line(r.failure->message.empty() ? r.failure->cause : r.failure->message);
    switch (k) {
      case FailureKind::kUnsupported:
      case FailureKind::kImport:
        o.kind = Outcome::kRefused;  // dmpcheck's rank program cannot express it on this release
        return o;
      case FailureKind::kTorchRec:
        // The release says it does not do this (a refusal), or fails inside what it accepted
        // (a finding: an exception in a collective or a kernel of a configuration it planned).
        if (refusal(o.text)) {
          o.kind = Outcome::kRefused;
        } else {
          o.kind = Outcome::kFinding;
          o.signature = "error: " + normalised_message(o.text);
        }
        return o;
      case FailureKind::kInvalidScenario:
      case FailureKind::kInvalidInput:
      case FailureKind::kInternal:
      case FailureKind::kEnvironment:
      case FailureKind::kInterrupted: o.kind = Outcome::kInvalid; return o;
      default:
        o.kind = Outcome::kFinding;
        o.signature = fmt::format("{}: {}", failure_kind_name(k), first_line(r.failure->cause, 60));
        return o;
    }
  }
  o.kind = Outcome::kFinding;
  std::vector<std::string> broke;
  for (const auto& t : r.replicas) {
    if (!t.equal && t.phase == scenario::Phase::kFinal) o.diverged.push_back(t.name);
  }
  if (!o.diverged.empty()) broke.push_back("replicas diverge");
  if (std::any_of(r.global_model.begin(), r.global_model.end(), [](const auto& g) { return !g.comparable; }))
    broke.push_back("not comparable with its unsharded model");
  if (std::any_of(r.global_model.begin(), r.global_model.end(),
                  [](const auto& g) { return g.comparable && !g.within_tolerance; }))
    broke.push_back("differs from its unsharded model");
  if (broke.empty())
    broke.push_back(r.expectation.failures.empty() ? "fails" : first_line(r.expectation.failures[0], 80));
  o.signature = fmt::format("{}", fmt::join(broke, ", "));
  std::string worst;
  double excess = -1e300;
  for (const auto& g : r.global_model) {
    if (g.comparable && !g.within_tolerance && g.max_allowed_excess > excess) {
      excess = g.max_allowed_excess;
      worst = fmt::format("{} at step {} (max |diff| {:.3g})", g.name, g.step, g.max_abs_diff);
    }
  }
  o.text = o.signature + (worst.empty() ? "" : "; worst " + worst) +
           (o.diverged.empty() ? "" : fmt::format("; diverged: {}", fmt::join(o.diverged, ", ")));
  return o;
}

struct Finding {
  Config config;  // minimised
  std::vector<std::string> traits;
  std::string signature, text, file;
  uint64_t first_index = 0;
  int minimise_runs = 0, seen = 1;
  std::string against;     // what the second system showed
  bool confirmed = false;  // the written file, run as any scenario file, met its own expectations
  bool checked = false;    // ... and whether it was run at all (not when the search was interrupted)
};

class Search {
 public:
  explicit Search(const ExploreOptions& o) : o_(o), start_(Clock::now()) {
    run_options_.worker_executable = o.worker_executable;
    run_options_.out_dir = o.out_dir + "/runs";
    run_options_.write_reports = false;
    run_options_.echo_rank_output = false;
  }

  Outcome run(const Config& c, const std::string& system) {
    const std::string yaml = scenario_yaml(c, "explore", system);
    try {
      const scenario::Scenario s = scenario::load_scenario_text(yaml, "explore configuration");
      ++runs_;
      return classify(run::run_cell(s, 0, run_options_));
    } catch (const Error& e) { return Outcome{Outcome::kInvalid, {}, first_line(e.what()), {}, {}}; }
  }

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void progress(uint64_t tried) {
    if (!o_.out) return;
    *o_.out << fmt::format("\rexplore {}: {} tried: {} passed, {} refused, {} failing -> {} finding(s); {} runs, "
                           "{:.0f} of {:.0f} s   ",
                           o_.system, tried, passed_, refused_, failing_, findings_.size(), runs_, elapsed(),
                           o_.budget_s)
            << std::flush;
  }

  int main() {
    std::filesystem::create_directories(o_.out_dir + "/findings");
    // The simplest configuration first: a release that cannot run it cannot be searched.
    const Outcome first = run(Config{}, o_.system);
    if (first.kind == Outcome::kSkipped || first.kind == Outcome::kRefused || first.kind == Outcome::kInvalid) {
      if (o_.out)
        *o_.out << fmt::format("explore: {} cannot run the simplest configuration: {}\n", o_.system, first.text);
      return first.kind == Outcome::kInvalid ? 2 : 3;
    }
    uint64_t tried = 0;
    for (uint64_t i = 0;
         elapsed() < o_.budget_s && (o_.max_configs <= 0 || tried < static_cast<uint64_t>(o_.max_configs)) &&
         !run::interrupt_requested();
         ++i) {
      const Config c = draw(o_.seed, i);
      for (const auto& a : axis_values(c)) ++coverage_[a];
      const Outcome got = run(c, o_.system);
      ++tried;
      switch (got.kind) {
        case Outcome::kPassed: ++passed_; break;
        case Outcome::kRefused:
          ++refused_;
          ++refusals_[got.text];
          break;
        case Outcome::kSkipped:
        case Outcome::kInvalid:
          ++invalid_;
          ++refusals_["(invalid) " + got.text];
          break;
        case Outcome::kFinding:
          ++failing_;
          found(i, c, got);
          break;
      }
      progress(tried);
    }
    if (o_.out) *o_.out << "\n";
    // Interrupted, the search keeps what it found as it found it: nothing more is run, so no
    // finding is judged on runs that were stopped.
    interrupted_ = run::interrupt_requested();
    for (auto& f : findings_) {
      if (interrupted_) break;
      if (!o_.against.empty()) vet(f);
      confirm(f);
    }
    write_reports(tried);
    return findings_.empty() ? 0 : 1;
  }

 private:
  // A failing configuration: a finding already known (its minimised needs are all in this one and
  // it fails the same way), or minimised into a new one.
  void found(uint64_t index, const Config& c, const Outcome& got) {
    const auto have = traits(c);
    for (auto& f : findings_) {
      if (f.signature == got.signature && std::all_of(f.traits.begin(), f.traits.end(), [&](const std::string& t) {
            return std::find(have.begin(), have.end(), t) != have.end();
          })) {
        ++f.seen;
        return;
      }
    }
    Finding f;
    f.first_index = index;
    f.signature = got.signature;
    f.config = minimise(
        c, [&](const Config& s) { return run(s, o_.system).signature == got.signature; }, o_.minimise_tries,
        &f.minimise_runs);
    f.traits = traits(f.config);
    for (auto& known : findings_) {
      if (known.signature == f.signature && known.traits == f.traits) {
        ++known.seen;
        return;
      }
    }
    // A minimisation stopped by an interrupt is not a minimisation: the configuration as drawn stays.
    if (run::interrupt_requested()) {
      f.config = c;
      f.traits = have;
    }
    const Outcome again = run::interrupt_requested() ? got : run(f.config, o_.system);
    f.text = again.text;
    f.file = fmt::format("{}/findings/explore-{}-{}.yaml", o_.out_dir, o_.seed, findings_.size() + 1);
    findings_.push_back(f);
    write_finding(findings_.back(), again, std::nullopt);
  }

  // The finding's file run as a user runs it: every cell meets its expectations, or the report says not.
  void confirm(Finding& f) {
    f.checked = true;
    try {
      const scenario::Scenario s = scenario::load_scenario_file(f.file);
      f.confirmed = true;
      for (size_t i = 0; i < s.runs.size(); ++i) {
        ++runs_;
        f.confirmed = f.confirmed && run::run_cell(s, i, run_options_).verdict == Verdict::kPass;
      }
    } catch (const Error& e) {
      f.confirmed = false;
      f.text += fmt::format(" (the file did not load: {})", first_line(e.what()));
    }
  }

  // The finding on the second system: the same failure, none, or its own refusal.
  void vet(Finding& f) {
    const Outcome there = run(f.config, o_.against);
    if (there.kind == Outcome::kFinding && there.signature == f.signature) {
      f.against = "bug";
    } else if (there.kind == Outcome::kPassed) {
      f.against = "fixed";
    } else {
      f.against = "not runnable: " + (there.text.empty() ? there.signature : there.text);
    }
    write_finding(f, run(f.config, o_.system), there);
  }

  // The expectation lines that say `got` on a system.
  static std::string expectation_of(const Outcome& got) {
    if (got.kind == Outcome::kPassed) return "    replicas: equal\n    global_model: {rtol: 1.0e-5, atol: 1.0e-6}\n";
    if (got.failure) {
      // What the message says before its first number (sizes vary with the configuration); of an
      // oracle's failure, what its module raised, after the words every oracle failure begins with.
      const size_t raised = got.text.find(" raised ");
      const std::string said =
          *got.failure == FailureKind::kOracle && raised != std::string::npos ? got.text.substr(raised + 8) : got.text;
      std::string message = said.substr(0, std::min<size_t>(60, said.find_first_of("0123456789")));
      if (message.size() < 12) message = said.substr(0, 60);
      std::replace(message.begin(), message.end(), '"', '\'');
      std::replace(message.begin(), message.end(), '\\', '/');
      // The oracle runs only where the unsharded model is compared: its failure needs global_model.
      const std::string oracle =
          *got.failure == FailureKind::kOracle ? "    global_model: {rtol: 1.0e-5, atol: 1.0e-6}\n" : "";
      return fmt::format("{}    error: {{kind: {}, message: \"{}\"}}\n", oracle, failure_kind_name(*got.failure),
                         message);
    }
    std::string e = got.diverged.empty()
                        ? "    replicas: equal\n"
                        : fmt::format("    replicas: diverge\n    diverged: [{}]\n", fmt::join(got.diverged, ", "));
    if (got.signature.find("differs") != std::string::npos || got.signature.find("not comparable") != std::string::npos)
      e += "    global_model: {match: false, rtol: 1.0e-5, atol: 1.0e-6}\n";
    return e;
  }

  void write_finding(const Finding& f, const Outcome& here, const std::optional<Outcome>& there) {
    const std::string name = std::filesystem::path(f.file).stem().string();
    std::string head = fmt::format(
        "description: >\n  Found by dmpcheck explore --system {} --seed {} (configuration #{}), minimised in {} "
        "runs: {}. What it still needs: {}.\n",
        o_.system, o_.seed, f.first_index, f.minimise_runs, here.text, fmt::join(f.traits, "; "));
    head += fmt::format("reproduces:\n  url: \"dmpcheck explore --system {} --seed {}\"\n  affected: \"{}\"\n",
                        o_.system, o_.seed, o_.system);
    head += fmt::format("  releases:\n    {}: bug\n", o_.system);
    std::string matrix, expect;
    if (there) {
      const std::string status = f.against.rfind("not runnable", 0) == 0 ? "'not runnable: see its cell'" : f.against;
      head += fmt::format("    {}: {}\n", o_.against, status);
      matrix = fmt::format("matrix:\n  system: [{}, {}]\n", o_.system, o_.against);
      expect = fmt::format("  - when: {{system: {}}}\n{}", o_.against, expectation_of(*there));
      expect += fmt::format("  - when: {{system: {}}}\n{}", o_.system, expectation_of(here));
    } else {
      expect = "  -" + expectation_of(here).substr(3);
    }
    write_file_atomically(f.file, scenario_yaml(f.config, name, o_.system, head, matrix, expect));
  }

  static std::string confirmation(const Finding& f) {
    if (!f.checked) return "its file was not run: the search was interrupted";
    return f.confirmed ? "the file meets its expectations when run"
                       : "**the file does NOT meet its expectations when run**";
  }

  void write_reports(uint64_t tried) {
    nlohmann::json j;
    j["system"] = o_.system;
    j["against"] = o_.against;
    j["seed"] = o_.seed;
    j["seconds"] = elapsed();
    j["interrupted"] = interrupted_;
    j["runs"] = runs_;
    j["configurations"] = {
        {"tried", tried}, {"passed", passed_}, {"refused", refused_}, {"failing", failing_}, {"invalid", invalid_}};
    j["coverage"] = coverage_;
    j["refusals"] = refusals_;
    j["findings"] = nlohmann::json::array();
    std::string md = fmt::format(
        "# dmpcheck explore on {}\n\nSeed {}, {:.0f} s, {} runs. Configurations: {} tried, {} passed, {} refused by "
        "the release, {} failing, {} invalid.\n\n## Findings\n\n",
        o_.system, o_.seed, elapsed(), runs_, tried, passed_, refused_, failing_, invalid_);
    if (interrupted_) {
      md.insert(md.find("\n\n## Findings"),
                "\n\n**Interrupted** (SIGINT or SIGTERM): the search stopped early, and the findings' files were "
                "not run to confirm them.");
    }
    // Findings grouped by what broke (their signature), in the order first found: several differ
    // only in what trips them (the optimizer, the pooling), and read as one bug there.
    std::vector<std::string> signatures;
    for (const auto& f : findings_) {
      if (std::find(signatures.begin(), signatures.end(), f.signature) == signatures.end())
        signatures.push_back(f.signature);
    }
    j["signatures"] = nlohmann::json::array();
    for (const auto& signature : signatures) {
      nlohmann::json files = nlohmann::json::array();
      std::string lines;
      for (const auto& f : findings_) {
        if (f.signature != signature) continue;
        files.push_back(f.file);
        lines += fmt::format("- `{}`: {} (needs: {}; {} configuration(s) failed so; minimised in {} runs; {}){}\n",
                             f.file, f.text, fmt::join(f.traits, "; "), f.seen, f.minimise_runs, confirmation(f),
                             f.against.empty() ? "" : fmt::format("; on {}: {}", o_.against, f.against));
      }
      j["signatures"].push_back({{"signature", signature}, {"files", files}});
      md += fmt::format("### {} ({} finding(s))\n\n{}\n", signature, files.size(), lines);
    }
    for (const auto& f : findings_) {
      j["findings"].push_back({{"file", f.file},
                               {"signature", f.signature},
                               {"traits", f.traits},
                               {"configuration", f.first_index},
                               {"minimise_runs", f.minimise_runs},
                               {"configurations_failing_so", f.seen},
                               {"observed", f.text},
                               {"against", f.against},
                               {"confirmed", f.checked ? nlohmann::json(f.confirmed) : nlohmann::json()}});
    }
    if (findings_.empty()) md += "None.\n";
    md += "\n## What was drawn\n\n| axis=value | configurations |\n|---|--:|\n";
    for (const auto& [k, n] : coverage_) md += fmt::format("| {} | {} |\n", k, n);
    md += "\n## Refused by the release\n\n| message | configurations |\n|---|--:|\n";
    for (const auto& [k, n] : refusals_) md += fmt::format("| {} | {} |\n", k, n);
    write_file_atomically(o_.out_dir + "/explore.json", j.dump(2) + "\n");
    write_file_atomically(o_.out_dir + "/explore.md", md);
    if (o_.out) {
      *o_.out << fmt::format(
          "explore: {} configuration(s) in {:.0f} s: {} passed, {} refused, {} failing, {} finding(s)\n", tried,
          elapsed(), passed_, refused_, failing_, findings_.size());
      for (const auto& f : findings_) {
        *o_.out << fmt::format("  {}: {}{}{}\n", f.file, f.signature,
                               f.against.empty() ? "" : fmt::format(" (on {}: {})", o_.against, f.against),
                               !f.checked    ? " (its file was not run: the search was interrupted)"
                               : f.confirmed ? ""
                                             : " (its file does not meet its own expectations)");
      }
      if (interrupted_) *o_.out << "explore: interrupted; what was found so far is written\n";
      *o_.out << fmt::format("report: {}/explore.md\n", o_.out_dir);
    }
  }

  const ExploreOptions& o_;
  run::ScenarioRunOptions run_options_;
  Clock::time_point start_;
  int runs_ = 0, passed_ = 0, refused_ = 0, failing_ = 0, invalid_ = 0;
  bool interrupted_ = false;
  std::map<std::string, int> coverage_, refusals_;
  std::vector<Finding> findings_;
};

}  // namespace

int run_explore(const ExploreOptions& options) { return Search(options).main(); }

}  // namespace dmpcheck::explore
