#include "report/releases_picture.h"

#include <fmt/format.h>

#include "report/suite_reports.h"

namespace dmpcheck::report {
namespace {

// One colour per word; a word not here (a new one) is drawn grey and named in the legend anyway.
struct Colour {
  const char* word;
  const char* fill;
  const char* meaning;
};
constexpr Colour kColours[] = {
    {"bug", "#d7301f", "the report's bug shows"},
    {"fixed", "#1a9850", "no bug, where an older release showed it"},
    {"absent", "#a6d96a", "no bug, and no older release showed it"},
    {"error", "#fdae61", "failed as no named release does"},
    {"differs", "#9e64c6", "ran, and meets none of the named behaviours"},
    {"not runnable", "#969696", "fails as the scenario says this release cannot run it"},
    {"undecided", "#ffff99", "its cells cannot tell the behaviours apart"},
    {"control only", "#abd9e9", "ran only the cells every release is expected to pass"},
    {"as written", "#74add1", "meets what the file's release cells expect"},
    {"-", "#ffffff", "not measured (not installed here)"},
};

const char* fill_of(const std::string& word) {
  for (const auto& c : kColours) {
    if (word == c.word) return c.fill;
  }
  return "#d9d9d9";
}

std::string escape(const std::string& text) { return xml_escape(text); }

constexpr int kNameWidth = 430, kCell = 44, kRow = 18, kHead = 70;

}  // namespace

std::string render_releases_svg(const std::vector<std::string>& releases, const std::vector<PictureRow>& rows) {
  const int width = kNameWidth + kCell * static_cast<int>(releases.size()) + 10;
  const int legend_top = kHead + kRow * static_cast<int>(rows.size()) + 16;
  const int height = legend_top + 18 * static_cast<int>(std::size(kColours)) + 30;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      width, height, width, height);
  for (size_t c = 0; c < releases.size(); ++c) {
    const int x = kNameWidth + kCell * static_cast<int>(c) + kCell / 2;
    svg += fmt::format("<text x=\"{}\" y=\"{}\" transform=\"rotate(-45 {} {})\">{}</text>\n", x, kHead - 6, x,
                       kHead - 6, escape(releases[c]));
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const int y = kHead + kRow * static_cast<int>(r);
    svg += fmt::format("<text x=\"4\" y=\"{}\">{}</text>\n", y + 13, escape(rows[r].scenario));
    for (size_t c = 0; c < releases.size() && c < rows[r].words.size(); ++c) {
      const int x = kNameWidth + kCell * static_cast<int>(c);
      const auto change = rows[r].changes.find(c);
      svg += fmt::format(
          "<rect class=\"cell\" data-scenario=\"{}\" data-release=\"{}\" data-word=\"{}\" x=\"{}\" y=\"{}\" "
          "width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\"><title>{} on torchrec {}: {}{}</title></rect>\n",
          escape(rows[r].scenario), escape(releases[c]), escape(rows[r].words[c]), x, y, kCell, kRow,
          fill_of(rows[r].words[c]), escape(rows[r].scenario), escape(releases[c]), escape(rows[r].words[c]),
          change == rows[r].changes.end() ? "" : escape("; changed here: " + change->second));
      if (change != rows[r].changes.end()) {  // the change: a black bar on the cell's left edge
        svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"3\" height=\"{}\" fill=\"#000000\"/>\n", x, y, kRow);
      }
    }
  }
  for (size_t i = 0; i < std::size(kColours); ++i) {
    const int y = legend_top + 18 * static_cast<int>(i);
    svg +=
        fmt::format("<rect x=\"4\" y=\"{}\" width=\"14\" height=\"12\" fill=\"{}\" stroke=\"#999999\"/><text x=\"24\" "
                    "y=\"{}\">{}: {}</text>\n",
                    y, kColours[i].fill, y + 10, kColours[i].word, kColours[i].meaning);
  }
  svg += fmt::format(
      "<rect x=\"4\" y=\"{}\" width=\"3\" height=\"12\" fill=\"#000000\"/><text x=\"24\" y=\"{}\">the word changes "
      "here from the release before (the commit, where one was found, on hover)</text>\n</svg>\n",
      legend_top + 18 * static_cast<int>(std::size(kColours)),
      legend_top + 18 * static_cast<int>(std::size(kColours)) + 10);
  return svg;
}

std::string render_releases_html(const std::string& title, const std::vector<std::string>& releases,
                                 const std::vector<PictureRow>& rows, const std::string& svg_file) {
  std::string page = fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}
th,td{{border:1px solid #fff;padding:2px 6px;white-space:nowrap}}
th{{background:#eee;cursor:pointer;position:sticky;top:0}}
td.w{{text-align:center;min-width:3.2em}}
td.change{{border-left:3px solid #000}}
</style></head><body>
<h1>{}</h1>
<p>Rows: reports; columns: releases; click a column's head to sort by it. A black left edge marks where the
word changes from the release before; hover a cell for the commit found there. The same picture for
documents: <a href="{}">{}</a>.</p>
<table id="matrix"><thead><tr><th data-col="0">scenario</th>)",
                                 escape(title), escape(title), escape(svg_file), escape(svg_file));
  for (size_t c = 0; c < releases.size(); ++c) {
    page += fmt::format("<th data-col=\"{}\">{}</th>", c + 1, escape(releases[c]));
  }
  page += "</tr></thead><tbody>\n";
  for (const auto& row : rows) {
    page += fmt::format("<tr><td><a href=\"{}\">{}</a></td>", escape(row.link), escape(row.scenario));
    for (size_t c = 0; c < releases.size() && c < row.words.size(); ++c) {
      const auto change = row.changes.find(c);
      page += fmt::format(
          "<td class=\"w{}\" style=\"background:{}\" data-release=\"{}\" data-word=\"{}\" title=\"{}\">{}</td>",
          change == row.changes.end() ? "" : " change", fill_of(row.words[c]), escape(releases[c]),
          escape(row.words[c]), change == row.changes.end() ? escape(row.words[c]) : escape(change->second),
          escape(row.words[c]));
    }
    page += "</tr>\n";
  }
  page += "</tbody></table>\n<h2>Colours</h2>\n<table>";
  for (const auto& c : kColours) {
    page +=
        fmt::format("<tr><td class=\"w\" style=\"background:{}\">{}</td><td>{}</td></tr>", c.fill, c.word, c.meaning);
  }
  page += R"(</table>
<script>
// Sorts the matrix by the clicked column (the scenario's name, or a release's word), again to reverse.
document.querySelectorAll('#matrix th').forEach(th => th.addEventListener('click', () => {
  const col = +th.dataset.col, body = document.querySelector('#matrix tbody');
  const up = th.dataset.up !== '1';
  document.querySelectorAll('#matrix th').forEach(h => delete h.dataset.up);
  if (up) th.dataset.up = '1';
  const key = (tr) => tr.children[col].textContent;
  [...body.rows].sort((a, b) => (up ? 1 : -1) * key(a).localeCompare(key(b))).forEach(tr => body.appendChild(tr));
}));
</script>
</body></html>
)";
  return page;
}

}  // namespace dmpcheck::report
