#include "suite/releases.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <torch/version.h>

#include <ATen/Version.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "release/torchrec_systems.h"
#include "report/console.h"
#include "report/json.h"
#include "run/launcher.h"
#include "scenario/scenario.h"
#include "suite/behaviour.h"
#include "suite/bisect_search.h"
#include "suite/cells.h"

namespace dmpcheck::run {
namespace {

// The BLAS libtorch was built with (BLAS_INFO in its build configuration): it decides the order in
// which a Linear's dot products are added.
std::string blas_info() {
  const std::string config = at::show_config();
  const auto at = config.find("BLAS_INFO=");
  if (at == std::string::npos) return "BLAS unknown";
  const auto end = config.find_first_of(", \n", at);
  return config.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// The scenario's cells on one release: the cells that differ only by system or profile are one.
std::vector<size_t> distinct_cells(const scenario::Scenario& s, std::vector<std::string>* labels) {
  std::vector<size_t> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const std::string label = cell_label(s.runs[i].cell);
    if (!seen.insert(label).second) continue;
    out.push_back(i);
    labels->push_back(label);
  }
  return out;
}

ScenarioRunOptions cell_options(const ReleaseOptions& options, const std::string& sub) {
  ScenarioRunOptions o;
  o.worker_executable = options.worker_executable;
  o.out_dir = options.out_dir + "/" + sub;
  o.echo_rank_output = false;
  return o;
}

}  // namespace

namespace {

// One point of a bisection: a release or a commit, as the system the scenario's cells run on.
struct Point {
  std::string label;   // "torchrec 0.7.0", "cc482f8a 2024-04-10 Broadcast DP tables when init"
  std::string system;  // its text form, put in place of the scenario's `system`
  std::string name;    // what the verdict line calls it: "0.8.0", "cc482f8a"
};

// What a point showed: one behaviour per distinct cell (its key, compared between points, and its
// text, shown), or that it could not run.
struct Seen : SearchSeen {
  bool visited = false, import_failed = false;
  std::vector<std::string> texts;
};

// A bisection over releases or commits: runs the scenario's cells on the points the search
// (suite/bisect_search.h) visits, and says what each showed.
class Bisection {
 public:
  Bisection(const ReleaseOptions& options, std::vector<Point> points, std::string sub, bool commits)
      : options_(options),
        original_(scenario::load_scenario_file(options.scenario_files[0])),
        points_(std::move(points)),
        seen_(points_.size()),
        sub_(std::move(sub)),
        commits_(commits) {}

  const Seen& visit(size_t i) {
    Seen& s = seen_[i];
    if (s.visited) return s;
    s.visited = true;
    const scenario::Scenario scenario =
        scenario::load_scenario_file(options_.scenario_files[0], {{"system", points_[i].system}});
    const auto cells = cells_on_system(original_, scenario);
    labels_.clear();
    for (const auto& c : cells) labels_.push_back(c.label);
    const auto start = std::chrono::steady_clock::now();
    bool skipped = false;
    for (size_t c = 0; c < cells.size() && !interrupt_requested(); ++c) {
      const Behaviour b = judge_cell(cells[c], [&](size_t run) {
        check::RunResult r = run_cell(scenario, run, cell_options(options_, sub_));
        const bool chosen = commits_ && options_.over.empty();  // dmpcheck picked the environment
        s.import_failed = s.import_failed || (r.failure && r.failure->kind == FailureKind::kImport) ||
                          (chosen && environment_explains(r));
        return r;
      });
      skipped = skipped || b.skipped;
      s.error = s.error || b.failed;
      s.obs.push_back(b.key);
      s.texts.push_back(b.text);
    }
    // A commit whose source does not import over the environment did not run: it is no behaviour;
    // nor is what an interrupt stopped.
    const bool interrupted = interrupt_requested();
    s.ran = !skipped && !interrupted && s.obs.size() == cells.size() && !(commits_ && s.import_failed);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *options_.out << fmt::format("{} ({:.1f} s){}:\n", points_[i].label, seconds,
                                 interrupted                   ? ", interrupted: not a behaviour"
                                 : skipped                     ? ", not tested"
                                 : commits_ && s.import_failed ? ", did not run over this environment (what it "
                                                                 "failed on is the environment's): not a behaviour"
                                                               : "");
    for (size_t c = 0; c < s.texts.size(); ++c) *options_.out << fmt::format("  [{}] {}\n", labels_[c], s.texts[c]);
    *options_.out << std::flush;
    return s;
  }

  // Runs the search.  Returns false when the old end cannot run.  A release not installed at an
  // end costs nothing, so the next one inward is tried.  Among commits, the newer ones may need
  // more than the environment has (an fbgemm function of the next release): where the new end does
  // not import, the commits that do not are taken to be the newest ones, and the search looks for
  // the first commit that runs and behaves differently, or else for the first that does not import.
  bool run() {
    result_ = bisect_search(
        points_.size(), commits_, [this](size_t i) -> const SearchSeen& { return visit(i); },
        [] { return interrupt_requested(); });
    return result_.ran;
  }

  // After run(): an interrupted search draws no conclusion.  Says so, with what was measured.
  bool interrupted() const {
    if (!interrupt_requested()) return false;
    *options_.out << fmt::format(
        "bisect: interrupted (SIGINT or SIGTERM) after {} point(s) measured (above); an interrupted search draws no "
        "conclusion\n",
        visited());
    return true;
  }

  // Whether `hi` ran and showed a behaviour (else it is the first commit that did not import).
  bool hi_behaves() const { return result_.hi_behaves; }
  size_t lo() const { return result_.lo; }
  size_t hi() const { return result_.hi; }
  bool same_at_both_ends() const { return hi_behaves() && seen_[lo()].obs == seen_[hi()].obs; }
  size_t visited() const {
    return static_cast<size_t>(std::count_if(seen_.begin(), seen_.end(), [](const Seen& s) { return s.visited; }));
  }
  // The points strictly between lo and hi that were tried and could not decide.
  std::vector<size_t> untested_between() const {
    std::vector<size_t> out;
    for (size_t i : result_.untested)
      if (i > lo() && i < hi()) out.push_back(i);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<size_t> untested() const { return result_.untested; }
  const Point& point(size_t i) const { return points_[i]; }

  // The cells whose observation differs between lo and hi, one line each.
  void print_difference(std::ostream& out) const {
    for (size_t c = 0; c < labels_.size() && c < seen_[lo()].obs.size() && c < seen_[hi()].obs.size(); ++c) {
      if (seen_[lo()].obs[c] == seen_[hi()].obs[c]) continue;
      out << fmt::format("  [{}] {}: {}  ->  {}: {}\n", labels_[c], points_[lo()].name, seen_[lo()].texts[c],
                         points_[hi()].name, seen_[hi()].texts[c]);
    }
  }

 private:
  const ReleaseOptions& options_;
  const scenario::Scenario original_;  // as written: the behaviours it names per release
  std::vector<Point> points_;
  std::vector<Seen> seen_;
  std::string sub_;
  bool commits_;
  std::vector<std::string> labels_;
  SearchResult result_;  // where the search ended
};

std::string steps_for(size_t n) {
  size_t steps = 0;
  while ((size_t{1} << steps) < n) ++steps;
  return fmt::format("about {} step{}", steps, steps == 1 ? "" : "s");
}

// The commits between `old_rev` (excluded) and `new_rev` along first parents, each its source over
// the `over` release's environment, bisected like the releases.
// Where the newer commits do not import over `over`, *resume_from is the last commit that ran.
int bisect_commits(const ReleaseOptions& options, const TorchRecRepository& repo, const std::string& old_rev,
                   const std::string& new_rev, const std::string& over, Commit* found = nullptr,
                   std::string* resume_from = nullptr) {
  std::ostream& out = *options.out;
  const Commit old_end = repo.resolve(old_rev);
  const std::vector<Commit> commits = repo.first_parent_range(old_end.hash, new_rev);
  DMP_CHECK(!commits.empty(), ErrorKind::kInvalidInput, "bisect: no commits between {} and {}", old_rev, new_rev);
  // The old end, then every commit after it: point i > 0 is commits[i - 1].
  std::vector<Point> points;
  auto add = [&](const Commit& c) {
    points.push_back({fmt::format("commit {} {} {}", c.short_hash(), c.date, c.subject),
                      scenario::System::commit(c.hash, over).name(), c.short_hash()});
  };
  add(old_end);
  for (const Commit& c : commits) add(c);
  out << fmt::format("bisect: {} commits from {} to {} along first parents, each its source over the torchrec {} "
                     "environment; {}\n",
                     commits.size(), old_end.short_hash(), commits.back().short_hash(), over,
                     steps_for(commits.size() + 1))
      << std::flush;
  Bisection b(options, points, "bisect-commits", true);
  const bool ran = b.run();
  if (b.interrupted()) return 130;
  if (!ran) {
    out << fmt::format("bisect: {} could not run over the torchrec {} environment (see above); name another with "
                       "--over\n",
                       b.point(0).name, over);
    return 3;
  }
  if (!b.hi_behaves()) {
    out << fmt::format("bisect: every commit that runs over the torchrec {} environment behaves as {}, through {}; "
                       "from {} on the commits do not run over it (they do not import, or reach for an fbgemm or "
                       "torch operator or attribute it lacks){}\n",
                       over, b.point(0).name, b.point(b.lo()).name, b.point(b.hi()).name,
                       b.hi() - b.lo() > 1 ? " (some between could not be tested)" : "");
    out << fmt::format("first commit that does not run over torchrec {}: {} \"{}\" ({}); try the commits from "
                       "there over a newer release's environment (--commit-range {}..{} --over X.Y.Z)\n",
                       over, b.point(b.hi()).name, commits[b.hi() - 1].subject, commits[b.hi() - 1].date,
                       b.point(b.lo()).name, commits.back().short_hash());
    if (resume_from) *resume_from = b.lo() == 0 ? old_end.hash : commits[b.lo() - 1].hash;
    return 4;
  }
  if (b.same_at_both_ends()) {
    out << fmt::format("bisect: {} and {} behave the same over the torchrec {} environment: the change is not in "
                       "TorchRec's source between them but in what an environment brings (torch, fbgemm)\n",
                       b.point(b.lo()).name, b.point(b.hi()).name, over);
    return 1;
  }
  const auto untested = b.untested_between();
  if (b.hi() - b.lo() > 1) {
    std::vector<std::string> names;
    for (size_t i : untested) names.push_back(b.point(i).name);
    out << fmt::format("bisect: the behaviour changes between commits {} and {}; the {} between could not be tested "
                       "over torchrec {} ({})\n",
                       b.point(b.lo()).name, b.point(b.hi()).name, names.size(), over, fmt::join(names, ", "));
    b.print_difference(out);
    return 4;
  }
  const Commit& first = commits[b.hi() - 1];
  if (found) *found = first;
  out << fmt::format("bisect: {} commits run; the last that behaves as {}: {}\n", b.visited(), b.point(0).name,
                     b.point(b.lo()).label.substr(7));
  b.print_difference(out);
  out << fmt::format("first commit that behaves differently: {} \"{}\" ({})\n", first.hash.substr(0, 8), first.subject,
                     first.date);
  return 0;
}

// The commits from `old_rev` to `new_rev` over the older release's environment; where the newer
// ones need more than it has (they do not import over it), the rest over the newer release's,
// from the last commit that ran: each commit is judged over an environment it imports in.
int bisect_commits_across(const ReleaseOptions& options, const TorchRecRepository& repo, const std::string& old_rev,
                          const std::string& new_rev, const std::string& older, const std::string& newer,
                          Commit* found) {
  std::string resume_from;
  const int status = bisect_commits(options, repo, old_rev, new_rev, older, found, &resume_from);
  if (status != 4 || interrupt_requested() || resume_from.empty() || older == newer) return status;
  *options.out << fmt::format(
                      "bisect: on over the torchrec {} environment, from {}, the last commit that ran over {}\n", newer,
                      repo.resolve(resume_from).short_hash(), older)
               << std::flush;
  const int again = bisect_commits(options, repo, resume_from, new_rev, newer, found);
  if (again == 3 && !interrupt_requested()) {
    // Neither environment runs both sides: the older one stops at a commit that needs more than it
    // has, the newer one cannot run the last commit the older one ran.  As git bisect with skipped
    // commits, the answer is a range, said as one.
    *options.out << fmt::format(
        "bisect: no environment runs the commits on both sides of the change: the change lies between {} (the last "
        "that ran over torchrec {}) and {}, untested between; no commit is named\n",
        repo.resolve(resume_from).short_hash(), older, repo.resolve(new_rev).short_hash());
    return 4;
  }
  return again;
}

}  // namespace

std::vector<std::string> release_list(const std::vector<std::string>& given) {
  std::vector<std::string> releases = given.empty() ? pinned_releases() : given;
  // A range of pinned releases, "A..B": every pinned one from A to B.
  if (given.size() == 1 && given[0].find("..") != std::string::npos) {
    const std::string& range = given[0];
    const std::string from = range.substr(0, range.find("..")), to = range.substr(range.find("..") + 2);
    const auto pinned = pinned_releases();
    for (const auto& end : {from, to}) {
      DMP_CHECK(std::find(pinned.begin(), pinned.end(), end) != pinned.end(), ErrorKind::kInvalidInput,
                "--releases {}: {} is not a pinned release (pinned: {})", range, end, fmt::join(pinned, ", "));
    }
    releases.clear();
    for (const auto& r : pinned) {
      if (!version_less(r, from) && !version_less(to, r)) releases.push_back(r);
    }
  }
  for (const auto& r : releases) {
    DMP_CHECK(scenario::System::is_version(r), ErrorKind::kInvalidInput, "--releases: '{}' is not a release X.Y.Z", r);
  }
  DMP_CHECK(std::is_sorted(releases.begin(), releases.end(), version_less) &&
                std::adjacent_find(releases.begin(), releases.end()) == releases.end(),
            ErrorKind::kInvalidInput, "--releases {}: give them oldest first, each once", fmt::join(releases, ","));
  return releases;
}

int bisect_releases(const ReleaseOptions& options) {
  DMP_CHECK(options.scenario_files.size() == 1, ErrorKind::kInvalidInput, "bisect takes one scenario file");
  std::ostream& out = *options.out;
  // Every system's text first: a typo should not cost the runs before it.
  if (!options.over.empty()) {
    DMP_CHECK(scenario::System::is_version(options.over), ErrorKind::kInvalidInput,
              "--over {}: expected a release as X.Y.Z", options.over);
  }
  if (!options.commit_range.empty()) {
    const auto dots = options.commit_range.find("..");
    DMP_CHECK(dots != std::string::npos && dots > 0 && dots + 2 < options.commit_range.size() &&
                  options.commit_range.find("..", dots + 2) == std::string::npos,
              ErrorKind::kInvalidInput, "--commit-range {}: expected OLD..NEW (e.g. cc482f8~8..cc482f8)",
              options.commit_range);
    const TorchRecRepository repo = TorchRecRepository::open();
    const std::string old_rev = options.commit_range.substr(0, dots);
    const std::string new_rev = options.commit_range.substr(dots + 2);
    std::string over = options.over;
    if (over.empty()) {
      std::string why;
      over = repo.base_release(repo.resolve(old_rev), pinned_releases(), &why);
      DMP_CHECK(!over.empty(), ErrorKind::kInvalidInput, "--commit-range: {}; name the environment with --over", why);
    }
    return bisect_commits(options, repo, old_rev, repo.resolve(new_rev).hash, over);
  }
  const std::vector<std::string> releases = release_list(options.releases);
  DMP_CHECK(releases.size() >= 2, ErrorKind::kInvalidInput, "bisect needs at least two releases (--releases A,B,...)");
  // The scenario loads with every release as its system (its own errors surface before anything runs).
  (void)scenario::load_scenario_file(options.scenario_files[0],
                                     {{"system", scenario::System::release(releases.front()).name()}});
  std::vector<Point> points;
  for (const auto& r : releases) points.push_back({"torchrec " + r, scenario::System::release(r).name(), r});
  out << fmt::format("bisect: {} releases from {} to {}; {}\n", releases.size(), releases.front(), releases.back(),
                     steps_for(releases.size()))
      << std::flush;
  Bisection b(options, points, "bisect", false);
  const bool ran = b.run();
  if (b.interrupted()) return 130;
  auto install_hint = [&](const std::vector<size_t>& which) {
    std::vector<std::string> names;
    for (size_t i : which) names.push_back(releases[i]);
    std::sort(names.begin(), names.end(), version_less);
    return fmt::format("{} (install: bash ci/torchrec-env.sh {})", fmt::join(names, ", "), fmt::join(names, " "));
  };
  if (!ran) {
    out << "bisect: fewer than two releases could run; not tested: " << install_hint(b.untested()) << "\n";
    return 3;
  }
  if (b.same_at_both_ends()) {
    out << fmt::format("bisect: torchrec {} and {} behave the same (a bisection looks for one change between its "
                       "ends; run the releases between with `dmpcheck run` to see more){}\n",
                       releases[b.lo()], releases[b.hi()],
                       b.untested().empty() ? "" : "; not tested: " + install_hint(b.untested()));
    return 1;
  }
  const auto untested = b.untested_between();
  if (b.hi() - b.lo() > 1) {
    out << fmt::format("bisect: the behaviour changes between torchrec {} and {}; not tested between them: {}\n",
                       releases[b.lo()], releases[b.hi()], install_hint(untested));
    b.print_difference(out);
    return 4;
  }
  out << fmt::format("bisect: the behaviour changes between torchrec {} and {}: as {} through {}, different from {} "
                     "on\n",
                     releases[b.lo()], releases[b.hi()], releases[b.lo()], releases[b.lo()], releases[b.hi()]);
  b.print_difference(out);
  out << fmt::format("first release that behaves differently: {}\n", releases[b.hi()]);
  if (!options.commits) return 0;

  // On to the commits between the two releases' tags, over the older release's environment.
  const TorchRecRepository repo = TorchRecRepository::open();
  const std::string older = releases[b.lo()], newer = releases[b.hi()];
  const auto older_tag = repo.release_tag(older), newer_tag = repo.release_tag(newer);
  DMP_CHECK(older_tag && newer_tag, ErrorKind::kInvalidInput,
            "--commits: TorchRec's repository {} has no tag v{} (give the commits with --commit-range OLD..NEW)",
            repo.path(), older_tag ? newer : older);
  const std::string fork = repo.merge_base(*older_tag, *newer_tag);
  out << fmt::format("bisect: on to the commits: from {}'s branch point to {}\n", *older_tag, *newer_tag);
  if (!options.over.empty()) return bisect_commits(options, repo, fork, repo.resolve(*newer_tag).hash, options.over);
  return bisect_commits_across(options, repo, fork, repo.resolve(*newer_tag).hash, older, newer, nullptr);
}

int first_commit_between(const ReleaseOptions& options, const std::string& older, const std::string& newer,
                         Commit* found) {
  const TorchRecRepository repo = TorchRecRepository::open();
  const auto older_tag = repo.release_tag(older), newer_tag = repo.release_tag(newer);
  if (!older_tag || !newer_tag) return 2;
  *options.out << fmt::format("bisect: the commits from {}'s branch point to {}\n", *older_tag, *newer_tag);
  return bisect_commits_across(options, repo, repo.merge_base(*older_tag, *newer_tag), repo.resolve(*newer_tag).hash,
                               older, newer, found);
}

int measure_fidelity(const ReleaseOptions& options) {
  std::ostream& out = *options.out;
  DMP_CHECK(!options.output.empty(), ErrorKind::kInvalidInput, "fidelity needs --output FILE");
  struct Row {
    std::string release, scenario, cell, tensor;
    double max_abs = 0, max_rel = 0;
    int64_t differing = 0;
    std::string note;
    bool error = false;
  };
  std::vector<Row> rows;
  std::vector<std::string> versions;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& release : options.releases) {
    std::string version_line;
    for (const auto& file : options.scenario_files) {
      const scenario::Scenario s =
          scenario::load_scenario_file(file, {{"system", scenario::System::release(release).name()}});
      std::vector<std::string> labels;
      const auto cells = distinct_cells(s, &labels);
      for (size_t c = 0; c < cells.size() && !interrupt_requested(); ++c) {
        DMP_CHECK(s.runs[cells[c]].expect.reference.has_value(), ErrorKind::kInvalidScenario,
                  "{} [{}]: a fidelity scenario's cells need `expect: reference`", file, labels[c]);
        const check::RunResult r = run_cell(s, cells[c], cell_options(options, "fidelity-" + release));
        out << fmt::format("torchrec {} {} [{}]: {}\n", release, s.name, labels[c],
                           r.failure                               ? "error"
                           : r.verdict == check::Verdict::kSkipped ? "skipped"
                                                                   : "measured")
            << std::flush;
        if (r.verdict == check::Verdict::kSkipped || r.failure) {
          rows.push_back({release, s.name, labels[c], "-", 0, 0, 0,
                          r.verdict == check::Verdict::kSkipped
                              ? r.skip_reason
                              : fmt::format("rank {} failed: {}", r.failure->rank, r.failure->message.substr(0, 200)),
                          true});
          continue;
        }
        version_line = report::system_label(r);
        // Per tensor, the worst over steps.
        std::map<std::string, Row> worst;
        for (const auto& d : r.reference) {
          Row& w = worst.try_emplace(d.name, Row{release, s.name, labels[c], d.name, 0, 0, 0, {}, false}).first->second;
          w.max_abs = std::max(w.max_abs, d.max_abs_diff);
          w.max_rel = std::max(w.max_rel, d.max_rel_diff);
          w.differing = std::max(w.differing, d.elements_differing);
          if (!d.note.empty()) w.note = d.note;
        }
        for (auto& [name, w] : worst) rows.push_back(w);
        // The quantized lookup (expect.quantized): the release's against the reference's, on the
        // release's trained weights and the first batch.
        for (const auto& d : r.quantized_reference) {
          rows.push_back({release, s.name, labels[c], "quantized " + d.name, d.max_abs_diff, d.max_rel_diff,
                          d.elements_differing, d.note, false});
        }
      }
    }
    if (!version_line.empty()) versions.push_back(version_line);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string md;
  md += "# Fidelity: the reference DMP against real TorchRec releases\n\n";
  md += "Generated by a command; do not edit by hand. To regenerate (the environments first):\n\n";
  md += fmt::format("```bash\nbash ci/torchrec-env.sh {0}\nbuild/harness/dmpcheck fidelity {1} --releases {2} --output "
                    "docs/fidelity.md\n```\n\n",
                    fmt::join(options.releases, " "), fmt::join(options.scenario_files, " "),
                    fmt::join(options.releases, ","));
  md += "Each cell trains the scenario's model for its steps twice: on the release (its own planner, "
        "DistributedModelParallel, FBGEMM's fused optimizers, DDP) and on the reference DMP, on the same batches, "
        "from the same initial weights (`start: reference`) or each drawing its own from the scenario's seed "
        "(`start: seed`, as the scenarios here do; step 0 then compares the draws). Step 0 is the initial state; "
        "after every step every weight and optimizer-state tensor is "
        "compared whole (shards assembled). A row gives the worst step: max |a - b|, max |a - b| / |b| over elements "
        "whose reference value is not 0, and how many elements were not bitwise equal. The table names say the "
        "sharding type and pooling (`cw_mean`: column_wise, mean pooling). Why rows differ: see the notes below the "
        "table.\n\n";
  md += fmt::format("Systems: {}; the reference built against {}. Measured in {:.0f} s on {} core(s).\n\n",
                    fmt::join(versions, "; "), libtorch_build(), seconds,
                    std::max(1u, std::thread::hardware_concurrency()));
  int bitwise = 0, compared = 0;
  for (const auto& r : rows) {
    if (r.error || !r.note.empty()) continue;
    ++compared;
    bitwise += r.differing == 0 ? 1 : 0;
  }
  md += fmt::format("**{} of {} compared tensors are bitwise equal to the reference after every step.**\n\n", bitwise,
                    compared);
  md += "| release | scenario | cell | tensor | max abs | max rel | elements not bitwise | bitwise | note |\n";
  md += "|---|---|---|---|---:|---:|---:|---|---|\n";
  for (const auto& r : rows) {
    md += fmt::format("| {} | {} | {} | {} | {:.3g} | {:.3g} | {} | {} | {} |\n", r.release, r.scenario, r.cell,
                      r.tensor, r.max_abs, r.max_rel, r.differing,
                      r.error || !r.note.empty() ? "-"
                      : r.differing == 0         ? "yes"
                                                 : "no",
                      r.note);
  }
  md += "\n## Why rows differ\n\n"
        "The reference runs under the profile that models each release (`reference: {profile: release}`: "
        "`torchrec-0.6` for 0.6.0, `torchrec-1.9` for 1.9.2). What it reproduces, each established against the "
        "real kernels and releases:\n\n"
        "- **Initial weights** (`fidelity-init`, `start: seed`: both sides draw from the seed): TorchRec's draw "
        "order -- the dense layers, then the kernels' throw-away draws (a `randn` per data-parallel pooling "
        "group), then each rank's local shards in model order -- so every shard and replica is bitwise equal, "
        "and 0.6.0's per-rank data-parallel replicas come out as 0.6.0 draws them.\n"
        "- **Data-parallel tables**: TorchRec drops their in-backward optimizer; DDP averages the dense gradient "
        "(times 1/world_size, then summed) and the dense optimizer (here SGD) trains every row.\n"
        "- **FBGEMM's CPU arithmetic**: mean pooling as the sum times a float 1/L; each row's gradient "
        "accumulated in batch order with one rounding per id; SGD and Adagrad updates rounded once (Adagrad's "
        "weight update in double); row-wise Adagrad's mean square over eight float lanes.\n"
        "- **The quantized lookup** (`fidelity-quantized`, rows `quantized <output>`): the trained table "
        "quantized as TorchRec's quantize_embeddings does it (FBGEMM's row-wise quantization: the bias the row's "
        "minimum and the scale (max - min) / (2^bits - 1), both rounded to fp16, each element rounded to its "
        "level; fp16 tables rounded to fp16) and pooled as FBGEMM's CPU inference kernels pool it (per id "
        "`fma(scale x weight, level, out + bias x weight)`, a mean times a float 1/L): int8, int4, int2 and "
        "fp16, weighted or not (check/quantized_lookup.h).\n"
        "- **Row-wise means** divided by `L + 1e-6`, and beside them the row-wise *sum* features by `1 + 1e-6` "
        "(TorchRec builds one divisor for every reduce-scattered feature).\n"
        "- **DDP's gradient buckets** (measured with a comm hook on 0.6.0 and 1.9.2): TorchRec's DDP "
        "(static_graph) reduces the first two steps in one bucket in registration order, then rebuilds it in "
        "backward order. At world size 3 where an element sits in the bucket decides the order in which Gloo's "
        "ring adds the three ranks' values: before the reference laid its buckets out alike, one element of "
        "`dense.0.weight` differed in its last bit in five cells.\n\n"
        "What differs, where anything does: the dense layers' arithmetic of the libtorch the reference is built "
        "against. Debian's libtorch 1.13 (BLAS_INFO=generic) adds a Linear's dot products in another order than "
        "the torch wheels (MKL), in the forward and the backward; torch 2.2 and 2.14 agree with each other. With "
        "one Linear (fidelity-sharding, -row-wise, -init) no such sum reaches a weight: only the model output "
        "differs (about 1.5e-8, not a compared tensor). With three (`fidelity-dense`) the last bits of the dense "
        "weights and of the embedding gradients differ from step 1: SGD's update mostly hides them, Adagrad's "
        "squared-gradient state shows them, and its update amplifies them where that state is small. Built "
        "against torch 2.14.1's libtorch (`bash ci/torch2.sh`) the reference is bitwise on every row of all four "
        "training scenarios against both releases (measured: 360 of 360 tensors, before the quantized scenario "
        "was added).\n\n"
        "Taken from the release: its plan (a `start: seed` cell runs the reference on the release's own plan; "
        "the reference's own planner places every shard the same, checked on 450 table sets in "
        "`Planner.PlacesEveryShardWhere*`), and, with `start: reference`, the initial weights: the release "
        "starts from the reference's rank-0 weights, so the reference takes rank 0's data-parallel replicas on "
        "every rank too.\n"
        "- **Errors** are what the release itself raised (row_wise on CPU/Gloo in 0.6.0).\n";
  report::write_text_file_atomically(options.output, md);
  out << fmt::format("fidelity: {} rows, {} of {} compared tensors bitwise; written to {} ({:.0f} s)\n", rows.size(),
                     bitwise, compared, options.output, seconds);
  return 0;
}

std::string libtorch_build() { return fmt::format("libtorch {} ({})", TORCH_VERSION, blas_info()); }

}  // namespace dmpcheck::run
