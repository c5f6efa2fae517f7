#include "report/suite_reports.h"

#include "report/console.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/settings.h"

namespace dmpcheck::report {

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') continue;  // not allowed in XML 1.0
        out += c;
    }
  }
  return out;
}

namespace {

struct Counts {
  int pass = 0, fail = 0, error = 0, skipped = 0;
  double seconds = 0.0;
};

Counts count(const std::vector<const check::RunResult*>& runs) {
  Counts c;
  for (const auto* r : runs) {
    if (r->verdict == check::Verdict::kPass) ++c.pass;
    else if (r->verdict == check::Verdict::kFail) ++c.fail;
    else if (r->verdict == check::Verdict::kSkipped) ++c.skipped;
    else ++c.error;
    c.seconds += r->timings.total_s;
  }
  return c;
}

std::string headline(const Counts& c, size_t runs) {
  return fmt::format("{} of {} run(s) met their expectations ({} failed, {} errored, {} skipped)", c.pass, runs, c.fail,
                     c.error, c.skipped);
}

std::map<std::string, std::vector<const check::RunResult*>> by_scenario(const std::vector<check::RunResult>& results) {
  std::map<std::string, std::vector<const check::RunResult*>> out;
  for (const auto& r : results) out[r.scenario].push_back(&r);
  return out;
}

std::string diverged_summary(const check::RunResult& r) {
  std::vector<std::string> names;
  for (const auto& c : r.replicas) {
    if (!c.equal)
      names.push_back(
          fmt::format("{}@{} (ranks {})", c.name, scenario::phase_name(c.phase), fmt::join(c.differing_ranks, ",")));
  }
  return names.empty() ? "all replicas equal" : fmt::format("diverged: {}", fmt::join(names, "; "));
}

}  // namespace

std::string md_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

std::string failure_text(const check::RunResult& r) {
  if (r.verdict == check::Verdict::kSkipped) return fmt::format("skipped: {}", r.skip_reason);
  if (r.failure) {
    if (r.failure->rank < 0) return fmt::format("{} ({}): {}", r.failure->cause, r.failure->kind, r.failure->message);
    return fmt::format("rank {} {} ({}): {}", r.failure->rank, r.failure->cause, r.failure->kind, r.failure->message);
  }
  return fmt::format("{}", fmt::join(r.expectation.failures, "; "));
}

std::string headline(const std::vector<check::RunResult>& results) {
  std::vector<const check::RunResult*> all;
  for (const auto& r : results) all.push_back(&r);
  return headline(count(all), all.size());
}

std::string render_junit(const SuiteSummary& suite) {
  const auto groups = by_scenario(suite.results);
  std::vector<const check::RunResult*> all;
  for (const auto& r : suite.results) all.push_back(&r);
  const Counts total = count(all);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
      xml_escape(suite.title), all.size(), total.fail, total.error, total.skipped, suite.seconds);
  for (const auto& [scenario, runs] : groups) {
    const Counts c = count(runs);
    out += fmt::format(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
        xml_escape(scenario), runs.size(), c.fail, c.error, c.skipped, c.seconds);
    for (const auto* r : runs) {
      out += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\">\n", xml_escape(scenario),
                         xml_escape(r->run), r->timings.total_s);
      if (r->verdict == check::Verdict::kSkipped) {
        out += fmt::format("      <skipped message=\"{}\"/>\n", xml_escape(r->skip_reason));
      } else if (r->verdict == check::Verdict::kFail) {
        out += fmt::format("      <failure type=\"expectation\" message=\"{}\">{}\nexpected: {}</failure>\n",
                           xml_escape(failure_text(*r)), xml_escape(diverged_summary(*r)),
                           xml_escape(r->expectation.description));
      } else if (r->verdict != check::Verdict::kPass) {
        std::string lines;
        if (r->failure) lines = fmt::format("{}", fmt::join(r->failure->last_lines, "\n"));
        out += fmt::format(
            "      <error type=\"{}\" message=\"{}\">{}</error>\n",
            xml_escape(r->failure ? std::string(check::failure_kind_name(r->failure->kind)) : std::string("error")),
            xml_escape(failure_text(*r)), xml_escape(lines));
      }
      out += fmt::format("      <system-out>{}; on {}; {}</system-out>\n", xml_escape(r->expectation.description),
                         xml_escape(system_label(*r)), xml_escape(diverged_summary(*r)));
      out += "    </testcase>\n";
    }
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

std::string render_markdown(const SuiteSummary& suite) {
  std::vector<const check::RunResult*> all;
  for (const auto& r : suite.results) all.push_back(&r);
  const Counts total = count(all);
  std::string out = fmt::format("## {}: {}\n\n", suite.title, headline(total, all.size()));
  out += fmt::format("{:.1f} s; started {}.\n\n", suite.seconds, suite.started_at);
  out += "| scenario | run | ran on | verdict | observed |\n|---|---|---|---|---|\n";
  for (const auto& r : suite.results) {
    const std::string verdict = r.verdict == check::Verdict::kPass      ? "pass"
                                : r.verdict == check::Verdict::kSkipped ? "skipped"
                                : r.verdict == check::Verdict::kFail    ? "**FAIL**"
                                                                        : "**ERROR**";
    out += fmt::format(
        "| {} | {} | {} | {} | {} |\n", md_escape(r.scenario), md_escape(r.run), md_escape(system_label(r)), verdict,
        md_escape(r.failure || r.verdict == check::Verdict::kSkipped ? failure_text(r) : diverged_summary(r)));
  }
  // Each section below only where it has a row.
  std::string compared, failed;
  for (const auto& r : suite.results) {
    if (!r.reference_compared) continue;
    double abs = 0, rel = 0;
    for (const auto& d : r.reference) {
      abs = std::max(abs, d.max_abs_diff);
      rel = std::max(rel, d.max_rel_diff);
    }
    compared += fmt::format(
        "| {} [{}] | {} | {} | {:.3g} | {:.3g} |\n", md_escape(r.scenario), md_escape(r.run),
        md_escape(system_label(r)),
        r.reference_first_break_step < 0 ? std::string("none") : std::to_string(r.reference_first_break_step), abs,
        rel);
  }
  if (!compared.empty()) {
    out += "\n### TorchRec against the reference DMP\n\n| run | ran on | first step out of tolerance | worst max abs | "
           "worst max rel |\n|---|---|---|---|---|\n" +
           compared;
  }
  for (const auto& r : suite.results) {
    if (r.verdict == check::Verdict::kPass || r.verdict == check::Verdict::kSkipped) continue;
    failed += fmt::format("- **{} [{}]**: {}\n", md_escape(r.scenario), md_escape(r.run), md_escape(failure_text(r)));
  }
  return failed.empty() ? out : out + "\n### What did not hold\n\n" + failed;
}

std::string render_html(const SuiteSummary& suite, const std::string& chart_js) {
  std::vector<const check::RunResult*> all;
  for (const auto& r : suite.results) all.push_back(&r);
  const Counts total = count(all);
  std::string rows;
  for (const auto& r : suite.results) {
    const std::string cls(check::verdict_name(r.verdict));
    std::string divergence;
    for (const auto& d : r.divergence) {
      divergence += fmt::format("{}{}:{}", divergence.empty() ? "" : " ", d.step,
                                d.tensors_differing ? fmt::format("{:.2g}", d.max_abs_diff) : "0");
    }
    rows += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td "
        "class=\"mono\">{}</td><td>{:.2f}</td></tr>\n",
        cls, xml_escape(r.scenario), xml_escape(r.run), xml_escape(system_label(r)), r.verdict,
        xml_escape(r.failure || r.verdict == check::Verdict::kSkipped ? failure_text(r) : diverged_summary(r)),
        xml_escape(divergence), r.timings.total_s);
  }
  std::string tensors;
  for (const auto& r : suite.results) {
    for (const auto& c : r.replicas) {
      if (c.equal) continue;
      tensors += fmt::format(
          "<tr><td>{} [{}]</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3g}</td><td>{} of {}</td><td>{}</td></tr>\n",
          xml_escape(r.scenario), xml_escape(r.run), xml_escape(c.name), c.sharding, scenario::phase_name(c.phase),
          c.max_abs_diff, c.elements_differing, c.numel, fmt::join(c.differing_ranks, ","));
    }
  }
  // Broadcast cost points per backend: x = bytes, y = seconds.
  nlohmann::json series = nlohmann::json::object();
  for (const auto& r : suite.results) {
    if (!r.init_broadcast.performed) continue;
    series[r.environment.backend].push_back(
        {{"x", r.init_broadcast.bytes}, {"y", r.init_broadcast.seconds}, {"label", r.scenario + " [" + r.run + "]"}});
  }
  // TorchRec cells compared with the reference: the worst max |diff| over tensors, per step.
  nlohmann::json against = nlohmann::json::array();
  std::string against_rows;
  for (const auto& r : suite.results) {
    if (!r.reference_compared) continue;
    std::map<int, double> worst;
    for (const auto& d : r.reference) {
      if (!d.note.empty()) continue;
      double& w = worst[d.step];
      w = std::max(w, d.max_abs_diff);
    }
    nlohmann::json points = nlohmann::json::array();
    // A bitwise step has no point on a log axis: it is drawn at 1e-12 and said so in the table.
    for (const auto& [step, value] : worst) points.push_back({{"x", step}, {"y", std::max(value, 1e-12)}});
    against.push_back({{"label", r.scenario + " [" + r.run + "]"}, {"data", points}});
    std::string not_comparable;
    for (const auto& d : r.reference) {
      if (!d.note.empty() && d.step == 0)
        not_comparable += (not_comparable.empty() ? "" : "; ") + d.name + ": " + d.note;
    }
    against_rows += fmt::format(
        "<tr><td>{} [{}]</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}</td></tr>\n",
        xml_escape(r.scenario), xml_escape(r.run), xml_escape(system_label(r)),
        r.reference_first_break_step < 0 ? std::string("none") : std::to_string(r.reference_first_break_step),
        xml_escape([&] {
          std::string text;
          for (const auto& [step, value] : worst)
            text += fmt::format("{}{}:{:.2g}", text.empty() ? "" : " ", step, value);
          return text;
        }()),
        xml_escape(not_comparable.empty() ? std::string("-") : not_comparable));
  }
  std::string page = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>)" +
                     xml_escape(suite.title) + R"(</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
tr.pass td:nth-child(4){color:#176b1d;font-weight:bold}
tr.fail td:nth-child(4),tr.error td:nth-child(4){color:#b00020;font-weight:bold}
.mono{font-family:monospace}
#plot-box{width:760px;height:380px}
</style></head><body>
)";
  page += fmt::format("<h1>{}</h1>\n<p>{} in {:.1f} s, started {}.</p>\n", xml_escape(suite.title),
                      xml_escape(headline(total, all.size())), suite.seconds, suite.started_at);
  page += "<h2>Init broadcast of data-parallel tables: seconds against bytes</h2>\n";
  page += series.empty() ? std::string("<p>No run of this suite broadcast data-parallel tables at init.</p>\n")
                         : std::string("<div id=\"plot-box\"><canvas id=\"broadcast-cost\" role=\"img\" "
                                       "aria-label=\"broadcast cost plot\"></canvas></div>\n");
  if (chart_js.empty()) {
    page += "<p>The plot needs Chart.js: <code>apt-get install libjs-chart.js</code>, then run the suite again.</p>\n";
  } else {
    page += "<script>\n" + chart_js + "\n</script>\n<script>\n";
    page += "const series = " + series.dump() + ";\n";
    page += R"(const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd'];
const datasets = Object.keys(series).map((backend, i) => ({label: backend, data: series[backend],
  backgroundColor: colors[i % colors.length], pointRadius: 5}));
if (document.getElementById('broadcast-cost')) new Chart(document.getElementById('broadcast-cost'), {type: 'scatter', data: {datasets},
  options: {animation: false, maintainAspectRatio: false,
    scales: {x: {type: 'logarithmic', title: {display: true, text: 'bytes broadcast (log scale)'}},
             y: {type: 'linear', title: {display: true, text: 'seconds (max over ranks)'}}},
    plugins: {tooltip: {callbacks: {label: (c) => c.raw.label + ': ' + c.raw.x + ' B, ' + c.raw.y.toFixed(6) + ' s'}}}}});
</script>
)";
  }
  if (!against.empty()) {
    page += "<h2>TorchRec against the reference DMP: worst max |diff| per step</h2>\n"
            "<div id=\"plot-box-reference\" style=\"width:760px;height:380px\"><canvas id=\"against-reference\" "
            "role=\"img\" "
            "aria-label=\"difference from the reference per step\"></canvas></div>\n";
    if (!chart_js.empty()) {
      page += "<script>\nconst against = " + against.dump() + ";\n";
      page += R"(new Chart(document.getElementById('against-reference'), {type: 'line',
  data: {datasets: against.map((s, i) => ({label: s.label, data: s.data, borderColor: colors[i % colors.length],
    backgroundColor: colors[i % colors.length], pointRadius: 3}))},
  options: {animation: false, maintainAspectRatio: false, parsing: true,
    // One legend entry per run covered the plot: past six runs the legend is off, each line is named
    // on hover, and the table below lists every run.
    plugins: {legend: {display: against.length <= 6}, tooltip: {callbacks: {title: (items) => items[0].dataset.label}}},
    scales: {x: {type: 'linear', title: {display: true, text: 'step (0 = init)'}},
             y: {type: 'logarithmic', ticks: {callback: (v) => Number(v).toExponential(0)},
                 title: {display: true, text: 'worst max |diff| over tensors (1e-12 = bitwise)'}}}}});
</script>
)";
    }
    page += "<table id=\"against-reference-table\"><tr><th>run</th><th>ran on</th><th>first step out of tolerance</th>"
            "<th>worst max |diff| per step</th><th>not comparable</th></tr>\n" +
            against_rows + "</table>\n";
  }
  page += "<h2>Verdicts</h2>\n<table id=\"verdicts\"><tr><th>scenario</th><th>run</th><th>ran on</th><th>verdict</th>"
          "<th>observed</th><th>divergence per step (step:max |diff|)</th><th>seconds</th></tr>\n" +
          rows + "</table>\n";
  page += "<h2>Replicated tensors that differ across ranks</h2>\n";
  page +=
      tensors.empty()
          ? std::string("<p>None: every replicated tensor was bitwise equal on every rank.</p>\n")
          : "<table id=\"divergence\"><tr><th>run</th><th>tensor</th><th>sharding</th><th>phase</th><th>max |diff|</th>"
            "<th>elements differing</th><th>ranks</th></tr>\n" +
                tensors + "</table>\n";
  page += "</body></html>\n";
  return page;
}

std::string load_chart_js() {
  std::vector<std::string> candidates;
  if (!settings().chartjs.empty()) candidates.push_back(settings().chartjs);
  candidates.push_back("/usr/share/javascript/chart.js/chart.min.js");
  for (const auto& path : candidates) {
    std::ifstream in(path);
    if (!in.good()) continue;
    std::string js(std::istreambuf_iterator<char>(in), {});
    // Never let the bundle close the inline <script> early.
    for (size_t at = js.find("</script"); at != std::string::npos; at = js.find("</script", at))
      js.replace(at, 2, "<\\/");
    return js;
  }
  return {};
}

}  // namespace dmpcheck::report
