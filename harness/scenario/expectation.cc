// One entry of `expect`, and how an expectation describes itself.
#include "scenario/parse.h"

namespace dmpcheck::scenario {
namespace detail {

Expectation parse_expectation(const Reader& r, const YAML::Node& node, const std::string& path,
                              const std::set<std::string>& table_names, bool script) {
  r.check_keys(node, path,
               {"when", "replicas", "diverged", "at", "global_model", "reference", "outputs", "initial_state",
                "resumed", "quantized", "quantized_sharded", "max_broadcast_seconds", "error", "loop", "exit", "output",
                "exception", "hang", "observed"});
  Expectation e;
  if (node["replicas"]) {
    e.replicas = r.choice(node["replicas"], path + ".replicas", {"equal", "diverge"}) == "equal"
                     ? ReplicaExpectation::kEqual
                     : ReplicaExpectation::kDiverge;
  }
  if (node["diverged"]) {
    if (e.replicas != ReplicaExpectation::kDiverge)
      r.fail(node["diverged"], path + ".diverged", "needs 'replicas: diverge'");
    e.diverged = r.string_list(node["diverged"], path + ".diverged");
    for (size_t i = 0; i < e.diverged.size(); ++i) {
      const auto& name = e.diverged[i];
      if (!script && name.find('.') == std::string::npos && !table_names.count(name)) {
        r.fail(
            node["diverged"][i], fmt::format("{}.diverged[{}]", path, i),
            fmt::format("'{}' is neither a table nor a tensor name (tables: {})", name, fmt::join(table_names, ", ")));
      }
    }
  } else if (e.replicas == ReplicaExpectation::kDiverge) {
    r.fail(node, path, "'replicas: diverge' needs 'diverged:', the tensors or tables expected to differ");
  }
  if (node["at"]) {
    e.at.clear();
    const auto phases = r.string_list(node["at"], path + ".at");
    for (size_t i = 0; i < phases.size(); ++i) {
      const std::string at = fmt::format("{}.at[{}]", path, i);
      e.at.push_back(r.choice_of(node["at"][i], at, kPhaseNames));
      if (e.at.back() == Phase::kStep)
        r.fail(node["at"][i], at, "a divergence is judged at init or final (each step's is in the report's table)");
    }
  }
  auto tolerance = [&](const YAML::Node& g, const std::string& field) {
    Tolerance t;
    if (!(g.IsScalar() && g.Scalar() == "true")) {
      r.check_keys(g, field, {"rtol", "atol", "match"});
      if (g["match"]) t.match = r.choice(g["match"], field + ".match", {"true", "false"}) == "true";
      if (g["rtol"]) t.rtol = r.non_negative(g["rtol"], field + ".rtol");
      if (g["atol"]) t.atol = r.non_negative(g["atol"], field + ".atol");
    }
    return t;
  };
  if (YAML::Node g = node["global_model"]) e.global_model = tolerance(g, path + ".global_model");
  if (YAML::Node g = node["resumed"]) e.resumed = tolerance(g, path + ".resumed");
  if (YAML::Node g = node["quantized"]) {
    // The bound is each row's quantization step, computed, not a tolerance one gives.
    if (g.IsMap() && (g["rtol"] || g["atol"])) {
      r.fail(g["rtol"] ? g["rtol"] : g["atol"], path + ".quantized",
             "is judged within the bound each row's quantization allows (stated in the report); it takes match "
             "only");
    }
    e.quantized = tolerance(g, path + ".quantized");
  }
  if (YAML::Node g = node["quantized_sharded"]) e.quantized_sharded = tolerance(g, path + ".quantized_sharded");
  if (YAML::Node g = node["outputs"]) {
    if (g.IsMap() && g["match"]) r.fail(g["match"], path + ".outputs.match", "outputs take rtol and atol only");
    e.outputs = tolerance(g, path + ".outputs");
    if (!node["global_model"] && !node["reference"]) {
      r.fail(g, path + ".outputs",
             "compares outputs where 'global_model' (the unsharded model) or 'reference' (a release cell against the "
             "reference) compares; give one of them");
    }
  }
  if (YAML::Node g = node["reference"]) {
    if (g.IsMap() && g["profile"]) {
      std::vector<std::string> profiles = dmp::behaviour_profile_names();
      profiles.push_back(dmp::kReleaseProfile);  // the profile modelling the cell's release
      e.reference_profile = parse_profile(r, g["profile"], path + ".reference.profile", profiles, e.reference_switches);
    }
    if (g.IsMap() && g["start"]) {
      e.reference_draws_own_init = r.choice(g["start"], path + ".reference.start", {"reference", "seed"}) == "seed";
    }
    if (g.IsMap() && (g["profile"] || g["start"])) {
      YAML::Node rest = YAML::Clone(g);
      rest.remove("profile");
      rest.remove("start");
      e.reference = rest.size() == 0 ? Tolerance{} : tolerance(rest, path + ".reference");
    } else {
      e.reference = tolerance(g, path + ".reference");
    }
  }
  if (node["initial_state"]) {
    e.initial_state = r.choice(node["initial_state"], path + ".initial_state", {"from", "not_from"}) == "from";
  }
  if (YAML::Node error = node["error"]) {
    // Typed: the failure kind, and for a release's errors the text of its own message.
    if (!error.IsMap()) {
      r.expected(error, path + ".error",
                 "a mapping {kind: <failure kind>, message: <text the message contains>}, e.g. "
                 "{kind: torchrec, message: \"not supported\"}");
    }
    r.check_keys(error, path + ".error", {"kind", "message"});
    std::vector<std::string> kinds;
    for (auto k : failure_kind_names()) kinds.emplace_back(k);
    Expectation::ExpectedError expected;
    // One kind, or a list of the kinds the run may fail with.
    const YAML::Node kind = r.required(error, path + ".error", "kind");
    expected.kinds.clear();
    if (kind.IsSequence()) {
      if (kind.size() == 0) r.expected(kind, path + ".error.kind", "a failure kind or a non-empty list of them");
      for (size_t i = 0; i < kind.size(); ++i) {
        expected.kinds.push_back(
            *parse_failure_kind(r.choice(kind[i], fmt::format("{}.error.kind[{}]", path, i), kinds)));
      }
    } else {
      expected.kinds.push_back(*parse_failure_kind(r.choice(kind, path + ".error.kind", kinds)));
    }
    if (error["message"]) expected.message = r.string(error["message"], path + ".error.message");
    e.error = expected;
  }
  if (node["max_broadcast_seconds"]) {
    e.max_broadcast_seconds = r.number(node["max_broadcast_seconds"], path + ".max_broadcast_seconds", 0.0);
  }
  if (YAML::Node loop = node["loop"]) {
    r.check_keys(loop, path + ".loop", {"batches", "next_after_exhausted", "eval_batches"});
    auto count = [&](const char* key, std::optional<int64_t>& out) {
      if (loop[key]) out = r.integer(loop[key], path + ".loop." + key, 0, 1000000);
    };
    // One count for every epoch, or one per epoch.
    if (loop["batches"].IsSequence()) {
      r.integer_list(loop["batches"], path + ".loop.batches", "", 0, 1000000, e.loop_batches_per_epoch);
    } else {
      count("batches", e.loop_batches);
    }
    count("eval_batches", e.loop_eval_batches);
    count("next_after_exhausted", e.next_after_exhausted);
  }
  parse_script_expectation(r, node, path, e.script);
  if (YAML::Node observed = node["observed"]) {
    r.require_map(observed, path + ".observed");
    for (const auto& kv : observed) {
      const std::string name = kv.first.as<std::string>();
      if (!kv.second.IsScalar() || kv.second.Scalar().empty())
        r.expected(kv.second, path + ".observed." + name, "a boolean, a number or a string");
      e.observed.emplace_back(name, kv.second.Scalar());
    }
  }
  return e;
}

}  // namespace detail

std::string Expectation::ExpectedError::describe() const {
  const std::string which = fmt::format("{}", fmt::join(kinds, " or "));
  return message.empty() ? fmt::format("an error of kind {}", which)
                         : fmt::format("an error of kind {} containing '{}'", which, message);
}

std::string Expectation::switches_text() const {
  std::string text;
  for (const auto& [name, value] : reference_switches) text += fmt::format("+{}={}", name, value);
  return text;
}

std::string Expectation::describe() const {
  std::vector<const char*> phases;
  for (Phase ph : at) phases.push_back(phase_name(ph));
  std::string text =
      replicas == ReplicaExpectation::kEqual
          ? "replicas equal"
          : fmt::format("replicas diverge on {} at {}", fmt::join(diverged, ", "), fmt::join(phases, ", "));
  // "; <before>matches <after> (rtol R, atol A)", or "differs from" where the tolerance expects no match.
  auto compared = [](const Tolerance& t, const std::string& before, const std::string& after) {
    return fmt::format("; {}{} {} (rtol {}, atol {})", before, t.match ? "matches" : "differs from", after, t.rtol,
                       t.atol);
  };
  if (global_model) text += compared(*global_model, "", "the unsharded model");
  if (resumed) text += compared(*resumed, "the resumed run ", "the uninterrupted one");
  if (quantized) {
    text += fmt::format("; the quantized tables {} the float model within each row's quantization bound",
                        quantized->match ? "match" : "do not match");
  }
  if (quantized_sharded)
    text += compared(*quantized_sharded, "sharded for inference, the quantized model ", "the unsharded one");
  if (outputs) text += fmt::format("; outputs compared (rtol {}, atol {})", outputs->rtol, outputs->atol);
  if (initial_state)
    text += *initial_state ? "; the initial state is init.from's" : "; the initial state is not init.from's";
  if (reference) {
    std::string dmp = "the reference DMP";
    if (!reference_profile.empty()) dmp += " under profile " + reference_profile + switches_text();
    if (reference_draws_own_init) dmp += ", each drawing its own initial weights from the seed, on the release's plan";
    text += compared(*reference, "", dmp);
  }
  if (max_broadcast_seconds) text += fmt::format("; init broadcast <= {} s", *max_broadcast_seconds);
  if (loop_batches) text += fmt::format("; every rank executes {} batch(es) per epoch", *loop_batches);
  if (!loop_batches_per_epoch.empty())
    text += fmt::format("; every rank executes [{}] batch(es) in its epochs", fmt::join(loop_batches_per_epoch, ", "));
  if (loop_eval_batches) text += fmt::format("; every rank executes {} batch(es) per eval pass", *loop_eval_batches);
  if (next_after_exhausted)
    text += fmt::format("; asks its exhausted data iterator {} more time(s)", *next_after_exhausted);
  if (error) text = fmt::format("the run fails with {}", error->describe());
  if (!script.empty()) text += "; " + script.describe();
  for (const auto& [name, value] : observed) text += fmt::format("; hooks observe {} = {}", name, value);
  return text;
}

}  // namespace dmpcheck::scenario
