// The YAML loader: a strict schema walk over the file, its matrix expanded into runs (matrix.cc),
// each run's fields (run_fields.cc), expectations (expectation.cc) and what each system can run
// (system_rules.cc), every field read through Reader (reader.h).
#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include "common/interrupt.h"
#include "scenario/parse.h"

namespace dmpcheck::scenario {
namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the loader's own parts

// A scenario's name names the directory of its reports, checkpoints and batch dumps under the
// directory the user gave: one path component of plain characters, never "." or "..".
void check_name(const Reader& r, const YAML::Node& node, const std::string& name) {
  constexpr size_t kLongest = 100;
  const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
  });
  if (!plain || name.size() > kLongest || name.front() == '.') {
    r.fail(node, "name",
           fmt::format("expected at most {} letters, digits, '_', '-' or '.', not starting with '.' (it names the "
                       "directory of the scenario's reports under --out)",
                       kLongest));
  }
}

// A cell's slug names its report file (and checkpoint and batch-dump directories): never hidden, never
// "..", short enough for any file system, and one per cell (values that differ only in the characters a
// slug replaces would otherwise share one report).
void unique_file_slugs(std::vector<RunSpec>& runs) {
  constexpr size_t kLongest = 120;
  std::set<std::string> taken;
  for (auto& run : runs) {
    std::string slug = run.slug.front() == '.' ? "_" + run.slug : run.slug;
    uint64_t hash = 14695981039346656037ULL;  // FNV-1a of the cell's name: the same in every build
    for (char c : run.name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    if (slug.size() > kLongest) slug = fmt::format("{}_{:016x}", slug.substr(0, kLongest - 17), hash);
    if (!taken.insert(slug).second) slug = fmt::format("{}_{:016x}", slug, hash);
    run.slug = slug;
    taken.insert(slug);
  }
}

// Every mapping's keys once: YAML lets a later duplicate shadow the first silently.
void check_unique_keys(const Reader& r, const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) check_unique_keys(r, node[i], fmt::format("{}[{}]", path, i));
    return;
  }
  if (!node.IsMap()) return;
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
    const std::string here = path.empty() ? key : path + "." + key;
    if (!seen.insert(key).second) {
      r.fail(kv.first, here, fmt::format("'{}' is given twice in this mapping; YAML would keep one silently", key));
    }
    check_unique_keys(r, kv.second, here);
  }
}

// Where each document of a YAML text starts, and whether anything is in it.
class DocumentMarks : public YAML::EventHandler {
 public:
  struct Document {
    YAML::Mark start;
    bool has_content = false;
  };
  std::vector<Document> documents;
  void OnDocumentStart(const YAML::Mark& mark) override { documents.push_back({mark, false}); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { saw(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { saw(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override { saw(mark); }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    saw(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    saw(mark);
  }
  void OnMapEnd() override {}

 private:
  void saw(const YAML::Mark& mark) {
    if (!documents.empty() && !documents.back().has_content) {
      documents.back().has_content = true;
      documents.back().start = mark;
    }
  }
};

// The file's one YAML document.  Its documents are counted through yaml-cpp's parser, at most
// two: YAML::LoadAll, which would count them too, never returns on some malformed text (a ']' or
// '}' that closes nothing at the top level: yaml-cpp 0.7 hands out empty documents forever
// without consuming it, found by `ci/fuzz.sh --mutate`).
YAML::Node the_document(const std::string& text, const std::string& file_label) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentMarks marks;
  while (marks.documents.size() < 2 && parser.HandleNextDocument(marks)) {}
  if (marks.documents.size() > 1) {
    // A second document needs a '---' (or '...') at the start of a line; without one, yaml-cpp
    // read text that closes nothing as one.
    const bool marked = text.rfind("---", 0) == 0 || text.rfind("...", 0) == 0 ||
                        text.find("\n---") != std::string::npos || text.find("\n...") != std::string::npos;
    const auto& second = marks.documents[1];
    throw_error(
        ErrorKind::kInvalidScenario,
        marked && second.has_content
            ? fmt::format("{}:{}: a second YAML document; a scenario file holds one", file_label, second.start.line + 1)
            : fmt::format("{}:{}: not valid YAML: text YAML cannot place in the document (a ']' or '}}' "
                          "that closes nothing?)",
                          file_label, second.start.line + 1));
  }
  return marks.documents.empty() ? YAML::Node() : YAML::Load(text);
}

// The cells of `run` without the system axis: the same cell on another release.
std::vector<std::pair<std::string, std::string>> cell_without_system(const RunSpec& run) {
  auto cell = run.cell;
  cell.erase(std::remove_if(cell.begin(), cell.end(), [](const auto& a) { return a.first == "system"; }), cell.end());
  return cell;
}

// A release said to show a bug must be told apart from each release said to be fixed or not to
// have it: where every cell expects the same of both, the cells pass or fail on both alike and the
// entry says what nothing checks.
void refuse_a_bug_told_apart_from_no_fix(const Reader& r, const YAML::Node& root, const Scenario& s,
                                         const std::string& bug) {
  std::vector<std::vector<std::pair<std::string, std::string>>> cells;  // each run's, once
  for (const auto& run : s.runs) cells.push_back(cell_without_system(run));
  for (const auto& entry : s.reproduces->releases) {
    const std::string& other = entry.first;  // (a structured binding cannot be captured in C++17)
    const std::string& status = entry.second;
    if (status != "fixed" && status != "absent") continue;
    bool compared = false, alike = true;
    std::string example;
    for (size_t i = 0; i < s.runs.size(); ++i) {
      if (s.runs[i].system.name() != bug) continue;
      size_t j = 0;
      while (j < s.runs.size() && !(s.runs[j].system.name() == other && cells[j] == cells[i])) ++j;
      if (j == s.runs.size()) continue;
      compared = true;
      example = s.runs[i].expect.describe();
      alike = alike && s.runs[j].expect.describe() == example;
    }
    if (compared && alike) {
      r.fail(root["reproduces"]["releases"][bug], "reproduces.releases." + bug,
             fmt::format("says 'bug', and '{}' of {}, but every cell expects the same of both ({}): write what the "
                         "bug shows in an entry with `when: {{system: {}}}`",
                         status, other, example, bug));
    }
  }
}

Scenario load_scenario_unchecked(const std::string& text, const std::string& file_label, const Overrides& overrides) {
  Reader r(file_label);
  YAML::Node root;
  try {
    root = the_document(text, file_label);
  } catch (const YAML::Exception& e) {
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}:{}: not valid YAML: {}", file_label, e.mark.line + 1, e.msg));
  }
  check_unique_keys(r, root, "");
  r.check_keys(root, "", kTopLevelKeys);

  Scenario s;
  s.file = file_label;
  s.source_text = text;
  s.overrides = overrides;
  s.version = static_cast<int>(r.integer(r.required(root, "", "version"), "version", 1, 1000));
  if (s.version != kFormatVersion) {
    r.fail(root["version"], "version",
           fmt::format("this dmpcheck reads version {}, got {}", kFormatVersion, s.version));
  }
  s.name = r.string(r.required(root, "", "name"), "name");
  check_name(r, root["name"], s.name);
  if (root["description"]) s.description = r.string(root["description"], "description");
  if (YAML::Node rep = root["reproduces"]) {
    r.check_keys(rep, "reproduces", {"url", "affected", "fixed_in", "bug_profile", "fix_profile", "releases"});
    Reproduces out;
    out.url = r.string(r.required(rep, "reproduces", "url"), "reproduces.url");
    if (rep["affected"]) out.affected = r.string(rep["affected"], "reproduces.affected");
    if (rep["fixed_in"]) out.fixed_in = r.string(rep["fixed_in"], "reproduces.fixed_in");
    // The profiles are there when the bug is modelled in the reference; a report confirmed only on
    // real releases names the releases instead (at least one where it shows).
    if (rep["bug_profile"] || rep["fix_profile"]) {
      out.bug_profile = r.choice(r.required(rep, "reproduces", "bug_profile"), "reproduces.bug_profile",
                                 dmp::behaviour_profile_names());
      out.fix_profile = r.choice(r.required(rep, "reproduces", "fix_profile"), "reproduces.fix_profile",
                                 dmp::behaviour_profile_names());
    }
    if (YAML::Node releases = rep["releases"]) {
      r.require_map(releases, "reproduces.releases");
      for (const auto& kv : releases) {
        const std::string key = kv.first.as<std::string>();
        const std::string field = "reproduces.releases." + key;
        const auto system = System::parse(key);
        // A release, or a commit where the report's change lies between two releases (TorchRec #1886).
        if (!system || !(system->is_release() || system->kind == System::Kind::kCommit)) {
          r.expected(kv.first, field, "a release key as 'torchrec==X.Y.Z' or a commit as 'torchrec@<rev>'");
        }
        const std::string value = r.string(kv.second, field);
        if (value != "bug" && value != "fixed" && value != "absent" && value.rfind("not runnable: ", 0) != 0 &&
            value.rfind("not reproduced: ", 0) != 0) {
          r.expected(kv.second, field, "bug, fixed, absent, 'not runnable: <why>' or 'not reproduced: <why>'");
        }
        out.releases.emplace_back(key, value);
      }
    }
    const bool shown_on_a_release =
        std::any_of(out.releases.begin(), out.releases.end(), [](const auto& kv) { return kv.second == "bug"; });
    if (out.bug_profile.empty() && !shown_on_a_release) {
      r.fail(rep, "reproduces",
             "say where the bug shows: bug_profile and fix_profile (modelled in the reference), or releases with at "
             "least one 'torchrec==X.Y.Z: bug' (confirmed on a real release), or both");
    }
    s.reproduces = out;
  }

  const Matrix matrix = read_matrix(r, root);
  std::set<std::string> table_names;
  for (const auto& cell : matrix.cells) {
    // A thousand cells take seconds to read: SIGINT and SIGTERM are answered between two.
    DMP_CHECK(!interrupt_requested(), ErrorKind::kInvalidScenario,
              "{}: stopped while loading its cells (SIGINT or "
              "SIGTERM)",
              file_label);
    // A fresh parse per cell rather than YAML::Clone, which drops the line marks errors need.
    YAML::Node run_root = YAML::Load(text);
    run_root.remove("matrix");
    run_root.remove("expect");
    std::vector<std::pair<std::string, std::string>> assignments;
    for (size_t a = 0; a < matrix.axes.size(); ++a) {
      const MatrixAxis& axis = matrix.axes[a];
      for (size_t p = 0; p < axis.paths.size(); ++p) {
        const YAML::Node& value = axis.values[cell[a]][p];
        if (!assign_path(run_root, split_path(axis.paths[p]), value)) {
          r.fail(axis.keys[p], "matrix." + axis.paths[p], "this path does not lead to a field of the scenario");
        }
        assignments.emplace_back(axis.paths[p], cell_text(axis.paths[p], value));
      }
    }
    for (const auto& [path, value] : overrides) {
      const auto parts = split_path(path);
      YAML::Node parsed;
      try {
        parsed = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        throw_error(ErrorKind::kInvalidScenario,
                    fmt::format("override {}={}: not a YAML value: {}", path, value, e.msg));
      }
      DMP_CHECK(!parts.empty() && std::find(kMatrixRoots.begin(), kMatrixRoots.end(), parts[0]) != kMatrixRoots.end() &&
                    assign_path(run_root, parts, parsed),
                ErrorKind::kInvalidScenario, "override {}={}: '{}' is not a run field of {} (run fields: {})", path,
                value, path, file_label, fmt::join(kMatrixRoots, ", "));
    }
    RunSpec run = parse_run(r, run_root);
    // A behaviour profile simulates a release in the reference, and the `torchrec` axes say how a
    // release is driven: an axis that does not apply to the run's system is dropped from its cell,
    // and a cell that is then a repeat is not run again.
    const auto dropped = std::remove_if(assignments.begin(), assignments.end(), [&](const auto& a) {
      return run.on_torchrec() ? a.first == "profile" : a.first.rfind("torchrec", 0) == 0;
    });
    if (run.on_torchrec() || dropped != assignments.end()) {
      assignments.erase(dropped, assignments.end());
      if (std::any_of(s.runs.begin(), s.runs.end(), [&](const RunSpec& done) { return done.cell == assignments; }))
        continue;
    }
    run.cell = assignments;
    // The reference is the default system: its cells are named without it, as before the axis existed.
    std::vector<std::string> named, values;
    for (const auto& [path, value] : assignments) {
      if (path == "system" && value == System{}.name()) continue;
      named.push_back(path + "=" + value);
      values.push_back(slug_of(value));
    }
    run.name = named.empty() ? "default" : fmt::format("{}", fmt::join(named, " "));
    run.slug = values.empty() ? "default" : fmt::format("{}", fmt::join(values, "_"));
    for (const auto& t : run.model.tables) table_names.insert(t.name);

    // Expectations: the first entry whose `when` matches this cell.
    r.section([&] {
      if (YAML::Node expect = root["expect"]) {
        if (!expect.IsSequence()) r.expected(expect, "expect", "a list of expectations (each with an optional 'when')");
        bool found = false;
        for (size_t i = 0; i < expect.size() && !found; ++i) {
          const std::string path = fmt::format("expect[{}]", i);
          r.require_map(expect[i], path);
          const YAML::Node when = expect[i]["when"];
          bool matches = true;
          if (when) r.require_map(when, path + ".when");
          for (const auto& kv : when) {  // (none where there is no `when`)
            const std::string key = kv.first.as<std::string>();
            auto it =
                std::find_if(assignments.begin(), assignments.end(), [&](const auto& p) { return p.first == key; });
            if (!matrix.varies(key)) {
              r.fail(kv.first, path + ".when." + key, "is not a matrix key; 'when' selects matrix cells");
            }
            // A list or mapping value matches the cell whose matrix value is the same list or mapping;
            // a list on an axis of scalars, any cell whose value it holds.
            bool hit = it != assignments.end() && it->second == cell_text(key, kv.second);
            if (!hit && it != assignments.end() && kv.second.IsSequence() && axis_of_scalars(matrix.values_of(key))) {
              for (const auto& v : kv.second) hit = hit || (v.IsScalar() && it->second == cell_text(key, v));
            }
            matches = matches && hit;
          }
          if (matches) {
            // A file that declares a script is judged as one even when its script is missing (that error
            // is reported once, at 'script.path', not again at each tensor name).
            const bool script = bool(run_root["script"]);
            run.expect = parse_expectation(r, expect[i], path, table_names, script);
            check_script_expectation(r, expect[i], path, run, script);
            check_system_can_judge(r, expect[i], path, run);
            found = true;
          }
        }
        if (!found) {
          r.fail(expect, "expect",
                 fmt::format("no entry applies to run '{}'; add one without 'when' as the default", run.name));
        }
      }
    });
    // Every error of the file so far, at once (the first cell meets all that are not the matrix's).
    r.throw_recorded();
    s.runs.push_back(run);
  }
  // (Not when an override replaces every run's system, as `dmpcheck bisect` does.)
  const bool system_overridden =
      std::any_of(overrides.begin(), overrides.end(), [](const auto& o) { return o.first == "system"; });
  if (s.reproduces && !system_overridden) {
    for (const auto& entry : s.reproduces->releases) {
      const std::string& release = entry.first;
      const std::string& status = entry.second;
      if (status.rfind("not runnable: ", 0) == 0 || status.rfind("not reproduced: ", 0) == 0) continue;
      if (std::none_of(s.runs.begin(), s.runs.end(),
                       [&](const RunSpec& run) { return run.system.name() == release; })) {
        r.fail(root["reproduces"]["releases"][release], "reproduces.releases." + release,
               fmt::format("says '{}' but no run of the scenario runs on {} (add it to the matrix's system axis)",
                           status, release));
      }
      if (status == "bug") refuse_a_bug_told_apart_from_no_fix(r, root, s, release);
    }
  }
  unique_file_slugs(s.runs);
  return s;
}

}  // namespace

std::pair<int64_t, int64_t> DataSpec::ids_per_bag(const std::string& feature) const {
  auto it = per_feature.find(feature);
  return it == per_feature.end() ? std::make_pair(min_ids_per_bag, max_ids_per_bag) : it->second;
}

bool DataSpec::variable_batch() const {
  if (!stride_per_rank.empty()) return true;
  for (const auto& step : batches) {
    for (const auto& rank : step) {
      for (const auto& [feature, bags] : rank) {
        if (!bags.inverse_indices.empty()) return true;
      }
    }
  }
  return false;
}

std::optional<std::string> DataSpec::variable_batch_note() const {
  if (!stride_per_rank.empty() || !variable_batch()) return std::nullopt;
  std::string first;
  size_t without = 0, all = 0;
  for (size_t step = 0; step < batches.size(); ++step) {
    for (size_t rank = 0; rank < batches[step].size(); ++rank) {
      for (const auto& [feature, bags] : batches[step][rank]) {
        ++all;
        if (bags.inverse_indices.empty()) {
          ++without;
        } else if (first.empty()) {
          first = fmt::format("step {} rank {} feature {}", step + 1, rank, feature);
        }
      }
    }
  }
  if (without == 0) return std::nullopt;
  return fmt::format(
      "data.batches: {} has inverse_indices, so every step and feature goes to the release as a variable batch; the "
      "{} of {} (step, rank, feature) entries without them go as one distinct bag per bag (inverse indices 0..n-1)",
      first, without, all);
}

Scenario load_scenario_text(const std::string& text, const std::string& file_label, const Overrides& overrides) {
  // Every yaml-cpp error becomes a scenario error with its line, including shapes of input
  // the schema walk did not foresee (found by fuzzing: a scalar where a mapping was expected).
  try {
    return load_scenario_unchecked(text, file_label, overrides);
  } catch (const YAML::Exception& e) {
    throw_error(ErrorKind::kInvalidScenario,
                fmt::format("{}:{}: not a valid scenario: {}", file_label, e.mark.line + 1, e.msg));
  }
}

Scenario load_scenario_file(const std::string& path, const Overrides& overrides) {
  std::ifstream in(path, std::ios::binary);
  DMP_CHECK(in.good(), ErrorKind::kInvalidScenario, "{}: cannot open the scenario file", path);
  return load_scenario_text(std::string(std::istreambuf_iterator<char>(in), {}), path, overrides);
}

}  // namespace dmpcheck::scenario
