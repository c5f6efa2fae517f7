// The reports of a suite, all rendered from the same RunResult objects: JUnit XML for CI
// systems, a Markdown summary to paste into a pull request, and a self-contained HTML page
// (verdict table, per-tensor divergence, divergence per step, a plot of the init broadcast's
// cost against its bytes per backend, drawn by Chart.js inlined from Debian's libjs-chart.js).
#pragma once

#include <string>
#include <vector>

#include "check/run_result.h"

namespace dmpcheck::report {

struct SuiteSummary {
  std::string title = "dmpcheck suite";
  std::string started_at;  // ISO 8601, UTC
  double seconds = 0.0;
  std::vector<check::RunResult> results;
};

// The one headline of a set of runs, said alike in the console, summary.md and report.html: every run
// counted, "7 of 9 run(s) met their expectations (1 failed, 0 errored, 1 skipped)".
std::string headline(const std::vector<check::RunResult>& results);

std::string render_junit(const SuiteSummary& suite);
std::string render_markdown(const SuiteSummary& suite);
// `chart_js`: the Chart.js UMD bundle to inline; empty renders the page without the plot and
// says how to get it.
std::string render_html(const SuiteSummary& suite, const std::string& chart_js);

// Chart.js from Debian's libjs-chart.js (DMPCHECK_CHARTJS, or its install path); empty if absent.
std::string load_chart_js();

// `text` for XML or HTML (text and attribute values): markup escaped, what XML 1.0 forbids dropped.
std::string xml_escape(const std::string& text);

// `text` for a Markdown table's cell: '|' escaped, a newline as a space.
std::string md_escape(const std::string& text);

// One line naming what went wrong in a run (tensors, ranks, or the rank failure).
std::string failure_text(const check::RunResult& r);

}  // namespace dmpcheck::report
