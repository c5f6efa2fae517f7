"""pytest plugin: every scenarios/**/*.yaml file is a test module, every matrix cell a test item.

`pytest scenarios/` runs the regression suite through the dmpcheck Python module. A cell
passes when its expectations hold; otherwise it fails with the report's failure lines, which
name tensors and ranks. A scenario that does not load is a collection error with file:line.
"""
import os
import sys

import pytest


def _import_dmpcheck():
    # In this repository: the module of the build tree ($DMPCHECK_BUILD_DIR, default build/).
    # Installed (`pip install .`, which registers this plugin by entry point): the module next to it.
    build = os.environ.get("DMPCHECK_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    module_dir = os.path.abspath(os.path.join(build, "harness", "python"))
    if os.path.isdir(module_dir) and module_dir not in sys.path:
        sys.path.insert(0, module_dir)
    import dmpcheck  # noqa: E402

    return dmpcheck


def pytest_addoption(parser):
    group = parser.getgroup("dmpcheck")
    group.addoption("--dmpcheck-out", default="reports/pytest", help="where run reports are written")


def pytest_configure(config):
    config.addinivalue_line("markers", "dmpcheck: one matrix cell of a dmpcheck scenario")


def pytest_collect_file(parent, file_path):
    if file_path.suffix == ".yaml" and "scenarios" in file_path.parts:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    def collect(self):
        dmpcheck = _import_dmpcheck()
        try:
            scenario = dmpcheck.load_scenario(str(self.path))
        except dmpcheck.InvalidScenarioError as error:
            raise self.CollectError(str(error)) from None
        for run in scenario["runs"]:
            yield ScenarioCell.from_parent(self, name=run["slug"], run=run, scenario=scenario)


class ScenarioCellFailure(Exception):
    pass


class ScenarioCell(pytest.Item):
    def __init__(self, *, run, scenario, **kwargs):
        super().__init__(**kwargs)
        self.run = run
        self.scenario = scenario
        self.add_marker(pytest.mark.dmpcheck)

    def runtest(self):
        dmpcheck = _import_dmpcheck()
        out = self.config.getoption("--dmpcheck-out")
        (result,) = dmpcheck.run(str(self.path), run=self.run["name"], out_dir=out)
        self.user_properties.append(("verdict", result["verdict"]))
        if result["verdict"] == "skipped":
            pytest.skip(result["skip_reason"])
        if result["verdict"] != "pass":
            raise ScenarioCellFailure(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ScenarioCellFailure):
            result = excinfo.value.args[0]
            lines = [f"{result['scenario']} [{result['run']}]: {result['verdict']}",
                     f"expected: {result['expectation']['description']}"]
            lines += [f"  {line}" for line in result["expectation"]["failures"]]
            if result.get("failure"):
                f = result["failure"]
                lines.append(f"  rank {f['rank']} {f['cause']}: {f['message']}")
            return "\n".join(lines)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.scenario['name']} [{self.run['name']}]"
