#include "cli/explore_command.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>

#include "common/error.h"

namespace dmpcheck::cli {
namespace {

constexpr double kLongestBudget = 7 * 24 * 3600;

double parse_budget(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) { used = 0; }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : -1;
  DMP_CHECK(used > 0 && scale > 0 && value > 0 && std::isfinite(value), ErrorKind::kInvalidInput,
            "--budget {}: expected a duration such as 90, 90s, 20m or 1h", text);
  DMP_CHECK(value * scale <= kLongestBudget, ErrorKind::kInvalidInput,
            "--budget {}: at most {} hours (a search longer than a week is a mistake, not a plan)", text,
            kLongestBudget / 3600);
  return value * scale;
}

}  // namespace

CLI::App* add_explore_command(CLI::App& app, ExploreFlags& flags) {
  auto* cmd = app.add_subcommand(
      "explore",
      "Search a TorchRec release for bugs: draw configurations from a seed (ranks, tables, pooling, sharding types, "
      "optimizers, weights, variable batches, the pipeline), run each against the release's own unsharded model "
      "and its replicas, minimise every failure and write it as a scenario file (docs/explore.md). Exit: 0 nothing "
      "found, 1 findings written, 3 the release cannot run");
  auto& o = flags.options;
  cmd->add_option("--system", o.system, "What is searched: torchrec==X.Y.Z, torchrec@<rev>, python:/path")->required();
  cmd->add_option("--against", o.against, "A second system each finding is run on: what an upgrade breaks or fixes");
  cmd->add_option("--budget", flags.budget, "How long to draw: 90, 90s, 20m, 1h (a minimisation under way finishes)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "The search's seed (0 to 2^63-1): the same seed draws the same configurations")
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}))
      ->capture_default_str();
  cmd->add_option("--max-configs", o.max_configs, "Stop after this many configurations (0: the budget alone)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--minimise-runs", o.minimise_tries, "Runs one finding's minimisation may make")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--out", o.out_dir,
                  "Where findings/*.yaml, explore.md and explore.json go (default "
                  "reports/explore-<seed>)");
  return cmd;
}

int command_explore(ExploreFlags& flags, const std::string& worker_executable) {
  auto& o = flags.options;
  o.budget_s = parse_budget(flags.budget);
  if (o.out_dir.empty()) o.out_dir = fmt::format("reports/explore-{}", o.seed);
  std::error_code made;
  std::filesystem::create_directories(o.out_dir + "/findings", made);
  DMP_CHECK(!made, ErrorKind::kInvalidInput, "--out {}: cannot make the folder: {}", o.out_dir, made.message());
  o.worker_executable = worker_executable;
  o.out = &std::cout;
  return explore::run_explore(o);
}

}  // namespace dmpcheck::cli
