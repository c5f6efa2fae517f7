#include "run/releases.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <torch/version.h>

#include <ATen/Version.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "report/console.h"
#include "report/json.h"
#include "run/launcher.h"
#include "run/scenario_runner.h"
#include "scenario/scenario.h"

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
    std::vector<std::string> parts;
    for (const auto& [k, v] : s.runs[i].cell) {
      if (k != "system" && k != "profile") parts.push_back(k + "=" + v);
    }
    const std::string label = parts.empty() ? std::string("default") : fmt::format("{}", fmt::join(parts, " "));
    if (!seen.insert(label).second) continue;
    out.push_back(i);
    labels->push_back(label);
  }
  return out;
}

std::string observation(const check::RunResult& r) {
  if (r.verdict == check::Verdict::kSkipped) return "skipped: " + r.skip_reason;
  if (r.failure) return fmt::format("error ({}): {}", r.failure->kind, r.failure->message.substr(0, 160));
  std::vector<std::string> diverged;
  for (const auto& c : r.replicas) {
    if (!c.equal && std::find(diverged.begin(), diverged.end(), c.name) == diverged.end()) diverged.push_back(c.name);
  }
  if (diverged.empty()) return "replicas equal";
  return fmt::format("replicas DIVERGE on {} tensor(s): {}", diverged.size(), fmt::join(diverged, ", "));
}

ScenarioRunOptions cell_options(const ReleaseOptions& options, const std::string& sub) {
  ScenarioRunOptions o;
  o.worker_executable = options.worker_executable;
  o.out_dir = options.out_dir + "/" + sub;
  o.echo_rank_output = false;
  return o;
}

}  // namespace

int bisect_releases(const ReleaseOptions& options) {
  DMP_CHECK(options.scenario_files.size() == 1, ErrorKind::kInvalidInput, "bisect takes one scenario file");
  DMP_CHECK(options.releases.size() >= 2, ErrorKind::kInvalidInput,
            "bisect needs at least two releases (--releases A,B,...)");
  std::ostream& out = *options.out;
  // Validate every release's version first: a typo in the last one should not cost the others.
  std::vector<scenario::Scenario> per_release;
  for (const auto& release : options.releases) {
    per_release.push_back(scenario::load_scenario_file(options.scenario_files[0],
                                                       {{"system", scenario::System::release(release).name()}}));
  }
  std::vector<std::string> installed;                    // releases that ran
  std::map<std::string, std::vector<std::string>> seen;  // release -> observation per cell
  std::vector<std::string> labels;
  for (size_t k = 0; k < options.releases.size() && !interrupt_requested(); ++k) {
    const std::string& release = options.releases[k];
    labels.clear();
    const auto cells = distinct_cells(per_release[k], &labels);
    std::vector<std::string> obs;
    bool skipped = false;
    const auto start = std::chrono::steady_clock::now();
    for (size_t c = 0; c < cells.size(); ++c) {
      const check::RunResult r = run_cell(per_release[k], cells[c], cell_options(options, "bisect-" + release));
      skipped = skipped || r.verdict == check::Verdict::kSkipped;
      obs.push_back(observation(r));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out << fmt::format("torchrec {} ({:.1f} s):\n", release, seconds);
    for (size_t c = 0; c < cells.size(); ++c) out << fmt::format("  [{}] {}\n", labels[c], obs[c]);
    if (skipped) continue;
    installed.push_back(release);
    seen[release] = obs;
  }
  if (installed.empty()) {
    out << "bisect: no release could run (install them with bash ci/torchrec-env.sh "
        << fmt::format("{}", fmt::join(options.releases, " ")) << ")\n";
    return 3;
  }
  for (size_t k = 1; k < installed.size(); ++k) {
    if (seen[installed[k]] == seen[installed[k - 1]]) continue;
    out << fmt::format(
        "bisect: the behaviour changes between torchrec {} and {}: as {} through {}, different from {} on\n",
        installed[k - 1], installed[k], installed.front(), installed[k - 1], installed[k]);
    for (size_t c = 0; c < labels.size(); ++c) {
      if (seen[installed[k]][c] == seen[installed[k - 1]][c]) continue;
      out << fmt::format("  [{}] {}: {}  ->  {}: {}\n", labels[c], installed[k - 1], seen[installed[k - 1]][c],
                         installed[k], seen[installed[k]][c]);
    }
    out << fmt::format("first release that behaves differently: {}\n", installed[k]);
    return 0;
  }
  out << fmt::format("bisect: every installed release behaves the same ({})\n", fmt::join(installed, ", "));
  return 1;
}

int measure_fidelity(const ReleaseOptions& options) {
  std::ostream& out = *options.out;
  DMP_CHECK(!options.output.empty(), ErrorKind::kInvalidInput, "fidelity needs --output FILE");
  struct Row {
    std::string release, scenario, cell, tensor;
    double max_abs = 0, max_rel = 0;
    int64_t differing = 0;
    int ulp_steps = 0;
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
        if (r.verdict == check::Verdict::kSkipped) {
          rows.push_back({release, s.name, labels[c], "-", 0, 0, 0, 0, r.skip_reason, true});
          continue;
        }
        if (r.failure) {
          rows.push_back({release, s.name, labels[c], "-", 0, 0, 0, 0,
                          fmt::format("rank {} failed: {}", r.failure->rank, r.failure->message.substr(0, 200)), true});
          continue;
        }
        version_line = report::system_label(r);
        // Per tensor, the worst over steps.
        std::map<std::string, Row> worst;
        for (const auto& d : r.reference) {
          Row& w =
              worst.try_emplace(d.name, Row{release, s.name, labels[c], d.name, 0, 0, 0, 0, {}, false}).first->second;
          w.max_abs = std::max(w.max_abs, d.max_abs_diff);
          w.max_rel = std::max(w.max_rel, d.max_rel_diff);
          w.differing = std::max(w.differing, d.elements_differing);
          if (!d.note.empty()) w.note = d.note;
        }
        for (auto& [name, w] : worst) rows.push_back(w);
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
        "scenarios against both releases (measured: 360 of 360 tensors).\n\n"
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
