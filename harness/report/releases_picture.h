// The releases matrix as a picture (`dmpcheck releases`): reports x releases, a colour per word
// (bug, fixed, absent, error, not runnable, ...), each cell where the word changes marked with the
// commit found there.  An SVG that docs/ can embed, and an HTML page around the same data whose table
// sorts by any column and links each report to its file.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dmpcheck::report {

struct PictureRow {
  std::string scenario;
  std::string link;                       // the scenario file, relative to the page
  std::vector<std::string> words;         // one per release: "bug", "fixed", ..., "-" (not measured)
  std::map<size_t, std::string> changes;  // release index -> what changed there ("fixed → bug, commit ...")
};

std::string render_releases_svg(const std::vector<std::string>& releases, const std::vector<PictureRow>& rows);
std::string render_releases_html(const std::string& title, const std::vector<std::string>& releases,
                                 const std::vector<PictureRow>& rows, const std::string& svg_file);

}  // namespace dmpcheck::report
