// `dmpcheck releases`: every regression scenario on every pinned release, as one Markdown table
// (docs/releases.md), kept beside a JSON file of what each (scenario, release) showed, so that a
// second run measures only what changed (a scenario's text, a release not run before).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/digest.h"
#include "common/error.h"
#include "release/torchrec_systems.h"
#include "report/json.h"
#include "report/releases_picture.h"
#include "report/suite_reports.h"
#include "run/launcher.h"
#include "scenario/scenario.h"
#include "suite/behaviour.h"
#include "suite/cells.h"
#include "suite/releases.h"
#include "suite/suite.h"

namespace dmpcheck::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kStoreFormat = 1;
// How cells are judged (suite/behaviour.h): 2 tries each named release's own cell where the first
// meets no named behaviour; 3 judges a named behaviour only on a run that made its comparisons, and
// tells control cells apart.  A measurement judged before is kept where the newer judgement could
// not change it (decided, in a scenario with no control cell and no such comparison).
constexpr int kJudge = 3;

// What one scenario showed on one release, cell by cell.
struct Measured {
  std::string scenario, digest, release, torch;
  double seconds = 0;
  int judge = kJudge;
  struct Cell {
    std::string label, key, text;
    bool named = false, failed = false, skipped = false;
  };
  std::vector<Cell> cells;
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Measured::Cell, label, key, text, named, failed, skipped)

void to_json(json& j, const Measured& m) {
  j = json{{"scenario", m.scenario}, {"digest", m.digest}, {"release", m.release}, {"torch", m.torch},
           {"seconds", m.seconds},   {"cells", m.cells},   {"judge", m.judge}};
}
void from_json(const json& j, Measured& m) {
  j.at("scenario").get_to(m.scenario);
  j.at("digest").get_to(m.digest);
  j.at("release").get_to(m.release);
  j.at("torch").get_to(m.torch);
  j.at("seconds").get_to(m.seconds);
  j.at("cells").get_to(m.cells);
  m.judge = j.value("judge", 1);
}

std::string digest_of(const std::string& text) {
  const auto d = sha256(text);
  return to_hex(d.data(), 8);
}

// Whether a measurement still stands for the scenario as it is: the same text, and judged as now
// (or decided in a way the newer judgement would not change: no named cell met nothing).
bool judged_alike_before(const scenario::Scenario& s, const std::string& release) {
  static std::map<std::string, bool> known;  // by scenario digest
  const auto it = known.find(digest_of(s.source_text));
  if (it != known.end()) return it->second;
  bool alike = true;
  try {
    const auto replaced = scenario::load_scenario_file(s.file, {{"system", scenario::System::release(release).name()}});
    for (const auto& c : cells_on_system(s, replaced)) {
      alike = alike && !c.control && std::all_of(c.named.begin(), c.named.end(), [&](const NamedBehaviour& n) {
                return n.expect.error || n.expect.describe() == c.expect.describe() ||
                       (n.expect.reference.has_value() == c.expect.reference.has_value() &&
                        n.expect.reference_profile == c.expect.reference_profile &&
                        n.expect.reference_switches == c.expect.reference_switches);
              });
    }
  } catch (const Error&) { alike = false; }
  known[digest_of(s.source_text)] = alike;
  return alike;
}

bool still_valid(const Measured* m, const scenario::Scenario& s) {
  if (!m || m->digest != digest_of(s.source_text)) return false;
  if (m->judge >= kJudge) return true;
  return std::none_of(m->cells.begin(), m->cells.end(),
                      [](const Measured::Cell& c) { return c.named && c.key.rfind("other", 0) == 0; }) &&
         judged_alike_before(s, m->release);
}

// The store: one entry per (scenario, release), the newest measurement.
class Store {
 public:
  explicit Store(std::string path) : path_(std::move(path)) {
    if (!fs::exists(path_)) return;
    std::ifstream in(path_);
    json j;
    try {
      in >> j;
      DMP_CHECK(j.at("format").get<int>() == kStoreFormat, ErrorKind::kInvalidInput, "format {} is not {}",
                j.at("format").get<int>(), kStoreFormat);
      for (const auto& e : j.at("measured")) {
        Measured m = e.get<Measured>();
        entries_[{m.scenario, m.release}] = m;
      }
      if (j.contains("commits")) j.at("commits").get_to(commits_);
    } catch (const std::exception& e) {
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("{}: not a release table's store ({}); remove it, or run with --fresh", path_, e.what()));
    }
  }
  const Measured* find(const std::string& scenario, const std::string& release) const {
    const auto it = entries_.find({scenario, release});
    return it == entries_.end() ? nullptr : &it->second;
  }
  void put(const Measured& m) {
    entries_[{m.scenario, m.release}] = m;
    save();
  }
  // The commit bisection of one change: "<scenario> <from>..<to>" -> what it found.
  const json* commit(const std::string& key) const {
    const auto it = commits_.find(key);
    return it == commits_.end() ? nullptr : &it->second;
  }
  void put_commit(const std::string& key, json found) {
    commits_[key] = std::move(found);
    save();
  }

 private:
  void save() const {
    json all = json::array();
    for (const auto& [key, e] : entries_) all.push_back(e);
    report::write_text_file_atomically(
        path_, json{{"format", kStoreFormat}, {"measured", all}, {"commits", commits_}}.dump(1) + "\n");
  }
  std::string path_;
  std::map<std::pair<std::string, std::string>, Measured> entries_;
  std::map<std::string, json> commits_;
};

// One scenario on one release, in a word: "bug", "no bug", "error", "differs", "not runnable",
// "not reproduced", "undecided", "not run".
std::string word_of(const Measured& m) {
  auto any = [&](auto pred) { return std::any_of(m.cells.begin(), m.cells.end(), pred); };
  const bool named = any([](const Measured::Cell& c) { return c.named; });
  auto judged = [&](const Measured::Cell& c) { return c.named || !named; };
  if (any([&](const Measured::Cell& c) { return judged(c) && c.key == "bug"; })) return "bug";
  if (std::all_of(m.cells.begin(), m.cells.end(), [](const Measured::Cell& c) { return c.skipped; })) return "not run";
  if (any([&](const Measured::Cell& c) { return judged(c) && c.failed && c.key.rfind("other", 0) == 0; }))
    return "error";
  if (named && any([&](const Measured::Cell& c) { return c.named && c.key.rfind("other", 0) == 0; })) return "differs";
  if (any([&](const Measured::Cell& c) { return judged(c) && c.key == "not runnable"; })) return "not runnable";
  if (any([&](const Measured::Cell& c) { return judged(c) && (c.key == "fixed" || c.key == "absent"); }))
    return "no bug";
  if (any([&](const Measured::Cell& c) { return judged(c) && c.key == "not reproduced"; })) return "not reproduced";
  if (any([&](const Measured::Cell& c) { return judged(c) && c.key == "as written"; })) return "as written";
  if (named && std::all_of(m.cells.begin(), m.cells.end(),
                           [](const Measured::Cell& c) { return !c.named || c.key == "control"; }))
    return "control only";
  return named ? "undecided" : "ran";
}

Measured measure(const scenario::Scenario& original, const std::string& release, const ReleaseOptions& options) {
  Measured m;
  m.scenario = original.name;
  m.digest = digest_of(original.source_text);
  m.release = release;
  const auto start = std::chrono::steady_clock::now();
  scenario::Scenario replaced;
  try {
    replaced = scenario::load_scenario_file(original.file, {{"system", scenario::System::release(release).name()}});
  } catch (const Error& e) {
    // The file cannot describe a release cell (a reference-only expectation, say): one failed cell.
    m.cells.push_back({"default", "other: cannot run on a release", e.what(), false, true, false});
    return m;
  }
  ScenarioRunOptions o;
  o.worker_executable = options.worker_executable;
  o.out_dir = options.out_dir + "/releases-" + release;
  o.echo_rank_output = false;
  for (const auto& cell : cells_on_system(original, replaced)) {
    if (interrupt_requested()) break;
    Behaviour judged = judge_cell(cell, [&](size_t run) {
      check::RunResult r = run_cell(replaced, run, o);
      if (m.torch.empty() && !r.system.torch.empty()) m.torch = r.system.torch;
      return r;
    });
    // A release the scenario names without a cell of its own ("not runnable: <why>"): failing there
    // is what it says.
    const std::string self = scenario::System::release(release).name();
    if (judged.failed && judged.key.rfind("other", 0) == 0 && original.reproduces) {
      for (const auto& named : original.reproduces->releases) {
        const std::string& system = named.first;
        const std::string& status = named.second;
        const bool has_cell = std::any_of(original.runs.begin(), original.runs.end(),
                                          [&](const scenario::RunSpec& r) { return r.system.name() == system; });
        if (system == self && !has_cell && status.rfind("not runnable", 0) == 0) {
          judged.key = "not runnable";
          judged.text += fmt::format(" (the scenario says of {}: {})", system, status);
        }
      }
    }
    m.cells.push_back({cell.label, judged.key, judged.text, !cell.named.empty(), judged.failed, judged.skipped});
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

// A scenario's row: its word on each release ("-" where not measured) and where the word changes.
struct Row {
  std::vector<std::string> words;
  struct Change {
    std::string from, to, was, is;
  };
  std::vector<Change> changes;
  std::map<std::string, std::vector<std::string>> detail;  // "[label] text" -> the releases it was seen on
  std::set<std::string> torch;
  size_t measured = 0;
};

Row row_of(const scenario::Scenario& s, const std::vector<std::string>& releases, const Store& store) {
  Row row;
  bool seen_bug = false;
  std::string previous, previous_release;
  for (const auto& release : releases) {
    const Measured* m = store.find(s.name, release);
    if (!still_valid(m, s)) {
      row.words.push_back("-");
      continue;
    }
    ++row.measured;
    if (!m->torch.empty()) row.torch.insert(fmt::format("{} (torch {})", release, m->torch));
    std::string w = word_of(*m);
    if (w == "no bug") w = seen_bug ? "fixed" : "absent";
    if (w == "bug") seen_bug = true;
    if (!previous.empty() && w != previous) row.changes.push_back({previous_release, release, previous, w});
    previous = w;
    previous_release = release;
    row.words.push_back(w);
    if (w != "bug" && w != "fixed" && w != "absent") {
      for (const auto& c : m->cells) {
        if (c.named || w == "ran") row.detail[fmt::format("[{}] {}", c.label, c.text)].push_back(release);
      }
    }
  }
  return row;
}

std::string commit_key(const std::string& scenario, const Row::Change& c) {
  return fmt::format("{} {}..{}", scenario, c.from, c.to);
}

// Where a bug appears or goes between two releases whose tags the repository has: the commit.
void find_commits(const std::vector<scenario::Scenario>& scenarios, const std::vector<std::string>& releases,
                  Store& store, const ReleaseOptions& options) {
  (void)TorchRecRepository::open();  // no repository: said once, before anything runs
  for (const auto& s : scenarios) {
    for (const auto& c : row_of(s, releases, store).changes) {
      if (interrupt_requested()) return;
      if (c.was != "bug" && c.is != "bug") continue;
      const std::string key = commit_key(s.name, c);
      const json* before = store.commit(key);
      // Measured before, unless it stopped where the commits no longer import over the older
      // release's environment, before the bisection went on over the newer one's.
      if (before && before->at("digest") == digest_of(s.source_text) &&
          (before->at("status") != 4 || before->value("across", false)))
        continue;
      ReleaseOptions o = options;
      o.scenario_files = {s.file};
      o.out_dir = options.out_dir + "/commits";
      *options.out << fmt::format("releases: {}: {} on {}, {} on {}: the commits between\n", s.name, c.was, c.from,
                                  c.is, c.to)
                   << std::flush;
      Commit found;
      int status = 0;
      try {
        status = first_commit_between(o, c.from, c.to, &found);
      } catch (const Error& e) {
        *options.out << fmt::format("releases: {}: the commit bisection failed: {}\n", key, e.what());
        continue;
      }
      if (status == 2) continue;  // a tag the repository lacks: not recorded, nothing to say
      json j{{"digest", digest_of(s.source_text)}, {"status", status}, {"across", true}};
      if (status == 0) j.update({{"hash", found.hash}, {"subject", found.subject}, {"date", found.date}});
      if (!interrupt_requested()) store.put_commit(key, j);
    }
  }
}

}  // namespace

int release_table(const ReleaseOptions& options) {
  std::ostream& out = *options.out;
  DMP_CHECK(!options.output.empty(), ErrorKind::kInvalidInput, "releases needs --output FILE.md");
  const std::vector<std::string> releases = release_list(options.releases);
  const std::vector<std::string> files = collect_scenario_files(options.scenario_files);
  DMP_CHECK(!files.empty(), ErrorKind::kInvalidInput, "releases: no scenario files (*.yaml) under {}",
            fmt::join(options.scenario_files, ", "));
  std::vector<scenario::Scenario> scenarios;
  for (const auto& f : files) scenarios.push_back(scenario::load_scenario_file(f));  // bad input before any run
  std::string store_path = options.output;
  if (store_path.size() > 3 && store_path.compare(store_path.size() - 3, 3, ".md") == 0)
    store_path.resize(store_path.size() - 3);
  store_path += ".json";
  if (options.fresh && fs::exists(store_path)) fs::remove(store_path);
  Store store(store_path);

  size_t to_run = 0;
  for (const auto& r : releases)
    for (const auto& s : scenarios) {
      const Measured* m = store.find(s.name, r);
      if (!still_valid(m, s)) ++to_run;
    }
  out << fmt::format(
             "releases: {} scenario(s) x {} release(s) ({} to {}); {} measured before and unchanged, {} to run; "
             "store {}\n",
             scenarios.size(), releases.size(), releases.front(), releases.back(),
             scenarios.size() * releases.size() - to_run, to_run, store_path)
      << std::flush;
  const auto start = std::chrono::steady_clock::now();
  size_t done = 0;
  // Release by release: each environment is needed once (and may be installed, and later evicted).
  for (const auto& release : releases) {
    for (const auto& s : scenarios) {
      if (interrupt_requested()) break;
      const Measured* before = store.find(s.name, release);
      if (still_valid(before, s)) continue;
      const Measured m = measure(s, release, options);
      ++done;
      const std::string word = word_of(m);
      out << fmt::format("[{}/{}] torchrec {} {}: {} ({:.1f} s)\n", done, to_run, release, s.name, word, m.seconds);
      for (const auto& c : m.cells) out << fmt::format("    [{}] {}\n", c.label, c.text);
      out << std::flush;
      // A release that did not run (not installed, --no-install) is not recorded: the next run tries again.
      if (word != "not run" && !interrupt_requested()) store.put(m);
    }
  }

  // The table, from the store (this run's measurements and the earlier ones still valid).
  std::string md;
  md += "# Every regression scenario on every TorchRec release\n\n";
  md += "Generated by one command; do not edit by hand. To bring it up to date (it runs only what is not measured "
        "yet, or whose scenario changed; `--fresh` runs everything; a release not installed is installed within "
        "`$DMPCHECK_TORCHREC_BUDGET_GB`):\n\n";
  md += fmt::format("```bash\nbuild/harness/dmpcheck releases {} --output {}{}\n```\n\n",
                    fmt::join(options.scenario_files, " "), options.output,
                    options.table_commits ? " --commits --torchrec-repo ../shared/torchrec.bundle" : "");
  md += "Each scenario's cells run on each release, its `system` replaced, and each cell is judged against the "
        "expectations the scenario writes for the releases (or reference profiles) it names in "
        "`reproduces.releases`: **bug** meets those of a release where the report shows; **fixed** / **absent** meets "
        "those of a release where it does not (fixed where an older release shows the bug, absent where none does); "
        "**error** the release failed in a way no named release does (its own error, in the notes); **differs** it "
        "ran and meets none of them; **not runnable** it fails as a release the scenario marks not runnable; "
        "**undecided** its cells cannot tell the named behaviours apart there; **control only** it ran only the cells "
        "every named release expects to work (the workaround beside the bug); **as written** it meets what the file's "
        "release cells expect, in a scenario that names no release's behaviour (a bug modelled in the reference that "
        "no release is known to have); **-** not measured. Changes: the "
        "releases where the word changes from the release before; where a bug appears or goes between two releases "
        "whose tags TorchRec's repository has (the bundle used here has v0.1.0 to v1.3.0), the first commit along "
        "main, from the older release's branch point, whose source over the older release's environment behaves "
        "differently from it; where the later commits need more than that environment has (they do not import over "
        "it), the search goes on over the newer release's from the last commit that ran (`dmpcheck bisect "
        "--commits`).\n\n";
  md += fmt::format("| scenario | {} | changes |\n", fmt::join(releases, " | "));
  md += "|---|";
  for (size_t i = 0; i < releases.size(); ++i) md += ":-:|";
  md += "---|\n";
  if (options.table_commits) find_commits(scenarios, releases, store, options);
  std::string notes;
  std::set<std::string> torch_lines;
  size_t measured = 0;
  std::vector<report::PictureRow> picture;
  const fs::path page_dir = fs::absolute(options.output).parent_path();
  for (const auto& s : scenarios) {
    const Row row = row_of(s, releases, store);
    report::PictureRow& drawn = picture.emplace_back();
    drawn.scenario = s.name;
    drawn.link = fs::relative(fs::absolute(s.file), page_dir).string();
    drawn.words = row.words;
    measured += row.measured;
    torch_lines.insert(row.torch.begin(), row.torch.end());
    std::vector<std::string> words, changes;
    for (const auto& w : row.words) words.push_back(w == "bug" ? "**bug**" : w);
    for (const auto& c : row.changes) {
      std::string commit;
      const json* found = store.commit(commit_key(s.name, c));
      if (found && found->at("digest") == digest_of(s.source_text) && found->contains("hash")) {
        commit = fmt::format(", commit {} \"{}\" ({})", found->at("hash").get<std::string>().substr(0, 8),
                             report::md_escape(found->at("subject").get<std::string>()),
                             found->at("date").get<std::string>());
      } else if (found && found->at("digest") == digest_of(s.source_text)) {
        commit = found->at("status") == 1 ? ", not a commit: its ends behave alike over one environment, so the change "
                                            "comes with the environment (torch, fbgemm)"
                                          : ", no single commit found (`dmpcheck bisect --commits` says why)";
      }
      changes.push_back(fmt::format("{} ({} → {}{})", c.to, c.was, c.is, commit));
      const auto column = std::find(releases.begin(), releases.end(), c.to);
      if (column != releases.end()) {
        drawn.changes[static_cast<size_t>(column - releases.begin())] = fmt::format("{} → {}{}", c.was, c.is, commit);
      }
    }
    md += fmt::format("| `{}` | {} | {} |\n", s.name, fmt::join(words, " | "),
                      changes.empty() ? std::string("none") : fmt::format("{}", fmt::join(changes, "; ")));
    if (!row.detail.empty()) {
      notes += fmt::format("- `{}`:\n", s.name);
      for (const auto& [text, rs] : row.detail)
        notes += fmt::format("  - {}: {}\n", fmt::join(rs, ", "), report::md_escape(text));
    }
  }
  md += fmt::format("\n{} of {} (scenario, release) pairs measured. Releases and the torch each ran with: {}.\n",
                    measured, scenarios.size() * releases.size(), fmt::join(torch_lines, ", "));
  if (!notes.empty()) md += "\n## Notes: what the cells showed where the word is not bug, fixed or absent\n\n" + notes;
  report::write_text_file_atomically(options.output, md);
  // The same matrix as a picture: an SVG for documents, and a page around it that sorts and links.
  const std::string svg_path = store_path.substr(0, store_path.size() - 5) + ".svg";
  const std::string html_path = store_path.substr(0, store_path.size() - 5) + ".html";
  report::write_text_file_atomically(svg_path, report::render_releases_svg(releases, picture));
  report::write_text_file_atomically(
      html_path, report::render_releases_html("Every regression scenario on every TorchRec release", releases, picture,
                                              fs::path(svg_path).filename().string()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out << fmt::format("releases: {} run now in {:.0f} s; {} of {} pairs measured; written to {} (and {}, {})\n", done,
                     seconds, measured, scenarios.size() * releases.size(), options.output, svg_path, html_path);
  return measured == scenarios.size() * releases.size() ? 0 : 4;
}

}  // namespace dmpcheck::run
