"""The suite's reports: JUnit parsed back, Markdown against a fixture, the HTML in Chromium."""
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest


def _suite(dmpcheck_bin, root, out, *paths):
    # The reference's cells ("profile=" in their names); real-release cells are tested in torchrec_sut/tests.
    run = subprocess.run([dmpcheck_bin, "suite", *paths, "--filter", "profile=", "--out", str(out)], cwd=root, capture_output=True, text=True,
                         timeout=300)
    match = re.search(r"reports: (\S+)/junit.xml", run.stdout)
    assert match, run.stdout + run.stderr
    return run, match.group(1)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    dmpcheck_bin = os.environ.get("DMPCHECK_BIN", os.path.join(root, "build", "harness", "dmpcheck"))
    out = tmp_path_factory.mktemp("suite")
    run, report_dir = _suite(dmpcheck_bin, root, out, "scenarios/regressions/torchrec-1739-dp-tables-not-broadcast.yaml",
                             "fixtures/scenario-files/seed-wrong-expectation.yaml")
    return run, report_dir


def test_the_suite_prints_progress_and_fails_on_the_wrong_expectation(suite):
    run, _ = suite
    assert run.returncode == 1
    assert re.search(r"\[8/8\] .* \| elapsed \d+ s, about 0 s left", run.stdout), run.stdout
    assert "7 of 8 run(s) met their expectations" in run.stdout


def test_junit_parses_back_with_one_testcase_per_cell(suite):
    _, report_dir = suite
    tree = ET.parse(os.path.join(report_dir, "junit.xml"))
    top = tree.getroot()
    assert top.tag == "testsuites"
    assert top.get("tests") == "8" and top.get("failures") == "1" and top.get("errors") == "0"
    cases = top.findall("./testsuite/testcase")
    assert len(cases) == 8
    failures = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["init.mode=unseeded profile=current"]
    assert "ebc.embedding_bags.large_table_0.weight was expected to diverge" in failures[0].find("failure").get("message")


def test_markdown_and_json_match_the_fixtures(dmpcheck_bin, root, tmp_path):
    # Reports render from the run JSON alone, so a fixture of JSON renders the same every time.
    shutil.copytree(os.path.join(root, "fixtures", "reports", "suite"), tmp_path / "suite")
    subprocess.run([dmpcheck_bin, "report", str(tmp_path / "suite")], check=True, capture_output=True)
    def normalise(text):
        return re.sub(r"started \S+\.", "started <time>.", text)
    with open(os.path.join(root, "fixtures", "reports", "expected", "summary.md")) as f:
        expected = normalise(f.read())
    assert normalise((tmp_path / "suite" / "summary.md").read_text()) == expected
    with open(os.path.join(root, "fixtures", "reports", "expected", "junit.xml")) as f:
        assert (tmp_path / "suite" / "junit.xml").read_text() == f.read()


def test_the_html_report_loads_in_chromium_and_draws_the_plot(suite, chromium, root):
    _, report_dir = suite
    page = "file://" + os.path.join(report_dir, "report.html")
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(common + ["--virtual-time-budget=5000", "--dump-dom", page], capture_output=True, text=True,
                         timeout=120)
    console_errors = [line for line in dom.stderr.splitlines()
                      if "CONSOLE" in line and ("Error" in line or "error" in line)]
    assert console_errors == [], console_errors
    canvas = re.search(r'<canvas id="broadcast-cost"[^>]*>', dom.stdout)
    assert canvas, dom.stdout[:2000]
    # Chart.js sizes the canvas when it draws: proof that the script ran, not only that it loaded.
    assert "box-sizing: border-box" in canvas.group(0), canvas.group(0)
    shots = os.path.join(root, "reports", "screenshots")
    os.makedirs(shots, exist_ok=True)
    shot = os.path.join(shots, "suite-report.png")
    subprocess.run(common + ["--window-size=1100,800", f"--screenshot={shot}", page], capture_output=True, timeout=120)
    assert os.path.getsize(shot) > 10000
