// The `dmpcheck` Python module: a thin layer over the C++ API the CLI uses.  Runs release the
// GIL while ranks run; dmpcheck::Error becomes a Python exception of the matching type.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "comm/backends.h"
#include "common/error.h"
#include "report/json.h"
#include "scenario/scenario.h"
#include "suite/cells.h"

namespace py = pybind11;
using namespace dmpcheck;

namespace {

// The CLI binary ranks are exec-ed from (when they are not forked): DMPCHECK_BIN, else the one
// built beside this module, else the one `pip install` put in this environment's bin/.
std::string worker_executable() {
  if (const char* env = std::getenv("DMPCHECK_BIN")) return env;
  if (std::filesystem::exists(DMPCHECK_CLI_PATH)) return DMPCHECK_CLI_PATH;
  const std::string prefix = py::module_::import("sys").attr("prefix").cast<std::string>();
  std::string installed = prefix + "/bin/dmpcheck";
  if (std::filesystem::exists(installed)) return installed;
  return DMPCHECK_CLI_PATH;  // the error when a rank is exec-ed names the path that was tried
}

scenario::Overrides to_overrides(const py::object& overrides) {
  scenario::Overrides out;
  if (overrides.is_none()) return out;
  auto json = py::module_::import("json");
  for (const auto& item : overrides.cast<py::dict>()) {
    const std::string key = py::str(item.first);
    // Values are written as YAML (JSON is YAML), so 3, 0.5, "x" and [1, 2] all mean themselves.
    out.emplace_back(key, json.attr("dumps")(item.second).cast<std::string>());
  }
  return out;
}

py::object to_python(const nlohmann::json& value) { return py::module_::import("json").attr("loads")(value.dump()); }

py::dict describe(const scenario::Scenario& s) {
  py::dict d;
  d["name"] = s.name;
  d["file"] = s.file;
  d["description"] = s.description;
  py::list runs;
  for (const auto& r : s.runs) {
    py::dict run;
    run["name"] = r.name;
    run["slug"] = r.slug;
    run["world_size"] = r.world_size;
    run["steps"] = r.steps;
    run["profile"] = r.profile.name;
    run["init_mode"] = scenario::init_mode_name(r.init.mode);
    run["expect"] = r.expect.describe();
    py::dict cell;
    for (const auto& [k, v] : r.cell) cell[py::str(k)] = v;
    run["cell"] = cell;
    runs.append(run);
  }
  d["runs"] = runs;
  return d;
}

}  // namespace

PYBIND11_MODULE(dmpcheck, m) {
  m.doc() = "dmpcheck: run TorchRec-style DMP correctness scenarios from Python";

  static py::exception<Error> base(m, "DmpcheckError");
  // Each kind's own subclass of DmpcheckError (kInjected has none: it raises DmpcheckError).
  static const std::pair<ErrorKind, const char*> kSubclasses[] = {
      {ErrorKind::kInvalidScenario, "InvalidScenarioError"}, {ErrorKind::kInvalidInput, "InvalidInputError"},
      {ErrorKind::kCommunication, "CommunicationError"},     {ErrorKind::kTimeout, "CollectiveTimeoutError"},
      {ErrorKind::kRankFailed, "RankFailedError"},           {ErrorKind::kInternal, "InternalError"}};
  static std::map<ErrorKind, py::exception<Error>> by_kind;
  for (const auto& [kind, name] : kSubclasses) by_kind.emplace(kind, py::exception<Error>(m, name, base.ptr()));
  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11 takes a translator of this type
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      const auto it = by_kind.find(e.kind());
      (it == by_kind.end() ? base : it->second)(e.what());
    }
  });

  m.def(
      "backend_unavailable_reason",
      [](const std::string& backend, int local_world_size) -> std::optional<std::string> {
        const auto known = value_in(comm::kBackendNames, backend);
        if (!known)
          return fmt::format("unknown backend '{}' (expected one of: {})", backend,
                             fmt::join(names_in(comm::kBackendNames), ", "));
        return comm::backend_unavailable_reason(*known, local_world_size);
      },
      py::arg("backend"), py::arg("local_world_size") = 1,
      "Why `backend` ('gloo', 'nccl') cannot run that many ranks per host here (a reason to skip), or None.");
  m.def(
      "load_scenario",
      [](const std::string& path, const py::object& overrides) {
        return describe(scenario::load_scenario_file(path, to_overrides(overrides)));
      },
      py::arg("path"), py::arg("overrides") = py::none(),
      "Load and validate a scenario file; returns {name, file, description, runs: [{name, slug, cell, ...}]}.");
  m.def(
      "validate",
      [](const std::string& path) {
        const auto s = scenario::load_scenario_file(path);
        std::vector<std::string> names;
        for (const auto& r : s.runs) names.push_back(r.name);
        return names;
      },
      py::arg("path"),
      "Validate a scenario file; returns its run names or raises InvalidScenarioError (file:line in the message).");
  m.def(
      "run",
      [](const std::string& path, const py::object& overrides, const py::object& run_filter, const std::string& out_dir,
         double budget_s) {
        const auto s = scenario::load_scenario_file(path, to_overrides(overrides));
        const std::string wanted = run_filter.is_none() ? std::string() : run_filter.cast<std::string>();
        if (!run_filter.is_none()) {
          // A run name that matches nothing is a mistake to say, not an empty result to return.
          std::vector<std::string> slugs;
          for (const auto& r : s.runs) slugs.push_back(r.slug);
          DMP_CHECK(std::any_of(s.runs.begin(), s.runs.end(),
                                [&](const scenario::RunSpec& r) { return r.name == wanted || r.slug == wanted; }),
                    ErrorKind::kInvalidInput, "{} has no run '{}'; its runs: {}", path, wanted, fmt::join(slugs, ", "));
        }
        run::ScenarioRunOptions options;
        options.worker_executable = worker_executable();
        options.out_dir = out_dir;
        options.budget_s = budget_s;
        options.echo_rank_output = false;
        py::list out;
        for (size_t i = 0; i < s.runs.size(); ++i) {
          if (!run_filter.is_none() && s.runs[i].name != wanted && s.runs[i].slug != wanted) continue;
          check::RunResult result;
          {
            py::gil_scoped_release release;  // ranks run in other processes; Python may go on
            result = run::run_cell(s, i, options);
          }
          out.append(to_python(nlohmann::json(result)));
        }
        return out;
      },
      py::arg("path"), py::arg("overrides") = py::none(), py::arg("run") = py::none(), py::arg("out_dir") = "reports",
      py::arg("budget_s") = 600.0,
      "Run a scenario's runs (or only the run named `run`); returns one dict per run with the fields of the JSON "
      "report.");
  m.attr("worker_executable") = worker_executable();
}
