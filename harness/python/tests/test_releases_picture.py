"""`dmpcheck releases` also draws the matrix (issue 62): an SVG and an HTML page beside the Markdown,
from the same store.  Opened in headless Chromium, every cell is the Markdown table's word, drawn in
its legend's colour, and a pair the store (releases.json) never measured is '-'."""
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

# Releases no CI machine installs: nothing runs, every word comes from the store.
RELEASES = "0.3.1,0.8.0,1.0.0,1.5.1"


class Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.legend, self._row, self._in_legend = [], {}, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self._row = []
        if tag == "td" and "data-word" in a:
            colour = re.search(r"background:(#[0-9a-f]{6})", a.get("style", "")).group(1)
            self._row.append((a["data-release"], a["data-word"], colour, "change" in a.get("class", "")))
        elif tag == "td" and a.get("class") == "w":
            self._in_legend = re.search(r"background:(#[0-9a-f]{6})", a["style"]).group(1)

    def handle_data(self, data):
        if self._in_legend:
            self.legend[data] = self._in_legend
            self._in_legend = False

    def handle_endtag(self, tag):
        if tag == "tr" and self._row:
            self.rows.append(self._row)
            self._row = None


def test_the_releases_matrix_is_drawn_and_every_cell_is_the_stores(dmpcheck_bin, root, tmp_path, chromium):
    shutil.copy(os.path.join(root, "docs", "releases.json"), tmp_path / "releases.json")
    p = subprocess.run([dmpcheck_bin, "releases", os.path.join(root, "scenarios", "regressions"), "--releases",
                        RELEASES, "--no-install", "--output", str(tmp_path / "releases.md")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 4), p.stdout + p.stderr
    for name in ("releases.svg", "releases.html"):
        assert (tmp_path / name).exists(), p.stdout
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          "file://" + str(tmp_path / "releases.html")], capture_output=True, text=True, timeout=120)
    cells = Cells()
    cells.feed(dom.stdout)
    # The Markdown table of the same run: one row per scenario, a word per release.
    md_rows = [line for line in (tmp_path / "releases.md").read_text().splitlines() if line.startswith("| `")]
    assert len(cells.rows) == len(md_rows) == len(os.listdir(os.path.join(root, "scenarios", "regressions"))) - \
        len([f for f in os.listdir(os.path.join(root, "scenarios", "regressions")) if not f.endswith(".yaml")])
    store = json.load(open(tmp_path / "releases.json"))
    measured = {(m["scenario"], m["release"]) for m in store["measured"]}
    releases = RELEASES.split(",")
    for md, row in zip(md_rows, cells.rows):
        parts = [c.strip() for c in md.strip("|").split("|")]
        scenario, words = parts[0].strip("`"), [w.replace("**", "") for w in parts[1:1 + len(releases)]]
        assert [r for r, _, _, _ in row] == releases
        assert [w for _, w, _, _ in row] == words, scenario
        for release, word, colour, _ in row:
            assert colour == cells.legend[word], (scenario, release, word, colour)
            if (scenario, release) not in measured:
                assert word == "-", (scenario, release, word)
    # Somewhere a change is marked, and the SVG holds the same cells.
    assert any(change for row in cells.rows for _, _, _, change in row)
    svg = (tmp_path / "releases.svg").read_text()
    assert svg.count('class="cell"') == len(md_rows) * len(releases)
    shot = tmp_path / "releases.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--screenshot=" + str(shot),
                    "--window-size=1200,900", "file://" + str(tmp_path / "releases.svg")],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10000
